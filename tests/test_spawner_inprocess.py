"""GPUSpawner's lifecycle in pytest-jupyterhub's in-process hub (``hub_app``: MockHub, the hub's
own application, REST handlers, ``User`` objects and database in this test's event loop), on
the fake engine (gpuspawner.testing.fake_backend.FakeBackend) with a routing table in memory
(gpuspawner.testing.inprocess.MemoryProxy): no engine, no proxy process, no hub process.

The hub builds its one runtime (nodes, ledger, backend, queue) as ``jupyterhub`` does, from
the shipped file's ``check_hub_config`` at configuration load (gpuspawner.testing.inprocess.
load_config_file); each test reads that runtime's ledger and the fake engine's record.

Covered through the hub's REST API: a start with a profile from ``user_options`` books the
profile's bundle and launches on it; the hub's poll sees a server that ended and releases;
a stop releases; bad ``user_options`` are a 400 naming the field and are never stored; a start
whose launch fails releases the allocation and the engine's objects; named servers book one
allocation each and a refused one leaves no record (moved here from a real hub + engine:
tests/test_refused_spawn_records.py, the hole of refused spawns filling the named-server limit).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jupyterhub.tests.mocking import MockHub
from jupyterhub.tests.utils import api_request

from gpuspawner.testing.fake_backend import FakeBackend
from gpuspawner.testing.inprocess import MemoryProxy, wait_for
from tests.inprocess_hub import runtime

GiB = 1 << 30
NODE = "inproc-n1"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "1G", "default": True},
    {"slug": "a100-1", "display_name": "1 x A100", "cpu": 2, "memory": "4G", "gpus": 1,
     "gpu_models": ["A100"], "queue": False},
    {"slug": "a100-2", "display_name": "2 x A100", "cpu": 4, "memory": "8G", "gpus": 2,
     "gpu_models": ["A100"], "queue": False},
    # valid options, refused at placement: no node has an H100 (HTTP 400)
    {"slug": "h100", "cpu": 1, "memory": "1G", "gpus": 1, "gpu_models": ["H100"]},
]


@pytest.fixture
def gpu_hub(inprocess_hub):
    """``await gpu_hub(**gpuspawner_settings)``: the started in-process hub (one node of two
    A100s, :data:`PROFILES`, the hub's poll every second), its runtime built at start as
    ``jupyterhub`` builds it (tests/inprocess_hub.py)."""

    async def make(**gpuspawner: Any) -> MockHub:
        app, _ = await inprocess_hub(NODE, PROFILES, config={"Spawner": {"poll_interval": 1}},
                                     **gpuspawner)
        return app

    return make


def engine(app: MockHub) -> FakeBackend:
    backend = runtime(app).backend
    assert isinstance(backend, FakeBackend)
    return backend


async def api(app: MockHub, method: str, *path: str, body: Any = None):
    """The hub's REST API as the admin (straight to the hub: no proxy in front)."""
    kwargs = {} if body is None else {"data": json.dumps(body)}
    return await api_request(app, *path, method=method, bypass_proxy=True, **kwargs)


async def servers(app: MockHub, user: str, stopped: bool = True) -> dict[str, Any]:
    """The user model's servers (``stopped``: stopped ones too)."""
    r = await api(app, "get", "users", f"{user}?include_stopped_servers" if stopped else user)
    assert r.status_code == 200, r.text
    return r.json().get("servers") or {}


async def records(app: MockHub, user: str) -> dict[str, Any]:
    """Every named server record of ``user``, stopped ones too."""
    return {k: v for k, v in (await servers(app, user)).items() if k}


def holdings(app: MockHub) -> dict[tuple[str, str], list[str]]:
    """What the ledger holds: ``{(user, server): [GPU UUIDs]}``."""
    return {(a.owner.user, a.owner.server): a.gpu_uuids
            for a in runtime(app).ledger.allocations()}


def engine_records(app: MockHub) -> dict[tuple[str, str], str]:
    """What the fake engine runs: ``{(user, server): node}``."""
    backend = engine(app)
    return {(o["gpuspawner.user"], o["gpuspawner.server"]): backend.running[h].node
            for h, o in backend.owners.items()}


def routes(app: MockHub) -> set[tuple[str, str]]:
    """The users' servers the proxy routes to: ``{(user, server)}``."""
    return {(r["data"]["user"], r["data"].get("server_name", ""))
            for r in app.proxy.routes.values() if "user" in r["data"]}


async def start(app: MockHub, user: str, server: str, options: dict[str, Any]):
    path = ("users", user, "server") if not server else ("users", user, "servers", server)
    r = await api(app, "post", *path, body=options)
    if r.status_code == 202:  # pending: wait until the hub says it is ready
        await wait_for(lambda: app.users[user].spawners[server].ready, 20, message=lambda: (
            f"{user}/{server} ready; pending {app.users[user].spawners[server].pending}"))
    return r


async def stopped(app: MockHub, user: str, server: str = "") -> None:
    spawner = app.users[user].spawners.get(server)
    if spawner is not None:
        await wait_for(lambda: not spawner.active, 20, message=f"{user}/{server} stopped")


async def test_start_with_a_profile_books_it_poll_and_stop_release(gpu_hub):
    app = await gpu_hub()
    assert isinstance(app.proxy, MemoryProxy)  # no proxy process, routes in memory
    await api(app, "post", "users", "ann")
    r = await start(app, "ann", "", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text

    # booked: the profile's bundle, one A100 of the node, for (ann, "")
    [alloc] = runtime(app).ledger.allocations()
    assert (alloc.owner.user, alloc.owner.server, alloc.node) == ("ann", "", NODE)
    assert len(alloc.cpuset) == 2 and alloc.memory_bytes == 4 * GiB
    assert len(alloc.gpu_uuids) == 1 and alloc.gpu_uuids[0].startswith(f"GPU-{NODE}-")
    # launched on exactly that allocation, routed, and the hub stored the options
    [spec] = engine(app).specs.values()
    assert spec.allocation.id == alloc.id and spec.user == "ann"
    assert engine_records(app) == {("ann", ""): NODE}
    assert routes(app) == {("ann", "")}
    model = (await servers(app, "ann"))[""]
    assert model["ready"] and model["user_options"] == {"profile": "a100-1"}

    spawner = app.users["ann"].spawner
    assert await spawner.poll() is None  # running: still booked
    assert holdings(app) == {("ann", ""): alloc.gpu_uuids}

    r = await api(app, "delete", "users", "ann", "server")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "ann")
    assert holdings(app) == {} and engine_records(app) == {} and routes(app) == set()
    # released means usable: both GPUs at once now
    r = await start(app, "ann", "", {"profile": "a100-2"})
    assert r.status_code in (201, 202), r.text
    assert len(holdings(app)[("ann", "")]) == 2


async def test_a_server_that_ends_is_seen_by_the_hubs_poll_and_released(gpu_hub):
    app = await gpu_hub()
    await api(app, "post", "users", "bea")
    r = await start(app, "bea", "", {"profile": "a100-2"})
    assert r.status_code in (201, 202), r.text
    assert len(holdings(app)[("bea", "")]) == 2

    # the server exits on its own: the engine no longer runs it
    [handle] = engine(app).running
    engine(app).running.pop(handle)
    # the hub's poll (c.Spawner.poll_interval = 1 s) notices, stops the server, releases
    await wait_for(lambda: not app.users["bea"].spawner.active, 20,
                   message="the hub saw bea's server end")
    await wait_for(lambda: holdings(app) == {} and routes(app) == set(), 10,
                   message=lambda: f"released: ledger {holdings(app)}, routes {routes(app)}")
    assert (await servers(app, "bea", stopped=False)) == {}


#: refused ``user_options`` and the field the 400 names
BAD_OPTIONS = [
    ({"profile": "no-such-profile"}, "profile"),
    ({"profile": "cpu", "cores": 64}, "cores"),
    ({"profile": "cpu", "queue": "yes"}, "queue"),
    ({"profile": "x" * 70000}, "user_options"),  # past user_options_max_bytes
]


async def test_bad_user_options_are_a_400_naming_the_field_and_never_stored(gpu_hub):
    app = await gpu_hub()
    await api(app, "post", "users", "cid")
    # first a good spawn and stop, and a named server's options: the stored options to keep
    assert (await start(app, "cid", "", {"profile": "cpu"})).status_code in (201, 202)
    await api(app, "delete", "users", "cid", "server")
    await stopped(app, "cid")
    assert (await api(app, "put", "users", "cid", "servers", "kept",
                      body={"user_options": {"profile": "a100-1"}})).status_code == 201
    stored = {"": {"profile": "cpu"}, "kept": {"profile": "a100-1"}}

    for options, field in BAD_OPTIONS:
        # the default server's spawn, a new named server's spawn, a named server's update
        for method, path, body in [
                ("post", ("server",), options), ("post", ("servers", "bad"), options),
                ("patch", ("servers", "kept"), {"user_options": options})]:
            r = await api(app, method, "users", "cid", *path, body=body)
            assert r.status_code == 400, (field, method, path, r.text)
            assert field in r.json()["message"], (field, method, path, r.json())
        # never stored: the default server keeps the options of its last good start, the
        # named one its last good PUT, no record was made for "bad", the database rows agree,
        # and nothing was booked or launched
        assert {k: v["user_options"] for k, v in (await servers(app, "cid")).items()} == \
            stored, field
        orm_spawners = app.users["cid"].orm_user.orm_spawners
        assert {k: s.user_options for k, s in orm_spawners.items()} == stored, field
        assert holdings(app) == {} and engine_records(app) == {}, field


async def test_a_start_whose_launch_fails_releases_everything(gpu_hub):
    app = await gpu_hub()
    await api(app, "post", "users", "dan")
    engine(app).fail_launch = "fake engine: container exited with 139"
    r = await start(app, "dan", "", {"profile": "a100-2"})
    assert r.status_code == 500, r.text
    assert "container exited with 139" in r.json()["message"]
    await stopped(app, "dan")
    # the allocation, the engine's record (recorded before the failure) and the route: gone
    assert holdings(app) == {} and engine_records(app) == {} and routes(app) == set()
    assert engine(app).specs == {}

    # nothing kept the GPUs: the whole node's two A100s start now
    engine(app).fail_launch = ""
    r = await start(app, "dan", "", {"profile": "a100-2"})
    assert r.status_code in (201, 202), r.text
    assert len(holdings(app)[("dan", "")]) == 2 and engine_records(app) == {("dan", ""): NODE}


async def test_named_servers_book_one_allocation_each(gpu_hub):
    app = await gpu_hub()
    await api(app, "post", "users", "eve")
    for name in ("one", "two"):
        r = await start(app, "eve", name, {"profile": "a100-1"})
        assert r.status_code in (201, 202), r.text
    held = holdings(app)
    assert set(held) == {("eve", "one"), ("eve", "two")}
    assert len({*held[("eve", "one")], *held[("eve", "two")]}) == 2  # different GPUs
    assert engine_records(app) == {("eve", "one"): NODE, ("eve", "two"): NODE}
    assert routes(app) == {("eve", "one"), ("eve", "two")}

    # a third A100 server: no GPU free and the profile does not wait: refused, nothing kept
    r = await start(app, "eve", "three", {"profile": "a100-1"})
    assert r.status_code == 400 and "a100-1" in r.json()["message"], r.text
    assert set(await records(app, "eve")) == {"one", "two"}

    # stopping one frees its GPU for the next server, and only that one
    freed = held[("eve", "one")]
    r = await api(app, "delete", "users", "eve", "servers", "one")
    assert r.status_code in (202, 204), r.text
    await stopped(app, "eve", "one")
    assert set(holdings(app)) == {("eve", "two")}
    r = await start(app, "eve", "three", {"profile": "a100-1"})
    assert r.status_code in (201, 202), r.text
    assert holdings(app)[("eve", "three")] == freed
    assert holdings(app)[("eve", "two")] == held[("eve", "two")]


# -- moved from tests/test_refused_spawn_records.py (a real hub, proxy and engine) ------------
# The hole replayed (found probing as a hostile user): JupyterHub's POST
# /users/{name}/servers/{server} makes the named server's record before the spawn, and a spawn
# refused with HTTP 400 (bad user_options) kept it. Five refused spawns on new names left five
# empty records; the user then got "already has the maximum of 5 named servers"
# (named_server_limit_per_user = 5, the shipped config) while the user model listed no servers.
# A spawn refused for capacity also kept its options as the next start's defaults
# (gpuspawner.hub.user_options.watch_spawn undoes both).
async def test_refused_spawns_on_new_names_leave_no_records(gpu_hub):
    app = await gpu_hub()
    user = "st-refused"
    await api(app, "post", "users", user)
    refused = [({"profile": "no-such-profile"}, "profile")] * 6 + [
        ({"profile": "h100"}, "H100")]
    for i, (options, word) in enumerate(refused):
        r = await api(app, "post", "users", user, "servers", f"st-bad{i}", body=options)
        assert r.status_code == 400, r.text
        message = r.json()["message"]
        # the sixth one used to be refused for the limit: five empty records were left
        assert "maximum" not in message and word in message, (i, message)
    assert await records(app, user) == {}
    assert set(app.users[user].orm_user.orm_spawners) <= {""}
    # a valid spawn on a new name is not refused for the limit, and starts
    r = await start(app, user, "st-good", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    assert list(await records(app, user)) == ["st-good"]
    assert engine_records(app) == {(user, "st-good"): NODE}


async def test_refused_puts_on_new_names_leave_no_records(gpu_hub):
    """``PUT /users/{name}/servers/{new name}`` with options the guard refuses: 400, and no
    record (the refused POST's hole, through PUT): the sixth is not refused for the limit."""
    app = await gpu_hub()
    user = "st-refused-put"
    await api(app, "post", "users", user)
    for i in range(6):
        r = await api(app, "put", "users", user, "servers", f"st-put{i}",
                      body={"user_options": {"profile": "no-such-profile"}})
        assert r.status_code == 400, r.text
        assert "maximum" not in r.json()["message"], (i, r.json())
    assert await records(app, user) == {}


async def test_refused_spawn_on_an_existing_server_keeps_it_and_its_options(gpu_hub):
    app = await gpu_hub()
    owner = "st-refused-kept"
    await api(app, "post", "users", owner)
    r = await api(app, "put", "users", owner, "servers", "st-kept",
                  body={"user_options": {"profile": "cpu"}})
    assert r.status_code == 201, r.text
    # refused by the options guard, then by placement (valid options: no H100 here)
    for options in ({"profile": "no-such-profile"}, {"profile": "h100"}):
        r = await api(app, "post", "users", owner, "servers", "st-kept", body=options)
        assert r.status_code == 400, r.text
        kept = await records(app, owner)
        assert {k: v["user_options"] for k, v in kept.items()} == {
            "st-kept": {"profile": "cpu"}}, options
    assert holdings(app) == {} and engine_records(app) == {}
