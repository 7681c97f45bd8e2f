"""GPUSpawner against the real Docker engine, without a hub: the container it creates (device
requests by GPU UUID, cpuset, memory, hardening, labels), rollback on failure and on a start
timeout, the shared home's ownership. Marked ``docker``; skipped with a reason when no engine
answers."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

docker = pytest.importorskip("docker")

from jupyterhub.objects import Hub  # noqa: E402
from tornado import web  # noqa: E402
from traitlets.config import Config  # noqa: E402

from gpuspawner.backends.docker_backend import DockerBackend  # noqa: E402
from gpuspawner.backends.docker_network import ServerNetwork  # noqa: E402
from gpuspawner.backends.spec import ALLOCATION_LABEL  # noqa: E402
from gpuspawner.hub.cluster import reset_clusters  # noqa: E402
from gpuspawner.hub.metrics import SERVER_MOVES  # noqa: E402
from gpuspawner.hub.spawner import GPUSpawner  # noqa: E402
from gpuspawner.inventory.local import read_local_node  # noqa: E402
from gpuspawner.inventory.topology import node_to_dict  # noqa: E402
from gpuspawner.testing.fakes import FakeUser  # noqa: E402

pytestmark = pytest.mark.docker
IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")


@pytest.fixture(scope="module")
def client():
    try:
        c = docker.APIClient(version="auto")
        c.inspect_image(IMAGE)
    except Exception as e:  # no engine or no image
        pytest.skip(f"needs a Docker engine and {IMAGE} (make engine images): {e}")
    return c


def assert_removed(client, cid: str, timeout: float = 15) -> None:
    """The container is gone (auto_remove may finish a moment after the API call)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.inspect_container(cid)
        except docker.errors.NotFound:
            return
        time.sleep(0.2)
    raise AssertionError(f"container {cid[:12]} still exists")


def gpu_topology(tmp_path: Path) -> Path:
    """This host's CPUs and memory plus two declared (not present) GPUs on NUMA node 0."""
    local = node_to_dict(read_local_node("gpunode"))
    first_numa = local["numa_nodes"][0]["id"]
    local["gpus"] = [
        {"uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}", "index": i, "model": "A100",
         "memory": "80G", "pci_bus_id": f"00000000:0{i + 1}:00.0", "numa_node": first_numa}
        for i in range(2)
    ]
    local.pop("links", None)
    path = tmp_path / "gpunode.yaml"
    path.write_text(yaml.safe_dump(local))
    return path


#: without a hub, jupyterhub-singleuser cannot start: a stand-in that answers as a Jupyter
#: server does ({"version": ...} on every path, port 8888)
FAKE_SERVER = ["python3", "-c", (
    "import http.server as h\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers()\n"
    "        self.wfile.write(b'{\"version\": \"0\"}')\n"
    "h.HTTPServer(('0.0.0.0', 8888), H).serve_forever()\n")]


@pytest.fixture
def make_spawner(tmp_path, client, monkeypatch):
    reset_clusters()
    # as inside a hub: a database beside the state folder gives this test's spawners a hub id
    # of their own, so the cluster never adopts, books or sweeps the servers of other test
    # modules' hubs on the same engine (make test runs modules in parallel); outside a hub
    # every managed object on the engine would count as this cluster's
    monkeypatch.setattr("gpuspawner.hub.spawner.hub_db_url",
                        lambda: f"sqlite:///{tmp_path / 'state' / 'jupyterhub.sqlite'}")
    made: list[GPUSpawner] = []
    topo = gpu_topology(tmp_path)

    def make(user: str = "alice", options: dict | None = None, **config) -> GPUSpawner:
        config.setdefault("nodes", [{"name": "gpunode", "topology": str(topo)}])
        config.setdefault("profiles", [
            {"slug": "cpu", "cpu": 1, "memory": "256M"},
            {"slug": "gpu1", "cpu": 1, "memory": "256M", "gpus": 1},
            {"slug": "missing", "cpu": 1, "memory": "256M", "image": "gpuspawner/nope:0"},
        ])
        (tmp_path / "home").mkdir(exist_ok=True)  # the shared file system's folder
        config.setdefault("home_path_template", str(tmp_path / "home" / "{username}"))
        config.setdefault("cmd", FAKE_SERVER)
        # the queue and drains files in this test's folder: by default they land beside the
        # hub database, i.e. in the working directory, where an entry another test left
        # waiting put this test's spawn behind it ("1 spawn wait ahead of you")
        (tmp_path / "state").mkdir(exist_ok=True)
        config.setdefault("state_dir", str(tmp_path / "state"))
        cfg = Config()
        for key, value in config.items():  # each setting to the class that has it
            section = "DockerBackend" if DockerBackend.class_traits().get(key) is not None \
                and key not in GPUSpawner.class_traits() else "GPUSpawner"
            cfg[section][key] = value
        sp = GPUSpawner(config=cfg, user=FakeUser(user), hub=Hub(), oauth_client_id=f"c-{user}",
                        api_token="secret-token")
        sp.user_options = options or {"profile": "cpu"}
        made.append(sp)
        return sp

    yield make
    for sp in made:
        if container_id(sp):
            try:
                client.remove_container(container_id(sp), force=True)
            except docker.errors.NotFound:
                pass
        if server_network(sp) is not None:
            client.remove_network(server_network(sp).name)
    reset_clusters()


