"""Culling under pressure (issue 15, point 5), without a hub: the ``pressure_idle_timeout``
policy field, the queue document, the decision with a fake clock, and the queue read over
HTTP against a tornado stand-in of gpuspawner's ``/services/gpuspawner/api/queue`` and
``api/nodes`` (and of the hub's ``/hub/api/users`` for whole passes) on 127.0.0.1."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from idle_culler.core import REASONS, Culler, iso
from idle_culler.hub import HubClient
from idle_culler.policies import PolicyError, PolicySet
from idle_culler.pressure import Demand

A100 = "GPU-a100-0000"
A100_B = "GPU-a100-0001"
T4 = "GPU-t4-0000"
A100_SMALL = "GPU-a100-small"  # the one A100 of node-3 (8 cores, 64 GiB), not shareable
INVENTORY = [
    {"name": "node-1", "gpus": [{"uuid": A100, "index": 0, "model": "A100"},
                                {"uuid": A100_B, "index": 1, "model": "A100"}]},
    {"name": "node-2", "gpus": [{"uuid": T4, "index": 0, "model": "T4"}]},
    {"name": "node-3", "gpus": [{"uuid": A100_SMALL, "index": 0, "model": "A100",
                                 "shareable": False}],
     "numa_nodes": [{"id": 0, "cpus": list(range(8)), "memory_bytes": 64 << 30}]},
]


def entry(user: str, models: list[str], gpus: int = 1, milli: int = 0,
          position: int = 1) -> dict[str, Any]:
    """A queue entry as gpuspawner's ``api/queue`` writes it."""
    return {"id": f"q{position}-{user}", "user": user, "server": "", "profile": "p",
            "position": position, "enqueued": "2026-11-23T18:00:00Z", "waited_s": 12.5,
            "wants": f"{gpus} x {'|'.join(models) or 'GPU'}", "gpu_models": models,
            "gpus": gpus, "gpu_milli": milli}


def queue_doc(*entries: dict[str, Any]) -> dict[str, Any]:
    """The whole document, with ``waiting_gpus`` and ``by_profile`` computed from the entries
    as the endpoint does (an entry counts under each model it accepts; "GPU" = any)."""
    waiting: dict[str, int] = {}
    for e in entries:
        if e["gpus"] or e["gpu_milli"]:
            for m in e["gpu_models"] or ["GPU"]:
                waiting[m] = waiting.get(m, 0) + 1
    return {"length": len(entries), "by_profile": {"p": len(entries)} if entries else {},
            "waiting_gpus": waiting, "entries": list(entries)}


TWO_FOR_A100 = queue_doc(entry("bob", ["A100"]), entry("carl", ["A100"], position=2),
                         entry("bob", ["A100"], position=3))


# ------------------------------------------------------------------ policy field
def test_pressure_idle_timeout_precedence_and_schema() -> None:
    ps = PolicySet({"global": {"pressure_idle_timeout": "10m"},
                    "groups": {"a": {"pressure_idle_timeout": "20m"},
                               "b": {"pressure_idle_timeout": 0},
                               "c": {"pressure_idle_timeout": 300}},
                    "users": {"strict": {"pressure_idle_timeout": 60}}})
    p = ps.resolve("zoe")
    assert (p.pressure_idle_timeout, p.sources["pressure_idle_timeout"]) == (600, "global")
    p = ps.resolve("ann", ["a", "c"])  # larger is more lenient
    assert (p.pressure_idle_timeout, p.sources["pressure_idle_timeout"]) == (1200, "group:a")
    p = ps.resolve("ann", ["a", "b"])  # 0 = never culled early = the most lenient
    assert (p.pressure_idle_timeout, p.sources["pressure_idle_timeout"]) == (0, "group:b")
    p = ps.resolve("strict", ["b"])  # the user's entry wins even when stricter
    assert (p.pressure_idle_timeout, p.sources["pressure_idle_timeout"]) == (60, "user:strict")
    assert PolicySet().resolve("x").pressure_idle_timeout == 0  # off by default
    assert ps.sets("pressure_idle_timeout") and not PolicySet().sets("pressure_idle_timeout")
    assert not PolicySet({"users": {"u": {"pressure_idle_timeout": 0}}}).sets(
        "pressure_idle_timeout")
    with pytest.raises(PolicyError, match=r"^groups.g.pressure_idle_timeout: 'soon' is not a "
                                          r"duration"):
        PolicySet({"groups": {"g": {"pressure_idle_timeout": "soon"}}})


