"""The simulation: trace pods offered one by one to a :class:`~gpuspawner.placement.Ledger`.

Pods come from :mod:`gpuspawner.simulate.traces` (which states how a trace pod becomes a
:class:`~gpuspawner.placement.model.Bundle` and a trace node a
:class:`~gpuspawner.placement.model.Node`); the ledger of :mod:`gpuspawner.placement`, the one
the spawner reserves with, places them under one of its policies. The metrics below are a
dict per run; :mod:`gpuspawner.simulate.report` prints them.

Modes:

* ``fill`` (the method of Weng et al., ATC '23, section 6): pods are drawn with replacement
  from the pod list with ``random.Random(seed)`` and placed one after another, with no
  departures, until the GPU demand of all arrived pods (in milli-GPU, rejected pods included)
  reaches the cluster's GPU capacity. The headline metric is the GPU allocation ratio at the
  end (allocated / capacity); the rest is fragmentation or refusals.
* ``replay``: creation and deletion events sorted by time (deletions first at equal times, a
  pod whose deletion is not after its creation leaves right after arriving); a pod is placed at
  ``creation_time`` and released at ``deletion_time`` (never, when that is empty). There is no
  queue: a pod that does not fit when it arrives is counted as rejected and dropped. Ratios are
  time-weighted means over the span from the first to the last event.

Metrics (one dict per run; ``--json`` prints them as they are):

* ``pods_total`` arrived pods = ``pods_placed`` + ``pods_rejected``; ``rejected_reasons`` counts
  refusals by ``PlacementRefused.reason`` (all ``unplaced`` unless ``explain`` is on: the
  ledger's cheap refusal path, ``reserve(..., explain=False)``, is the default here).
* ``gpu_milli_requested``: GPU demand of all arrived pods, milli-GPU.
* ``gpu_allocation_ratio``: allocated / capacity (fill: at the end; replay: time-weighted mean);
  ``unallocated_gpus``: capacity - allocated, in GPUs (same time basis).
* ``numa_aligned_fraction``: among placed bundles of >= 2 whole GPUs on a node that has a NUMA
  node with at least that many GPUs (``numa_aligned_eligible`` of them), the share whose GPUs
  all sit on one NUMA node; None when there are none.
* ``decision_us_p50`` / ``decision_us_p99``: nearest-rank percentiles of the time of each
  ``Ledger.reserve`` call (granted or refused), microseconds, ``time.perf_counter_ns``;
  ``decision_cpu_us_p99``: the same in this thread's CPU time (``time.thread_time_ns``), which
  leaves out the time other processes of a shared machine took;
  ``decisions_per_s``: calls / summed call time; ``setup_s``: ledger construction, seconds;
  ``wall_s``: the whole run, seconds; ``stop``: why arrivals ended (``capacity``, ``end``,
  ``max_pods``, ``time_limit``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

from gpuspawner.placement import POLICIES, Ledger, PlacementRefused
from gpuspawner.placement.model import GPU_MILLI, NUMA_POLICIES, Allocation, Bundle, Node, Owner
from gpuspawner.simulate.traces import Pod

MODES: tuple[str, ...] = ("fill", "replay")

#: metric keys, in the order the text table prints them
METRIC_KEYS: tuple[str, ...] = (
    "policy", "mode", "numa_policy", "seed", "explain_refusals", "nodes", "gpus",
    "pods_total", "pods_placed", "pods_rejected", "rejected_reasons", "gpu_milli_requested",
    "gpu_allocation_ratio", "unallocated_gpus", "numa_aligned_fraction", "numa_aligned_eligible",
    "decision_us_p50", "decision_us_p99", "decision_cpu_us_p99", "decisions_per_s", "setup_s",
    "wall_s", "stop",
)


def _percentile(sorted_values: Sequence[int], pct: float) -> int | None:
    """Nearest-rank percentile of already sorted values; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class _Run:
    """Book-keeping of one simulation: the ledger, reserve timings and NUMA alignment."""

    def __init__(self, nodes: Sequence[Node], policy: str, numa_policy: str,
                 seed: int | None, explain: bool = False) -> None:
        t0 = time.perf_counter()
        self.ledger = Ledger(nodes, policy, seed=seed)
        self.setup_s = time.perf_counter() - t0
        self.numa_policy = numa_policy
        self.explain = explain
        # node -> (GPU uuid -> NUMA id, largest number of GPUs on one NUMA node)
        self.gpu_numa: dict[str, tuple[dict[str, int | None], int]] = {}
        for node in nodes:
            per_numa: dict[int | None, int] = {}
            for g in node.gpus:
                per_numa[g.numa_node] = per_numa.get(g.numa_node, 0) + 1
            self.gpu_numa[node.name] = ({g.uuid: g.numa_node for g in node.gpus},
                                        max(per_numa.values(), default=0))
        self.gpu_count = sum(len(n.gpus) for n in nodes)
        self.latencies_ns: list[int] = []
        #: the same decisions in this thread's CPU time (time.thread_time_ns): what the
        #: decision costs, without the time other processes of a shared machine took
        self.cpu_ns: list[int] = []
        self.arrived = 0
        self.placed = 0
        self.rejected = 0
        self.requested_milli = 0
        self.allocated_milli = 0
        self.aligned = 0
        self.aligned_eligible = 0
        self.reasons: dict[str, int] = {}
        self._bundles: dict[Pod, Bundle] = {}

    def offer(self, pod: Pod) -> Allocation | None:
        """Reserve for one arriving pod; the allocation, or None when refused.

        Raises:
            RuntimeError: the ledger granted a different GPU amount than asked for.
        """
        bundle = self._bundles.get(pod)
        if bundle is None:
            bundle = self._bundles[pod] = pod.bundle(self.numa_policy)
        # the ledger holds one allocation per (user, server): a pod drawn again in fill mode is
        # a new server, named by its arrival number
        owner = Owner(pod.name, str(self.arrived))
        self.arrived += 1
        self.requested_milli += bundle.total_gpu_milli
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        try:
            alloc = self.ledger.reserve(bundle, owner, explain=self.explain)
        except PlacementRefused as e:
            self.latencies_ns.append(time.perf_counter_ns() - t0)
            self.cpu_ns.append(time.thread_time_ns() - c0)
            self.rejected += 1
            self.reasons[e.reason] = self.reasons.get(e.reason, 0) + 1
            return None
        self.latencies_ns.append(time.perf_counter_ns() - t0)
        self.cpu_ns.append(time.thread_time_ns() - c0)
        if alloc.total_gpu_milli != bundle.total_gpu_milli:
            raise RuntimeError(f"ledger granted {alloc.total_gpu_milli} milli-GPU for "
                               f"{pod.name}, which asked for {bundle.total_gpu_milli}")
        self.placed += 1
        self.allocated_milli += alloc.total_gpu_milli
        if bundle.gpus >= 2:
            numa_of, most_on_one = self.gpu_numa[alloc.node]
            if most_on_one >= bundle.gpus:
                self.aligned_eligible += 1
                if len({numa_of[u] for u in alloc.gpu_uuids}) == 1:
                    self.aligned += 1
        return alloc

    def release(self, alloc: Allocation) -> None:
        """Release an allocation made by :meth:`offer`."""
        self.ledger.release(alloc.id)
        self.allocated_milli -= alloc.total_gpu_milli

    def metrics(self, policy: str, mode: str, seed: int | None, allocated_milli: float,
                wall_s: float, stop: str) -> dict[str, Any]:
        """The metrics dict (keys in :data:`METRIC_KEYS`)."""
        capacity = self.ledger.gpu_milli_capacity()
        lat = sorted(self.latencies_ns)
        p50 = _percentile(lat, 50)
        p99 = _percentile(lat, 99)
        cpu99 = _percentile(sorted(self.cpu_ns), 99)
        total_ns = sum(lat)
        return {
            "policy": policy,
            "mode": mode,
            "numa_policy": self.numa_policy,
            "seed": seed,
            "explain_refusals": self.explain,
            "nodes": len(self.gpu_numa),
            "gpus": self.gpu_count,
            "pods_total": self.arrived,
            "pods_placed": self.placed,
            "pods_rejected": self.rejected,
            "rejected_reasons": dict(sorted(self.reasons.items(),
                                            key=lambda kv: (-kv[1], kv[0]))),
            "gpu_milli_requested": self.requested_milli,
            "gpu_allocation_ratio": (allocated_milli / capacity) if capacity else 0.0,
            "unallocated_gpus": (capacity - allocated_milli) / GPU_MILLI,
            "numa_aligned_fraction": ((self.aligned / self.aligned_eligible)
                                      if self.aligned_eligible else None),
            "numa_aligned_eligible": self.aligned_eligible,
            "decision_us_p50": None if p50 is None else p50 / 1000,
            "decision_us_p99": None if p99 is None else p99 / 1000,
            "decision_cpu_us_p99": None if cpu99 is None else cpu99 / 1000,
            "decisions_per_s": (len(lat) / (total_ns / 1e9)) if total_ns else None,
            "setup_s": self.setup_s,
            "wall_s": wall_s,
            "stop": stop,
        }


