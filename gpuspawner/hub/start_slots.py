"""Start slots: at most so many servers start at once on one node.

A server's start (the image's entry point, Jupyter's imports, the extensions' loading) costs
about 3 CPU seconds; eight started at once on a node with two CPUs share them to the end and
all answer late together, so the median spawn waits as long as the slowest. DockerSpawner runs
every engine call on one thread (``DockerSpawner.executor``, a ``ThreadPoolExecutor(1)``), so
its starts begin about half a second apart and the first servers get the CPUs first
(docs/benchmarks.md, "Start slots"). Here a start holds one of its node's slots from the
backend's launch until its server answers, fails or is cancelled, and at most
``hold_s`` seconds: a server that never answers does not keep the slot for the whole
``Spawner.http_timeout``.

Order: a waiting start gets a freed slot before any later one, except that a user's starts do
not follow each other while others wait: a freed slot goes to the waiting start whose user holds
the fewest slots of the node, counting the user whose start freed the slot as holding one more,
then in order of arrival. (With one slot per node, "the earliest start of a user who holds
none" would give it to the same user's next queued start each time hers ended: found by an
attack with hanging named servers, replayed in tests/test_attack_start_slots.py.)

This module is the hub's bookkeeping only (one event loop, no threads); the spawner asks for a
slot around its launch (:meth:`gpuspawner.hub.spawner.GPUSpawner.start`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["START_SLOT_TRAITS", "StartSlots", "check_start_slot_settings", "node_limit"]

log = logging.getLogger("gpuspawner")

#: the ``c.GPUSpawner`` traits checked by :func:`check_start_slot_settings` (their defaults are
#: the traits': -1 and 30 s)
START_SLOT_TRAITS = ("node_concurrent_starts", "node_start_slot_timeout")


def check_start_slot_settings(values: Mapping[str, Any]) -> None:
    """Check the start-slot settings in ``{trait name: value}`` (a missing trait is not
    checked: it keeps the trait's default). ``node_concurrent_starts``: an integer >= -1 (-1:
    the node's logical CPUs, 0: no limit); ``node_start_slot_timeout``: seconds, finite, > 0.

    Raises:
        ValueError: ``"<trait>: <why>"`` for the first wrong value (the caller prefixes the
            class, ``GPUSpawner.``).
    """
    if "node_concurrent_starts" in values:
        starts = values["node_concurrent_starts"]
        if isinstance(starts, bool) or not isinstance(starts, int) or starts < -1:
            raise ValueError(f"node_concurrent_starts: {starts!r} is not an integer >= -1 "
                             "(-1: the node's logical CPUs, 0: no limit, n: at most n at once)")
    if "node_start_slot_timeout" in values:
        hold = values["node_start_slot_timeout"]
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not hold > 0 \
                or hold == float("inf"):
            raise ValueError(f"node_start_slot_timeout: {hold!r} is not a number of seconds > 0")


def node_limit(concurrent_starts: int, cpu_count: int) -> int:
    """Slots of a node: ``concurrent_starts`` when > 0, the node's ``cpu_count`` (at least 1)
    when -1, 0 (no limit) when 0."""
    if concurrent_starts < 0:
        return max(1, cpu_count)
    return concurrent_starts


@dataclass(eq=False)
class _Start:
    owner: str
    seq: int
    future: asyncio.Future[None] | None = None
    timer: asyncio.TimerHandle | None = None
    holding: bool = False


@dataclass
class _NodeSlots:
    limit: int = 0
    holding: list[_Start] = field(default_factory=list)
    waiting: list[_Start] = field(default_factory=list)

    def held_by(self, owner: str) -> int:
        return sum(1 for s in self.holding if s.owner == owner)


class StartSlots:
    """Per-node slots for starting servers, shared by every spawner of one hub
    (:attr:`gpuspawner.hub.cluster.Cluster.start_slots`)."""

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeSlots] = {}
        self._seq = itertools.count()

    def holding(self, node: str) -> int:
        """Starts holding a slot of ``node`` now."""
        slots = self._nodes.get(node)
        return len(slots.holding) if slots else 0

    def waiting(self, node: str) -> int:
        """Starts waiting for a slot of ``node`` now."""
        slots = self._nodes.get(node)
        return sum(1 for s in slots.waiting if not s.future or not s.future.done()) \
            if slots else 0

    @asynccontextmanager
    async def slot(self, node: str, limit: int, owner: str,
                   on_wait: Callable[[int], None] | None = None,
                   hold_s: float = 30.0) -> AsyncIterator[None]:
        """Hold one of ``node``'s ``limit`` slots (0: no limit) for the ``async with`` body,
        at most ``hold_s`` seconds; ``owner`` is the user (for the order above). Waits while
        the node's slots are held; ``on_wait(ahead)`` is called once when the start has to wait,
        with the number of starts holding or waiting before it.

        Raises:
            asyncio.CancelledError: cancelled while waiting (its place is given up) or while
                holding (the slot is freed).
        """
        if limit <= 0:
            yield
            return
        slots = self._nodes.setdefault(node, _NodeSlots())
        slots.limit = limit
        start = _Start(owner, next(self._seq))
        await self._acquire(node, slots, start, on_wait)
        try:
            start.timer = asyncio.get_running_loop().call_later(
                hold_s, self._timed_out, node, start, hold_s)
            yield
        finally:
            self._release(node, start)

    async def _acquire(self, node: str, slots: _NodeSlots, start: _Start,
                       on_wait: Callable[[int], None] | None) -> None:
        if len(slots.holding) < slots.limit and not self.waiting(node):
            start.holding = True
            slots.holding.append(start)
            return
        start.future = asyncio.get_running_loop().create_future()
        slots.waiting.append(start)
        if on_wait is not None:
            on_wait(len(slots.holding) + self.waiting(node) - 1)
        try:
            await start.future
        except asyncio.CancelledError:
            if start in slots.waiting:
                slots.waiting.remove(start)
            if start.holding:  # granted, then cancelled before it resumed
                self._release(node, start)
            raise

    def _timed_out(self, node: str, start: _Start, hold_s: float) -> None:
        if start.holding:
            log.warning("start of a server of %s held its slot on %s for %.0f s: freed "
                        "(c.GPUSpawner.node_start_slot_timeout); the start goes on",
                        start.owner, node, hold_s)
            self._release(node, start)

    def _release(self, node: str, start: _Start) -> None:
        if start.timer is not None:
            start.timer.cancel()
            start.timer = None
        if not start.holding:
            return
        start.holding = False
        slots = self._nodes[node]
        slots.holding.remove(start)
        self._grant(node, slots, freed_by=start.owner)

    def _grant(self, node: str, slots: _NodeSlots, freed_by: str) -> None:
        while len(slots.holding) < slots.limit:
            slots.waiting = [s for s in slots.waiting if s.future and not s.future.done()]
            if not slots.waiting:
                break
            chosen = min(slots.waiting, key=lambda s: (
                slots.held_by(s.owner) + (s.owner == freed_by), s.seq))
            slots.waiting.remove(chosen)
            chosen.holding = True
            slots.holding.append(chosen)
            assert chosen.future is not None
            chosen.future.set_result(None)
        if not slots.holding and not slots.waiting:
            del self._nodes[node]
