"""GPU fragmentation of a node for an observed request mix, after Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC
'23 (the FGD paper).

For one task type *m* the fragmentation F(n, m) of node *n* is the free GPU capacity of *n* that
*m* cannot use: all of it when *m* does not fit on *n*; otherwise the free milli-GPU of the GPUs
that cannot serve *m* (a partly used GPU for a whole-GPU task, a GPU with less room than the
share for a sharing task, a GPU of another model). The node's fragmentation for the workload is
the expectation over the task mix, F(n) = sum_m p_m F(n, m). FGD places a task on the node whose
F grows least.

Our addition: NUMA. A whole-GPU task whose GPUs fit on one NUMA node of *n* and that asks for
alignment can use only the free GPUs of NUMA nodes that hold enough of them, so free GPUs
stranded alone on a NUMA node count as fragments for it. Scores are computed on the node's GPU
*signature* (:attr:`~.state.NodeState.sig`), so equal nodes are scored once.

Units: milli-GPU throughout (1000 = one whole GPU).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

GPU_MILLI = 1000

Signature = tuple  # tuple over NUMA nodes of sorted tuples (model, free_milli, shareable)


@dataclass(frozen=True)
class Demand:
    """A task type as the fragmentation measure sees it: whole GPUs ``gpus`` or a share
    ``milli`` (milli-GPU), the allowed models (lower case, empty = any) and whether the task asks
    for NUMA alignment."""

    gpus: int
    milli: int
    models: frozenset[str]
    aligned: bool

    def allows(self, model: str) -> bool:
        """True when a GPU of ``model`` may serve this demand."""
        return not self.models or model.lower() in self.models


def fragmentation(sig: Signature, d: Demand) -> int:
    """F(n, m) in milli-GPU for a node with GPU signature ``sig`` and task type ``d``."""
    total_free = 0
    usable = 0
    if d.gpus:
        per_numa = []
        for numa in sig:
            n_full = 0
            for model, free, _share in numa:
                total_free += free
                if free == GPU_MILLI and d.allows(model):
                    n_full += 1
            per_numa.append(n_full)
        if d.aligned:
            cap = max((sum(1 for model, _f, _s in numa if d.allows(model)) for numa in sig),
                      default=0)
            if cap >= d.gpus:  # fits one NUMA node: only NUMA nodes with enough free GPUs count
                usable = sum(n for n in per_numa if n >= d.gpus)
            else:
                usable = sum(per_numa)
        else:
            usable = sum(per_numa)
        if usable < d.gpus:
            return total_free
        return total_free - usable * GPU_MILLI
    for numa in sig:
        for model, free, share in numa:
            total_free += free
            if share and free >= d.milli and d.allows(model):
                usable += free
    if usable == 0:
        return total_free
    return total_free - usable


def apply(sig: Signature, d: Demand) -> Signature | None:
    """The signature after placing ``d`` the way :mod:`.devices` would (a NUMA node with enough
    free GPUs and the fewest of them for whole GPUs; the fullest GPU with room for a share), or
    None when it does not fit."""
    numas = [list(n) for n in sig]
    if d.gpus:
        cands = []
        for i, numa in enumerate(numas):
            full = [j for j, (m, f, _s) in enumerate(numa) if f == GPU_MILLI and d.allows(m)]
            cands.append((i, full))
        single = [(len(full), i, full) for i, full in cands if len(full) >= d.gpus]
        if single:
            _, i, full = min(single)
            for j in full[: d.gpus]:
                m, _f, s = numas[i][j]
                numas[i][j] = (m, 0, s)
        else:
            left = d.gpus
            for i, full in sorted(cands, key=lambda c: -len(c[1])):
                for j in full[:left]:
                    m, _f, s = numas[i][j]
                    numas[i][j] = (m, 0, s)
                left -= min(left, len(full))
            if left:
                return None
    elif d.milli:
        best = None
        for i, numa in enumerate(numas):
            for j, (m, f, s) in enumerate(numa):
                if s and f >= d.milli and d.allows(m) and (best is None or f < best[0]):
                    best = (f, i, j)
        if best is None:
            return None
        f, i, j = best
        m, _f, s = numas[i][j]
        numas[i][j] = (m, f - d.milli, s)
    return tuple(tuple(sorted(n)) for n in numas)


class FragmentationModel:
    """Expected fragmentation over the observed request mix, with caches.

    Signatures are interned to small integer ids (:meth:`intern`) so that a decision hashes
    ints, not nested tuples. The mix is the count of GPU task types seen by :meth:`observe`
    (the ``top`` most frequent types). Weights are recomputed after 16, 32, 64, ...
    observations, then every ``refresh_every``, and adopted only when they moved by more than
    ``tolerance`` in L1 distance: a new weighting invalidates every cached score, so it is
    adopted rarely, and a decision's cost does not grow with the number of nodes.
    """

    def __init__(self, top: int = 8, refresh_every: int = 512, tolerance: float = 0.1,
                 prior: dict[Demand, int] | None = None) -> None:
        self.top = top
        self.refresh_every = refresh_every
        self.tolerance = tolerance
        self.counts: Counter[Demand] = Counter(prior or {})
        self._since = 0
        self._next_refresh = 16
        self._weights: dict[Demand, float] = {}
        self._ids: dict[Signature, int] = {}
        self._sigs: list[Signature] = []
        self.free: list[int] = []  #: free milli-GPU of each interned signature
        self._score: dict[int, float] = {}
        self._after: dict[tuple[int, Demand], int | None] = {}
        self._delta: dict[Demand, dict[int, float | None]] = {}
        self._reweight(force=True)

    def intern(self, sig: Signature) -> int:
        """The integer id of a signature (new ids for new signatures)."""
        sid = self._ids.get(sig)
        if sid is None:
            sid = self._ids[sig] = len(self._sigs)
            self._sigs.append(sig)
            self.free.append(sum(f for numa in sig for _m, f, _s in numa))
        return sid

    def signature(self, sid: int) -> Signature:
        """The signature of an id."""
        return self._sigs[sid]

    def _reweight(self, force: bool = False) -> None:
        self._since = 0
        common = self.counts.most_common(self.top)
        total = sum(c for _, c in common)
        weights = {d: c / total for d, c in common} if total else {}
        if not force:
            keys = weights.keys() | self._weights.keys()
            moved = sum(abs(weights.get(d, 0.0) - self._weights.get(d, 0.0)) for d in keys)
            if moved <= self.tolerance:
                return
        self._weights = weights
        self._score.clear()
        self._delta.clear()

    def observe(self, d: Demand) -> None:
        """Count one arriving GPU request (CPU-only ones are not part of the GPU mix)."""
        if not (d.gpus or d.milli):
            return
        self.counts[d] += 1
        self._since += 1
        if self._since >= self._next_refresh:
            self._next_refresh = min(self.refresh_every, self._next_refresh * 2)
            self._reweight()

    def score(self, sid: int) -> float:
        """F(n) = sum_m p_m F(n, m) of a signature id, milli-GPU."""
        s = self._score.get(sid)
        if s is None:
            sig = self._sigs[sid]
            s = self._score[sid] = sum(p * fragmentation(sig, d)
                                       for d, p in self._weights.items())
        return s

    def deltas(self, d: Demand) -> dict[int, float | None]:
        """The cache of :meth:`delta` results for one demand: signature id -> delta. Look up
        there first and call :meth:`delta` on a miss (what the ``fgd`` policy does per bucket)."""
        table = self._delta.get(d)
        if table is None:
            table = self._delta[d] = {}
        return table

    def delta(self, sid: int, d: Demand) -> float | None:
        """Growth of F when ``d`` is placed on a node with signature ``sid``; None if it
        cannot fit there."""
        table = self.deltas(d)
        if sid in table:
            return table[sid]
        key = (sid, d)
        if key in self._after:
            after = self._after[key]
        else:
            if len(self._after) > 500_000:
                self._after.clear()
            sig = apply(self._sigs[sid], d)
            after = self._after[key] = None if sig is None else self.intern(sig)
        out = None if after is None else self.score(after) - self.score(sid)
        table[sid] = out
        return out