def container_id(sp: GPUSpawner) -> str:
    return sp.backend_state.get("container_id", "")


def server_network(sp: GPUSpawner) -> ServerNetwork | None:
    net = sp.backend_state.get("network")
    return ServerNetwork.from_dict(net) if net else None


async def test_gpu_container_has_exactly_the_allocated_uuids(make_spawner, client):
    sp = make_spawner("gpuuser", {"profile": "gpu1"}, default_uid=1234, default_gid=1234)
    engine = sp.backend_obj.client("gpunode")
    created: list[str] = []
    engine.start = lambda cid, *a, **k: created.append(cid)  # no NVIDIA runtime here
    sp.http_timeout = 1  # created, never started: the readiness wait fails, then rollback
    state: dict = {}
    original = sp._rollback

    async def keep_state():
        state.update(sp.backend_state, alloc=sp.allocation)

    sp._rollback = keep_state  # inspect before anything is removed
    with pytest.raises(web.HTTPError):
        await asyncio.wait_for(sp.start(), 60)
    alloc = state["alloc"]
    (cid,) = created
    info = client.inspect_container(cid)
    hc = info["HostConfig"]
    requests = hc["DeviceRequests"]
    assert len(requests) == 1
    assert requests[0]["Driver"] == "nvidia"
    assert requests[0]["DeviceIDs"] == alloc.gpu_uuids
    assert requests[0]["Capabilities"] == [["gpu", "compute", "utility"]]
    assert hc["CpusetCpus"] == alloc.cpuset_str()
    assert hc["CpusetMems"] == alloc.mems_str()
    assert hc["Memory"] == 256 * 2**20 and hc["MemorySwap"] == 256 * 2**20
    assert hc["Privileged"] is False
    assert "no-new-privileges" in hc["SecurityOpt"]
    assert hc["PidsLimit"] == sp.backend_obj.pids_limit
    net = ServerNetwork.from_dict(state["network"])
    assert hc["NetworkMode"] == net.name == "jupyter-gpuuser-net"
    ipam = info["NetworkSettings"]["Networks"][net.name]["IPAMConfig"]
    assert ipam["IPv4Address"] == str(net.server_ip)
    assert net.subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15"))
    assert not any("docker.sock" in b for b in hc.get("Binds") or [])
    assert info["Config"]["User"] == "1234:1234"
    label = json.loads(info["Config"]["Labels"][ALLOCATION_LABEL])
    assert label["id"] == alloc.id and [g["uuid"] for g in label["gpus"]] == alloc.gpu_uuids
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(alloc.gpu_uuids)
    assert env["CPU_LIMIT"] == "1" and env["MEM_LIMIT"] == str(256 * 2**20)
    assert json.loads(env["GPUSPAWNER_ALLOCATION"])["id"] == alloc.id
    sp._rollback = original
    await sp._rollback()
    assert sp.cluster.ledger.allocations() == []
    assert_removed(client, cid)


async def test_gpu_start_fails_without_nvidia_runtime_and_releases(make_spawner, client):
    # This engine has the NVIDIA hook's test double (scripts/dockerd.sh), so the refusal an
    # engine without the toolkit gives at start is replayed: dockerd 20.10's own error
    sp = make_spawner("gpuuser", {"profile": "gpu1"})
    engine = sp.backend_obj.client("gpunode")
    real_start = engine.start

    def start_without_toolkit(cid, *a, **k):
        raise docker.errors.APIError(
            "500 Server Error", explanation='could not select device driver "nvidia" with '
            "capabilities: [[gpu compute utility]]")

    engine.start = start_without_toolkit
    try:
        with pytest.raises(web.HTTPError, match="could not start the container.*nvidia") as e:
            await asyncio.wait_for(sp.start(), 60)
    finally:
        engine.start = real_start
    assert e.value.status_code == 500
    assert sp.allocation is None and server_network(sp) is None
    assert sp.cluster.ledger.allocations() == []
    assert client.containers(all=True, filters={"label": "gpuspawner.user=gpuuser"}) == []
    assert client.networks(filters={"label": "gpuspawner.user=gpuuser"}) == []


async def test_missing_image_leaves_no_allocation(make_spawner, client):
    sp = make_spawner("imguser", {"profile": "missing"})
    with pytest.raises(web.HTTPError, match="image 'gpuspawner/nope:0' is not on node"):
        await asyncio.wait_for(sp.start(), 60)
    assert sp.cluster.ledger.allocations() == []


async def test_start_timeout_rolls_back(make_spawner, client):
    sp = make_spawner("slowuser")
    starting, release = threading.Event(), threading.Event()
    engine = sp.backend_obj.client("gpunode")

    def slow_start(cid, *a, **k):  # the engine hangs in start
        starting.set()
        release.wait(30)

    engine.start = slow_start
    task = asyncio.ensure_future(sp.start())
    try:
        await asyncio.wait_for(asyncio.to_thread(starting.wait, 60), 61)
        assert len(sp.cluster.ledger.allocations()) == 1
        created = container_id(sp)
        assert created
        task.cancel()  # what asyncio.wait_for(spawner.start(), start_timeout) does
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        release.set()
    assert sp.cluster.ledger.allocations() == []
    assert_removed(client, created)


