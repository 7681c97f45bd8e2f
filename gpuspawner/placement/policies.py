"""Level one of the placement: which node. Two-level scheduling as in Backend.AI's Sokovan
(seed 003): a node-selection policy picks the node, then :mod:`.devices` picks the devices.

Policies, selectable by name (``POLICIES``):

``fgd``
    Fragmentation gradient descent (Weng et al., "Beware of Fragmentation", USENIX ATC '23;
    simulator ``pkg/simulator/plugin/fgd_score.go``): the node whose fragmentation
    (:mod:`.fragmentation`: frag.go's definition, CPU included, NUMA-aware) over the target
    workload grows least; ties to the smallest node name.
``fgd-lookahead``
    ``fgd``, then among the nodes within one score of the best the one after which the likely
    next requests fit with the least fragmentation growth (:mod:`.lookahead`; ours, measured
    in docs/placement.md "Beyond FGD").
``fgd-mem``, ``fgd-mem-lookahead`` (default, :data:`DEFAULT_POLICY`)
    ``fgd`` and ``fgd-lookahead`` with memory-aware fragmentation (:mod:`.fragmentation`: a
    task type whose memory does not fit the node counts all its free GPU; ours, measured in
    docs/placement.md "Memory-aware fragmentation" and "The default policy").
``fgd-mem-lookahead-t3``, ``-t2``, ``-t2c4``, ``-c4``
    ``fgd-mem-lookahead`` looking at fewer next-request types (3 or 2 instead of 5) and/or
    fewer candidate buckets (4 instead of 8) (:data:`.lookahead.SETTINGS`; docs/placement.md
    "A cheaper look-ahead").
``best-fit``, ``dot-product``, ``gpu-packing``, ``gpu-clustering``, ``random``
    The paper's baselines, scored as in :mod:`.baselines` (highest score, ties by node name;
    ``random`` uniform among nodes that fit, seeded).
``first-fit``
    The first node, in configuration order, that fits.
``spread``
    The node with the most free capacity of what the bundle asks for most.
``pack``
    Our earlier best fit: least free GPU, then cores, then memory left, as fractions.

A policy gets the cluster view, the bundle, whether NUMA spill is allowed and an optional node
filter, and returns ``(node state, device plan)`` or None.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from heapq import heapify, heappop, heappush, heapreplace
from typing import Protocol

from .baselines import (
    PaperNode,
    ScoreFn,
    score_best_fit,
    score_dot_product,
    score_gpu_clustering,
    score_gpu_packing,
)
from .devices import min_numa_count, plan, quick_fit
from .fragmentation import Demand, FragmentationModel
from .lookahead import CANDIDATES, OWN, SETTINGS, SLACK, TYPES
from .lookahead import order as lookahead_order
from .model import GPU_MILLI, Bundle, mig_slices
from .numa_local import local_terms
from .rank_index import ShapeRanks, first_name
from .state import NodeState, Plan
from .workload import PodType

Choice = tuple[NodeState, Plan]
NodeFilter = Callable[[NodeState], bool]


class ClusterView(Protocol):
    """What a policy may read: node states in configuration order, the GPU-signature buckets,
    the fragmentation model and a seeded random generator."""

    states: list[NodeState]
    buckets: dict[tuple[int, int, int], dict[str, NodeState]]
    versions: dict[tuple[int, int, int], int]
    no_fit: dict[int, dict[tuple[int, int, int], int]]
    spent: dict[int, dict[tuple[int, int, int], int]]
    shapes: dict[tuple, int]
    frag: FragmentationModel
    rng: random.Random
    affinity: dict[str, dict[str, int]]
    quantize: bool
    one_numa: dict[tuple, tuple[int, bool]]
    first_name: dict[tuple[int, int, int], str]
    by_sid: dict[int, dict[tuple[int, int, int], None]]
    by_name: dict[str, NodeState]
    profiles: dict[tuple, NodeState]
    created: list[tuple[int, int, int]]
    lookahead: dict
    changed: dict[tuple[int, int, int], int]
    change_seq: int
    rank_heaps: dict


def demand_of(bundle: Bundle, aligned: bool) -> Demand:
    """The bundle as a fragmentation task type."""
    return Demand(bundle.gpus, bundle.gpu_milli,
                  frozenset(m.lower() for m in bundle.gpu_models), aligned)


def _try(states: Iterable[NodeState], bundle: Bundle, spill: bool,
         ok: NodeFilter | None) -> Choice | None:
    for st in states:
        if ok is not None and not ok(st):
            continue
        if quick_fit(st, bundle, not spill):
            p = plan(st, bundle, spill)
            if p is not None:
                return st, p
    return None


def first_fit(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """The first node in configuration order with room."""
    return _try(c.states, bundle, spill, ok)


def _left(st: NodeState, bundle: Bundle) -> tuple[float, float, float]:
    gpu_cap = len(st.gpu_used) * GPU_MILLI or 1
    cpu_cap = st.node.cpu_count or 1
    mem_cap = st.node.memory_bytes or 1
    return ((st.free_gpu_milli() - bundle.total_gpu_milli) / gpu_cap,
            (st.free_cpu_count() - bundle.cores) / cpu_cap,
            (st.free_memory() - bundle.memory_bytes) / mem_cap)


def best_fit(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """``pack`` (our best fit before the paper's): least free capacity left (GPU, then cores,
    then memory, as fractions), ties by configuration order."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]
    fits.sort(key=lambda st: (_left(st, bundle), st.order))
    return _try(fits, bundle, spill, None)


