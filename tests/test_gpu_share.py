"""GPU shares held on the device (:mod:`gpuspawner.gpushare.mechanism`): each node's mechanism
chosen at start (dmem from a cgroup tree, MPS when the admin asks and the daemon's folder is
there, else the watchdog), shown in api/nodes and on the admin map; a share's limits in a real
container's environment, its MPS folder and IPC namespace, its dmem cgroup parent. No GPU and
no dmem controller here (cgroup v1): the dmem files are a tree in a temporary folder, the real
engine makes the container under the cgroup parent named after it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gpuspawner.gpushare.mechanism import (
    Mechanism,
    ShareModeUnavailable,
    detect_mechanism,
    dmem_capacity,
    prepare_dmem_cgroup,
    remove_dmem_cgroup,
    share_limits,
)
from gpuspawner.hub.cluster import NodeConfigError, parse_node_config, reset_clusters
from gpuspawner.placement.model import GPU, Allocation, GPUShare, Owner

GiB = 1024**3
UUID = "GPU-6513270e-269e-0d37-f2a7-4de452e6b438"
A100 = GPU(
    uuid=UUID,
    index=0,
    model="A100",
    memory_bytes=80 * GiB,
    pci_bus_id="00000000:3B:00.0",
    numa_node=0,
    shareable=True,
)
REGION = "drm/0000:3b:00.0/vram0"


def cgroup_tree(
    root: Path,
    controllers: str = "cpu memory dmem",
    capacity: str = f"{REGION} {80 * GiB}\ndrm/0000:3b:00.0/stolen 8650752\n",
) -> Path:
    """A cgroup v2 root as the kernel shows it (cgroup.controllers, dmem.capacity)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    if capacity is not None:
        (root / "dmem.capacity").write_text(capacity)
    return root


def alloc(milli: int, uuid: str = UUID) -> Allocation:
    return Allocation(
        id="a1",
        owner=Owner("alice", ""),
        node="n",
        gpus=(GPUShare(uuid, milli),),
        cpuset=(0,),
        mems=(0,),
        memory_bytes=GiB,
        disk_bytes=0,
    )


# ------------------------------------------------------------------ the choice per node
def test_auto_takes_dmem_where_the_gpu_has_a_region(tmp_path):
    root = cgroup_tree(tmp_path / "cg")
    assert dmem_capacity(str(root)) == {REGION: 80 * GiB, "drm/0000:3b:00.0/stolen": 8650752}
    m = detect_mechanism("auto", [A100], cgroup_root=str(root))
    assert m.name == "dmem" and m.regions == {UUID: REGION}  # vram, not stolen memory


@pytest.mark.parametrize(
    ("controllers", "capacity", "why"),
    [
        ("cpu memory", f"{REGION} 1\n", "no cgroup v2 dmem controller"),
        ("cpu memory dmem", "drm/0000:af:00.0/vram0 1\n", "has no region"),
    ],
)
def test_auto_falls_back_to_the_watchdog_saying_why(tmp_path, controllers, capacity, why):
    root = cgroup_tree(tmp_path / "cg", controllers, capacity)
    m = detect_mechanism("auto", [A100], cgroup_root=str(root))
    assert m.name == "watchdog" and why in m.reason
    with pytest.raises(ShareModeUnavailable, match=why):
        detect_mechanism("dmem", [A100], cgroup_root=str(root))


def test_this_host_has_no_dmem_so_auto_is_the_watchdog():
    # cgroup v1 here: no /sys/fs/cgroup/cgroup.controllers
    assert detect_mechanism("auto", [A100]).name == "watchdog"


def test_mps_only_when_asked_and_the_daemon_folder_exists(tmp_path):
    assert (
        detect_mechanism(
            "auto", [A100], cgroup_root=str(tmp_path), mps_pipe_directory=str(tmp_path)
        ).name
        == "watchdog"
    )
    with pytest.raises(ShareModeUnavailable, match="nvidia-cuda-mps-control"):
        detect_mechanism("mps", [A100], mps_pipe_directory=str(tmp_path / "none"))
    m = detect_mechanism("mps", [A100], mps_pipe_directory=str(tmp_path))
    assert m.name == "mps" and m.mps_pipe_directory == str(tmp_path)
    # a remote node: taken as the admin says, auto cannot look
    assert detect_mechanism("mps", [A100], local=False, mps_pipe_directory="/nowhere").name == "mps"
    assert detect_mechanism("auto", [A100], local=False).name == "watchdog"


def test_a_node_asking_for_what_it_lacks_stops_the_hub_naming_the_setting(tmp_path):
    with pytest.raises(NodeConfigError, match=r"nodes\[0\] \(local\)\.gpu_share: 'dmem'"):
        parse_node_config([{"name": "local", "gpu_share": "dmem"}])
    with pytest.raises(NodeConfigError, match=r"GPUSpawner\.gpu_share_mode: 'mps'"):
        parse_node_config([{"name": "local"}], share_mode="mps")
    with pytest.raises(NodeConfigError, match="gpu_share"):
        parse_node_config([{"name": "local", "gpu_share": "sometimes"}])
    (rt,) = parse_node_config([{"name": "local", "gpu_share": "watchdog"}], share_mode="mps")
    assert rt.gpu_share.name == "watchdog"


