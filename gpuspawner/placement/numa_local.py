"""NUMA-local fragmentation for the memory-aware look-ahead under ``strict`` NUMA (ours).

Why: the ledger's fragmentation model (:mod:`.fragmentation`) reads a node's free cores and
memory as one pool (the bucket key, :meth:`~.ledger_index.IndexMaintenance._bucket_key`),
while a ``strict`` bundle must take its cores and memory from its GPUs' NUMA node. So F
counts a free GPU as usable by a type that asks 12 cores when its NUMA node has 2 cores left
and the other NUMA node 40: the look-ahead then ranks candidates by a fragmentation that is
not the one the device plan lives with. Counted on one fill (docs/placement.md "Strict NUMA
and its cost"), most of the GPUs strict NUMA leaves idle sit on NUMA nodes whose own cores
or memory are too few while the node's total would do.

What: for an aligned (``strict``) bundle, the look-ahead's candidate terms (the bundle's own
growth and each next type's growth on the candidate, :func:`~.lookahead._terms`) are taken on
the candidate bucket's first node by name (the node :func:`~.policies._try_keys` tries first),
with the devices the device plan gives it (:func:`~.devices.plan`), and with F read per NUMA
node: for each type of the workload a NUMA node's free GPUs are usable only when that NUMA
node's own free cores and (memory-aware) memory fit the type; a whole-GPU type of k GPUs that
fits one NUMA node also needs k free GPUs there (the NUMA rule of :mod:`.fragmentation`);
a type that no NUMA node of the node can hold is read node-level. A next type is placed the
way the device plan would place it (whole GPUs: the NUMA node with the fewest free GPUs
that holds them; a share: the fullest GPU with room; CPU only: a NUMA node without free GPUs
first, then the fewest cores left). The best growth elsewhere is the look-ahead's own
(bucket-level) one.

Values are kept per (bundle shape, the node's per-NUMA state) until the workload or the
types' memory changes. Units: milli-GPU, cores, MiB. Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .devices import plan, quick_fit
from .fragmentation import FragmentationModel, allowed_models
from .model import GPU_MILLI, Bundle
from .state import NodeState

#: one NUMA node as this module reads it: (GPUs as sorted (model, free milli, shareable),
#: free cores, free MiB)
Numa = tuple[tuple, int, int]
#: a type as read here: (probability, whole GPUs, share milli, cores, MiB, allowed models)
LType = tuple[float, int, int, int, int, frozenset]

#: at most this many kept values per table; past it the table is dropped
MAX_KEPT = 100_000


def node_numas(st: NodeState) -> tuple[Numa, ...]:
    """The node's per-NUMA state (:data:`Numa`), in the order of its NUMA ids."""
    return tuple((st.sig[i], len(st.free_cpus[nid]), st.free_mem[nid] >> 20)
                 for i, nid in enumerate(st.numa_ids))


def numas_after(st: NodeState, numas: tuple[Numa, ...], gpus: list[tuple[str, int]],
                cpus: list[int], mem: list[tuple[int, int]]) -> tuple[Numa, ...]:
    """``numas`` after a plan's GPUs ``(uuid, milli)``, CPU ids and memory ``(NUMA id,
    bytes)`` are taken from node ``st``."""
    index = {nid: i for i, nid in enumerate(st.numa_ids)}
    out = [[list(g), c, m] for g, c, m in numas]
    for uuid, milli in gpus:
        g = st.gpu_by_uuid[uuid]
        i = index[st.gpu_numa[uuid]]
        free = GPU_MILLI - st.gpu_used[uuid]
        gl = out[i][0]
        gl.remove((g.model, free, g.shareable))
        gl.append((g.model, free - milli, g.shareable))
    for cpu in cpus:
        out[index[st.cpu_numa[cpu]]][1] -= 1
    for nid, b in mem:
        out[index[nid]][2] -= b >> 20
    return tuple((tuple(sorted(g)), c, m) for g, c, m in out)


