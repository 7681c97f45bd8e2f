"""GPU drains in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the real Docker
engine; marked ``hub`` and ``docker``): an admin drains the only GPU of a topology-file node
through ``POST /services/gpuspawner/api/gpus/{uuid}/drain``; a spawn of a 1-GPU profile is
refused naming the GPU and the reason, also after a hub restart (the drains file); after
``DELETE`` of the drain the spawn is placed on that GPU.

No GPU here: the node ``g1`` is a topology file with one A100 (this host's CPUs). Placement is
what this test checks; the container asks Docker for that GPU (``device_requests``, driver
nvidia) and cannot start without an NVIDIA runtime, so "placed" is read from the hub's answer:
not a placement refusal, and the spawn's progress/log names the allocation on that GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, remove_managed  # noqa: E402
from tests.test_hub_e2e import one_gpu_topology as gpu_node_topology  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SVC = "/services/gpuspawner/"
UUID = "GPU-6513270e-269e-0d37-f2a7-4de452e6b438"


def one_gpu_topology(tmp: Path) -> str:
    """This host's CPUs in one NUMA node with 2 GiB and one A100 (UUID :data:`UUID`)."""
    return gpu_node_topology(tmp, "g1", UUID)


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drainhub")
    nodes = [{"name": "g1", "topology": one_gpu_topology(tmp)}]
    profiles = [{"slug": "a100", "display_name": "1 x A100", "cpu": 1, "memory": "256M",
                 "gpus": 1, "gpu_models": ["A100"], "default": True}]
    h = Hub(tmp, nodes, profiles, extra_config=EXTRA_ADMIN_SCOPES)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    yield h
    for user in h.api("GET", "/users").json():
        if user.get("servers"):
            h.api("DELETE", f"/users/{user['name']}/server")
    h.stop()
    remove_managed(engine)


def svc(hub: Hub, method: str, path: str, token: str, body: object = None
        ) -> requests.Response:
    return requests.request(method, f"{hub.url}{SVC}{path}", timeout=30,
                            headers={"Authorization": f"token {token}"},
                            data=None if body is None else json.dumps(body))


def user_token(hub: Hub, name: str) -> str:
    hub.ensure_user(name)
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "drain test"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def spawn(hub: Hub, user: str) -> requests.Response:
    hub.ensure_user(user)
    return hub.api("POST", f"/users/{user}/server", {"profile": "a100"})


def test_drained_gpu_refuses_spawns_across_a_restart_until_undrained(hub):
    # a user may not drain; an admin may
    tok = user_token(hub, "drainuser")
    r = svc(hub, "POST", f"api/gpus/{UUID}/drain", tok, {"reason": "mine"})
    assert r.status_code == 403, r.text
    # nor may a token of an admin that holds only a server token's access to the service:
    # its owner is an admin, the token is not (any code in an admin's server reads it)
    hub.ensure_user("admin")  # an admin (the shipped config's admin_users)
    r = hub.api("POST", "/users/admin/tokens", {
        "note": "as a server token", "scopes": ["access:services!service=gpuspawner"]})
    assert r.status_code in (200, 201), r.text
    r = svc(hub, "POST", f"api/gpus/{UUID}/drain", r.json()["token"], {"reason": "mine"})
    assert r.status_code == 403, r.text
    r = svc(hub, "POST", f"api/gpus/{UUID}/drain", hub.token, {"reason": "bad fan"})
    assert r.status_code == 200, r.text
    assert r.json()["drained"] == "bad fan"
    # everyone sees that it is drained; only admins see who
    (node,) = svc(hub, "GET", "api/nodes", tok).json()
    assert node["gpus"][0]["drained"] == "bad fan" and "drained_by" not in node["gpus"][0]
    (node,) = svc(hub, "GET", "api/nodes", hub.token).json()
    assert node["gpus"][0]["drained_by"] == "gpuspawner-admin"
    # the spawn of the 1-GPU profile is refused, naming the GPU and the reason
    r = spawn(hub, "gpuer")
    assert r.status_code in (400, 503), r.text
    assert UUID in r.json()["message"] and "bad fan" in r.json()["message"]
    # kept across a hub restart (the drains file beside the hub's database)
    drains = Path(hub.env["GPUSPAWNER_STATE_DIR"]) / "gpuspawner-drains.json"
    assert json.loads(drains.read_text())["drains"][UUID]["reason"] == "bad fan"
    hub.stop()
    hub.start()
    r = spawn(hub, "gpuer")
    assert r.status_code in (400, 503), r.text
    assert UUID in r.json()["message"] and "bad fan" in r.json()["message"]
    # undrain: the spawn is placed on that GPU (the container itself cannot start here)
    r = svc(hub, "DELETE", f"api/gpus/{UUID}/drain", hub.token)
    assert r.status_code == 200 and r.json()["drained"] is None, r.text
    assert json.loads(drains.read_text())["drains"] == {}
    before = len(hub.log_path.read_bytes())
    r = spawn(hub, "gpuer")
    assert r.status_code in (201, 202) or (
        r.status_code == 500 and 'could not select device driver "nvidia"' in r.json()["message"]
    ), r.text
    # the spawn's progress, logged by the hub: the allocation on that very GPU
    wait_until(lambda: f"gpuer: placed on g1: {UUID}".encode() in hub.log_path.read_bytes()[
        before:], 30, 0.3, "the placement in the hub's log")
