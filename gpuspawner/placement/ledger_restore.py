"""Persistence of the ledger (a part of :class:`~.ledger.Ledger`): after a hub restart the record
is rebuilt from the allocations read back from the engine (:meth:`LedgerRestore.restore`),
refusing and reporting any that would double-book; :meth:`LedgerRestore.adopt` takes what the
engine granted in place of what was planned (Slurm's model mode)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from .errors import (
    PlacementError,
    RestoreConflict,
    RestoreReport,
    UnknownAllocation,
)
from .model import Allocation, GPUShare


class LedgerRestore:
    """Rebuild the record from what the engine runs.

    A part of :class:`~.ledger.Ledger` (its lock ``_lock``, node states and indexes ``_c``, and
    allocations are the ledger's), kept in its own module by concern."""

    def adopt(self, allocation_id: str, *, cpuset: Iterable[int] | None = None,
              gpus: Iterable[str] | None = None) -> Allocation:
        """Make a booked allocation name the devices an engine actually granted: Slurm cannot
        be told core ids (``sbatch`` asks for a count, the select plugin picks them) and, in
        model mode, picks the GPUs itself. The allocation keeps its id, owner, node, memory
        and disk; ``cpuset`` replaces its cores (same count; when they sit on other NUMA nodes
        than its memory, the memory moves to theirs, split by core count), ``gpus`` its GPUs
        (UUIDs, same count and models, each keeping its milli-GPU). Every new core, GPU share
        and byte of NUMA memory must be free or already this allocation's. Atomic: on refusal
        nothing changes.

        Returns:
            the allocation as booked now.

        Raises:
            UnknownAllocation: no such allocation.
            PlacementError: the granted devices do not fit (held by another allocation, other
                counts, models or NUMA nodes); the message says which.
        """
        with self._lock:
            old = self._allocs.get(allocation_id)
            if old is None:
                raise UnknownAllocation(f"no allocation {allocation_id}")
            st = self._by_name[old.node]
            new_cpus = tuple(sorted(cpuset)) if cpuset is not None else old.cpuset
            if len(new_cpus) != len(old.cpuset):
                raise PlacementError(f"adopt {old.id}: {len(new_cpus)} cores granted, "
                                     f"{len(old.cpuset)} allocated")
            unknown_cpus = [c for c in new_cpus if c not in st.cpu_numa]
            if unknown_cpus:
                raise PlacementError(f"adopt {old.id}: cores {unknown_cpus} are not on node "
                                     f"{old.node}")
            mems, by_numa = old.mems, old.memory_by_numa
            numa_of = sorted({st.cpu_numa[c] for c in new_cpus})
            if new_cpus and old.mems and set(numa_of) != set(old.mems):
                # the memory follows the cores (split by core count), where it fits
                total, n = old.memory_bytes, len(new_cpus)
                share = {m: total * sum(st.cpu_numa[c] == m for c in new_cpus) // n
                         for m in numa_of}
                share[numa_of[0]] += total - sum(share.values())
                mems, by_numa = tuple(numa_of), tuple(sorted(share.items()))
            new_gpus = old.gpus
            if gpus is not None:
                uuids = list(gpus)
                models_old = sorted(st.gpu_by_uuid[g.uuid].model for g in old.gpus)
                unknown = [u for u in uuids if u not in st.gpu_by_uuid]
                if unknown or sorted(st.gpu_by_uuid[u].model for u in uuids) != models_old:
                    raise PlacementError(f"adopt {old.id}: GPUs {uuids} are not "
                                         f"{len(old.gpus)} of the models {models_old}")
                new_gpus = tuple(GPUShare(u, g.milli) for u, g in zip(uuids, old.gpus, strict=True))
            new = replace(old, cpuset=new_cpus, gpus=new_gpus, mems=mems,
                          memory_by_numa=by_numa)
            if new == old:
                return old
            self._unbook(old.id)
            problem = self._restore_problem(new)
            if problem:
                self._book(st, old, notify=False)
                raise PlacementError(f"adopt {old.id}: {problem}")
            self._book(st, new, notify=False)
            if self.observers:
                self._notify("adopt", new)
            return new

    def restore(self, allocations: Iterable[Allocation | Mapping[str, Any] | str],
                replace: bool = False) -> RestoreReport:
        """Book allocations read back after a restart (from container labels or spawner state).

        Each is checked against what is already booked: an allocation whose node is unknown,
        whose devices are held already, whose owner's server holds another allocation, or that
        is malformed is refused and listed as a conflict; it is never double-booked. Quotas are
        not applied (the containers already run).

        Args:
            allocations: :class:`Allocation` objects, their ``to_dict()`` or ``to_json()`` forms.
            replace: drop everything booked first (a full rebuild).
        """
        report = RestoreReport()
        with self._lock:
            if replace:
                for aid in list(self._allocs):
                    self.release(aid)
            for item in allocations:
                try:
                    if isinstance(item, str):
                        alloc = Allocation.from_json(item)
                    elif isinstance(item, Mapping):
                        alloc = Allocation.from_dict(item)
                    else:
                        alloc = item
                except ValueError as e:
                    report.conflicts.append(RestoreConflict("?", "?", str(e)))
                    continue
                who = f"{alloc.owner.user}/{alloc.owner.server}"
                taken = self._unhold_for(alloc)  # a drained GPU still serves what runs there
                problem = self._restore_problem(alloc)
                if problem:
                    self._rehold(alloc.node, taken)
                    report.conflicts.append(RestoreConflict(alloc.id, who, problem))
                    continue
                self._book(self._by_name[alloc.node], alloc)
                if self.prior is not None:
                    self.prior.record_allocation(alloc)
                report.restored.append(alloc.id)
        return report

    def _restore_problem(self, alloc: Allocation) -> str | None:
        if alloc.id in self._allocs:
            return f"allocation {alloc.id} is already booked"
        st = self._by_name.get(alloc.node)
        if st is None:
            return f"node {alloc.node!r} is not in the inventory"
        other = self._by_owner.get((alloc.owner.user, alloc.owner.server))
        if other is not None:
            return f"server {alloc.owner.user}/{alloc.owner.server} already holds {other}"
        conflict = st.conflict(alloc)
        if conflict is None:
            return None
        holder = self._holder_of(alloc) if conflict.held else None
        return f"{conflict.text}; held by {holder}" if holder else conflict.text

    def _holder_of(self, alloc: Allocation) -> str | None:
        uuids = {g.uuid for g in alloc.gpus} | {m.uuid for m in alloc.mig}
        cpus = set(alloc.cpuset)
        for a in self._allocs.values():
            if a.node == alloc.node and (uuids & set(a.device_ids) or cpus & set(a.cpuset)):
                return f"{a.owner.user}/{a.owner.server} ({a.id})"
        return None