def spread(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """Most free capacity of the bundle's main resource (GPUs for GPU bundles, else cores)."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]

    def key(st: NodeState):
        g, cpu, mem = _left(st, bundle)
        return ((-g, -cpu, -mem) if bundle.total_gpu_milli else (-cpu, -mem, g)), st.order

    fits.sort(key=key)
    return _try(fits, bundle, spill, None)


def random_fit(c: ClusterView, bundle: Bundle, spill: bool,
               ok: NodeFilter | None) -> Choice | None:
    """A random node with room (uniform among those that pass the quick check)."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]
    while fits:
        i = c.rng.randrange(len(fits))
        st = fits[i]
        p = plan(st, bundle, spill)
        if p is not None:
            return st, p
        fits[i] = fits[-1]
        fits.pop()
    return None


_MISS = object()

#: ``fgd`` decides from the candidate buckets kept across decisions (:mod:`.rank_index`);
#: False: from a pass over every bucket with the same caches (tests/test_rank_index.py
#: checks that both decide alike)
RANK_INDEX = True


def pod_type_of(bundle: Bundle) -> PodType:
    """The bundle as a fragmentation task type (:class:`~.workload.PodType`): cores x 1000
    milli-CPU, whole GPUs or a share, the allowed models."""
    if bundle.gpus:
        return PodType(bundle.cores * 1000, GPU_MILLI, bundle.gpus, "|".join(bundle.gpu_models))
    if bundle.gpu_milli:
        return PodType(bundle.cores * 1000, bundle.gpu_milli, 1, "|".join(bundle.gpu_models))
    return PodType(bundle.cores * 1000)


def fgd(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """Fragmentation gradient descent: the node whose fragmentation F (:mod:`.fragmentation`,
    frag.go's definition with CPU, over the target workload) grows least when the bundle lands
    there, compared as the simulator's plugin does (``fgd_score.go``
    ``calculateGpuShareFragExtendScore``: the integer score ``int(sigmoid(-growth / 1000) *
    100)``, :func:`~.workload.fgd_score_from_delta`); equal scores go to the smallest node name
    (the simulator's ``selectHost``). The coarse score matters: comparing exact growths left
    far more GPUs idle in the paper method (docs/placement.md); ``ClusterView.quantize =
    False`` compares them exactly. Nodes are bucketed by (GPU signature, free cores, memory
    class), so a decision scores each bucket once, from cache while the bucket is unchanged.

    NUMA (ours): an aligned bundle of >= 2 whole GPUs first considers only nodes where the
    whole bundle (GPUs, cores, memory) fits one NUMA node, and the others only when none of
    those has room, so its GPUs share one NUMA node whenever any node allows it.

    MIG (ours, :func:`_fgd_mig`): a MIG bundle goes through :func:`_fgd_mig`; whole-GPU and
    share bundles never see MIG GPUs (counted fully used), so their decisions are unchanged."""
    if bundle.mig:
        return _fgd_mig(c, bundle, spill, ok)
    if not spill and bundle.gpus >= 2 and _one_numa_possible(c, bundle):
        def one_numa(st: NodeState) -> bool:
            return (ok is None or ok(st)) and min_numa_count(st, bundle) == 1

        got = _fgd(c, bundle, spill, one_numa, static=ok is None)
        if got is not None:
            return got
    return _fgd(c, bundle, spill, ok)


def fgd_lookahead(c: ClusterView, bundle: Bundle, spill: bool,
                  ok: NodeFilter | None, look: tuple[int, int] = (TYPES, CANDIDATES),
                  numa_local: bool = False) -> Choice | None:
    """``fgd`` with a one-step look-ahead among the near-best nodes (:mod:`.lookahead`): the
    same NUMA pass first for aligned multi-GPU bundles, the same MIG rule; where the
    look-ahead's candidates have no room, ``fgd``'s own order. Equal to ``fgd`` when the
    fragmentation model has no workload yet. ``look``: (next-request types, candidate
    buckets) of the look-ahead (:data:`.lookahead.SETTINGS`). ``numa_local``: a ``strict``
    bundle's candidates are read per NUMA node (:mod:`.numa_local`,
    ``fgd-mem-lookahead-numa``)."""
    if bundle.mig:
        return _fgd_mig(c, bundle, spill, ok)
    if not spill and bundle.gpus >= 2 and _one_numa_possible(c, bundle):
        def one_numa(st: NodeState) -> bool:
            return (ok is None or ok(st)) and min_numa_count(st, bundle) == 1

        # not static: shared no-fit results would leave buckets out of the look-ahead's
        # candidates that this pass used to offer it, and change its decisions
        got = _fgd(c, bundle, spill, one_numa, look=look, numa_local=numa_local)
        if got is not None:
            return got
    return _fgd(c, bundle, spill, ok, look=look, numa_local=numa_local)


def _lookahead_policy(name: str, numa_local: bool = False) -> PolicyFn:
    """:func:`fgd_lookahead` with the settings of ``name`` in :data:`.lookahead.SETTINGS`
    (``numa_local``: of :data:`NUMA_LOCAL_POLICIES` ``[name]``, read per NUMA node)."""
    look = SETTINGS[NUMA_LOCAL_POLICIES.get(name, name)]

    def policy(c: ClusterView, bundle: Bundle, spill: bool,
               ok: NodeFilter | None) -> Choice | None:
        return fgd_lookahead(c, bundle, spill, ok, look, numa_local)

    policy.__name__ = policy.__qualname__ = name.replace("-", "_")
    policy.__doc__ = (f"{fgd_lookahead.__doc__.splitlines()[0]} ({name}: "
                      f"{look[0]} next types, {look[1]} candidates"
                      f"{', strict bundles read per NUMA node' if numa_local else ''})")
    return policy


def _fgd_mig(c: ClusterView, bundle: Bundle, spill: bool,
             ok: NodeFilter | None) -> Choice | None:
    """FGD for a MIG bundle. How fragmentation counts MIG slices: frag.go's rule (Weng et al.,
    ATC '23, section 3: the free GPU resource a task type cannot use is fragment for it)
    applied to MIG's fixed partitions (NVIDIA MIG user guide: an instance is a static GPU
    partition and a CUDA process sees only the instance it was given): a free instance counts
    as a free device of its slice size (``slices / 7 * 1000`` milli-GPU,
    :func:`~.model.mig_milli`) usable only by task types asking for its profile, so it is
    fragment for every other task type, whole-GPU and share types included. Landing a MIG task
    of profile p takes one free p instance: for task types not asking for p the node's
    fragmentation falls by that instance's milli-GPU, for those asking for p it is unchanged.
    The growth is the same on every node with a free p instance (the layout is static; we do
    not repartition), so FGD's choice among them is decided by the tie-break, for which we
    use best fit on slices (ours): the node with the fewest free MIG slices left after the
    bundle lands, then the smallest node name (the simulator's ``selectHost``). Nodes are
    asked through the device interface (:func:`~.devices.quick_fit`, :func:`~.devices.plan`)."""
    need = bundle.mig_units * mig_slices(bundle.mig)
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle, not spill)]
    fits.sort(key=lambda st: (st.free_mig_slices() - need, st.name))
    return _try(fits, bundle, spill, None)


