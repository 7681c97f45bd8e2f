"""Work on the hub's event loop that grows with the number of servers (benchmarks/hub_scale.py
found it): each must stay proportional to what changed, not to what exists.

- ``GET api/allocations`` and the admin map format an allocation once (a count of
  ``Allocation.to_dict`` calls per request: 0 for a request after nothing changed, 1 after one
  new booking), and their answers are the same as formatting everything anew;
- the admin map's view and HTML (about 1 MiB at 1,000 servers) and the metrics' gauges are
  made in a worker thread from a copy of the cluster taken on the loop, not on the loop (the
  threads that run ``map_view``, ``Template.render`` and the collector, through the service's
  real handlers); the copy gives what the live cluster gave when it was taken;
- a spawner's state formats its allocation once however often JupyterHub asks for it;
- a spawn that books at once writes no queue file (a count of writes over 50 spawns);
- the nodes' setting is checked against its schema once, not once per spawner;
- a new spawner (one per server and spawn) costs the same work at 10 and 100 nodes: the
  hub's start leaves ``nodes`` in its configuration as a shared, checked, read-only value
  that traitlets neither deep-copies nor validates again (a count of calls).

No hub, no engine: a real Ledger on benchmark-sized fake nodes, the service's real Tornado
application with the hub's login replaced by a fixed admin model.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import pickle
import sys
import threading
from typing import Any

import jinja2
import pytest
from traitlets import TraitError
from traitlets.config import Config

from benchmarks.fake_backend import FakeBackend
from benchmarks.hub_scale import fake_node
from benchmarks.loop_probe import freeze_after_start
from gpuspawner.backends.base import Managed, NodeRuntime
from gpuspawner.gpushare.mechanism import Mechanism
from gpuspawner.hub import cluster as cluster_module
from gpuspawner.hub import trait_check
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.service import views
from gpuspawner.hub.service.views import allocation_views, allocations_json, map_view
from gpuspawner.hub.spawn_queue import QueueSettings, SpawnQueue
from gpuspawner.inventory.topology import node_from_dict
from gpuspawner.placement import Allocation, Bundle, Ledger, Owner
from gpuspawner.placement.queue import WaitQueue

SMALL = Bundle(cores=1, memory_bytes=2 << 30, gpu_milli=250)


def cluster_with(servers: int) -> Cluster:
    nodes = [node_from_dict(fake_node(i)) for i in range((servers + 23) // 24)]
    ledger = Ledger(nodes, policy="fgd")
    for i in range(servers):
        ledger.reserve(SMALL, Owner(f"u{i:05d}", "", (f"g{i % 3}",)))
    return Cluster(
        {n.name: NodeRuntime(n.name, "127.0.0.1", "x.yaml", n) for n in nodes},
        ledger,
        FakeBackend(responder_port=4242),
    )


@pytest.fixture
def to_dict_calls(monkeypatch) -> list[tuple[str, int]]:
    """Every ``Allocation.to_dict`` call from now on (the allocation's id, the calling
    thread's ident)."""
    calls: list[tuple[str, int]] = []
    original = Allocation.to_dict

    def counted(self: Allocation) -> dict[str, Any]:
        calls.append((self.id, threading.get_ident()))
        return original(self)

    monkeypatch.setattr(Allocation, "to_dict", counted)
    views._VIEWS.clear()
    yield calls
    views._VIEWS.clear()


def test_allocations_are_formatted_once_per_booking(to_dict_calls):
    cluster = cluster_with(200)
    first = allocations_json(cluster)
    assert len(to_dict_calls) == 200
    assert allocations_json(cluster) == first and len(to_dict_calls) == 200  # nothing again
    assert json.loads(first) == allocation_views(cluster)
    assert first == json.dumps(allocation_views(cluster), sort_keys=True)  # the same bytes
    cluster.ledger.reserve(SMALL, Owner("newcomer"))
    again = json.loads(allocations_json(cluster))
    assert len(to_dict_calls) == 201 and again[-1]["owner"]["user"] == "newcomer"
    one = json.loads(allocations_json(cluster, "u00007"))
    assert [a["owner"]["user"] for a in one] == ["u00007"] and len(to_dict_calls) == 201
    # released allocations leave the cache once it holds twice what is booked
    for a in cluster.ledger.allocations()[:150]:
        cluster.ledger.release(a.id)
    allocations_json(cluster)
    assert len(views._VIEWS) <= 2 * 51 + 64


def test_the_admin_map_formats_nothing_again_and_matches_a_fresh_one(to_dict_calls):
    cluster = cluster_with(120)
    view = map_view(cluster)
    n = len(to_dict_calls)
    assert n == 120
    again = map_view(cluster)
    assert len(to_dict_calls) == n
    views._VIEWS.clear()
    assert again == view == map_view(cluster)  # cached or made anew: the same page data
    assert len(view["quota_rows"]) == 120 and view["totals"]["allocations"] == 120


def test_a_snapshot_rebuilds_only_the_nodes_that_changed(monkeypatch):
    """``Ledger.snapshot`` (the admin map's, the metrics' and ``api/nodes``' read on the loop)
    makes a node's dict again only for the nodes that changed: none after nothing changed, one
    after one booking; its readers never change the dicts it shares between snapshots."""
    from gpuspawner.hub.metrics import latest_from
    from gpuspawner.hub.service.frozen import FrozenCluster, freeze_all

    cluster = cluster_with(240)
    ledger = cluster.ledger
    built: list[str] = []
    original = Ledger._snapshot_node

    def counted(self: Ledger, st: Any) -> dict[str, Any]:
        built.append(st.name)
        return original(self, st)

    monkeypatch.setattr(Ledger, "_snapshot_node", counted)
    first = ledger.snapshot()
    assert len(built) == len(ledger.nodes) == 10 and first == ledger._snapshot_full()
    built.clear()
    assert ledger.snapshot() == first and built == []  # nothing changed: nothing made
    a = ledger.reserve(SMALL, Owner("newcomer"))
    after = ledger.snapshot()
    assert built == [a.node] and after == ledger._snapshot_full() != first
    assert sum(x is not y for x, y in zip(first, after, strict=True)) == 1
    built.clear()
    gone = ledger.release(ledger.allocations()[0].id)
    cluster.drain_gpu(ledger.nodes[3].gpus[0].uuid, "fan", by="admin")
    ledger.set_node_state(ledger.nodes[5].name, "drain", "maintenance")
    kept = copy.deepcopy(ledger.snapshot())
    assert sorted(built) == sorted({gone.node, ledger.nodes[3].name, ledger.nodes[5].name})
    assert kept == ledger._snapshot_full()
    built.clear()
    # its readers copy what they change: the ledger's dicts are as they were
    views.node_views(cluster, None)
    views.node_views(cluster, "u00007")
    map_view(cluster)
    map_view(FrozenCluster(cluster))
    latest_from(freeze_all([cluster]))
    assert ledger.snapshot() == kept == ledger._snapshot_full() and built == []


def test_a_frozen_copy_gives_the_same_map_and_metrics(monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuspawner.hub import metrics
    from gpuspawner.hub.metrics import ClusterCollector, latest_from
    from gpuspawner.hub.service.frozen import FrozenCluster, freeze_all

    cluster = cluster_with(60)
    cluster.drain_gpu(cluster.ledger.nodes[0].gpus[7].uuid, "fan", by="admin")
    frozen = FrozenCluster(cluster)
    cluster.ledger.reserve(SMALL, Owner("later"))  # after the copy: not in it
    view = map_view(frozen)
    assert view["totals"]["allocations"] == 60 and view["drained"] == 1
    assert "later" not in {r["user"] for r in view["quota_rows"]}
    live = map_view(cluster)
    assert live["totals"]["allocations"] == 61
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: [cluster]))
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    copy = freeze_all([cluster])
    assert metrics.other_families() == []  # (the live ledger's gauges are left out)
    assert latest_from(copy) == generate_latest(registry)  # nothing changed: the same text
    cluster.ledger.reserve(SMALL, Owner("last"))
    assert b"gpuspawner_users_holding 61.0" in latest_from(copy)  # the copy's
    assert b"gpuspawner_users_holding 62.0" in generate_latest(registry)  # the ledger's now


