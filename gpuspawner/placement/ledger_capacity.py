"""What could fit, now or ever (a part of :class:`~.ledger.Ledger`): the wait queue's admission
(capacity, the nodes that could take a bundle, whether it fits now and where), free GPUs, the
snapshot the hub's views read, and the words of a refusal (:func:`explain_refusal`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .devices import min_numa_count, model_allowed, plan, share_blocked
from .errors import (
    PlacementRefused,
)
from .model import GPU_MILLI, Bundle
from .quota import Usage
from .state import NodeState
from .units import format_bytes


class LedgerCapacity:
    """Questions of capacity: could this bundle fit now, ever, and where.

    A part of :class:`~.ledger.Ledger` (its lock ``_lock``, node states and indexes ``_c``, and
    allocations are the ledger's), kept in its own module by concern."""

    def usable_nodes(self) -> set[str]:
        """Names of the nodes that take new placements (not down, not drained)."""
        with self._lock:
            return set(self._by_name) - set(self._node_state)

    def startable_nodes(self) -> set[str]:
        """Names of the elastic nodes that are off and can be started (state "off")."""
        with self._lock:
            return {n for n, (s, _) in self._node_state.items() if s == "off"}

    def capacity(self) -> Usage:
        """What the usable nodes have in all, booked or not (drained GPUs left out):
        milli-GPU, cores, memory bytes, disk bytes. The denominators of DRF shares.
        Cached until a node is added, a node's state or the set of drained GPUs changes."""
        with self._lock:
            key = (len(self._by_name), frozenset(self._node_state), frozenset(self._drained))
            if self._capacity_cache is not None and self._capacity_cache[0] == key:
                return self._capacity_cache[1]
            gpu = cores = mem = disk = 0
            for name in self.usable_nodes():
                n = self._by_name[name].node
                gpu += sum(GPU_MILLI for g in n.gpus if g.uuid not in self._drained)
                cores += sum(len(nn.cpus) for nn in n.numa_nodes)
                mem += sum(nn.memory_bytes for nn in n.numa_nodes)
                disk += n.disk_bytes
            cap = Usage(gpu, cores, mem, disk, 0)
            self._capacity_cache = (key, cap)
            return cap

    def _empty_state(self, name: str) -> NodeState:
        """Node ``name`` with nothing booked but its drained GPUs (cached per drain set)."""
        st = self._by_name[name]
        drained = frozenset(u for u in st.gpu_used if u in self._drained)
        key = (name, drained)
        cache = self._empty_cache
        if key not in cache:
            fresh = NodeState(st.node, order=st.order)
            for u in drained:
                fresh.gpu_used[u] = GPU_MILLI
                if fresh.gpu_by_uuid[u].mig_enabled:
                    fresh.mig_drained.add(u)
            fresh.refresh_signature()
            cache[key] = fresh
        return cache[key]

    def nodes_that_could_take(self, bundle: Bundle, nodes: Iterable[str] | None = None
                              ) -> set[str]:
        """Usable nodes (within ``nodes``, when given) whose capacity could hold ``bundle``
        if nothing else ran there, under its NUMA policy. O(nodes) plans of an empty node."""
        spill = bundle.numa_policy != "strict"
        with self._lock:
            names = self.usable_nodes()
            if nodes:
                names &= set(nodes)
            return {n for n in names if plan(self._empty_state(n), bundle, spill) is not None}

    def could_hold(self, bundle: Bundle, name: str) -> bool:
        """Whether node ``name``, with nothing booked, could hold ``bundle`` under its NUMA
        policy, whatever the node's state (an elastic node that is off: would starting it
        help?). One plan of an empty node.

        Raises:
            KeyError: unknown node.
        """
        with self._lock:
            return plan(self._empty_state(name), bundle,
                        bundle.numa_policy != "strict") is not None

    def fits_now(self, bundle: Bundle, nodes: Iterable[str] | None = None,
                 user: str | None = None) -> str | None:
        """The first usable node (within ``nodes``, when given; configuration order) on which
        ``bundle`` could be placed now, under its NUMA policy and the devices' rules
        (:func:`~.devices.plan` on the live state: booked and drained devices are taken), or
        None. The question the form, the queue and the REST service ask instead of counting
        free capacity beside the ledger; quotas are not judged here (:meth:`check_quota`).
        ``user``: the share's owner, for the one-user-per-GPU rule of marked nodes
        (:meth:`~.ledger.Ledger.set_one_user_shares`); None: not applied.
        O(nodes) plans at most, stopping at the first that fits."""
        with self._lock:
            names = self.usable_nodes()
            if nodes:
                names &= set(nodes)
            for n in sorted(names, key=lambda n: self._by_name[n].order):
                st = self._by_name[n]
                if bundle.numa_policy != "none" and plan(st, bundle, False, user) is not None:
                    return n
                if bundle.numa_policy != "strict" and plan(st, bundle, True, user) is not None:
                    return n
            return None

    def closest_node(self, bundle: Bundle, nodes: Iterable[str],
                     user: str | None = None) -> str | None:
        """Of ``nodes``, the one that lacks the least to hold ``bundle`` now, for the wait
        queue's reservation (:class:`~.queue.WaitQueue`): the smallest (GPUs missing, cores
        missing, memory bytes missing, configuration order). GPUs missing: for whole GPUs,
        ``bundle.gpus`` minus the node's fully free GPUs of an allowed model (0 at least);
        for a share, 0 when one shareable GPU of an allowed model has ``gpu_milli`` free
        (and, with ``user``, takes that user's share: :func:`~.devices.share_blocked`),
        else 1. A proxy: NUMA placement is not planned. None when ``nodes`` is empty."""
        with self._lock:
            best: tuple[int, int, int, int] | None = None
            name = None
            for n in nodes:
                st = self._by_name.get(n)
                if st is None:
                    continue
                ok = [g for g in st.node.gpus if model_allowed(g, bundle)]
                if bundle.mig:
                    gpus = max(0, bundle.mig_count - st.free_mig(bundle.mig))
                elif bundle.gpus:
                    free = sum(1 for g in ok if st.gpu_used[g.uuid] == 0)
                    gpus = max(0, bundle.gpus - free)
                elif bundle.gpu_milli:
                    gpus = 0 if any(g.shareable and st.gpu_free_milli(g.uuid) >= bundle.gpu_milli
                                    and not share_blocked(st, g.uuid, user)
                                    for g in ok) else 1
                else:
                    gpus = 0
                key = (gpus, max(0, bundle.cores - st.free_cpu_count()),
                       max(0, bundle.memory_bytes - st.free_memory()), st.order)
                if best is None or key < best:
                    best, name = key, n
            return name

    def capacity_refusal(self, bundle: Bundle, nodes: Iterable[str] | None = None
                         ) -> PlacementRefused | None:
        """None when some usable node, or an elastic node that can be started (state
        "off"), could hold ``bundle`` once enough of it is free; else the refusal saying why
        not even an empty cluster could (reason keys as :class:`PlacementRefused`, ``never``
        when only the combination does not fit)."""
        spill = bundle.numa_policy != "strict"
        with self._lock:
            names = self.usable_nodes() | self.startable_nodes()
            if nodes:
                names &= set(nodes)
            # any() stops at the first node that could: O(1) plans on a roomy cluster
            if any(plan(self._empty_state(n), bundle, spill) is not None for n in names):
                return None
            states = [self._empty_state(n) for n in sorted(
                names, key=lambda n: self._by_name[n].order)]
            detail, reason, _ = explain_refusal(states, bundle)
            if reason in ("gpus", "gpu_share", "numa", "cores", "memory", "disk"):
                detail = detail.replace(" free", "").replace("; best:", "; largest:")
                reason = "never"
            text = f"no usable node could ever hold {bundle.describe()}: {detail}"
            if self._node_state:
                text += "; " + "; ".join(f"node {n} is {s}" + (f" ({r})" if r else "")
                                         for n, (s, r) in sorted(self._node_state.items()))
            if bundle.total_gpu_milli and self._drained:
                text += "; drained: " + "; ".join(
                    f"GPU {u} on {d[0]} ({d[1]})" for u, d in sorted(self._drained.items())
                    if not nodes or d[0] in set(nodes))
            return PlacementRefused(reason, text)

    def gpu_milli_capacity(self) -> int:
        """Milli-GPU of all nodes."""
        return sum(len(st.gpu_used) for st in self._c.states) * GPU_MILLI

    def gpu_milli_allocated(self) -> int:
        """Milli-GPU booked now (a MIG-enabled GPU counts its booked instances'
        :func:`~.model.mig_milli`, not the 1000 its NodeState holds against whole-GPU use)."""
        with self._lock:
            held = sum(d[2] for d in self._drained.values())
            total = 0
            for st in self._c.states:
                total += sum(st.gpu_used.values())
                if st.mig_by_uuid or any(g.mig_mode for g in st.node.gpus):
                    total -= sum(GPU_MILLI for g in st.node.gpus if g.mig_enabled)
                    total += sum(st.mig_by_uuid[u].milli for u in st.mig_used)
            return total - held

    def free_gpus(self, models: Iterable[str] = (),
                  nodes: Iterable[str] = (), mig: str = "") -> tuple[int, int]:
        """(untouched GPUs, all GPUs) of the given models (empty = any) on the given nodes
        (a profile's node selector; empty = all nodes); what the spawn form and a waiting
        spawn's progress show as "3 of 8 A100 free now". With ``mig`` (a MIG profile name):
        (free, all) MIG instances of that profile on GPUs of those models instead."""
        probe = Bundle(cores=0, gpus=1, gpu_models=tuple(models))
        only = set(nodes)
        free = total = 0
        with self._lock:
            for st in self._c.states:
                if only and st.node.name not in only:
                    continue
                for g in st.node.gpus:
                    if not model_allowed(g, probe):
                        continue
                    if mig:
                        for m in g.mig:
                            if m.profile == mig:
                                total += 1
                                free += st.mig_free(m)
                    elif not g.mig_enabled:
                        total += 1
                        free += st.gpu_used[g.uuid] == 0
        return free, total

    def snapshot(self) -> list[dict[str, Any]]:
        """Per node, in configuration order: state, free/used GPUs (by UUID, with milli used
        and holders), cores and memory per NUMA node, disk; JSON-ready. This is what the admin
        map, the metrics and ``GET api/nodes`` read, on the hub's event loop.

        Incremental: each node's dict is kept and made anew only when something the snapshot
        shows changed on that node since the last call (a booking, release, restore or
        adoption there, its state, a GPU of it drained or undrained, the node added), so a
        call costs one node's dict per changed node plus a list of the nodes (O(changed
        allocations' nodes + nodes), not O(allocations)). The list is new each call; its node
        dicts are shared with earlier and later snapshots and are never changed by the ledger
        (a changed node gets a new dict): a caller must not change them either (copy what it
        changes, as :func:`gpuspawner.hub.service.views.node_views` does). Equal to
        :meth:`_snapshot_full`, the whole walk it replaces."""
        with self._lock:
            dirty = self._snap_dirty
            if dirty:
                snap = self._snap
                states = self._c.states
                if len(snap) < len(states):
                    snap.extend([{}] * (len(states) - len(snap)))
                for name in dirty:
                    st = self._by_name.get(name)
                    if st is not None:
                        snap[st.order] = self._snapshot_node(st)
                dirty.clear()
            return list(self._snap)

    def _snapshot_node(self, st: NodeState) -> dict[str, Any]:
        """One node's dict of :meth:`snapshot`, made anew from its allocations only."""
        n = st.node
        holders: dict[str, list[dict[str, Any]]] = {}
        owners: dict[int, str] = {}
        for a in self._node_allocs.get(n.name, {}).values():
            for g in a.gpus:
                holders.setdefault(g.uuid, []).append(
                    {"allocation": a.id, "user": a.owner.user, "server": a.owner.server,
                     "milli": g.milli})
            for c in a.cpuset:
                owners[c] = a.owner.user
        return self._node_dict(st, holders, owners)

    def _snapshot_full(self) -> list[dict[str, Any]]:
        """:meth:`snapshot` made whole: one walk over every allocation and every node, every
        dict new (what :meth:`snapshot` did before it was incremental; kept as the reference
        the tests and ``benchmarks/ledger_snapshot.py`` compare it with)."""
        with self._lock:
            holders: dict[str, list[dict[str, Any]]] = {}
            cpu_holder: dict[str, dict[int, str]] = {}
            for a in self._allocs.values():
                for g in a.gpus:
                    holders.setdefault(g.uuid, []).append(
                        {"allocation": a.id, "user": a.owner.user, "server": a.owner.server,
                         "milli": g.milli})
                owners = cpu_holder.setdefault(a.node, {})
                for c in a.cpuset:
                    owners[c] = a.owner.user
            return [self._node_dict(st, holders, cpu_holder.get(st.name, {}))
                    for st in self._c.states]

    def _node_dict(self, st: NodeState, holders: dict[str, list[dict[str, Any]]],
                   owners: dict[int, str]) -> dict[str, Any]:
        """The snapshot's dict of node ``st``, given its GPUs' holders (GPU UUID -> holder
        dicts, in booking order) and the user holding each of its booked cores."""
        n = st.node
        state, reason = self._node_state.get(n.name, ("up", ""))
        return {
            "name": n.name,
            "state": state,
            "state_reason": reason,
            "labels": dict(n.labels),
            "disk_bytes": n.disk_bytes,
            "disk_free_bytes": st.free_disk,
            "numa_nodes": [{
                "id": nn.id,
                "cpus": list(nn.cpus),
                "cpus_free": sorted(st.free_cpus[nn.id]),
                "cpu_owners": {str(c): owners[c] for c in nn.cpus if c in owners},
                "memory_bytes": nn.memory_bytes,
                "memory_free_bytes": st.free_mem[nn.id],
            } for nn in n.numa_nodes],
            "gpus": [{
                "uuid": g.uuid, "index": g.index, "model": g.model,
                "memory_bytes": g.memory_bytes, "pci_bus_id": g.pci_bus_id,
                "numa_node": g.numa_node, "shareable": g.shareable,
                "milli_used": st.gpu_used[g.uuid] - self._held(g.uuid),
                "holders": holders.get(g.uuid, []),
                "drained": self._drained[g.uuid][1] if g.uuid in self._drained
                else None,
            } for g in n.gpus],
        }


def gpu_free(st: NodeState, bundle: Bundle, strict: bool, user: str | None = None) -> int:
    """Free whole GPUs of the allowed models (on the fewest NUMA nodes that could hold the
    bundle when ``strict``), or for a share the most free milli-GPU of one shareable GPU
    (with ``user``: one that may take that user's share, :func:`~.devices.share_blocked`)."""
    if bundle.mig:
        per = [sum(1 for m in st.mig_by_numa[n] if m.profile == bundle.mig
                   and st.mig_free(m) and model_allowed(st.gpu_by_uuid[m.gpu], bundle))
               for n in st.numa_ids]
        if not strict:
            return sum(per)
        m = min_numa_count(st, bundle) or len(per)
        return sum(sorted(per, reverse=True)[:m])
    if bundle.gpus:
        per = [sum(1 for g in st.gpus_by_numa[n] if st.gpu_used[g.uuid] == 0
                   and model_allowed(g, bundle)) for n in st.numa_ids]
        if not strict:
            return sum(per)
        m = min_numa_count(st, bundle) or len(per)
        return sum(sorted(per, reverse=True)[:m])
    return max((GPU_MILLI - st.gpu_used[g.uuid] for g in st.node.gpus
                if g.shareable and model_allowed(g, bundle)
                and not share_blocked(st, g.uuid, user)), default=0)


def explain_refusal(states: list[NodeState], bundle: Bundle,
                    user: str | None = None) -> tuple[str, str, str | None]:
    """(sentence, reason key, closest node) for a bundle no node can take. O(nodes).
    ``user``: the share's owner; GPUs that keep their shares for another user (the
    one-user-per-GPU rule, :func:`~.devices.share_blocked`) do not count as free, and the
    sentence names them."""
    if not states:
        return "no node is available for this profile", "no_nodes", None
    models = "|".join(bundle.gpu_models) if bundle.gpu_models else "GPU"
    strict = bundle.numa_policy == "strict"
    wants_gpu = bool(bundle.total_gpu_milli)
    if bundle.mig and not any(m.profile == bundle.mig and model_allowed(g, bundle)
                              for st in states for g in st.node.gpus for m in g.mig):
        have = sorted({m.profile for st in states for g in st.node.gpus for m in g.mig})
        on = f" on {models}" if bundle.gpu_models else ""
        return (f"no node has a MIG {bundle.mig} instance{on} (MIG profiles here: "
                f"{', '.join(have) or 'none'})", "no_gpu_model", None)
    if wants_gpu and not bundle.mig and not any(
            model_allowed(g, bundle) and (bundle.gpus or g.shareable)
            for st in states for g in st.node.gpus):
        have = sorted({g.model for st in states for g in st.node.gpus if g.model})
        kind = "shareable " if bundle.gpu_milli else ""
        return (f"no node has a {kind}{models} (models here: {', '.join(have) or 'none'})",
                "no_gpu_model", None)
    big = [st for st in states if min_numa_count(st, bundle) is not None]
    if not big:
        return (f"no node is large enough for {bundle.describe()}", "too_large", None)
    if wants_gpu:
        need = bundle.gpus or bundle.gpu_milli or bundle.mig_units
        free = {st.name: gpu_free(st, bundle, strict, user) for st in big}
        best = max(big, key=lambda st: (free[st.name], -st.order))
        n = free[best.name]
        if n < need:
            if bundle.mig:
                return (f"no node has {need} free MIG {bundle.mig} instance"
                        f"{'' if need == 1 else 's'}; best: {best.name} with {n} free",
                        "gpus", best.name)
            if bundle.gpus:
                m = min_numa_count(best, bundle) or 1
                where = ("" if not strict else " on one NUMA node" if m == 1
                         else f" on {m} NUMA nodes")
                return (f"no node has {bundle.gpus} free {models}{where}; best: {best.name} "
                        f"with {n} free", "gpus", best.name)
            kept = [f"{g.uuid} on {st.name}" for st in big for g in st.node.gpus
                    if g.shareable and model_allowed(g, bundle)
                    and st.gpu_free_milli(g.uuid) >= need and share_blocked(st, g.uuid, user)]
            why = (f" (with room, but their shares serve another user under MPS, one user "
                   f"per GPU: {', '.join(kept)})" if kept else "")
            return (f"no shareable {models} has {bundle.gpu_milli} milli-GPU free"
                    f"{' for you' if kept else ''}{why}; best: {best.name} with {n} "
                    "milli-GPU free", "gpu_share", best.name)
        big = [st for st in big if free[st.name] >= need]
    with_gpus = f" beside {bundle.gpus or 1} free {models}" if wants_gpu else ""
    if bundle.mig:
        with_gpus = f" beside {bundle.mig_count} free MIG {bundle.mig}"
    checks = (
        ("cores", lambda st: st.free_cpu_count(), bundle.cores, str),
        ("memory", lambda st: st.free_memory(), bundle.memory_bytes, format_bytes),
        ("disk", lambda st: st.free_disk, bundle.disk_bytes, format_bytes),
    )
    for reason, have, need, fmt in checks:
        best = max(big, key=lambda st: (have(st), -st.order))
        if have(best) < need:
            what = f"{need} free cores" if reason == "cores" else \
                f"{fmt(need)} of free {reason}"
            return (f"no node has {what}{with_gpus}; best: {best.name} with "
                    f"{fmt(have(best))}", reason, best.name)
    best = big[0]
    spill = plan(best, bundle, True) if strict else None
    hint = "; numa_policy 'prefer' would place it across NUMA nodes" if spill else ""
    return (f"no node has {bundle.describe()} free together on one NUMA node{hint}; "
            f"closest: {best.name}", "numa", best.name)
