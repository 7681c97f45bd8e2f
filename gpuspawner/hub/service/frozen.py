"""A copy of what the admin map and the metrics read from the hub's cluster, taken on the event
loop in one go, so that the formatting (about 1,000 table rows and 340 GPU cells at 1,000
servers: tens of milliseconds, growing with the servers) runs in a worker thread without
reading the ledger while spawns change it.

The copy is consistent: it is taken by one synchronous call on the loop, where every change of
the ledger happens, so no booking or release falls between two of its reads. It holds the
ledger's own snapshot (:meth:`~gpuspawner.placement.Ledger.snapshot`: new dicts), the list of
allocations (frozen objects), each holder's :class:`~gpuspawner.placement.Usage` (frozen), and
copies of the drains, health readings, moves and queue order. What it costs on the loop is the
ledger's snapshot plus a dict lookup per user and group.

:class:`FrozenCluster` answers the parts of :class:`~gpuspawner.hub.cluster.Cluster` that
:func:`~gpuspawner.hub.service.views.map_view` and
:class:`~gpuspawner.hub.metrics.ClusterCollector` read, so both run unchanged on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...placement import Allocation, Usage

__all__ = ["FrozenCluster", "FrozenLedger", "FrozenQueue", "MapCache", "freeze_all",
           "map_signature"]


class FrozenLedger:
    """The read side of a :class:`~gpuspawner.placement.Ledger` at one moment.

    Args:
        ledger: the hub's ledger (read now, on the event loop).
        usage: also copy each holder's and group's usage (the admin map needs it, the
            metrics do not).
    """

    def __init__(self, ledger: Any, usage: bool = True) -> None:
        self._nodes = ledger.snapshot()
        self._allocations: list[Allocation] = list(ledger.allocations())
        self.quotas = ledger.quotas
        self.policy_name = ledger.policy_name
        self._usage: dict[str, Usage] = {}
        self._group_usage: dict[str, Usage] = {}
        if usage:
            users = {a.owner.user for a in self._allocations} | set(self.quotas.users)
            self._usage = {u: ledger.usage(u) for u in users}
            groups = set(self.quotas.groups)
            groups.update(g for a in self._allocations for g in a.owner.groups)
            self._group_usage = {g: ledger.group_usage(g) for g in groups}

    def snapshot(self) -> list[dict[str, Any]]:
        """The ledger's snapshot as it was (the same list each call: its reader may change
        it, as it may change a snapshot of the ledger)."""
        return self._nodes

    def allocations(self, user: str | None = None) -> list[Allocation]:
        """Every allocation, or one user's, in the ledger's order."""
        if user is None:
            return list(self._allocations)
        return [a for a in self._allocations if a.owner.user == user]

    def usage(self, user: str) -> Usage:
        """What ``user`` held (nothing for a user the copy did not see)."""
        return self._usage.get(user) or Usage()

    def group_usage(self, group: str) -> Usage:
        """What the members of ``group`` held."""
        return self._group_usage.get(group) or Usage()


class FrozenQueue:
    """The wait queue's order and counts at one moment (``queue.wq.order()`` and
    ``queue.wq.count_by_profile()``, as the metrics read them)."""

    def __init__(self, queue: Any) -> None:
        self._order = list(queue.wq.order())
        self._counts = dict(queue.wq.count_by_profile())
        self.wq = self

    def order(self) -> list[Any]:
        return list(self._order)

    def count_by_profile(self) -> dict[str, int]:
        return dict(self._counts)


class FrozenCluster:
    """The read side of the hub's :class:`~gpuspawner.hub.cluster.Cluster` at one moment:
    ``ledger``, ``nodes``, ``last_health``, ``moves``, ``queue`` and ``drain_records()``.

    Args:
        cluster: the hub's cluster (read now, on the event loop).
        usage: see :class:`FrozenLedger`.
    """

    def __init__(self, cluster: Any, usage: bool = True) -> None:
        self.ledger = FrozenLedger(cluster.ledger, usage=usage)
        self.nodes = dict(cluster.nodes)
        self.last_health = dict(getattr(cluster, "last_health", {}) or {})
        self.moves = list(getattr(cluster, "moves", ()))
        queue = getattr(cluster, "queue", None)
        self.queue = FrozenQueue(queue) if queue is not None else None
        drains = getattr(cluster, "drain_records", None)
        self._drains = dict(drains()) if drains is not None else {}

    def drain_records(self) -> dict[str, Any]:
        """Drained GPUs: UUID -> record, as they were."""
        return dict(self._drains)


def map_signature(cluster: Any) -> tuple[Any, ...]:
    """What the admin map shows changes only when this changes: the allocation objects (a
    booking, release or adoption is a new object), the drained GPUs and each node's state,
    the drains' records, the latest health readings, the moves, the policy and each node's
    GPU share mechanism. It holds the objects themselves (the allocations, records and
    readings are frozen or replaced on change), so two signatures are equal when each part is
    the same object or an equal one (tuple comparison tries identity first: cheap, no
    formatting). The admin page reuses its last view while this stays the same
    (:class:`MapCache`)."""
    ledger = cluster.ledger
    moves = getattr(cluster, "moves", ())
    health = getattr(cluster, "last_health", {}) or {}
    drains = cluster.drain_records() if hasattr(cluster, "drain_records") else {}
    return (tuple(ledger.allocations()),
            tuple(sorted(ledger.drained_gpus().items())),
            tuple(ledger.node_state(n.name) for n in ledger.nodes),
            tuple(sorted(drains.items(), key=lambda kv: kv[0])),
            tuple(sorted(health.items(), key=lambda kv: kv[0])),
            tuple(moves), ledger.policy_name,
            tuple((name, getattr(rt, "gpu_share", None)) for name, rt in
                  sorted(cluster.nodes.items(), key=lambda kv: kv[0])))


class MapCache:
    """The admin map's last view and what it was made from (:func:`map_signature`), reused
    for at most ``max_age_s`` seconds while the signature is the same: admins' open pages
    refresh every few seconds, and each view made anew is thousands of objects the garbage
    collector then walks (a full collection pauses the hub).

    Args:
        max_age_s: the longest a view is reused, seconds (a bound on any change the signature
            does not see).
        clock: seconds (monotonic).
    """

    def __init__(self, max_age_s: float = 5.0, clock: Any = None) -> None:
        import time

        self.max_age_s = max_age_s
        self._clock = clock or time.monotonic
        self._entry: tuple[tuple[Any, ...], float, Any] | None = None

    def get(self, signature: tuple[Any, ...]) -> Any:
        """The view made for ``signature`` less than ``max_age_s`` ago, else None."""
        entry = self._entry
        if entry is None or entry[0] != signature or self._clock() - entry[1] > self.max_age_s:
            return None
        return entry[2]

    def put(self, signature: tuple[Any, ...], view: Any) -> None:
        """Keep ``view`` (read-only from now on) as made for ``signature``."""
        self._entry = (signature, self._clock(), view)


def freeze_all(clusters: Iterable[Any], usage: bool = False) -> list[FrozenCluster]:
    """:class:`FrozenCluster` of each of ``clusters`` (the metrics' collector: no usage)."""
    return [FrozenCluster(c, usage=usage) for c in clusters]
