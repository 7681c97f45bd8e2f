"""A server moves off a failed node, seen through the real hub and proxy: node a (the local
engine behind a socket that the test can cut) fails; the hub's poll restarts the server on
node b (the btrfs engine), routes the user's URL to it, and the same token reaches it again.
Docs: docs/howto/node-failure.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")

from gpuspawner.testing.hubrunner import Hub  # noqa: E402
from gpuspawner.testing.waiting import wait_until  # noqa: E402
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


@contextmanager
def moving_hub(tmp_path: Path, user: str) -> Iterator[tuple[Hub, docker.APIClient,
                                                            docker.APIClient, EngineForwarder]]:
    """A started hub over :func:`node_pair`'s two nodes (first-fit, 2 s poll) and ``user``
    made: yields (hub, engine of a, engine of b, a's forwarder); afterwards stops the user's
    server and the hub, cuts a's forwarder and removes the user's objects on both engines."""
    engine, btrfs, fwd, nodes = node_pair(tmp_path)
    profiles = [{"slug": "cpu", "cpu": 1, "memory": "512M", "default": True}]
    hub = Hub(tmp_path / "hub", nodes, profiles,
              extra_config="c.Spawner.poll_interval = 2\n"
                           "c.GPUSpawner.placement_policy = 'first-fit'\n")
    hub.start()
    try:
        hub.ensure_user(user)
        yield hub, engine, btrfs, fwd
    finally:
        try:
            hub.api("DELETE", f"/users/{user}/server")
            hub.wait_stopped(user)
        except Exception:
            pass
        hub.stop()
        try:
            fwd.fail()
        except Exception:
            pass
        remove_objects_of(engine, [user])
        remove_objects_of(btrfs, [user])


def test_the_users_url_works_again_after_its_node_fails(tmp_path: Path):
    with moving_hub(tmp_path, USER) as (hub, engine, btrfs, fwd):
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


def test_the_old_server_is_removed_when_its_node_returns_and_its_token_is_dead(
        tmp_path: Path):
    """Issue 46: 40 s after node a answered again, the container the server left there still
    ran, with the user's home and the same API token, beside the moved server. Now the token
    is revoked when the server moves (the hub refuses it at once) and the old container is
    removed as soon as node a answers again, before anything else runs there."""
    user = USER + "-old"
    with moving_hub(tmp_path, user) as (hub, engine, btrfs, fwd):
        r = hub.api("POST", f"/users/{user}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(user)
        (old,) = engine.containers(filters={"label": f"gpuspawner.user={user}"})
        env = dict(e.split("=", 1) for e in engine.inspect_container(old["Id"])["Config"]["Env"])
        old_token = env["JUPYTERHUB_API_TOKEN"]
        assert hub.api("GET", "/user", token=old_token).status_code == 200

        fwd.fail()

        def moved() -> dict | None:
            server = hub.server(user)
            return server if server and (server.get("state") or {}).get("moves") and \
                server.get("ready") else None

        server = wait_until(moved, 120, 0.5, "the server moved to node b")
        assert server["state"]["allocation"]["node"] == "b"
        # the old token is dead as soon as the server moved; the new server has its own
        assert hub.api("GET", "/user", token=old_token).status_code == 403
        (new,) = btrfs.containers(filters={"label": f"gpuspawner.user={user}"})
        new_env = dict(e.split("=", 1)
                       for e in btrfs.inspect_container(new["Id"])["Config"]["Env"])
        assert new_env["JUPYTERHUB_API_TOKEN"] != old_token
        assert hub.api("GET", "/user", token=new_env["JUPYTERHUB_API_TOKEN"]
                       ).status_code == 200
        # node a's engine never stopped: the old container outlived the "outage"
        assert engine.containers(filters={"id": old["Id"]})

        fwd.recover()
        t0 = time.monotonic()
        wait_until(lambda: not engine.containers(all=True, filters={"id": old["Id"]}), 20,
                   0.2, "the old container on node a removed")
        print(f"node a answers -> its old container is gone: {time.monotonic() - t0:.1f} s")
        assert moved() is not None  # the moved server runs on
