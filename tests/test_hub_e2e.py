"""End to end: a real JupyterHub with configurable-http-proxy and GPUSpawner on the real Docker
engine, driven through the hub's REST API (marked ``docker``).

Nodes (all on the local engine, described by topology files built from this host):
``local`` (this host as read by sysfs), ``burst`` (memory for exactly 4 burst servers) and
``tiny`` (memory for exactly one tiny server), so capacity effects are exact.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

docker = pytest.importorskip("docker")

from gpuspawner.inventory.local import read_local_node  # noqa: E402
from gpuspawner.inventory.topology import node_to_dict  # noqa: E402
from tests.hubrunner import REPO, Hub, own  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
IMAGE = "gpuspawner/singleuser:latest"
MiB = 2**20


def _engine() -> docker.APIClient:
    try:
        c = docker.APIClient(version="auto")
        c.inspect_image(IMAGE)
    except Exception as e:
        pytest.skip(f"needs a Docker engine and {IMAGE} (make engine images): {e}")
    if not (REPO / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        pytest.skip("needs configurable-http-proxy (make chp)")
    return c


def topology(tmp: Path, name: str, memory: int) -> str:
    """This host's CPUs with ``memory`` bytes in one NUMA node."""
    d = node_to_dict(read_local_node(name))
    cpus = [c for n in d["numa_nodes"] for c in _cpus(n["cpus"])]
    d["numa_nodes"] = [{"id": 0, "cpus": cpus, "memory": memory}]
    d["gpus"] = []
    d.pop("links", None)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def one_gpu_topology(tmp: Path, name: str, uuid: str) -> str:
    """This host's CPUs in one NUMA node with 2 GiB and one A100 (``uuid``; no such GPU here:
    its containers start through the engine's NVIDIA hook test double, scripts/dockerd.sh)."""
    d = node_to_dict(read_local_node(name))
    cpus = [c for n in d["numa_nodes"] for c in _cpus(n["cpus"])]
    d["numa_nodes"] = [{"id": 0, "cpus": cpus, "memory": 2 * 2**30}]
    d["gpus"] = [{"uuid": uuid, "index": 0, "model": "A100", "memory": "80G",
                  "pci_bus_id": "00000000:07:00.0", "numa_node": 0}]
    d.pop("links", None)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def _cpus(value) -> list[int]:
    from gpuspawner.placement import parse_cpu_list

    return list(value) if isinstance(value, list) else list(parse_cpu_list(str(value)))


NODES_PROFILES = None


def hub_setup(tmp: Path) -> tuple[list[dict], list[dict]]:
    nodes = [
        {"name": "local", "topology": "auto"},
        {"name": "burst", "topology": topology(tmp, "burst", 4 * 300 * MiB + 100 * MiB)},
        {"name": "tiny", "topology": topology(tmp, "tiny", 300 * MiB)},
    ]
    profiles = [
        {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "256M", "nodes": ["local"],
         "default": True},
        {"slug": "burst", "cpu": 0, "memory": "300M", "nodes": ["burst"]},
        {"slug": "tiny", "cpu": 0, "memory": "256M", "nodes": ["tiny"]},
        {"slug": "tiny-broken", "cpu": 0, "memory": "256M", "nodes": ["tiny"],
         "image": "gpuspawner/no-such-image:0"},
        {"slug": "staff", "cpu": 1, "memory": "256M", "nodes": ["local"],
         "groups": ["staff"]},
        {"slug": "a100", "cpu": 1, "memory": "256M", "gpus": 1, "gpu_models": ["A100"]},
    ]
    return nodes, profiles


def remove_objects_of(engine: docker.APIClient, users: Iterable[str]) -> None:
    """Remove the containers and server networks of these users only (teardown of a test
    module whose neighbours may run on the same engine)."""
    for user in users:
        for c in own(engine.containers(all=True,
                                       filters={"label": f"gpuspawner.user={user}"})):
            engine.remove_container(c["Id"], force=True)
        for n in own(engine.networks(filters={"label": f"gpuspawner.user={user}"})):
            try:
                engine.remove_network(n["Id"])
            except docker.errors.APIError:
                pass


