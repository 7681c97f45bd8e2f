"""The FGD paper's workload model, shared by the ledger's ``fgd`` (:mod:`.fragmentation`,
:mod:`.prior`) and the simulator (:mod:`gpuspawner.simulate.paper`): task types
(:class:`PodType`), the target workload (:func:`typical_pods`) and the FGD plugin's score of a
fragmentation growth (:func:`fgd_score_from_delta`).

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23, and its simulator
github.com/hkust-adsl/kubernetes-scheduler-simulator (commit 8f3d641); each rule names the Go
file and function it follows. Pure: standard library only, no I/O.

Units: milli-CPU (1000 = one CPU), milli-GPU (1000 = one whole GPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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


def workload_distance(a: list[tuple[PodType, float]], b: list[tuple[PodType, float]]) -> float:
    """Total variation distance between two workloads (``[(type, frequency)]``, frequencies
    summing to 1, as :func:`typical_pods` returns them): half the summed absolute difference
    of each type's frequency, a type missing from one counting as frequency 0 there. 0 for
    equal workloads, 1 for workloads with no type in common."""
    fa = dict(a)
    fb = dict(b)
    return 0.5 * sum(abs(fa.get(t, 0.0) - fb.get(t, 0.0)) for t in fa.keys() | fb.keys())


def asks_whole_gpus(workload: Iterable[tuple[PodType, float]]) -> bool:
    """True when some type of ``workload`` (``[(type, frequency)]``) asks for whole GPUs
    (``gpu_number >= 1`` and not a share). Our additions to FGD (the look-ahead and the
    memory term of ``fgd-lookahead``, ``fgd-mem``, ``fgd-mem-lookahead``) act only then: on
    a workload of GPU shares and CPU-only pods alone they are ``fgd``, because there they
    left more GPUs idle than ``fgd`` (the paper's ``gpushare100``, docs/placement.md
    "Share-only workloads"). Ours, not the paper's."""
    return any(t.gpu_number >= 1 and not t.is_share for t, _p in workload)


def sigmoid(x: float) -> float:
    """``plugin.sigmoid`` (``plugin_utils.go``): 1 / (1 + e^-x)."""
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score_from_delta(delta: float) -> int:
    """The FGD plugin's node score for a fragmentation growth ``delta`` (milli-GPU):
    ``int64(sigmoid((before - after) / 1000) * MaxNodeScore)`` (``fgd_score.go``
    ``calculateGpuShareFragExtendScore``), 0..100, higher is better. Go truncates toward zero,
    so growths within about 40 milli-GPU of each other often get the same score."""
    return int(sigmoid(-delta / 1000.0) * MAX_NODE_SCORE)
