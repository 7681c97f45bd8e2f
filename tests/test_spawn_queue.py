"""The hub side of the wait queue (gpuspawner.hub.spawn_queue.SpawnQueue) on a real asyncio
loop over a Ledger of factory nodes: waiting, waking on release, "fail now", its own timeout,
cancellation (kept for a restart, dropped by the server's stop), the queue file."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuspawner.hub.spawn_queue import QueueSettings, QueueTimeout, SpawnQueue
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.queue import WaitQueue
from tests.factories import GiB, make_node

ONE = Bundle(cores=1, gpus=1, memory_bytes=GiB, numa_policy="none")


def make(tmp_path=None, **kw) -> SpawnQueue:
    ledger = Ledger([make_node("n1", gpus=1, numa=1)], policy="first-fit")
    file = str(tmp_path / "q.json") if tmp_path is not None else ""
    return SpawnQueue(WaitQueue(ledger), QueueSettings(file=file, tick_s=0.05, **kw))


async def wait_for(cond, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def test_waits_and_starts_when_released_with_positions_reported():
    async def main():
        q = make()
        first = await q.acquire(Owner("a"), ONE)
        seen = []
        task = asyncio.ensure_future(q.acquire(
            Owner("b"), ONE, on_wait=lambda e, pos, n: seen.append((e.owner.user, pos, n))))
        await wait_for(lambda: seen)
        assert seen[0] == ("b", 1, 1) and not task.done()
        q.ledger.release(first.id)
        q.kick()
        got = await asyncio.wait_for(task, 5)
        assert got.owner.user == "b" and len(q.wq) == 0
    asyncio.run(main())


def test_fail_now_says_why_and_leaves_nothing():
    async def main():
        q = make()
        await q.acquire(Owner("a"), ONE)
        with pytest.raises(PlacementRefused) as e:
            await q.acquire(Owner("b"), ONE, wait=False)
        assert "no node has 1 free GPU" in str(e.value) and len(q.wq) == 0
        with pytest.raises(PlacementRefused) as e:  # never fits: refused even when waiting
            await q.acquire(Owner("c"), Bundle(cores=1, gpus=2))
        assert e.value.reason in ("never", "too_large") and len(q.wq) == 0
    asyncio.run(main())


def test_its_own_timeout_ends_the_wait_with_the_reason():
    async def main():
        q = make(timeout_s=0.2)
        await q.acquire(Owner("a"), ONE)
        with pytest.raises(QueueTimeout, match=r"waited 0.2 s in the queue .*position 1 of 1"):
            await q.acquire(Owner("b"), ONE)
        assert len(q.wq) == 0
    asyncio.run(main())


def test_cancelled_wait_keeps_its_place_until_the_server_stops(tmp_path):
    async def main():
        q = make(tmp_path)
        held = await q.acquire(Owner("a"), ONE)
        task = asyncio.ensure_future(q.acquire(Owner("b"), ONE, options={"profile": "g"}))
        await wait_for(lambda: len(q.wq) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # a hub shutdown cancels too: the entry stays in the file for the next hub
        kept = json.loads((tmp_path / "q.json").read_text())["entries"]
        assert [(e["user"], e["options"]) for e in kept] == [("b", {"profile": "g"})]
        assert q.restored_entries() == []  # cancelled, not a restored entry to spawn again
        q.ledger.release(held.id)
        assert q.kick() == []  # an unclaimed entry never gets an allocation
        assert q.forget("b") and len(q.wq) == 0  # the user's stop: gone, nothing held
        assert q.ledger.allocations() == []
        assert json.loads((tmp_path / "q.json").read_text())["entries"] == []
    asyncio.run(main())


def test_a_grant_that_races_a_cancel_is_released():
    async def main():
        q = make()
        held = await q.acquire(Owner("a"), ONE)
        task = asyncio.ensure_future(q.acquire(Owner("b"), ONE))
        await wait_for(lambda: len(q.wq) == 1)
        q.ledger.release(held.id)
        q.kick()  # grants b's future ...
        task.cancel()  # ... but the spawn is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await task
        assert q.ledger.allocations() == [] and len(q.wq) == 0
    asyncio.run(main())


def test_restart_restores_the_order_and_a_bad_file_is_kept_aside(tmp_path):
    async def main():
        q = make(tmp_path)
        await q.acquire(Owner("a"), ONE)
        tasks = [asyncio.ensure_future(q.acquire(Owner(u), ONE, options={"u": u}))
                 for u in ("b", "c")]
        await wait_for(lambda: len(q.wq) == 2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # a new hub process: same file, same ledger contents (a's server still runs)
        q2 = SpawnQueue(WaitQueue(q.ledger), q.settings)
        assert q2.load() == []
        assert [e.owner.user for e in q2.restored_entries()] == ["b", "c"]
        assert [e.options for e in q2.restored_entries()] == [{"u": "b"}, {"u": "c"}]
        (tmp_path / "q.json").write_text("{not json")
        q3 = SpawnQueue(WaitQueue(q.ledger), q.settings)
        problems = q3.load()
        assert len(problems) == 1 and "kept as" in problems[0] and len(q3.wq) == 0
        assert (tmp_path / "q.json.bad").read_text() == "{not json"
    asyncio.run(main())


def test_many_waiters_cost_one_order_per_change():
    # a flood of waiting spawns must not make every change O(waiters^2): positions come from
    # one WaitQueue.order() per change, shared by every waiter
    async def main():
        q = make()
        held = await q.acquire(Owner("a"), ONE)
        calls = [0]
        real = q.wq.order

        def counting():
            calls[0] += 1
            return real()

        q.wq.order = counting  # type: ignore[method-assign]
        seen: dict[str, tuple[int, int]] = {}
        tasks = [asyncio.ensure_future(q.acquire(
            Owner(f"u{i}"), ONE, on_wait=lambda e, p, n: seen.__setitem__(e.owner.user, (p, n))))
            for i in range(200)]
        await wait_for(lambda: len(seen) == 200)
        assert sorted(p for p, _ in seen.values()) == list(range(1, 201))
        calls[0] = 0
        q.ledger.release(held.id)
        q.kick()  # u0 starts; 199 waiters wake and re-read their positions
        await wait_for(lambda: tasks[0].done() and all(
            seen[f"u{i}"] == (i, 199) for i in range(1, 200)))
        assert calls[0] <= 5, calls[0]  # schedule's passes plus one shared order, not 199
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(main())


def test_queue_view_shows_other_users_entries_only_to_admins():
    # GET api/queue: a user sees the counts of everyone but only their own entries (who else
    # waits, and for what, is not theirs to read); admins (viewer None) see every entry
    from types import SimpleNamespace

    from gpuspawner.hub.service.views import queue_view

    async def main():
        q = make()
        await q.acquire(Owner("a"), ONE)
        tasks = [asyncio.ensure_future(q.acquire(Owner(u, "s"), ONE, profile="a100"))
                 for u in ("bob", "eve")]
        await wait_for(lambda: len(q.wq) == 2)
        cluster = SimpleNamespace(queue=q)
        mine = queue_view(cluster, "eve")
        assert (mine["length"], mine["by_profile"], mine["waiting_gpus"]) == (
            2, {"a100": 2}, {"GPU": 2})
        assert [(e["user"], e["position"]) for e in mine["entries"]] == [("eve", 2)]
        everyone = queue_view(cluster, None)
        assert [(e["user"], e["position"]) for e in everyone["entries"]] == [
            ("bob", 1), ("eve", 2)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(main())
