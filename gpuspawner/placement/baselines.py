"""The FGD paper's baseline score plugins (BestFit, DotProd, GpuPacking, GpuClustering), ported
from its simulator, over a small milli-CPU node (:class:`PaperNode`). The ledger's policies of
the same names score a node through them (:mod:`.policies`); the simulator's cluster model
(:class:`gpuspawner.simulate.paper.PaperCluster`) schedules with them and with FGD.

Source: Weng et al., USENIX ATC '23, and github.com/hkust-adsl/kubernetes-scheduler-simulator
(commit 8f3d641); each score names the Go file and function it follows. Scores are integers
0..100 (``framework.MaxNodeScore``), higher is better. Units: milli-CPU, milli-GPU, memory in
MiB (the trace's unit). A node's GPUs are a list of free milli-GPU per GPU, in device order.
Pure: standard library only, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .workload import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, MILLI, PodType


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


@dataclass(eq=False, slots=True)
class PaperNode:
    """One node of :class:`~gpuspawner.simulate.paper.PaperCluster`: capacities and what is free.

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


#: a policy: (cluster, node, pod type) -> (score 0..100, share GPU index or -1); the cluster is
#: the simulator's :class:`~gpuspawner.simulate.paper.PaperCluster` (the baselines ignore it)
ScoreFn = Callable[[Any, PaperNode, PodType], tuple[int, int]]


def best_fit_gpu(node: PaperNode, t: PodType) -> int:
    """``allocateGpuIdBasedOnBestFit``: the share goes to the GPU with the least free milli-GPU
    that still fits (lowest index on ties)."""
    best = -1
    for i, g in enumerate(node.gpu_left):
        if g >= t.milli_gpu and (best < 0 or g < node.gpu_left[best]):
            best = i
    return best


def score_best_fit(c: Any, node: PaperNode, t: PodType) -> tuple[int, int]:
    """BestFit: ``best_fit_score.go`` ``getBestFitScore``. Lower
    ``0.5 * (cpu_left - cpu) / 128000 + 0.5 * (gpu_left - gpu) / 8000`` (node totals, milli)
    is better; score ``int((1 - that) * 100)``. Shares: best-fit GPU."""
    s = (0.5 * (node.cpu_left - t.milli_cpu) / MAX_SPEC_CPU
         + 0.5 * (node.gpu_milli_left - t.total_milli_gpu) / MAX_SPEC_GPU)
    return int((1.0 - s) * MAX_NODE_SCORE), (best_fit_gpu(node, t) if t.is_share else -1)


def score_dot_product(c: Any, node: PaperNode, t: PodType) -> tuple[int, int]:
    """DotProd (Tetris) as the paper ran it (``-dimext merge -norm max -gpusel best``):
    ``dot_product_score.go`` ``calculateDotProductScore`` with ``MergeGpuDim``: node vector
    (free milli-CPU / 128000, free milli-GPU / 8000), pod vector (milli-CPU / 128000,
    milli-GPU / 8000), score ``int((1 - dot / 2) * 100)``: the smaller the dot product, the
    higher. Shares: best-fit GPU."""
    dot = (node.cpu_left / MAX_SPEC_CPU) * (t.milli_cpu / MAX_SPEC_CPU) + \
        (node.gpu_milli_left / MAX_SPEC_GPU) * (t.total_milli_gpu / MAX_SPEC_GPU)
    return int(MAX_NODE_SCORE * (1.0 - dot / 2)), (best_fit_gpu(node, t) if t.is_share else -1)


def score_gpu_packing(c: Any, node: PaperNode, t: PodType) -> tuple[int, int]:
    """GpuPacking: ``gpu_packing_score.go`` ``getPackingScore``. CPU-only pods score 0
    everywhere. Node with all GPUs free: ``max(33 - free, free)``; else, picking GPUs by free
    milli-GPU ascending: when fully free GPUs must be used, ``max(50 - used_free, 33)``; else
    ``max(100 - (sum of percent free on the GPUs used) // 10, 50)``. Shares: best-fit GPU."""
    share = best_fit_gpu(node, t) if t.is_share else -1
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


def score_gpu_clustering(c: Any, node: PaperNode, t: PodType) -> tuple[int, int]:
    """GpuClustering: ``gpu_clustering_score.go`` ``Score``. CPU-only pods score 0. Base
    ``25 * (8000 - free milli-GPU) // 8000`` plus 75 when the node holds only pods of this
    pod's affinity tag, 50 when it holds that tag among others, 25 when it holds no GPU pod, 0
    otherwise. Shares: best-fit GPU."""
    share = best_fit_gpu(node, t) if t.is_share else -1
    tag = t.affinity()
    if not tag:
        return 0, share
    base = MAX_NODE_SCORE // 4 * (MAX_SPEC_GPU - node.gpu_milli_left) // MAX_SPEC_GPU
    aff = node.affinity
    if aff.get(tag, 0) > 0:
        return base + (MAX_NODE_SCORE * 3 // 4 if len(aff) == 1 else MAX_NODE_SCORE * 2 // 4), \
            share
    return base + (MAX_NODE_SCORE // 4 if not aff else 0), share