def remove_managed(engine: docker.APIClient) -> None:
    """Remove every GPUSpawner container and server network of the hubs this process started
    (test teardown; other modules' hubs run on the same engine at the same time)."""
    for c in own(engine.containers(all=True, filters={"label": "gpuspawner.managed=1"})):
        engine.remove_container(c["Id"], force=True)
    for n in own(engine.networks(filters={"label": "gpuspawner.user"})):
        try:
            engine.remove_network(n["Id"])
        except docker.errors.APIError:
            pass


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    nodes, profiles = hub_setup(tmp)
    h = Hub(tmp, nodes, profiles, extra_config="c.GPUSpawner.poll_interval = 2\n"
                                               "c.GPUSpawner.quotas = {'users': "
                                               "{'quotauser': {'servers': 1}}}\n")
    h.start()
    yield h
    left = [(user["name"], server) for user in h.api("GET", "/users").json()
            for server in (user.get("servers") or {})]
    for name, server in left:
        h.api("DELETE", f"/users/{name}/servers/{server}" if server else f"/users/{name}/server")
    try:  # a deadline, not a fixed sleep (none are left when the tests pass)
        for name, server in left:
            h.wait_stopped(name, server)
    finally:
        h.stop()
        remove_managed(engine)


def containers_of(engine, user: str) -> list[dict]:
    """The user's running containers made by the hubs this process started."""
    return own(engine.containers(filters={"label": f"gpuspawner.user={user}"}))


def test_rest_spawn_gives_a_pinned_container(hub, engine):
    hub.ensure_user("alice")
    r = hub.api("POST", "/users/alice/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice")
    (c,) = containers_of(engine, "alice")
    alloc = json.loads(c["Labels"]["gpuspawner.allocation"])
    assert alloc["owner"]["user"] == "alice" and len(alloc["cpuset"]) == 1
    ex = engine.exec_create(c["Id"], ["sh", "-c", "nproc; echo $HOME; id -u"])
    nproc, home, uid = engine.exec_start(ex).decode().split()
    assert nproc == "1" and home == "/home/alice" and uid == "1000"
    # the server answers through the proxy (a real route, a real HTTP call)
    r = hub.api("GET", "/users/alice")
    assert r.json()["servers"][""]["ready"] is True
    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204)
    hub.wait_stopped("alice")
    assert containers_of(engine, "alice") == []


@pytest.mark.parametrize("body, status, message", [
    ({"profile": "nope"}, 400, "profile: unknown profile 'nope'"),
    ({"profile": 7}, 400, "profile: must be a string"),
    ({"profile": "cpu", "cpu": 64}, 400, "cpu: unknown option; allowed: profile"),
    ({"user_options": {"gpus": "all"}}, 400, "gpus: unknown option"),
    ({"profile": "staff"}, 400, "profile 'staff' is not available to your groups"),
    ({"profile": "a100"}, 400, "no node has a A100"),
    ({"user_options": "cpu"}, 400, "user_options must be an object"),
])
def test_malformed_user_options_are_400(hub, engine, body, status, message):
    hub.ensure_user("mallory")
    r = hub.api("POST", "/users/mallory/server", body)
    assert r.status_code == status, r.text
    assert message in r.json()["message"]
    assert containers_of(engine, "mallory") == []