# ------------------------------------------------------------------ the queue document
def test_demand_counts_distinct_users_per_model() -> None:
    d = Demand.from_json(TWO_FOR_A100)
    p = d.match({"A100"})
    assert p is not None and p.text == "2 users waiting for A100" and p.spawns == 3
    assert d.match({"a100"}) is not None  # models compare case-insensitively, as placement
    assert d.match({"T4"}) is None and d.match(set()) is None
    assert d.specific_models()
    # an entry for any model: every GPU server's models match it
    d = Demand.from_json(queue_doc(entry("dan", []), entry("eve", ["A100"], gpus=0, milli=500)))
    assert d.match({"T4"}).text == "1 user waiting for any GPU"
    assert d.match(set()).text == "1 user waiting for any GPU"  # models unknown
    assert d.match({"A100"}).text == "2 users waiting for A100 or any GPU"
    assert d.match({"A100"}).models == ("A100", "GPU")
    # entries that want no GPU make no pressure
    cpu_only = Demand.from_json(queue_doc(entry("fay", [], gpus=0)))
    assert cpu_only.length == 1 and not cpu_only and cpu_only.match({"A100"}) is None


def test_demand_without_every_entry_counts_spawns() -> None:
    """A token that may not read others' entries still gets ``waiting_gpus``: the text counts
    waiting spawns then, not users it cannot see."""
    doc = {**TWO_FOR_A100, "entries": [TWO_FOR_A100["entries"][0]]}
    p = Demand.from_json(doc).match({"A100"})
    assert p is not None and p.text == "3 spawns waiting for A100" and p.users == frozenset()
    for bad in ({"waiting_gpus": ["A100"]}, {"length": "many"}, {"entries": [{"gpus": 1}]},
                {"waiting_gpus": {"A100": "x"}}):
        with pytest.raises(ValueError, match="queue document"):
            Demand.from_json(bad)


# ------------------------------------------------------------------ the decision
def server(started: float, last: float, gpus: list[str] = (), **kw: Any) -> dict[str, Any]:
    return {"ready": True, "pending": None, "started": iso(started),
            "last_activity": iso(last),
            "state": {"allocation": {"gpus": [{"uuid": g, "milli": 1000} for g in gpus]}},
            **kw}


POLICY = {"global": {"idle_timeout": "1h", "pressure_idle_timeout": "10m", "warning": 60}}
U = {"name": "u", "groups": []}


def pressured(policy: dict[str, Any] = POLICY, doc: dict[str, Any] | None = TWO_FOR_A100
              ) -> Culler:
    """A culler as after reading ``doc`` (None: no queue) and the inventory."""
    c = Culler(HubClient("http://127.0.0.1:1/hub/api", "x"), PolicySet(policy))
    c.demand = Demand.from_json(doc) if doc is not None else None
    c.set_inventory(INVENTORY)
    return c


def test_culled_early_only_while_the_queue_waits_for_its_model() -> None:
    s = server(0, 0, [A100])
    c = pressured(doc=None)
    assert c.evaluate(U, "", s, 1000).action == "keep"  # no queue: the 1 h timeout
    c.demand = Demand.from_json(TWO_FOR_A100)
    d = c.evaluate(U, "", s, 530)  # due at 600, the warning starts at 540
    assert (d.action, d.due) == ("keep", 600) and d.figures["pressure"] == {
        "waiting_users": 2, "waiting_spawns": 3, "models": ["A100"]}
    d = c.evaluate(U, "", s, 545)  # warned first, as for every reason
    assert (d.action, d.reason, d.cull_at) == ("warn", "pressure_idle", 605)
    assert d.message.startswith("will be culled at ")
    assert "because culled early: 2 users waiting for A100 (no activity for 9.1min, idle " \
           "timeout under pressure 10.0min instead of 60.0min)" in d.message
    d = c.evaluate(U, "", s, 605)
    assert (d.action, d.reason) == ("cull", "pressure_idle")
    assert d.message.startswith("culled early: 2 users waiting for A100")
    assert d.to_json()["reason"] == "pressure_idle" and "pressure_idle" in REASONS


