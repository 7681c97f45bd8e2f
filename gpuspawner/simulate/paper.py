"""The FGD paper's simulator, ported: its fragmentation rule and the FGD, random, first-fit and
spread scores over a small milli-CPU cluster model (:class:`PaperCluster`) that applies them
with the baselines of :mod:`gpuspawner.placement.baselines`; the workload model (task types,
typical pods) is :mod:`gpuspawner.placement.workload`. It lived in ``gpuspawner.placement``;
the ledger never used the cluster model, only the pieces now in those two modules.

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23, and its simulator
github.com/hkust-adsl/kubernetes-scheduler-simulator (commit 8f3d641). Every rule below names
the Go file and function it follows. Pure: standard library only, no I/O.

Units: milli-CPU (1000 = one CPU), milli-GPU (1000 = one whole GPU), memory in MiB (the trace's
unit). A node's GPUs are a list of free milli-GPU per GPU, in device order.

What the Go code does and this module copies:

* **Scores are integers 0..100** (``framework.MaxNodeScore``) and the scheduler takes the
  highest, ties to the lexicographically smallest node name (the simulator's patched
  ``genericScheduler.selectHost`` in ``vendor/k8s.io/kubernetes/pkg/scheduler/core/
  generic_scheduler.go``). The simulator renames every node first, prefixing the name with
  its place in a random permutation (``Simulator.syncClusterResourceList``,
  ``pkg/simulator/simulator.go``: ``"%04d-" + name`` from ``rand.Perm``), so "smallest name"
  is a random node order per seed: :class:`PaperCluster`'s ``tie_order``.
  ``NormalizeScore`` (``plugin_utils.go``) maps scores min-max onto 0..100 with integer
  division; with scores already in 0..100 that keeps their order and their ties, so it is
  not applied here.
* **Filter** (``open_gpu_share.go`` ``GpuSharePlugin.Filter`` plus Kubernetes'
  ``NodeResourcesFit``): enough free milli-CPU and memory; for a GPU pod a node with GPUs of an
  allowed model and ``gpu_number`` GPUs each with at least ``milli_gpu`` free.
* **Which GPU inside the node** (``open_gpu_share.go`` ``allocateGpuId*``): whole GPUs take the
  first fully free GPUs in device order (``types.AllocateExclusiveGpuId``); a share goes, per
  the policy's ``gpuSelMethod``, to the fullest GPU with room (``best``, lowest index on ties),
  a uniformly random GPU with room (``random``) or the GPU with the best FGD score (``FGD``).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

from gpuspawner.placement.baselines import (
    PaperNode,
    ScoreFn,
    best_fit_gpu,
    score_best_fit,
    score_dot_product,
    score_gpu_clustering,
    score_gpu_packing,
    sub_pack,
)
from gpuspawner.placement.lookahead import SETTINGS as LOOKAHEAD_SETTINGS
from gpuspawner.placement.workload import (
    MAX_NODE_SCORE,
    MILLI,
    PodType,
    accessible,
    asks_whole_gpus,
    fgd_score_from_delta,
    pod_type,
    sigmoid,
    typical_pods,
)

__all__ = ["LOOKAHEAD_POLICIES", "MEMORY_POLICIES", "PAPER_NAMES", "PAPER_POLICIES",
           "Fragmentation", "PaperCluster", "PaperNode",
           "PodType", "ScoreFn", "accessible", "fgd_score_from_delta", "pod_type",
           "numa_take", "score_best_fit", "score_dot_product", "score_fgd", "score_fgd_whole",
           "score_first_fit",
           "score_gpu_clustering", "score_gpu_packing", "score_random", "score_spread",
           "sigmoid", "sub_pack", "typical_pods"]


# ------------------------------------------------------------------------------------------
# fragmentation


class Fragmentation:
    """The node fragmentation score of FGD for one target workload, memoised.

    ``score(model, cpu_left, gpu_left)`` is ``utils.NodeGpuShareFragAmountScore``
    (``pkg/utils/frag.go``): for each typical pod *m* with frequency *p*, the node's idle
    milli-GPU is split by ``GetNodePodFrag``:

    * *m* asks no GPU (``XLSatisfied`` / ``XRLackCPU``): all idle GPU counts;
    * the node's model is not allowed (``NoAccess``): all idle GPU counts;
    * *m* fits the free GPUs (``CanNodeHostPodOnGpuMemory``: ``gpu_number`` GPUs with at least
      ``milli_gpu`` free each) and the free CPU (``Q3Satisfied``): only the free milli-GPU of
      the GPUs with less than ``milli_gpu`` free counts (``GetGpuFragMilliByNodeResAndPodRes``);
    * otherwise (``Q1LackBoth``, ``Q2LackGpu``, ``Q4LackCpu``): all idle GPU counts.

    The score is ``sum_m p * (counted milli-GPU)`` (``FragAmountSumExceptQ3``), milli-GPU.

    **Memory (ours, not the paper's):** with ``memory`` (type -> MiB it typically asks) and a
    node's free memory passed to :meth:`score`, a GPU type whose memory does not fit counts
    all idle GPU too, as one whose CPU does not fit (``fgd-mem`` and ``fgd-mem-lookahead``;
    docs/placement.md "Memory-aware fragmentation"). The paper's F has no memory term: on the
    trace, nodes whose memory ran out with GPUs still free were left as they were.

    **Why the simulator keeps this rule beside** :mod:`gpuspawner.placement.fragmentation`:
    the definition is the same (on a paper node, one GPU model and every GPU shareable,
    ``type_fragmentation`` summed over the workload gives the same F up to the last bit of a
    float; ``tests/test_paper.py`` checks it), but the reproduction of the paper's figures
    (``benchmarks/paper_exact.py``, ``--exact-fgd``, which compares raw growths) depends on
    this rule's exact float sums and Go's case-sensitive model match
    (:func:`~gpuspawner.placement.workload.accessible`), where one ulp decides a tie between
    nodes, and on its memo keyed by the paper node's raw state (the ledger's is keyed by its
    own GPU signatures, which a paper node does not have). The ledger never uses it.
    """

    def __init__(self, typical: Sequence[tuple[PodType, float]],
                 memory: Mapping[PodType, int] | None = None) -> None:
        self.typical = list(typical)
        #: type -> memory it typically asks, MiB (absent: 0, always fits)
        self.memory = dict(memory or {})
        self._mem_levels = sorted(set(self.memory.values()))
        self._per_model: dict[str, tuple[float, tuple[tuple[int, int, int, float, int],
                                                       ...]]] = {}
        self._memo: dict[tuple, float] = {}

    def _terms(self, model: str
               ) -> tuple[float, tuple[tuple[int, int, int, float, int], ...]]:
        got = self._per_model.get(model)
        if got is None:
            whole = 0.0  # frequency of types for which every idle milli-GPU is fragment
            gpu_terms = []
            for t, p in self.typical:
                if t.milli_gpu == 0 or not accessible(model, t.gpu_type):
                    whole += p
                else:
                    gpu_terms.append((t.milli_cpu, t.milli_gpu, t.gpu_number, p,
                                      self.memory.get(t, 0)))
            got = self._per_model[model] = (whole, tuple(gpu_terms))
        return got

    def score(self, model: str, cpu_left: int, gpu_left: Sequence[int],
              mem_left: int | None = None) -> float:
        """F(node), milli-GPU, for free ``cpu_left`` milli-CPU and free milli-GPU per GPU;
        ``mem_left`` (free MiB): also count a type whose memory does not fit (class
        docstring); None: the paper's F."""
        if mem_left is None:
            key: tuple = (model, cpu_left, tuple(sorted(gpu_left)))
        else:  # F depends on the free memory only through which types' memory it reaches
            key = (model, cpu_left, tuple(sorted(gpu_left)),
                   bisect_right(self._mem_levels, mem_left))
        s = self._memo.get(key)
        if s is not None:
            return s
        total = sum(gpu_left)
        if total == 0:
            s = 0.0
        else:
            whole, terms = self._terms(model)
            s = whole * total
            for cpu, milli, number, p, mem in terms:
                fits = 0
                frag = 0
                for g in gpu_left:
                    if g >= milli:
                        fits += 1
                    else:
                        frag += g
                if fits >= number and cpu_left >= cpu and (mem_left is None
                                                           or mem_left >= mem):
                    s += p * frag
                else:
                    s += p * total
        if len(self._memo) > 2_000_000:
            self._memo.clear()
        self._memo[key] = s
        return s


    def score_numa(self, model: str, cpu_left: int, gpu_left: Sequence[int],
                   numa_of_gpu: Sequence[int], mem_left: int | None = None) -> float:
        """:meth:`score` with strict NUMA (ours, not the paper's): a whole-GPU type of k GPUs
        that fits one NUMA node (one holds >= k GPUs) can use only the fully free GPUs of NUMA
        nodes with >= k of them, so free GPUs stranded elsewhere count as fragment, and it
        does not fit when no NUMA node has k free. Shares and CPU-only types as in
        :meth:`score`. Same as :func:`~.fragmentation.type_fragmentation` on one model."""
        groups: dict[int, list[int]] = {}
        for g, k in zip(gpu_left, numa_of_gpu, strict=True):
            groups.setdefault(k, []).append(g)
        key = ("numa", model, cpu_left, tuple(sorted(tuple(sorted(v)) for v in groups.values())),
               None if mem_left is None else bisect_right(self._mem_levels, mem_left))
        s = self._memo.get(key)
        if s is not None:
            return s
        total = sum(gpu_left)
        if total == 0:
            s = 0.0
        else:
            whole, terms = self._terms(model)
            s = whole * total
            cap = max(len(v) for v in groups.values())
            full = [sum(1 for g in v if g == MILLI) for v in groups.values()]
            for cpu, milli, number, p, mem in terms:
                if milli < MILLI:
                    fits = 0
                    frag = 0
                    for g in gpu_left:
                        if g >= milli:
                            fits += 1
                        else:
                            frag += g
                    ok = fits >= number
                else:
                    usable = sum(f for f in full if f >= number) if cap >= number else sum(full)
                    ok = usable >= number
                    frag = total - usable * MILLI
                s += p * (frag if ok and cpu_left >= cpu
                          and (mem_left is None or mem_left >= mem) else total)
        if len(self._memo) > 2_000_000:
            self._memo.clear()
        self._memo[key] = s
        return s


