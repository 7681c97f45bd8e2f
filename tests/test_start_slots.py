"""Start slots per node (gpuspawner.hub.start_slots, c.GPUSpawner.node_concurrent_starts):
at most so many servers start at once on a node, the rest wait in order of arrival, except that
one user's starts do not follow each other while others wait; a start holds its slot from the
launch until its server answers, fails or is cancelled, at most node_start_slot_timeout.

Units on :class:`StartSlots` (no sleeps: each start is a task that holds its slot until the
test lets it go), the settings' checks at hub start, and in the in-process hub three concurrent
spawns with one slot whose launches follow each other (and begin together without the limit).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from jupyterhub.tests.utils import api_request
from traitlets import TraitError

from gpuspawner.hub.config_check import check_spawner_settings
from gpuspawner.hub.settings import SpawnerSettings
from gpuspawner.hub.start_slots import StartSlots, check_start_slot_settings, node_limit
from gpuspawner.hub.trait_check import HubConfigError
from gpuspawner.testing.fake_backend import FakeBackend
from gpuspawner.testing.inprocess import wait_for
from tests.inprocess_hub import runtime

NODE = "inproc-n1"
PROFILES = [{"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "1G", "default": True}]


class Starts:
    """Starts on one :class:`StartSlots`, each a task that enters its slot, records the order
    of entry and holds the slot until :meth:`finish` lets it go."""

    def __init__(self, slots: StartSlots, limit: int = 1, hold_s: float = 30.0) -> None:
        self.slots, self.limit, self.hold_s = slots, limit, hold_s
        self.entered: list[str] = []
        self.waits: dict[str, int] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._done: dict[str, asyncio.Event] = {}

    def begin(self, name: str, owner: str, node: str = "n1") -> None:
        """Start ``name`` of user ``owner`` (it enters at once or waits)."""
        done = self._done[name] = asyncio.Event()

        def on_wait(ahead: int) -> None:
            self.waits[name] = ahead

        async def run() -> None:
            async with self.slots.slot(node, self.limit, owner, on_wait, self.hold_s):
                self.entered.append(name)
                await done.wait()

        self.tasks[name] = asyncio.create_task(run())

    async def settle(self) -> None:
        """Let every task run until it waits (the loop has nothing else to do)."""
        for _ in range(5):
            await asyncio.sleep(0)

    async def finish(self, name: str) -> None:
        """Let ``name`` leave its slot and end."""
        self._done[name].set()
        await asyncio.wait_for(self.tasks[name], 5)
        await self.settle()


async def test_starts_beyond_the_limit_wait_in_order_of_arrival():
    slots = StartSlots()
    s = Starts(slots, limit=2)
    for name, owner in (("a", "ann"), ("b", "bob"), ("c", "cat"), ("d", "dan")):
        s.begin(name, owner)
    await s.settle()
    assert s.entered == ["a", "b"]
    assert s.waits == {"c": 2, "d": 3}  # starts holding or waiting before each
    assert (slots.holding("n1"), slots.waiting("n1")) == (2, 2)
    await s.finish("b")
    assert s.entered == ["a", "b", "c"]
    await s.finish("a")
    assert s.entered == ["a", "b", "c", "d"]
    await s.finish("c")
    await s.finish("d")
    assert (slots.holding("n1"), slots.waiting("n1")) == (0, 0)


async def test_each_node_has_its_own_slots_and_zero_means_no_limit():
    slots = StartSlots()
    s = Starts(slots, limit=1)
    s.begin("a", "ann", node="n1")
    s.begin("b", "bob", node="n2")
    s.begin("c", "cat", node="n1")
    await s.settle()
    assert s.entered == ["a", "b"] and s.waits == {"c": 1}
    unlimited = Starts(slots, limit=0)
    for name in ("x", "y", "z"):
        unlimited.begin(name, "ann", node="n1")
    await unlimited.settle()
    assert unlimited.entered == ["x", "y", "z"] and unlimited.waits == {}
    for name in ("x", "y", "z"):
        await unlimited.finish(name)
    for name in ("a", "b", "c"):
        await s.finish(name)
    assert slots.holding("n1") == slots.holding("n2") == 0


async def test_a_start_cancelled_while_waiting_gives_up_its_place():
    slots = StartSlots()
    s = Starts(slots, limit=1)
    for name, owner in (("a", "ann"), ("b", "bob"), ("c", "cat")):
        s.begin(name, owner)
    await s.settle()
    s.tasks["b"].cancel()
    await s.settle()
    assert s.tasks["b"].cancelled() and slots.waiting("n1") == 1
    await s.finish("a")
    assert s.entered == ["a", "c"]
    await s.finish("c")
    assert (slots.holding("n1"), slots.waiting("n1")) == (0, 0)


async def test_a_start_cancelled_while_holding_frees_its_slot():
    slots = StartSlots()
    s = Starts(slots, limit=1)
    s.begin("a", "ann")
    s.begin("b", "bob")
    await s.settle()
    s.tasks["a"].cancel()
    await s.settle()
    assert s.entered == ["a", "b"] and slots.holding("n1") == 1
    await s.finish("b")
    assert (slots.holding("n1"), slots.waiting("n1")) == (0, 0)


async def test_a_start_granted_and_cancelled_before_it_resumes_frees_the_slot():
    slots = StartSlots()
    s = Starts(slots, limit=1)
    held = slots.slot("n1", 1, "ann")
    await held.__aenter__()
    s.begin("b", "bob")
    s.begin("c", "cat")
    await s.settle()
    await held.__aexit__(None, None, None)  # gives the slot to b, which has not run yet
    s.tasks["b"].cancel()
    await s.settle()
    assert s.tasks["b"].cancelled() and s.entered == ["c"]
    await s.finish("c")
    assert (slots.holding("n1"), slots.waiting("n1")) == (0, 0)


async def test_a_start_holds_its_slot_at_most_the_timeout():
    slots = StartSlots()
    s = Starts(slots, limit=1, hold_s=0.2)
    s.begin("a", "ann")  # never lets go by itself
    s.begin("b", "bob")
    await s.settle()
    assert s.entered == ["a"]
    await wait_for(lambda: "b" in s.entered, 5, message="b entered after a's hold ended")
    assert not s.tasks["a"].done()  # a goes on, without the slot
    await s.finish("a")  # its late end frees nothing twice
    assert slots.holding("n1") == 1
    await s.finish("b")
    assert slots.holding("n1") == 0


async def test_with_one_slot_a_users_next_start_does_not_follow_her_own():
    # mallory holds the slot and queued three more; ann arrives after them
    slots = StartSlots()
    s = Starts(slots, limit=1)
    for name in ("m1", "m2", "m3", "m4"):
        s.begin(name, "mallory")
    s.begin("a", "ann")
    await s.settle()
    assert s.entered == ["m1"]
    await s.finish("m1")
    assert s.entered == ["m1", "a"]  # not m2: mallory's start just freed the slot
    await s.finish("a")
    assert s.entered == ["m1", "a", "m2"]
    for name in ("m2", "m3", "m4"):
        await s.finish(name)
    assert s.entered == ["m1", "a", "m2", "m3", "m4"]


async def test_a_freed_slot_goes_to_the_user_holding_fewest():
    slots = StartSlots()
    s = Starts(slots, limit=2)
    s.begin("m1", "mallory")
    s.begin("m2", "mallory")
    s.begin("m3", "mallory")
    s.begin("b1", "bob")
    await s.settle()
    await s.finish("m1")  # mallory still holds m2: bob, holding none, goes first
    assert s.entered == ["m1", "m2", "b1"]
    await s.finish("b1")
    assert s.entered[-1] == "m3"
    await s.finish("m2")
    await s.finish("m3")


def test_node_limit():
    assert node_limit(-1, 8) == 8 and node_limit(-1, 0) == 1
    assert node_limit(0, 8) == 0 and node_limit(3, 8) == 3


@pytest.mark.parametrize("values, field", [
    ({"node_concurrent_starts": -2}, "node_concurrent_starts"),
    ({"node_concurrent_starts": "4"}, "node_concurrent_starts"),
    ({"node_concurrent_starts": True}, "node_concurrent_starts"),
    ({"node_start_slot_timeout": 0}, "node_start_slot_timeout"),
    ({"node_start_slot_timeout": -1.5}, "node_start_slot_timeout"),
    ({"node_start_slot_timeout": float("inf")}, "node_start_slot_timeout"),
])
def test_wrong_settings_are_refused_naming_the_trait(values: dict[str, Any], field: str,
                                                     tmp_path):
    with pytest.raises(ValueError, match=f"^{field}: "):
        check_start_slot_settings(values)
    # at hub start, whichever file set it (the raw value, before any spawner exists)
    with pytest.raises(HubConfigError, match=f"GPUSpawner.{field}: "):
        check_spawner_settings({"nodes": [{"name": "n1"}], "state_dir": str(tmp_path),
                                **values})
    # and on the trait itself
    with pytest.raises(TraitError, match=field):
        SpawnerSettings(**values)


@pytest.fixture
def slow_launches(monkeypatch) -> tuple[list[str], asyncio.Event]:
    """FakeBackend launches that record their server and wait for the returned event."""
    begun: list[str] = []
    go = asyncio.Event()
    launch = FakeBackend.launch

    async def slow(self: FakeBackend, spec: Any, state: dict[str, Any], progress: Any):
        begun.append(spec.user)
        await go.wait()
        return await launch(self, spec, state, progress)

    monkeypatch.setattr(FakeBackend, "launch", slow)
    return begun, go


async def _three_spawns(app: Any) -> list[asyncio.Task[Any]]:
    tasks = []
    for name in ("ann", "bob", "cat"):
        r = await api_request(app, "users", name, method="post", bypass_proxy=True)
        assert r.status_code == 201, r.text
        tasks.append(asyncio.create_task(app.users[name].spawn("", {"profile": "cpu"})))
    return tasks


async def test_with_one_slot_the_hubs_spawns_launch_one_after_another(inprocess_hub,
                                                                      slow_launches):
    begun, go = slow_launches
    app, _ = await inprocess_hub(NODE, PROFILES, node_concurrent_starts=1)
    tasks = await _three_spawns(app)
    await wait_for(lambda: begun, 10, message="a first launch")
    waiting = [app.users[n].spawner for n in ("ann", "bob", "cat") if n not in begun]
    await wait_for(lambda: all(any(e["message"].startswith("Waiting to start")
                                   for e in sp._events) for sp in waiting), 10,
                   message="the two other spawns waiting to start")
    assert len(begun) == 1 and runtime(app).start_slots.waiting(NODE) == 2
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert sorted(begun) == ["ann", "bob", "cat"]
    assert all(app.users[n].spawner.ready for n in begun)
    assert runtime(app).start_slots.holding(NODE) == 0


async def test_without_a_limit_the_hubs_spawns_launch_together(inprocess_hub, slow_launches):
    begun, go = slow_launches
    app, _ = await inprocess_hub(NODE, PROFILES, node_concurrent_starts=0)
    tasks = await _three_spawns(app)
    await wait_for(lambda: len(begun) == 3, 10, message="three launches at once")
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
