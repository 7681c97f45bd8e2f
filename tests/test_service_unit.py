"""The service's views, OpenAPI document and metrics on a real ledger (no hub, no engine).

Topology: ``tests/data/topologies/dgx-a100.yaml`` (8 A100 on 2 NUMA nodes) plus a CPU-only node,
with quotas; two users hold allocations. Every view is validated against the OpenAPI
document's schema, so the document and the code cannot disagree silently.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuspawner.backends.base import Backend
from gpuspawner.gpushare.watchdog import Notice, Watchdog
from gpuspawner.hub import metrics
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.service.frozen import FrozenCluster
from gpuspawner.hub.service.openapi import openapi_document
from gpuspawner.hub.service.views import (
    OTHER,
    allocation_views,
    map_view,
    node_views,
    usage_view,
)
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner, QuotaExceeded, QuotaTable

TOPO = Path(__file__).parent / "data" / "topologies"


@pytest.fixture
def cluster() -> Cluster:
    dgx = load_topology_file(str(TOPO / "dgx-a100.yaml"))
    cpu = load_topology_file(str(TOPO / "cpu-only.yaml"))
    quotas = QuotaTable.from_config(users={"alice": {"gpus": 2}},
                                    groups={"lab": {"gpus": 4}},
                                    default_user={"gpus": 1, "servers": 2})
    ledger = Ledger([dgx, cpu], quotas=quotas)
    ledger.reserve(Bundle(cores=8, memory_bytes=2**30, gpus=2, gpu_models=("A100",)),
                   Owner("alice", "", ("lab",)))
    ledger.reserve(Bundle(cores=2, memory_bytes=2**30, gpus=1, gpu_models=("A100",)),
                   Owner("bob", "work", ("lab",)))
    # the base Backend runs nothing and finds nothing to restore
    return Cluster({n.name: None for n in ledger.nodes}, ledger, Backend())  # type: ignore


def _json_schema(name: str) -> dict[str, Any]:
    """The OpenAPI component ``name`` as a JSON Schema (``nullable`` -> a null type)."""
    doc = copy.deepcopy(openapi_document())

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            if node.pop("nullable", False) and "type" in node:
                node["type"] = [node["type"], "null"]
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(doc)
    return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}


def _validate(instance: Any, name: str, array: bool = False) -> None:
    schema = _json_schema(name)
    if array:
        schema = {"type": "array", "items": {"$ref": schema["$ref"]},
                  "components": schema["components"]}
    jsonschema.validate(instance, schema)


def test_admin_node_view_names_every_holder(cluster):
    nodes = node_views(cluster, None)
    _validate(nodes, "Node", array=True)
    dgx = next(n for n in nodes if n["gpus"])
    held = {h["user"] for g in dgx["gpus"] for h in g["holders"]}
    assert held == {"alice", "bob"}
    assert dgx["summary"]["gpus_total"] == 8
    assert dgx["summary"]["gpus_free"] == 5
    assert dgx["summary"]["gpu_milli_used"] == 3000
    assert dgx["summary"]["cores_free"] == dgx["summary"]["cores_total"] - 10


def test_user_node_view_hides_other_users(cluster):
    nodes = node_views(cluster, "bob")
    _validate(nodes, "Node", array=True)
    holders = [h for n in nodes for g in n["gpus"] for h in g["holders"]]
    mine = [h for h in holders if h["mine"]]
    others = [h for h in holders if not h["mine"]]
    assert [h["user"] for h in mine] == ["bob"]
    assert len(others) == 2 and all(h["user"] == OTHER and h["allocation"] is None
                                    for h in others)
    owners = {u for n in nodes for nn in n["numa_nodes"] for u in nn["cpu_owners"].values()}
    assert owners == {"bob", OTHER}


def test_user_node_view_from_the_frozen_copy_names_no_one_else(cluster):
    """What api/nodes encodes for bob (node_views on the FrozenCluster the handler makes):
    alice's name, her allocation's id and her groups appear nowhere in the JSON text."""
    alice = cluster.ledger.allocations("alice")[0]
    text = json.dumps(node_views(FrozenCluster(cluster, usage=False, allocations=False), "bob"))
    assert "bob" in text
    for secret in ("alice", alice.id, '"lab"'):
        assert secret not in text, secret


def test_changing_a_node_view_leaves_later_views_alone(cluster):
    """The answer is the caller's to change (its docstring); the ledger's incremental
    snapshot shares its node dicts between calls, so every nested list or dict of the answer
    must be a copy, or a change would show in every later api/nodes, map and metrics answer
    until the node next changes."""
    before = node_views(cluster, "bob")
    for node in before:
        node["labels"]["changed"] = "yes"
        for nn in node["numa_nodes"]:
            nn["cpus"].append(10_000)
            nn["cpus_free"].clear()
        for g in node["gpus"]:
            g["holders"].clear()
    assert cluster.ledger.snapshot() == cluster.ledger._snapshot_full()
    assert node_views(cluster, "bob") == node_views(cluster, "bob")
    assert node_views(cluster, "bob") != before


def test_allocations_and_usage(cluster):
    allocs = allocation_views(cluster)
    _validate(allocs, "Allocation", array=True)
    assert [a["owner"]["user"] for a in allocs] == ["alice", "bob"]
    assert [a["gpu_milli"] for a in allocation_views(cluster, "bob")] == [1000]
    u = usage_view(cluster, "alice", ["lab"])
    _validate(u, "UserUsage")
    assert u["usage"]["gpu_milli"] == 2000 and u["quota"]["gpu_milli"] == 2000
    assert u["remaining"]["gpu_milli"] == 0
    assert u["group_quotas"] == [{"group": "lab",
                                  "usage": {**u["group_quotas"][0]["usage"],
                                            "gpu_milli": 3000},
                                  "quota": {"gpu_milli": 4000, "cores": None,
                                            "memory_bytes": None, "disk_bytes": None,
                                            "servers": None}}]
    # a user without an entry gets default_user
    assert usage_view(cluster, "nobody", [])["quota"]["servers"] == 2
    assert u["gpu_share_notices"] == []  # no watchdog here


def test_usage_view_carries_the_users_own_share_notices_only(cluster):
    """The watchdog's notices reach their user's usage view (the Lab panel reads it), never
    another user's."""
    dog = Watchdog(nvml=None)
    note = Notice("alice", "big", "GPU-x", 31 * 2**30, 20 * 2**30, 1_900_000_000.0)
    dog.notices = {"alice": (note,)}
    cluster.share_watchdog = dog
    u = usage_view(cluster, "alice", ["lab"])
    _validate(u, "UserUsage")
    assert u["gpu_share_notices"] == [note.to_dict()]
    assert u["gpu_share_notices"][0]["message"].startswith("Your kernels use 31.0 GiB")
    assert usage_view(cluster, "bob", [])["gpu_share_notices"] == []


