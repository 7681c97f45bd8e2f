"""The wait queue in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the real
Docker engine; marked ``hub`` and ``docker``).

The node (a topology file: this host's CPUs and one A100 that this machine does not have) has
room for exactly one bundle of the 1-GPU profile, whose ``queue`` is on by default. The
containers ask Docker for that GPU; without GPUs, the engine's NVIDIA hook is the test double
of scripts/dockerd.sh (tests/doubles/nvidia-container-runtime-hook), so they start with no GPU
inside. Three users ask: the first starts, the second and third wait with positions 1 and 2
and see their position in the spawn progress; a fourth waits and cancels (nothing of it is
left held); the hub restarts in the middle and the order survives; then the waiting servers
start in order as the one before them stops.
"""

from __future__ import annotations

import json

import pytest
import requests

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, one_gpu_topology, remove_managed  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SVC = "/services/gpuspawner/"
#: JupyterHub's limit for Spawner.start; a wait in the queue is not counted in it
START_TIMEOUT = 15
PROFILES = [{"slug": "one", "display_name": "1 x A100", "cpu": 1, "memory": "256M", "gpus": 1,
             "gpu_models": ["A100"], "default": True}]



@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("queuehub")
    nodes = [{"name": "gq", "topology": one_gpu_topology(
        tmp, "gq", "GPU-0a0b0c0d-1111-2222-3333-444455556666")}]
    h = Hub(tmp, nodes, PROFILES, extra_config=EXTRA_ADMIN_SCOPES +
            f"c.GPUSpawner.start_timeout = {START_TIMEOUT}\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    yield h
    h.stop()
    remove_managed(engine)


def queue(hub: Hub) -> dict:
    r = requests.get(f"{hub.url}{SVC}api/queue", timeout=30,
                     headers={"Authorization": f"token {hub.token}"})
    assert r.status_code == 200, r.text
    return r.json()


def waiting(hub: Hub) -> list[tuple[str, int]]:
    return [(e["user"], e["position"]) for e in queue(hub)["entries"]]


def spawn(hub: Hub, user: str) -> None:
    hub.ensure_user(user)
    r = hub.api("POST", f"/users/{user}/server", {"profile": "one"})
    assert r.status_code in (201, 202), r.text


def test_three_users_one_slot_wait_in_order_survive_a_restart_and_cancel_releases(hub):
    spawn(hub, "qa")
    hub.wait_ready("qa")
    spawn(hub, "qb")
    wait_until(lambda: waiting(hub) == [("qb", 1)], 30, 0.3, lambda: str(queue(hub)))
    spawn(hub, "qc")
    wait_until(lambda: waiting(hub) == [("qb", 1), ("qc", 2)], 30, 0.3,
               lambda: str(queue(hub)))
    msgs = hub.progress("qc", until="waiting: position 2 of 2")
    assert any("waiting: position 2 of 2 for 1 x A100; 0 of 1 A100 free now" in m
               for m in msgs), msgs
    assert hub.server("qb")["pending"] == "spawn" and not hub.server("qb")["ready"]
    # waiting longer than start_timeout does not end the spawn: the wait has its own limit
    wait_until(lambda: queue(hub)["entries"][0]["waited_s"] > START_TIMEOUT + 3, 60, 0.5,
               lambda: str(queue(hub)))
    assert waiting(hub) == [("qb", 1), ("qc", 2)]
    assert hub.server("qb")["pending"] == "spawn"

    # a fourth waits, then cancels with the stop button's call: nothing of it stays
    spawn(hub, "qd")
    wait_until(lambda: [u for u, _ in waiting(hub)] == ["qb", "qc", "qd"], 30, 0.3,
               lambda: str(queue(hub)))
    r = hub.api("DELETE", "/users/qd/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped("qd")
    wait_until(lambda: waiting(hub) == [("qb", 1), ("qc", 2)], 30, 0.3,
               lambda: str(queue(hub)))
    allocs = requests.get(f"{hub.url}{SVC}api/allocations", timeout=30,
                          headers={"Authorization": f"token {hub.token}"}).json()
    assert [a["owner"]["user"] for a in allocs] == ["qa"]

    # the hub restarts while two wait: the order is kept, the spawns come back by themselves
    hub.stop()
    saved = json.loads(next((hub.state_dir / "hub").glob("gpuspawner-queue.json"))
                       .read_text())
    assert [e["user"] for e in saved["entries"]] == ["qb", "qc"]
    hub.start()
    wait_until(lambda: [(e["user"], e["position"], e["restored"])
                        for e in queue(hub)["entries"]] == [("qb", 1, False), ("qc", 2, False)],
               60, 0.5, lambda: f"{queue(hub)}\n{hub.tail(30)}")
    wait_until(lambda: (hub.server("qb") or {}).get("pending") == "spawn", 30, 0.3,
               "qb's spawn is pending again")
    assert hub.server("qa")["ready"]  # the running server kept its slot across the restart

    # the first stops: the second starts; the third moves up, then starts when it stops
    assert hub.api("DELETE", "/users/qa/server").status_code in (202, 204)
    hub.wait_ready("qb", timeout=90)
    wait_until(lambda: waiting(hub) == [("qc", 1)], 30, 0.3, lambda: str(queue(hub)))
    assert hub.server("qc")["pending"] == "spawn"
    assert hub.api("DELETE", "/users/qb/server").status_code in (202, 204)
    hub.wait_ready("qc", timeout=90)
    assert queue(hub) == {"length": 0, "by_profile": {}, "waiting_gpus": {}, "entries": []}
    # what ran is what the ledger booked: qc holds the one GPU
    allocs = requests.get(f"{hub.url}{SVC}api/allocations", timeout=30,
                          headers={"Authorization": f"token {hub.token}"}).json()
    assert [(a["owner"]["user"], [g["uuid"] for g in a["gpus"]]) for a in allocs] == [
        ("qc", ["GPU-0a0b0c0d-1111-2222-3333-444455556666"])]


def test_fail_now_and_never_fits_are_refused_at_once(hub):
    # the slot is taken (by qc from the test above, or by a new one)
    if not (hub.server("qc") or {}).get("ready"):
        spawn(hub, "qc")
        hub.wait_ready("qc")
    hub.ensure_user("qe")
    r = hub.api("POST", "/users/qe/server", {"profile": "one", "queue": False})
    assert r.status_code == 400, r.text
    assert "profile 'one'" in r.json()["message"]
    assert queue(hub)["length"] == 0 and hub.server("qe") is None
    r = hub.api("POST", "/users/qe/server", {"profile": "one", "queue": "later"})
    assert r.status_code == 400 and "queue: must be true" in r.json()["message"], r.text