async def test_the_admin_page_is_rendered_off_the_event_loop(monkeypatch, to_dict_calls):
    """The service's real handler, with the hub's login replaced by an admin model: the map's
    view, its HTML, the metrics' gauges and ``api/nodes``' view are made in a worker thread
    (``api/nodes`` the same answer as the live cluster's view)."""
    from prometheus_client import CollectorRegistry
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from gpuspawner.hub import metrics
    from gpuspawner.hub.service import app

    cluster = cluster_with(100)
    admin = {
        "name": "root",
        "kind": "user",
        "admin": True,
        "scopes": ["custom:gpuspawner:admin", "access:services!service=gpuspawner"],
    }

    class Login:
        base_url = "/services/gpuspawner/"

        async def get_user(self, handler: Any, sync: bool = True) -> dict[str, Any]:
            return admin

        def check_scopes(self, required: Any, model: dict[str, Any]) -> set[str]:
            return set(required)

    service = app.GPUService(
        "gpuspawner",
        "t" * 64,
        hub_api_url="http://127.0.0.1:1/hub/api",
        cluster_provider=lambda: cluster,
        user_lookup=lambda name: (True, []),
    )
    service._hub_auth = Login()  # type: ignore[assignment]
    threads: list[int] = []
    original = jinja2.Template.render

    def spy(self: jinja2.Template, *args: Any, **kwargs: Any) -> str:
        threads.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Template, "render", spy)
    # the template's first load compiles it (65-75 ms at the first page after the hub's
    # start): off the loop too
    load_threads: list[int] = []
    load = jinja2.Environment.get_template

    def load_spy(self: jinja2.Environment, *args: Any, **kwargs: Any) -> jinja2.Template:
        load_threads.append(threading.get_ident())
        return load(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "get_template", load_spy)
    # a first api/allocations after a burst of bookings (100 > INLINE_FORMAT_MAX not
    # formatted yet) formats them off the loop (to_dict_calls: the threads that formatted)
    view_threads: list[int] = []

    def map_spy(c: Any) -> dict[str, Any]:
        view_threads.append(threading.get_ident())
        return map_view(c)

    monkeypatch.setattr(app, "map_view", map_spy)
    nodes_threads: list[int] = []

    def nodes_spy(c: Any, viewer: str | None) -> list[dict[str, Any]]:
        nodes_threads.append(threading.get_ident())
        return views.node_views(c, viewer)

    monkeypatch.setattr(app, "node_views", nodes_spy)
    gauge_threads: list[int] = []
    collect = metrics.ClusterCollector.collect

    def collect_spy(self: Any) -> Any:
        families = list(collect(self))
        if families:  # (on the loop it yields nothing: the copy's gauges are made instead)
            gauge_threads.append(threading.get_ident())
        return iter(families)

    other_threads: list[int] = []

    class LoopOwned:  # like the jobs' collector, whose database session the loop owns
        def collect(self) -> Any:
            from prometheus_client.core import GaugeMetricFamily

            other_threads.append(threading.get_ident())
            yield GaugeMetricFamily("loop_owned", "read on the loop", value=1)

    monkeypatch.setattr(metrics.ClusterCollector, "collect", collect_spy)
    collector = metrics.ClusterCollector(lambda: [cluster])
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(LoopOwned())  # type: ignore[arg-type]
    monkeypatch.setattr(metrics, "_COLLECTOR", collector)
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(service.make_app())
    server.add_sockets(sockets)
    try:
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{service.prefix}"
        allocs = await AsyncHTTPClient().fetch(url + "api/allocations", raise_error=False)
        r = await AsyncHTTPClient().fetch(url + "admin", raise_error=False)
        scrape = await AsyncHTTPClient().fetch(url + "metrics", raise_error=False)
        nodes = await AsyncHTTPClient().fetch(url + "api/nodes", raise_error=False)
    finally:
        server.stop()
        await server.close_all_connections()
    assert r.code == 200, r.body[:500]
    html = r.body.decode()
    assert html.count('data-quota-user="u000') == 100 and 'data-allocation="' in html
    loop_thread = threading.get_ident()
    assert threads and loop_thread not in threads  # never on the loop's thread
    assert load_threads and loop_thread not in load_threads
    format_threads = [thread for _, thread in to_dict_calls]
    assert allocs.code == 200 and len(format_threads) == 100
    assert loop_thread not in format_threads
    assert allocs.body.decode() == allocations_json(cluster)  # the same answer
    assert view_threads and loop_thread not in view_threads
    assert scrape.code == 200 and b"gpuspawner_users_holding 100.0" in scrape.body
    assert gauge_threads and loop_thread not in gauge_threads
    assert b"loop_owned 1.0" in scrape.body and other_threads == [loop_thread]
    assert nodes.code == 200 and nodes_threads and loop_thread not in nodes_threads
    assert json.loads(nodes.body) == json.loads(json.dumps(views.node_views(cluster, None)))


