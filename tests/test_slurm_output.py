"""A Slurm job's output file, replayed as a hostile second user on the private cluster of
scripts/slurm.sh (driven through SlurmBackend, no hub): a notebook job of gpsuser1 whose
output the other user (gpsuser2) tries to create first, read, and forge.

Before, the default ``c.SlurmBackend.output`` was a file in /tmp, which every account may
write, and every user sees each job's StdOut path: while the hub held the job (between
``sbatch --hold`` and the release) the other user created that path first (mode 0666), the
victim's job wrote into it, the other user read the victim's result and appended a result
frame of its own, which the hub took (the last frame counted). The hub also read a FIFO the
user put there (``tail`` waited until its timeout) and gave no reason for a link.

Now the output goes to ``<output_dir>/<uid>/`` (a folder 0700 of the user, made by the hub
before the submission, in a folder of root's), only a result frame signed with the job's own
key counts, and a FIFO, a link or a file of another owner is refused with a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("sqlalchemy")

from gpuspawner.backends.slurm.backend import SlurmBackend  # noqa: E402
from gpuspawner.backends.slurm.job import output_path  # noqa: E402
from gpuspawner.backends.slurm.output import OutputRefused  # noqa: E402
from gpuspawner.backends.spec import HomeMount, LaunchSpec, launch_spec  # noqa: E402
from gpuspawner.hub.jobs.runner import EXECUTE_SOURCE  # noqa: E402
from gpuspawner.jobs import execute  # noqa: E402
from gpuspawner.jobs.model import notebook_env, parse_output  # noqa: E402
from gpuspawner.placement import Allocation, Bundle, Ledger, Owner  # noqa: E402
from gpuspawner.testing.slurm_hub import OTHER, USER, job_python  # noqa: E402
from tests.test_jobs_slurm import node_state  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.test_slurm_backend import slurm_conf, topology_nodes  # noqa: E402, F401
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slurm
MiB = 2**20
#: sinfo's states of a node that takes jobs
UP = ("idle", "mixed", "allocated")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def as_user(name: str, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` run as the account ``name`` (its uid and primary group, no others)."""
    pw = pwd.getpwnam(name)
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30,
                          user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                          stdin=subprocess.DEVNULL)


#: what the other user runs to take a path first: created, never opened by someone else
CREATE_FIRST = ("import os, sys; os.umask(0); "
                "os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))")


