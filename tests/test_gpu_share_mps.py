"""MPS control daemons run by gpuspawner (``gpu_share: mps-daemon``,
:mod:`gpuspawner.gpushare.mps`): one per shared GPU in a container of its own, started by the
Docker backend before the GPU's first MPS client and stopped after its last.

No GPU here: the node is a topology file with two A100s (this host's CPUs); the daemon's
container runs a stand-in command (``c.DockerBackend.mps_daemon_command``) instead of
``nvidia-cuda-mps-control -f``, which the NVIDIA container toolkit would bring. What is checked
on the real engine is the daemon's container spec (a device request for exactly that GPU's
UUID, the MPS environment, the pipe and log volumes, a shareable IPC namespace, no network)
and each client's (the pipe volume at the same path, the daemon's IPC namespace, the MPS
limits), and the daemon's life: one for two clients of a GPU, gone after the last.
"""

from __future__ import annotations

import asyncio

import pytest

from gpuspawner.gpushare.mechanism import Mechanism, detect_mechanism, share_limits
from gpuspawner.gpushare.mps import (
    CLIENT_LABEL,
    DAEMON_LABEL,
    LOG_MOUNT,
    PIPE_MOUNT,
    client_host_config,
    daemon_for,
)
from gpuspawner.hub.cluster import parse_node_config
from tests.test_gpu_share import A100, UUID, alloc

# the stand-in daemon: makes a 'control' file where nvidia-cuda-mps-control makes its pipe,
# then waits (TERM ends it at once, as `docker stop` sends)
STAND_IN = ["sh", "-c", 'touch "$CUDA_MPS_PIPE_DIRECTORY/control"; trap "exit 0" TERM; '
            "while :; do sleep 0.2; done"]


# ------------------------------------------------------------------ pure
def test_mps_daemon_mode_needs_no_daemon_of_the_admin():
    m = detect_mechanism("mps-daemon", [A100], mps_pipe_directory="/nowhere")
    assert (m.name, m.mps_daemon, m.mps_pipe_directory) == ("mps", True, PIPE_MOUNT)
    assert "one MPS control daemon per shared GPU" in m.reason
    (rt,) = parse_node_config([{"name": "local", "gpu_share": "mps-daemon"}])
    assert rt.gpu_share.mps_daemon


def test_a_client_of_a_managed_daemon_gets_the_limits_and_its_gpu_not_a_host_folder():
    lim = share_limits(alloc(250), {UUID: A100}, detect_mechanism("mps-daemon", [A100]), "x")
    assert lim.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert lim.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert lim.env["CUDA_MPS_PIPE_DIRECTORY"] == PIPE_MOUNT
    assert lim.mps_daemon_gpu == UUID and not lim.mps_pipe_directory
    # the admin's own daemon: a host folder, no managed daemon
    own = share_limits(alloc(250), {UUID: A100}, Mechanism("mps", "", mps_pipe_directory="/p"),
                       "x")
    assert own.mps_pipe_directory == "/p" and not own.mps_daemon_gpu


def test_the_daemon_spec_and_a_client_joining_it():
    d = daemon_for("node 1", UUID, "img", labels={"gpuspawner.hub": "h1"})
    assert d.name == f"gpuspawner-mps-node-1-{UUID.lower()}"
    assert (d.pipe_volume, d.log_volume) == (f"{d.name}-pipe", f"{d.name}-log")
    assert d.labels == {"gpuspawner.hub": "h1", DAEMON_LABEL: UUID}
    host = d.host_kwargs()
    assert host["device_requests"][0]["device_ids"] == [UUID]
    assert host["ipc_mode"] == "shareable" and host["network_mode"] == "none"
    assert host["binds"][d.log_volume]["bind"] == LOG_MOUNT
    client = client_host_config({"binds": {"/home/a": {"bind": "/home/a", "mode": "rw"}}}, d)
    assert client["ipc_mode"] == f"container:{d.name}"
    assert client["binds"][d.pipe_volume] == {"bind": PIPE_MOUNT, "mode": "rw"}
    assert d.log_volume not in client["binds"]  # the daemon's logs name every client
    with pytest.raises(ValueError, match="IPC namespace"):
        client_host_config({"ipc_mode": "host"}, d)
    with pytest.raises(ValueError, match="already mounted"):
        client_host_config({"binds": {"/x": {"bind": PIPE_MOUNT, "mode": "ro"}}}, d)
    with pytest.raises(ValueError):
        daemon_for("n", "", "img")


# ------------------------------------------------------------------ the real engine
docker = pytest.importorskip("docker")
from gpuspawner.gpushare.check import (  # noqa: E402
    CHECK_LABEL,
    Context,
    start_mps_daemon,
    stop_mps_daemon,
)
from gpuspawner.hub.service.views import node_views  # noqa: E402

