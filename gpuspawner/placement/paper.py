"""The FGD paper's scheduling rules, ported from its simulator: fragmentation, typical pods and
the six score plugins, plus a small milli-CPU cluster model that applies them.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MILLI = 1000  #: one whole GPU (or CPU) in milli units
MAX_SPEC_CPU = 128_000  #: ``gpushareutils.MaxSpecCpu``, milli-CPU, normalises BestFit/DotProd
MAX_SPEC_GPU = 8_000  #: ``gpushareutils.MaxSpecGpu``, milli-GPU
MAX_NODE_SCORE = 100  #: ``framework.MaxNodeScore``
DEFAULT_MILLI_CPU = 100  #: ``schedulerutil.DefaultMilliCPURequest`` for a pod asking for 0


@dataclass(frozen=True)
class PodType:
    """A task type as the simulator's ``simontype.PodResource`` (``pkg/type/resource.go``).

    Attributes:
        milli_cpu: CPU request, milli-CPU (a request of 0 counts as 100, as Kubernetes'
            ``GetNonzeroRequests`` does).
        milli_gpu: per GPU, milli-GPU: 1..999 for a share of one GPU, 1000 for whole GPUs,
            0 for a CPU-only pod.
        gpu_number: number of GPUs (0 for CPU-only, 1 for a share).
        gpu_type: allowed GPU models separated by ``|``; "" = any.
    """

    milli_cpu: int
    milli_gpu: int = 0
    gpu_number: int = 0
    gpu_type: str = ""

    @property
    def total_milli_gpu(self) -> int:
        """``milli_gpu * gpu_number`` (``PodResource.TotalMilliGpu``)."""
        return self.milli_gpu * self.gpu_number

    @property
    def is_share(self) -> bool:
        """True for a share of one GPU (``gpu_number == 1 and milli_gpu < 1000``)."""
        return self.gpu_number == 1 and 0 < self.milli_gpu < MILLI

    def affinity(self) -> str:
        """The GPU-affinity tag of ``gpushareutils.GetGpuAffinityFromPodAnnotation``
        (``pkg/type/open-gpu-share/utils/pod.go``): "" for CPU-only (``NoGpuTag``),
        ``"share"`` for a share, ``"<n>-gpu"`` for n whole GPUs."""
        if self.gpu_number == 0:
            return ""
        if self.is_share:
            return "share"
        return f"{self.gpu_number}-gpu"

    def sort_key(self) -> tuple[int, int, int, str]:
        """``PodResource.Less`` order: milli-CPU, milli-GPU, GPU number, GPU type."""
        return (self.milli_cpu, self.milli_gpu, self.gpu_number, self.gpu_type)


def pod_type(milli_cpu: int, num_gpu: int, gpu_milli: int, gpu_spec: str = "") -> PodType:
    """A trace row (``cpu_milli, num_gpu, gpu_milli, gpu_spec``) as a :class:`PodType`, the way
    ``utils.GetPodResource`` (``pkg/utils/utils.go``) reads the pod's annotations: milli-GPU is
    per GPU, CPU 0 becomes 100 milli-CPU.

    Raises:
        ValueError: negative values, or ``num_gpu > 1`` with ``gpu_milli`` other than 1000 (the
            simulator panics on it: ``GetGpuAffinityFromPodAnnotation``).
    """
    if min(milli_cpu, num_gpu, gpu_milli) < 0:
        raise ValueError("pod sizes must be >= 0")
    if num_gpu > 1 and gpu_milli != MILLI:
        raise ValueError(f"{num_gpu} GPUs of {gpu_milli} milli-GPU each: a pod with several "
                         "GPUs must ask for whole ones (gpu_milli 1000)")
    if num_gpu == 0:
        gpu_milli = 0
    return PodType(milli_cpu or DEFAULT_MILLI_CPU, min(gpu_milli, MILLI), num_gpu, gpu_spec)


def accessible(node_model: str, gpu_type: str) -> bool:
    """``utils.IsNodeAccessibleToPodByType`` (``pkg/utils/utils.go``): any node when the pod
    names no model; else a GPU node whose model is one of the ``|``-separated names (exact,
    case-sensitive, as in Go)."""
    names = [t for t in gpu_type.split("|") if t]
    if not names:
        return True
    if not node_model:
        return False
    return node_model in names


# ------------------------------------------------------------------------------------------
# typical pods (the target workload)


def typical_pods(pods: Iterable[PodType] | Mapping[PodType, float], threshold: int = 95,
                 step: int = 1, include_cpu: bool = True) -> list[tuple[PodType, float]]:
    """The target workload of FGD: ``utils.GetTypicalPods`` (``pkg/utils/frag.go``) with the
    paper's configuration (``scripts/generate_config_and_run.py``: ``isInvolvedCpuPods: true``,
    ``podPopularityThreshold: 95``, ``podIncreaseStep: 1``, ``gpuResWeight: 0``).

    Task types are counted (weight 1 each), sorted by count, most frequent first (equal counts:
    the larger :meth:`PodType.sort_key` first, as ``sort.Reverse`` of ``TargetPodList.Less``
    orders them); the leading types are taken, ``step`` at a time, until they cover at least
    ``threshold`` percent of all pods; their frequencies are renormalised to sum to 1.

    Args:
        pods: one entry per pod of the trace (CPU-only ones included), or a mapping of task
            type to its (possibly decayed, fractional) count.
        threshold: percent of pods the types must cover, 1..100.
        step: how many types are added per round.
        include_cpu: count CPU-only pods (the paper does).

    Returns:
        ``[(type, frequency)]``, most frequent first; frequencies sum to 1. Empty when there
        are no pods.

    Raises:
        ValueError: ``threshold`` outside 1..100 or ``step < 1``.
    """
    if not 1 <= threshold <= 100 or step < 1:
        raise ValueError("threshold must be 1..100 and step >= 1")
    counts: dict[PodType, float] = {}
    items = pods.items() if isinstance(pods, Mapping) else ((p, 1) for p in pods)
    for p, c in items:
        if (not include_cpu and p.gpu_number == 0) or c <= 0:
            continue
        counts[p] = counts.get(p, 0) + c
    total = sum(counts.values())
    if not total:
        return []
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
    expected = threshold * total / 100.0
    cum = 0.0
    i = 0
    n = 0
    while cum < expected:
        n += step
        while i < n and i < len(ordered):
            cum += ordered[i][1]
            i += 1
    return [(t, c / cum) for t, c in ordered[:i]]


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
    """

    def __init__(self, typical: Sequence[tuple[PodType, float]]) -> None:
        self.typical = list(typical)
        self._per_model: dict[str, tuple[float, tuple[tuple[int, int, int, float], ...]]] = {}
        self._memo: dict[tuple, float] = {}

    def _terms(self, model: str) -> tuple[float, tuple[tuple[int, int, int, float], ...]]:
        got = self._per_model.get(model)
        if got is None:
            whole = 0.0  # frequency of types for which every idle milli-GPU is fragment
            gpu_terms = []
            for t, p in self.typical:
                if t.milli_gpu == 0 or not accessible(model, t.gpu_type):
                    whole += p
                else:
                    gpu_terms.append((t.milli_cpu, t.milli_gpu, t.gpu_number, p))
            got = self._per_model[model] = (whole, tuple(gpu_terms))
        return got

    def score(self, model: str, cpu_left: int, gpu_left: Sequence[int]) -> float:
        """F(node), milli-GPU, for free ``cpu_left`` milli-CPU and free milli-GPU per GPU."""
        key = (model, cpu_left, tuple(sorted(gpu_left)))
        s = self._memo.get(key)
        if s is not None:
            return s
        total = sum(gpu_left)
        if total == 0:
            s = 0.0
        else:
            whole, terms = self._terms(model)
            s = whole * total
            for cpu, milli, number, p in terms:
                fits = 0
                frag = 0
                for g in gpu_left:
                    if g >= milli:
                        fits += 1
                    else:
                        frag += g
                if fits >= number and cpu_left >= cpu:
                    s += p * frag
                else:
                    s += p * total
        if len(self._memo) > 2_000_000:
            self._memo.clear()
        self._memo[key] = s
        return s


    def score_numa(self, model: str, cpu_left: int, gpu_left: Sequence[int],
                   numa_of_gpu: Sequence[int]) -> float:
        """:meth:`score` with strict NUMA (ours, not the paper's): a whole-GPU type of k GPUs
        that fits one NUMA node (one holds >= k GPUs) can use only the fully free GPUs of NUMA
        nodes with >= k of them, so free GPUs stranded elsewhere count as fragment, and it
        does not fit when no NUMA node has k free. Shares and CPU-only types as in
        :meth:`score`. Same as :func:`~.fragmentation.type_fragmentation` on one model."""
        groups: dict[int, list[int]] = {}
        for g, k in zip(gpu_left, numa_of_gpu, strict=True):
            groups.setdefault(k, []).append(g)
        key = ("numa", model, cpu_left, tuple(sorted(tuple(sorted(v)) for v in groups.values())))
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
            for cpu, milli, number, p in terms:
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
                s += p * (frag if ok and cpu_left >= cpu else total)
        if len(self._memo) > 2_000_000:
            self._memo.clear()
        self._memo[key] = s
        return s


