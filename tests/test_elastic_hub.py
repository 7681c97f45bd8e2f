"""Elastic nodes in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner; marked
``hub`` and ``docker``), with the command provider and real programs
(tests/doubles/elastic/start-node, stop-node): each start runs a Docker engine in a network
namespace of its own (scripts/elastic-engine.sh), reached through a veth pair, as a machine
that is powered on; each stop stops it.

Node ``a`` (the local engine) holds one server of the profile (it asks for all of this host's
cores); elastic node ``burst-N`` (category ``cpu``, the same topology) is off. A second
user's request fits no running node: it waits, says that a node is being started, gets its
server on the new engine, and the node is stopped ``idle_shutdown`` seconds after that server
is gone. A provider that fails leaves the request waiting with the provider's message and
starts nothing else (back-off). Docs: docs/howto/elastic-nodes.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml

docker = pytest.importorskip("docker")

from gpuspawner.inventory.local import read_local_node  # noqa: E402
from gpuspawner.testing.hubrunner import REPO, Hub  # noqa: E402
from gpuspawner.testing.waiting import wait_until  # noqa: E402
from tests.test_hub_e2e import _engine, remove_objects_of, topology  # noqa: E402
from tests.test_service_hub import EXTRA_ADMIN_SCOPES  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SVC = "/services/gpuspawner/"
DOUBLES = REPO / "tests" / "doubles" / "elastic"
POOL = "198.19.240.0/21"  # the elastic engine's server networks (disjoint from the others')
LINK = "198.19.239.252/30"  # its veth pair
CORES = sum(len(n.cpus) for n in read_local_node("x").numa_nodes)
#: one server fills a node: every core of this host
PROFILES = [
    {
        "slug": "all",
        "display_name": "all cores",
        "cpu": CORES,
        "memory": "256M",
        "queue": True,
        "default": True,
    }
]


def engine_socket(node: str) -> str:
    return f"unix://{REPO / 'var' / 'run' / f'elastic-{node}.sock'}"


def answers(url: str) -> bool:
    try:
        docker.APIClient(base_url=url, version="auto", timeout=3).ping()
        return True
    except Exception:
        return False


def calls(ctl: Path) -> list[str]:
    p = ctl / "calls"
    return p.read_text().splitlines() if p.exists() else []


def queue(hub: Hub) -> dict:
    r = requests.get(
        f"{hub.url}{SVC}api/queue", timeout=30, headers={"Authorization": f"token {hub.token}"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def spawn(hub: Hub, user: str) -> None:
    hub.ensure_user(user)
    r = hub.api("POST", f"/users/{user}/server", {"profile": "all"})
    assert r.status_code in (201, 202), r.text


@contextmanager
def elastic_hub(
    tmp: Path, node: str, users: list[str], fail: str = "", settings: str = ""
) -> Iterator[tuple[Hub, Path]]:
    """A started hub over node ``a`` and elastic node ``node``; yields (hub, control folder
    of the test programs). Afterwards: the users' servers and the hub stopped, the elastic
    engine stopped, the users' objects removed."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, ip and nsenter (a network namespace for the node's engine)")
    ctl = tmp / "ctl"
    ctl.mkdir()
    (ctl / "pool").write_text(POOL)
    (ctl / "link").write_text(LINK)
    topo = topology(tmp, node, 2**30)
    (ctl / "topology.json").write_text(json.dumps(yaml.safe_load(Path(topo).read_text())))
    if fail:
        (ctl / "fail").write_text(fail)
    nodes = [
        {"name": "a", "topology": topology(tmp, "a", 2**30)},
        {
            "name": node,
            "elastic": True,
            "category": "cpu",
            "provider": "command",
            "topology": topo,
            "network_pool": POOL,
        },
    ]
    extra = (
        EXTRA_ADMIN_SCOPES
        + f"""
c.GPUSpawner.placement_policy = 'first-fit'
c.CommandProvider.start_command = [{str(DOUBLES / "start-node")!r}, {str(ctl)!r}]
c.CommandProvider.stop_command = [{str(DOUBLES / "stop-node")!r}, {str(ctl)!r}]
c.GPUElastic.scale_out_after = 2
c.GPUElastic.interval = 1
c.GPUElastic.join_timeout = 180
c.GPUElastic.categories = {{"cpu": {{"start_s": 60}}}}
{settings}
"""
    )
    hub = Hub(tmp / "hub", nodes, PROFILES, extra_config=extra)
    hub.env["GPUSPAWNER_CULLER"] = "off"
    hub.start()
    try:
        yield hub, ctl
    finally:
        for user in users:
            try:
                hub.api("DELETE", f"/users/{user}/server")
                hub.wait_stopped(user)
            except Exception:
                pass
        hub.stop()
        url = engine_socket(node)
        if answers(url):
            remove_objects_of(docker.APIClient(base_url=url, version="auto"), users)
        remove_objects_of(_engine(), users)
        (ctl / "fail").unlink(missing_ok=True)
        subprocess.run([str(DOUBLES / "stop-node"), str(ctl), node], check=False)


