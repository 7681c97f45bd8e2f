"""Culling under pressure in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on
the real Docker engine + the hub-managed idle culler; marked ``hub`` and ``docker``).

One A100 (a topology file; the container starts through the engine's NVIDIA hook test double,
see tests/test_queue_hub.py). ``holder`` takes it and stays idle. Its policy culls after an
hour of inactivity, or after ``pressure_idle_timeout`` seconds while someone waits for an A100.
While nobody waits, it keeps running well past the short time; once ``waiter`` asks for the
GPU and waits in the queue, ``holder`` is warned, culled with reason ``pressure_idle`` and the
explanation "culled early: 1 user waiting for A100", and ``waiter``'s server starts.
"""

from __future__ import annotations

import json

import pytest
import requests
import yaml

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, one_gpu_topology, remove_managed  # noqa: E402
from tests.test_queue_hub import PROFILES  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
PRESSURE_S, WARNING_S = 4, 2


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("queueculler")
    policies = tmp / "policies.yaml"
    policies.write_text(yaml.safe_dump({
        "global": {"exempt": True},
        "users": {"holder": {"exempt": False, "idle_timeout": 3600, "warning": WARNING_S,
                             "pressure_idle_timeout": PRESSURE_S, "grace_period": 0,
                             "network_floor": 10**12}}}))
    nodes = [{"name": "gc", "topology": one_gpu_topology(
        tmp, "gc", "GPU-0c0c0c0c-1111-2222-3333-444455556666")}]
    h = Hub(tmp, nodes, PROFILES, extra_config=EXTRA_ADMIN_SCOPES)
    h.env.update({"GPUSPAWNER_CULLER": "on", "GPUSPAWNER_CULLER_POLICIES": str(policies),
                  "GPUSPAWNER_CULLER_EVERY": "1"})
    h.start()
    yield h
    h.stop()
    remove_managed(engine)


def holder_status(hub: Hub, token: str) -> dict | None:
    """The culler's decision for holder's server (the culler's API, holder's own token)."""
    r = requests.get(f"{hub.url}/services/idle-culler/api/status", timeout=30,
                     headers={"Authorization": f"token {token}"})
    if r.status_code != 200:
        return None
    servers = [s for s in r.json()["servers"] if s["user"] == "holder"]
    return servers[0] if servers else None


def test_idle_gpu_server_is_culled_early_only_while_someone_waits(hub):
    hub.ensure_user("holder")
    r = hub.api("POST", "/users/holder/server", {"profile": "one"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("holder")
    r = hub.api("POST", "/users/holder/tokens", {"note": "culler status"})
    assert r.status_code == 201, r.text
    token = r.json()["token"]

    # nobody waits: idle for longer than the short time plus the warning, still kept
    def long_idle() -> dict | None:
        s = holder_status(hub, token)
        return s if s and s["figures"].get("inactive_s", 0) >= PRESSURE_S + WARNING_S + 3 \
            else None

    s = wait_until(long_idle, 60, 0.5, lambda: f"{holder_status(hub, token)}\n{hub.tail(20)}")
    assert s["action"] == "keep" and "pressure" not in s["figures"], s
    assert hub.server("holder")["ready"]

    # someone waits for the A100: warned, then culled early, and the waiter starts
    hub.ensure_user("waiter")
    before = len(hub.log_path.read_bytes())
    # (the POST itself may take JupyterHub's slow_spawn_timeout, 10 s: the cull comes first)
    r = hub.api("POST", "/users/waiter/server", {"profile": "one"})
    assert r.status_code in (201, 202), r.text
    hub.wait_stopped("holder", timeout=30)
    hub.wait_ready("waiter", timeout=90)
    culls = [json.loads(line) for line in
             (hub.state_dir / "hub" / "culls.jsonl").read_text().splitlines()]
    assert [(c["user"], c["reason"]) for c in culls] == [("holder", "pressure_idle")], culls
    assert "culled early: 1 user waiting for A100" in culls[0]["message"], culls
    assert culls[0]["figures"]["pressure"]["models"] == ["A100"], culls
    # warned first: a pass decided "warn" before the one that culled
    passes = [line for line in hub.log_path.read_bytes()[before:].decode().splitlines()
              if "idle_culler] pass:" in line]
    first_cull = next(i for i, line in enumerate(passes) if "'cull'" in line)
    assert any("'warn': 1" in line for line in passes[:first_cull]), passes