def _one_numa_possible(c: ClusterView, bundle: Bundle) -> bool:
    """True when some node could hold the bundle on one NUMA node if it were empty
    (:func:`~.devices.min_numa_count` is 1); otherwise ``fgd``'s one-NUMA-node pass cannot
    find anything and is skipped. It depends on the hardware only, so one node of each
    hardware profile (``ClusterView.profiles``) is asked; cached per bundle shape while the
    profiles stay the same."""
    key = (bundle.gpus, bundle.gpu_milli > 0, bundle.gpu_models, bundle.cores,
           bundle.memory_bytes)
    n = len(c.profiles)
    got = c.one_numa.get(key)
    if got is None or got[0] != n:
        if len(c.one_numa) > 10_000:
            c.one_numa.clear()
        got = c.one_numa[key] = (n, any(min_numa_count(st, bundle) == 1
                                        for st in c.profiles.values()))
    return got[1]


def _fgd(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None,
         look: tuple[int, int] | None = None, static: bool = False,
         numa_local: bool = False) -> Choice | None:
    """``fgd``'s choice among the nodes ``ok`` accepts (all when None). ``static``: ``ok``
    depends only on the nodes' hardware (``fgd``'s one-NUMA-node pass), so what it rejects
    stays rejected and the shape's caches (no-fit, spent, :mod:`.rank_index`) may be kept
    across decisions as for an unfiltered one, under their own shape."""
    d = demand_of(bundle, aligned=not spill)
    frag = c.frag
    # the look-ahead acts only on a workload with a whole-GPU type (workload.asks_whole_gpus)
    if look is not None and not frag.asks_whole_gpus():
        look = None
    cores = bundle.cores
    cpu = cores * 1000
    mib = bundle.memory_bytes >> 20
    need = frag.mem_need(mib)  # a bucket of a smaller memory class cannot hold the bundle
    if ok is None or static:
        shape = c.shapes.get((bundle, spill, static))
        if shape is None:
            if len(c.shapes) > 10_000:
                c.shapes.clear()
                c.no_fit.clear()
                c.spent.clear()
                c.rank_heaps.clear()
            shape = c.shapes[(bundle, spill, static)] = len(c.shapes)
        no_fit = c.no_fit.setdefault(shape, {})
        spent = c.spent.setdefault(shape, {})
    else:
        no_fit = {}
        spent = {}
    quantize = c.quantize
    # bucket key -> rank, cached until the workload changes
    ranks = frag.keys(d, cpu, quantize, mib)
    rank_of = frag.ranker(d, cpu, quantize, mib)
    if (ok is None or static) and quantize and RANK_INDEX:
        return _fgd_ranked(c, ShapeRanks(c, shape, d, cores, need, ranks, rank_of, no_fit), d,
                           bundle, spill, ok, spent, look, numa_local)
    versions = c.versions
    miss = _MISS
    afters = frag.after_table(d)

    # one pass over the buckets: (rank, bucket key) of every bucket that may take the bundle
    # (signatures whose GPUs cannot take it are skipped with all their buckets); the best
    # group usually has room, so the others are sorted only when it has not
    cands: list[tuple[float, tuple[int, int, int]]] = []
    append = cands.append
    best = None
    for sid, keys in c.by_sid.items():
        after = afters.get(sid, miss)
        if after is miss:
            after = frag.after(sid, d)
        if after is None:
            continue
        for key in keys:
            if cores > key[1] or key[2] < need:
                continue
            if no_fit and no_fit.get(key, -1) == versions[key]:
                continue
            rank = ranks.get(key, miss)
            if rank is miss:
                rank = ranks[key] = rank_of(sid, key[1] * 1000, key[2])
            if rank is not None:
                append((rank, key))
                if best is None or rank < best:
                    best = rank
    if best is None:
        return None
    if look is not None and quantize:
        # (smallest node name, key) of the buckets within SLACK of the best: tuples, so the
        # look-ahead picks its candidates by name in C (names are unique across buckets)
        lim = best + SLACK
        near = [(first_name(c, key), key) for rank, key in cands if rank <= lim]
        if len(near) > 1:
            for key in lookahead_order(frag, c.buckets, c.created, c.lookahead, near, d,
                                       cores, mib, *look,
                                       local=_local(c, bundle, spill, numa_local)):
                got = _try_keys(c, [key], bundle, spill, ok, spent)
                if got is not None:
                    return got
    best_keys = [key for rank, key in cands if rank == best]
    got = _try_keys(c, best_keys, bundle, spill, ok, spent)
    if got is not None:
        return got
    for k in best_keys:
        no_fit[k] = versions[k]  # the shape's, or a local one under a filter
    scored: dict[float, list[tuple[int, int, int]]] = {}
    for rank, key in cands:
        if rank != best:
            scored.setdefault(rank, []).append(key)
    for rank in sorted(scored):
        keys = scored[rank]
        got = _try_keys(c, keys, bundle, spill, ok, spent)
        if got is not None:
            return got
        for k in keys:
            no_fit[k] = versions[k]
    return None


