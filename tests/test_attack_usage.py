"""Hostile review of this round's surfaces, as another user with real tokens: each test replays
an attack of one user on another's data or servers.

- ``api/usage`` (reports, CSV), ``api/usage/budgets``, ``api/users/<name>/usage`` (with its
  ``gpu_share_notices``) and ``api/queue`` (``fairshare_factor``) in pytest-jupyterhub's
  in-process hub with the gpuspawner service on loopback (tests/test_usage_budgets_hub.py's
  hub): bob's own token asks for ann's figures every way the handlers parse a name.
- MPS daemons run by gpuspawner (``gpu_share: mps-daemon``) on the real Docker engine with the
  stand-in daemon of tests/test_gpu_share_mps.py (no GPU here): two users' servers that are
  clients of one GPU's daemon.

A finding that still works is an ``xfail(strict=True)`` naming it: it turns into a failure (to
be made a plain test) once the hole is closed.
"""

from __future__ import annotations

import asyncio

import pytest

docker = pytest.importorskip("docker")

from gpuspawner.gpushare.mps import PIPE_MOUNT  # noqa: E402
from tests.test_gpu_share import engine, spawner  # noqa: E402, F401 (fixtures)
from tests.test_gpu_share_mps import STAND_IN, daemons, no_daemons  # noqa: E402, F401


def run_in(engine, cid: str, *cmd: str) -> tuple[int, str]:  # noqa: F811
    """``cmd`` run in container ``cid`` as the container's user (what the server's owner
    runs in a terminal): (exit status, output)."""
    ex = engine.exec_create(cid, list(cmd))
    out = engine.exec_start(ex).decode(errors="replace")
    return engine.exec_inspect(ex["Id"])["ExitCode"], out


@pytest.fixture
async def two_mps_clients(no_daemons, spawner, engine):  # noqa: F811
    """ann's and bob's servers, quarter shares of one GPU under gpuspawner's MPS daemon, both
    at the backend's default uid (1000: no uid map, as a site without LDAP uids has it).
    Returns (ann's container id, bob's)."""
    sps = [spawner(u, node={"gpu_share": "mps-daemon"}) for u in ("gsatka", "gsatkb")]
    backend = sps[0].cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1  # the stand-in server ignores SIGTERM (pid 1)
    for sp in sps:
        await asyncio.wait_for(sp.start(), 90)
    assert sps[0].backend_state["mps_gpu"] == sps[1].backend_state["mps_gpu"]
    assert len(daemons(engine)) == 1
    yield tuple(sp.backend_state["container_id"] for sp in sps)
    for sp in sps:
        await sp.stop()


@pytest.mark.docker
async def test_mps_client_cannot_touch_the_daemons_pipes_or_see_the_others_processes(
        two_mps_clients, engine):  # noqa: F811
    """Held: the pipe volume is root's (a client can neither remove the daemon's control pipe
    nor plant a file beside it), the daemon's logs are not mounted in a client, and each
    client has a PID namespace of its own."""
    ann, bob = two_mps_clients
    code, out = run_in(engine, bob, "sh", "-c", f"rm -f {PIPE_MOUNT}/control; "
                       f"touch {PIPE_MOUNT}/planted")
    assert code != 0 and out.count("Permission denied") == 2, out
    _, out = run_in(engine, ann, "ls", PIPE_MOUNT)
    assert out.split() == ["control"], out
    code, out = run_in(engine, bob, "ls", "/var/log/nvidia-mps")
    assert code != 0, out  # the log volume: the daemon's only
    code, out = run_in(engine, ann, "sh", "-c", "sleep 30 & echo $!")
    code, out = run_in(engine, bob, "ps", "-eo", "args")
    assert "sleep 30" not in out, out


@pytest.mark.docker
@pytest.mark.xfail(strict=True, reason=(
    "open: MPS clients of one GPU share the daemon's IPC namespace (IpcMode container:<daemon>) "
    "and with it one /dev/shm and the System V IPC objects: at the default uid another user "
    "reads a 0600 POSIX shared memory segment of yours (a DataLoader's tensors); see "
    "docs/gpu-sharing.md, MPS"))
async def test_mps_client_cannot_read_another_users_shared_memory(
        two_mps_clients, engine):  # noqa: F811
    ann, bob = two_mps_clients
    # ann: a POSIX shared memory segment as shm_open makes it (a file in /dev/shm, mode
    # 0600, as torch's and multiprocessing's are) and a System V segment, mode 0600
    code, out = run_in(engine, ann, "sh", "-c", "umask 077; printf secret-of-gsatka > "
                       "/dev/shm/torch_4242_1; ipcmk -M 4096 -p 0600")
    assert code == 0, out
    # bob, in his own server: lists and reads them
    _, listing = run_in(engine, bob, "ls", "/dev/shm")
    _, content = run_in(engine, bob, "cat", "/dev/shm/torch_4242_1")
    _, sysv = run_in(engine, bob, "cat", "/proc/sysvipc/shm")
    leaked = {"name": "torch_4242_1" in listing, "content": "secret-of-gsatka" in content,
              "System V segment": any(line.split()[3:4] == ["4096"]
                                      for line in sysv.splitlines()[1:])}
    assert not any(leaked.values()), leaked
