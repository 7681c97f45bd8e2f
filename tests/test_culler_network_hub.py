"""The culler's network signal on GPUSpawner's own servers, end to end: the project's hub
config (tests/hubrunner.py ``Hub``: GPUSpawner, a bridge network per server, the idle culler as
the hub-managed service with its ``--docker-url`` per node) on the real Docker engine. A
server whose container sends traffic is kept by a network policy; one without traffic is
culled (issue 24, item 3).

The traffic is a process in the container sending UDP datagrams towards the hub's address
(nothing listens; the bytes leave the container's interface, which is what the engine's stats
count): no request reaches the hub or the proxy, so the hub's ``last_activity`` of both
servers stays where their start left it and only the network signal can tell them apart.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
import yaml

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub, free_port  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of, remove_objects_of  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]

BUSY, IDLE = "cn-net-busy", "cn-net-idle"
USERS = (BUSY, IDLE)
IDLE_TIMEOUT = 12  # seconds without activity before the idle cull
FLOOR = 1000  # bytes/s: the policy's network_floor
#: ~70 kB/s from inside the container, towards the hub's address (port 9: nothing listens)
TRAFFIC = (
    "import os, socket, time, urllib.parse\n"
    "host = urllib.parse.urlparse(os.environ['JUPYTERHUB_API_URL']).hostname\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "while True:\n"
    "    try:\n"
    "        s.sendto(b'x' * 1400, (host, 9))\n"
    "    except OSError:\n"
    "        pass\n"
    "    time.sleep(0.02)\n")


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cn-nethub")
    policies = tmp / "culler_policies.yaml"
    mine = {"exempt": False, "idle_timeout": IDLE_TIMEOUT, "network_floor": FLOOR,
            "grace_period": 0, "warning": 0, "max_age": 0, "gpu_idle_threshold": 0,
            "pressure_idle_timeout": 0}
    policies.write_text(yaml.safe_dump({"global": {"exempt": True},
                                        "users": {u: dict(mine) for u in USERS}}))
    (tmp / "home").mkdir()  # the homes' parent (hub_config: beside the state folder)
    h = Hub(tmp, [{"name": "local", "topology": "auto"}],
            [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}],
            extra_config="c.GPUSpawner.http_timeout = 30\n")
    h.env.update({"GPUSPAWNER_CULLER": "on", "GPUSPAWNER_CULLER_POLICIES": str(policies),
                  "GPUSPAWNER_CULLER_EVERY": "1", "GPUSPAWNER_CULLER_PORT": str(free_port())})
    h.start()
    yield h
    h.stop()
    remove_objects_of(engine, USERS)


def culls(hub: Hub) -> list[dict]:
    """The culler service's cull log (hub_config: culls.jsonl in the hub's state folder)."""
    path = Path(hub.env["GPUSPAWNER_STATE_DIR"]) / "culls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def status_of(hub: Hub, user: str, session: requests.Session) -> dict | None:
    """The culler's latest decision on ``user``'s default server (its page's API, through
    the proxy, with ``user``'s login session: the owner's view)."""
    try:
        r = session.get(f"{hub.url}/services/idle-culler/api/status", timeout=10)
    except requests.RequestException:
        return None
    if r.status_code != 200 or not r.url.endswith("/api/status"):
        return None
    return next((s for s in r.json()["servers"] if s["user"] == user), None)


def events(engine, cid: str, since: int) -> list[str]:
    """The engine's events of a container since ``since`` (epoch s): "time action"."""
    found = engine.events(since=since, until=int(time.time()) + 1, decode=True,
                          filters={"container": cid})
    return [f"{e.get('time')} {e.get('Action') or e.get('status')}" for e in found]


def test_network_traffic_keeps_a_server_and_its_absence_culls_one(hub, engine):
    started = int(time.time())
    for user in USERS:
        hub.ensure_user(user)
        r = hub.api("POST", f"/users/{user}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
    busy = hub.wait_ready(BUSY)
    (container,) = containers_of(engine, BUSY)
    ex = engine.exec_create(container["Id"], ["python3", "-c", TRAFFIC])
    engine.exec_start(ex, detach=True)
    hub.wait_ready(IDLE)

    # the state the culler reads is GPUSpawner's own: the container on its node
    state = busy["state"]  # (the admin token sees it, as the culler's admin:server_state)
    assert state["backend"]["container_id"] == container["Id"], state
    assert state["backend"]["node"] == "local" and state["backend"]["network"], state

    # the network signal sees the busy server's traffic (bytes/s over the policy's floor)
    session = hub.login(BUSY)  # the culler's page, as the owner sees it (hub OAuth)

    def measured() -> dict | None:
        s = status_of(hub, BUSY, session)
        rate = (s or {}).get("figures", {}).get("net_rate_Bps")
        return s if rate is not None and rate >= FLOOR else None

    seen = wait_until(measured, 60, 0.5, lambda: f"no network rate for {BUSY}: "
                      f"{status_of(hub, BUSY, session)}\n{hub.tail()}")
    assert seen["action"] == "keep", seen

    # the idle one is culled for inactivity ...
    hub.wait_stopped(IDLE, timeout=IDLE_TIMEOUT + 60)
    (cull,) = [c for c in culls(hub) if c["user"] == IDLE]
    assert cull["reason"] == "idle" and not cull["dry_run"], cull
    assert cull["policy"]["network_floor"] == FLOOR
    assert not containers_of(engine, IDLE)

    # ... while the busy one, started before it and as silent towards the hub, stays: for a
    # whole idle timeout after the idle one went, it is still running and kept as active
    after = busy_since = wait_until(lambda: status_of(hub, BUSY, session), 10, 0.5)
    deadline_passes = IDLE_TIMEOUT + 3

    def outlived() -> bool:
        nonlocal after
        s = status_of(hub, BUSY, session)
        assert hub.server(BUSY) is not None, (
            f"{BUSY} is gone; the culls: {culls(hub)}; the engine's events of its container "
            f"(a kill + destroy before any cull: removed by something else on this engine): "
            f"{events(engine, container['Id'], started)}")
        if s is not None:
            assert s["action"] == "keep", s
            after = s
        return s is not None and s["figures"]["age_s"] >= (
            busy_since["figures"]["age_s"] + deadline_passes)

    wait_until(outlived, deadline_passes + 30, 0.5, lambda: f"status of {BUSY}: {after}")
    assert after["figures"]["hub_inactive_s"] > IDLE_TIMEOUT, after  # the hub saw nothing
    assert after["figures"]["net_rate_Bps"] >= FLOOR, after
    assert [c for c in culls(hub) if c["user"] == BUSY] == []
    assert engine.inspect_container(container["Id"])["State"]["Running"]
