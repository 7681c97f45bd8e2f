"""The wait queue: bundles that fit the cluster's capacity but not what is free now wait here
and start in a fair order as resources free.

Order (:meth:`WaitQueue.order`): **weighted dominant-resource fairness** across users (Ghodsi et
al., "Dominant Resource Fairness: Fair Allocation of Multiple Resource Types", NSDI '11, §4:
the next task goes to the user with the smallest dominant share; weighted DRF, §6). The
dimensions are GPU (milli-GPU), cores and memory; a user's share counts what the user holds now
(:meth:`~.ledger.Ledger.usage`) plus the bundles ahead of it in the order, divided by the user's
weight (the largest weight of the user's groups, ``group_weights``; 1 by default). Within one
user, first come first served. Above fairness, a request may carry a *priority* (an integer,
0 by default; the hub sets it per kind: ``c.GPUSpawner.queue_priority`` for servers,
``c.GPUJobs.queue_priority`` for notebook jobs): every entry of a higher priority is ordered
before every entry of a lower one, and DRF orders the entries within one priority (the
projected shares carry over from the higher priorities). Slurm's multifactor priority plugin
is the model: a partition's ``PriorityTier`` is compared before any other factor
(slurm.conf(5), ``PriorityTier``).

Fair share over time (optional): the caller may pass each user's *decayed past usage*
(:meth:`WaitQueue.set_past_usage`, any unit, e.g. GPU-seconds each weighted by
``0.5 ** (age / half_life)``: :func:`decayed`, Slurm's ``PriorityDecayHalfLife``). A user's
fair-share factor is then ``F = 2 ** (-U / S)`` as in Slurm's classic fair-share formula
(priority_multifactor, "Fair-share Factor"): ``U`` the user's share of all past usage passed
in (0..1), ``S`` the user's weight divided by the weights of all users passed in or waiting.
The DRF key becomes ``dominant share / weight + (1 - F)``: at equal current holdings a user
with more decayed past usage waits behind one with less. With no past usage passed, F = 1
for everyone and the order is plain DRF on current holdings.

Start (:meth:`WaitQueue.schedule`): the entries are tried in that order. The first one that does
not fit now becomes the *head*. Entries behind it may still start if they fit now (backfill,
as Slurm's backfill scheduler lets lower-priority jobs start when they do not delay the first
one; slurm.conf(5) ``SchedulerType=sched/backfill``). Notebook servers have no time limit, so
"does not delay" cannot be computed from end times as Slurm does; instead the head may be
passed at most ``max_bypass`` times on a node that could take it. After that, one node is
reserved for it: of the nodes that could take it, the one that lacks the least to hold it now
(:meth:`~.ledger.Ledger.closest_node`, chosen again at every pass); later entries may start
anywhere else. What that node lacks can only shrink (nothing new starts there, and the choice
moves only to a node that lacks less), so a large bundle at the head starts at the latest when
enough of that node's servers stop, however many small ones keep arriving. Reserving every node
that could take the head instead (the first version) kept most of a saturated cluster idle
behind one large bundle: on a 12-node sample of the Alibaba trace 2,875 pods waited, 30,708 s
on average, against 267 and 530 s with one reserved node (docs/placement.md, "Queue
replay"). A head restored after a hub restart (not yet claimed by its spawn) is passed by
nobody on any node that could take it.

What never fits (over quota, more GPUs than any usable node has, a model the site lacks) is
refused before it is queued: :meth:`WaitQueue.check_admissible`.

Pure: standard library only; the caller holds no lock around it other than the ledger's own
(each method is called from one thread, the hub's event loop).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import PlacementError, PlacementRefused
from .ledger import Ledger
from .model import GPU_MILLI, Allocation, Bundle, Owner, now
from .quota import QuotaTable, Usage

__all__ = ["QueueEntry", "QueueOutcome", "WaitQueue", "bundle_to_dict", "bundle_from_dict",
           "decayed"]


def decayed(amount: float, age_s: float, half_life_s: float) -> float:
    """``amount`` decayed over ``age_s`` seconds with a half-life of ``half_life_s`` seconds:
    ``amount * 0.5 ** (age_s / half_life_s)`` (Slurm's ``PriorityDecayHalfLife``).
    ``half_life_s <= 0`` means no decay (the amount itself).
    """
    if half_life_s <= 0:
        return amount
    return amount * 0.5 ** (max(age_s, 0.0) / half_life_s)


def bundle_to_dict(b: Bundle) -> dict[str, Any]:
    """A bundle as JSON-ready dict (sizes in bytes and milli-GPU)."""
    d = asdict(b)
    d["gpu_models"] = list(b.gpu_models)
    return d


def bundle_from_dict(d: Mapping[str, Any]) -> Bundle:
    """Inverse of :func:`bundle_to_dict`. Raises InvalidBundle (a ValueError) on bad sizes."""
    return Bundle(**{**d, "gpu_models": tuple(d.get("gpu_models") or ())})


@dataclass
class QueueEntry:
    """One waiting spawn.

    Attributes:
        id: unique entry id.
        owner: user, server name, groups.
        bundle: what it waits for.
        profile: the profile's slug (for people and metrics).
        nodes: node names it may use (the profile's node selector); empty = any.
        options: the spawn's ``user_options`` (kept so a restarted hub can spawn it again).
        enqueued: seconds since the epoch when it joined (kept across a hub restart).
        seq: first-come-first-served number; smaller = earlier.
        bypassed: how often a later entry started ahead of it, on a node that could take it,
            while it was the head.
        claimed: False for an entry restored after a hub restart that no spawn has taken back
            yet (it holds its place, but cannot start until a spawn claims it).
        restored_at: when it was restored (seconds since the epoch), for expiry.
        quotas: the request's own quota table (a ``group_overrides`` of ``quotas``), None =
            the ledger's; checked at admission and at each try.
        priority: higher starts first, before any fairness (see the module's docstring).
    """

    id: str
    owner: Owner
    bundle: Bundle
    profile: str = ""
    nodes: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    enqueued: float = 0.0
    seq: int = 0
    bypassed: int = 0
    claimed: bool = True
    restored_at: float = 0.0
    quotas: QuotaTable | None = None
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what the queue file keeps and the REST API shows)."""
        return {
            "id": self.id, "user": self.owner.user, "server": self.owner.server,
            "groups": list(self.owner.groups), "bundle": bundle_to_dict(self.bundle),
            "profile": self.profile, "nodes": list(self.nodes), "options": self.options,
            "enqueued": self.enqueued, "seq": self.seq, "bypassed": self.bypassed,
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QueueEntry:
        """Inverse of :meth:`to_dict`. Raises KeyError, TypeError or ValueError on a bad record.
        """
        return cls(id=str(d["id"]), owner=Owner(str(d["user"]), str(d.get("server", "")),
                                                tuple(d.get("groups") or ())),
                   bundle=bundle_from_dict(d["bundle"]), profile=str(d.get("profile", "")),
                   nodes=tuple(d.get("nodes") or ()), options=dict(d.get("options") or {}),
                   enqueued=float(d["enqueued"]), seq=int(d["seq"]),
                   bypassed=int(d.get("bypassed", 0)), priority=int(d.get("priority", 0)))


@dataclass
class QueueOutcome:
    """What :meth:`WaitQueue.schedule` did with one entry: started (``allocation`` booked in
    the ledger) or failed (``error``: e.g. the user's quota no longer allows it). Either way
    the entry has left the queue."""

    entry: QueueEntry
    allocation: Allocation | None = None
    error: PlacementError | None = None


class WaitQueue:
    """Fair wait queue over one :class:`~.ledger.Ledger`.

    Args:
        ledger: the ledger that books what starts.
        group_weights: group name -> weight (> 0) of its members' fair share; a user's weight
            is the largest of the user's groups, 1.0 when none is listed.
        max_bypass: how many later entries may start ahead of a blocked head on nodes that
            could take it, before one of them is reserved for it (0 = reserve at once).
        clock: seconds since the epoch.

    Raises:
        ValueError: a weight <= 0 or a negative ``max_bypass``.
    """

    def __init__(self, ledger: Ledger, *, group_weights: Mapping[str, float] | None = None,
                 max_bypass: int = 3, clock: Callable[[], float] = now) -> None:
        weights = dict(group_weights or {})
        for g, w in weights.items():
            if not w > 0:
                raise ValueError(f"group_weights.{g}: must be > 0, got {w!r}")
        if max_bypass < 0:
            raise ValueError(f"max_bypass: must be >= 0, got {max_bypass}")
        self.ledger = ledger
        self.group_weights = weights
        self.max_bypass = max_bypass
        self._clock = clock
        self._entries: dict[str, QueueEntry] = {}
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)
        #: (bundle, nodes tried) -> ``ledger.grown`` when the ledger refused it there: until
        #: something grows, the same try is refused again and is not made (see _try)
        self._refused: dict[tuple[Bundle, frozenset[str], str], int] = {}
        #: user -> decayed past usage (set_past_usage); empty: fair share over time is off
        self._past: dict[str, float] = {}

    # -- admission ----------------------------------------------------------------------------
    def check_admissible(self, bundle: Bundle, owner: Owner,
                         nodes: Iterable[str] | None = None,
                         quotas: QuotaTable | None = None) -> None:
        """Refuse what waiting could never help: over quota now, or no usable node (up, its
        drained GPUs left out) could hold the bundle even with nothing else running.

        Raises:
            QuotaExceeded: over a user or group quota (counting what the user holds now).
            PlacementRefused: the capacity can never hold it; ``reason`` is ``never`` or the
                ledger's key (``no_gpu_model``, ``too_large``, ``no_nodes``).
        """
        self.ledger.check_quota(bundle, owner, quotas)
        problem = self.ledger.capacity_refusal(bundle, nodes)
        if problem is not None:
            raise problem

    # -- entries ------------------------------------------------------------------------------
    def add(self, owner: Owner, bundle: Bundle, *, profile: str = "",
            nodes: Iterable[str] = (), options: Mapping[str, Any] | None = None,
            quotas: QuotaTable | None = None, priority: int = 0) -> QueueEntry:
        """Queue a spawn, or claim the entry a restored queue kept for the same user and
        server (keeping its place; the bundle, options, quota table and priority are the new
        ones). ``priority``: higher starts first (see the module's docstring).

        Raises:
            PlacementError: that server already has a claimed entry (a second spawn of it).
        """
        old = self.find(owner.user, owner.server)
        if old is not None:
            if old.claimed:
                raise PlacementError(f"server {owner.user}/{owner.server} is already waiting "
                                     "in the queue")
            old.claimed, old.owner, old.bundle = True, owner, bundle
            old.profile, old.nodes, old.options = profile, tuple(nodes), dict(options or {})
            old.quotas, old.priority = quotas, priority
            return old
        self.ledger.observe(bundle)  # one arrival, however often schedule() retries it
        e = QueueEntry(id=f"q{next(self._ids)}-{int(self._clock() * 1000) % 10**9}",
                       owner=owner, bundle=bundle, profile=profile, nodes=tuple(nodes),
                       options=dict(options or {}), enqueued=self._clock(),
                       seq=next(self._seq), quotas=quotas, priority=priority)
        self._entries[e.id] = e
        return e

    def remove(self, entry_id: str) -> QueueEntry | None:
        """Take an entry out (cancelled, timed out); None if it is not queued."""
        return self._entries.pop(entry_id, None)

    def get(self, entry_id: str) -> QueueEntry | None:
        """The entry with this id, or None."""
        return self._entries.get(entry_id)

    def find(self, user: str, server: str = "") -> QueueEntry | None:
        """The entry of one user's server, or None."""
        return next((e for e in self._entries.values()
                     if e.owner.user == user and e.owner.server == server), None)

    def __len__(self) -> int:
        return len(self._entries)

    # -- order --------------------------------------------------------------------------------
    def weight(self, owner: Owner) -> float:
        """The owner's DRF weight: the largest weight of its groups, else 1.0."""
        ws = [self.group_weights[g] for g in owner.groups if g in self.group_weights]
        return max(ws) if ws else 1.0

    def dominant_share(self, held: Usage, capacity: Usage | None = None) -> float:
        """max over GPU, cores and memory of ``held / capacity`` (dimensions with no capacity
        are left out), in 0..1 (more when over). NSDI '11, §4.1."""
        cap = capacity or self.ledger.capacity()
        shares = [h / c for h, c in ((held.gpu_milli, cap.gpu_milli), (held.cores, cap.cores),
                                     (held.memory_bytes, cap.memory_bytes)) if c > 0]
        return max(shares, default=0.0)

    def set_past_usage(self, past: Mapping[str, float]) -> None:
        """Set each user's decayed past usage (>= 0, one unit for all users; see the module's
        docstring). An empty mapping turns fair share over time off.

        Raises:
            ValueError: a negative amount.
        """
        for u, v in past.items():
            if not v >= 0:
                raise ValueError(f"past usage of {u!r}: must be >= 0, got {v!r}")
        self._past = dict(past)

    @property
    def past_usage(self) -> dict[str, float]:
        """A copy of the decayed past usage set (:meth:`set_past_usage`); empty: off."""
        return dict(self._past)

    def fairshare_factors(self) -> dict[str, float]:
        """User -> :meth:`fairshare_factor` of every user waiting (their first entry's
        owner), in one pass."""
        owners: dict[str, Owner] = {}
        for e in sorted(self._entries.values(), key=lambda e: e.seq):
            owners.setdefault(e.owner.user, e.owner)
        return {u: self.fairshare_factor(o) for u, o in owners.items()}

    def fairshare_factor(self, owner: Owner) -> float:
        """Slurm's classic fair-share factor ``2 ** (-U / S)`` in (0, 1] of ``owner`` (1.0 when
        no past usage is set or nobody has any): ``U`` the owner's share of the past usage
        set, ``S`` its weight over the weights of the users with past usage or waiting."""
        total = sum(self._past.values())
        if total <= 0:
            return 1.0
        weights = {e.owner.user: self.weight(e.owner) for e in self._entries.values()}
        for u in self._past:
            weights.setdefault(u, 1.0)
        weights[owner.user] = self.weight(owner)
        s = weights[owner.user] / sum(weights.values())
        return 2.0 ** (-(self._past.get(owner.user, 0.0) / total) / s)

    def order(self) -> list[QueueEntry]:
        """Entries in the order they get to start: the higher priorities first; within one
        priority, repeatedly the user with the smallest weighted dominant share (holdings now
        plus the bundles already ordered before), ties by the user's earliest entry; each
        user's entries first come first served.

        O(E log U) for E entries of U users.
        """
        cap = self.ledger.capacity()
        projected: dict[str, Usage] = {}
        levels: dict[int, list[QueueEntry]] = {}
        for e in self._entries.values():
            levels.setdefault(e.priority, []).append(e)
        out: list[QueueEntry] = []
        for level in sorted(levels, reverse=True):
            out += self._drf_order(levels[level], cap, projected)
        return out

    def _drf_order(self, entries: list[QueueEntry], cap: Usage,
                   projected: dict[str, Usage]) -> list[QueueEntry]:
        """Weighted DRF order of ``entries`` (one priority); ``projected`` (user -> usage
        counted so far, the ledger's when absent) grows by each entry ordered."""
        by_user: dict[str, list[QueueEntry]] = {}
        for e in sorted(entries, key=lambda e: e.seq):
            by_user.setdefault(e.owner.user, []).append(e)
        for u in by_user:
            if u not in projected:
                projected[u] = self.ledger.usage(u)
        fs = {u: 1.0 - self.fairshare_factor(es[0].owner) for u, es in by_user.items()}
        heap = [(self.dominant_share(projected[u], cap) / self.weight(es[0].owner) + fs[u],
                 es[0].seq, u) for u, es in by_user.items()]
        heapq.heapify(heap)
        pos = dict.fromkeys(by_user, 0)
        out: list[QueueEntry] = []
        while heap:
            _, _, u = heapq.heappop(heap)
            es = by_user[u]
            e = es[pos[u]]
            out.append(e)
            pos[u] += 1
            b = e.bundle
            projected[u] = projected[u] + Usage(b.total_gpu_milli, b.cores, b.memory_bytes)
            if pos[u] < len(es):
                nxt = es[pos[u]]
                heapq.heappush(heap, (self.dominant_share(projected[u], cap) / self.weight(
                    nxt.owner) + fs[u], nxt.seq, u))
        return out

    def position(self, entry_id: str) -> tuple[int, int]:
        """(1-based position in :meth:`order`, entries in all); (0, n) when not queued."""
        order = self.order()
        for i, e in enumerate(order, 1):
            if e.id == entry_id:
                return i, len(order)
        return 0, len(order)

    def count_by_profile(self) -> dict[str, int]:
        """Profile slug -> entries waiting for it."""
        out: dict[str, int] = {}
        for e in self._entries.values():
            out[e.profile] = out.get(e.profile, 0) + 1
        return out

    # -- starting -----------------------------------------------------------------------------
    def schedule(self) -> list[QueueOutcome]:
        """Start what can start now, in :meth:`order`, with bounded backfill behind a blocked
        head (see the module's docstring). Started and failed entries leave the queue; their
        allocations are booked in the ledger.

        Bounded: at most one pass over the entries per entry that leaves; an empty queue
        returns at once (no pass, no look at the ledger).
        """
        outcomes: list[QueueOutcome] = []
        if not self._entries:
            return outcomes
        for _ in range(len(self._entries) + 1):
            moved = self._one_pass(outcomes)
            if not moved:
                break
        return outcomes

    def _one_pass(self, outcomes: list[QueueOutcome]) -> bool:
        head: QueueEntry | None = None
        protected: set[str] = set()  # the nodes that could take the head
        reserved: str | None = None  # the one kept for it once it was passed max_bypass times
        usable = self.ledger.usable_nodes()
        for e in self.order():
            own = set(e.nodes) & usable if e.nodes else set(usable)
            if head is None:
                if not e.claimed:
                    head, protected = e, self.ledger.nodes_that_could_take(e.bundle, e.nodes)
                    continue
                done = self._try(e, own, outcomes)
                if done is not None:
                    return True
                head, protected = e, self.ledger.nodes_that_could_take(e.bundle, e.nodes)
                continue
            if not e.claimed:
                continue
            # a restored head whose spawn has not come back yet is passed by nobody: the
            # order a hub restart kept must not depend on which re-spawn arrives first
            may_pass = head.claimed and head.bypassed < self.max_bypass
            if may_pass:
                allowed = own
            elif head.claimed:  # past its bound: one node is kept for it
                if reserved is None:
                    reserved = self.ledger.closest_node(
                        head.bundle, protected,
                        self.ledger.share_user(head.bundle, head.owner.user))
                allowed = own - {reserved}
            else:
                allowed = own - protected
            if not allowed:
                continue
            done = self._try(e, allowed, outcomes)
            if done is None:
                continue
            if may_pass and done.allocation is not None and done.allocation.node in protected:
                head.bypassed += 1
            return True
        return False

    def _try(self, e: QueueEntry, allowed: set[str],
             outcomes: list[QueueOutcome]) -> QueueOutcome | None:
        """Reserve ``e`` on ``allowed``; the outcome if it left the queue, None if it waits."""
        if not allowed:
            return None
        # the user too where a GPU's shares serve one user (Ledger.set_one_user_shares): a
        # share refused to bob may fit ann's GPU
        key = (e.bundle, frozenset(allowed),
               e.owner.user if e.bundle.gpu_milli and self.ledger.one_user_share_nodes else "")
        grown = self.ledger.grown
        try:
            if self._refused.get(key) == grown:
                # refused on these nodes since nothing grew: bookings only shrink nodes, so
                # the ledger would refuse again; only the checks it makes before placing
                # (one allocation per server, quotas) can answer otherwise
                if self.ledger.find(e.owner.user, e.owner.server) is not None:
                    raise PlacementError(f"server {e.owner.user}/{e.owner.server} already "
                                         "holds an allocation")
                self.ledger.check_quota(e.bundle, e.owner, e.quotas)
                return None
            alloc = self.ledger.reserve(e.bundle, e.owner, nodes=allowed, explain=False,
                                        observe=False, quotas=e.quotas)
        except PlacementRefused:
            if len(self._refused) > 100_000:
                self._refused.clear()
            self._refused[key] = grown
            return None
        except PlacementError as err:  # the quota no longer allows it, or already holds one
            out = QueueOutcome(e, error=err)
        else:
            out = QueueOutcome(e, allocation=alloc)
        self._entries.pop(e.id, None)
        outcomes.append(out)
        return out

    # -- persistence --------------------------------------------------------------------------
    def to_list(self) -> list[dict[str, Any]]:
        """Every entry, in seq order, JSON-ready (for the queue file)."""
        return [e.to_dict() for e in sorted(self._entries.values(), key=lambda e: e.seq)]

    def restore(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """Load entries kept by an earlier hub process, unclaimed, holding their places (their
        ``seq`` and ``enqueued`` kept; new entries come after them). Returns the problems of
        records that could not be read (each skipped), e.g. ``"queue[2]: 'user'"``.
        """
        problems: list[str] = []
        t = self._clock()
        top = 0
        for i, r in enumerate(records):
            try:
                e = QueueEntry.from_dict(r)
            except (KeyError, TypeError, ValueError) as err:
                problems.append(f"queue[{i}]: {err}")
                continue
            if self.find(e.owner.user, e.owner.server) is not None:
                problems.append(f"queue[{i}]: {e.owner.user}/{e.owner.server} twice")
                continue
            e.claimed, e.restored_at = False, t
            self._entries[e.id] = e
            top = max(top, e.seq)
        if top:
            current = next(self._seq)
            self._seq = itertools.count(max(current, top + 1))
        return problems

    def expire_unclaimed(self, grace_s: float) -> list[QueueEntry]:
        """Drop restored entries that no spawn claimed within ``grace_s`` seconds."""
        t = self._clock()
        gone = [e for e in self._entries.values()
                if not e.claimed and t - e.restored_at >= grace_s]
        for e in gone:
            del self._entries[e.id]
        return gone

    def gpus_wanted(self, entry: QueueEntry) -> str:
        """What the entry waits for in words, e.g. ``"2 x A100"``, ``"0.25 GPU"`` or
        ``"1 x MIG 1g.10gb"``; "" for no GPU."""
        b = entry.bundle
        models = "|".join(b.gpu_models) if b.gpu_models else "GPU"
        if b.gpus:
            return f"{b.gpus} x {models}"
        if b.gpu_milli:
            return f"{b.gpu_milli / GPU_MILLI:g} {models}"
        if b.mig:
            return f"{b.mig_count} x MIG {b.mig}"
        return ""
