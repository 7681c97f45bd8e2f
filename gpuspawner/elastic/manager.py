"""The elastic nodes of a hub: started when requests wait for what only they could hold,
stopped when idle (docs/howto/elastic-nodes.md).

An elastic node is a ``c.GPUSpawner.nodes`` entry with ``elastic: true``, a ``category`` and a
``provider``. It is in the ledger from the start with its category's topology: while it is
not running its state is ``off`` (:meth:`~gpuspawner.placement.Ledger.set_node_state`): no
placement there, but a request that fits only it is admissible (*can start*) and waits in the
queue. It is out of the backend's node table until it has joined, so nothing asks its engine
before it runs.

:class:`ElasticManager` looks every ``interval`` seconds: it asks the policy
(:mod:`~gpuspawner.elastic.policy`) what to start and stop, keeps the policy's decisions
within the limits (``max_nodes``, ``starts_per_hour``, back-off; never a stop of a node that
holds a server or a job, or that its provider did not start), and runs each start and stop
as a task:

- start: the provider starts a machine (``join_timeout`` for all of it), its topology must
  match the category's (GPU models, count and UUIDs, cores, memory; else it is refused and
  stopped), its engine must answer; then the node is ``up`` and the queue is moved;
- a failed start (the provider fails, the node never joins, a wrong topology) stops what the
  provider may have started, and the category backs off (``backoff`` doubled per failure up to
  ``backoff_max``); the waiting requests keep their places and say why;
- stop: only a running node its provider started, with nothing booked and no server on its
  engine; it is ``off`` first (nothing is placed there meanwhile), then the provider stops it.

The nodes' states and the provider's handles are kept in a JSON file (``state_file``): after a
hub restart, running nodes are running again; a start or stop the restart cut short is
stopped (its provider was asked to start it, so stopping it is its to do).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..inventory.topology import node_from_dict
from ..placement import Node
from ..placement.queue import QueueEntry
from .config import ElasticSettings
from .policy import CategoryView, Decision, ElasticView, NodeView, WaitingView
from .provider import Provider, ProviderError

log = logging.getLogger("gpuspawner")

__all__ = ["ELASTIC_FILE_NAME", "ElasticManager", "Slot", "topology_problem"]

ELASTIC_FILE_NAME = "gpuspawner-elastic.json"
VERSION = 1


@dataclass
class Slot:
    """One elastic node and where it stands.

    Attributes:
        name, category, provider: from its node entry.
        state: ``off``, ``starting``, ``running`` or ``stopping``.
        handle: the provider's id of the machine it started ("" = nothing started: never
            stopped).
        started_at, joined_at: seconds since the epoch (0 = not yet).
        idle_since: when it last held nothing (None while booked).
        error: the last failure, shown to waiting requests.
    """

    name: str
    category: str
    provider: str
    state: str = "off"
    handle: str = ""
    started_at: float = 0.0
    joined_at: float = 0.0
    idle_since: float | None = None
    error: str = ""
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass
class _Backoff:
    failures: int = 0
    until: float = 0.0
    error: str = ""


def _minutes(seconds: float) -> str:
    if seconds < 60:
        return "less than a minute"
    n = math.ceil(seconds / 60)
    return f"about {n} min"


def topology_problem(expected: Node, got: Node) -> str | None:
    """Why a joining node's topology is not its category's, or None: GPU count, models and
    UUIDs (the ledger books the category's devices), cores, memory (within 1 %). Names and
    labels are not compared."""

    def gpus(n: Node) -> list[tuple[str, str]]:
        return sorted((g.model, g.uuid) for g in n.gpus)

    if len(expected.gpus) != len(got.gpus):
        return f"{len(got.gpus)} GPU(s), the category has {len(expected.gpus)}"
    if sorted(g.model for g in expected.gpus) != sorted(g.model for g in got.gpus):
        return (
            f"GPU models {sorted(g.model for g in got.gpus)}, the category has "
            f"{sorted(g.model for g in expected.gpus)}"
        )
    if gpus(expected) != gpus(got):
        return "GPU UUIDs other than the category's topology file names"
    cores = [sum(len(nn.cpus) for nn in n.numa_nodes) for n in (expected, got)]
    if cores[0] != cores[1]:
        return f"{cores[1]} cores, the category has {cores[0]}"
    mem = [sum(nn.memory_bytes for nn in n.numa_nodes) for n in (expected, got)]
    if abs(mem[0] - mem[1]) > 0.01 * max(mem[0], 1):
        return f"{mem[1]} bytes of memory, the category has {mem[0]}"
    return None


class ElasticManager:
    """The elastic nodes of one hub's cluster (see the module's docstring).

    Args:
        cluster: the hub's :class:`~gpuspawner.hub.cluster.Cluster`.
        settings: the checked ``c.GPUElastic``.
        providers: provider name -> provider.
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        cluster: Any,
        settings: ElasticSettings,
        providers: Mapping[str, Provider],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.providers = dict(providers)
        self._clock = clock
        self.slots: dict[str, Slot] = {}
        for name, rt in cluster.nodes.items():
            el = rt.extra.get("elastic")
            if el:
                self.slots[name] = Slot(name, el["category"], el["provider"])
        #: the backend's node table: fixed nodes and the elastic nodes that joined
        self.active: dict[str, Any] = {
            n: rt for n, rt in cluster.nodes.items() if n not in self.slots
        }
        self._backoff: dict[str, _Backoff] = {}
        self._starts: deque[float] = deque()
        self._task: asyncio.Task[None] | None = None
        #: what the policy decided last (for the log and tests)
        self.last_decisions: list[Decision] = []

    # -- wiring ---------------------------------------------------------------------------
    def attach(self) -> None:
        """Bind the backend to the running nodes, set the others ``off`` in the ledger, load
        the state file, and hang the queue's notes on :meth:`note`."""
        self.cluster.backend.bind(self.active)
        self.load()
        for slot in self.slots.values():
            if slot.state != "running":
                self.cluster.ledger.set_node_state(slot.name, "off", self._off_reason(slot))
        self.cluster.elastic = self
        self.cluster.queue.wait_note = self.note

    def live(self, name: str) -> bool:
        """Whether node ``name`` is running (a fixed node always is, as far as this goes)."""
        slot = self.slots.get(name)
        return slot is None or slot.state == "running"

    def start(self) -> None:
        """Start the policy's loop on the running event loop (once; again after a loop that
        ran it ended)."""
        loop = asyncio.get_running_loop()
        t = self._task
        if t is not None and not t.done() and t.get_loop() is loop:
            return
        self._task = loop.create_task(self._run(), name="gpuspawner-elastic")

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one error
                log.exception("elastic nodes: step failed")
            await asyncio.sleep(self.settings.interval)

    # -- the state file -------------------------------------------------------------------
    def save(self) -> None:
        """Write the nodes' states atomically (no file: nothing); errors are logged."""
        path = self.settings.state_file
        if not path:
            return
        data = {
            "version": VERSION,
            "starts": list(self._starts),
            "nodes": {
                s.name: {
                    "state": s.state,
                    "handle": s.handle,
                    "started_at": s.started_at,
                    "joined_at": s.joined_at,
                    "docker_url": self.cluster.nodes[s.name].docker_url,
                    "host": self.cluster.nodes[s.name].host,
                    "network_pool": self.cluster.nodes[s.name].network_pool,
                }
                for s in self.slots.values()
                if s.state != "off" or s.handle
            },
        }
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".gpuspawner-elastic.", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as e:
            log.error("elastic nodes: cannot write %s: %s", path, e)

    def load(self) -> None:
        """Restore what an earlier hub process kept: running nodes run again (their engine
        URL back in the backend's table); a start or stop it left unfinished is stopped by
        the next step. Unknown nodes and bad records are logged and skipped."""
        path = self.settings.state_file
        if not path or not os.path.exists(path):
            return
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"version: must be {VERSION}")
        except (OSError, ValueError) as e:
            log.error(
                "elastic nodes: %s unreadable (%s); every elastic node counts as off", path, e
            )
            return
        now = self._clock()
        self._starts.extend(
            t for t in data.get("starts", []) if isinstance(t, (int, float)) and now - t < 3600
        )
        for name, rec in (data.get("nodes") or {}).items():
            slot = self.slots.get(name)
            if slot is None or not isinstance(rec, dict):
                log.error(
                    "elastic nodes: %s names node %s, which is no elastic node; "
                    "skipped (nothing is stopped)",
                    path,
                    name,
                )
                continue
            slot.handle = str(rec.get("handle") or "")
            slot.started_at = float(rec.get("started_at") or 0)
            state = rec.get("state")
            rt = self.cluster.nodes[name]
            if state == "running" and rec.get("docker_url"):
                rt.docker_url = str(rec["docker_url"])
                rt.host = str(rec.get("host") or rt.host)
                rt.network_pool = str(rec.get("network_pool") or rt.network_pool)
                slot.state, slot.joined_at = "running", float(rec.get("joined_at") or now)
                slot.idle_since = now
                self.active[name] = rt
                self.cluster.ledger.set_node_state(name, "up")
                log.info("elastic node %s: running (kept across the restart)", name)
            elif slot.handle:
                slot.state = "stopping"
                slot.error = "the hub restarted while it was being started or stopped"
                log.warning(
                    "elastic node %s: the hub restarted during its %s; it is stopped", name, state
                )

    # -- what waits -----------------------------------------------------------------------
    def categories_for(self, entry: QueueEntry) -> tuple[str, ...]:
        """The categories whose node, empty, could hold ``entry``'s bundle (within its
        profile's node selector)."""
        out = []
        for c, cs in self.settings.categories.items():
            names = [n for n in cs.nodes if not entry.nodes or n in entry.nodes]
            if names and self.cluster.ledger.could_hold(entry.bundle, names[0]):
                out.append(c)
        return tuple(out)

    def _off_reason(self, slot: Slot) -> str:
        cs = self.settings.categories[slot.category]
        return (
            f"elastic node of category {slot.category}: off, started when a request "
            f"needs it ({_minutes(cs.start_s)})"
        )

    def note(self, entry: QueueEntry) -> str | None:
        """What a waiting request is told about elastic nodes: "a node is being started for
        this, about 2 min (node burst-1)", a failure and the next try, or when a node will be
        started; None when no category fits it."""
        cats = self.categories_for(entry)
        if not cats:
            return None
        now = self._clock()
        for c in cats:
            for s in self.slots.values():
                if s.category == c and s.state == "starting":
                    left = self.settings.categories[c].start_s - (now - s.started_at)
                    return f"a node is being started, {_minutes(max(0.0, left))} (node {s.name})"
        for c in cats:
            b = self._backoff.get(c)
            if b is not None and b.until > now:
                return (
                    f"starting a node failed ({b.error}); next try in {math.ceil(b.until - now)} s"
                )
        waited = now - entry.enqueued
        c = cats[0]
        cs = self.settings.categories[c]
        if waited < self.settings.scale_out_after:
            return (
                f"a node (category {c}) is started if this waits "
                f"{math.ceil(self.settings.scale_out_after - waited)} s more; it takes "
                f"{_minutes(cs.start_s)}"
            )
        if self._starts_last_hour(now) >= self.settings.starts_per_hour:
            return (
                f"no node can be started now: {self.settings.starts_per_hour} were "
                "started in the last hour (GPUElastic.starts_per_hour)"
            )
        running = sum(1 for s in self.slots.values() if s.category == c and s.state != "off")
        if running >= cs.max_nodes:
            return f"all {cs.max_nodes} node(s) of category {c} run (max_nodes)"
        return None

    def _starts_last_hour(self, now: float) -> int:
        while self._starts and now - self._starts[0] >= 3600:
            self._starts.popleft()
        return len(self._starts)

    # -- the policy's step ----------------------------------------------------------------
    def view(self) -> ElasticView:
        """What the policy decides from, now (idle times updated)."""
        now = self._clock()
        booked: dict[str, int] = {}
        for a in self.cluster.ledger.allocations():
            booked[a.node] = booked.get(a.node, 0) + 1
        nodes = []
        for s in self.slots.values():
            n = booked.get(s.name, 0)
            if s.state == "running":
                if n:
                    s.idle_since = None
                elif s.idle_since is None:
                    s.idle_since = now
            idle = now - s.idle_since if s.state == "running" and s.idle_since else 0.0
            nodes.append(NodeView(s.name, s.category, s.state, n, idle, bool(s.handle)))
        waiting = tuple(
            WaitingView(e.id, e.owner.user, max(0.0, now - e.enqueued), self.categories_for(e))
            for e in self.cluster.queue.wq.order()
        )
        cats = {
            c: CategoryView(
                c,
                cs.min_nodes,
                cs.max_nodes,
                cs.start_s,
                max(0.0, self._backoff[c].until - now) if c in self._backoff else 0.0,
            )
            for c, cs in self.settings.categories.items()
        }
        return ElasticView(
            tuple(nodes),
            waiting,
            cats,
            self._starts_last_hour(now),
            self.settings.scale_out_after,
            self.settings.idle_shutdown,
            self.settings.starts_per_hour,
        )

    async def step(self) -> list[Decision]:
        """One look: retry unfinished stops, ask the policy, apply what the limits allow.
        Returns the decisions applied."""
        for s in self.slots.values():
            if s.state == "stopping" and (s.task is None or s.task.done()):
                s.task = asyncio.ensure_future(self._stop(s, s.error or "unfinished stop"))
        view = self.view()
        try:
            decisions = list(self.settings.policy(view))
        except Exception:
            log.exception("elastic nodes: the policy failed; nothing started or stopped")
            return []
        applied = []
        for d in decisions:
            if d.action == "start" and self._may_start(d):
                applied.append(d)
            elif d.action == "stop" and self._may_stop(d):
                applied.append(d)
        self.last_decisions = applied
        return applied

    def _may_start(self, d: Decision) -> bool:
        now = self._clock()
        cs = self.settings.categories.get(d.category)
        if cs is None:
            log.warning("elastic policy: start of unknown category %r ignored", d.category)
            return False
        b = self._backoff.get(d.category)
        if b is not None and b.until > now:
            return False
        if self._starts_last_hour(now) >= self.settings.starts_per_hour:
            return False
        live = [s for s in self.slots.values() if s.category == d.category and s.state != "off"]
        if len(live) >= cs.max_nodes:
            return False
        free = [
            s
            for s in self.slots.values()
            if s.category == d.category and s.state == "off" and (not d.node or s.name == d.node)
        ]
        if not free:
            return False
        slot = free[0]
        slot.state, slot.handle, slot.started_at, slot.error = "starting", slot.name, now, ""
        self._starts.append(now)
        self.cluster.ledger.set_node_state(
            slot.name, "off", f"being started ({d.reason}), {_minutes(cs.start_s)}"
        )
        self.save()
        log.info("elastic node %s (category %s): starting: %s", slot.name, slot.category, d.reason)
        slot.task = asyncio.ensure_future(self._start(slot))
        self._moved()
        return True

    def _may_stop(self, d: Decision) -> bool:
        slot = self.slots.get(d.node)
        if slot is None or slot.state != "running":
            return False
        if not slot.handle:
            log.warning("elastic node %s: not stopped: its provider did not start it", slot.name)
            return False
        if any(a.node == slot.name for a in self.cluster.ledger.allocations()):
            return False  # never a node with a server or a job
        # off in the ledger now, before any await: nothing is placed there meanwhile
        slot.state = "stopping"
        self.cluster.ledger.set_node_state(slot.name, "off", f"being stopped: {d.reason}")
        self.save()
        log.info("elastic node %s: stopping: %s", slot.name, d.reason)
        slot.task = asyncio.ensure_future(self._stop(slot, d.reason))
        return True

    def _moved(self) -> None:
        """Wake the waiting spawns (their notes changed) and start what fits now."""
        self.cluster.queue.kick()

    # -- start and stop -------------------------------------------------------------------
    async def _start(self, slot: Slot) -> None:
        cs = self.settings.categories[slot.category]
        provider = self.providers[slot.provider]
        rt = self.cluster.nodes[slot.name]
        backend = self.cluster.backend
        deadline = asyncio.get_running_loop().time() + self.settings.join_timeout
        try:
            try:
                started = await asyncio.wait_for(
                    provider.start(slot.category, slot.name), self.settings.join_timeout
                )
            except asyncio.TimeoutError:
                raise ProviderError(
                    f"the provider did not start it within join_timeout "
                    f"{self.settings.join_timeout:g} s"
                ) from None
            slot.handle = started.handle
            self.save()
            try:
                got = node_from_dict(started.topology, f"node {slot.name}'s topology")
            except ValueError as e:
                raise ProviderError(f"its topology does not load: {e}") from None
            problem = topology_problem(rt.node, got)
            if problem:
                raise ProviderError(
                    f"it joined with a topology other than category {cs.name}'s: {problem}; refused"
                )
            rt.docker_url = started.docker_url
            if started.host:
                rt.host = started.host
            if started.network_pool:
                rt.network_pool = started.network_pool
            backend.forget_node(slot.name)
            self.active[slot.name] = rt
            while True:
                state = (await backend.node_states()).get(slot.name, ("down", "no answer"))
                if state[0] == "up":
                    break
                if asyncio.get_running_loop().time() > deadline:
                    raise ProviderError(
                        f"its engine {rt.docker_url} did not answer within "
                        f"join_timeout {self.settings.join_timeout:g} s: "
                        f"{state[1]}",
                        f"its engine did not answer within join_timeout "
                        f"{self.settings.join_timeout:g} s",
                    )
                await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            public = e.public if isinstance(e, ProviderError) else "an error (the hub's log)"
            await self._give_up(slot, str(e), public)
            return
        now = self._clock()
        slot.state, slot.joined_at, slot.idle_since = "running", now, now
        self._backoff.pop(slot.category, None)
        self.cluster.ledger.set_node_state(slot.name, "up")
        self.save()
        log.info(
            "elastic node %s joined (engine %s) %.1f s after its start",
            slot.name,
            rt.docker_url,
            now - slot.started_at,
        )
        self._moved()

    async def _give_up(self, slot: Slot, why: str, public: str) -> None:
        """A start failed: stop what the provider may have started, back off. ``why`` goes
        to the log and :meth:`status` (admins), ``public`` to users (notes, state reason)."""
        b = self._backoff.setdefault(slot.category, _Backoff())
        b.failures += 1
        delay = min(self.settings.backoff_max, self.settings.backoff * 2 ** (b.failures - 1))
        b.until, b.error = self._clock() + delay, public
        slot.error = why
        log.error(
            "elastic node %s (category %s): start failed: %s; next try in %g s",
            slot.name,
            slot.category,
            why,
            delay,
        )
        self.active.pop(slot.name, None)
        self.cluster.backend.forget_node(slot.name)
        slot.state = "stopping"
        self.cluster.ledger.set_node_state(slot.name, "off", f"start failed: {public}")
        self.save()
        self._moved()
        await self._stop(slot, f"start failed: {public}")

    async def _stop(self, slot: Slot, reason: str) -> None:
        """Stop a node its provider started (``slot.handle``): check its engine has no server
        of ours, leave the backend's table, ask the provider. A failed stop is retried at the
        next step."""
        if not slot.handle:
            slot.state = "off"
            self.save()
            return
        if slot.name in self.active:
            try:
                found = [
                    m for m in await self.cluster.backend.list_managed() if m.node == slot.name
                ]
            except Exception as e:  # an engine that does not answer: nothing runs there
                log.warning("elastic node %s: engine not asked before the stop: %s", slot.name, e)
                found = []
            if found:
                log.warning(
                    "elastic node %s: not stopped: %d server(s) run there", slot.name, len(found)
                )
                slot.state = "running"
                self.cluster.ledger.set_node_state(slot.name, "up")
                self.save()
                return
            self.active.pop(slot.name, None)
            self.cluster.backend.forget_node(slot.name)
        try:
            await self.providers[slot.provider].stop(slot.name, slot.handle)
        except Exception as e:
            slot.error = f"stop failed: {e}"
            log.error("elastic node %s: stop failed (retried): %s", slot.name, e)
            return
        log.info("elastic node %s stopped (%s)", slot.name, reason)
        slot.state, slot.handle, slot.joined_at, slot.idle_since = "off", "", 0.0, None
        self.cluster.ledger.set_node_state(slot.name, "off", self._off_reason(slot))
        self.save()
        self._moved()

    def status(self) -> list[dict[str, Any]]:
        """The elastic nodes for the admin: name, category, state, handle, error."""
        return [
            {
                "name": s.name,
                "category": s.category,
                "state": s.state,
                "handle": s.handle,
                "error": s.error,
            }
            for s in self.slots.values()
        ]
