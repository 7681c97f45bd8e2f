"""Elastic nodes without a hub: the default policy (pure), the command provider with real
programs, the settings check, the ledger's ``off`` state, and the manager's faults (a node
that joins with another topology, a node whose engine never answers, a provider that fails)
over a real cluster with the command provider running real programs. The hub tests
(tests/test_elastic_hub.py) start real engines. Docs: docs/howto/elastic-nodes.md."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

from gpuspawner.elastic import CommandProvider, ProviderError, default_policy, topology_problem
from gpuspawner.elastic.attach import attach_elastic
from gpuspawner.elastic.config import ElasticConfigError, GPUElastic, elastic_settings
from gpuspawner.elastic.policy import CategoryView, ElasticView, NodeView, WaitingView
from gpuspawner.hub.cluster import get_cluster, reset_clusters
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Owner, PlacementRefused
from tests.test_hub_e2e import topology


def view(nodes=(), waiting=(), cats=None, starts=0, per_hour=10, after=30.0, idle=60.0):
    cats = cats or {"g": CategoryView("g", 0, 2, 120.0)}
    return ElasticView(tuple(nodes), tuple(waiting), cats, starts, after, idle, per_hour)


def w(i: int, waited: float, cats=("g",)) -> WaitingView:
    return WaitingView(f"q{i}", f"u{i}", waited, cats)


OFF = [NodeView("g1", "g", "off"), NodeView("g2", "g", "off")]


# -- the default policy ---------------------------------------------------------------------
def test_scale_out_only_after_scale_out_after_and_once_per_uncovered_request():
    assert default_policy(view(OFF, [w(1, 29.0)])) == []
    (d,) = default_policy(view(OFF, [w(1, 31.0)]))
    assert (d.action, d.category, d.for_entries) == ("start", "g", ("q1",))
    # a node already starting covers the first request; the second gets its own start
    nodes = [NodeView("g1", "g", "starting", started_by_provider=True), OFF[1]]
    assert default_policy(view(nodes, [w(1, 40.0)])) == []
    assert [d.action for d in default_policy(view(nodes, [w(1, 40.0), w(2, 35.0)]))] == ["start"]
    # a request only fixed nodes can hold starts nothing
    assert default_policy(view(OFF, [w(1, 99.0, cats=())])) == []


def test_scale_out_stops_at_max_nodes_the_hourly_cap_and_a_back_off():
    many = [w(i, 100.0) for i in range(5)]
    assert len(default_policy(view(OFF, many))) == 2  # two node entries, max_nodes 2
    cats = {"g": CategoryView("g", 0, 1, 120.0)}
    assert len(default_policy(view(OFF, many, cats))) == 1
    assert len(default_policy(view(OFF, many, starts=9))) == 1
    assert default_policy(view(OFF, many, starts=10)) == []
    backing = {"g": CategoryView("g", 0, 2, 120.0, backoff_until_s=30.0)}
    assert default_policy(view(OFF, many, backing)) == []


def test_min_nodes_are_started_without_demand_and_kept():
    cats = {"g": CategoryView("g", 1, 2, 120.0)}
    (d,) = default_policy(view(OFF, [], cats))
    assert d.action == "start"
    running = [NodeView("g1", "g", "running", 0, 999.0, True), OFF[1]]
    assert default_policy(view(running, [], cats)) == []  # the one min_nodes keeps


def test_scale_in_only_idle_unbooked_nodes_the_provider_started_and_none_a_request_wants():
    idle = NodeView("g1", "g", "running", 0, 61.0, True)
    (d,) = default_policy(view([idle, OFF[1]]))
    assert (d.action, d.node) == ("stop", "g1")
    assert default_policy(view([NodeView("g1", "g", "running", 0, 59.0, True)])) == []
    assert default_policy(view([NodeView("g1", "g", "running", 1, 0.0, True)])) == []
    assert default_policy(view([NodeView("g1", "g", "running", 0, 999.0, False)])) == []
    assert default_policy(view([idle], [w(1, 1.0)])) == []  # a request that fits it waits


# -- the command provider -------------------------------------------------------------------
def program(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_command_provider_runs_the_programs_and_reads_the_last_line(tmp_path: Path):
    topo = {"name": "x", "numa_nodes": [{"id": 0, "cpus": [0], "memory": "1G"}]}
    start = program(
        tmp_path / "start",
        f"""echo booting >&2