def score_fgd(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """FGD: ``fgd_score.go`` ``calculateGpuShareFragExtendScore``. Score
    ``int(sigmoid((F_before - F_after) / 1000) * 100)`` with F from :class:`Fragmentation`
    (:meth:`Fragmentation.score_numa` when the cluster is NUMA-strict, ours);
    for a share, every GPU with room is tried and the best score wins (lowest index on ties),
    which is also the GPU the share gets (``allocateGpuIdBasedOnFGDScore``); for other pods the
    state after is ``NodeResource.Sub`` (:func:`sub_pack`)."""
    f = c.frag
    m0 = m1 = None
    if c.mem_aware:  # fgd-mem: the node's free memory before and after (ours)
        m0 = node.memory_left
        m1 = m0 - c.request_memory
    if c.numa_strict:
        numa = node.numa_of_gpu

        def score(cpu_left, gl, m):
            return f.score_numa(node.model, cpu_left, gl, numa, m)
    else:
        def score(cpu_left, gl, m):
            return f.score(node.model, cpu_left, gl, m)
    before = score(node.cpu_left, node.gpu_left, m0)
    cpu_after = node.cpu_left - t.milli_cpu
    if t.is_share:
        best, gpu = -1, -1
        gl = node.gpu_left
        for i, g in enumerate(gl):
            if g >= t.milli_gpu:
                after = list(gl)
                after[i] -= t.milli_gpu
                s = c.quantize(score(cpu_after, after, m1) - before)
                if gpu < 0 or s > best:
                    best, gpu = s, i
        return best, gpu
    if c.numa_strict and t.gpu_number:
        ids = c.numa_fits(node, t)
        if ids is None:
            return -1, -1
        after = list(node.gpu_left)
        for i in ids:
            after[i] = 0
    else:
        after = sub_pack(node.gpu_left, t)
    if after is None:
        return -1, -1
    return c.quantize(score(cpu_after, after, m1) - before), -1


def score_fgd_whole(c: PaperCluster, node: PaperNode, t: PodType
                    ) -> tuple[tuple[int | float, bool], int]:
    """FGD, ties to nodes that already hold GPU work (ours, ``fgd-whole``; docs/placement.md
    "Beyond FGD"). The score is ``(fgd score, used)``: the FGD plugin's integer score of
    :func:`score_fgd` first, so the node FGD prefers still wins whenever it is alone at the top;
    among nodes of the same FGD score a GPU pod goes to one where some GPU is already
    (partly) allocated, keeping untouched nodes whole for later multi-GPU requests; only then
    the tie order decides, as in ``fgd``. CPU-only pods: ``used`` is False everywhere, so they
    go exactly where ``fgd`` sends them. The share's GPU is FGD's. Pure function of the node's
    state, so the cluster caches it like ``fgd``."""
    s, gpu = score_fgd(c, node, t)
    used = t.gpu_number > 0 and node.gpu_milli_left < node.gpus * MILLI
    return (s, used), gpu


def numa_take(gpu_left: Sequence[int], numa_of_gpu: Sequence[int], count: int
              ) -> list[int] | None:
    """:meth:`PaperCluster.numa_fits` on a node state: the ``count`` whole GPUs strict NUMA
    takes from free milli-GPU ``gpu_left`` (per GPU) whose NUMA nodes are ``numa_of_gpu``, or
    None when they are not free."""
    per: dict[int, list[int]] = {}
    size: dict[int, int] = {}
    for i, g in enumerate(gpu_left):
        numa = numa_of_gpu[i]
        size[numa] = size.get(numa, 0) + 1
        if g == MILLI:
            per.setdefault(numa, []).append(i)
    if max(size.values(), default=0) >= count:
        ok = [(len(v), k) for k, v in per.items() if len(v) >= count]
        if not ok:
            return None
        _, k = min(ok)
        return per[k][:count]
    free = [i for i, g in enumerate(gpu_left) if g == MILLI]
    return free[:count] if len(free) >= count else None


def _growth(c: PaperCluster, model: str, cpu_left: int, gpu_left: Sequence[int],
            t: PodType, mem_left: int | None = None,
            numa: Sequence[int] | None = None) -> float:
    """Exact FGD growth of placing ``t`` on a node state (for a share, on the GPU where it
    grows least); ``inf`` when it does not fit. ``mem_left``: the node's free MiB, for the
    memory-aware policies (``t`` then asks the memory its type typically asks); None: the
    paper's F, memory not looked at. ``numa``: the NUMA node of each GPU under strict NUMA
    (F is :meth:`Fragmentation.score_numa` and whole GPUs are taken as :func:`numa_take`
    takes them); None: the paper's rule."""
    if cpu_left < t.milli_cpu:
        return math.inf
    m1 = None
    if mem_left is not None:
        m1 = mem_left - c.frag.memory.get(t, 0)
        if m1 < 0:
            return math.inf
    if t.gpu_number and not accessible(model, t.gpu_type):
        return math.inf
    f = c.frag
    if numa is None:
        def score(cpu: int, gl: Sequence[int], m: int | None) -> float:
            return f.score(model, cpu, gl, m)
    else:
        def score(cpu: int, gl: Sequence[int], m: int | None) -> float:
            return f.score_numa(model, cpu, gl, numa, m)
    before = score(cpu_left, gpu_left, mem_left)
    cpu_after = cpu_left - t.milli_cpu
    if t.is_share:
        best = math.inf
        for i, g in enumerate(gpu_left):
            if g >= t.milli_gpu:
                after = list(gpu_left)
                after[i] -= t.milli_gpu
                best = min(best, score(cpu_after, after, m1) - before)
        return best
    if numa is not None and t.gpu_number:
        ids = numa_take(gpu_left, numa, t.gpu_number)
        if ids is None:
            return math.inf
        after = list(gpu_left)
        for i in ids:
            after[i] = 0
    else:
        after = sub_pack(gpu_left, t)
    if after is None:
        return math.inf
    return score(cpu_after, after, m1) - before


#: ``fgd-lookahead``: nodes compared (the first in tie order whose FGD score is within
#: ``LOOKAHEAD_SLACK`` of the best), next-request types (the most likely of the target
#: workload); docs/placement.md "Beyond FGD" has the settings that were measured
LOOKAHEAD_CANDIDATES = 8
LOOKAHEAD_TYPES = 5
LOOKAHEAD_SLACK = 1
#: weight of the pod's own exact FGD growth on the candidate, added to the look-ahead's
#: expectation (0: the pick looks only at what comes next; docs/placement.md has both)
LOOKAHEAD_OWN = 0.5


def score_first_fit(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """First fit (ours, not in the paper): every node scores the same, so the first feasible
    node in configuration order wins (see :class:`PaperCluster`). Shares: best-fit GPU."""
    return 0, (best_fit_gpu(node, t) if t.is_share else -1)


def score_spread(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """Spread (ours): the node with the most free GPU (GPU pods) or CPU (CPU-only pods), as a
    0..100 score of the free fraction. Shares: best-fit GPU."""
    if t.gpu_number:
        s = node.gpu_milli_left * MAX_NODE_SCORE // max(1, node.gpus * MILLI)
    else:
        s = node.cpu_left * MAX_NODE_SCORE // max(1, node.cpu_capacity)
    return s, (best_fit_gpu(node, t) if t.is_share else -1)


def score_random(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """Random: ``random_score.go`` picks one feasible node uniformly in ``PreScore`` (done by
    :class:`PaperCluster`); a share goes to a uniformly random GPU with room
    (``allocateGpuIdBasedOnRandomFit``)."""
    if not t.is_share:
        return 0, -1
    pick, n = -1, 0
    for i, g in enumerate(node.gpu_left):
        if g >= t.milli_gpu:
            n += 1
            if c.rng.randrange(n) == 0:
                pick = i
    return 0, pick


#: policy name -> score function; ``random`` and ``first-fit`` are special-cased by the
#: cluster (a uniform pick, and configuration order); ``fgd-whole`` and ``fgd-lookahead``
#: (``fgd``'s score, then :meth:`PaperCluster._lookahead` among the near-best nodes) are ours,
#: and so are ``fgd-mem`` and ``fgd-mem-lookahead``: the same with memory-aware
#: fragmentation (:class:`Fragmentation`, ``type_memory``)
PAPER_POLICIES: dict[str, ScoreFn] = {
    "fgd": score_fgd,
    "fgd-whole": score_fgd_whole,
    "fgd-lookahead": score_fgd,
    "fgd-mem": score_fgd,
    "fgd-mem-lookahead": score_fgd,
    **{name: score_fgd for name in LOOKAHEAD_SETTINGS},
    "best-fit": score_best_fit,
    "dot-product": score_dot_product,
    "gpu-packing": score_gpu_packing,
    "gpu-clustering": score_gpu_clustering,
    "random": score_random,
    "first-fit": score_first_fit,
    "spread": score_spread,
}

#: our names -> the names in the paper's results (``analysis_allo_discrete.csv``)
PAPER_NAMES: dict[str, str] = {
    "random": "01-Random", "dot-product": "02-DotProd", "gpu-clustering": "03-GpuClustering",
    "gpu-packing": "04-GpuPacking", "best-fit": "05-BestFit", "fgd": "06-FGD",
}

#: scores that do not change with the node's state between calls are cached per node state
_CACHEABLE = frozenset({"fgd", "fgd-whole", "fgd-lookahead", "fgd-mem", "fgd-mem-lookahead",
                        "best-fit", "dot-product", "gpu-packing", "gpu-clustering",
                        "first-fit", "spread", *LOOKAHEAD_SETTINGS})
#: policies that add the look-ahead (:meth:`PaperCluster._lookahead`) to ``fgd``'s score,
#: with their (next-request types, candidates): the ledger's look-ahead settings
#: (``gpuspawner.placement.lookahead.SETTINGS``; the cheaper variants look at fewer)
LOOKAHEAD_POLICIES = frozenset(LOOKAHEAD_SETTINGS)
#: policies whose fragmentation also counts a type whose memory does not fit (ours)
MEMORY_POLICIES = frozenset({"fgd-mem", *(n for n in LOOKAHEAD_SETTINGS
                                          if n.startswith("fgd-mem-"))})


class PaperCluster:
    """A cluster of :class:`PaperNode` scheduled one pod at a time by one policy, with
    milli-CPU accounting (the simulator's ``NodeResource``).

    Args:
        nodes: the nodes; ties go to the smallest name whatever their order, unless
            ``tie_order`` says otherwise.
        policy: a key of :data:`PAPER_POLICIES`.
        typical: the target workload for ``fgd`` (:func:`typical_pods`).
        seed: seed of the generator used by ``random``.
        exact_fgd: score ``fgd`` by the exact fragmentation growth (smallest wins) instead of
            the Go plugin's integer sigmoid score.
        numa_strict: whole-GPU pods of at most as many GPUs as one NUMA node holds must take
            them from one NUMA node (``PaperNode.numa_of_gpu``); fragmentation then also counts
            free GPUs that only fit such pods across NUMA nodes (see :meth:`numa_fits`).
        type_memory: MiB each workload type typically asks (``run_paper`` passes the median
            over the trace's pods of the type); used by the memory-aware policies only
            (:data:`MEMORY_POLICIES`), whose fragmentation then counts a type whose memory
            does not fit the node's free memory, and only when ``typical`` has a whole-GPU
            type (:func:`~gpuspawner.placement.workload.asks_whole_gpus`).

    Raises:
        ValueError: unknown policy or duplicate node names.
    """

    def __init__(self, nodes: Iterable[PaperNode], policy: str,
                 typical: Sequence[tuple[PodType, float]] = (), seed: int | None = None,
                 exact_fgd: bool = False, numa_strict: bool = False,
                 tie_order: Sequence[str] | None = None,
                 type_memory: Mapping[PodType, int] | None = None) -> None:
        if policy not in PAPER_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of "
                             f"{', '.join(PAPER_POLICIES)}")
        self.nodes = list(nodes)
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("duplicate node names")
        if tie_order is None:
            self.ranked = sorted(self.nodes, key=lambda n: n.name)
        else:
            if sorted(tie_order) != sorted(names):
                raise ValueError("tie_order must name every node exactly once")
            rank = {name: i for i, name in enumerate(tie_order)}
            self.ranked = sorted(self.nodes, key=lambda n: rank[n.name])
        for n in self.nodes:  # cached scores belong to one cluster's policy
            n.cache.clear()
        self.policy = policy
        self.fn = PAPER_POLICIES[policy]
        # our additions to fgd (look-ahead, memory term) act only on a workload with a
        # whole-GPU type; on shares and CPU-only pods alone the policy is fgd
        beyond = asks_whole_gpus(typical)
        self.mem_aware = policy in MEMORY_POLICIES and beyond
        #: the look-ahead applies (a look-ahead policy, a whole-GPU type; under strict NUMA
        #: with the NUMA-aware F and NUMA-aligned GPUs)
        self.lookahead = policy in LOOKAHEAD_POLICIES and beyond
        self.frag = Fragmentation(typical, type_memory if self.mem_aware else None)
        #: the memory (MiB) of the pod being placed, for the memory-aware score
        self.request_memory = 0
        self.rng = random.Random(seed)
        self.exact = exact_fgd
        self.numa_strict = numa_strict
        self.cacheable = policy in _CACHEABLE
        self.gpu_capacity = sum(n.gpus for n in self.nodes) * MILLI
        self.gpu_used = 0
        self.last_gpus: list[int] = []  #: GPU indices the last :meth:`place` booked
        self._type_ids: dict[PodType | tuple[str, PodType], int] = {}
        self._la_types: list[tuple[PodType, float]] | None = None
        #: the look-ahead's (next-request types, candidates)
        self.la_settings = LOOKAHEAD_SETTINGS.get(policy, (LOOKAHEAD_TYPES,
                                                           LOOKAHEAD_CANDIDATES))

    def quantize(self, delta: float) -> int | float:
        """The score of a fragmentation growth: Go's integer score, or ``-delta`` when
        ``exact_fgd`` (higher is better either way)."""
        if self.exact:
            return -delta
        return fgd_score_from_delta(delta)

    def _gpu_fit(self, node: PaperNode, t: PodType) -> bool:
        if not node.gpus or not accessible(node.model, t.gpu_type):
            return False
        n = 0
        for g in node.gpu_left:
            if g >= t.milli_gpu:
                n += 1
        if n < t.gpu_number:
            return False
        if self.numa_strict and not t.is_share:
            return self.numa_fits(node, t) is not None
        return True

    def numa_fits(self, node: PaperNode, t: PodType) -> list[int] | None:
        """Whole GPUs for ``t`` under strict NUMA: when one NUMA node of ``node`` has at least
        ``t.gpu_number`` GPUs, the fully free GPUs of the NUMA node with the fewest free ones
        that still has enough (lowest id on ties), first in device order; otherwise the first
        fully free GPUs anywhere. None when they are not free."""
        return numa_take(node.gpu_left, node.numa_of_gpu, t.gpu_number)

    def feasible(self, t: PodType, memory_mib: int) -> list[PaperNode]:
        """Nodes that pass the filter, in tie order (by name unless ``tie_order``)."""
        out = []
        for n in self.ranked:
            if n.cpu_left < t.milli_cpu or n.memory_left < memory_mib:
                continue
            if t.gpu_number and not self._gpu_fit(n, t):
                continue
            out.append(n)
        return out

    def choose(self, t: PodType, memory_mib: int = 0) -> tuple[PaperNode, int] | None:
        """The node (and share GPU index, -1 for none) the policy picks, or None when no node
        passes the filter. Highest score wins, ties to the first in tie order; ``first-fit``
        takes the first feasible node in configuration order; ``random`` a uniform one."""
        if self.policy == "random":
            fits = self.feasible(t, memory_mib)
            if not fits:
                return None
            n = fits[self.rng.randrange(len(fits))]
            return n, score_random(self, n, t)[1]
        if self.policy == "first-fit":
            for n in self.nodes:
                if n.cpu_left >= t.milli_cpu and n.memory_left >= memory_mib and (
                        not t.gpu_number or self._gpu_fit(n, t)):
                    return n, score_first_fit(self, n, t)[1]
            return None
        fn = self.fn
        best = None
        best_score = None
        best_gpu = -1
        cpu = t.milli_cpu
        wants_gpu = t.gpu_number > 0
        # node caches are keyed by a small int, hashed fast; the memory-aware score also
        # depends on the pod's memory
        tkey = (t, memory_mib) if self.mem_aware else t
        key = self._type_ids.get(tkey)
        if key is None:
            key = self._type_ids[tkey] = len(self._type_ids)
        self.request_memory = memory_mib
        for n in self.ranked:
            if n.cpu_left < cpu or n.memory_left < memory_mib:
                continue
            cache = n.cache
            got = cache.get(key)
            if got is None:
                if wants_gpu and not self._gpu_fit(n, t):
                    got = (None, -1)
                else:
                    got = fn(self, n, t)
                cache[key] = got
            s = got[0]
            if s is None:
                continue
            if best_score is None or s > best_score:
                best, best_score, best_gpu = n, s, got[1]
        if best is None:
            return None
        if self.lookahead:
            return self._lookahead(t, memory_mib, key, best_score, best, best_gpu)
        return best, best_gpu

    def _next_types(self) -> list[tuple[PodType, float]]:
        """The look-ahead's next-request types: the most likely of the target workload."""
        got = self._la_types
        if got is None:
            top = sorted(self.frag.typical, key=lambda tp: -tp[1])[:self.la_settings[0]]
            total = sum(p for _, p in top) or 1.0
            got = self._la_types = [(t, p / total) for t, p in top]
        return got

    def _best_two(self, t: PodType) -> tuple[float, PaperNode | None, float]:
        """Best and second-best exact growth of ``t`` over the cluster now (cached per node
        state under a key of its own), and the node of the best."""
        key = self._type_ids.get(("la", t))
        if key is None:
            key = self._type_ids[("la", t)] = len(self._type_ids)
        mem = self.mem_aware
        b1, n1, b2 = math.inf, None, math.inf
        for n in self.ranked:
            g = n.cache.get(key)
            if g is None:
                g = n.cache[key] = _growth(self, n.model, n.cpu_left, n.gpu_left, t,
                                           n.memory_left if mem else None,
                                           n.numa_of_gpu if self.numa_strict else None) \
                    if (not t.gpu_number or n.gpus) else math.inf
            if g < b1:
                b1, n1, b2 = g, n, b1
            elif g < b2:
                b2 = g
        return b1, n1, b2

    def _lookahead(self, t: PodType, memory_mib: int, key: int, best_score: int,
                   best: PaperNode, best_gpu: int) -> tuple[PaperNode, int]:
        """``fgd-lookahead`` (ours; docs/placement.md "Beyond FGD"): the candidates are the
        first :data:`LOOKAHEAD_CANDIDATES` (the policy's ``la_settings``) nodes in tie order
        whose FGD score (cached by :meth:`choose`) is within :data:`LOOKAHEAD_SLACK` of the
        best. For each, with ``t`` placed there as ``fgd`` would (same GPUs), and for each
        of the :data:`LOOKAHEAD_TYPES` (``la_settings``) most likely types *u* of the target
        workload (probabilities renormalised), the best exact FGD growth *u* can then get
        anywhere: on this node's new state, or the best elsewhere (the cluster's best for
        *u* now, or its second best when the best is this node); *u*'s total milli-GPU when
        it fits nowhere (a refusal leaves that much demand unserved). The candidate with the
        smallest expectation wins, ties to the first in tie order, so when the look-ahead
        sees no difference the pick is ``fgd``'s. :data:`LOOKAHEAD_OWN` times the pod's own
        exact growth on the candidate is added to the expectation (0.5: measured against 0
        and 1 in docs/placement.md). Under strict NUMA the candidate's GPUs, the next types'
        GPUs and every F are the NUMA-aware ones (:meth:`numa_fits`,
        :meth:`Fragmentation.score_numa`), as ``fgd``'s. Not applied on a target workload
        without a whole-GPU type (:func:`~gpuspawner.placement.workload.asks_whole_gpus`;
        there it is ``fgd``)."""
        cands = []
        most = self.la_settings[1]
        for n in self.ranked:
            got = n.cache.get(key)
            if got is None or got[0] is None:
                continue
            if got[0] >= best_score - LOOKAHEAD_SLACK and n.cpu_left >= t.milli_cpu \
                    and n.memory_left >= memory_mib:
                cands.append((n, got[1]))
                if len(cands) >= most:
                    break
        if len(cands) <= 1:
            return best, best_gpu
        nxt = [(u, p, self._best_two(u)) for u, p in self._next_types()]
        best_v, pick = None, (best, best_gpu)
        for n, gpu in cands:
            numa = n.numa_of_gpu if self.numa_strict else None
            if t.is_share:
                gl = list(n.gpu_left)
                gl[gpu] -= t.milli_gpu
            elif numa is not None and t.gpu_number:
                gl = list(n.gpu_left)
                for i in self.numa_fits(n, t) or ():  # a candidate fits: fgd scored it
                    gl[i] = 0
            else:
                gl = sub_pack(n.gpu_left, t) if t.gpu_number else list(n.gpu_left)
            cpu_after = n.cpu_left - t.milli_cpu
            m0 = m1 = None
            if self.mem_aware:
                m0 = n.memory_left
                m1 = m0 - memory_mib
            v = 0.0
            if LOOKAHEAD_OWN:
                f = self.frag
                if numa is None:
                    v = LOOKAHEAD_OWN * (f.score(n.model, cpu_after, gl, m1)
                                         - f.score(n.model, n.cpu_left, n.gpu_left, m0))
                else:
                    v = LOOKAHEAD_OWN * (f.score_numa(n.model, cpu_after, gl, numa, m1)
                                         - f.score_numa(n.model, n.cpu_left, n.gpu_left, numa,
                                                        m0))
            for u, p, (b1, n1, b2) in nxt:
                here = _growth(self, n.model, cpu_after, gl, u, m1, numa) \
                    if (not u.gpu_number or n.gpus) else math.inf
                other = b2 if n1 is n else b1
                g = min(here, other)
                if g == math.inf:
                    g = u.total_milli_gpu or 0.0
                v += p * g
            if best_v is None or v < best_v - 1e-9:
                best_v, pick = v, (n, gpu)
        return pick

    def place(self, t: PodType, memory_mib: int = 0) -> PaperNode | None:
        """Schedule one pod: choose a node, book milli-CPU, memory and milli-GPU there
        (whole GPUs: the first fully free ones in device order, or per NUMA rule; a share: the
        GPU the policy chose). Returns the node, or None when the pod is refused."""
        got = self.choose(t, memory_mib)
        if got is None:
            return None
        n, gpu = got
        n.cpu_left -= t.milli_cpu
        n.memory_left -= memory_mib
        ids: list[int] = []
        if t.gpu_number:
            if t.is_share:
                n.gpu_left[gpu] -= t.milli_gpu
                ids = [gpu]
            else:
                if self.numa_strict:
                    ids = self.numa_fits(n, t) or []
                else:
                    ids = [i for i, g in enumerate(n.gpu_left) if g == MILLI][: t.gpu_number]
                for i in ids:
                    n.gpu_left[i] = 0
            self.gpu_used += t.total_milli_gpu
            tag = t.affinity()
            n.affinity[tag] = n.affinity.get(tag, 0) + 1
        self.last_gpus = ids
        n.cache.clear()
        return n