def forged_frame() -> bytes:
    """A result frame as the job program prints it, of a notebook the job never ran, without
    the job's key (the other user does not have it)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        execute.emit({"notebook": {"cells": [], "forged": True}, "error": None})
    return buf.getvalue().encode()


@dataclass
class NotebookJob:
    backend: SlurmBackend
    alloc: Allocation
    state: dict[str, Any]
    secret: str
    taken_first: subprocess.CompletedProcess | None
    stdout_at_release: str
    appended: threading.Event
    code: int


def notebook_spec(alloc: Allocation, home: Path, name: str, nb: dict) -> LaunchSpec:
    """A notebook job's launch spec as the job runner makes it (port 0, ``python3 -c`` the
    job program, which the backend runs with its ``job_python``)."""
    user = pwd.getpwnam(USER)
    env, _ = notebook_env(nb)
    env.update({"USER": USER, "PYTHONUNBUFFERED": "1", "GPUSPAWNER_JOB_ID": name,
                "GPUSPAWNER_JOB_NAME": "nb", "GPUSPAWNER_JOB_OUTPUT_DIR": f"jobs/nb/{name}",
                "GPUSPAWNER_JOB_PARAMETERS": "{}", "GPUSPAWNER_JOB_TIME_LIMIT": "120"})
    spec = launch_spec(name=name, user=USER, server=f"job/{name}", allocation=alloc,
                       image="(none)", cmd=["python3", "-c", EXECUTE_SOURCE], env=env,
                       uid=user.pw_uid, gid=user.pw_gid, port=1,
                       home=HomeMount(str(home), f"/home/{USER}"))
    return replace(spec, port=0, time_limit=120)


@pytest.fixture(scope="module")
def folders() -> Iterator[tuple[Path, Path]]:
    """(the user's home, the admin's output_dir: a folder of root's, made by the hub)."""
    user = pwd.getpwnam(USER)
    top = Path(tempfile.mkdtemp(prefix="gps-slurmout-", dir="/tmp"))
    top.chmod(0o755)
    home = top / "home"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    home.chmod(0o700)
    yield home, top / "output"
    shutil.rmtree(top, ignore_errors=True)


def watch_and_append(path_of: Any, done: threading.Event, stop: threading.Event) -> None:
    """The other user's watcher: as soon as the job's result frame is in its output file,
    append a forged one (written here as root: someone who can write the file, as every
    account could in /tmp)."""
    end = execute.END.encode()
    while not stop.is_set():
        path = path_of()
        try:
            data = Path(path).read_bytes() if path else b""
        except OSError:
            data = b""
        if end in data:
            with open(path, "ab") as f:
                f.write(forged_frame())
            done.set()
            return
        time.sleep(0.01)


@pytest.fixture(scope="module")
def nb_job(slurm_conf: str, folders: tuple[Path, Path]) -> Iterator[NotebookJob]:  # noqa: F811
    py = job_python()
    if py is None:
        pytest.skip("no Python for notebook jobs on the nodes: scripts/slurm-jobenv.sh")
    home, output_dir = folders
    # the hub's defaults but for the folder of the output folders (no c.SlurmBackend.output)
    backend = SlurmBackend(slurm_conf=slurm_conf, python="/usr/bin/python3", job_python=py,
                           submit_timeout=60, stop_timeout=30, output_dir=str(output_dir))
    backend.bind(topology_nodes())
    ledger = Ledger([rt.node for rt in topology_nodes().values()])
    backend.ledger = ledger  # Slurm may give other free cores of the node: adopted
    up = [n for n in ("node2", "node1") if node_state(slurm_conf, n) in UP]
    if not up:
        pytest.skip("neither node1 nor node2 of the test cluster is up (scripts/slurm.sh)")
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=1024 * MiB, gpus=0), Owner(USER),
                           nodes=up[:1])
    secret = f"private-{uuid.uuid4().hex}"
    nb = notebook(f"print({secret!r})", "import time\ntime.sleep(4)")
    spec = notebook_spec(alloc, home, f"gps-out-{uuid.uuid4().hex[:6]}", nb)
    taken: dict[str, Any] = {}
    real_run = backend.client.run

    async def release_after_the_other_user(*args: str, **kw: Any) -> str:
        # the window of the replay: the job is held, its StdOut is known to every user
        if args[:2] == ("scontrol", "release"):
            job = await backend.client.show_job(int(args[2]))
            assert job is not None
            taken["stdout"] = path = output_path(job, "")
            taken["made"] = as_user(OTHER, "/usr/bin/python3", "-c", CREATE_FIRST, path)
        return await real_run(*args, **kw)

    backend.client.run = release_after_the_other_user  # type: ignore[method-assign]
    state: dict[str, Any] = {}
    appended, stop = threading.Event(), threading.Event()
    watcher = threading.Thread(target=watch_and_append, daemon=True, args=(
        lambda: state.get("output_path") or taken.get("stdout"), appended, stop))
    watcher.start()
    try:
        run(backend.launch(spec, state, lambda p, m: None))
        (code,) = wait_until(lambda: (lambda c: None if c is None else (c,))(
            run(backend.poll(state))), 90, 0.3, "the notebook job ends")
        wait_until(appended.is_set, 10, 0.05, "the forged frame appended after the real one")
        yield NotebookJob(backend, alloc, state, secret, taken.get("made"),
                          taken.get("stdout", ""), appended, code)
    finally:
        stop.set()
        run(backend.cleanup(alloc, state))