def test_map_view_cells_match_the_ledger(cluster):
    view = map_view(cluster)
    dgx = next(r for r in view["nodes"] if r["gpus"])
    busy = [g for g in dgx["gpus"] if g["owners"]]
    assert sorted(o for g in busy for o in g["owners"]) == ["alice", "alice", "bob"]
    assert all(g["milli_used"] == 1000 for g in busy)
    assert len({g["colour"] for g in busy}) == 2  # one colour per owner
    free = [g for g in dgx["gpus"] if not g["owners"]]
    assert {g["colour"] for g in free} == {"#eeeeee"}
    used = sum(m["cores_used"] for m in dgx["numa"])
    assert used == 10
    assert view["totals"] == {"gpus": 8, "gpus_free": 5, "gpu_milli_used": 3000,
                              "allocations": 2}
    rows = {q["user"]: q for q in view["quota_rows"]}
    assert rows["alice"]["usage"]["gpu_milli"] == 2000
    assert rows["alice"]["quota"]["gpu_milli"] == 2000


def test_admin_template_renders_every_cell(cluster):
    from gpuspawner.hub.service.views import page_templates
    from gpuspawner.webui import service_links

    html = page_templates().get_template("admin.html.j2").render(
        view=map_view(cluster), user={"name": "admin", "admin": True},
        prefix="/services/gpuspawner/", hub_prefix="/hub/", refresh_s=5,
        links=service_links("/services/", "GPU map"), api_links=[("API", "/x")])
    assert html.count('class="gpu"') == 5
    assert html.count('class="gpu busy"') == 3
    assert html.count('class="numa"') == 4  # 2 NUMA nodes on each node
    assert 'data-quota-user="alice" data-gpu-milli="2000" data-gpu-milli-limit="2000"' in html
    # in the hub's look: its stylesheet and theme script, its navigation, both service pages
    assert '<link rel="stylesheet" href="/hub/static/css/style.min.css">' in html
    assert 'src="/hub/static/js/darkmode.js"' in html and 'id="dark-theme-toggle"' in html
    assert 'href="/services/gpuspawner/admin" aria-current="page">GPU map' in html
    assert 'href="/services/idle-culler/">Idle culler' in html
    # the allocations' cores column: a count, the CPU ids in its title
    for a in map_view(cluster)["allocations"]:
        assert (f'<td data-cores="{len(a["cpuset"])}"><span title="CPU ids '
                f'{a["cpuset_text"]}">{len(a["cpuset"])}</span>') in html