def test_warning_withdrawn_when_the_queue_empties() -> None:
    s = server(0, 0, [A100])
    c = pressured()
    assert c.evaluate(U, "", s, 550).action == "warn" and "u/" in c.warnings
    c.demand = Demand.from_json(queue_doc())  # the waiting spawns started or gave up
    d = c.evaluate(U, "", s, 610)
    assert d.action == "keep" and d.due == 3600 and "u/" not in c.warnings
    c.demand = None  # a failed read: no pressure either
    assert c.evaluate(U, "", s, 610).action == "keep"


def test_not_culled_early_for_another_model_a_cpu_server_or_unknown_models() -> None:
    c = pressured()
    assert c.evaluate(U, "t4", server(0, 0, [T4]), 3000).action == "keep"
    d = c.evaluate(U, "cpu", server(0, 0), 3000)  # CPU-only: never culled early
    assert d.action == "keep" and "pressure" not in d.figures
    # a GPU the inventory did not list: its model is unknown, only "any GPU" entries count
    assert c.evaluate(U, "new", server(0, 0, ["GPU-new"]), 3000).action == "keep"
    # the same servers while someone waits for any GPU
    c = pressured(doc=queue_doc(entry("dan", [])))
    for name, gpus in (("t4", [T4]), ("new", ["GPU-new"])):
        d = c.evaluate(U, name, server(0, 0, gpus), 3000)
        assert (d.action, d.reason) == ("warn", "pressure_idle"), d.to_json()
        assert "1 user waiting for any GPU" in d.message
    assert c.evaluate(U, "cpu", server(0, 0), 3000).action == "keep"


def test_pressure_respects_the_other_limits() -> None:
    s = server(0, 0, [A100, T4])  # one of its GPUs is waited for: enough
    pol = {"global": {"idle_timeout": "1h", "pressure_idle_timeout": "10m"},
           "groups": {"long": {"idle_timeout": 0, "pressure_idle_timeout": "10m"},
                      "vip": {"exempt": True},
                      "late": {"pressure_idle_timeout": "2h"},
                      "grace": {"grace_period": "30m"}}}
    c = pressured(pol)
    d = c.evaluate(U, "", s, 601)
    assert (d.action, d.reason) == ("cull", "pressure_idle")  # no warning period set
    # idle culling off: nothing to shorten; exempt; a pressure timeout longer than idle
    for g in ("long", "vip", "late"):
        d = c.evaluate({"name": g, "groups": [g]}, "", s, 1000)
        assert d.action == "keep" and d.reason in ("active", "exempt"), (g, d.to_json())
    d = c.evaluate({"name": "g", "groups": ["grace"]}, "", s, 1000)
    assert (d.action, d.due) == ("keep", 1800)  # not before the grace period ends
    # activity (hub last_activity) moves the short timeout like the long one
    assert c.evaluate(U, "", server(0, 500, [A100]), 1000).action == "keep"


