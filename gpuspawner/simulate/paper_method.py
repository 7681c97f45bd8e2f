"""``gpuspawner simulate --method paper``: the FGD paper's experiment, on
:mod:`gpuspawner.simulate.paper`'s milli-CPU cluster model.

Method (Weng et al., "Beware of Fragmentation", USENIX ATC '23, section 6, as its simulator
github.com/hkust-adsl/kubernetes-scheduler-simulator runs it):

1. The target workload of ``fgd`` is the typical pods of the *whole* pod list
   (:func:`~gpuspawner.simulate.paper.typical_pods`: 95 % of pods, CPU-only types included,
   weighted by count): ``Simulator.SetTypicalPods`` runs before the workload is tuned.
2. The pod list, sorted by name, is shuffled (``Simulator.SortClusterPods`` with
   ``shufflePod: true``), *then* tuned to 130 % of the cluster's GPU capacity
   (``Simulator.TunePodsByNodeTotalResource``, ``pkg/simulator/simulator.go``; ``Simulate`` in
   ``core.go`` calls them in that order): while the list asks for more milli-GPU than that, a
   uniformly random pod is removed (``tuneDownPods``); while it asks for less, a uniformly
   random pod of the name-sorted list is appended *at the end* as long as the demand plus that
   pod's per-GPU ``milli_gpu`` stays within the target (``tuneUpPods``, whose check uses the
   per-GPU value, as copied here). So on a list below 130 % every original pod arrives, in
   random order, before the first duplicate.
3. The nodes are ranked by a random permutation (``syncClusterResourceList`` prefixes each
   name with ``rand.Perm``'s index, and ties go to the smallest name): the ``tie_order`` of
   :class:`~gpuspawner.simulate.paper.PaperCluster`. Ranking ties by plain node name instead
   (``node_order="name"``) sends every tie, e.g. every CPU-only pod under ``gpu-packing``,
   to the same nodes, and leaves 544.0 GPUs unallocated for ``gpu-packing`` on ``default``
   where the paper reports 510.7. Every pod is then offered once, in order, with no
   departures.
4. After each pod the arrived demand (refused pods included) and the allocated milli-GPU are
   recorded (``ClusterGpuFragReport``'s ``[Alloc]`` line); the paper's "X % arrived" column is
   the mean allocation over the pods whose arrived demand rounds to X % of capacity
   (``experiments/analysis/merge_alloc_discrete.py``). We report X = 100.

Differences, stated: Python's ``random.Random(seed)`` replaces Go's ``math/rand`` seeded with
the same number, so seed 42 here is not the paper's seed 42 pod sequence; only means over
seeds compare. ``benchmarks/paper_exact.py`` passes Go's generator as ``rng`` (and its node
ranking as ``rank_nodes``) and reproduces the paper's published per-seed curves exactly.
Pods after the 100 % reading cannot change it, so by default a run stops once the arrived
demand passes 100.5 % (``until=130`` runs the whole 130 %).

The node rows and pod lists come from :mod:`gpuspawner.simulate.traces`
(:func:`~gpuspawner.simulate.traces.read_node_rows`, :func:`~gpuspawner.simulate.traces.load_pods`);
the ``--compare`` table is :func:`gpuspawner.simulate.report.format_compare`.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from gpuspawner.simulate.paper import (
    MEMORY_POLICIES,
    MILLI,
    PAPER_NAMES,
    PAPER_POLICIES,
    PaperCluster,
    PaperNode,
    PodType,
    pod_type,
    typical_pods,
)

#: the paper's 10-seed means of unallocated GPUs at 100 % arrived, openb_node_list_gpu_node.csv
#: (6,212 GPUs), from experiments/analysis/expected_results/analysis_allo_discrete.csv:
#: ``total_gpus * (1 - column "100" / 100)`` averaged over seeds 42..51. The first three
#: traces are in ``../shared/data/alibaba-gpu-v2023``; the pod lists of the others are in the
#: simulator's repository (``data/csv/``, commit 8f3d641), which is where the results are from.
PAPER_UNALLOCATED: dict[str, dict[str, float]] = {
    "default": {"random": 850.9, "dot-product": 582.6, "gpu-clustering": 518.7,
                "gpu-packing": 510.7, "best-fit": 443.4, "fgd": 296.5},
    "multigpu50": {"random": 1162.8, "dot-product": 327.5, "gpu-clustering": 268.0,
                   "gpu-packing": 244.5, "best-fit": 271.9, "fgd": 180.5},
    "gpushare100": {"random": 1310.7, "dot-product": 1119.5, "gpu-clustering": 1104.2,
                    "gpu-packing": 1109.8, "best-fit": 955.7, "fgd": 829.9},
    "cpu050": {"random": 682.0, "dot-product": 432.7, "gpu-clustering": 402.5,
               "gpu-packing": 406.1, "best-fit": 400.1, "fgd": 310.8},
    "cpu100": {"random": 780.5, "dot-product": 513.7, "gpu-clustering": 471.2,
               "gpu-packing": 466.2, "best-fit": 418.5, "fgd": 297.7},
    "cpu200": {"random": 1054.4, "dot-product": 779.3, "gpu-clustering": 641.9,
               "gpu-packing": 622.5, "best-fit": 487.5, "fgd": 321.5},
    "cpu250": {"random": 1242.5, "dot-product": 1020.6, "gpu-clustering": 760.9,
               "gpu-packing": 742.4, "best-fit": 546.0, "fgd": 422.7},
    "gpushare40": {"random": 940.2, "dot-product": 664.4, "gpu-clustering": 636.3,
                   "gpu-packing": 635.2, "best-fit": 531.6, "fgd": 375.1},
    "gpushare60": {"random": 1068.0, "dot-product": 819.0, "gpu-clustering": 813.7,
                   "gpu-packing": 798.4, "best-fit": 679.6, "fgd": 543.2},
    "gpushare80": {"random": 1203.8, "dot-product": 985.5, "gpu-clustering": 963.0,
                   "gpu-packing": 953.7, "best-fit": 828.9, "fgd": 678.2},
    "gpuspec10": {"random": 853.7, "dot-product": 610.4, "gpu-clustering": 499.7,
                  "gpu-packing": 482.2, "best-fit": 428.7, "fgd": 331.5},
    "gpuspec20": {"random": 875.8, "dot-product": 727.3, "gpu-clustering": 676.5,
                  "gpu-packing": 665.7, "best-fit": 716.7, "fgd": 331.6},
    "gpuspec25": {"random": 905.8, "dot-product": 904.6, "gpu-clustering": 844.5,
                  "gpu-packing": 821.7, "best-fit": 890.2, "fgd": 378.5},
    "gpuspec33": {"random": 1002.2, "dot-product": 1253.8, "gpu-clustering": 1174.7,
                  "gpu-packing": 1104.6, "best-fit": 1217.9, "fgd": 755.6},
    "multigpu20": {"random": 812.6, "dot-product": 506.5, "gpu-clustering": 413.5,
                   "gpu-packing": 403.8, "best-fit": 389.2, "fgd": 277.8},
    "multigpu30": {"random": 830.5, "dot-product": 428.3, "gpu-clustering": 338.4,
                   "gpu-packing": 329.0, "best-fit": 337.6, "fgd": 226.3},
    "multigpu40": {"random": 908.5, "dot-product": 370.2, "gpu-clustering": 289.1,
                   "gpu-packing": 273.8, "best-fit": 304.5, "fgd": 192.2},
}

CPU_ROUNDING = ("none", "ceil")
DEFAULT_SEEDS = tuple(range(42, 52))
DEFAULT_TRACES = ("default", "multigpu50", "gpushare100")


def parse_seeds(text: str) -> list[int]:
    """``"42-51"``, ``"42,44"`` or ``"42-44,50"`` to a list of seeds.

    Raises:
        ValueError: malformed text or an empty list.
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            lo, hi = part.split("-", 1) if not part.startswith("-") else (part, part)
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad seed range {part!r}")
            out.extend(range(a, b + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError("no seeds given")
    return out


def _ceil_milli(v: int) -> int:
    return -(-v // MILLI) * MILLI


def make_nodes(rows: Sequence[tuple[str, int, int, int, str]], cpu_rounding: str = "none",
               numa_split: int = 1) -> list[PaperNode]:
    """Fresh :class:`PaperNode` objects from ``(name, cpu_milli, memory_mib, gpus, model)``.
    ``cpu_rounding="ceil"`` rounds milli-CPU up to whole CPUs; ``numa_split`` > 1 gives nodes
    with >= 2 GPUs that many NUMA nodes, GPUs split evenly in device order (remainder to the
    lowest ids), as :func:`gpuspawner.simulate.traces.make_node` does."""
    out = []
    for name, cpu, mem, gpus, model in rows:
        parts = numa_split if gpus >= 2 else 1
        q, r = divmod(gpus, parts)
        numa: list[int] = []
        for k in range(parts):
            numa.extend([k] * (q + (1 if k < r else 0)))
        out.append(PaperNode(name, model, _ceil_milli(cpu) if cpu_rounding == "ceil" else cpu,
                             mem, gpus, numa_of_gpu=tuple(numa)))
    return out


Task = tuple[str, PodType, int]  # (pod name, type, memory MiB)


def tasks_of(pods, cpu_rounding: str = "none") -> list[Task]:
    """Trace pods (:class:`gpuspawner.simulate.traces.Pod`) as
    ``(name, PodType, memory_mib)``."""
    out = []
    for p in pods:
        cpu = _ceil_milli(p.cpu_milli) if cpu_rounding == "ceil" else p.cpu_milli
        out.append((p.name, pod_type(cpu, p.num_gpu, p.gpu_milli, "|".join(p.gpu_spec)),
                    p.memory_mib))
    return out


def tune_workload(tasks: Sequence[Task], capacity_milli: int, ratio: float,
                  rng) -> list[Task]:
    """Step 2 of the method (module docstring): sort by name, shuffle, then tune to ``ratio``
    x capacity (removals anywhere, duplicates appended at the end).

    Raises:
        ValueError: the list must grow but no task asks for a GPU (it would never reach the
            target).
    """
    target = ratio * capacity_milli
    out = sorted(tasks, key=lambda x: x[0])
    rng.shuffle(out)
    total = sum(t.total_milli_gpu for _, t, _ in out)
    if total > target:
        while total > target and out:
            _, t, _ = out.pop(rng.randrange(len(out)))
            total -= t.total_milli_gpu
    elif total < target:
        pool = sorted(tasks, key=lambda x: x[0])
        if not any(t.total_milli_gpu > 0 for _, t, _ in pool):
            raise ValueError("the paper's method needs pods that ask for GPUs; none in this "
                             "pod list does")
        while True:
            pick = pool[rng.randrange(len(pool))]
            if total + pick[1].milli_gpu > target:
                break
            total += pick[1].total_milli_gpu
            out.append(pick)
    return out


NODE_ORDERS = ("shuffled", "name")


def ranked_by_permutation(names: Sequence[str], perm: Sequence[int]) -> list[str]:
    """The node names in the order the simulator's renamed nodes sort: node ``i`` of the
    name-sorted list is renamed ``"%04d-" % perm[i] + name`` (``syncClusterResourceList``),
    so it ranks ``perm[i]``. ``perm`` is a permutation of ``range(len(names))``."""
    ranked = [""] * len(names)
    for i, name in enumerate(sorted(names)):
        ranked[perm[i]] = name
    return ranked


def tie_order(names: Sequence[str], rng) -> list[str]:
    """Step 3 of the method: the node names ranked by a permutation drawn from ``rng``
    (:func:`ranked_by_permutation`)."""
    perm = list(range(len(names)))
    rng.shuffle(perm)
    return ranked_by_permutation(names, perm)


def _percentile(values: list[int], pct: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[max(1, math.ceil(pct / 100 * len(s))) - 1] / 1000


def run_paper(rows: Sequence[tuple[str, int, int, int, str]], tasks: Sequence[Task],
              policy: str, seed: int, *, typical=None, cpu_rounding: str = "none",
              until: float = 100.5, exact_fgd: bool = False, numa: str = "none",
              numa_split: int = 2, trace: str = "",
              node_order: str = "shuffled", rng: Any = None,
              rank_nodes: Callable[[Sequence[str], Any], list[str]] = tie_order,
              curve: bool = False) -> dict[str, Any]:
    """One run of the paper's method (module docstring) for one policy and seed.

    Args:
        rows: node rows (:func:`read_node_rows`).
        tasks: the pod list (:func:`tasks_of`), untuned.
        policy: a key of :data:`~gpuspawner.simulate.paper.PAPER_POLICIES`.
        seed: seeds the tuning, the shuffle and the ``random`` policy
            (``random.Random(seed)``).
        typical: the fgd target workload; default: :func:`typical_pods` of ``tasks``.
        cpu_rounding: ``none`` (milli-CPU, as the paper) or ``ceil`` (whole CPUs, as cpusets).
        until: stop once arrived demand exceeds this percent of capacity (130 = all of it).
        exact_fgd: see :class:`~gpuspawner.simulate.paper.PaperCluster`.
        numa: ``none`` or ``strict`` (nodes with >= 2 GPUs get ``numa_split`` NUMA nodes).
        node_order: ``shuffled`` (the paper's: ties by a random node ranking per seed, step 3)
            or ``name`` (ties to the smallest node name).
        rng: the generator for steps 2 and 3 (``shuffle(list)`` and ``randrange(n)``);
            default ``random.Random(seed)``. ``benchmarks/paper_exact.py`` passes Go's.
        rank_nodes: draws the tie order from ``(node names, rng)`` after the tuning
            (default :func:`tie_order`).
        curve: also return ``curve``: percent of GPU capacity allocated at each percent
            arrived (the paper's columns, ``{percent: mean}``).

    Returns:
        Metrics: ``unallocated_gpus`` and ``gpu_allocation_ratio`` at 100 % arrived,
        ``numa_aligned_fraction`` of multi-GPU pods that could sit on one NUMA node,
        decision latency percentiles (microseconds), counts and ``wall_s``.
    """
    t_start = time.perf_counter()
    nodes = make_nodes(rows, cpu_rounding, numa_split if numa != "none" else 1)
    if typical is None:
        typical = typical_pods(t for _, t, _ in tasks)
    if node_order not in NODE_ORDERS:
        raise ValueError(f"node_order must be one of {', '.join(NODE_ORDERS)}")
    if rng is None:
        rng = random.Random(seed)
    cap = sum(n.gpus for n in nodes) * MILLI
    work = tune_workload(tasks, cap, 1.3, rng)
    ranked = rank_nodes([n.name for n in nodes], rng) if node_order == "shuffled" else None
    cluster = PaperCluster(nodes, policy, typical, seed=seed, exact_fgd=exact_fgd,
                           numa_strict=(numa == "strict"), tie_order=ranked,
                           type_memory=type_memory(tasks) if policy in MEMORY_POLICIES
                           else None)
    arrived = 0
    placed = rejected = 0
    lat: list[int] = []
    at: dict[int, list[int]] = {}
    aligned = eligible = 0
    numa_size = {n.name: max((n.numa_of_gpu.count(k) for k in set(n.numa_of_gpu)), default=0)
                 for n in nodes}
    limit = until / 100 * cap
    for _name, t, mem in work:
        if arrived > limit:
            break
        arrived += t.total_milli_gpu
        t0 = time.perf_counter_ns()
        node = cluster.place(t, mem)
        lat.append(time.perf_counter_ns() - t0)
        if node is None:
            rejected += 1
        else:
            placed += 1
            if t.gpu_number >= 2 and numa_size[node.name] >= t.gpu_number:
                eligible += 1
                aligned += len({node.numa_of_gpu[i] for i in cluster.last_gpus}) == 1
        pct = round(arrived * 100 / cap) if cap else 0
        at.setdefault(pct, []).append(cluster.gpu_used)
    used = at.get(100) or [u for k in (99, 100, 101) for u in at.get(k, [])]
    mean_used = statistics.fmean(used) if used else float(cluster.gpu_used)
    extra = {"curve": {k: 100 * statistics.fmean(v) / cap for k, v in sorted(at.items())}
             } if curve and cap else {}
    return {
        "trace": trace, "policy": policy, "seed": seed, "method": "paper",
        "cpu_rounding": cpu_rounding, "numa": numa, "exact_fgd": exact_fgd,
        "node_order": node_order,
        "nodes": len(nodes), "gpus": cap // MILLI,
        "pods_arrived": placed + rejected, "pods_placed": placed, "pods_rejected": rejected,
        "arrived_percent": arrived * 100 / cap if cap else 0.0,
        "gpu_allocation_ratio": mean_used / cap if cap else 0.0,
        "unallocated_gpus": (cap - mean_used) / MILLI,
        "numa_aligned_fraction": (aligned / eligible) if eligible else None,
        "numa_aligned_eligible": eligible,
        "decision_us_p50": _percentile(lat, 50), "decision_us_p99": _percentile(lat, 99),
        "typical_pods": len(typical), "wall_s": time.perf_counter() - t_start, **extra,
    }


def type_memory(tasks: Sequence[Task]) -> dict[PodType, int]:
    """The memory each pod type of ``tasks`` typically asks, MiB: the lower median over the
    type's pods (on the Alibaba traces most types ask one amount), for the memory-aware
    policies (:data:`~gpuspawner.simulate.paper.MEMORY_POLICIES`)."""
    seen: dict[PodType, list[int]] = {}
    for _name, t, mem in tasks:
        seen.setdefault(t, []).append(mem)
    return {t: statistics.median_low(v) for t, v in seen.items()}


def _job(args: tuple) -> dict[str, Any]:
    rows, tasks, policy, seed, kw = args
    return run_paper(rows, tasks, policy, seed, **kw)


def compare(rows, traces: dict[str, list[Task]], policies: Sequence[str],
            seeds: Sequence[int], jobs: int = 1, **kw) -> list[dict[str, Any]]:
    """Every (trace, policy, seed) run; ``jobs`` > 1 runs them in that many processes.
    Returns the per-run metrics."""
    work = [(rows, tasks, p, s, {**kw, "trace": name})
            for name, tasks in traces.items() for p in policies for s in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as ex:
            return list(ex.map(_job, work, chunksize=1))
    return [_job(w) for w in work]


def summarize(results: Sequence[dict[str, Any]], paper: bool = True) -> list[dict[str, Any]]:
    """Per (trace, policy): mean, sample standard deviation, min and max of unallocated GPUs,
    mean allocation ratio, the median of the per-run decision p50 and the largest per-run p99,
    the paper's mean (when published and ``paper``: the paper's runs used
    ``openb_node_list_gpu_node.csv`` without NUMA) and our difference from it in percent."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["trace"], r["policy"]), []).append(r)
    out = []
    for (trace, policy), rs in groups.items():
        un = [r["unallocated_gpus"] for r in rs]
        ref = PAPER_UNALLOCATED.get(trace, {}).get(policy) if paper else None
        mean = statistics.fmean(un)
        out.append({
            "trace": trace, "policy": policy, "seeds": len(rs),
            "unallocated_mean": mean,
            "unallocated_std": statistics.stdev(un) if len(un) > 1 else 0.0,
            "unallocated_min": min(un), "unallocated_max": max(un),
            "allocation_ratio": statistics.fmean(r["gpu_allocation_ratio"] for r in rs),
            "numa_aligned_fraction": (statistics.fmean(x) if (x := [
                r["numa_aligned_fraction"] for r in rs
                if r["numa_aligned_fraction"] is not None]) else None),
            "decision_us_p50": statistics.median(r["decision_us_p50"] or 0 for r in rs),
            "decision_us_p99": max(r["decision_us_p99"] or 0 for r in rs),
            "paper_mean": ref,
            "diff_percent": None if ref is None else 100 * (mean - ref) / ref,
            "per_seed": {r["seed"]: round(r["unallocated_gpus"], 1) for r in rs},
        })
    return out


def _by_trace_and_seed(results: Sequence[dict[str, Any]]
                       ) -> dict[str, dict[int, dict[str, float]]]:
    """trace -> seed -> policy -> unallocated GPUs of :func:`compare`'s results."""
    by: dict[str, dict[int, dict[str, float]]] = {}
    for r in results:
        by.setdefault(r["trace"], {}).setdefault(r["seed"], {})[r["policy"]] = \
            r["unallocated_gpus"]
    return by


def default_wins(results: Sequence[dict[str, Any]], default: str = "fgd"
                 ) -> list[dict[str, Any]]:
    """Per trace, whether ``default`` leaves strictly fewer unallocated GPUs than every other
    policy run, in the mean over seeds and on each seed (the placement issue's goal).

    Returns:
        One dict per trace with ``default`` among its policies: ``trace``, ``policy``,
        ``seeds`` (how many), ``seeds_won`` (seeds where every other policy left more),
        ``mean_won`` (bool), ``lost`` (``[seed, policy, theirs, ours]`` for each tie or loss,
        GPUs rounded to 0.1).
    """
    by = _by_trace_and_seed(results)
    out = []
    for trace, seeds in by.items():
        if not any(default in v for v in seeds.values()):
            continue
        lost = [[seed, p, round(u, 1), round(v[default], 1)]
                for seed, v in sorted(seeds.items()) if default in v
                for p, u in sorted(v.items()) if p != default and u <= v[default]]
        means: dict[str, list[float]] = {}
        for v in seeds.values():
            for p, u in v.items():
                means.setdefault(p, []).append(u)
        mean = {p: statistics.fmean(u) for p, u in means.items()}
        out.append({
            "trace": trace, "policy": default,
            "seeds": sum(1 for v in seeds.values() if default in v),
            "seeds_won": sum(1 for v in seeds.values() if default in v and all(
                u > v[default] for p, u in v.items() if p != default)),
            "mean_won": all(m > mean[default] for p, m in mean.items() if p != default),
            "lost": lost,
        })
    return out


def sign_flip_p(diffs: Sequence[float], samples: int = 20_000) -> float:
    """Two-sided p-value of the paired sign-flip (permutation) test that the mean of ``diffs``
    is 0: the share of the 2^n ways of flipping the signs of the per-seed differences whose
    mean is at least as far from 0 as the observed one. Exact for n <= 16 (65,536 flips);
    above, ``samples`` flips drawn with ``random.Random(0)``. 1.0 for no differences."""
    d = [float(x) for x in diffs]
    n = len(d)
    if not n or all(x == 0 for x in d):
        return 1.0
    obs = abs(sum(d)) - 1e-9
    if n <= 16:
        hits = 0
        for mask in range(1 << n):
            tot = 0.0
            for i, x in enumerate(d):
                tot += -x if mask >> i & 1 else x
            hits += abs(tot) >= obs
        return hits / (1 << n)
    rng = random.Random(0)
    hits = sum(abs(sum(x if rng.random() < 0.5 else -x for x in d)) >= obs
               for _ in range(samples))
    return (hits + 1) / (samples + 1)


def paired(results: Sequence[dict[str, Any]], policy: str, baseline: str = "fgd"
           ) -> list[dict[str, Any]]:
    """Per trace, ``policy`` against ``baseline`` over the seeds both ran (paired: the same
    seed is the same pod order and node ranking): ``seeds``, ``mean_diff`` (unallocated GPUs,
    policy minus baseline; negative = fewer idle GPUs), ``diff_percent`` of the baseline's
    mean, ``fewer`` / ``equal`` / ``more`` (seeds), ``p`` (:func:`sign_flip_p`)."""
    by = _by_trace_and_seed(results)
    out = []
    for trace, seeds in by.items():
        pairs = [(v[policy], v[baseline]) for _, v in sorted(seeds.items())
                 if policy in v and baseline in v]
        if not pairs:
            continue
        diffs = [a - b for a, b in pairs]
        base = statistics.fmean(b for _, b in pairs)
        mean = statistics.fmean(diffs)
        out.append({
            "trace": trace, "policy": policy, "baseline": baseline, "seeds": len(pairs),
            "mean_diff": mean, "diff_percent": 100 * mean / base if base else 0.0,
            "fewer": sum(x < 0 for x in diffs), "equal": sum(x == 0 for x in diffs),
            "more": sum(x > 0 for x in diffs), "p": sign_flip_p(diffs),
        })
    return out


__all__ = ["NODE_ORDERS", "PAPER_UNALLOCATED", "PAPER_NAMES", "PAPER_POLICIES", "compare",
           "default_wins", "make_nodes", "paired", "parse_seeds", "ranked_by_permutation",
           "run_paper", "sign_flip_p", "summarize", "tasks_of", "tie_order", "tune_workload"]