def simulate_fill(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = "fgd", *,
                  numa_policy: str = "strict", seed: int = 0, max_pods: int | None = None,
                  time_limit_s: float | None = None, explain: bool = False) -> dict[str, Any]:
    """Fill mode (Weng et al., "Beware of Fragmentation", USENIX ATC '23): draw pods with
    replacement (``random.Random(seed)``) and place them one after another, no departures,
    until the arrived pods' GPU demand (milli-GPU, rejected pods included) reaches the
    cluster's GPU capacity.

    Args:
        max_pods: stop after this many arrivals as well (``stop == "max_pods"``).
        time_limit_s: stop once this much wall time has passed (``stop == "time_limit"``).
        explain: let the ledger build its refusal sentence (``reserve(..., explain=True)``, an
            extra O(nodes) pass per refusal, as the spawner does) so that
            ``rejected_reasons`` has the real reasons; by default refusals are cheap and all
            counted as ``unplaced``.

    Returns:
        The metrics dict; ``gpu_allocation_ratio`` and ``unallocated_gpus`` are the state at
        the end, ``stop`` says why arrivals stopped (``"capacity"`` normally).

    Raises:
        ValueError: no pods, or the cluster has GPUs but no pod asks for any (fill would
            never end).
    """
    if not pods:
        raise ValueError("fill mode needs at least one pod")
    start = time.perf_counter()
    run = _Run(nodes, policy, numa_policy, seed, explain)
    capacity = run.ledger.gpu_milli_capacity()
    if capacity > 0 and not any(p.gpu_demand_milli for p in pods):
        raise ValueError("fill mode needs pods that ask for GPUs; none in this pod list does")
    rng = random.Random(seed)
    deadline = None if time_limit_s is None else start + time_limit_s
    stop = "capacity"
    while run.requested_milli < capacity:
        if max_pods is not None and run.arrived >= max_pods:
            stop = "max_pods"
            break
        if deadline is not None and time.perf_counter() >= deadline:
            stop = "time_limit"
            break
        run.offer(pods[rng.randrange(len(pods))])
    allocated = run.ledger.gpu_milli_allocated()
    if allocated != run.allocated_milli:
        raise RuntimeError(f"ledger reports {allocated} milli-GPU allocated, its allocations "
                           f"add up to {run.allocated_milli}")
    return run.metrics(policy, "fill", seed, allocated, time.perf_counter() - start, stop)