# ------------------------------------------------------------------ over HTTP
class Stand:
    """A tornado stand-in on 127.0.0.1 of gpuspawner's queue and nodes endpoints and of the
    hub's users list and server stop. ``mode``: ``ok`` | ``404`` | ``500`` | ``html`` |
    ``slow``. Tokens in ``ALL`` (those with read:servers) see every entry; others their own
    (named by ``TOKENS``), with the same length, by_profile and waiting_gpus."""

    ALL: ClassVar[set[str]] = {"culler-token"}
    TOKENS: ClassVar[dict[str, str]] = {"bob-token": "bob"}

    def __init__(self) -> None:
        self.mode = "ok"
        self.doc: dict[str, Any] = TWO_FOR_A100
        self.calls: dict[str, int] = {}
        self.stopped: list[str] = []
        self.users: list[dict[str, Any]] = []
        stand = self

        class Base(web.RequestHandler):
            def token(self) -> str | None:
                auth = self.request.headers.get("Authorization", "")
                tok = auth.removeprefix("token ")
                if tok not in stand.ALL and tok not in stand.TOKENS:
                    raise web.HTTPError(403)
                return tok

            def count(self, what: str) -> None:
                stand.calls[what] = stand.calls.get(what, 0) + 1

        class Queue(Base):
            async def get(self) -> None:
                self.count("queue")
                tok = self.token()
                if stand.mode == "404":
                    raise web.HTTPError(404)
                if stand.mode == "500":
                    raise web.HTTPError(500)
                if stand.mode == "html":
                    self.finish("<html>login</html>")
                    return
                if stand.mode == "slow":
                    import asyncio

                    await asyncio.sleep(2)
                doc = dict(stand.doc)
                if tok not in stand.ALL:
                    doc["entries"] = [e for e in doc["entries"]
                                      if e["user"] == stand.TOKENS[tok]]
                self.finish(json.dumps(doc))

        class Nodes(Base):
            def get(self) -> None:
                self.count("nodes")
                self.token()
                self.finish(json.dumps(INVENTORY))

        class Users(Base):
            def get(self) -> None:
                self.count("users")
                self.finish(json.dumps(stand.users))

        class Server(Base):
            def delete(self, user: str) -> None:
                stand.stopped.append(user)
                self.set_status(204)

        sock, self.port = bind_unused_port()
        self.http = HTTPServer(web.Application([
            ("/services/gpuspawner/api/queue", Queue), ("/services/gpuspawner/api/nodes", Nodes),
            ("/hub/api/users", Users), (r"/hub/api/users/([^/]+)/server", Server)]))
        self.http.add_sockets([sock])
        self.url = f"http://127.0.0.1:{self.port}"
        self.service = f"{self.url}/services/gpuspawner/"


@pytest.fixture
async def stand() -> AsyncIterator[Stand]:
    s = Stand()
    yield s
    s.http.stop()
    await s.http.close_all_connections()


def http_culler(stand: Stand, token: str = "culler-token", policy: dict[str, Any] = POLICY,
                **kw: Any) -> Culler:
    hub = HubClient(f"{stand.url}/hub/api", token, retries=3, backoff=0.05)
    return Culler(hub, PolicySet(policy), gpuspawner_url=stand.service, queue_timeout=1,
                  **kw)


async def test_read_queue_over_http(stand: Stand, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "idle_culler")
    c = http_culler(stand)
    d = await c.read_queue()  # good JSON: pressure, models from the inventory
    assert d is not None and d.match({"A100"}).text == "2 users waiting for A100"
    assert c.gpu_model[A100] == "A100" and c.gpu_model[T4] == "T4"
    assert c.queue_status == {"ok": True, "length": 3, "waiting_gpus": {"A100": 3}}
    assert stand.calls == {"queue": 1, "nodes": 1}

    stand.mode = "404"  # no gpuspawner service: no pressure, logged once
    assert await c.read_queue() is None and await c.read_queue() is None
    assert sum("no gpuspawner service" in r.message for r in caplog.records) == 1
    assert c.queue_status["error"].endswith("api/queue: 404")

    for mode in ("500", "html", "slow"):  # an error: no pressure this pass, not retried
        stand.mode, before = mode, stand.calls["queue"]
        assert await c.read_queue() is None, mode
        assert stand.calls["queue"] == before + 1 and c.queue_status["ok"] is False
    assert any("HTTP 500" in r.message for r in caplog.records)
    assert any("HTTP 599" in r.message for r in caplog.records)  # the 1 s timeout

    stand.mode = "ok"  # back: pressure again; the inventory is read while GPUs are waited for
    stand.doc, before = queue_doc(entry("dan", [])), stand.calls["nodes"]
    d = await c.read_queue()
    assert d is not None and d.match(set()) is not None and stand.calls["nodes"] == before + 1
    stand.doc = queue_doc(entry("fay", [], gpus=0))  # no GPU wanted: the inventory is not read
    assert not await c.read_queue() and stand.calls["nodes"] == before + 1