async def test_run_pins_cpuset_and_home_owned_by_uid(make_spawner, client, tmp_path):
    sp = make_spawner("homeuser", uid_map={"homeuser": {"uid": 4321, "gid": 4322}})
    ip, port = await asyncio.wait_for(sp.start(), 90)
    # its own network, a fixed address in it, the fixed port inside its namespace
    assert ip == str(server_network(sp).server_ip) and port == 8888
    net_name = server_network(sp).name
    try:
        alloc = sp.allocation
        cid = container_id(sp)

        def run(cmd: str) -> str:
            ex = client.exec_create(cid, ["sh", "-c", cmd])
            return client.exec_start(ex).decode().strip()

        assert run("nproc") == "1"
        assert run("cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || "
                   "cat /sys/fs/cgroup/cpuset.cpus.effective") == alloc.cpuset_str()
        mem = run("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || "
                  "cat /sys/fs/cgroup/memory.max")
        assert int(mem) == 256 * 2**20
        assert run("id -u; id -g").split() == ["4321", "4322"]
        run("echo hello > $HOME/written-inside.txt")
        host_file = tmp_path / "home" / "homeuser" / "written-inside.txt"
        assert host_file.read_text().strip() == "hello"
        st = host_file.stat()
        assert (st.st_uid, st.st_gid) == (4321, 4322)
        home_st = (tmp_path / "home" / "homeuser").stat()
        assert (home_st.st_uid, oct(home_st.st_mode & 0o777)) == (4321, "0o700")
        assert sp._events[0]["message"].startswith("Placed: ")
        assert "256 MiB memory" in sp._events[0]["message"]
    finally:
        await sp.stop()
    assert sp.cluster.ledger.allocations() == []
    assert_removed(client, cid)
    assert client.networks(names=[net_name]) == []


async def test_home_is_made_on_the_node_through_its_engine(make_spawner, client, tmp_path):
    """home_on_node "always": the home is checked and made by a helper container on the
    node's engine, owned by the user's uid, 0700; the helper is gone afterwards."""
    sp = make_spawner("nodehome", uid_map={"nodehome": {"uid": 4331, "gid": 4332}},
                      home_on_node="always")
    await asyncio.wait_for(sp.start(), 90)
    try:
        st = (tmp_path / "home" / "nodehome").stat()
        assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o777)) == (4331, 4332, "0o700")
        assert any("on node gpunode" in e["message"] for e in sp._events)
        assert client.containers(all=True, filters={"label": "gpuspawner.home-helper=1"}) == []
    finally:
        await sp.stop()


@pytest.mark.parametrize("home_on_node", ["auto", "always"])
async def test_a_node_without_the_shared_home_fails_naming_node_and_folder(
        make_spawner, client, tmp_path, home_on_node):
    """The home's parent (the shared file system) is missing: the spawn fails naming the
    node and the folder, nothing is made, nothing stays booked."""
    missing = tmp_path / "not-mounted"
    sp = make_spawner(f"nohome{home_on_node}", home_on_node=home_on_node,
                      home_path_template=str(missing / "{username}"))
    with pytest.raises(web.HTTPError, match=f"node gpunode: the folder {missing} of the home"):
        await asyncio.wait_for(sp.start(), 90)
    assert not missing.exists()
    assert sp.cluster.ledger.allocations() == []
    assert client.containers(all=True, filters={"label": "gpuspawner.user=nohome"
                                                         + home_on_node}) == []


def test_home_path_cannot_escape(make_spawner):
    sp = make_spawner("../../etc")
    assert "/" not in sp.escaped_name  # escapism turns "/" and "." into escapes
    path = sp.home_host_path()
    assert path is not None and ".." not in Path(path).parts
    assert Path(path).parent.name == "home"


@pytest.mark.parametrize("options, message", [
    ({"profile": "nope"}, "profile: unknown profile 'nope'; choose one of: cpu, gpu1, missing"),
    ({"profile": 3}, "profile: must be a string"),
    ({"cpu": 4}, "cpu: unknown option; allowed: profile"),
    ({"profile": "cpu", "image": "evil"}, "image: profile 'cpu' offers no choice of image"),
])
async def test_bad_options_are_400_and_reserve_nothing(make_spawner, options, message):
    sp = make_spawner("bad", options)
    with pytest.raises(web.HTTPError) as e:
        await sp.start()
    assert e.value.status_code == 400
    assert message in e.value.log_message
    assert sp.cluster.ledger.allocations() == []


BTRFS_SOCK = Path(__file__).resolve().parents[1] / "var" / "run" / "docker-btrfs.sock"