#: look-ahead policies that read a strict bundle's candidates per NUMA node
#: (:mod:`.numa_local`): name -> the :data:`.lookahead.SETTINGS` they take. Not the default:
#: 16.9 % fewer idle GPUs than ``fgd`` under strict NUMA on the default pod list, at about
#: twice the default's decision time (docs/placement.md "Strict NUMA and its cost")
NUMA_LOCAL_POLICIES: dict[str, str] = {"fgd-mem-lookahead-numa": "fgd-mem-lookahead"}


def _local(c: ClusterView, bundle: Bundle, spill: bool, numa_local: bool) -> Callable | None:
    """The look-ahead's per-NUMA candidate terms (:func:`~.numa_local.local_terms`) for a
    ``strict`` bundle under a memory-aware look-ahead policy of :data:`NUMA_LOCAL_POLICIES`,
    else None (bucket-level terms: every other policy and NUMA rule decides as before)."""
    if not numa_local or spill or bundle.numa_policy != "strict" or not c.frag.memory_aware:
        return None

    def make(state: dict, nxt: list) -> Callable:
        return local_terms(state, c.frag, c.buckets, lambda key: first_name(c, key), bundle,
                           nxt, OWN)

    return make


def _fgd_ranked(c: ClusterView, sr: ShapeRanks, d: Demand, bundle: Bundle, spill: bool,
                ok: NodeFilter | None, spent: dict[tuple[int, int, int], int],
                look: tuple[int, int] | None, numa_local: bool = False) -> Choice | None:
    """:func:`_fgd` for an unfiltered (or statically filtered) decision from the shape's
    candidate buckets kept across decisions (:mod:`.rank_index`) instead of a pass over every
    bucket: the same best rank, the same look-ahead candidates (the smallest names within one
    score of it) and the same walk (the best rank's nodes by name, then the next ranks'), so
    the same choice."""
    best = sr.best()
    if best is None:
        return None
    if look is not None:
        near = [e for r in range(best, best + SLACK + 1)
                for e in sr.smallest(r, look[1])]
        if len(near) > 1:
            for key in lookahead_order(c.frag, c.buckets, c.created, c.lookahead, near, d,
                                       bundle.cores, bundle.memory_bytes >> 20, *look,
                                       local=_local(c, bundle, spill, numa_local)):
                got = _try_keys(c, [key], bundle, spill, ok, spent)
                if got is not None:
                    return got
    got = _walk_rank(c, sr, best, bundle, spill, ok, spent)
    if got is not None:
        return got
    for r in sr.ranks_from(best):
        got = _walk_rank(c, sr, r, bundle, spill, ok, spent)
        if got is not None:
            return got
    return None