def sigmoid(x: float) -> float:
    """``plugin.sigmoid`` (``plugin_utils.go``): 1 / (1 + e^-x)."""
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score_from_delta(delta: float) -> int:
    """The FGD plugin's node score for a fragmentation growth ``delta`` (milli-GPU):
    ``int64(sigmoid((before - after) / 1000) * MaxNodeScore)`` (``fgd_score.go``
    ``calculateGpuShareFragExtendScore``), 0..100, higher is better. Go truncates toward zero,
    so growths within about 40 milli-GPU of each other often get the same score."""
    return int(sigmoid(-delta / 1000.0) * MAX_NODE_SCORE)


def sub_pack(gpu_left: Sequence[int], t: PodType) -> list[int] | None:
    """``NodeResource.Sub``'s GPU part (``pkg/type/resource.go``): take ``t.milli_gpu`` from
    ``t.gpu_number`` GPUs, visiting them by free milli-GPU ascending (stable: device order on
    ties); None when they do not fit."""
    out = list(gpu_left)
    need = t.gpu_number
    if need == 0:
        return out
    for i in sorted(range(len(out)), key=out.__getitem__):
        if t.milli_gpu <= out[i]:
            out[i] -= t.milli_gpu
            need -= 1
            if need <= 0:
                return out
    return None


