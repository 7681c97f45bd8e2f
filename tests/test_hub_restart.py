"""A hub restart with servers running (marked ``docker``): servers keep running and keep their
allocations (rebuilt from container labels and spawner state), new spawns never get their
devices, and a container that vanished while the hub was down frees its allocation."""

from __future__ import annotations

import time

import pytest

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import (  # noqa: E402
    MiB,
    _engine,
    containers_of,
    remove_managed,
    topology,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture
def engine():
    return _engine()


def test_restart_keeps_servers_and_allocations(engine, tmp_path):
    nodes = [{"name": "tiny", "topology": topology(tmp_path, "tiny", 300 * MiB)}]
    profiles = [{"slug": "tiny", "cpu": 1, "memory": "256M", "nodes": ["tiny"]}]
    hub = Hub(tmp_path, nodes, profiles, extra_config="c.GPUSpawner.poll_interval = 2\n")
    hub.start()
    try:
        hub.ensure_user("rita")
        hub.ensure_user("rob")
        assert hub.api("POST", "/users/rita/server", {"profile": "tiny"}).status_code in (201,
                                                                                         202)
        hub.wait_ready("rita")
        (before,) = containers_of(engine, "rita")

        hub.stop()
        assert containers_of(engine, "rita")[0]["Id"] == before["Id"]  # still running
        hub.start()

        model = hub.api("GET", "/users/rita").json()
        assert model["servers"][""]["ready"] is True
        (after,) = containers_of(engine, "rita")
        assert after["Id"] == before["Id"]
        assert after["Labels"]["gpuspawner.allocation"] == \
            before["Labels"]["gpuspawner.allocation"]
        # the restored allocation still holds node tiny: rob is refused
        r = hub.api("POST", "/users/rob/server", {"profile": "tiny"})
        assert r.status_code == 400, r.text
        assert "no node has 256.0 MiB of free memory" in r.json()["message"]

        # the container vanishes while the hub is down: its allocation is freed on restart
        hub.stop()
        engine.remove_container(before["Id"], force=True)
        hub.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and hub.api("GET", "/users/rita").json()["servers"]:
            time.sleep(0.5)
        r = hub.api("POST", "/users/rob/server", {"profile": "tiny"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("rob")
        hub.api("DELETE", "/users/rob/server")
        hub.wait_stopped("rob")
    finally:
        hub.stop()
        remove_managed(engine)