def _walk_rank(c: ClusterView, sr: ShapeRanks, r: int, bundle: Bundle, spill: bool,
               ok: NodeFilter | None, spent: dict[tuple[int, int, int], int]) -> Choice | None:
    """The first node with room among rank ``r``'s buckets, by name (:func:`_try_keys`'s
    walk and ``spent`` rule, over the rank's heap): the buckets come off the heap by smallest
    name as they are needed and go back on after. When no node has room, every bucket of the
    rank goes into the shape's no-fit cache (as :func:`_fgd` does) and stays off the heap."""
    buckets = c.buckets
    versions = c.versions
    aligned = not spill
    taken: list[tuple[str, tuple[int, int, int]]] = []  # entries off the heap
    keys: set[tuple[int, int, int]] = set()
    nxt: list[tuple[str, tuple[int, int, int]]] = []  # next names of buckets being walked
    sorted_names: dict[tuple[int, int, int], list] = {}
    top = sr.peek(r)
    while top is not None or nxt:
        if top is not None and (not nxt or top[0] < nxt[0][0]):
            sr.pop(r)
            name, k = top
            top = sr.peek(r)
            if k in keys:
                continue  # a second entry of a bucket
            keys.add(k)
            taken.append((name, k))
            if spent and spent.get(k, -1) == versions[k]:
                continue
        else:
            name, k = heappop(nxt)
        st = buckets[k][name]
        if (ok is None or ok(st)) and quick_fit(st, bundle, aligned):
            p = plan(st, bundle, spill)
            if p is not None:
                sr.put_back(r, taken)
                return st, p
        after = _next_name(buckets[k], k, sorted_names)
        if after is not None:
            heappush(nxt, (after, k))
        else:
            spent[k] = versions[k]
    for _name, k in taken:
        sr.no_fit[k] = versions[k]
    return None


