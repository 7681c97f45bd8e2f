"""The atomic ledger: the one record of which device of which node belongs to whom.

``reserve`` takes every resource of a bundle or none of them, in one step under one lock, with
the quota check in the same step. ``release`` gives them back. ``restore`` rebuilds the record
after a hub restart from allocations read back from containers, refusing (and reporting) any
that would double-book. The lock is a ``threading.RLock`` and no method awaits while holding it,
so the ledger is safe for threads and for asyncio tasks alike (a decision takes micro- to
milliseconds, see ``benchmarks/placement.py``).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .devices import plan, quick_fit
from .errors import (
    PlacementError,
    PlacementRefused,
    UnknownAllocation,
)
from .fragmentation import FragmentationModel
from .ledger_capacity import LedgerCapacity, explain_refusal
from .ledger_health import NODE_STATES, LedgerHealth
from .ledger_index import IndexMaintenance, LedgerIndex, affinity_tag, node_profile
from .ledger_restore import LedgerRestore
from .model import GPU_MILLI, Allocation, Bundle, GPUShare, MigShare, Node, Owner, now
from .policies import (
    DEFAULT_POLICY,
    MEMORY_POLICIES,
    POLICIES,
    Choice,
    NodeFilter,
    get_policy,
    pod_type_of,
)
from .prior import LivePrior
from .quota import QuotaTable, Usage
from .state import NodeState, Plan
from .workload import PodType

__all__ = ["Ledger", "NODE_STATES", "POLICIES", "DEFAULT_POLICY"]


def _usage(a: Allocation) -> Usage:
    return Usage(a.total_gpu_milli, len(a.cpuset), a.memory_bytes, a.disk_bytes, 1)


def _bundle_usage(b: Bundle) -> Usage:
    return Usage(b.total_gpu_milli, b.cores, b.memory_bytes, b.disk_bytes, 1)


class Ledger(LedgerCapacity, LedgerRestore, LedgerHealth, IndexMaintenance):
    """Placement state of a set of nodes.

    Args:
        nodes: the nodes (names must be unique).
        policy: node-selection policy name, one of :data:`POLICIES` (default
            :data:`DEFAULT_POLICY`, ``fgd-mem-lookahead``).
        quotas: user and group quotas; None = no quotas.
        seed: seed of the ``random`` policy's generator.
        clock: returns seconds since the epoch (``Allocation.created``).
        workload: the target workload of ``fgd``, ``[(PodType, frequency)]`` (e.g.
            :func:`~.workload.typical_pods` or :meth:`~.prior.LivePrior.workload`); None = learn
            it from the bundles this ledger sees (see
            :class:`~.fragmentation.FragmentationModel`).
        prior: a :class:`~.prior.LivePrior` to feed: every granted bundle and every restored
            allocation is recorded in it, and ``fgd``'s workload is re-read from it every
            ``prior_refresh_s`` seconds of ``clock`` (at the first reservation too); ignored
            when ``workload`` is given.
        prior_refresh_s: see ``prior``.

    Raises:
        ValueError: duplicate node names or an unknown policy.
    """

    def __init__(self, nodes: Iterable[Node], policy: str = DEFAULT_POLICY, *,
                 quotas: QuotaTable | None = None, seed: int | None = None,
                 clock: Callable[[], float] = now,
                 workload: list[tuple[PodType, float]] | None = None,
                 prior: LivePrior | None = None, prior_refresh_s: float = 3600.0) -> None:
        self._lock = threading.RLock()
        self.policy_name = policy
        self._policy = get_policy(policy)
        self.quotas = quotas or QuotaTable()
        self._clock = clock
        self._c = LedgerIndex(rng=random.Random(seed), frag=FragmentationModel(
            workload, memory_aware=policy in MEMORY_POLICIES))
        self.prior = prior if workload is None else None
        self._prior_refresh_s = prior_refresh_s
        self._prior_read: float | None = None
        self._by_name: dict[str, NodeState] = self._c.by_name
        self._allocs: dict[str, Allocation] = {}
        self._by_owner: dict[tuple[str, str], str] = {}
        self._user_used: dict[str, Usage] = {}
        self._group_used: dict[str, Usage] = {}
        #: node name -> (state, reason) for nodes that take no new placements
        self._node_state: dict[str, tuple[str, str]] = {}
        #: GPU UUID -> (node, reason, milli held): drained GPUs; their free capacity is held
        #: so no new placement gets it, while allocations already there keep theirs
        self._drained: dict[str, list[Any]] = {}
        #: (node, drained GPU UUIDs) -> that node with nothing booked (capacity checks)
        self._empty_cache: dict[tuple[str, frozenset[str]], NodeState] = {}
        #: (nodes added, node states, drained GPUs) -> capacity(): the wait queue asks for it
        #: at every order() and it is O(GPUs) to add up; nodes are never removed
        self._capacity_cache: tuple[tuple[int, frozenset[str], frozenset[str]], Usage] | None
        self._capacity_cache = None
        self._grown = 0
        #: the nodes whose GPU shares serve one user per GPU (:meth:`set_one_user_shares`)
        self._one_user: list[NodeState] = []
        self._one_user_names: frozenset[str] = frozenset()
        #: node name -> its allocations (id -> allocation, in booking order), what
        #: :meth:`snapshot` reads to rebuild one node without walking every allocation
        self._node_allocs: dict[str, dict[str, Allocation]] = {}
        #: :meth:`snapshot`'s node dicts in configuration order; one is never changed once
        #: made: a node that changed gets a new dict (copy-on-write)
        self._snap: list[dict[str, Any]] = []
        #: names of the nodes whose dict in ``_snap`` is stale (set under the lock by every
        #: change a snapshot shows: bookings, releases, node states, drains, new nodes)
        self._snap_dirty: set[str] = set()
        #: called ``(event, allocation)`` after each change of what is booked, under the
        #: ledger's lock: ``"book"`` (reserve, restore), ``"adopt"`` (the same allocation
        #: now names other devices), ``"release"``; an observer's exception is logged, never
        #: raised (the hub's usage records, :mod:`gpuspawner.usage`)
        self.observers: list[Callable[[str, Allocation], None]] = []
        for n in nodes:
            self.add_node(n)

    # -- nodes -------------------------------------------------------------------------------
    def add_node(self, node: Node) -> None:
        """Add a node with nothing booked on it.

        Raises:
            ValueError: a node of that name exists.
        """
        with self._lock:
            if node.name in self._by_name:
                raise ValueError(f"duplicate node name {node.name!r}")
            st = NodeState(node, order=len(self._c.states))
            self._c.states.append(st)
            self._c.profiles.setdefault(node_profile(st), st)
            self._by_name[node.name] = st
            self._rebucket(st)
            self._snap_dirty.add(node.name)

    @property
    def grown(self) -> int:
        """A counter bumped whenever a node may fit more than before: added, something
        released on it (``release``, ``adopt``, ``restore(replace=True)``), back up, a GPU
        undrained. Bookings, drains and nodes going down never bump it, so a bundle that did
        not fit (on some nodes) while it had one value does not fit there while it keeps it
        (what the wait queue uses to skip tries that cannot succeed)."""
        return self._grown

    def node(self, name: str) -> Node:
        """The node of that name. Raises KeyError."""
        return self._by_name[name].node

    @property
    def nodes(self) -> list[Node]:
        """All nodes, in configuration order."""
        return [st.node for st in self._c.states]

    def set_one_user_shares(self, names: Iterable[str]) -> None:
        """Mark the nodes whose GPU shares serve one hub user per GPU (all others unmarked):
        nodes whose shares run under gpuspawner's MPS control daemons (``gpu_share:
        mps-daemon``), where the MPS clients of one GPU share its daemon's IPC namespace
        (docs/gpu-sharing.md, MPS). On them a GPU holding shares of one user is no candidate
        for another user's share (:func:`~.devices.share_blocked`), in the choice of the node
        and of the GPU: :meth:`reserve` goes to another GPU or node, or refuses (the wait
        queue keeps the request). Whole GPUs and MIG instances are unaffected. Allocations
        already booked stay as they are.

        Raises:
            KeyError: a name that is not a node of the ledger.
        """
        names = set(names)
        with self._lock:
            unknown = names - set(self._by_name)
            if unknown:
                raise KeyError(f"no node {sorted(unknown)[0]!r}")
            loosened = any(st.one_user_shares and st.name not in names
                           for st in self._c.states)
            for st in self._c.states:
                st.one_user_shares = st.name in names
            self._one_user = [st for st in self._c.states if st.one_user_shares]
            self._one_user_names = frozenset(names)
            if loosened:  # a share refused there may fit now
                self._grown += 1

    @property
    def one_user_share_nodes(self) -> frozenset[str]:
        """Names of the nodes marked by :meth:`set_one_user_shares`."""
        return self._one_user_names

    def share_user(self, bundle: Bundle, user: str) -> str | None:
        """``user`` when the one-user-per-GPU rule can change where ``bundle`` goes for them
        (a share, and a marked node has a GPU with another user's shares), else None: the
        owner need not be known to place it. O(marked nodes' GPUs with shares)."""
        if not bundle.gpu_milli or not self._one_user:
            return None
        with self._lock:
            for st in self._one_user:
                for users in st.share_users.values():
                    if len(users) > 1 or user not in users:
                        return user
        return None

    def _choose(self, bundle: Bundle, spill: bool, ok: NodeFilter | None,
                user: str | None) -> Choice | None:
        """The policy's choice; with ``user`` (:meth:`share_user`) only among the nodes where
        that user's share has a GPU under the one-user rule, and on a marked node the devices
        planned for that user (the policy's own plan may name another user's GPU)."""
        if user is None:
            return self._policy(self._c, bundle, spill, ok)
        plans: dict[str, Plan | None] = {}

        def mine(st: NodeState) -> bool:
            if ok is not None and not ok(st):
                return False
            if not st.one_user_shares:
                return True
            if st.name not in plans:
                plans[st.name] = (plan(st, bundle, spill, user)
                                  if quick_fit(st, bundle, not spill, user) else None)
            return plans[st.name] is not None

        got = self._policy(self._c, bundle, spill, mine)
        if got is not None and got[0].one_user_shares:
            st = got[0]
            p = plans.get(st.name) or plan(st, bundle, spill, user)
            got = (st, p) if p is not None else None
        return got

    def set_workload(self, workload: list[tuple[PodType, float]] | None) -> None:
        """Set the target workload of ``fgd`` (``[(PodType, frequency)]``, frequencies summing
        to 1), e.g. ``LivePrior.workload()`` once a day; None = learn it online again."""
        with self._lock:
            self._c.frag.set_workload(workload)

    @property
    def workload(self) -> list[tuple[PodType, float]]:
        """The target workload ``fgd`` uses now."""
        return list(self._c.frag.workload)

    def set_policy(self, name: str) -> None:
        """Switch the node-selection policy. Raises ValueError for an unknown name."""
        fn = get_policy(name)
        with self._lock:
            self._policy, self.policy_name = fn, name
            mem = name in MEMORY_POLICIES
            if mem != self._c.frag.memory_aware:
                self._c.frag.set_memory_aware(mem)
                self._rebucket_all()

    # -- queries -----------------------------------------------------------------------------
    def allocations(self, user: str | None = None) -> list[Allocation]:
        """All allocations, or one user's, oldest first."""
        with self._lock:
            out = [a for a in self._allocs.values() if user is None or a.owner.user == user]
        return sorted(out, key=lambda a: (a.created, a.id))

    def get(self, allocation_id: str) -> Allocation | None:
        """The allocation with that id, or None."""
        return self._allocs.get(allocation_id)

    def find(self, user: str, server: str = "") -> Allocation | None:
        """The allocation held by one user's server, or None."""
        with self._lock:
            aid = self._by_owner.get((user, server))
            return self._allocs.get(aid) if aid else None

    def usage(self, user: str) -> Usage:
        """What one user holds now."""
        return self._user_used.get(user, Usage())

    def group_usage(self, group: str) -> Usage:
        """What all members of a group hold now (allocations made while they were members)."""
        return self._group_used.get(group, Usage())

    def quota_remaining(self, user: str, groups: Iterable[str] = (),
                        quotas: QuotaTable | None = None) -> dict[str, int | None]:
        """What the user may still take of each resource; None = unlimited (see QuotaTable).
        ``quotas``: the request's own table (a JupyterHub ``group_overrides`` of ``quotas``)
        instead of the ledger's."""
        with self._lock:
            return (quotas or self.quotas).remaining(user, tuple(groups), self.usage(user),
                                                     self._group_used)

    def observe(self, bundle: Bundle) -> None:
        """Count ``bundle`` as one arriving request of ``fgd``'s online workload model (what
        :meth:`reserve` does unless ``observe=False``)."""
        with self._lock:
            self._c.frag.observe(pod_type_of(bundle), bundle.memory_bytes >> 20)

    def check_quota(self, bundle: Bundle, owner: Owner,
                    quotas: QuotaTable | None = None) -> None:
        """Raise :class:`QuotaExceeded` if ``bundle`` would take ``owner`` (or one of its
        groups) over a quota of ``quotas`` (None: the ledger's), counting what they hold now;
        nothing is booked."""
        with self._lock:
            (quotas or self.quotas).check(owner.user, owner.groups, _bundle_usage(bundle),
                                          self.usage(owner.user), self._group_used)

    # -- capacity (what could ever fit: the wait queue's admission) ---------------------------
    # -- reserve / release ---------------------------------------------------------------------
    def reserve(self, bundle: Bundle, owner: Owner, nodes: Iterable[str] | None = None, *,
                explain: bool = True, observe: bool = True,
                quotas: QuotaTable | None = None, notify: bool = True) -> Allocation:
        """Book every resource of ``bundle`` for ``owner`` on one node, or nothing.

        Args:
            bundle: what to book.
            owner: user, server name and the user's groups (for group quotas).
            nodes: restrict the choice to these node names (a profile's node selector).
            explain: build the refusal's sentence (an O(nodes) pass over the cluster); False
                gives the reason key ``unplaced`` and a short sentence, for simulations.
            observe: count the bundle as an arriving request of the online workload model
                (False for the wait queue's retries: it counts an arrival once, in
                :meth:`observe`).
            quotas: the request's quota table instead of the ledger's (a JupyterHub
                ``group_overrides`` that sets ``quotas`` for the user's groups: a per-user
                difference is an input of the request, not a second ledger).
            notify: tell :attr:`observers` (False for a probe released at once with
                ``release(..., notify=False)``).

        Returns:
            The allocation (already booked).

        Raises:
            QuotaExceeded: a user or group quota would be exceeded (nothing booked).
            PlacementRefused: no node has the devices free now; the message says what is
                missing, the closest node and what the quota still allows.
            PlacementError: the owner's server already holds an allocation.
        """
        allowed = set(nodes) if nodes is not None else None
        with self._lock:
            if self._node_state:  # nodes that are down or drained take nothing new
                if allowed is None:
                    allowed = set(self._by_name)
                allowed -= set(self._node_state)
            ok = (lambda st: st.node.name in allowed) if allowed is not None else None
            key = (owner.user, owner.server)
            if key in self._by_owner:
                raise PlacementError(
                    f"server {owner.user}/{owner.server} already holds allocation "
                    f"{self._by_owner[key]}; release it first")
            (quotas or self.quotas).check(owner.user, owner.groups, _bundle_usage(bundle),
                                          self.usage(owner.user), self._group_used)
            if observe:
                self._c.frag.observe(pod_type_of(bundle), bundle.memory_bytes >> 20)
            if self.prior is not None:
                t = self._clock()
                if self._prior_read is None or t - self._prior_read >= self._prior_refresh_s:
                    self._prior_read = t
                    self._c.frag.set_workload(self.prior.workload(t))
            choice = None
            user = self.share_user(bundle, owner.user)  # one user's shares per GPU
            if bundle.numa_policy != "none":
                choice = self._choose(bundle, False, ok, user)
            if choice is None and bundle.numa_policy != "strict":
                choice = self._choose(bundle, True, ok, user)
            if choice is None:
                if not explain:
                    raise PlacementRefused("unplaced", f"no node can take {bundle.describe()} "
                                           "now")
                raise self._refusal(bundle, owner, allowed)
            st, p = choice
            alloc = self._allocation(bundle, owner, st, p)
            self._book(st, alloc, notify=notify)
            if self.prior is not None:
                self.prior.record_bundle(bundle, alloc.created)
            return alloc

    def _allocation(self, bundle: Bundle, owner: Owner, st: NodeState, p: Plan) -> Allocation:
        mems = tuple(sorted(n for n, _ in p.memory_by_numa))
        return Allocation(
            id=Allocation.new_id(), owner=owner, node=st.name,
            gpus=tuple(GPUShare(u, m) for u, m in p.gpus),
            cpuset=tuple(sorted(p.cpus)), mems=mems,
            memory_bytes=bundle.memory_bytes, disk_bytes=bundle.disk_bytes,
            memory_by_numa=tuple(sorted(p.memory_by_numa)),
            created=self._clock(), numa_aligned=p.aligned, note=p.note,
            mig=tuple(MigShare(u, st.mig_by_uuid[u].gpu, st.mig_by_uuid[u].profile,
                               st.mig_by_uuid[u].slices) for u in p.mig),
        )

    def _notify(self, event: str, alloc: Allocation) -> None:
        for fn in list(self.observers):
            try:
                fn(event, alloc)
            except Exception:  # an observer never undoes or refuses a booking
                logging.getLogger("gpuspawner").exception(
                    "ledger observer failed on %s of %s", event, alloc.id)

    def _book(self, st: NodeState, alloc: Allocation, notify: bool = True) -> None:
        old = self._bucket_key(st)
        st.book(alloc)
        self._rebucket(st, old, grew=False)
        self._allocs[alloc.id] = alloc
        self._node_allocs.setdefault(alloc.node, {})[alloc.id] = alloc
        self._snap_dirty.add(alloc.node)
        self._by_owner[(alloc.owner.user, alloc.owner.server)] = alloc.id
        tag = affinity_tag(alloc)
        if tag:
            aff = self._c.affinity.setdefault(alloc.node, {})
            aff[tag] = aff.get(tag, 0) + 1
        u = _usage(alloc)
        self._user_used[alloc.owner.user] = self.usage(alloc.owner.user) + u
        for g in alloc.owner.groups:
            self._group_used[g] = self.group_usage(g) + u
        if notify and self.observers:
            self._notify("book", alloc)

    def release(self, allocation_id: str, missing_ok: bool = False, *,
                notify: bool = True) -> Allocation | None:
        """Give back everything an allocation holds; returns it (None when ``missing_ok``
        and the ledger holds no such allocation). ``notify``: tell :attr:`observers`.

        Raises:
            UnknownAllocation: the ledger holds no allocation with that id (unless
                ``missing_ok``).
        """
        with self._lock:
            alloc = self._unbook(allocation_id, missing_ok)
            if alloc is not None and notify and self.observers:
                self._notify("release", alloc)
            return alloc

    def _unbook(self, allocation_id: str, missing_ok: bool = False) -> Allocation | None:
        """:meth:`release` without telling the observers (``adopt`` rebooks the same one)."""
        with self._lock:
            alloc = self._allocs.pop(allocation_id, None)
            if alloc is None:
                if missing_ok:
                    return None
                raise UnknownAllocation(f"no allocation {allocation_id}")
            st = self._by_name[alloc.node]
            self._node_allocs[alloc.node].pop(allocation_id, None)
            self._snap_dirty.add(alloc.node)
            old = self._bucket_key(st)
            st.unbook(alloc)
            for g in alloc.gpus:  # a drained GPU keeps what is given back
                if g.uuid in self._drained:
                    st.gpu_used[g.uuid] += g.milli
                    self._drained[g.uuid][2] += g.milli
            st.refresh_signature()
            self._rebucket(st, old)
            self._by_owner.pop((alloc.owner.user, alloc.owner.server), None)
            tag = affinity_tag(alloc)
            aff = self._c.affinity.get(alloc.node, {})
            if tag in aff:
                aff[tag] -= 1
                if not aff[tag]:
                    del aff[tag]
            u = _usage(alloc)
            self._user_used[alloc.owner.user] = self.usage(alloc.owner.user) - u
            if self._user_used[alloc.owner.user] == Usage():
                del self._user_used[alloc.owner.user]
            for g in alloc.owner.groups:
                self._group_used[g] = self.group_usage(g) - u
                if self._group_used[g] == Usage():
                    del self._group_used[g]
            return alloc

    # -- health: nodes that take no new work, drained GPUs ------------------------------------
    # -- refusals ----------------------------------------------------------------------------
    def _refusal(self, bundle: Bundle, owner: Owner,
                 allowed: set[str] | None) -> PlacementRefused:
        states = [st for st in self._c.states if allowed is None or st.name in allowed]
        detail, reason, best = explain_refusal(states, bundle,
                                               self.share_user(bundle, owner.user))
        if self._node_state:
            detail += "; " + "; ".join(f"node {n} is {s}" + (f" ({r})" if r else "")
                                       for n, (s, r) in sorted(self._node_state.items()))
        if bundle.total_gpu_milli and self._drained:
            names = {st.name for st in states}
            drained = [(d[0], u, d[1]) for u, d in self._drained.items() if d[0] in names]
            if drained:
                detail += "; drained: " + "; ".join(f"GPU {u} on {n} ({r})"
                                                    for n, u, r in sorted(drained))
        left = self.quotas.remaining(owner.user, owner.groups, self.usage(owner.user),
                                     self._group_used)
        if bundle.total_gpu_milli and left["gpu_milli"] is not None:
            n = left["gpu_milli"] / GPU_MILLI
            detail += f"; your quota allows {n:g} more GPU" + ("" if n == 1 else "s")
        return PlacementRefused(reason, detail, best)
