"""The wait queue in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the real
Docker engine; marked ``hub`` and ``docker``).

The node has room for exactly one bundle of the profile (memory is the scarce resource: no
GPU container can start on this machine without the NVIDIA container toolkit, so the bundle
that runs out is memory; the queue treats every dimension alike and GPU bundles are covered
by tests/test_queue.py). Three users ask: the first starts, the second and third wait with
positions 1 and 2 and see their position in the spawn progress; a fourth waits and cancels
(nothing of it is left held); the hub restarts in the middle and the order survives; then the
waiting servers start in order as the one before them stops.
"""

from __future__ import annotations

import json

import pytest
import requests

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, remove_managed, topology  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
MiB = 2**20
SVC = "/services/gpuspawner/"
PROFILES = [{"slug": "one", "display_name": "the only slot", "cpu": 1, "memory": "300M",
             "numa_policy": "none", "queue": True, "default": True}]


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("queuehub")
    nodes = [{"name": "slot", "topology": topology(tmp, "slot", 500 * MiB)}]
    h = Hub(tmp, nodes, PROFILES, extra_config=EXTRA_ADMIN_SCOPES)
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


def progress_messages(hub: Hub, user: str, until: str, timeout: float = 30) -> list[str]:
    """Read the spawn's progress event stream until a message contains ``until``."""
    out = []
    with hub.session.get(f"{hub.api_url}/users/{user}/server/progress", stream=True,
                         headers={"Authorization": f"token {hub.token}"},
                         timeout=timeout) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                out.append(json.loads(line[5:]).get("message", ""))
                if until in out[-1]:
                    break
    return out


def test_three_users_one_slot_wait_in_order_survive_a_restart_and_cancel_releases(hub):
    spawn(hub, "qa")
    hub.wait_ready("qa")
    spawn(hub, "qb")
    wait_until(lambda: waiting(hub) == [("qb", 1)], 30, 0.3, lambda: str(queue(hub)))
    spawn(hub, "qc")
    wait_until(lambda: waiting(hub) == [("qb", 1), ("qc", 2)], 30, 0.3,
               lambda: str(queue(hub)))
    msgs = progress_messages(hub, "qc", "waiting: position 2 of 2")
    assert any("waiting: position 2 of 2" in m for m in msgs), msgs
    assert hub.server("qb")["pending"] == "spawn" and not hub.server("qb")["ready"]

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
