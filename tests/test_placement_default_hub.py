"""A spawn through a real hub (JupyterHub, configurable-http-proxy and GPUSpawner with the
project's shipped configuration, on the real Docker engine) is placed by the default policy,
``fgd-mem-lookahead``: the hub's runtime line and the admin's GPU map name it, and the spawn's
allocation is in that ledger (docs/placement.md "The default policy")."""

from __future__ import annotations

import pytest
import requests

from tests.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GPU = "/services/gpuspawner/"


def test_a_spawn_through_the_hub_is_placed_by_the_default_policy(tmp_path):
    pytest.importorskip("docker")
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import MiB, _engine, topology

    engine = _engine()
    nodes = [{"name": "pd-node", "topology": topology(tmp_path, "pd-node", 1024 * MiB)}]
    profiles = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]
    h = Hub(tmp_path, nodes, profiles)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    try:
        log = h.log_path.read_text(errors="replace")
        assert "backend DockerBackend, policy fgd-mem-lookahead" in log, log[-3000:]
        h.ensure_user("pd-ann")
        r = h.api("POST", "/users/pd-ann/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        h.wait_ready("pd-ann")
        admin = h.login("admin")

        def map_page() -> requests.Response | None:
            page = admin.get(f"{h.url}{GPU}admin", timeout=30)
            return page if page.status_code == 200 and "pd-ann" in page.text else None

        page = wait_until(map_page, 30, 0.3, "pd-ann on the admin's GPU map")
        assert "placement policy fgd-mem-lookahead" in page.text
        allocs = requests.get(f"{h.url}{GPU}api/allocations", timeout=10,
                              headers={"Authorization": f"token {h.token}"})
        if allocs.status_code == 200:  # the test token may lack the service's admin scope
            assert [a["owner"]["user"] for a in allocs.json()] == ["pd-ann"]
        h.api("DELETE", "/users/pd-ann/server")
        h.wait_stopped("pd-ann")
    finally:
        h.stop()
        for c in engine.containers(all=True, filters={"label": "gpuspawner.user=pd-ann"}):
            engine.remove_container(c["Id"], force=True)
