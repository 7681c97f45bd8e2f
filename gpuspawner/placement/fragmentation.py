"""Node fragmentation for the ledger's ``fgd`` policy: the definition of the FGD simulator's
``pkg/utils/frag.go`` (``NodeGpuShareFragAmountScore``; Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23),
generalised to the ledger's nodes (several GPU models per node, exclusive GPUs, NUMA).

For a node *n* and the target workload, a list of typical task types *m* with frequencies *p*
(:func:`~.workload.typical_pods`), F(n) = sum_m p_m F(n, m) in milli-GPU, where F(n, m) is:

* all free milli-GPU of *n* when *m* asks for no GPU (frag.go's ``XLSatisfied``/``XRLackCPU``
  count, as ``FragAmountSumExceptQ3`` keeps them), when *m* does not fit *n*'s free GPUs
  (``Q1``/``Q2``, and ``NoAccess`` for a model *m* does not allow) or when it fits them but not
  *n*'s free CPU (``Q4LackCpu``);
* otherwise (``Q3Satisfied``) the free milli-GPU of the GPUs that cannot serve *m*: a GPU with
  less free than *m*'s share (frag.go ``GetGpuFragMilliByNodeResAndPodRes``), and (our
  generalisation) a GPU of a model *m* does not allow or, for a share, an exclusive GPU.

**NUMA (ours):** with ``numa_aware``, a whole-GPU type of k GPUs that fits one NUMA node of *n*
(some NUMA node holds k allowed GPUs) can use only the free GPUs of NUMA nodes that have k free
ones, so free GPUs stranded on the other NUMA nodes are fragment for it and it does not fit
when no NUMA node has k free. This is what ``strict`` placement needs.

**Memory (ours, ``fgd-mem`` and ``fgd-mem-lookahead``):** with ``memory_aware``, a type whose
typical memory (:attr:`FragmentationModel.memory`, MiB: the lower median of what the bundles
of that type asked) does not fit the node's free memory counts all free milli-GPU, as one
whose CPU does not fit. The free memory read is the lower bound of the node's memory class
(:func:`mem_class`, :func:`mem_low`: within 1/8 of the free MiB), so that a bucket's rank is
a function of its key (:mod:`.rank_index`). The paper's F has no memory term; the rule and
what it wins are in docs/placement.md "Memory-aware fragmentation". The term acts only while
the workload has a type asking for whole GPUs (:func:`~.workload.asks_whole_gpus`; on GPU
shares and CPU-only pods alone F is ``fgd``'s, docs/placement.md "Share-only workloads").

CPU is the node's free logical CPUs x 1000 (the ledger books whole CPUs). Scores are computed on
the node's GPU *signature* (:attr:`~.state.NodeState.sig`) and free CPU, so equal nodes are
scored once. Units: milli-GPU, milli-CPU.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import mul

from .units import GPU_MILLI
from .workload import (
    PodType,
    asks_whole_gpus,
    fgd_score_from_delta,
    typical_pods,
    workload_distance,
)

Signature = tuple  # tuple over NUMA nodes of sorted tuples (model, free_milli, shareable)

_MISS = object()

#: a learned workload replaces the one in use when its total variation distance from it is at
#: least this (:class:`FragmentationModel`)
REFRESH_TOLERANCE = 0.05

#: mantissa bits of the memory classes of the memory-aware policies (:func:`mem_class`):
#: classes are exact below 16 MiB, then 8 per power of two (steps of 1/8 to 1/16)
MEM_BITS = 3
_MEM_EXACT = 1 << (MEM_BITS + 1)
#: free memory of "memory not looked at": above every type's memory
MEM_ANY = 1 << 62


def mem_class(mib: int, fine: bool) -> int:
    """The memory class of ``mib`` free MiB in a ledger bucket key: its bit length (classes
    of powers of two: the ``fgd`` policies skip a bucket whose nodes are all too small), or,
    with ``fine`` (the memory-aware policies), a log-linear class with :data:`MEM_BITS`
    mantissa bits, as a floating-point number's exponent and leading bits: exact below 16
    MiB, then 8 classes per power of two. Classes are monotone in ``mib``, so a bundle of
    ``m`` MiB can fit only buckets of class ``>= mem_class(m, fine)``."""
    e = mib.bit_length()
    if not fine:
        return e
    if e <= MEM_BITS + 1:
        return mib
    s = e - MEM_BITS - 1
    return (s << MEM_BITS) + (mib >> s)


def mem_low(c: int, fine: bool) -> int:
    """The smallest MiB of memory class ``c`` (:func:`mem_class`)."""
    if not fine:
        return (1 << c) >> 1
    if c < _MEM_EXACT:
        return c
    s = (c >> MEM_BITS) - 1
    return (c - (s << MEM_BITS)) << s


#: :func:`mem_low` of every fine class of a MiB count below 2**63
_MEM_LOWS = [mem_low(c, True) for c in range(mem_class((1 << 63) - 1, True) + 1)]


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


def allowed_models(t: PodType) -> frozenset[str]:
    """The GPU models a task type allows, lower case (empty = any): its ``gpu_type`` split
    on ``|`` (the trace's ``gpu_spec``)."""
    return frozenset(x.lower() for x in t.gpu_type.split("|") if x)


def _allows(models: frozenset[str], model: str) -> bool:
    return not models or model.lower() in models


def type_fragmentation(sig: Signature, cpu_left: int, t: PodType, numa_aware: bool,
                       models: frozenset[str] | None = None, total: int | None = None) -> int:
    """F(n, m) in milli-GPU for a node with GPU signature ``sig`` and ``cpu_left`` free
    milli-CPU, for task type ``t`` (module docstring). ``models`` (``t``'s allowed models, lower
    case) and ``total`` (the node's free milli-GPU) may be passed to save recomputing them."""
    if total is None:
        total = 0
        for numa in sig:
            for _m, free, _s in numa:
                total += free
    if total == 0 or t.milli_gpu == 0:
        return total
    if models is None:
        models = allowed_models(t)
    if t.is_share:
        usable = 0
        for numa in sig:
            for model, free, share in numa:
                if share and free >= t.milli_gpu and _allows(models, model):
                    usable += free
        if usable == 0 or cpu_left < t.milli_cpu:
            return total
        return total - usable
    k = t.gpu_number
    per = []
    cap = 0
    for numa in sig:
        n_full = 0
        n_allowed = 0
        for model, free, _s in numa:
            if _allows(models, model):
                n_allowed += 1
                if free == GPU_MILLI:
                    n_full += 1
        per.append(n_full)
        cap = max(cap, n_allowed)
    if numa_aware and cap >= k:
        usable = sum(n for n in per if n >= k)
    else:
        usable = sum(per)
    if usable < k or cpu_left < t.milli_cpu:
        return total
    return total - usable * GPU_MILLI


def apply(sig: Signature, d: Demand) -> Signature | None:
    """The signature after placing ``d`` the way :mod:`.devices` would (a NUMA node with enough
    free GPUs and the fewest of them for whole GPUs; the fullest GPU with room for a share), or
    None when it does not fit. ``sig``'s NUMA tuples are sorted (as
    :meth:`~.state.NodeState.refresh_signature` makes them); only the changed ones are
    copied and sorted again."""
    gpus = d.gpus
    models = d.models
    if gpus:
        # per NUMA node, its full GPUs of an allowed model, by place
        cands = []
        n = 0
        for numa in sig:
            full = [j for j, (m, f, _s) in enumerate(numa)
                    if f == GPU_MILLI and (not models or m.lower() in models)]
            cands.append(full)
            n += len(full)
        if n < gpus:
            return None
        out = list(sig)
        # one NUMA node with enough: the one with the fewest, the first of those
        best = -1
        for i, full in enumerate(cands):
            if len(full) >= gpus and (best < 0 or len(full) < len(cands[best])):
                best = i
        if best >= 0:
            numa = list(sig[best])
            for j in cands[best][:gpus]:
                m, _f, s = numa[j]
                numa[j] = (m, 0, s)
            out[best] = tuple(sorted(numa))
            return tuple(out)
        # else spread, from the NUMA node with the most (ties in order)
        left = gpus
        for i in sorted(range(len(cands)), key=lambda i: -len(cands[i])):
            full = cands[i][:left]
            if full:
                numa = list(sig[i])
                for j in full:
                    m, _f, s = numa[j]
                    numa[j] = (m, 0, s)
                out[i] = tuple(sorted(numa))
                left -= len(full)
        return tuple(out)
    milli = d.milli
    if milli:
        best_f = bi = bj = -1
        for i, numa in enumerate(sig):
            for j, (m, f, s) in enumerate(numa):
                if (s and f >= milli and (best_f < 0 or f < best_f)
                        and (not models or m.lower() in models)):
                    best_f, bi, bj = f, i, j
        if best_f < 0:
            return None
        numa = list(sig[bi])
        m, _f, s = numa[bj]
        numa[bj] = (m, best_f - milli, s)
        out = list(sig)
        out[bi] = tuple(sorted(numa))
        return tuple(out)
    return sig


class FragmentationModel:
    """F(n) = sum_m p_m F(n, m) over a target workload, with caches (module docstring).

    The workload is a static prior given to :meth:`set_workload` (``[(PodType, frequency)]``,
    e.g. :func:`~.workload.typical_pods` of a trace or :class:`~.prior.LivePrior`'s output). Until
    one is given, the model learns one online: every bundle the ledger sees is counted
    (:meth:`observe`, CPU-only ones included) and the typical pods of those counts (95 % of
    them, frag.go's rule) are computed after 16, 32, 64, ... and then every ``refresh_every``
    observations, and become the workload when they differ from the one in use by at least
    ``refresh_tolerance`` (:func:`~.workload.workload_distance`, total variation: the share of
    probability mass that moved). A new workload clears the score caches, so every bucket is
    scored again on the next decisions; the tolerance keeps a learned mix that only drifts by
    a percent or two from costing that (ours: in ``benchmarks/placement.py``'s fill mode, with
    tolerance 0 every refresh was adopted and the cold decisions after them made most of the
    p99; docs/placement.md "Speed").

    Signatures are interned to small integer ids (:meth:`intern`).

    With ``memory_aware`` (``fgd-mem``, ``fgd-mem-lookahead``), F also counts a type whose
    memory does not fit (module docstring). A type's memory (:attr:`memory`, MiB) is the one
    given to :meth:`set_workload`, or else the lower median of the memory of the bundles of
    that type seen so far (:meth:`observe`), re-read whenever a workload is set or a learned
    one adopted and, under a static workload, at the learned workload's refresh points; a
    change clears the score caches. Without it, the memory arguments below are
    ignored and F is the one above to the last bit.
    """

    def __init__(self, workload: list[tuple[PodType, float]] | None = None,
                 numa_aware: bool = True, refresh_every: int = 512,
                 refresh_tolerance: float = REFRESH_TOLERANCE,
                 memory_aware: bool = False,
                 memory: Mapping[PodType, int] | None = None) -> None:
        self.numa_aware = numa_aware
        self.memory_aware = memory_aware
        #: type -> MiB it typically asks (absent: 0); read by the memory-aware F only
        self.memory: dict[PodType, int] = dict(memory or {})
        self._memory_given = memory is not None
        #: type -> {MiB asked: bundles seen}
        self.mem_counts: dict[PodType, dict[int, int]] = {}
        self._mem_levels: list[int] = []
        self._mmul = 1
        #: bumped whenever the score caches are dropped (a new workload or types' memory):
        #: what :mod:`.lookahead` keys its own state by
        self.epoch = 0
        self.refresh_every = refresh_every
        self.refresh_tolerance = refresh_tolerance
        self.static = workload is not None
        self.counts: dict[PodType, float] = {}
        self._since = 0
        self._next_refresh = 16
        self.workload: list[tuple[PodType, float]] = list(workload or [])
        self._ids: dict[Signature, int] = {}
        self._sigs: list[Signature] = []
        self.free: list[int] = []  #: free milli-GPU of each interned signature
        #: signature id * _lvmul + CPU level -> F; integer keys, not tuples: ints are not
        #: tracked by the garbage collector, so filling the caches triggers no collections
        self._score: dict[int, float] = {}
        self._lvmul = 1
        #: (demand, milli-CPU, quantize) -> {(signature id, free cores): policy sort key}
        self._keys: dict[tuple, dict[tuple, float | int | None]] = {}
        #: (demand, quantize) -> {(signature id, CPU level after, CPU level before), packed
        #: in one int: rank}
        self._ranks: dict[tuple, dict[int, float | int | None]] = {}
        #: demand -> {signature id: signature id after placing it (None: does not fit)}
        self._after: dict[Demand, dict[int, int | None]] = {}
        self._delta: dict[tuple, dict[tuple[int, int], float | None]] = {}
        self._parsed_for: object = None
        self._parsed_list: list[tuple[PodType, float, frozenset[str]]] = []
        self._cpu_levels: list[int] = []
        #: level -> its canonical level (:meth:`_canonical_levels`), the one the caches key
        self._canon: list[int] = [0]
        self._whole = False
        #: per workload type: (frequency, GPU kind index or -1 for no GPU, milli-CPU, MiB)
        self._template: list[tuple[float, int, int, int]] = []
        #: the template's frequencies, and per level the types' places in the kind values
        #: (:meth:`_fit_index`)
        self._probs: tuple[float, ...] = ()
        self._fit_idx: dict[int, tuple[int, ...]] = {}
        #: per allowed-models set: (models, [(kind, share milli)], [(kind, whole GPUs)])
        self._kind_groups: list[tuple[frozenset[str], list, list]] = []
        self._kind_count = 0
        self._kinds_key: tuple = ()
        #: signature id -> F(n, kind) per GPU kind of the workload's kinds (kept per set of
        #: kinds, so a workload refresh that keeps or restores its kinds keeps the values)
        self._kvals: dict[int, list[int]] = {}
        self._kvals_by: dict[tuple, dict[int, list[int]]] = {}

    def set_workload(self, workload: list[tuple[PodType, float]] | None,
                     memory: Mapping[PodType, int] | None = None) -> None:
        """Use a static workload (None: go back to learning it online). ``memory``: MiB each
        type typically asks, for the memory-aware F (None: learned from the bundles seen,
        :meth:`observe`)."""
        self.static = workload is not None
        self.workload = list(workload or [])
        if workload is None:
            self.workload = typical_pods(self.counts)
        self._memory_given = memory is not None
        self.memory = dict(memory or {})
        self._learn_memory()
        self._drop_scores()

    def set_memory_aware(self, on: bool) -> None:
        """Turn the memory term on or off (a policy switch); clears the score caches."""
        if on != self.memory_aware:
            self.memory_aware = on
            self._learn_memory()
            self._drop_scores()

    def _learn_memory(self) -> bool:
        """Re-read :attr:`memory` from the bundles seen (unless it was given): the lower
        median per type of the workload (``statistics.median_low``, as the simulator's
        ``paper_method.type_memory``). True when it changed."""
        if self._memory_given or not self.memory_aware:
            return False
        new = {}
        for t, _p in self.workload:
            seen = self.mem_counts.get(t)
            if seen:
                n = sum(seen.values())
                half = (n + 1) // 2  # the lower median: the ((n + 1) // 2)-th smallest
                acc = 0
                for mib in sorted(seen):
                    acc += seen[mib]
                    if acc >= half:
                        new[t] = mib
                        break
        if new == self.memory:
            return False
        self.memory = new
        return True

    def _drop_scores(self) -> None:
        """Clear every cache that depends on the workload: F, growths, policy keys, ranks
        (the GPU-only values per kind and the after-placement signatures do not)."""
        self._score.clear()
        self._delta.clear()
        self._keys.clear()
        self._ranks.clear()
        self._parsed_for = None  # the levels and template too (the memory may have changed)
        self.epoch += 1

    def _parsed(self) -> list[tuple[PodType, float, frozenset[str]]]:
        """The workload with each type's allowed models parsed (cached per workload)."""
        if self._parsed_for is not self.workload:
            self._parsed_list = [(t, p, allowed_models(t)) for t, p in self.workload]
            self._parsed_for = self.workload
            self._cpu_levels = sorted({t.milli_cpu for t, _ in self.workload})
            self._whole = asks_whole_gpus(self.workload)
            # the memory term, as the look-ahead, acts only on a workload with a whole-GPU
            # type (workload.asks_whole_gpus): on shares alone F is fgd's
            mem = self.memory if self.memory_aware and self._whole else {}
            self._mem_levels = sorted({m for t, _ in self.workload if (m := mem.get(t, 0))})
            self._mmul = len(self._mem_levels) + 1  # memory levels are 0..len
            # a node's level: CPU level * _mmul + memory level (0 without the memory term)
            self._lvmul = (len(self._cpu_levels) + 1) * self._mmul  # CPU levels are 0..len
            # the distinct GPU demands ("kinds") of the workload, grouped by allowed models
            # (sorted, so that a new workload with the same kinds keeps their values)
            kinds = {k: i for i, k in enumerate(sorted(
                {(models, t.is_share, t.milli_gpu, t.gpu_number)
                 for t, _p, models in self._parsed_list if t.milli_gpu},
                key=lambda k: (sorted(k[0]), *k[1:])))}
            self._template = [
                (p, kinds[(models, t.is_share, t.milli_gpu, t.gpu_number)] if t.milli_gpu
                 else -1, t.milli_cpu, mem.get(t, 0)) for t, p, models in self._parsed_list]
            self._probs = tuple(p for p, _ki, _c, _m in self._template)
            self._fit_idx = {}
            self._canon = self._canonical_levels()
            if tuple(kinds) != self._kinds_key:
                self._kinds_key = tuple(kinds)
                if len(self._kvals_by) > 8:
                    self._kvals_by.clear()
                self._kvals = self._kvals_by.setdefault(self._kinds_key, {})
                groups: dict[frozenset[str], tuple[list, list]] = {}
                for (models, share, milli, number), ki in kinds.items():
                    shares, wholes = groups.setdefault(models, ([], []))
                    (shares if share else wholes).append((ki, milli if share else number))
                self._kind_groups = [(m, sh, wh) for m, (sh, wh) in groups.items()]
                self._kind_count = len(kinds)
            self._score.clear()
            self._keys.clear()
            self._ranks.clear()
        return self._parsed_list

    def asks_whole_gpus(self) -> bool:
        """True when the current workload has a type asking for whole GPUs
        (:func:`~.workload.asks_whole_gpus`); the look-ahead and the memory term act only
        then."""
        self._parsed()
        return self._whole

    def intern(self, sig: Signature, free: int | None = None) -> int:
        """The integer id of a signature (new ids for new signatures). ``free``: its free
        milli-GPU when the caller knows them (:meth:`after`), else they are summed."""
        n = len(self._sigs)
        sid = self._ids.setdefault(sig, n)  # one hash of the nested tuple, not two
        if sid == n:
            self._sigs.append(sig)
            self.free.append(sum([f for numa in sig for _m, f, _s in numa])
                             if free is None else free)
        return sid

    def signature(self, sid: int) -> Signature:
        """The signature of an id."""
        return self._sigs[sid]

    def observe(self, t: PodType, mib: int = 0) -> None:
        """Count one arriving request of ``mib`` MiB memory (the workload is learned from
        them while no static one is set; the types' memory while none was given)."""
        self.counts[t] = self.counts.get(t, 0) + 1
        seen = self.mem_counts.get(t)
        if seen is None:
            seen = self.mem_counts[t] = {}
        seen[mib] = seen.get(mib, 0) + 1
        if self.static and not self.memory_aware:
            return
        self._since += 1
        if self._since >= self._next_refresh:
            self._since = 0
            self._next_refresh = min(self.refresh_every, self._next_refresh * 2)
            if not self.static:
                new = typical_pods(self.counts)
                if new != self.workload and (
                        workload_distance(new, self.workload) >= self.refresh_tolerance):
                    self.workload = new
                    self._learn_memory()
                    self._drop_scores()
                # a learned workload re-reads the memory only with a new workload: every
                # change drops every score and rank index, and on the trace's fill the four
                # re-reads between adoptions changed no decision of fgd-mem-lookahead (5
                # seeds x 2 traces) while their rebuilds raised the p99 (docs/placement.md)
                return
            if self._learn_memory():
                self._drop_scores()

    def score(self, sid: int, cpu_left: int, mem_left: int = MEM_ANY) -> float:
        """F(n) in milli-GPU for signature id ``sid``, ``cpu_left`` free milli-CPU and
        ``mem_left`` free MiB (read only when memory-aware)."""
        # F depends on cpu_left (mem_left) only through which types' milli-CPU (memory) it
        # reaches: key by that
        self._parsed()
        lv = self._level(cpu_left, mem_left)
        s = self._score.get(sid * self._lvmul + lv)
        if s is None:
            s = self._score_at(sid, lv, mem_left < 0)
        return s

    def _score_at(self, sid: int, lv: int, neg: bool) -> float:
        """:meth:`score` on a cache miss, for a node at level ``lv`` (:meth:`_level`); ``neg``:
        its free MiB is below 0 (a task's memory taken from a bucket's lower bound), which the
        level does not tell and which leaves no type's memory fitting. Cached as
        :meth:`score` reads it."""
        key = sid * self._lvmul + lv
        if len(self._score) > 1_000_000:
            self._score.clear()
        total = self.free[sid]
        if total == 0:
            s = self._score[key] = 0.0
            return s
        # F(n, m) is the type's GPU-only value when the type's CPU and memory fit, else all
        # free milli-GPU (type_fragmentation): the GPU-only values are computed once per
        # signature and GPU kind (_kind_values, kept with the total appended, so that index
        # -1 reads it), and which types fit is a function of the level (_fit_index); the
        # products and their sum keep the workload's order, so it is the same float as
        # summing type_fragmentation
        vals = self._kvals.get(sid)
        if vals is None:
            if len(self._kvals) > 200_000:
                self._kvals.clear()
            vals = self._kvals[sid] = self._kind_values(self._sigs[sid], total)
            vals.append(total)
        idx = self._fit_idx.get(-1 - lv if neg else lv)
        if idx is None:
            idx = self._fit_index(lv, neg)
        s = self._score[key] = sum(map(mul, self._probs, map(vals.__getitem__, idx)))
        return s

    def _fit_index(self, lv: int, neg: bool) -> tuple[int, ...]:
        """Per workload type, in the workload's order: the index of its GPU-only value in a
        signature's kind values when its CPU and memory fit a node at level ``lv`` (free MiB
        below 0 with ``neg``), else -1 (all free milli-GPU). A type's milli-CPU ``c`` fits
        ``cpu_left`` exactly when ``bisect_right(cpu levels, cpu_left)`` is past ``c``'s
        place in them, and the same for its memory among the memory levels; memory 0 fits
        unless the free MiB is below 0. Cached until the workload is parsed again."""
        mm = self._mmul
        lc, lm = divmod(lv, mm)
        cpos = {c: i for i, c in enumerate(self._cpu_levels)}
        mpos = {m: i for i, m in enumerate(self._mem_levels)}
        idx = tuple(-1 if ki < 0 or lc <= cpos[c] or (lm <= mpos[m] if m else neg) else ki
                    for _p, ki, c, m in self._template)
        self._fit_idx[-1 - lv if neg else lv] = idx
        return idx

    def _canonical_levels(self) -> list[int]:
        """Per level (:meth:`_level`'s packing), the level the caches key it by: the lowest
        level at which the same workload types fit. F of a signature depends on its level
        only through which GPU types fit there (:meth:`_fit_index`), so equal fits give the
        same float, and the score cache, the rank tables and the growers' memos then share
        one entry where they kept one per level: with the memory term a node's level is
        (CPU level, memory level), 15 x 19 = 285 levels on the trace's fill for 27 sets of
        fitting types.

        The set of GPU types that fit at (CPU level ``lc``, memory level ``lm``) is those
        with CPU place < ``lc`` and memory place < ``lm``; its lowest level is one past the
        largest of each among them (0 for none), which has the same set. The identity
        without the memory term (the plain ranker keys raw CPU levels; few of them share a
        set) and where a GPU type asks 0 MiB: there free memory below 0 (``neg``) changes
        that type's fit at memory level 0, which the score cache does not key (the first
        value asked of a level is kept, test_memory_aware_score_is_the_definition), so
        levels stay apart and every cached value is the one it was. On the trace's fill
        this changes no decision (its digests at 1,523 and 10,000 nodes are unchanged)."""
        mm = self._mmul
        canon = list(range(self._lvmul))
        if mm == 1 or any(ki >= 0 and not m for _p, ki, _c, m in self._template):
            return canon
        cpos = {c: i for i, c in enumerate(self._cpu_levels)}
        mpos = {m: i for i, m in enumerate(self._mem_levels)}
        places = [(cpos[c], mpos[m]) for _p, ki, c, m in self._template if ki >= 0]
        for lv in canon:
            lc, lm = divmod(lv, mm)
            c_low = m_low = 0
            for ci, mi in places:
                if lc > ci and lm > mi:
                    if ci >= c_low:
                        c_low = ci + 1
                    if mi >= m_low:
                        m_low = mi + 1
            canon[lv] = c_low * mm + m_low
        return canon

    def level(self, cpu_left: int, mem_left: int = MEM_ANY) -> int:
        """A node's level: which of the workload's milli-CPU and (memory-aware) memory levels
        ``cpu_left`` milli-CPU and ``mem_left`` MiB reach; F of a signature depends on free
        CPU and memory only through it."""
        self._parsed()
        return self._level(cpu_left, mem_left)

    def _level(self, cpu_left: int, mem_left: int) -> int:
        """:meth:`level` once the workload is parsed (:meth:`score` has parsed it)."""
        lv = bisect_right(self._cpu_levels, cpu_left)
        if self._mmul > 1:
            return self._canon[lv * self._mmul + bisect_right(self._mem_levels, mem_left)]
        return lv

    def mem_need(self, mib: int) -> int:
        """The smallest bucket memory class that may hold ``mib`` MiB (:func:`mem_class`)."""
        return mem_class(mib, self.memory_aware)

    def mem_left(self, cls: int) -> int:
        """The free MiB the memory-aware F reads for a bucket of memory class ``cls``: the
        class's lower bound (:data:`MEM_ANY` without the memory term)."""
        return mem_low(cls, True) if self.memory_aware else MEM_ANY

    def _kind_values(self, sig: Signature, total: int) -> list[int]:
        """F(n, m) for each GPU kind of the workload when m's CPU fits, for a node of
        signature ``sig`` with ``total`` free milli-GPU: :func:`type_fragmentation`'s value
        (tests/test_fragmentation_kinds.py checks they agree), computed from one pass over
        the GPUs per allowed-models set instead of one per type."""
        out = [total] * self._kind_count
        na = self.numa_aware
        for models, shares, wholes in self._kind_groups:
            if shares:
                frees = [f for numa in sig for m, f, sh in numa
                         if sh and f and (not models or m.lower() in models)]
                for ki, milli in shares:
                    usable = 0
                    for f in frees:
                        if f >= milli:
                            usable += f
                    if usable:
                        out[ki] = total - usable
            if wholes:
                per = []
                cap = 0
                for numa in sig:
                    n_full = n_allowed = 0
                    for m, f, _sh in numa:
                        if not models or m.lower() in models:
                            n_allowed += 1
                            if f == GPU_MILLI:
                                n_full += 1
                    per.append(n_full)
                    if n_allowed > cap:
                        cap = n_allowed
                every = sum(per)
                for ki, k in wholes:
                    usable = sum(n for n in per if n >= k) if na and cap >= k else every
                    if usable >= k:
                        out[ki] = total - usable * GPU_MILLI
        return out

    def after_table(self, d: Demand) -> dict[int, int | None]:
        """The cache of :meth:`after` for ``d``: signature id -> id after placing ``d`` (None:
        does not fit). A caller looks there first and calls :meth:`after` on a miss."""
        table = self._after.get(d)
        if table is None:
            if len(self._after) > 10_000:
                self._after.clear()
            table = self._after[d] = {}
        return table

    def after(self, sid: int, d: Demand) -> int | None:
        """The signature id after placing ``d`` on signature ``sid`` (:func:`apply`), or None
        when its GPUs do not fit; cached."""
        table = self.after_table(d)
        # a get, not table[sid] in a try: the callers look in the table first, so most
        # calls here are misses, and raising KeyError costs more than the lookup
        got = table.get(sid, _MISS)
        if got is not _MISS:
            return got  # type: ignore[return-value]
        if len(table) > 200_000:
            table.clear()
        sig = apply(self._sigs[sid], d)
        # apply takes d.gpus full GPUs or d.milli of one GPU: the free milli-GPU after
        after = table[sid] = None if sig is None else self.intern(
            sig, self.free[sid] - (d.gpus * GPU_MILLI if d.gpus else d.milli))
        return after

    def ranker(self, d: Demand, cpu: int, quantize: bool, mib: int = 0
               ) -> Callable[[int, int, int], int | float | None]:
        """``rank(sid, cpu_left, mem_class)``: ``fgd``'s rank of a node (lower is better) for
        a task of GPU demand ``d``, ``cpu`` milli-CPU and ``mib`` MiB on a node of signature
        ``sid`` with ``cpu_left`` free milli-CPU and bucket memory class ``mem_class`` (read
        as :meth:`mem_left`; ignored without the memory term): minus the FGD plugin's
        integer score of the growth :meth:`delta` (:func:`~.workload.fgd_score_from_delta`,
        ``fgd_score.go``) when ``quantize``, else the growth rounded to 1e-6; None when the
        GPUs do not fit.

        Ranks are cached by the levels (:meth:`level`) before and after the task (F depends
        on free CPU and memory only through them), so requests that differ only in CPU or
        memory share entries. The function is valid until the workload changes (get a new
        one per decision)."""
        self._parsed()
        if self._mmul > 1:
            return self._ranker_mem(d, cpu, quantize, mib)
        lv = self._cpu_levels
        table = self._rank_table(d, quantize)
        afters = self.after_table(d)
        scores = self._score
        score_at = self._score_at
        after_of = self.after
        miss = _MISS
        mul = self._lvmul

        def rank(sid: int, cpu_left: int, _mem: int = 0) -> int | float | None:
            la = bisect_right(lv, cpu_left - cpu)
            lb = bisect_right(lv, cpu_left)
            k = (sid * mul + la) * mul + lb  # an int key (see _score)
            r = table.get(k, miss)
            if r is not miss:
                return r  # type: ignore[return-value]
            after = afters.get(sid, miss)
            if after is miss:
                after = after_of(sid, d)
            if after is None:
                table[k] = None
                return None
            a = scores.get(after * mul + la)
            if a is None:
                a = score_at(after, la, False)
            b = scores.get(sid * mul + lb)
            if b is None:
                b = score_at(sid, lb, False)
            delta = a - b
            out = table[k] = -fgd_score_from_delta(delta) if quantize else round(delta, 6)
            return out

        return rank

    def grower(self, d: Demand, cpu: int, mib: int = 0) -> Callable[[int, int, int], float]:
        """``growth(sid, cpu_left, mem_left)``: the growth of F (milli-GPU) when a task of GPU
        demand ``d``, ``cpu`` milli-CPU and ``mib`` MiB lands on a node of signature ``sid``
        with ``cpu_left`` free milli-CPU and ``mem_left`` free MiB: :meth:`delta`'s value, to
        the bit, with ``math.inf`` where the task does not fit (its CPU, its GPUs, or,
        memory-aware, its memory). F depends on free CPU and memory only through the node's
        level (:meth:`level`), so the values are kept per (signature, level before, level
        after) in the function's own memo: far fewer misses than :meth:`delta`'s cache, keyed
        by exact free amounts. Valid for the current workload only (a new one bumps
        :attr:`epoch`; ask for a new function then)."""
        self._parsed()
        cl = self._cpu_levels
        ml = self._mem_levels
        mm = self._mmul
        mul = self._lvmul
        canon = self._canon
        afters = self.after_table(d)
        after_of = self.after
        scores = self._score
        score_at = self._score_at
        aware = self.memory_aware
        inf = math.inf
        miss = _MISS
        memo: dict[int, float] = {}

        def growth(sid: int, cpu_left: int, mem_left: int) -> float:
            if cpu_left < cpu or (aware and mem_left < mib):
                return inf
            la = canon[bisect_right(cl, cpu_left - cpu) * mm + bisect_right(ml, mem_left - mib)]
            lb = canon[bisect_right(cl, cpu_left) * mm + bisect_right(ml, mem_left)]
            k = (sid * mul + la) * mul + lb
            g = memo.get(k)
            if g is not None:
                return g
            after = afters.get(sid, miss)
            if after is miss:
                after = after_of(sid, d)
            if after is None:
                g = inf
            else:
                a = scores.get(after * mul + la)
                if a is None:
                    a = score_at(after, la, mem_left < mib)
                b = scores.get(sid * mul + lb)
                if b is None:
                    b = score_at(sid, lb, mem_left < 0)
                g = a - b
            if len(memo) > 200_000:
                memo.clear()
            memo[k] = g
            return g

        return growth

    def _rank_table(self, d: Demand, quantize: bool) -> dict[int, int | float | None]:
        """The rank cache of one GPU demand: packed (signature id, level after, level
        before) -> rank (bounded: cleared past 200,000 entries, all of them past 10,000
        demands)."""
        table = self._ranks.get((d, quantize))
        if table is None:
            if len(self._ranks) > 10_000:
                self._ranks.clear()
            table = self._ranks[(d, quantize)] = {}
        elif len(table) > 200_000:
            table.clear()
        return table

    def _ranker_mem(self, d: Demand, cpu: int, quantize: bool, mib: int
                    ) -> Callable[[int, int, int], int | float | None]:
        """:meth:`ranker` with the memory term: the levels also read the bucket's free memory
        (:meth:`mem_left`) before and ``mib`` less after."""
        table = self._rank_table(d, quantize)
        afters = self.after_table(d)
        after_of = self.after
        scores = self._score
        score_at = self._score_at
        cl = self._cpu_levels
        ml = self._mem_levels
        mm = self._mmul
        mul = self._lvmul
        canon = self._canon
        miss = _MISS
        low = _MEM_LOWS  # mem_low(c, True) of every class a MiB count can have

        def rank(sid: int, cpu_left: int, mem_cls: int = 0) -> int | float | None:
            # the levels inline, as :meth:`level` computes them (a rank index rebuild asks
            # this for every bucket)
            m = low[mem_cls]
            la = canon[bisect_right(cl, cpu_left - cpu) * mm + bisect_right(ml, m - mib)]
            lb = canon[bisect_right(cl, cpu_left) * mm + bisect_right(ml, m)]
            k = (sid * mul + la) * mul + lb
            r = table.get(k, miss)
            if r is not miss:
                return r  # type: ignore[return-value]
            after = afters.get(sid, miss)
            if after is miss:
                after = after_of(sid, d)
            if after is None:
                table[k] = None
                return None
            # m < mib is ranked (memory level 0 after), not refused: a node of the class may
            # have up to 1/8 more than m free, and the device plan decides
            a = scores.get(after * mul + la)
            if a is None:
                a = score_at(after, la, m < mib)
            b = scores.get(sid * mul + lb)
            if b is None:
                b = score_at(sid, lb, False)
            delta = a - b
            out = table[k] = -fgd_score_from_delta(delta) if quantize else round(delta, 6)
            return out

        return rank

    def delta(self, sid: int, cpu_left: int, d: Demand, cpu: int, mem_left: int = MEM_ANY,
              mib: int = 0) -> float | None:
        """Growth of F when a task of GPU demand ``d``, ``cpu`` milli-CPU and ``mib`` MiB is
        placed on a node with signature ``sid``, ``cpu_left`` free milli-CPU and ``mem_left``
        free MiB (GPUs taken the way :mod:`.devices` takes them, :func:`apply`); None if its
        GPUs (or, memory-aware, its memory) do not fit."""
        table = self.deltas(d, cpu, mib)
        key = (sid, cpu_left, mem_left)
        try:
            return table[key]
        except KeyError:
            pass
        after = self.after(sid, d)
        if len(table) > 200_000:
            table.clear()
        if after is None or (self.memory_aware and mem_left < mib):
            out = None
        else:
            out = (self.score(after, cpu_left - cpu, mem_left - mib)
                   - self.score(sid, cpu_left, mem_left))
        table[key] = out
        return out

    def deltas(self, d: Demand, cpu: int, mib: int = 0
               ) -> dict[tuple[int, int, int], float | None]:
        """The cache of :meth:`delta` for one request: ``(signature id, free milli-CPU, free
        MiB) -> growth``. A policy looks there first and calls :meth:`delta` on a miss."""
        table = self._delta.get((d, cpu, mib))
        if table is None:
            if len(self._delta) > 10_000:
                self._delta.clear()
            table = self._delta[(d, cpu, mib)] = {}
        return table

    def keys(self, d: Demand, cpu: int, quantize: bool, mib: int = 0
             ) -> dict[tuple, float | int | None]:
        """A cache for a policy that ranks nodes by a function of :meth:`delta` (``fgd``'s
        integer plugin score, or the rounded growth): ``bucket key -> rank key`` for one
        request of ``mib`` MiB (counted only when memory-aware), cleared whenever the deltas
        are (a new workload)."""
        k = (d, cpu, quantize, mib if self.memory_aware else 0)
        table = self._keys.get(k)
        if table is None:
            if len(self._keys) > 10_000:
                self._keys.clear()
            table = self._keys[k] = {}
        elif len(table) > 200_000:
            table.clear()
        return table