async def test_disk_limit_enforced_on_btrfs_engine(make_spawner, tmp_path):
    """On the btrfs engine (make btrfs-engine), writing past the profile's disk fails."""
    url = f"unix://{BTRFS_SOCK}"
    try:
        btrfs = docker.APIClient(base_url=url, version="auto")
        assert btrfs.info()["Driver"] == "btrfs"
        btrfs.inspect_image(IMAGE)
    except Exception as e:
        pytest.skip(f"needs the btrfs engine with {IMAGE} (make btrfs-engine): {e}")
    topo = gpu_topology(tmp_path)
    sp = make_spawner("diskuser", {"profile": "disk"},
                      nodes=[{"name": "btrfs", "docker_url": url, "topology": str(topo),
                              "network_pool": "198.19.0.0/16"}],
                      profiles=[{"slug": "disk", "cpu": 1, "memory": "256M", "disk": "64M"}])
    await asyncio.wait_for(sp.start(), 90)
    try:
        assert any("disk limited to 64.0 MiB writable (btrfs" in e["message"]
                   for e in sp._events)

        def run(cmd: str) -> str:
            ex = btrfs.exec_create(container_id(sp), ["sh", "-c", cmd])
            return btrfs.exec_start(ex).decode()

        small = run("dd if=/dev/zero of=/tmp/small bs=1M count=16 2>&1; echo rc=$?")
        assert "rc=0" in small, small
        big = run("dd if=/dev/zero of=/tmp/big bs=1M count=128 2>&1; echo rc=$?")
        assert "rc=1" in big and ("Disk quota exceeded" in big or "No space left" in big), big
    finally:
        await sp.stop()
    assert sp.cluster.ledger.allocations() == []


async def test_disk_on_overlay2_is_accounted_or_refused(make_spawner, client):
    profiles = [{"slug": "disk", "cpu": 1, "memory": "256M", "disk": "1G"}]
    refuse = make_spawner("refuser", {"profile": "disk"}, profiles=profiles,
                          disk_limit_mode="refuse")
    if refuse.backend_obj.disk_limit_supported("gpunode")[0]:
        pytest.skip("the default engine can limit disk")
    with pytest.raises(web.HTTPError, match="cannot limit disk.*'refuse'") as e:
        await refuse.start()
    assert e.value.status_code == 400
    assert refuse.cluster.ledger.allocations() == []


async def test_shared_network_mode_puts_servers_on_one_network(make_spawner, client):
    """network_isolation = "shared": the named network is made when missing (a subnet of the
    pool) and both servers are on it, reached by IP (no per-server network)."""
    name = "gpuspawner-test-shared"
    a = make_spawner("sharer1", network_isolation="shared", network_name=name)
    b = make_spawner("sharer2", network_isolation="shared", network_name=name)
    try:
        ip_a, port_a = await asyncio.wait_for(a.start(), 90)
        ip_b, _ = await asyncio.wait_for(b.start(), 90)
        (net,) = client.networks(names=[name])
        subnet = ipaddress.ip_network(
            client.inspect_network(net["Id"])["IPAM"]["Config"][0]["Subnet"])
        assert ipaddress.ip_address(ip_a) in subnet
        assert ipaddress.ip_address(ip_b) in subnet and ip_a != ip_b
        assert port_a == 8888 and server_network(a) is None
    finally:
        await a.stop()
        await b.stop()
        client.remove_network(name)


async def test_host_network_mode_is_an_explicit_opt_out(make_spawner, client):
    sp = make_spawner("trusted", network_isolation="host")
    ip, port = await asyncio.wait_for(sp.start(), 90)
    try:
        assert (ip, port) == ("127.0.0.1", 8888)
        assert client.inspect_container(container_id(sp))["HostConfig"]["NetworkMode"] == "host"
    finally:
        await sp.stop()


async def test_datasets_are_read_only_and_projects_only_for_members(make_spawner, client,
                                                                     tmp_path):
    """A dataset mounted ro cannot be written (the engine's read-only bind: EROFS); a group's
    project folder is in its member's server and absent from a non-member's."""
    data = tmp_path / "datasets"
    data.mkdir()
    (data / "labels.txt").write_text("cat\ndog\n")
    projects = tmp_path / "projects"
    (projects / "physics").mkdir(parents=True)
    (projects / "physics" / "plan.txt").write_text("secret plan\n")
    settings = dict(volumes={str(data): {"bind": "/data", "mode": "ro"}},
                    group_volumes={"physics": {str(projects) + "/{group}":
                                               {"bind": "/projects/{group}", "mode": "rw"}}})
    member = make_spawner("ann", **settings)
    member.user = FakeUser("ann", groups=("physics",))
    other = make_spawner("bob", **settings)

    def run(sp, cmd: str) -> tuple[int, str]:
        ex = client.exec_create(container_id(sp), ["sh", "-c", cmd])
        out = client.exec_start(ex).decode().strip()
        return client.exec_inspect(ex["Id"])["ExitCode"], out

    await asyncio.wait_for(member.start(), 90)
    try:
        await asyncio.wait_for(other.start(), 90)
        try:
            assert run(member, "cat /data/labels.txt") == (0, "cat\ndog")
            code, out = run(member, "echo x > /data/new.txt")
            assert code != 0 and "Read-only file system" in out, out
            assert not (data / "new.txt").exists()
            assert run(member, "cat /projects/physics/plan.txt") == (0, "secret plan")
            code, out = run(other, "ls /projects/physics 2>&1; cat /projects/physics/plan.txt")
            assert code != 0 and "secret plan" not in out, out
            assert run(other, "cat /data/labels.txt")[0] == 0  # the site's data: everyone
        finally:
            await other.stop()
    finally:
        await member.stop()
    assert member.cluster.ledger.allocations() == []