def _try_keys(c: ClusterView, keys: list[tuple[int, int, int]], bundle: Bundle, spill: bool,
              ok: NodeFilter | None, spent: dict[tuple[int, int, int], int]) -> Choice | None:
    """The first node of these buckets, by name, that passes ``ok`` and has room (the quick
    check, then the device plan), with its plan; None when none has.

    Usually the smallest name is all that is tried (found from each bucket's smallest name,
    :func:`~.rank_index.first_name`, kept across decisions). When it fails, the rest follow in
    name order by a merge over the buckets (a heap of each bucket's next name), so a bucket's
    names are sorted only once its first node has failed.

    ``spent`` (the bundle shape's ``ClusterView.spent``: bucket key -> version) records the
    buckets all of whose nodes failed, at the bucket's version; such a bucket is skipped until
    its version changes (a node joined it or grew: bookings only shrink a node, so a node that
    failed fails again). Strict NUMA makes this common: a bucket key counts a node's free cores
    and memory over all its NUMA nodes, and a CPU-only bundle must find them on one. Skipped
    nodes are nodes that would fail, so the node chosen is the same."""
    buckets = c.buckets
    versions = c.versions
    aligned = not spill
    first = at = None
    for k in keys:
        if spent and spent.get(k, -1) == versions[k]:
            continue
        name = first_name(c, k)
        if first is None or name < first:
            first, at = name, k
    if first is None:
        return None
    st = buckets[at][first]  # type: ignore[index]
    if (ok is None or ok(st)) and quick_fit(st, bundle, aligned):
        p = plan(st, bundle, spill)
        if p is not None:
            return st, p
    # the merge: (name, key) of each bucket's next node; a failed node is replaced by the
    # next name of its bucket, or its bucket is spent
    heap = [(first_name(c, k), k) for k in keys
            if k != at and not (spent and spent.get(k, -1) == versions[k])]
    heap.append((first, at))  # type: ignore[arg-type]
    heapify(heap)
    sorted_names: dict[tuple[int, int, int], list] = {}
    while heap:
        name, k = heap[0]
        bucket = buckets[k]
        if name != first:
            st = bucket[name]
            if (ok is None or ok(st)) and quick_fit(st, bundle, aligned):
                p = plan(st, bundle, spill)
                if p is not None:
                    return st, p
        first = None  # the first node was tried above
        after = _next_name(bucket, k, sorted_names)
        if after is not None:
            heapreplace(heap, (after, k))
        else:
            heappop(heap)
            spent[k] = versions[k]
    return None


def _next_name(bucket: dict[str, NodeState], k: tuple[int, int, int],
               sorted_names: dict[tuple[int, int, int], list]) -> str | None:
    """In a walk by name, the name after the one just tried in bucket ``k`` (None: it was the
    last). ``sorted_names`` is the walk's: key -> [the bucket's names sorted, position], made
    when the bucket's first node has failed."""
    got = sorted_names.get(k)
    if got is None:
        got = sorted_names[k] = [sorted(bucket), 0]
    got[1] += 1
    return got[0][got[1]] if got[1] < len(got[0]) else None


# -- the FGD paper's baselines on the ledger: the same scores as .baselines, on whole cores --


def _paper_view(st: NodeState) -> PaperNode:
    """A :class:`~.baselines.PaperNode` view of a node (free cores x 1000 milli-CPU, memory MiB,
    free milli-GPU per GPU, the first GPU's model, GPU-affinity tags of its allocations)."""
    n = PaperNode(st.name, st.node.gpus[0].model if st.node.gpus else "",
                  st.node.cpu_count * 1000, st.node.memory_bytes >> 20, len(st.node.gpus))
    n.cpu_left = st.free_cpu_count() * 1000
    n.memory_left = st.free_memory() >> 20
    n.gpu_left = [GPU_MILLI - st.gpu_used[g.uuid] for g in st.node.gpus]
    return n