# ------------------------------------------------------------------------------------------
# the cluster model


@dataclass(eq=False, slots=True)
class PaperNode:
    """One node of :class:`PaperCluster`: capacities and what is free.

    Attributes:
        name: node name (ties between equal scores go to the smallest).
        model: GPU model ("" for a CPU-only node).
        cpu_capacity / cpu_left: milli-CPU.
        memory_capacity / memory_left: MiB.
        gpu_left: free milli-GPU per GPU, device order.
        affinity: GPU-affinity tag -> number of pods with it on the node
            (``NodeResource.GpuAffinity``, for ``gpu-clustering``).
        numa_of_gpu: NUMA node of each GPU (all 0 when NUMA is not modelled).
    """

    name: str
    model: str
    cpu_capacity: int
    memory_capacity: int
    gpus: int
    cpu_left: int = 0
    memory_left: int = 0
    gpu_left: list[int] = field(default_factory=list)
    affinity: dict[str, int] = field(default_factory=dict)
    numa_of_gpu: tuple[int, ...] = ()
    cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.cpu_left = self.cpu_capacity
        self.memory_left = self.memory_capacity
        self.gpu_left = [MILLI] * self.gpus
        if not self.numa_of_gpu:
            self.numa_of_gpu = (0,) * self.gpus

    @property
    def gpu_milli_left(self) -> int:
        """Free milli-GPU of the node."""
        return sum(self.gpu_left)

    def fully_free(self) -> int:
        """GPUs with nothing allocated (``NodeResource.GetFullyFreeGpuNum``)."""
        return sum(1 for g in self.gpu_left if g == MILLI)


#: a policy: (cluster, node, pod type) -> (score 0..100, share GPU index or -1)
ScoreFn = Callable[["PaperCluster", PaperNode, PodType], tuple[int, int]]


