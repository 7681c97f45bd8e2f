"""The start slots (c.GPUSpawner.node_concurrent_starts) attacked as a user with her own token
through the hub's REST API, in the in-process hub.

The slots are shared by every user of a node. mallory starts named servers whose launch never
ends (an image that hangs, a node that does not answer) and stops them while they wait and
while they hold a slot. Replayed hole (found by such an attack): with one slot per node, the
first fairness rule ("the earliest waiting start of a user who holds none") gave the slot to
mallory's next queued start each time hers ended, since she held none at that moment, so ann's
start waited one hold per queued start of mallory's. A freed slot's user now counts as holding
one more (gpuspawner.hub.start_slots).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from jupyterhub.tests.utils import api_request

from gpuspawner.testing.fake_backend import FakeBackend
from gpuspawner.testing.inprocess import wait_for
from tests.inprocess_hub import runtime
from tests.test_usage_hub import token_of

NODE = "inproc-n1"
PROFILES = [{"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "1G", "default": True}]


@pytest.fixture
def hanging_launches(monkeypatch) -> tuple[list[tuple[str, str]], asyncio.Event]:
    """FakeBackend launches of mallory's servers that hang until the returned event is set;
    every launch is recorded as (user, server) when it begins."""
    begun: list[tuple[str, str]] = []
    release = asyncio.Event()
    launch = FakeBackend.launch

    async def hanging(self: FakeBackend, spec: Any, state: dict[str, Any], progress: Any):
        begun.append((spec.user, spec.server))
        if spec.user == "mallory":
            await release.wait()
        return await launch(self, spec, state, progress)

    monkeypatch.setattr(FakeBackend, "launch", hanging)
    return begun, release


async def rest(app: Any, token: str, method: str, *path: str, body: Any = None):
    """The hub's REST API with the user's own token."""
    kwargs = {} if body is None else {"data": json.dumps(body)}
    return await api_request(app, *path, method=method, bypass_proxy=True,
                             headers={"Authorization": f"token {token}"}, **kwargs)


async def test_hanging_named_servers_do_not_queue_ann_behind_all_of_them(
        inprocess_hub, hanging_launches, monkeypatch):
    begun, release = hanging_launches
    app, _ = await inprocess_hub(NODE, PROFILES, node_concurrent_starts=1,
                                 config={"JupyterHub": {"allow_named_servers": True}})
    monkeypatch.setitem(app.tornado_settings, "slow_spawn_timeout", 0.1)
    slots = runtime(app).start_slots
    mallory, ann = await token_of(app, "mallory"), await token_of(app, "ann")

    for name in ("h1", "h2", "h3", "h4"):
        r = await rest(app, mallory, "post", "users", "mallory", "servers", name,
                       body={"profile": "cpu"})
        assert r.status_code == 202, r.text
    await wait_for(lambda: slots.waiting(NODE) == 3, 10, message="h2-h4 waiting")
    assert begun == [("mallory", "h1")] and slots.holding(NODE) == 1
    r = await rest(app, ann, "post", "users", "ann", "server", body={"profile": "cpu"})
    assert r.status_code == 202, r.text
    await wait_for(lambda: slots.waiting(NODE) == 4, 10, message="ann waiting")

    # mallory stops the start that holds the slot: it goes to ann, not to mallory's h2
    r = await rest(app, mallory, "delete", "users", "mallory", "servers", "h1")
    assert r.status_code in (202, 204), r.text
    await wait_for(lambda: len(begun) >= 2, 10, message="the next launch")
    assert begun[1] == ("ann", "")
    await wait_for(lambda: app.users["ann"].spawner.ready, 10, message="ann's server ready")

    # ann's start ended: mallory's h2 holds the slot; she stops the two waiting ones, then h2
    await wait_for(lambda: ("mallory", "h2") in begun, 10, message="h2's launch")
    for name in ("h4", "h3", "h2"):
        r = await rest(app, mallory, "delete", "users", "mallory", "servers", name)
        assert r.status_code in (202, 204), r.text
    # nothing leaked and nothing was freed twice: no slot held or waited for, mallory holds
    # no allocation, h3 and h4 never launched
    await wait_for(lambda: slots.holding(NODE) == slots.waiting(NODE) == 0, 10,
                   message="every slot free")
    assert [a.owner.user for a in runtime(app).ledger.allocations()] == ["ann"]
    assert ("mallory", "h3") not in begun and ("mallory", "h4") not in begun
    release.set()


async def test_a_start_that_never_answers_holds_its_slot_only_until_the_timeout(
        inprocess_hub, hanging_launches, monkeypatch):
    begun, release = hanging_launches
    app, _ = await inprocess_hub(NODE, PROFILES, node_concurrent_starts=1,
                                 node_start_slot_timeout=0.5)
    monkeypatch.setitem(app.tornado_settings, "slow_spawn_timeout", 0.1)
    slots = runtime(app).start_slots
    mallory, ann = await token_of(app, "mallory"), await token_of(app, "ann")
    r = await rest(app, mallory, "post", "users", "mallory", "server", body={"profile": "cpu"})
    assert r.status_code == 202, r.text
    await wait_for(lambda: begun == [("mallory", "")], 10, message="mallory's launch")
    r = await rest(app, ann, "post", "users", "ann", "server", body={"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    # mallory's launch still hangs, but her slot was freed after 0.5 s: ann's server starts
    await wait_for(lambda: app.users["ann"].spawner.ready, 10, message="ann's server ready")
    assert app.users["mallory"].spawner.pending == "spawn"
    r = await rest(app, mallory, "delete", "users", "mallory", "server")
    assert r.status_code in (202, 204), r.text
    await wait_for(lambda: not app.users["mallory"].spawner.active, 10,
                   message="mallory's server stopped")
    assert slots.holding(NODE) == slots.waiting(NODE) == 0
    release.set()