async def test_group_overrides_of_quotas_are_the_requests_not_a_second_cluster(make_spawner):
    """JupyterHub's ``group_overrides`` that set ``quotas`` for a group: its members' requests
    are checked against the override's table, others' against the hub's; both spawners use
    the one cluster (before: the member's spawner got the hub's cluster and its quotas, with
    a warning, and was refused)."""
    settings = dict(
        profiles=[{"slug": "cpu2", "cpu": 2, "memory": "128M", "default": True}],
        quotas={"default_user": {"cores": 1}},
        group_overrides={"big": {"groups": ["big"], "spawner_override": {
            "quotas": {"default_user": {"cores": 4}}}}})
    small = make_spawner("small", options={"profile": "cpu2"}, **settings)
    member = make_spawner("bigone", options={"profile": "cpu2"}, **settings)
    member.user = FakeUser("bigone", groups=("big",))
    for sp in (small, member):
        await sp.apply_group_overrides()
    assert member.quotas == {"default_user": {"cores": 4}}
    assert small.quotas == {"default_user": {"cores": 1}}
    assert small.cluster is member.cluster
    assert small.request_quotas() is None and member.request_quotas() is not None
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(small.start(), 60)
    assert e.value.status_code == 400 and "over your quota for cores" in str(e.value), e.value
    await asyncio.wait_for(member.start(), 90)
    try:
        assert len(member.allocation.cpuset) == 2
        assert [a.owner.user for a in member.cluster.ledger.allocations()] == ["bigone"]
    finally:
        await member.stop()
    assert member.cluster.ledger.allocations() == []


# -- users' own images (gpuspawner.hub.images, DockerBackend.check_image) -----------------------
USER_IMAGE_PROFILES = [{"slug": "own", "cpu": 1, "memory": "256M", "profile_options": {
    "image": {"unlisted_choice": {"enabled": True}}}}]


@pytest.fixture(scope="module")
def root_image(client):
    """The single-user image made hostile: ``USER root`` and a setuid-root copy of ``id``."""
    yield from built_image(client, "gpuspawner/test-user-image:setuid",
                           "RUN cp /usr/bin/id /usr/local/bin/suid-id"
                           " && chmod 4755 /usr/local/bin/suid-id\n")


def built_image(client, tag: str, steps: str):  # noqa: ANN201 - a fixture's generator
    """Build ``tag`` from the single-user image as root plus ``steps`` (Dockerfile lines,
    no network), yield it, remove it."""
    import io

    dockerfile = f"FROM {IMAGE}\nUSER root\n{steps}"
    for _ in client.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                          network_mode="none", decode=True):
        pass
    yield tag
    try:
        client.remove_image(tag, force=True)
    except docker.errors.APIError:
        pass


def trojan_image(client, parent: Path):  # noqa: ANN201 - a fixture's generator
    """A user's own image that tries to act as root beside every home: its ``python3`` and its
    entrypoint each leave ``pwned-<uid>`` / ``pwned-entrypoint-<uid>`` in ``parent`` (the
    homes' parent folder on the host) when it is writable, then go on as usual."""
    steps = (
        'RUN real="$(command -v python3)" && mv "$real" "$real.real" && printf '
        f"'#!/bin/sh\\ntouch {parent}/pwned-$(id -u) 2>/dev/null\\n"
        'exec %s.real "$@"\\n\' "$real" > "$real" && chmod 755 "$real"\n'
        f'ENTRYPOINT ["/bin/sh", "-c", "touch {parent}/pwned-entrypoint-$(id -u) 2>/dev/null;'
        ' exec \\"$@\\"", "--"]\n')
    yield from built_image(client, "gpuspawner/test-user-image:trojan", steps)


async def test_a_users_own_image_never_runs_the_root_home_helper(make_spawner, client,
                                                                 tmp_path):
    """The home helper (home_on_node "always", as for a node whose engine is remote) runs as
    root with the parent folder of every user's home mounted. It used to run from the
    server's image, so a user's own image (``unlisted_choice``) ran its entrypoint and its
    ``python3`` there as root: read and write every home. It now runs from the admin's image;
    the user's image runs only the server, as the user."""
    parent = tmp_path / "home"
    parent.mkdir(exist_ok=True)
    images = trojan_image(client, parent)
    image = next(images)
    try:
        sp = make_spawner("trojan", options={"profile": "own", "image--unlisted-choice": image},
                          profiles=USER_IMAGE_PROFILES, home_on_node="always",
                          uid_map={"trojan": {"uid": 4361, "gid": 4362}})
        await asyncio.wait_for(sp.start(), 120)
        try:
            assert client.inspect_container(container_id(sp))["Config"]["Image"] == image
            st = (parent / "trojan").stat()
            assert (st.st_uid, oct(st.st_mode & 0o777)) == (4361, "0o700")
            assert sorted(p.name for p in parent.glob("pwned*")) == []
        finally:
            await sp.stop()
    finally:
        images.close()