def test_spawner_state_formats_its_allocation_once(to_dict_calls):
    from gpuspawner.hub.spawner import GPUSpawner

    cluster = cluster_with(2)
    a, b = cluster.ledger.allocations()
    spawner = GPUSpawner()
    spawner.allocation = a
    states = [spawner.get_state() for _ in range(5)]
    assert len(to_dict_calls) == 1
    assert all(s["allocation"] == a.to_dict() for s in states)
    spawner.allocation = b  # a new allocation is formatted anew
    assert spawner.get_state()["allocation"]["id"] == b.id
    spawner.allocation = None
    assert "allocation" not in spawner.get_state()


def test_spawns_that_book_at_once_write_no_queue_file(tmp_path, monkeypatch):
    ledger = Ledger([node_from_dict(fake_node(i)) for i in range(3)], policy="fgd")
    path = tmp_path / "q.json"
    q = SpawnQueue(WaitQueue(ledger), QueueSettings(file=str(path), tick_s=0.05))
    writes: list[str] = []
    original = os.replace

    def counted(src: Any, dst: Any) -> None:
        writes.append(str(dst))
        original(src, dst)

    monkeypatch.setattr(os, "replace", counted)

    async def main() -> None:
        for i in range(50):
            await q.acquire(Owner(f"u{i}"), SMALL)

    asyncio.run(main())
    assert len(ledger.allocations()) == 50
    assert writes.count(str(path)) <= 1  # (the first save of this process)
    assert json.loads(path.read_text())["entries"] == []
    path.unlink()  # gone from under the hub: written again at the next change
    q.save()
    assert json.loads(path.read_text())["entries"] == []