async def test_read_queue_with_a_users_token_and_without_url(stand: Stand) -> None:
    c = http_culler(stand, token="bob-token")  # sees bob's entries only: counts spawns
    d = await c.read_queue()
    assert d is not None and d.match({"A100"}).text == "3 spawns waiting for A100"
    c = http_culler(stand, token="nobody")  # 403 (no access to the service): no pressure
    assert await c.read_queue() is None and "HTTP 403" in c.queue_status["error"]
    # no URL, or no policy that uses it: the queue is not read at all
    before = dict(stand.calls)
    assert await Culler(c.hub, PolicySet(POLICY)).read_queue() is None
    assert await http_culler(stand, policy={"global": {"idle_timeout": 60}}).read_queue() \
        is None
    assert stand.calls == before


async def test_passes_cull_early_only_while_the_queue_waits(stand: Stand,
                                                            tmp_path: Path) -> None:
    """Whole passes against the stand-in: the queue is read once per pass; the A100 server is
    warned, then culled early with the reason in the cull log; the T4 and CPU servers stay."""
    now = [1_000_000.0]
    t0 = now[0]
    stand.users = [
        {"name": "ann", "groups": [], "servers": {"": server(t0, t0, [A100])}},
        {"name": "tom", "groups": [], "servers": {"": server(t0, t0, [T4])}},
        {"name": "cy", "groups": [], "servers": {"": server(t0, t0)}},
    ]
    log = tmp_path / "culls.jsonl"
    c = http_culler(stand, clock=lambda: now[0], cull_log=log)
    stand.doc = queue_doc()  # nobody waits
    now[0] = t0 + 590
    ds = {d.user: d for d in await c.run_pass()}
    assert {u: d.action for u, d in ds.items()} == {"ann": "keep", "tom": "keep", "cy": "keep"}
    assert c.last_pass["queue"] == {"ok": True, "length": 0, "waiting_gpus": {}}
    stand.doc = TWO_FOR_A100
    ds = {d.user: d for d in await c.run_pass()}
    assert ds["ann"].action == "warn" and ds["ann"].cull_at == t0 + 650
    assert {ds["tom"].action, ds["cy"].action} == {"keep"}
    status = c.user_status("ann")["servers"][0]
    assert status["reason"] == "pressure_idle" and "2 users waiting for A100" in \
        status["message"] and status["figures"]["pressure"]["waiting_users"] == 2
    now[0] = t0 + 650
    ds = {d.user: d for d in await c.run_pass()}
    assert ds["ann"].action == "cull" and stand.stopped == ["ann"]
    assert {ds["tom"].action, ds["cy"].action} == {"keep"}
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["reason"] == "pressure_idle"
    assert record["message"].startswith("culled early: 2 users waiting for A100")
    assert record["policy"]["pressure_idle_timeout"] == 600
    assert stand.calls["queue"] == 3 and stand.calls["users"] == 3  # once per pass