async def test_a_users_own_image_runs_as_confined_as_ours(make_spawner, client, root_image):
    """An image whose user is root with a setuid-root binary: the server still runs as the
    user's uid, and the setuid bit gives nothing (no-new-privileges); the image was checked
    before booking and its digest is in the server's state."""
    sp = make_spawner("imguser", options={"profile": "own", "image--unlisted-choice": root_image},
                      profiles=USER_IMAGE_PROFILES,
                      uid_map={"imguser": {"uid": 4351, "gid": 4352}})
    await asyncio.wait_for(sp.start(), 120)
    try:
        cid = container_id(sp)
        assert client.inspect_container(cid)["Config"]["Image"] == root_image

        def run(cmd: str) -> str:
            ex = client.exec_create(cid, ["sh", "-c", cmd])
            return client.exec_start(ex).decode().strip()

        assert run("id -u") == "4351"
        assert run("/usr/local/bin/suid-id -u") == "4351"  # the setuid bit is not honoured
        state = sp.get_state()["image"]
        assert state["reference"] == root_image
        assert state["digest"] == client.inspect_image(root_image)["Id"]
        assert any("checked" in e["message"] for e in sp._events)
    finally:
        await sp.stop()


@pytest.mark.parametrize(("image", "reason"), [
    ("local/debian-python:bookworm", "jupyterhub-singleuser does not run in it"),
    ("localhost:1/nothing:1", "cannot be pulled"),
])
async def test_a_broken_user_image_is_refused_before_anything_is_booked(
        make_spawner, client, image, reason):
    try:
        client.inspect_image("local/debian-python:bookworm")
    except docker.errors.ImageNotFound:
        pytest.skip("needs the local base image (make images)")
    sp = make_spawner("badimg", options={"profile": "own", "image--unlisted-choice": image},
                      profiles=USER_IMAGE_PROFILES, image_check_timeout=30,
                      allowed_registries=["localhost:1"])  # loopback: refused unless listed
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    assert e.value.status_code == 400, e.value
    assert "image--unlisted-choice" in str(e.value) and reason in str(e.value), str(e.value)
    assert sp.cluster.ledger.allocations() == []
    assert not container_id(sp)
    assert client.containers(all=True, filters={"label": "gpuspawner.image-check"}) == []