def test_the_nodes_setting_is_checked_once_for_every_spawner(monkeypatch):
    calls: list[int] = []
    original = trait_check.check_node_entries

    def counted(entries: Any) -> None:
        calls.append(len(entries))
        original(entries)

    monkeypatch.setattr(trait_check, "check_node_entries", counted)
    trait_check._PASSED.clear()
    nodes = [{"name": f"fake-{i:03d}", "topology": f"/x/{i}.yaml"} for i in range(42)]
    for _ in range(20):
        trait_check.check_trait("nodes", [dict(n) for n in nodes])
    assert calls == [42]
    with pytest.raises(trait_check.HubConfigError, match="nodes"):  # a bad value still fails
        trait_check.check_trait("nodes", [*nodes, {"name": "x", "gpus": 1}])
    with pytest.raises(trait_check.HubConfigError):  # every time
        trait_check.check_trait("nodes", [*nodes, {"name": "x", "gpus": 1}])
    assert len(calls) == 3


def test_gc_freeze_after_start_freezes_once_the_hub_has_started() -> None:
    """hub_scale.py --gc-freeze: nothing is frozen while the hub starts, everything it held
    once started is, and the thresholds are set after."""
    seen: list[int] = []

    class App:
        async def start(self) -> None:
            seen.append(gc.get_freeze_count())

    before = gc.get_threshold()
    gc.unfreeze()
    app = App()
    try:
        freeze_after_start(app, (50_000, 20, 100))
        assert gc.get_freeze_count() == 0  # not before the start
        asyncio.run(app.start())
        assert seen == [0]
        assert gc.get_freeze_count() > 1000  # the modules, classes, ... of this process
        assert gc.get_threshold() == (50_000, 20, 100)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def _python_calls(fn: Any) -> int:
    """How many Python function calls ``fn()`` makes (a count of the work, not a time)."""
    calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


def _spawner_config(nodes: int) -> Config:
    c = Config()
    c.GPUSpawner.nodes = [{"name": f"fake-{i:03d}", "topology": f"/x/{i}.yaml"}
                          for i in range(nodes)]
    c.GPUSpawner.quotas = {"users": {"ann": {"gpus": 1}}}
    return c