# ------------------------------------------------------------------ the limits of a share
def test_a_quarter_share_gets_a_quarter_of_the_memory_under_each_mechanism():
    dmem = Mechanism("dmem", "", regions={UUID: REGION})
    lim = share_limits(alloc(250), {UUID: A100}, dmem, "jupyter-alice")
    assert lim.env["GPUSPAWNER_GPU_MEMORY_LIMIT"] == str(20 * GiB)
    assert lim.env["GPUSPAWNER_GPU_MEMORY_FRACTION"] == "0.250"
    assert lim.env["GPUSPAWNER_GPU_SHARE_MECHANISM"] == "dmem"
    assert lim.cgroup_parent == "/gpuspawner/jupyter-alice"
    assert lim.dmem_max == {REGION: 20 * GiB}
    mps = share_limits(alloc(250), {UUID: A100}, Mechanism("mps", "", mps_pipe_directory="/p"), "x")
    assert mps.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert mps.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert mps.env["CUDA_MPS_PIPE_DIRECTORY"] == "/p" and not mps.cgroup_parent
    dog = share_limits(alloc(250), {UUID: A100}, Mechanism("watchdog", ""), "x")
    assert dog.memory_bytes == {UUID: 20 * GiB} and not dog.cgroup_parent
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in dog.env


def test_a_whole_gpu_has_nothing_to_hold():
    lim = share_limits(alloc(1000), {UUID: A100}, Mechanism("dmem", "", {UUID: REGION}), "x")
    assert lim.env == {"GPUSPAWNER_GPU_SHARE_MECHANISM": "dmem"}
    assert not lim.memory_bytes and not lim.cgroup_parent


def test_the_dmem_parent_is_made_with_its_limit_and_removed(tmp_path):
    root = cgroup_tree(tmp_path / "cg")
    lim = share_limits(
        alloc(500), {UUID: A100}, Mechanism("dmem", "", {UUID: REGION}), "jupyter-bob"
    )
    (root / "gpuspawner").mkdir()
    (root / "gpuspawner" / "cgroup.subtree_control").write_text("")
    path = prepare_dmem_cgroup(lim, str(root))
    assert path == str(root / "gpuspawner" / "jupyter-bob")
    assert (root / "gpuspawner/jupyter-bob/dmem.max").read_text() == f"{REGION} {40 * GiB}\n"
    assert (root / "cgroup.subtree_control").read_text() == "+dmem"  # the kernel's write form
    assert (root / "gpuspawner/cgroup.subtree_control").read_text() == "+dmem"
    os.remove(root / "gpuspawner/jupyter-bob/dmem.max")  # the kernel's files go with rmdir
    remove_dmem_cgroup(lim.cgroup_parent, str(root))
    assert not (root / "gpuspawner/jupyter-bob").exists()


# ------------------------------------------------------------------ real containers
docker = pytest.importorskip("docker")
from jupyterhub.objects import Hub  # noqa: E402
from traitlets.config import Config  # noqa: E402

from gpuspawner.backends.docker_backend import DockerBackend  # noqa: E402
from gpuspawner.hub.service.views import map_view, node_views, page_templates  # noqa: E402
from gpuspawner.hub.spawner import GPUSpawner  # noqa: E402
from gpuspawner.testing.fakes import FakeUser  # noqa: E402
from gpuspawner.webui import service_links  # noqa: E402
from tests.test_spawner_docker import FAKE_SERVER, gpu_topology  # noqa: E402

IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")


@pytest.fixture
def engine():
    try:
        c = docker.APIClient(version="auto")
        c.inspect_image(IMAGE)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"needs a Docker engine and {IMAGE} (make engine images): {e}")
    return c


@pytest.fixture
def spawner(tmp_path, engine, monkeypatch):
    reset_clusters()
    monkeypatch.setattr(
        "gpuspawner.hub.spawner.hub_db_url",
        lambda: f"sqlite:///{tmp_path / 'state' / 'jupyterhub.sqlite'}",
    )
    topo = gpu_topology(tmp_path)
    text = topo.read_text().replace("numa_node:", "shareable: true\n  numa_node:")
    topo.write_text(text)
    made: list[GPUSpawner] = []

    def make(user: str, node: dict | None = None, **config) -> GPUSpawner:
        (tmp_path / "state").mkdir(exist_ok=True)
        cfg = Config()
        cfg.GPUSpawner.nodes = [{"name": "gpunode", "topology": str(topo), **(node or {})}]
        cfg.GPUSpawner.profiles = [{"slug": "quarter", "cpu": 1, "memory": "256M", "gpus": 0.25}]
        cfg.GPUSpawner.cmd = FAKE_SERVER
        cfg.GPUSpawner.state_dir = str(tmp_path / "state")
        cfg.GPUSpawner.gpu_share_interval = 0.0
        for k, v in config.items():
            cfg.GPUSpawner[k] = v
        sp = GPUSpawner(
            config=cfg,
            user=FakeUser(user),
            hub=Hub(),
            oauth_client_id=f"c-{user}",
            api_token="secret-token",
        )
        sp.user_options = {"profile": "quarter"}
        made.append(sp)
        return sp

    yield make
    for sp in made:
        cid = sp.backend_state.get("container_id")
        if cid:
            try:
                engine.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass
        net = sp.backend_state.get("network")
        if net:
            try:
                engine.remove_network(net["name"])
            except docker.errors.NotFound:
                pass
    reset_clusters()