def _best_fit_gpu(node: PaperNode, t: PodType) -> int:
    """``allocateGpuIdBasedOnBestFit``: the share goes to the GPU with the least free milli-GPU
    that still fits (lowest index on ties)."""
    best = -1
    for i, g in enumerate(node.gpu_left):
        if g >= t.milli_gpu and (best < 0 or g < node.gpu_left[best]):
            best = i
    return best


def score_fgd(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """FGD: ``fgd_score.go`` ``calculateGpuShareFragExtendScore``. Score
    ``int(sigmoid((F_before - F_after) / 1000) * 100)`` with F from :class:`Fragmentation`
    (:meth:`Fragmentation.score_numa` when the cluster is NUMA-strict, ours);
    for a share, every GPU with room is tried and the best score wins (lowest index on ties),
    which is also the GPU the share gets (``allocateGpuIdBasedOnFGDScore``); for other pods the
    state after is ``NodeResource.Sub`` (:func:`sub_pack`)."""
    f = c.frag
    if c.numa_strict:
        numa = node.numa_of_gpu

        def score(cpu_left, gl):
            return f.score_numa(node.model, cpu_left, gl, numa)
    else:
        def score(cpu_left, gl):
            return f.score(node.model, cpu_left, gl)
    before = score(node.cpu_left, node.gpu_left)
    cpu_after = node.cpu_left - t.milli_cpu
    if t.is_share:
        best, gpu = -1, -1
        gl = node.gpu_left
        for i, g in enumerate(gl):
            if g >= t.milli_gpu:
                after = list(gl)
                after[i] -= t.milli_gpu
                s = c.quantize(score(cpu_after, after) - before)
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
    return c.quantize(score(cpu_after, after) - before), -1


def score_best_fit(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """BestFit: ``best_fit_score.go`` ``getBestFitScore``. Lower
    ``0.5 * (cpu_left - cpu) / 128000 + 0.5 * (gpu_left - gpu) / 8000`` (node totals, milli)
    is better; score ``int((1 - that) * 100)``. Shares: best-fit GPU."""
    s = (0.5 * (node.cpu_left - t.milli_cpu) / MAX_SPEC_CPU
         + 0.5 * (node.gpu_milli_left - t.total_milli_gpu) / MAX_SPEC_GPU)
    return int((1.0 - s) * MAX_NODE_SCORE), (_best_fit_gpu(node, t) if t.is_share else -1)


def score_dot_product(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """DotProd (Tetris) as the paper ran it (``-dimext merge -norm max -gpusel best``):
    ``dot_product_score.go`` ``calculateDotProductScore`` with ``MergeGpuDim``: node vector
    (free milli-CPU / 128000, free milli-GPU / 8000), pod vector (milli-CPU / 128000,
    milli-GPU / 8000), score ``int((1 - dot / 2) * 100)``: the smaller the dot product, the
    higher. Shares: best-fit GPU."""
    dot = (node.cpu_left / MAX_SPEC_CPU) * (t.milli_cpu / MAX_SPEC_CPU) + \
        (node.gpu_milli_left / MAX_SPEC_GPU) * (t.total_milli_gpu / MAX_SPEC_GPU)
    return int(MAX_NODE_SCORE * (1.0 - dot / 2)), (_best_fit_gpu(node, t) if t.is_share else -1)


def score_gpu_packing(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """GpuPacking: ``gpu_packing_score.go`` ``getPackingScore``. CPU-only pods score 0
    everywhere. Node with all GPUs free: ``max(33 - free, free)``; else, picking GPUs by free
    milli-GPU ascending: when fully free GPUs must be used, ``max(50 - used_free, 33)``; else
    ``max(100 - (sum of percent free on the GPUs used) // 10, 50)``. Shares: best-fit GPU."""
    share = _best_fit_gpu(node, t) if t.is_share else -1
    if t.total_milli_gpu <= 0:
        return 0, share
    free = node.fully_free()
    if free == node.gpus:
        return max(MAX_NODE_SCORE // 3 - free, free), share
    gl = node.gpu_left
    need = t.gpu_number
    use_free = 0
    used: list[int] = []
    for i in sorted(range(len(gl)), key=gl.__getitem__):
        if need == 0:
            break
        if t.milli_gpu <= gl[i]:
            need -= 1
            used.append(i)
            if gl[i] == MILLI:
                use_free += 1
    if need:
        return 0, share
    if use_free > 0:
        return max(MAX_NODE_SCORE // 2 - use_free, MAX_NODE_SCORE // 3), share
    pct = sum(gl[i] * 100 // MILLI for i in used)
    return max(MAX_NODE_SCORE - pct // 10, MAX_NODE_SCORE // 2), share


def score_gpu_clustering(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """GpuClustering: ``gpu_clustering_score.go`` ``Score``. CPU-only pods score 0. Base
    ``25 * (8000 - free milli-GPU) // 8000`` plus 75 when the node holds only pods of this
    pod's affinity tag, 50 when it holds that tag among others, 25 when it holds no GPU pod, 0
    otherwise. Shares: best-fit GPU."""
    share = _best_fit_gpu(node, t) if t.is_share else -1
    tag = t.affinity()
    if not tag:
        return 0, share
    base = MAX_NODE_SCORE // 4 * (MAX_SPEC_GPU - node.gpu_milli_left) // MAX_SPEC_GPU
    aff = node.affinity
    if aff.get(tag, 0) > 0:
        return base + (MAX_NODE_SCORE * 3 // 4 if len(aff) == 1 else MAX_NODE_SCORE * 2 // 4), \
            share
    return base + (MAX_NODE_SCORE // 4 if not aff else 0), share


def score_first_fit(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """First fit (ours, not in the paper): every node scores the same, so the first feasible
    node in configuration order wins (see :class:`PaperCluster`). Shares: best-fit GPU."""
    return 0, (_best_fit_gpu(node, t) if t.is_share else -1)


def score_spread(c: PaperCluster, node: PaperNode, t: PodType) -> tuple[int, int]:
    """Spread (ours): the node with the most free GPU (GPU pods) or CPU (CPU-only pods), as a
    0..100 score of the free fraction. Shares: best-fit GPU."""
    if t.gpu_number:
        s = node.gpu_milli_left * MAX_NODE_SCORE // max(1, node.gpus * MILLI)
    else:
        s = node.cpu_left * MAX_NODE_SCORE // max(1, node.cpu_capacity)
    return s, (_best_fit_gpu(node, t) if t.is_share else -1)


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
#: cluster (a uniform pick, and configuration order)
PAPER_POLICIES: dict[str, ScoreFn] = {
    "fgd": score_fgd,
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
_CACHEABLE = frozenset({"fgd", "best-fit", "dot-product", "gpu-packing", "gpu-clustering",
                        "first-fit", "spread"})


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

    Raises:
        ValueError: unknown policy or duplicate node names.
    """

    def __init__(self, nodes: Iterable[PaperNode], policy: str,
                 typical: Sequence[tuple[PodType, float]] = (), seed: int | None = None,
                 exact_fgd: bool = False, numa_strict: bool = False,
                 tie_order: Sequence[str] | None = None) -> None:
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
        self.frag = Fragmentation(typical)
        self.rng = random.Random(seed)
        self.exact = exact_fgd
        self.numa_strict = numa_strict
        self.cacheable = policy in _CACHEABLE
        self.gpu_capacity = sum(n.gpus for n in self.nodes) * MILLI
        self.gpu_used = 0
        self.last_gpus: list[int] = []  #: GPU indices the last :meth:`place` booked
        self._type_ids: dict[PodType, int] = {}

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
        per: dict[int, list[int]] = {}
        size: dict[int, int] = {}
        for i, g in enumerate(node.gpu_left):
            numa = node.numa_of_gpu[i]
            size[numa] = size.get(numa, 0) + 1
            if g == MILLI:
                per.setdefault(numa, []).append(i)
        if max(size.values(), default=0) >= t.gpu_number:
            ok = [(len(v), k) for k, v in per.items() if len(v) >= t.gpu_number]
            if not ok:
                return None
            _, k = min(ok)
            return per[k][: t.gpu_number]
        free = [i for i, g in enumerate(node.gpu_left) if g == MILLI]
        return free[: t.gpu_number] if len(free) >= t.gpu_number else None

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
        key = self._type_ids.get(t)  # node caches are keyed by a small int, hashed fast
        if key is None:
            key = self._type_ids[t] = len(self._type_ids)
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
        return best, best_gpu

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