def test_a_new_spawner_costs_the_same_whatever_the_number_of_nodes():
    """JupyterHub makes a spawner per server and spawn; traitlets deep-copies and validates
    every configured value into it. With the hub's shared, checked ``nodes`` (what the hub's
    start leaves in its configuration) that is O(1), not O(nodes): before, each GPUSpawner()
    made about 17 more calls per node (copy, per-entry validation, the check's JSON key)."""
    from gpuspawner.hub.config_check import share_checked_settings
    from gpuspawner.hub.spawner import GPUSpawner

    work, configs = {}, {}
    for nodes in (10, 100):
        c = configs[nodes] = _spawner_config(nodes)
        share_checked_settings(c)
        GPUSpawner(config=c)  # (first: imports, the once-per-process guard)
        work[nodes] = _python_calls(lambda c=c: [GPUSpawner(config=c) for _ in range(10)])
    assert work[100] - work[10] < 100, work  # not per node
    for nodes, c in configs.items():
        s = GPUSpawner(config=c)
        assert s.nodes is c.GPUSpawner.nodes
        assert s.nodes == _spawner_config(nodes).GPUSpawner.nodes  # the same value


def test_shared_settings_are_read_only_and_checked():
    from gpuspawner.hub.config_check import share_checked_settings
    from gpuspawner.hub.spawner import GPUSpawner
    from gpuspawner.hub.trait_check import SharedDict, SharedList

    c = _spawner_config(3)
    share_checked_settings(c)
    nodes = c.GPUSpawner.nodes
    assert isinstance(nodes, SharedList) and isinstance(nodes[0], SharedDict)
    with pytest.raises(TypeError, match="read-only"):
        nodes.append({"name": "x"})
    with pytest.raises(TypeError, match="read-only"):
        nodes[0]["name"] = "renamed"
    # quotas stay each spawner's own: JupyterHub's group_overrides merge into them in place
    spawner = GPUSpawner(config=c)
    spawner._apply_overrides({"quotas": {"users": {"bob": {"gpus": 2}}}})
    assert spawner.quotas["users"] == {"ann": {"gpus": 1}, "bob": {"gpus": 2}}
    assert c.GPUSpawner.quotas == {"users": {"ann": {"gpus": 1}}}
    assert GPUSpawner(config=c).quotas == c.GPUSpawner.quotas
    assert copy.deepcopy(nodes) is nodes and copy.copy(nodes) is nodes
    again = pickle.loads(pickle.dumps(nodes))
    assert type(again) is list and type(again[0]) is dict and again == nodes
    assert json.loads(json.dumps(nodes)) == nodes
    # a spawner given its own plain value still has it checked (and copied) as before
    with pytest.raises(TraitError, match="nodes"):
        GPUSpawner(nodes=[{"name": "x", "gpus": 1}])
    own = [{"name": "own", "topology": "/x/own.yaml"}]
    s = GPUSpawner(nodes=own)
    assert s.nodes == own and not isinstance(s.nodes, SharedList)
    bad = Config()
    bad.GPUSpawner.nodes = [{"name": "x", "gpus": 1}]
    with pytest.raises(SystemExit, match="GPUSpawner.nodes"):
        share_checked_settings(bad)


async def test_the_share_watchdog_parses_allocations_off_the_event_loop(monkeypatch):
    """A watchdog pass parses every running server's allocation (``Allocation.from_json``,
    every ``share_interval_s``): that is done in the pass's worker thread, and the shares it
    hands the watchdog are those of the servers on share nodes."""
    cluster = cluster_with(48)
    for rt in cluster.nodes.values():
        rt.gpu_share = Mechanism("watchdog", "")
    allocs = cluster.ledger.allocations()
    found = [Managed(a.node, a.to_json(), f"c{i:04d}") for i, a in enumerate(allocs)]

    async def list_managed() -> list[Managed]:
        return found

    monkeypatch.setattr(cluster.backend, "list_managed", list_managed)
    loop_thread = threading.get_ident()
    parsed_on: set[int] = set()
    original = cluster_module.shares_from_allocations

    def recorded(*args: Any, **kwargs: Any) -> Any:
        parsed_on.add(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(cluster_module, "shares_from_allocations", recorded)
    seen: list[dict] = []

    class Dog:
        notices: dict = {}

        def check(self, shares: dict) -> list:
            seen.append(shares)
            return []

    cluster.share_watchdog = Dog()  # type: ignore[assignment]
    assert await cluster.check_shares(force=True) == []
    assert parsed_on and loop_thread not in parsed_on
    (shares,) = seen
    assert sorted(shares) == sorted(m.handle for m in found)
    assert {s.user for s in shares.values()} == {a.owner.user for a in allocs}