def simulate_replay(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = "fgd", *,
                    numa_policy: str = "strict", seed: int = 0, max_pods: int | None = None,
                    time_limit_s: float | None = None, explain: bool = False) -> dict[str, Any]:
    """Replay mode: place each pod at ``creation_time``, release it at ``deletion_time``.

    Events are sorted by time; at equal times deletions go first; a pod whose deletion is not
    after its creation is released right after it is offered. No queue: a refused pod is
    counted in ``pods_rejected`` and dropped. ``gpu_allocation_ratio`` is the time-weighted
    mean of allocated / capacity from the first to the last event, and ``unallocated_gpus`` the
    time-weighted mean of (capacity - allocated) in GPUs (with a zero-length span, the state
    after the last event).

    Args:
        max_pods: replay only the first this many pods by creation time.
        time_limit_s: stop once this much wall time has passed (``stop == "time_limit"``).
        explain: as for :func:`simulate_fill`.

    Raises:
        ValueError: a pod has no ``creation_time``.
    """
    missing = next((p for p in pods if p.creation_time is None), None)
    if missing is not None:
        raise ValueError(f"replay mode needs creation_time; pod {missing.name} has none "
                         "(use --mode fill for pod lists without times)")
    start = time.perf_counter()
    order = sorted(range(len(pods)), key=lambda i: (pods[i].creation_time, i))
    if max_pods is not None:
        order = order[:max_pods]
    # (time, kind, index): kind 0 = deletion, 1 = creation, 2 = deletion of a zero-length pod
    events: list[tuple[float, int, int]] = []
    for i in order:
        pod = pods[i]
        created = float(pod.creation_time)  # type: ignore[arg-type]
        events.append((created, 1, i))
        if pod.deletion_time is not None:
            if pod.deletion_time > created:
                events.append((pod.deletion_time, 0, i))
            else:
                events.append((created, 2, i))
    events.sort()
    run = _Run(nodes, policy, numa_policy, seed, explain)
    deadline = None if time_limit_s is None else start + time_limit_s
    live: dict[int, Allocation] = {}
    area = 0.0  # integral of allocated milli-GPU over time
    t_first = events[0][0] if events else 0.0
    t_last = t_first
    stop = "end"
    for t, kind, i in events:
        if deadline is not None and time.perf_counter() >= deadline:
            stop = "time_limit"
            break
        area += run.allocated_milli * (t - t_last)
        t_last = t
        if kind == 1:
            alloc = run.offer(pods[i])
            if alloc is not None:
                live[i] = alloc
        else:
            alloc = live.pop(i, None)
            if alloc is not None:
                run.release(alloc)
    span = t_last - t_first
    mean_allocated = area / span if span > 0 else float(run.allocated_milli)
    allocated = run.ledger.gpu_milli_allocated()
    if allocated != run.allocated_milli:
        raise RuntimeError(f"ledger reports {allocated} milli-GPU allocated, its allocations "
                           f"add up to {run.allocated_milli}")
    return run.metrics(policy, "replay", seed, mean_allocated, time.perf_counter() - start,
                       stop)


def simulate(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = "fgd",
             mode: str = "fill", *, numa_policy: str = "strict", seed: int = 0,
             max_pods: int | None = None, time_limit_s: float | None = None,
             explain: bool = False) -> dict[str, Any]:
    """Run one policy in one mode (see :func:`simulate_fill`, :func:`simulate_replay`).

    Raises:
        ValueError: unknown mode, policy or NUMA policy, or inputs the mode cannot use.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if numa_policy not in NUMA_POLICIES:
        raise ValueError(f"unknown NUMA policy {numa_policy!r}; expected one of "
                         f"{', '.join(NUMA_POLICIES)}")
    if mode == "fill":
        fn = simulate_fill
    elif mode == "replay":
        fn = simulate_replay
    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    return fn(nodes, pods, policy, numa_policy=numa_policy, seed=seed, max_pods=max_pods,
              time_limit_s=time_limit_s, explain=explain)

