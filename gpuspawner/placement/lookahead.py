"""``fgd-lookahead`` on the ledger (ours): among the nodes whose FGD score is within one of the
best, the one after which the likely next requests fit with the least fragmentation growth.

The rule is the simulator's ``PaperCluster._lookahead`` (``gpuspawner/simulate/paper.py``;
docs/placement.md "Beyond FGD", where it is measured against the FGD paper's FGD on the
paper's 17 traces), on the ledger's buckets instead of single nodes. Nodes of one bucket
(same GPU signature, free cores and memory class, :class:`~.ledger_index.LedgerIndex`) are
equal for fragmentation, so the look-ahead scores buckets:

1. Candidates: the buckets whose FGD rank (minus the plugin's integer score,
   :meth:`~.fragmentation.FragmentationModel.ranker`) is within :data:`SLACK` of the best, the
   first :data:`CANDIDATES` by their smallest node name (FGD's tie order).
2. For each candidate, the bundle placed there (:func:`~.fragmentation.apply`); for each of
   the :data:`TYPES` most likely types *u* of the fragmentation model's workload (frequencies
   renormalised), the smallest exact growth *u* could then get: on the candidate's new state,
   or on any other bucket now (the best bucket, or the second best when the best is the
   candidate and holds one node only). A type that fits nowhere costs its milli-GPU.
3. Value = :data:`OWN` x the bundle's own exact growth there + the expectation of 2.
   Candidates are tried by value, ties by name; when none has room (the device plan refuses)
   the plain ``fgd`` order follows.

Under a memory-aware policy (``fgd-mem-lookahead``) growths are the memory-aware ones, each
type *u* asks the memory it typically asks (``FragmentationModel.memory``) and a bucket's free
memory is its class's lower bound (:meth:`~.fragmentation.FragmentationModel.mem_left`), as
the simulator's ``fgd-mem-lookahead`` does with exact free memory.

Not applied while the workload has no type asking for whole GPUs
(:meth:`~.fragmentation.FragmentationModel.asks_whole_gpus`): on GPU shares and CPU-only pods
alone the look-ahead left more GPUs idle than ``fgd`` (docs/placement.md "Share-only
workloads"), so there the policy is ``fgd``.

Units: milli-GPU (growths), milli-CPU. Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush, nsmallest

from .fragmentation import Demand, FragmentationModel, allowed_models
from .workload import PodType

#: FGD ranks within this of the best are candidates (the plugin's integer score)
SLACK = 1
#: at most this many candidate buckets, by smallest node name
CANDIDATES = 8
#: the next-request types: this many of the workload's most likely
TYPES = 5
#: weight of the bundle's own exact growth on the candidate
OWN = 0.5

#: the look-ahead policies' settings: policy name -> (next-request types, candidate
#: buckets). The cheaper variants look at fewer next types and/or fewer candidates
#: (docs/placement.md "A cheaper look-ahead"); each is its name's policy with the memory term
#: and ``fgd`` otherwise
SETTINGS: dict[str, tuple[int, int]] = {
    "fgd-lookahead": (TYPES, CANDIDATES),
    "fgd-mem-lookahead": (TYPES, CANDIDATES),
    "fgd-mem-lookahead-t3": (3, CANDIDATES),
    "fgd-mem-lookahead-t2": (2, CANDIDATES),
    "fgd-mem-lookahead-t2c4": (2, 4),
    "fgd-mem-lookahead-c4": (TYPES, 4),
}

Key = tuple[int, int, int]  # (signature id, free cores, memory class): a ledger bucket


def type_demand(t: PodType) -> tuple[Demand, int]:
    """A workload type as the fragmentation model's :class:`~.fragmentation.Demand` (not
    NUMA-aligned) and its milli-CPU."""
    models = allowed_models(t)
    if not t.milli_gpu:
        return Demand(0, 0, models, False), t.milli_cpu
    if t.is_share:
        return Demand(0, t.milli_gpu, models, False), t.milli_cpu
    return Demand(t.gpu_number, 0, models, False), t.milli_cpu


def next_types(frag: FragmentationModel, types: int = TYPES
               ) -> list[tuple[Demand, int, float, int, int]]:
    """The ``types`` (:data:`TYPES`) most likely types of ``frag``'s workload as ``(demand,
    milli-CPU, probability renormalised over them, total milli-GPU, memory MiB)`` (memory 0
    without the memory term); empty without a workload. Ties in probability keep the
    workload's order (a stable sort), so the first ``k`` of ``k + 1`` types are the ``k``."""
    top = sorted(frag.workload, key=lambda tp: -tp[1])[:types]
    total = sum(p for _, p in top)
    if not total:
        return []
    mem = frag.memory if frag.memory_aware else {}
    return [(*type_demand(t), p / total, t.total_milli_gpu, mem.get(t, 0)) for t, p in top]


