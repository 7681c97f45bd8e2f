"""A server moves off a failed node, seen through the real hub and proxy: node a (the local
engine behind a socket that the test can cut) fails; the hub's poll restarts the server on
node b (the btrfs engine), routes the user's URL to it, and the same token reaches it again.
Docs: docs/howto/node-failure.md."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")

from gpuspawner.testing.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, remove_objects_of  # noqa: E402
from tests.test_spawner_docker import (  # noqa: E402
    EngineForwarder,
    cpu_topology,
    second_engine,
)

pytestmark = pytest.mark.docker
USER = "nodemover"


def status(session: requests.Session, url: str) -> int:
    """The status of ``url`` for a logged-in user (the hub's OAuth redirects followed); 0 when
    nothing answers."""
    try:
        return session.get(url, timeout=10).status_code
    except requests.RequestException:
        return 0


def node_pair(tmp_path: Path) -> tuple[docker.APIClient, docker.APIClient, EngineForwarder,
                                        list[dict]]:
    """Two CPU nodes for a hub: a (the local engine behind a socket that ``fail()`` cuts) and
    b (the btrfs engine, its own address pool): (engine of a, engine of b, a's forwarder,
    ``c.GPUSpawner.nodes``). Skips without the btrfs engine."""
    engine = _engine()
    url_b, btrfs = second_engine()
    fwd = EngineForwarder(tmp_path / "node-a.sock")
    nodes = [{"name": "a", "docker_url": f"unix://{fwd.path}",
              "topology": str(cpu_topology(tmp_path, "a"))},
             {"name": "b", "docker_url": url_b, "topology": str(cpu_topology(tmp_path, "b")),
              "network_pool": "198.19.0.0/16"}]
    return engine, btrfs, fwd, nodes


def test_the_users_url_works_again_after_its_node_fails(tmp_path: Path):
    engine, btrfs, fwd, nodes = node_pair(tmp_path)
    profiles = [{"slug": "cpu", "cpu": 1, "memory": "512M", "default": True}]
    hub = Hub(tmp_path / "hub", nodes, profiles,
              extra_config="c.Spawner.poll_interval = 2\n"
                           "c.GPUSpawner.placement_policy = 'first-fit'\n")
    hub.start()
    try:
        hub.ensure_user(USER)
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER)
        session = hub.login(USER)
        probe = f"{hub.url}/user/{USER}/lab"
        assert status(session, probe) == 200
        state = hub.api("GET", f"/users/{USER}").json()["servers"][""]["state"]
        assert state["allocation"]["node"] == "a"

        fwd.fail()
        t0 = time.monotonic()
        deadline = t0 + 120
        moved = None
        while time.monotonic() < deadline:
            server = (hub.api("GET", f"/users/{USER}").json().get("servers") or {}).get("")
            if server and (server.get("state") or {}).get("moves") and \
                    status(session, probe) == 200:
                moved = server
                break
            time.sleep(0.5)
        assert moved is not None, hub.tail(80)
        seconds = time.monotonic() - t0
        print(f"node a failed -> the user's URL answers from node b: {seconds:.1f} s")
        assert moved["state"]["allocation"]["node"] == "b"
        assert moved["ready"] and moved["state"]["moves"][-1]["from"] == "a"
        assert btrfs.containers(filters={"label": f"gpuspawner.user={USER}"})
    finally:
        try:
            hub.api("DELETE", f"/users/{USER}/server")
            hub.wait_stopped(USER)
        except Exception:
            pass
        hub.stop()
        try:
            fwd.fail()
        except Exception:
            pass
        remove_objects_of(engine, [USER])
        remove_objects_of(btrfs, [USER])