echo "some log line"
echo '{json.dumps({"docker_url": "tcp://n1:2376", "topology": topo, "handle": "i-1"})}'
echo "done"
""",
    )
    # the JSON must be the last line: here it is not, so the provider says so
    p = CommandProvider(start_command=[start], stop_command=["true"])
    with pytest.raises(ProviderError, match="last line"):
        asyncio.run(p.start("gpu", "n1"))
    start = program(
        tmp_path / "start2",
        f"""echo "$1 $GPUSPAWNER_NODE" > {tmp_path}/started
echo '{json.dumps({"docker_url": "tcp://n1:2376", "topology": topo, "handle": "i-1"})}'
""",
    )
    stop = program(tmp_path / "stop", f'echo "$1 $GPUSPAWNER_NODE" > {tmp_path}/stopped\n')
    p = CommandProvider(start_command=[start], stop_command=[stop])
    got = asyncio.run(p.start("gpu", "n1"))
    assert (got.docker_url, got.handle, got.topology) == ("tcp://n1:2376", "i-1", topo)
    assert (tmp_path / "started").read_text().split() == ["gpu", "n1"]
    asyncio.run(p.stop("n1", "i-1"))
    assert (tmp_path / "stopped").read_text().split() == ["i-1", "n1"]


def test_command_provider_failures_say_why(tmp_path: Path):
    fail = program(tmp_path / "fail", "echo 'quota exceeded' >&2; exit 3\n")
    p = CommandProvider(start_command=[fail], stop_command=[fail])
    with pytest.raises(ProviderError, match="exit status 3: quota exceeded") as e:
        asyncio.run(p.start("gpu", "n1"))
    # what users are told: neither the program's path nor its output
    assert e.value.public == "its program failed with exit status 3"
    slow = program(tmp_path / "slow", "sleep 30\n")
    p = CommandProvider(start_command=[slow], stop_command=[slow], timeout=0.5)
    with pytest.raises(ProviderError, match="no answer within 0.5 s"):
        asyncio.run(p.start("gpu", "n1"))
    bad = program(tmp_path / "bad", "echo '{\"docker_url\": 1}'\n")
    with pytest.raises(ProviderError, match="docker_url"):
        asyncio.run(CommandProvider(start_command=[bad], stop_command=[bad]).start("g", "n"))
    with pytest.raises(ValueError, match="stop_command: empty"):
        CommandProvider(start_command=[bad]).check_config()
    with pytest.raises(ValueError, match="not an executable"):
        CommandProvider(start_command=[str(tmp_path / "none")], stop_command=[bad]).check_config()


# -- settings -------------------------------------------------------------------------------
def test_settings_are_checked_against_the_node_entries():
    cats = {"g": ["g1", "g2"]}
    s = elastic_settings(GPUElastic(categories={"g": {"min_nodes": 1}}), cats, "")
    assert (s.categories["g"].min_nodes, s.categories["g"].max_nodes) == (1, 2)
    for conf, text in [
        (GPUElastic(categories={"g": {"max_nodes": 3}}), "max_nodes: 3 is more than its 2"),
        (GPUElastic(categories={"g": {"min_nodes": 2, "max_nodes": 1}}), "min_nodes: 2 is more"),
        (GPUElastic(categories={"x": {}}), "categories.x: no elastic node"),
        (GPUElastic(categories={"g": {"size": 1}}), "categories.g.size: unknown"),
        (GPUElastic(join_timeout=0), "join_timeout: must be > 0"),
        (GPUElastic(policy="no.such.policy"), "policy: 'no.such.policy' cannot be imported"),
        (GPUElastic(policy=3), "policy: 3 is not callable"),
    ]:
        with pytest.raises(ElasticConfigError, match=text):
            elastic_settings(conf, cats, "")


def test_topology_problem_names_what_differs(tmp_path: Path):
    a = load_topology_file(topology(tmp_path, "a", 2**30))
    assert topology_problem(a, a) is None
    b = load_topology_file(topology(tmp_path, "b", 2**31))
    assert "bytes of memory" in topology_problem(a, b)


# -- a real cluster, real programs ----------------------------------------------------------
@pytest.fixture
def cluster_with(tmp_path: Path):
    """(make(start_body, **GPUElastic settings) -> (cluster, manager), calls file)."""
    made = []

    def make(start_body: str, **settings):
        reset_clusters()
        topo_a = topology(tmp_path, "a", 2**30)
        topo_e = topology(tmp_path, "e1", 2**30)
        (tmp_path / "topology.json").write_text(
            json.dumps(yaml.safe_load(Path(topo_e).read_text()))
        )
        nodes = [
            {"name": "a", "topology": topo_a},
            {"name": "e1", "elastic": True, "category": "cpu", "topology": topo_e},
        ]
        cluster = get_cluster(nodes, "first-fit", {}, backend="docker")
        c = Config()
        c.CommandProvider.start_command = [program(tmp_path / "start-node", start_body)]
        c.CommandProvider.stop_command = [
            program(tmp_path / "stop-node", f'echo "stop $1" >> {tmp_path}/calls\n')
        ]
        c.GPUElastic.scale_out_after = 0
        c.GPUElastic.backoff = 600
        for k, v in settings.items():
            setattr(c.GPUElastic, k, v)
        manager = attach_elastic(cluster, c, str(tmp_path))
        made.append(cluster)
        return cluster, manager

    yield make, tmp_path / "calls"
    reset_clusters()


def reporting(tmp_path: Path, url: str, memory: str = "") -> str:
    """A start-node program's body: logs "start CATEGORY", prints ``url`` and the category's
    topology (its memory replaced by ``memory`` when given)."""
    script = tmp_path / "report.py"
    script.write_text(
        "import json, sys\n"
        f"t = json.load(open({str(tmp_path / 'topology.json')!r}))\n"
        f"if {memory!r}: t['numa_nodes'][0]['memory'] = {memory!r}\n"
        f"print(json.dumps({{'docker_url': {url!r}, 'topology': t}}))\n"
    )
    return f'echo "start $1" >> {tmp_path}/calls\npython3 {script}\n'


def fill_a_and_wait(cluster) -> None:
    """Book all of node a; queue a request of the same size (it fits only e1)."""
    cores = sum(len(n.cpus) for n in cluster.ledger.node("a").numa_nodes)
    b = Bundle(cores=cores, memory_bytes=2**28)
    cluster.ledger.reserve(b, Owner("holder"))
    cluster.queue.wq.check_admissible(b, Owner("waiter"))  # fits the capacity: e1 can start
    cluster.queue.wq.add(Owner("waiter"), b)


def test_an_off_node_is_capacity_but_takes_nothing(cluster_with):
    make, _ = cluster_with
    cluster, manager = make("exit 1\n")
    assert cluster.ledger.node_state("e1")[0] == "off"
    assert "e1" not in cluster.backend.nodes  # nothing asks its engine
    b = Bundle(cores=1)
    assert cluster.ledger.capacity_refusal(b, ["e1"]) is None
    with pytest.raises(PlacementRefused):
        cluster.ledger.reserve(b, Owner("u"), ["e1"])


async def run_start(manager):
    (d,) = await manager.step()
    assert d.action == "start"
    await manager.slots["e1"].task
    return d


async def test_a_node_with_another_topology_is_refused_stopped_and_its_category_backs_off(
    cluster_with, tmp_path: Path
):
    make, calls = cluster_with
    cluster, manager = make(reporting(tmp_path, "unix:///nonexistent.sock", memory="64G"))
    fill_a_and_wait(cluster)
    await run_start(manager)
    slot = manager.slots["e1"]
    assert slot.state == "off" and "topology other than category cpu's" in slot.error
    assert calls.read_text().split("\n")[:2] == ["start cpu", "stop e1"]
    assert cluster.ledger.node_state("e1")[0] == "off" and "e1" not in cluster.backend.nodes
    (entry,) = cluster.queue.wq.order()
    assert manager.note(entry).startswith("starting a node failed (it joined with a topology")
    assert await manager.step() == []  # backing off: nothing else starts
    assert calls.read_text().count("start") == 1


async def test_a_node_whose_engine_never_answers_is_given_up_after_join_timeout(
    cluster_with, tmp_path: Path
):
    make, calls = cluster_with
    cluster, manager = make(reporting(tmp_path, f"unix://{tmp_path}/none.sock"), join_timeout=2.0)
    fill_a_and_wait(cluster)
    await run_start(manager)
    slot = manager.slots["e1"]
    assert slot.state == "off" and "did not answer within join_timeout 2 s" in slot.error
    assert "stop e1" in calls.read_text()
    assert "e1" not in cluster.backend.nodes


async def test_a_hub_restart_during_a_start_stops_what_was_started(cluster_with, tmp_path):
    make, calls = cluster_with
    cluster, manager = make("sleep 30\n")
    fill_a_and_wait(cluster)
    (d,) = await manager.step()
    assert (
        json.loads((tmp_path / "gpuspawner-elastic.json").read_text())["nodes"]["e1"]["state"]
        == "starting"
    )
    manager.slots["e1"].task.cancel()
    # a new hub process: the start it did not see end is stopped
    cluster2, manager2 = make("exit 1\n")
    assert manager2.slots["e1"].state == "stopping"
    await manager2.step()
    await manager2.slots["e1"].task
    assert manager2.slots["e1"].state == "off"
    assert calls.read_text().split() == ["stop", "e1"]


async def test_the_sites_policy_is_called_and_the_limits_still_hold(cluster_with, tmp_path):
    make, calls = cluster_with
    seen = []

    def greedy(v):
        seen.append(v)
        from gpuspawner.elastic import Decision

        return [
            Decision("start", "cpu"),
            Decision("start", "cpu"),
            Decision("stop", "cpu", "a", reason="not elastic"),
        ]

    cluster, manager = make("exit 1\n", policy=greedy)
    applied = await manager.step()
    assert len(seen) == 1 and [n.name for n in seen[0].nodes] == ["e1"]
    assert [d.action for d in applied] == ["start"]  # one e1; node a is never stopped
    await manager.slots["e1"].task
    assert cluster.ledger.node_state("a")[0] == "up"


def test_the_form_says_a_node_is_started_when_only_an_off_node_has_room(cluster_with):
    from gpuspawner.hub.form import profile_cards
    from gpuspawner.hub.profiles import load_profiles

    make, _ = cluster_with
    cluster, _ = make("exit 1\n")
    cores = sum(len(n.cpus) for n in cluster.ledger.node("a").numa_nodes)
    (p,) = load_profiles([{"slug": "all", "cpu": cores, "memory": "256M", "queue": True}])
    (card,) = profile_cards([p], cluster.ledger, "u", [])
    assert card["free"] and not card["waits"]  # node a has room: nothing to start
    cluster.ledger.reserve(p.bundle, Owner("holder"))
    (card,) = profile_cards([p], cluster.ledger, "u", [])
    assert card["waits"] and card["available"] and not card["never"]
    assert card["reason"] == "no room now: you will wait in the queue while a node is started"
    (p2,) = load_profiles(
        [{"slug": "a-only", "cpu": cores, "memory": "256M", "queue": True, "nodes": ["a"]}]
    )
    (card,) = profile_cards([p2], cluster.ledger, "u", [])
    assert card["reason"] == "no room now: you will wait in the queue"
