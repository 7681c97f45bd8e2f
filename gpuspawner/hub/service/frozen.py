"""A copy of what the admin map and the metrics read from the hub's cluster, taken on the event
loop in one go, so that the formatting (about 1,000 table rows and 340 GPU cells at 1,000
servers: tens of milliseconds, growing with the servers) runs in a worker thread without
reading the ledger while spawns change it.

The copy is consistent: it is taken by one synchronous call on the loop, where every change of
the ledger happens, so no booking or release falls between two of its reads. It holds the
ledger's own snapshot (:meth:`~gpuspawner.placement.Ledger.snapshot`: a new list of node dicts
that the ledger never changes, a changed node getting a new one), the list of
allocations (frozen objects), each holder's :class:`~gpuspawner.placement.Usage` (frozen), and
copies of the drains, health readings, moves and queue order. What it costs on the loop is the
ledger's snapshot plus a dict lookup per user and group.

:class:`FrozenCluster` answers the parts of :class:`~gpuspawner.hub.cluster.Cluster` that
:func:`~gpuspawner.hub.service.views.map_view`, :func:`~gpuspawner.hub.service.views.node_views`
(``api/nodes``) and :class:`~gpuspawner.hub.metrics.ClusterCollector` read, so they run
unchanged on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...placement import Allocation, Usage

__all__ = ["FrozenCluster", "FrozenLedger", "FrozenQueue"]


class FrozenLedger:
    """The read side of a :class:`~gpuspawner.placement.Ledger` at one moment.

    Args:
        ledger: the hub's ledger (read now, on the event loop).
        usage: also copy each holder's and group's usage (the admin map needs it, the
            metrics do not).
        allocations: also copy the list of allocations (sorted: O(n log n) in the
            allocations; ``api/nodes`` reads none, so it passes False and gets an empty list;
            :class:`FrozenCluster` then copies no usage either).
    """

    def __init__(self, ledger: Any, usage: bool = True, allocations: bool = True) -> None:
        self._nodes = ledger.snapshot()
        self._allocations: list[Allocation] = (list(ledger.allocations()) if allocations
                                               else [])
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
        """The ledger's snapshot as it was (the same list each call). Its node dicts are the
        ledger's own, shared with its later snapshots: readers must not change them (copy
        what they change, as :func:`~gpuspawner.hub.service.views.node_views` does)."""
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
        usage, allocations: see :class:`FrozenLedger`.
    """

    def __init__(self, cluster: Any, usage: bool = True, allocations: bool = True) -> None:
        self.ledger = FrozenLedger(cluster.ledger, usage=usage and allocations,
                                   allocations=allocations)
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


def freeze_all(clusters: Iterable[Any], usage: bool = False) -> list[FrozenCluster]:
    """:class:`FrozenCluster` of each of ``clusters`` (the metrics' collector: no usage)."""
    return [FrozenCluster(c, usage=usage) for c in clusters]