def container_env(engine, cid: str) -> dict[str, str]:
    """The environment the server's own process sees (``env`` run inside it)."""
    ex = engine.exec_create(cid, ["env"])
    out = engine.exec_start(ex).decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.docker
async def test_a_share_starts_with_its_limits_and_the_map_shows_the_mechanism(spawner, engine):
    sp = spawner("gsamy")
    await asyncio.wait_for(sp.start(), 90)
    env = container_env(engine, sp.backend_state["container_id"])
    assert env["GPUSPAWNER_GPU_MEMORY_LIMIT"] == str(20 * GiB)  # 1/4 of the topology's 80G
    assert env["GPUSPAWNER_GPU_MEMORY_FRACTION"] == "0.250"
    assert env["GPUSPAWNER_GPU_SHARE_MECHANISM"] == "watchdog"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    (node,) = node_views(sp.cluster, None)
    assert node["gpu_share"]["mechanism"] == "watchdog"
    assert "no dmem" in node["gpu_share"]["reason"]
    view = map_view(sp.cluster)
    html = (
        page_templates()
        .get_template("admin.html.j2")
        .render(
            view=view,
            user={"name": "admin", "admin": True},
            prefix="/services/gpuspawner/",
            hub_prefix="/hub/",
            refresh_s=5,
            links=service_links("/services/", "GPU map"),
            api_links=[],
        )
    )
    assert 'data-testid="gpu-share" data-mechanism="watchdog"' in html
    assert "shares held by: watchdog" in html
    await sp.stop()


@pytest.mark.docker
async def test_an_mps_node_gives_the_client_limits_folder_and_ipc(spawner, engine, tmp_path):
    pipe = "/tmp/nvidia-mps"
    made = not os.path.isdir(pipe)
    os.makedirs(pipe, exist_ok=True)
    try:
        sp = spawner("gsbob", node={"gpu_share": "mps"})
        await asyncio.wait_for(sp.start(), 90)
        cid = sp.backend_state["container_id"]
        env = container_env(engine, cid)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        hc = engine.inspect_container(cid)["HostConfig"]
        assert hc["IpcMode"] == "host"
        assert f"{pipe}:{pipe}:rw" in hc["Binds"]
        assert node_views(sp.cluster, None)[0]["gpu_share"]["mechanism"] == "mps"
        await sp.stop()
    finally:
        if made:
            os.rmdir(pipe)


@pytest.mark.docker
async def test_a_dmem_node_runs_the_share_under_its_own_cgroup_parent(
    spawner, engine, tmp_path, monkeypatch
):
    if engine.info().get("CgroupDriver") != "cgroupfs":
        pytest.skip("the engine uses the systemd cgroup driver")
    root = cgroup_tree(tmp_path / "cg")
    sp = spawner("gscal")
    rt = sp.cluster.nodes["gpunode"]
    # this host has no dmem controller: the node's choice as on a host that has, the cgroup
    # files in a tree of this test's (the engine still makes the parent it is given)
    uuid = rt.node.gpus[0].uuid
    rt.gpu_share = Mechanism(
        "dmem", "test", regions={g.uuid: f"drm/{g.index}/vram0" for g in rt.node.gpus}
    )
    monkeypatch.setattr(DockerBackend, "cgroup_root", str(root))
    (root / "gpuspawner").mkdir()
    (root / "gpuspawner" / "cgroup.subtree_control").write_text("")
    await asyncio.wait_for(sp.start(), 90)
    cid = sp.backend_state["container_id"]
    assert (
        engine.inspect_container(cid)["HostConfig"]["CgroupParent"] == "/gpuspawner/jupyter-gscal"
    )
    granted = sp.allocation.gpus[0]
    index = next(g.index for g in rt.node.gpus if g.uuid == granted.uuid)
    limit = (root / "gpuspawner/jupyter-gscal/dmem.max").read_text()
    assert limit == f"drm/{index}/vram0 {20 * GiB}\n"
    assert uuid  # a GPU of the node
    os.remove(root / "gpuspawner/jupyter-gscal/dmem.max")  # the kernel's files go with rmdir
    await sp.stop()
    assert not (root / "gpuspawner/jupyter-gscal").exists()
    # the engine's own (cgroup v1) copies of the parent, empty now: not left behind
    for parent in Path("/sys/fs/cgroup").glob("*/gpuspawner/jupyter-gscal"):
        try:
            parent.rmdir()
            parent.parent.rmdir()
        except OSError:
            pass