class LocalF:
    """F read per NUMA node (module docstring) over a fragmentation model's workload."""

    def __init__(self, frag: FragmentationModel) -> None:
        self.frag = frag
        mem = frag.memory if frag.memory_aware else {}
        self.types: list[LType] = []
        for t, p in frag.workload:
            whole = 0 if t.is_share else t.gpu_number
            share = t.milli_gpu if t.is_share else 0
            self.types.append((p, whole, share, -(-t.milli_cpu // 1000), mem.get(t, 0),
                               allowed_models(t)))
        #: the sum of the types' probabilities
        self._p = sum(t[0] for t in self.types)
        #: NUMA state -> (its free milli-GPU, sum over types of p x usable, usable per type)
        self._per: dict[Numa, tuple[int, float, tuple[int, ...]]] = {}
        #: the GPU models per NUMA node -> the whole-GPU types no NUMA node of it can hold
        self._span: dict[tuple, tuple[int, ...]] = {}
        self._f: dict[tuple[Numa, ...], float] = {}

    def _numa(self, n: Numa) -> tuple[int, float, tuple[int, ...]]:
        """For NUMA node ``n``: its free milli-GPU, the sum over types of p x what it can
        use here, and per type the milli-GPU of ``n`` usable by it on ``n`` alone (whole
        types: free GPUs x 1000 when k of them are free; -1 when the type asks no GPU or its
        cores or memory do not fit here)."""
        got = self._per.get(n)
        if got is not None:
            return got
        gpus, cores, mib = n
        out = []
        w = 0.0
        for p, whole, share, tc, tm, models in self.types:
            if not (whole or share) or cores < tc or mib < tm:  # CPU only: every GPU counts
                out.append(-1)
                continue
            if whole:
                full = sum(1 for m, f, _s in gpus
                           if f == GPU_MILLI and (not models or m.lower() in models))
                u = full * GPU_MILLI if full >= whole else 0
            else:
                u = sum(f for m, f, s in gpus if s and f >= share
                        and (not models or m.lower() in models))
            out.append(u)
            if u > 0:
                w += p * u
        if len(self._per) > MAX_KEPT:
            self._per.clear()
        got = self._per[n] = (sum(f for _m, f, _s in gpus), w, tuple(out))
        return got

    def _spanning(self, numas: tuple[Numa, ...]) -> tuple[int, ...]:
        """The whole-GPU types (indexes) that no NUMA node of this node can hold (a
        function of its GPUs' models per NUMA node)."""
        hw = tuple(tuple(m for m, _f, _s in g) for g, _c, _m in numas)
        got = self._span.get(hw)
        if got is None:
            got = self._span[hw] = tuple(
                i for i, (_p, whole, _sh, _c, _m, models) in enumerate(self.types)
                if whole and whole > max(sum(1 for m in g if not models or m.lower() in models)
                                         for g in hw))
        return got

    def value(self, numas: tuple[Numa, ...]) -> float:
        """F of a node in this per-NUMA state (milli-GPU): sum over the workload's types of
        p x (free milli-GPU - what the type can use), a type using a NUMA node's GPUs only
        where that NUMA node's cores and memory fit it; a type no NUMA node can hold is read
        over the whole node."""
        got = self._f.get(numas)
        if got is not None:
            return got
        per = [self._numa(n) for n in numas]
        total = sum(x[0] for x in per)
        s = total * self._p - sum(x[1] for x in per)
        for i in self._spanning(numas):
            p, whole, _share, tc, tm, models = self.types[i]
            s += p * sum(x[2][i] for x in per if x[2][i] > 0)  # not per NUMA node, but:
            usable = 0
            if (sum(c for _g, c, _m in numas) >= tc and sum(m for _g, _c, m in numas) >= tm):
                full = sum(1 for g, _c, _m in numas for m, f, _s in g
                           if f == GPU_MILLI and (not models or m.lower() in models))
                usable = full * GPU_MILLI if full >= whole else 0
            s -= p * usable
        if len(self._f) > MAX_KEPT:
            self._f.clear()
        self._f[numas] = s
        return s

    def place(self, numas: tuple[Numa, ...], whole: int, share: int, cores: int, mib: int,
              models: frozenset) -> tuple[Numa, ...] | None:
        """``numas`` after a task of ``whole`` GPUs or a ``share`` (milli), ``cores`` and
        ``mib`` lands on one NUMA node the way the device plan would put it (module
        docstring), or None when no NUMA node holds it."""
        best = None
        for i, (g, c, m) in enumerate(numas):
            if c < cores or m < mib:
                continue
            if whole:
                full = [j for j, (mo, f, _s) in enumerate(g)
                        if f == GPU_MILLI and (not models or mo.lower() in models)]
                if len(full) < whole:
                    continue
                key = (len(full), c - cores, i)
            elif share:
                room = [(f, j) for j, (mo, f, s) in enumerate(g)
                        if s and f >= share and (not models or mo.lower() in models)]
                if not room:
                    continue
                key = (min(room)[0], c - cores, i)
            else:
                key = (sum(1 for _mo, f, _s in g if f == GPU_MILLI), c - cores, i)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        i = best[-1]
        g, c, m = numas[i]
        gl = list(g)
        if whole:
            left = whole
            for j, (mo, f, s) in enumerate(gl):
                if left and f == GPU_MILLI and (not models or mo.lower() in models):
                    gl[j] = (mo, 0, s)
                    left -= 1
        elif share:
            f, j = min((f, j) for j, (mo, f, s) in enumerate(gl)
                       if s and f >= share and (not models or mo.lower() in models))
            gl[j] = (gl[j][0], f - share, gl[j][2])
        out = list(numas)
        out[i] = (tuple(sorted(gl)), c - cores, m - mib)
        return tuple(out)


def local_terms(state: dict, frag: FragmentationModel, buckets: dict, first_name: Callable,
                bundle: Bundle, nxt: list, own_weight: float
                ) -> Callable[[tuple[int, int, int]], tuple[float, tuple[float, ...]] | None]:
    """``terms(key)``: the look-ahead's candidate terms (``(own weight x own growth, per next
    type its growth on the candidate)``, as :func:`~.lookahead._terms` returns them) for
    bucket ``key``, read per NUMA node on its first node by name (module docstring); None
    when the device plan gives that node nothing. ``state`` is the look-ahead's (its kept
    values live there, dropped when ``frag.epoch`` moves); ``nxt``:
    :func:`~.lookahead.next_types`; ``first_name(key)``: the bucket's smallest node name."""
    kept = state.get("numa_local")
    if kept is None or kept[0] != frag.epoch:
        kept = state["numa_local"] = (frag.epoch, LocalF(frag), {})
    lf, memo = kept[1], kept[2]
    shape = (bundle.gpus, bundle.gpu_milli, bundle.gpu_models, bundle.cores,
             bundle.memory_bytes)
    table = memo.get(shape)
    if table is None:
        if len(memo) > 10_000:
            memo.clear()
        table = memo[shape] = {}
    inf = math.inf
    aware = frag.memory_aware
    nts = [(d.gpus, d.milli, -(-cu // 1000), mu if aware else 0, d.models)
           for d, cu, _p, _m, mu in nxt]

    def terms(key: tuple[int, int, int]) -> tuple[float, tuple[float, ...]] | None:
        st = buckets[key][first_name(key)]
        numas = node_numas(st)
        got = table.get(numas, table)
        if got is not table:
            return got  # type: ignore[return-value]
        p = plan(st, bundle, False) if quick_fit(st, bundle, True) else None
        if p is None:
            out = None
        else:
            after = numas_after(st, numas, p.gpus, p.cpus, p.memory_by_numa)
            f1 = lf.value(after)
            own = own_weight * (f1 - lf.value(numas)) if own_weight else 0.0
            heres = []
            for whole, share, cores, mib, models in nts:
                a2 = lf.place(after, whole, share, cores, mib, models)
                heres.append(inf if a2 is None else lf.value(a2) - f1)
            out = (own, tuple(heres))
        if len(table) > MAX_KEPT:
            table.clear()
        table[numas] = out
        return out

    return terms


__all__ = ["LocalF", "local_terms", "node_numas", "numas_after"]