def test_another_user_cannot_make_the_jobs_output_file_first(
        nb_job: NotebookJob, folders: tuple[Path, Path]) -> None:
    """While the job was held, gpsuser2 tried to create its StdOut path (O_EXCL, 0666). Before:
    it did (in /tmp), and the victim's job wrote into gpsuser2's file. Now the path is in the
    user's own folder 0700, which the hub made before the submission."""
    _, output_dir = folders
    uid = pwd.getpwnam(USER).pw_uid
    assert nb_job.taken_first is not None
    assert nb_job.taken_first.returncode != 0, (
        f"gpsuser2 created the job's output file {nb_job.stdout_at_release} first")
    assert "Permission denied" in nb_job.taken_first.stderr
    path = Path(nb_job.state["output_path"])
    assert path.parent == output_dir / str(uid)
    assert nb_job.stdout_at_release == str(path)
    folder = path.parent.stat()
    assert (folder.st_uid, oct(folder.st_mode & 0o7777)) == (uid, "0o700")
    base = output_dir.stat()
    assert (base.st_uid, oct(base.st_mode & 0o7777)) == (0, "0o711")
    assert path.stat().st_uid == uid
    # ... nor read it
    seen = as_user(OTHER, "/bin/cat", "--", str(path))
    assert seen.returncode != 0 and nb_job.secret not in seen.stdout


def test_a_result_frame_without_the_jobs_key_is_ignored(nb_job: NotebookJob) -> None:
    """A result frame appended after the job's own (by anyone who can write the file): before,
    the hub took the last frame, i.e. the forged notebook. Now only a frame signed with the
    job's key counts; the forged one is kept as text in the log only."""
    assert nb_job.code == 0
    out = run(nb_job.backend.read_output(nb_job.state, 2 * MiB))
    assert out is not None
    result = parse_output(out, 2 * MiB)
    assert result is not None and result.get("notebook") is not None
    assert not result["notebook"].get("forged"), "the hub took the forged result frame"
    texts = "".join("".join(o.get("text", "")) for c in result["notebook"]["cells"]
                    for o in c.get("outputs", []))
    assert nb_job.secret in texts
    assert b"a result frame without the job's key, ignored" in out


def test_a_fifo_a_link_or_a_file_of_another_owner_is_refused_with_a_message(
        nb_job: NotebookJob) -> None:
    """The job's user replaces the output file. Before: the hub's ``tail`` (as the user) read
    a link's target and waited on a FIFO until its 30 s timeout, and said nothing of either.
    Now each is refused at once, naming the file and why; the exit report says it too."""
    path = str(nb_job.state["output_path"])
    other = pwd.getpwnam(OTHER)
    victim_file = Path(nb_job.state["output_path"]).parent / "precious.txt"
    cases = [
        ("a FIFO", 'rm -f "$1" && mkfifo -m 600 "$1"'),
        ("a symbolic link", f'rm -f "$1" && echo mine > {victim_file} && '
                            f'ln -s {victim_file} "$1"'),
    ]
    for words, script in cases:
        r = as_user(USER, "/bin/sh", "-c", script, "sh", path)
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        with pytest.raises(OutputRefused) as e:
            run(nb_job.backend.read_output(nb_job.state, 2 * MiB))
        assert time.monotonic() - t0 < 5
        assert path in str(e.value) and words in str(e.value), str(e.value)
        report = run(nb_job.backend.exit_report(nb_job.state))
        assert report is not None and words in report and "refused" in report, report
    # a file of another account in its place (as a hard link of gpsuser2's file would be)
    os.unlink(path)
    Path(path).write_text("gpsuser2's own\n")
    os.chown(path, other.pw_uid, other.pw_gid)
    with pytest.raises(OutputRefused) as e:
        run(nb_job.backend.read_output(nb_job.state, 2 * MiB))
    assert f"belongs to uid {other.pw_uid}" in str(e.value), str(e.value)