# the real-container fixtures of the GPU share tests (a spawner on a two-A100 topology file)
from tests.test_gpu_share import IMAGE, container_env, engine, spawner  # noqa: E402, F401


def daemons(cli, gpu: str | None = None) -> list[dict]:
    label = f"{DAEMON_LABEL}={gpu}" if gpu else DAEMON_LABEL
    return cli.containers(all=True, filters={"label": label})


@pytest.fixture
def no_daemons(engine):  # noqa: F811
    """No MPS daemon before or after the test (removed with their volumes)."""
    def clear() -> None:
        for c in daemons(engine):
            engine.remove_container(c["Id"], force=True)
        for v in engine.volumes(filters={"label": DAEMON_LABEL}).get("Volumes") or []:
            engine.remove_volume(v["Name"], force=True)

    clear()
    yield
    clear()


@pytest.mark.docker
async def test_one_daemon_per_gpu_started_before_its_first_client_stopped_after_its_last(
        no_daemons, spawner, engine):  # noqa: F811 (no_daemons first: torn down last)
    uids = {"gsmib": {"uid": 1001, "gid": 100}}  # gsmia: the default, 1000
    sps = [spawner("gsmia", node={"gpu_share": "mps-daemon"}, uid_map=uids) for _ in (1, 2)]
    other = spawner("gsmib", node={"gpu_share": "mps-daemon"}, uid_map=uids)
    backend = sps[0].cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1  # the stand-in server ignores SIGTERM (pid 1)
    await asyncio.wait_for(sps[0].start(), 90)
    gpu = sps[0].backend_state["mps_gpu"]
    (d,) = daemons(engine, gpu)
    info = engine.inspect_container(d["Id"])
    hc, cfg = info["HostConfig"], info["Config"]
    # the daemon: exactly that GPU by UUID, its MPS folders, a shareable IPC namespace
    (req,) = hc["DeviceRequests"]
    assert (req["Driver"], req["DeviceIDs"]) == ("nvidia", [gpu])
    assert hc["IpcMode"] == "shareable" and hc["NetworkMode"] == "none"
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == PIPE_MOUNT
    assert env["CUDA_MPS_LOG_DIRECTORY"] == LOG_MOUNT
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts[PIPE_MOUNT]["Type"] == "volume" and mounts[LOG_MOUNT]["Type"] == "volume"
    assert cfg["Entrypoint"] + cfg["Cmd"] == STAND_IN and info["State"]["Running"]
    assert cfg["User"] == "0:0"  # the control daemon starts servers as its clients' uids

    # api/nodes and the admin map: MPS, with gpuspawner's daemons as the reason
    (node,) = node_views(sps[0].cluster, None)
    assert node["gpu_share"]["mechanism"] == "mps"
    assert "one MPS control daemon per shared GPU run by gpuspawner" in node["gpu_share"]["reason"]

    # the client: the daemon's pipe volume at the same path, its IPC namespace, its limits
    cid = sps[0].backend_state["container_id"]
    client = engine.inspect_container(cid)
    assert client["HostConfig"]["IpcMode"] == f"container:{d['Id']}"  # the engine's id
    assert client["Config"]["Labels"][CLIENT_LABEL] == gpu
    cmounts = {m["Destination"]: m for m in client["Mounts"]}
    assert cmounts[PIPE_MOUNT]["Name"] == mounts[PIPE_MOUNT]["Name"]
    assert LOG_MOUNT not in cmounts
    cenv = container_env(engine, cid)
    assert cenv["CUDA_MPS_PIPE_DIRECTORY"] == PIPE_MOUNT
    assert cenv["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert cenv["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    # the client sees what the daemon made in the shared folder
    ex = engine.exec_create(cid, ["ls", PIPE_MOUNT])
    assert "control" in engine.exec_start(ex).decode().split()

    # another user's share on that GPU is refused: MPS clients share the daemon's IPC
    # namespace (/dev/shm, System V segments: tests/test_attack_usage.py), and MPS serves one
    # uid at a time; nothing of theirs is left, and the ledger has their GPU back. The
    # placement keeps it off that GPU (test_another_users_share_starts_on_another_gpu...);
    # with its rule off, as a placement that did not steer, the start-time check refuses
    ledger = sps[0].cluster.ledger
    assert ledger.one_user_share_nodes == {"gpunode"}
    ledger.set_one_user_shares([])
    with pytest.raises(Exception, match="runs under MPS .* for another user's server"):
        await asyncio.wait_for(other.start(), 90)
    ledger.set_one_user_shares(["gpunode"])
    assert not other.backend_state.get("container_id")
    assert [c for c in engine.containers(all=True, filters={"label": [f"{CLIENT_LABEL}={gpu}"]})
            if c["Labels"].get("gpuspawner.user") == "gsmib"] == []
    assert sps[0].cluster.ledger.find("gsmib", "") is None
    # the same user's second share: on the same GPU (the ledger packs shares), same daemon
    await asyncio.wait_for(sps[1].start(), 90)
    assert sps[1].backend_state["mps_gpu"] == gpu
    assert [c["Id"] for c in daemons(engine)] == [d["Id"]]
    await sps[0].stop()
    assert [c["Id"] for c in daemons(engine)] == [d["Id"]]  # one client left: it stays
    assert engine.inspect_container(d["Id"])["State"]["Running"]
    await sps[1].stop()
    assert not daemons(engine)  # removed by the last client's stop, before it returns
    names = [v["Name"] for v in engine.volumes(filters={"label": DAEMON_LABEL}).get(
        "Volumes") or []]
    assert f"{info['Name'].lstrip('/')}-log" in names  # the logs stay for the admin
    assert f"{info['Name'].lstrip('/')}-pipe" not in names


@pytest.mark.docker
async def test_another_users_share_starts_on_another_gpu_with_a_daemon_of_its_own(
        no_daemons, spawner, engine):  # noqa: F811
    """The refusal of tests/test_attack_usage.py's replay, with room elsewhere: the placement
    used to put bob's share on ann's GPU (best fit packs shares) and his server was refused
    at start (her daemon's clients share its IPC namespace). Now the ledger keeps it off her
    GPU: it starts on the node's other GPU under a daemon of its own, and neither server
    joins the other's daemon."""
    ann = spawner("gsmoa", node={"gpu_share": "mps-daemon"})
    bob = spawner("gsmob", node={"gpu_share": "mps-daemon"})
    backend = ann.cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1  # the stand-in server ignores SIGTERM (pid 1)
    await asyncio.wait_for(ann.start(), 90)
    try:
        await asyncio.wait_for(bob.start(), 90)
        try:
            a_gpu, b_gpu = ann.backend_state["mps_gpu"], bob.backend_state["mps_gpu"]
            assert a_gpu != b_gpu
            assert ann.cluster.ledger.find("gsmob", "").gpu_uuids == [b_gpu]
            (da,), (db,) = daemons(engine, a_gpu), daemons(engine, b_gpu)
            for sp, d in ((ann, da), (bob, db)):
                info = engine.inspect_container(sp.backend_state["container_id"])
                assert info["HostConfig"]["IpcMode"] == f"container:{d['Id']}"
        finally:
            await bob.stop()
    finally:
        await ann.stop()
    assert not daemons(engine)


@pytest.mark.docker
async def test_a_daemon_left_without_clients_is_removed_by_the_sweep(
        no_daemons, spawner, engine):  # noqa: F811
    """A hub that stopped between a GPU's last client and its daemon: the next start's sweep
    stops the daemon; a daemon with a client stays."""
    sp = spawner("gsmic", node={"gpu_share": "mps-daemon"})
    backend = sp.cluster.backend
    backend.mps_daemon_command = STAND_IN
    backend.stop_timeout = 1  # the stand-in server ignores SIGTERM (pid 1)
    await asyncio.wait_for(sp.start(), 90)
    gpu = sp.backend_state["mps_gpu"]
    await backend.sweep("gpunode", lambda _: True, lambda *_: True)
    assert len(daemons(engine, gpu)) == 1  # its client runs
    engine.remove_container(sp.backend_state["container_id"], force=True)  # the client gone
    await backend.sweep("gpunode", lambda _: True, lambda *_: True)
    assert not daemons(engine)


@pytest.mark.docker
def test_gpu_check_runs_its_mps_shares_under_a_daemon_as_the_backend_makes_it(
        no_daemons, engine):  # noqa: F811
    """``make gpu-check``'s MPS shares where the admin runs no daemon: the same daemon
    container (gpuspawner.gpushare.check.start_mps_daemon), its volumes removed after."""
    ctx = Context(nvml=None, smi=lambda args: "", engine=engine, image=IMAGE)
    d, cid = start_mps_daemon(ctx, UUID, STAND_IN)
    try:
        info = engine.inspect_container(cid)
        assert info["HostConfig"]["IpcMode"] == "shareable"
        assert info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == [UUID]
        assert info["Config"]["Labels"][CHECK_LABEL] == "1"
    finally:
        stop_mps_daemon(ctx, d, cid)
    assert not daemons(engine)
    assert not engine.volumes(filters={"label": DAEMON_LABEL}).get("Volumes")
    # a daemon that never makes its control pipe: refused, nothing left
    with pytest.raises(RuntimeError, match="no control pipe"):
        start_mps_daemon(ctx, UUID, ["sleep", "30"], timeout=1.0)
    assert not daemons(engine)