def test_group_member_may_use_group_profile_and_named_servers(hub, engine):
    hub.ensure_user("sam", groups=("staff",))
    r = hub.api("POST", "/users/sam/servers/work", {"profile": "staff"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("sam", "work")
    (c,) = containers_of(engine, "sam")
    assert c["Labels"]["gpuspawner.server"] == "work"
    hub.api("DELETE", "/users/sam/servers/work")
    hub.wait_stopped("sam", "work")


def test_quota_on_servers(hub, engine):
    hub.ensure_user("quotauser")
    assert hub.api("POST", "/users/quotauser/servers/a", {"profile": "cpu"}).status_code \
        in (201, 202)
    hub.wait_ready("quotauser", "a")
    r = hub.api("POST", "/users/quotauser/servers/b", {"profile": "cpu"})
    assert r.status_code == 400
    assert "over your quota for servers" in r.json()["message"]
    hub.api("DELETE", "/users/quotauser/servers/a")
    hub.wait_stopped("quotauser", "a")


def test_burst_of_20_on_room_for_4(hub, engine):
    users = [f"burst{i:02d}" for i in range(20)]
    for u in users:
        hub.ensure_user(u)
    results: dict[str, tuple[int, str]] = {}
    barrier = threading.Barrier(len(users))

    def spawn(u: str) -> None:
        barrier.wait(30)
        r = hub.api("POST", f"/users/{u}/server", {"profile": "burst"}, timeout=120)
        results[u] = (r.status_code, r.text)

    threads = [threading.Thread(target=spawn, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    ok = [u for u, (s, _) in results.items() if s in (201, 202)]
    refused = {u: t for u, (s, t) in results.items() if s == 400}
    assert len(ok) == 4, results
    assert len(refused) == 16, results
    for text in refused.values():
        assert "no node has 300.0 MiB of free memory" in json.loads(text)["message"]
    for u in ok:
        hub.wait_ready(u, timeout=120)
    running = [c for u in users for c in containers_of(engine, u)]
    assert len(running) == 4
    booked = sum(json.loads(c["Labels"]["gpuspawner.allocation"])["memory_bytes"]
                 for c in running)
    assert booked == 4 * 300 * MiB
    for u in ok:
        hub.api("DELETE", f"/users/{u}/server")
    for u in ok:
        hub.wait_stopped(u)


def test_failures_leave_no_allocation(hub, engine):
    """A missing image and a killed container both free the one slot of
    node ``tiny``: the next tiny spawn succeeds each time."""
    hub.ensure_user("tina")
    r = hub.api("POST", "/users/tina/server", {"profile": "tiny-broken"})
    assert r.status_code == 500, r.text
    assert "image 'gpuspawner/no-such-image:0' is not on node tiny" in r.json()["message"]
    assert containers_of(engine, "tina") == []
    r = hub.api("POST", "/users/tina/server", {"profile": "tiny"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("tina")
    (c,) = containers_of(engine, "tina")
    engine.kill(c["Id"])
    hub.wait_stopped("tina", timeout=60)  # poll_interval = 2 s notices the death
    hub.ensure_user("tom")
    r = hub.api("POST", "/users/tom/server", {"profile": "tiny"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("tom")
    hub.api("DELETE", "/users/tom/server")
    hub.wait_stopped("tom")


def test_spawn_form_shows_availability(hub):
    hub.ensure_user("formuser")
    s = hub.login("formuser")
    r = s.get(f"{hub.url}/hub/spawn/formuser", timeout=30)
    assert r.status_code == 200
    html = r.text
    assert 'data-profile="cpu" data-available="true"' in html
    assert 'data-profile="staff" data-available="false"' in html
    assert "not available to your group" in html
    # no A100 on this hub: the card is not offered at all (show_unavailable_profiles is off)
    assert 'data-profile="a100"' not in html and "A100" not in html
    assert "1 core · 256 MiB memory" in r.content.decode()
    # the form posts back and spawns
    xsrf = s.cookies.get("_xsrf")
    r = s.post(f"{hub.url}/hub/spawn/formuser", data={"profile": "cpu", "_xsrf": xsrf},
               timeout=60)
    assert r.status_code == 200, r.text[:500]
    hub.wait_ready("formuser", timeout=90)
    hub.api("DELETE", "/users/formuser/server")
    hub.wait_stopped("formuser")