async def test_service_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gpuspawner-url`` reaches the culler; its default comes from the hub's public URL
    when the hub sets ``JUPYTERHUB_PUBLIC_HUB_URL`` (JupyterHub's ``public_url``), else none."""
    from idle_culler.app import IdleCuller

    monkeypatch.setenv("JUPYTERHUB_PUBLIC_HUB_URL", "https://hub.example.org/base/hub/")
    assert IdleCuller().gpuspawner_url == "https://hub.example.org/base/services/gpuspawner/"
    monkeypatch.delenv("JUPYTERHUB_PUBLIC_HUB_URL")
    app = IdleCuller()
    assert app.gpuspawner_url == "" and app.build().gpuspawner_url is None
    app = IdleCuller()
    app.parse_command_line(["--gpuspawner-url", "http://127.0.0.1:9/services/gpuspawner",
                            "--queue-timeout", "2.5"])
    c = app.build()
    assert (c.gpuspawner_url, c.queue_timeout) == ("http://127.0.0.1:9/services/gpuspawner/",
                                                   2.5)
    c.hub.close()


# ------------------------------------------------------------------ fit on the server's node
def test_a_spawn_counts_only_on_nodes_where_it_would_fit() -> None:
    """Issue 46 item 9: a waiting spawn shortened the idle timeout of every server holding its
    GPU model, also on nodes where it could never run. Now only where it would fit: enough
    GPUs of its model, a shareable one for a share, its cores and memory."""
    two = queue_doc(entry("bob", ["A100"], gpus=2))
    c = pressured(doc=two)
    d = c.evaluate(U, "big", server(0, 0, [A100]), 3000)  # node-1 has two A100
    assert (d.action, d.reason) == ("warn", "pressure_idle"), d.to_json()
    assert "1 user waiting for A100" in d.message
    d = c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000)  # node-3 has one
    assert d.action == "keep" and "pressure" not in d.figures, d.to_json()
    # the node named by the server's state wins over the GPU's listing
    s = server(0, 0, [A100_SMALL])
    s["state"]["allocation"]["node"] = "node-1"
    assert c.evaluate(U, "named", s, 3000).action == "warn"
    # any model, 2 GPUs: node-1 only; a share: not on node-3 (no shareable GPU)
    for doc in (queue_doc(entry("dan", [], gpus=2)),
                queue_doc(entry("eve", ["A100"], gpus=0, milli=250))):
        c = pressured(doc=doc)
        assert c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000).action == "keep"
    assert pressured(doc=queue_doc(entry("dan", [], gpus=2))).evaluate(
        U, "t4", server(0, 0, [T4]), 3000).action == "keep"
    # more cores or memory than node-3 has: no pressure there; within them: pressure
    big = {**entry("gus", ["A100"]), "cores": 16, "memory_bytes": 8 << 30}
    c = pressured(doc=queue_doc(big))
    assert c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000).action == "keep"
    fits = {**entry("gus", ["A100"]), "cores": 8, "memory_bytes": 64 << 30}
    c = pressured(doc=queue_doc(fits))
    assert c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000).action == "warn"
    # a profile pinned to node-1 makes no pressure on node-3, where it may not run
    c = pressured(doc=queue_doc({**entry("hal", ["A100"]), "nodes": ["node-1"]}))
    assert c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000).action == "keep"
    assert c.evaluate(U, "big", server(0, 0, [A100]), 3000).action == "warn"
    # only the fitting entries are counted: 2 of the 3 waiting fit node-3
    c = pressured(doc=queue_doc(entry("bob", ["A100"], gpus=2), entry("cy", ["A100"]),
                                entry("di", [], position=3)))
    d = c.evaluate(U, "small", server(0, 0, [A100_SMALL]), 3000)
    assert d.figures["pressure"] == {"waiting_users": 2, "waiting_spawns": 2,
                                     "models": ["A100", "GPU"]}


async def test_a_pass_shortens_only_servers_where_the_waiting_spawn_fits(
        stand: Stand) -> None:
    """The same through whole passes over HTTP (the queue and inventory read from the
    stand-in of gpuspawner's service): bob waits for two A100; ann's idle A100 server on
    node-1 (two A100) is warned, zed's on node-3 (one A100) is not. Before the fix both
    were warned."""
    now = [1_000_000.0]
    t0 = now[0]
    stand.users = [
        {"name": "ann", "groups": [], "servers": {"": server(t0, t0, [A100])}},
        {"name": "zed", "groups": [], "servers": {"": server(t0, t0, [A100_SMALL])}},
    ]
    stand.doc = queue_doc(entry("bob", ["A100"], gpus=2))
    c = http_culler(stand, clock=lambda: now[0])
    now[0] = t0 + 590
    ds = {d.user: d for d in await c.run_pass()}
    assert (ds["ann"].action, ds["ann"].reason) == ("warn", "pressure_idle")
    assert ds["zed"].action == "keep", ds["zed"].to_json()
    now[0] = t0 + 700
    ds = {d.user: d for d in await c.run_pass()}
    assert ds["ann"].action == "cull" and stand.stopped == ["ann"]
    assert ds["zed"].action == "keep"