def test_a_request_no_running_node_fits_starts_a_node_runs_there_and_the_idle_node_stops(
    tmp_path: Path,
):
    node = "burst-1"
    with elastic_hub(
        tmp_path, node, ["ela", "elb"], settings="c.GPUElastic.idle_shutdown = 4\n"
    ) as (hub, ctl):
        spawn(hub, "ela")
        hub.wait_ready("ela")
        assert calls(ctl) == []  # a running node took it: nothing started
        spawn(hub, "elb")
        msgs = hub.progress("elb", until="a node is being started", timeout=60)
        assert "a node is being started" in msgs[-1], msgs
        hub.wait_ready("elb", timeout=240)
        assert calls(ctl) == [f"start cpu {node}"]
        cli = docker.APIClient(base_url=engine_socket(node), version="auto")
        (c,) = cli.containers(filters={"label": "gpuspawner.user=elb"})
        assert c["State"] == "running"
        assert not _engine().containers(filters={"label": "gpuspawner.user=elb"})
        # the server answers through the hub's proxy, on the node's own network
        r = requests.get(
            f"{hub.url}/user/elb/api", timeout=30, headers={"Authorization": f"token {hub.token}"}
        )
        assert r.status_code == 200, r.text
        # the hub restarts: the node runs on, its server is restored there and still answers
        hub.stop()
        hub.start()
        assert (
            json.loads((tmp_path / "hub" / "hub" / "gpuspawner-elastic.json").read_text())["nodes"][
                node
            ]["state"]
            == "running"
        )
        r = requests.get(
            f"{hub.url}/user/elb/api", timeout=30, headers={"Authorization": f"token {hub.token}"}
        )
        assert r.status_code == 200, r.text
        assert calls(ctl) == [f"start cpu {node}"]
        (c2,) = cli.containers(filters={"label": "gpuspawner.user=elb"})
        assert c2["Id"] == c["Id"]
        # while it holds a server the node keeps running, past idle_shutdown
        wait_until(lambda: any(s["name"] == node and s["state"] == "up" for s in nodes_of(hub)), 30)
        hub.api("DELETE", "/users/elb/server")
        hub.wait_stopped("elb")
        wait_until(
            lambda: f"stop {node}" in calls(ctl),
            60,
            message=lambda: f"calls: {calls(ctl)}\n{hub.tail()}",
        )
        wait_until(lambda: not answers(engine_socket(node)), 30)
        assert calls(ctl) == [f"start cpu {node}", f"stop {node}"]
        assert any(s["name"] == node and s["state"] == "off" for s in nodes_of(hub))
        # node a, which the provider did not start, runs on with its server
        assert hub.server("ela") and hub.server("ela").get("ready")


def nodes_of(hub: Hub) -> list[dict]:
    r = requests.get(
        f"{hub.url}{SVC}api/nodes", timeout=30, headers={"Authorization": f"token {hub.token}"}
    )
    assert r.status_code == 200, r.text
    data = r.json()
    return data["nodes"] if isinstance(data, dict) else data


def test_a_failing_provider_leaves_the_request_waiting_with_its_message_and_starts_nothing_else(
    tmp_path: Path,
):
    node = "burst-2"
    with elastic_hub(
        tmp_path,
        node,
        ["elc", "eld"],
        fail="cloud quota exceeded",
        settings="c.GPUElastic.backoff = 600\n",
    ) as (hub, ctl):
        spawn(hub, "elc")
        hub.wait_ready("elc")
        spawn(hub, "eld")

        # the user asks with a token of their own (not the admin's): the note says that the
        # start failed and when the next try is, never the provider's program or its output
        # (the site's accounts, hosts); the hub's log has them for the admin
        r = hub.api("POST", "/users/eld/tokens", {"note": "elastic test"})
        assert r.status_code == 201, r.text
        own = r.json()["token"]

        def mine(path: str) -> dict:
            r = requests.get(
                f"{hub.url}{SVC}{path}", timeout=30, headers={"Authorization": f"token {own}"}
            )
            assert r.status_code == 200, r.text
            return r.json()

        def note() -> str:
            entries = [e for e in mine("api/queue")["entries"] if e["user"] == "eld"]
            return entries[0]["note"] if entries else ""

        text = wait_until(
            lambda: "failed" in note() and note(),
            60,
            message=lambda: f"note: {note()!r}\n{hub.tail()}",
        )
        assert text.startswith("starting a node failed (its program failed with exit status 3)")
        assert "next try in" in text
        for seen in (text, json.dumps(mine("api/nodes"))):
            assert "cloud quota exceeded" not in seen and str(ctl) not in seen
        assert "cloud quota exceeded" in hub.log_path.read_text(errors="replace")
        # time passes (the next try comes nearer), the policy looks again and again: nothing
        # else is started, the request keeps its place
        first = int(text.rsplit("next try in ", 1)[1].split()[0])
        wait_until(
            lambda: (
                "next try in" in note()
                and int(note().rsplit("next try in ", 1)[1].split()[0]) <= first - 4
            ),
            30,
        )
        assert [c for c in calls(ctl) if c.startswith("start")] == [f"start cpu {node}"]
        (entry,) = [e for e in queue(hub)["entries"] if e["user"] == "eld"]
        assert entry["position"] == 1
        assert not answers(engine_socket(node))
        msgs = hub.progress("eld", until="exit status 3", timeout=30)
        assert "starting a node failed" in msgs[-1], msgs