async def test_a_user_image_over_the_size_limit_is_refused_before_anything_is_booked(
        make_spawner, client, root_image):
    """c.GPUSpawner.image_max_bytes: an image on the node larger than it is a 400 naming the
    image field and its size; nothing booked, no check container; the same image passes with
    no limit (the test would pass for the wrong reason otherwise)."""
    size = client.inspect_image(root_image)["Size"]
    sp = make_spawner("bigimg", options={"profile": "own", "image--unlisted-choice": root_image},
                      profiles=USER_IMAGE_PROFILES, image_max_bytes=size // 2)
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    assert e.value.status_code == 400, e.value
    assert "image--unlisted-choice" in str(e.value) and "larger than users' images" in \
        str(e.value), str(e.value)
    assert sp.cluster.ledger.allocations() == [] and not container_id(sp)
    assert client.containers(all=True, filters={"label": "gpuspawner.image-check"}) == []
    ok = make_spawner("bigimg2", options={"profile": "own", "image--unlisted-choice": root_image},
                      profiles=USER_IMAGE_PROFILES, image_max_bytes=size)
    try:
        await asyncio.wait_for(ok.start(), 90)
        assert ok.get_state()["image"]["reference"] == root_image
    finally:
        await ok.stop()


@pytest.fixture(scope="module")
def silent_image(client):
    """The single-user image made to pass the image check but never serve:
    ``jupyterhub-singleuser --version`` answers as the real one does, anything else sleeps."""
    script = ('#!/bin/sh\\n[ "$1" = --version ] && exec /opt/venv/bin/jupyterhub-singleuser.real '
              '--version\\nexec sleep 3600\\n')  # printf's escapes
    yield from built_image(client, "gpuspawner/test-user-image:silent",
                           "RUN mv /opt/venv/bin/jupyterhub-singleuser "
                           "/opt/venv/bin/jupyterhub-singleuser.real"
                           f" && printf '{script}' > /opt/venv/bin/jupyterhub-singleuser"
                           " && chmod 755 /opt/venv/bin/jupyterhub-singleuser\n")


async def test_a_user_image_that_never_opens_its_port_fails_cleanly(make_spawner, client,
                                                                   silent_image):
    """The image passes the check (its jupyterhub-singleuser prints a version) but its server
    never listens: the spawn fails after http_timeout, and the container, its network and the
    booking are all gone."""
    sp = make_spawner("silent", options={"profile": "own", "image--unlisted-choice": silent_image},
                      profiles=USER_IMAGE_PROFILES, image_check_timeout=30,
                      cmd=["jupyterhub-singleuser"], http_timeout=6)
    t0 = time.monotonic()
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    assert time.monotonic() - t0 >= 6, "failed before its http_timeout"
    assert e.value.status_code == 500, e.value
    assert sp.cluster.ledger.allocations() == []
    assert client.containers(all=True, filters={"label": "gpuspawner.user=silent"}) == []
    assert client.networks(filters={"label": "gpuspawner.user=silent"}) == []


# -- restart elsewhere (GPUSpawner.restart_elsewhere) -------------------------------------------
class EngineForwarder:
    """A node's engine that can fail: a unix socket forwarding to the real engine; ``fail()``
    closes it and every open connection (the node's engine stops answering), ``recover()``
    opens it again."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self.server = None
        self.conns: list = []
        self.recover()

    def recover(self) -> None:
        import socket
        import socketserver

        fwd = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                up = socket.socket(socket.AF_UNIX)
                up.connect(fwd.target)
                fwd.conns += [self.request, up]

                def pump(a, b) -> None:
                    try:
                        while data := a.recv(65536):
                            b.sendall(data)
                    except OSError:
                        pass
                    finally:
                        for s in (a, b):
                            try:
                                s.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass

                t = threading.Thread(target=pump, args=(up, self.request), daemon=True)
                t.start()
                pump(self.request, up)
                t.join(5)

        if self.path.exists():
            self.path.unlink()
        self.server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(self) -> None:
        import socket

        self.server.shutdown()
        self.server.server_close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()
        self.path.unlink(missing_ok=True)


def second_engine() -> tuple[str, docker.APIClient]:
    """The btrfs engine (make btrfs-engine) as a second node: its URL and client; skips the
    test when it is not there or lacks the image."""
    url = f"unix://{BTRFS_SOCK}"
    try:
        client = docker.APIClient(base_url=url, version="auto")
        client.inspect_image(IMAGE)
    except Exception as e:
        pytest.skip(f"needs the btrfs engine with {IMAGE} as the second node: {e}")
    return url, client


def cpu_topology(tmp_path: Path, name: str) -> Path:
    local = node_to_dict(read_local_node(name))
    local["gpus"] = []
    local.pop("links", None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(local))
    return path


async def test_a_server_moves_off_a_failed_node_once_and_the_node_is_swept_on_return(
        make_spawner, client, tmp_path):
    """Node a's engine stops answering: the next poll restarts the server on node b (the
    same profile, a new booking, exactly one booking in the ledger), the home's files are
    there, the move is in the state and told to the user; when a answers again its leftover
    container is swept (the old booking was released once, at the move)."""
    url_b, btrfs = second_engine()
    fwd = EngineForwarder(tmp_path / "node-a.sock")
    try:
        sp = make_spawner(
            "mover", {"profile": "cpu"}, placement_policy="first-fit",
            nodes=[{"name": "a", "docker_url": f"unix://{fwd.path}",
                    "topology": str(cpu_topology(tmp_path, "a"))},
                   {"name": "b", "docker_url": url_b, "topology": str(cpu_topology(tmp_path, "b")),
                    "network_pool": "198.19.0.0/16"}],
            uid_map={"mover": {"uid": 4361, "gid": 4362}})
        await asyncio.wait_for(sp.start(), 90)
        old_cid = container_id(sp)
        assert sp.allocation.node == "a" and client.inspect_container(old_cid)["State"]["Running"]
        assert not any(e.startswith("GPUSPAWNER_MOVED=")
                       for e in client.inspect_container(old_cid)["Config"]["Env"])
        ex = client.exec_create(old_cid, ["sh", "-c", "echo kept > $HOME/notes.txt"])
        client.exec_start(ex)
        fwd.fail()
        t0 = time.monotonic()
        assert await asyncio.wait_for(sp.poll(), 120) is None  # moved, not stopped
        moved_s = time.monotonic() - t0
        try:
            assert sp.allocation.node == "b"
            assert [a.node for a in sp.cluster.ledger.allocations()] == ["b"]
            new_cid = container_id(sp)
            ex = btrfs.exec_create(new_cid, ["sh", "-c", "cat $HOME/notes.txt"])
            assert btrfs.exec_start(ex).decode().strip() == "kept"
            (move,) = sp.get_state()["moves"]
            assert (move["from"], move["to"]) == ("a", "b") and "does not answer" in move["reason"]
            assert any("Your server moved from node a to node b" in e["message"]
                       and "files in your home are safe" in e["message"] for e in sp._events)
            # the new container knows it was moved (JupyterLab tells the user from it); the
            # first one did not
            env = dict(e.split("=", 1) for e in btrfs.inspect_container(new_cid)["Config"]["Env"])
            told = json.loads(env["GPUSPAWNER_MOVED"])
            assert (told["from"], told["to"], told["at"]) == ("a", "b", move["at"])
            assert "does not answer" in told["reason"]
            assert await sp.poll() is None  # b answers: it runs
            print(f"moved in {moved_s:.1f} s")
            # node a answers again: its leftover is swept, the booking on b is untouched
            fwd.recover()
            sp.cluster._health_read = float("-inf")
            await sp.cluster.refresh_health()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    client.inspect_container(old_cid)
                except docker.errors.NotFound:
                    break
                await asyncio.sleep(0.5)
            else:
                raise AssertionError("the failed node's leftover container was not swept")
            assert [a.node for a in sp.cluster.ledger.allocations()] == ["b"]
        finally:
            await sp.stop()
        assert sp.cluster.ledger.allocations() == []
    finally:
        try:
            fwd.fail()
        except Exception:
            pass
        for c in client.containers(all=True, filters={"label": "gpuspawner.user=mover"}):
            client.remove_container(c["Id"], force=True)


async def test_moves_are_bounded_per_hour_and_may_be_turned_off(make_spawner):
    """A flapping node cannot bounce a server around: past ``restart_limit`` moves in the
    hour, or inside the backoff after the last one, the server is stopped as before; a
    profile with ``restart_on_node_failure: false`` is never moved."""
    sp = make_spawner("flappy", restart_limit=2, restart_backoff=30)
    now = time.time()
    sp.moves = [{"from": "x", "to": "y", "at": now - 4000, "reason": "old"},
                {"from": "y", "to": "x", "at": now - 10, "reason": "just now"}]
    assert await sp.restart_elsewhere("node x does not answer") is False  # in the backoff
    sp.moves = [{"at": now - 1000}, {"at": now - 900}]
    assert await sp.restart_elsewhere("node x does not answer") is False  # limit reached
    off = make_spawner("pinned", profiles=[{"slug": "cpu", "cpu": 1, "memory": "256M",
                                            "restart_on_node_failure": False}])
    assert await off.restart_elsewhere("node x does not answer") is False
    assert off.moves == [] and sp.allocation is None


async def test_a_flapping_pair_of_nodes_moves_a_server_at_most_restart_limit_times(
        make_spawner, client, tmp_path):
    """Two real engines that fail in turn (a, then b while a is back): with
    ``restart_limit=1`` the server moves once (a -> b) and, when b fails too, is stopped and
    released instead of bouncing back to a; nothing is left booked, the metric counts one
    ``moved`` and one ``limit``."""
    url_b, btrfs = second_engine()
    fwd_a = EngineForwarder(tmp_path / "node-a.sock")
    fwd_b = EngineForwarder(tmp_path / "node-b.sock", target=str(BTRFS_SOCK))
    def moves(outcome: str) -> float:
        return SERVER_MOVES.labels(outcome=outcome)._value.get()

    moved0, limit0 = moves("moved"), moves("limit")
    try:
        sp = make_spawner(
            "flapper", {"profile": "cpu"}, placement_policy="first-fit",
            restart_limit=1, restart_backoff=0,
            nodes=[{"name": "a", "docker_url": f"unix://{fwd_a.path}",
                    "topology": str(cpu_topology(tmp_path, "a"))},
                   {"name": "b", "docker_url": f"unix://{fwd_b.path}",
                    "topology": str(cpu_topology(tmp_path, "b")),
                    "network_pool": "198.19.0.0/16"}],
            uid_map={"flapper": {"uid": 4363, "gid": 4364}})
        await asyncio.wait_for(sp.start(), 90)
        assert sp.allocation.node == "a"
        fwd_a.fail()
        assert await asyncio.wait_for(sp.poll(), 120) is None  # moved to b
        assert sp.allocation.node == "b" and len(sp.moves) == 1
        fwd_a.recover()  # a is back (the hub's health check sees it), then b fails: a
        sp.cluster._health_read = float("-inf")  # second move would pass the limit
        await sp.cluster.refresh_health()
        fwd_b.fail()
        status = await asyncio.wait_for(sp.poll(), 120)
        assert status is not None, "moved a second time within the hour"
        assert len(sp.moves) == 1 and sp.cluster.ledger.allocations() == []
        assert (moves("moved") - moved0, moves("limit") - limit0) == (1, 1)
    finally:
        for fwd in (fwd_a, fwd_b):
            try:
                fwd.fail()
            except Exception:
                pass
        for cli in (client, btrfs):  # what the failed engines kept: container, network
            for c in cli.containers(all=True, filters={"label": "gpuspawner.user=flapper"}):
                cli.remove_container(c["Id"], force=True)
            for n in cli.networks(filters={"label": "gpuspawner.user=flapper"}):
                cli.remove_network(n["Id"])


async def test_a_jobs_output_is_read_back_without_holding_all_of_it(client):
    """A notebook job's standard output is the user's. ``read_output`` asked the engine for
    the whole log and kept its tail: a job printing gigabytes exhausted the hub's memory when
    it ended (and at each look at its log). Now the log is streamed and only the last
    ``max_bytes`` kept: 40 MB printed, 1 MiB read back, the hub's peak well under the log."""
    import tracemalloc
    from types import SimpleNamespace

    cid = client.create_container(
        IMAGE, ["sh", "-c", "head -c 40000000 /dev/zero | tr '\\0' x; echo END"],
        labels={"gpuspawner.test": "log-tail"})["Id"]
    try:
        client.start(cid)
        assert client.wait(cid, timeout=120)["StatusCode"] == 0
        backend = DockerBackend()
        backend.bind({"local": SimpleNamespace(docker_url="", network_pool="")})  # type: ignore[dict-item]
        tracemalloc.start()
        try:
            out = await backend.read_output({"node": "local", "container_id": cid}, 2**20)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert out is not None and len(out) == 2**20 and out.endswith(b"xxxEND\n")
        assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB for 1 MiB read back"
    finally:
        client.remove_container(cid, force=True)
    assert await backend.read_output({"node": "local", "container_id": cid}, 10) is None