def test_gpu_cell_text_reads_on_its_colour():
    from gpuspawner.hub.service.views import text_colour

    assert text_colour("#eeeeee") == "#000000"
    assert text_colour("#202020") == "#ffffff"
    assert text_colour("hsl(200, 65%, 45%)") in ("#000000", "#ffffff")
    assert text_colour("hsl(60, 65%, 90%)") == "#000000"


def test_openapi_document_is_valid_openapi_3():
    doc = openapi_document("/services/gpuspawner/")
    assert doc["openapi"].startswith("3.0")
    assert set(doc["paths"]) == {"/api/nodes", "/api/allocations", "/api/users/{name}/usage",
                                 "/api/openapi.json", "/api/schemas", "/api/schemas/{name}",
                                 "/api/gpus/{uuid}/drain", "/api/queue", "/api/profiles",
                                 "/api/jobs",
                                 "/api/jobs/{id}", "/api/jobs/{id}/output",
                                 "/api/jobs/{id}/log",
                                 "/api/job_definitions", "/api/job_definitions/{id}",
                                 "/api/job_definitions/{id}/jobs",
                                 "/api/usage", "/api/usage/budgets"}
    assert doc["servers"] == [{"url": "/services/gpuspawner"}]
    # every schema is a valid JSON Schema and every $ref resolves
    for name in doc["components"]["schemas"]:
        schema = _json_schema(name)
        jsonschema.Draft7Validator.check_schema(schema)
        jsonschema.Draft7Validator(schema).is_valid({})


def _samples(registry) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest

    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_cluster_collector_reports_the_ledger(cluster):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(metrics.ClusterCollector(lambda: [cluster]))
    s = _samples(reg)
    dgx = next(n.name for n in cluster.ledger.nodes if n.gpus)
    key = (("model", "A100"), ("node", dgx))
    assert s[("gpuspawner_gpus", key)] == 8
    assert s[("gpuspawner_gpus_allocated", key)] == 3
    assert s[("gpuspawner_gpus_free", key)] == 5
    assert s[("gpuspawner_users_holding", ())] == 2
    assert s[("gpuspawner_group_gpus", (("group", "lab"),))] == 3
    cluster.ledger.release(cluster.ledger.allocations("bob")[0].id)
    s = _samples(reg)  # computed at scrape time: follows the ledger at once
    assert s[("gpuspawner_gpus_free", key)] == 6
    assert s[("gpuspawner_users_holding", ())] == 1


def test_metric_names_follow_the_prometheus_naming_guide(cluster):
    """A gauge does not end in ``_total`` (the suffix of counters) and no metric of the
    service's registry has a ``user`` label: user names are an unbounded set, and each label
    value is a time series Prometheus keeps."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(metrics.ClusterCollector(lambda: [cluster]))
    families = list(reg.collect()) + list(metrics.REGISTRY.collect())
    assert families
    for f in families:
        if f.type == "gauge":
            assert not f.name.endswith("_total"), f.name
        for sample in f.samples:
            assert "user" not in sample.labels, (f.name, sample.labels)
    names = {f.name for f in families}
    assert "gpuspawner_gpus" in names and "gpuspawner_gpus_total" not in names


def test_refusals_are_counted_by_reason(cluster):
    before = _samples(metrics.REGISTRY)
    with pytest.raises(QuotaExceeded) as e:
        cluster.ledger.reserve(Bundle(cores=1, memory_bytes=2**20, gpus=1),
                               Owner("alice", "third", ("lab",)))
    metrics.placement_refused(e.value)
    after = _samples(metrics.REGISTRY)
    key = ("gpuspawner_placement_refusals_total", (("reason", "quota_gpu_milli"),))
    assert after[key] == before.get(key, 0) + 1
    assert metrics.refusal_reason(e.value) == "quota_gpu_milli"


async def test_track_spawn_observes_ready_spawns_only():
    import asyncio

    class FakeSpawner:
        ready = True
        allocation = None

    times = iter([10.0, 12.5])
    sp = FakeSpawner()
    sp._spawn_future = asyncio.get_running_loop().create_future()
    before = _samples(metrics.REGISTRY)
    metrics.track_spawn(sp, clock=lambda: next(times))
    sp._spawn_future.set_result(None)
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    after = _samples(metrics.REGISTRY)
    key = ("gpuspawner_spawn_ready_seconds_sum", (("gpus", "0"),))
    assert after[key] - before.get(key, 0) == pytest.approx(2.5)
    failed = FakeSpawner()
    failed._spawn_future = asyncio.get_running_loop().create_future()
    metrics.track_spawn(failed, clock=lambda: 0.0)
    failed._spawn_future.set_exception(RuntimeError("boom"))
    await asyncio.sleep(0)
    assert _samples(metrics.REGISTRY)[key] == after[key]


# -- the configuration schemas over HTTP (the service's Tornado app, no hub) -------------------
@pytest.fixture
async def service_url(cluster):
    """The service's own application on a loopback port; the public endpoints need no hub."""
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from gpuspawner.hub.service.app import GPUService

    service = GPUService("gpuspawner", "t" * 64, hub_api_url="http://127.0.0.1:1/hub/api",
                         cluster_provider=lambda: cluster, user_lookup=lambda name: None)
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(service.make_app())
    server.add_sockets(sockets)
    yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}{service.prefix}"
    server.stop()
    await server.close_all_connections()