def _growth(frag: FragmentationModel, sid: int, cores: int, d: Demand, cpu: int,
            mem_left: int, mib: int) -> float:
    if cores * 1000 < cpu:
        return math.inf
    g = frag.delta(sid, cores * 1000, d, cpu, mem_left, mib)
    return math.inf if g is None else g


def _growers(state: dict, frag: FragmentationModel,
             nxt: list[tuple[Demand, int, float, int, int]]) -> list:
    """Per next type, its :meth:`~.fragmentation.FragmentationModel.grower` (the same values
    as :func:`_growth`, memoised by level), kept in ``state`` until the workload changes."""
    if state.get("grow_for") != frag.epoch:
        state["grow_for"] = frag.epoch
        state["grow"] = [frag.grower(du, cu, mu) for du, cu, _p, _m, mu in nxt]
    return state["grow"]


def _best_two(state: dict, frag: FragmentationModel, buckets: dict[Key, dict],
              created: list[Key], nxt: list[tuple[Demand, int, float, int, int]]
              ) -> list[tuple[float, Key | None, float]]:
    """Per next type: (best growth over the buckets, its key, best growth on another key).

    Kept across decisions in ``state`` (the ledger's ``LedgerIndex.lookahead``): one min-heap
    of (growth, key) per type; a bucket's growth for a type depends only on its key (GPU
    signature, free cores and, memory-aware, memory class), so an entry stays right while its
    bucket exists. New buckets come from ``created`` (``LedgerIndex.created``, appended by the
    ledger), gone ones are dropped when they reach the top (lazy deletion). Rebuilt from
    ``buckets`` when the workload or the types' memory changes (``FragmentationModel.epoch``)
    or when ``created`` has grown past twice the buckets."""
    grow = _growers(state, frag, nxt)
    ml = frag.mem_left
    inf = math.inf
    if state.get("epoch") != frag.epoch or len(created) > 2 * len(buckets) + 1024:
        heaps: list[list[tuple[float, Key]]] = []
        for g_of in grow:
            h = [(g, key) for key in buckets
                 if (g := g_of(key[0], key[1] * 1000, ml(key[2]))) != inf]
            heapify(h)
            heaps.append(h)
        created.clear()
        state.update(epoch=frag.epoch, heaps=heaps, seen=0)
        state["tops"] = None
    heaps = state["heaps"]
    # tops: per type (growth, key) of the best entry and of the best on another key (None:
    # none), from the last call; right while both keys' buckets exist (entries only go stale
    # between calls) and updated here with each entry pushed, so that the heaps are read
    # only when a top's bucket is gone
    tops = state["tops"]
    seen = state["seen"]
    if seen < len(created):
        for key in created[seen:]:
            if key in buckets:
                cpu_left, m = key[1] * 1000, ml(key[2])
                for i, (g_of, h) in enumerate(zip(grow, heaps, strict=True)):
                    g = g_of(key[0], cpu_left, m)
                    if g != inf:
                        e = (g, key)
                        heappush(h, e)
                        if tops is not None:
                            t1, t2 = tops[i]
                            if t1 is None or key == t1[1] or (t2 is not None and key == t2[1]):
                                tops = None  # not a case worth updating in place
                            elif e < t1:
                                tops[i] = (e, t1)
                            elif t2 is None or e < t2:
                                tops[i] = (t1, e)
        state["seen"] = len(created)
    if tops is not None:
        out = []
        for t1, t2 in tops:
            if t1 is None or t1[1] not in buckets or (t2 is not None and t2[1] not in buckets):
                break
            out.append((t1[0], t1[1], inf if t2 is None else t2[0]))
        else:
            state["tops"] = tops
            return out
    out = []
    tops = []
    for h in heaps:
        while h and h[0][1] not in buckets:
            heappop(h)
        if not h:
            out.append((inf, None, inf))
            tops.append((None, None))
            continue
        top = heappop(h)
        while h and (h[0][1] not in buckets or h[0][1] == top[1]):
            heappop(h)  # a gone bucket, or a second entry of the top's (re-created) one
        second = h[0] if h else None
        heappush(h, top)
        out.append((top[0], top[1], inf if second is None else second[0]))
        tops.append((top, second))
    state["tops"] = tops
    return out


#: at most this many candidate terms are kept (:func:`order`); past it they are dropped
MAX_TERMS = 200_000


