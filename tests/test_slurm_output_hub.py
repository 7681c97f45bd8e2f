"""Reads of Slurm job output that cannot starve the hub, replayed as a hostile user on a real
hub (JupyterHub + configurable-http-proxy + GPUSpawner on the Slurm backend + the gpuspawner
service with notebook jobs) on the private cluster of scripts/slurm.sh.

Before: a user made its own running job's output file a FIFO and sent many concurrent
``GET api/jobs/{id}/log``. Each read ran ``tail`` on the FIFO in a thread of the hub's default
executor until ``tail``'s 30 s timeout (the log request's 15 s deadline cancelled the wait,
not the thread), so the default executor filled: everything else the hub does there waited
for a thread (another user's spawn took 60 s, 57 of them at the certificate step; here:
another user's job submission, whose notebook check runs there too).

Now output reads run in the Slurm backend's own executor, a few per user at a time, each with
a deadline that ends the read itself, and a FIFO is refused at once.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("sqlalchemy")

from gpuspawner.hub.identity import job_object_name  # noqa: E402
from gpuspawner.testing.slurm_hub import (  # noqa: E402
    OTHER,
    USER,
    SlurmHub,
    chp,
    job_python,
    real_singleuser,
)
from tests.test_jobs_hub import User  # noqa: E402
from tests.test_jobs_slurm import FINAL, slurm_jobs  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.test_slurm_backend import slurm_conf  # noqa: E402, F401
from tests.test_slurm_output import as_user  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.hub]
#: concurrent log requests of the attacker: more than the default executor's threads
#: (min(32, CPUs + 4)) on any machine the tests run on
FLOOD = 40
#: both users' jobs on node1 (one core each of its two): no other node needs to be up
PROFILES = [{"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M",
             "nodes": ["node1"], "default": True}]
EXTRA = """
c.GPUSpawner.placement_policy = "first-fit"
c.GPUJobs.profile_time_limits = {"cpu": {"default": 300, "max": 3600}}
"""


@pytest.fixture(scope="module")
def hub(slurm_conf: str, tmp_path_factory) -> Iterator[SlurmHub]:  # noqa: F811
    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    if job_python() is None:
        pytest.skip("no Python for notebook jobs on the nodes: scripts/slurm-jobenv.sh")
    h = SlurmHub(tmp_path_factory.mktemp("slurmout"), slurm_conf, profiles=PROFILES,
                 jobs=True, extra=EXTRA)
    h.start()
    try:
        yield h
    finally:
        h.stop()
        shutil.rmtree(h.home, ignore_errors=True)


def test_a_fifo_and_a_flood_of_log_reads_do_not_hold_up_another_user(
        hub: SlurmHub, slurm_conf: str) -> None:  # noqa: F811
    attacker, other = User(hub, USER), User(hub, OTHER)
    job = attacker.submit(notebook("import time\ntime.sleep(300)"), profile="cpu",
                          name="fifo", time_limit=600)
    try:
        attacker.wait_state(job["id"], ("running",), 90)
        (sj,) = wait_until(lambda: slurm_jobs(slurm_conf, job_object_name(USER, job["id"])),
                           10, 0.2, "the attacker's Slurm job")
        path = sj.fields["StdOut"]
        # the attacker's own code (in its job, say) puts a FIFO in place of its output file
        r = as_user(USER, "/bin/sh", "-c", 'rm -f "$1" && mkfifo -m 600 "$1"', "sh", path)
        assert r.returncode == 0, r.stderr

        def read_log() -> tuple[float, str]:
            t0 = time.monotonic()
            text = attacker.call("GET", f"api/jobs/{job['id']}/log").text
            return time.monotonic() - t0, text

        with concurrent.futures.ThreadPoolExecutor(FLOOD) as pool:
            flood = [pool.submit(read_log) for _ in range(FLOOD)]
            time.sleep(1.0)  # the reads have begun
            # meanwhile another user submits a job of their own
            t0 = time.monotonic()
            theirs = other.submit(notebook("print('hello from', x)"), profile="cpu",
                                  name="theirs", time_limit=120)
            submitted = time.monotonic() - t0
            done = other.wait_state(theirs["id"], FINAL, 120)
            finished = time.monotonic() - t0
            reads = [f.result(timeout=120) for f in flood]
        print(f"\nanother user's submission under {FLOOD} log reads of a FIFO: "
              f"{submitted:.2f} s; its job ran and completed in {finished:.1f} s; the log "
              f"reads took {min(t for t, _ in reads):.2f} to {max(t for t, _ in reads):.2f} s")
        assert submitted < 5, f"another user's submission waited {submitted:.1f} s"
        assert done["state"] == "completed", (
            done.get("message"), other.call("GET", f"api/jobs/{theirs['id']}/log").text[-3000:])
        assert max(t for t, _ in reads) < 15
        # each read says why it could not read the log
        assert all("FIFO" in text and "refused" in text for _, text in reads), reads[0][1]
    finally:
        attacker.call("DELETE", f"api/jobs/{job['id']}")


def test_a_fifo_and_a_flood_of_log_reads_do_not_hold_up_another_users_spawn(
        slurm_conf: str, tmp_path: Path) -> None:  # noqa: F811
    """The issue's measure: with internal_ssl the spawner makes each server's certificates in
    the hub's default executor. Another user's spawn of the real jupyterhub-singleuser under
    the flood takes about as long as without it (before: 30 s more, waiting for a thread)."""
    if chp() is None or job_python() is None:
        pytest.skip("configurable-http-proxy or the nodes' job Python is missing (make slurm)")
    real = real_singleuser()
    if real is None:
        pytest.skip("no jupyterhub in the hub's site-packages or no /usr/bin/python3")
    hub = SlurmHub(tmp_path, slurm_conf, **real, internal_ssl=True, jobs=True,
                   profiles=PROFILES, extra=EXTRA)
    hub.start()
    attacker = User(hub, USER)
    hub.ensure_user(OTHER)
    job = None

    def spawn() -> float:
        t0 = time.monotonic()
        r = hub.api("POST", f"/users/{OTHER}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(OTHER, timeout=150)
        took = time.monotonic() - t0
        assert hub.api("DELETE", f"/users/{OTHER}/server").status_code in (202, 204)
        hub.wait_stopped(OTHER)
        return took

    try:
        alone = spawn()
        job = attacker.submit(notebook("import time\ntime.sleep(300)"), profile="cpu",
                              name="fifo", time_limit=600)
        attacker.wait_state(job["id"], ("running",), 90)
        (sj,) = wait_until(lambda: slurm_jobs(slurm_conf, job_object_name(USER, job["id"])),
                           10, 0.2, "the attacker's Slurm job")
        r = as_user(USER, "/bin/sh", "-c", 'rm -f "$1" && mkfifo -m 600 "$1"', "sh",
                    sj.fields["StdOut"])
        assert r.returncode == 0, r.stderr
        with concurrent.futures.ThreadPoolExecutor(FLOOD) as pool:
            flood = [pool.submit(attacker.call, "GET", f"api/jobs/{job['id']}/log")
                     for _ in range(FLOOD)]
            time.sleep(1.0)
            flooded = spawn()
            texts = [f.result(timeout=120).text for f in flood]
        print(f"\nanother user's spawn (internal_ssl, jupyterhub-singleuser): {alone:.1f} s "
              f"alone, {flooded:.1f} s under {FLOOD} log reads of a FIFO")
        # before the fix the flood held the hub's threads for the reads' 30 s timeouts (34.5 s
        # against 5.5 s alone); a loaded machine (make test's parallel modules) adds seconds
        assert flooded < alone + 20, f"the spawn took {flooded:.1f} s, {alone:.1f} s alone"
        assert all("FIFO" in t and "refused" in t for t in texts), texts[0]
    finally:
        try:
            if job is not None:
                attacker.call("DELETE", f"api/jobs/{job['id']}")
            if hub.server(OTHER) is not None:
                hub.api("DELETE", f"/users/{OTHER}/server")
        finally:
            hub.stop()
            shutil.rmtree(hub.home, ignore_errors=True)