def _scored(fn: ScoreFn, c: ClusterView, bundle: Bundle, spill: bool,
            ok: NodeFilter | None) -> Choice | None:
    """Highest score first, ties by node name (``selectHost``), the first that fits."""
    t = pod_type_of(bundle)
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]
    shim = _PaperShim(c)
    keyed = []
    for st in fits:
        view = _paper_view(st)
        view.affinity = c.affinity.get(st.name, {})
        keyed.append((-fn(shim, view, t)[0], st.name, st))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return _try([st for _s, _n, st in keyed], bundle, spill, None)


class _PaperShim:
    """What the paper's score functions read from their cluster (``rng``, ``frag``)."""

    def __init__(self, c: ClusterView) -> None:
        self.rng = c.rng
        self.frag = None

    @staticmethod
    def quantize(delta: float) -> int:  # pragma: no cover - fgd is not scored through here
        return int(-delta)


def best_fit_paper(c: ClusterView, bundle: Bundle, spill: bool,
                   ok: NodeFilter | None) -> Choice | None:
    """The paper's BestFit (:func:`~.baselines.score_best_fit`, ``best_fit_score.go``): CPU and
    GPU left over, weighted 0.5 each, normalised by 128 CPUs and 8 GPUs."""
    return _scored(score_best_fit, c, bundle, spill, ok)


def dot_product(c: ClusterView, bundle: Bundle, spill: bool,
                ok: NodeFilter | None) -> Choice | None:
    """The paper's DotProd (:func:`~.baselines.score_dot_product`, ``dot_product_score.go``)."""
    return _scored(score_dot_product, c, bundle, spill, ok)


def gpu_packing(c: ClusterView, bundle: Bundle, spill: bool,
                ok: NodeFilter | None) -> Choice | None:
    """The paper's GpuPacking (:func:`~.baselines.score_gpu_packing`, ``gpu_packing_score.go``)."""
    return _scored(score_gpu_packing, c, bundle, spill, ok)


def gpu_clustering(c: ClusterView, bundle: Bundle, spill: bool,
                   ok: NodeFilter | None) -> Choice | None:
    """The paper's GpuClustering (:func:`~.baselines.score_gpu_clustering`,
    ``gpu_clustering_score.go``); GPU-affinity tags come from the node's allocations."""
    return _scored(score_gpu_clustering, c, bundle, spill, ok)


PolicyFn = Callable[[ClusterView, Bundle, bool, "NodeFilter | None"], "Choice | None"]

POLICIES: dict[str, PolicyFn] = {
    "fgd": fgd,
    "fgd-lookahead": fgd_lookahead,
    "fgd-mem": fgd,
    "fgd-mem-lookahead": fgd_lookahead,
    **{name: _lookahead_policy(name) for name in SETTINGS
       if name not in ("fgd-lookahead", "fgd-mem-lookahead")},
    **{name: _lookahead_policy(name, numa_local=True) for name in NUMA_LOCAL_POLICIES},
    "first-fit": first_fit,
    "best-fit": best_fit_paper,
    "dot-product": dot_product,
    "gpu-packing": gpu_packing,
    "gpu-clustering": gpu_clustering,
    "spread": spread,
    "random": random_fit,
    "pack": best_fit,
}

#: policies whose fragmentation also counts a task type whose memory does not fit (ours; the
#: ledger turns :attr:`~.fragmentation.FragmentationModel.memory_aware` on for them)
MEMORY_POLICIES = frozenset({"fgd-mem", *(n for n in SETTINGS if n.startswith("fgd-mem-")),
                             *NUMA_LOCAL_POLICIES})

#: old names kept working
ALIASES: dict[str, str] = {}

#: the policy of a ledger, a hub and the simulator unless one is named (the
#: memory-aware look-ahead left 4-15 % fewer GPUs idle than ``fgd`` on four held-out pod lists;
#: docs/placement.md "The default policy")
DEFAULT_POLICY = "fgd-mem-lookahead"


def get_policy(name: str) -> PolicyFn:
    """The policy function for a name.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return POLICIES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of "
                         f"{', '.join(POLICIES)}") from None