def _terms(frag: FragmentationModel, key: Key, d: Demand, cores: int, mib: int,
           grow: list) -> tuple[float, tuple[float, ...]]:
    """The parts of a candidate's value that depend only on its bucket ``key`` and the bundle
    (and the workload): :data:`OWN` x the bundle's own exact growth there, and for each next
    type (``grow``: :func:`_growers`) the growth it would get on the candidate's new state
    (inf: it does not fit there)."""
    sid, free, mem = key
    after = frag.after(sid, d)
    left = free - cores
    m0 = frag.mem_left(mem)
    m1 = m0 - mib if frag.memory_aware else m0
    if after is None:  # pragma: no cover - near holds buckets whose GPUs fit
        return math.nan, ()
    own = (OWN * (frag.score(after, left * 1000, m1) - frag.score(sid, free * 1000, m0))
           if OWN else 0.0)
    return own, tuple(g_of(after, left * 1000, m1) for g_of in grow)


def order(frag: FragmentationModel, buckets: dict[Key, dict], created: list[Key],
          state: dict, near: list[tuple[str, Key]], d: Demand, cores: int,
          mib: int = 0, types: int = TYPES, candidates: int = CANDIDATES,
          local: Callable[..., Callable[[Key], tuple[float, tuple[float, ...]] | None]]
          | None = None) -> list[Key]:
    """The candidate buckets ``near`` (``(smallest node name, key)``, already within
    :data:`SLACK` of the best FGD rank and able to take ``cores``) in look-ahead order (module
    docstring) for a bundle of GPU demand ``d``, ``cores`` cores and ``mib`` MiB (read only
    when memory-aware): at most ``candidates`` (:data:`CANDIDATES`), the first by smallest node
    name, sorted by value then name; the next-request types are the ``types`` (:data:`TYPES`)
    most likely (:func:`next_types`). ``buckets``: key -> {node name: state}; ``created``
    and ``state``: see :func:`_best_two`.

    A candidate's terms that depend only on its bucket key and the bundle (:func:`_terms`)
    are kept in ``state`` per bundle until the workload or the types' memory changes
    (``FragmentationModel.epoch``): a bucket key fixes its nodes' GPU signature, free cores
    and memory class, which is all the terms read. Only the best growths elsewhere
    (:func:`_best_two`) are read anew at each decision. Same values, to the bit, as computing
    every term at every decision (tests/test_placement_decisions.py).

    ``local`` (strict bundles under a memory-aware policy, :mod:`.numa_local`): called as
    ``local(state, next types)``, it gives ``terms(key)``, the candidate's terms read per
    NUMA node on the bucket's first node (None: that node has no room; the candidate is
    left out), used instead of the bucket-level :func:`_terms`."""
    near = nsmallest(candidates, near)
    if state.get("types_for") != (frag.epoch, types):
        # the per-type heaps (_best_two) and growers follow the types: start them afresh
        state.pop("epoch", None)
        state.pop("grow_for", None)
        state["types_for"], state["types"] = (frag.epoch, types), next_types(frag, types)
        state["terms"] = {}
        state["terms_n"] = 0
    nxt = state["types"]
    if len(near) <= 1 or not nxt:
        return [key for _name, key in near]
    best = _best_two(state, frag, buckets, created, nxt)
    shape = (d, cores, mib)
    kept = state["terms"].get(shape)
    if kept is None:
        if state["terms_n"] > MAX_TERMS:
            state["terms"].clear()
            state["terms_n"] = 0
        kept = state["terms"][shape] = {}
    inf = math.inf
    scored = []
    local_of = None if local is None else local(state, nxt)
    for name, key in near:
        if local_of is not None:
            got = local_of(key)
            if got is None:
                continue
        else:
            got = kept.get(key)
            if got is None:
                got = kept[key] = _terms(frag, key, d, cores, mib, _growers(state, frag, nxt))
                state["terms_n"] += 1
        v, heres = got
        if v != v:  # pragma: no cover - nan: the candidate's GPUs do not fit
            continue
        single = len(buckets[key]) == 1
        for (_du, _cu, p, milli, _mu), here, (b1, k1, b2) in zip(nxt, heres, best,
                                                                  strict=True):
            other = b2 if single and k1 == key else b1
            g = other if other < here else here  # min(here, other), as min() picks
            v += p * (milli if g == inf else g)
        scored.append((round(v, 9), name, key))
    scored.sort()
    return [key for _v, _name, key in scored]


__all__ = ["CANDIDATES", "MAX_TERMS", "OWN", "SETTINGS", "SLACK", "TYPES", "next_types", "order",
           "type_demand"]