async def _get(url: str) -> tuple[int, Any]:
    import json

    from tornado.httpclient import AsyncHTTPClient

    r = await AsyncHTTPClient().fetch(url, raise_error=False)
    assert r.headers["Content-Type"].startswith("application/json")
    return r.code, json.loads(r.body)


async def test_the_service_serves_the_configuration_schemas(service_url):
    from gpuspawner.schemas import SCHEMA_NAMES, load_schema

    code, listed = await _get(service_url + "api/schemas")
    assert code == 200
    _validate(listed, "SchemaInfo", array=True)
    assert [s["name"] for s in listed] == list(SCHEMA_NAMES)
    for item in listed:
        assert item["url"] == f"/services/gpuspawner/api/schemas/{item['name']}"
        code, schema = await _get(service_url + f"api/schemas/{item['name']}")
        assert code == 200 and schema == load_schema(item["name"])  # the shipped file
        assert item["title"] == schema["title"] and item["id"] == schema["$id"]
        jsonschema.Draft202012Validator.check_schema(schema)
    code, err = await _get(service_url + "api/schemas/profile")
    assert code == 404 and "no configuration schema 'profile'" in err["message"]
    _validate(err, "Error")


async def test_schemas_are_public_while_the_state_is_not(service_url):
    """The schemas describe the configuration (like the OpenAPI document); the nodes need a
    hub user: without a token or cookie, 401."""
    code, _ = await _get(service_url + "api/schemas/quotas")
    assert code == 200
    code, _ = await _get(service_url + "api/nodes")
    assert code == 401, code


@pytest.mark.parametrize("admin", [True, False])
def test_culler_page_shell(admin):
    """The idle culler's page (idle_culler/templates/index.html.j2) in the hub's look; its
    script reads the JSON API; admins also get the policies table and the admin API links."""
    from jinja2 import PackageLoader

    from gpuspawner.webui import environment, service_links

    html = environment(PackageLoader("idle_culler", "templates")).get_template(
        "index.html.j2").render(
        hub_prefix="/hub/", prefix="/services/idle-culler/", refresh_s=5,
        user={"name": "ann", "admin": admin},
        links=service_links("/services/", "Idle culler"),
        api_links=[("status", "/services/idle-culler/api/status")])
    assert 'href="/services/idle-culler/" aria-current="page">Idle culler' in html
    assert ('href="/services/gpuspawner/admin">GPU map' in html) is admin
    assert ('id="policies"' in html) is admin
    assert ('href="/hub/admin">Admin' in html) is admin
    assert ("Every user's servers" in html) is admin
    assert "get('api/status')" in html and "innerHTML" not in html


def test_the_admin_page_lists_servers_moved_off_failed_nodes(cluster):
    """GPUSpawner.restart_elsewhere records each move on the cluster; the GPU map shows them,
    newest first (and no table while there are none)."""
    from gpuspawner.hub.service.views import page_templates

    def render() -> str:
        return page_templates().get_template("admin.html.j2").render(
            view=map_view(cluster), user={"name": "admin", "admin": True},
            prefix="/services/gpuspawner/", hub_prefix="/hub/", refresh_s=5, links=[],
            api_links=[])

    assert 'data-testid="moves"' not in render()
    cluster.record_move("alice", "", "n1", "n2", 1_764_000_000.0, "node n1 does not answer")
    cluster.record_move("bob", "big", "n2", "n1", 1_764_000_100.0, "node n2 is down")
    assert [m["user"] for m in map_view(cluster)["moves"]] == ["bob", "alice"]
    html = render()
    assert 'data-testid="moves"' in html
    assert ("<td>alice</td><td>(default)</td><td>n1</td><td>n2</td><td>node n1 does not "
            "answer</td>") in html
    moves = html[html.index('data-testid="moves"'):]
    assert moves.index('data-user="bob"><td>') < moves.index('data-user="alice"><td>')
