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
* ``replay`` with the wait queue (:func:`simulate_replay_queue`, ``--queue``): a pod that fits
  the capacity but not what is free waits in :class:`~gpuspawner.placement.queue.WaitQueue`
  and keeps its duration once started; :func:`compare_queue` runs both replays.

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
* replay only: ``gpu_hours``, GPU time served (the integral of allocated GPUs, hours);
  ``span_s``, first to last event (seconds). With the queue, the wait metrics of
  :func:`simulate_replay_queue`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
import zlib
from collections.abc import Sequence
from typing import Any

from gpuspawner.placement import (
    DEFAULT_POLICY,
    POLICIES,
    Ledger,
    PlacementError,
    PlacementRefused,
)
from gpuspawner.placement.model import GPU_MILLI, NUMA_POLICIES, Allocation, Bundle, Node, Owner
from gpuspawner.placement.queue import WaitQueue
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


def nearest_rank(sorted_values: Sequence[int], pct: float) -> int | None:
    """The nearest-rank ``pct``-th percentile (0-100) of already sorted values, in their unit
    (the decision times here: nanoseconds); None when empty. Also what
    ``benchmarks/placement.py`` reads its percentiles with."""
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
        bundle = self.bundle_of(pod)
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
        self.book(pod, bundle, alloc)
        return alloc

    def bundle_of(self, pod: Pod) -> Bundle:
        """The pod's bundle under this run's NUMA policy (cached per pod)."""
        bundle = self._bundles.get(pod)
        if bundle is None:
            bundle = self._bundles[pod] = pod.bundle(self.numa_policy)
        return bundle

    def book(self, pod: Pod, bundle: Bundle, alloc: Allocation) -> None:
        """Count a granted allocation: placed pods, allocated milli-GPU, NUMA alignment.

        Raises:
            RuntimeError: the ledger granted a different GPU amount than asked for.
        """
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

    def release(self, alloc: Allocation) -> None:
        """Release an allocation made by :meth:`offer`."""
        self.ledger.release(alloc.id)
        self.allocated_milli -= alloc.total_gpu_milli

    def metrics(self, policy: str, mode: str, seed: int | None, allocated_milli: float,
                wall_s: float, stop: str) -> dict[str, Any]:
        """The metrics dict (keys in :data:`METRIC_KEYS`)."""
        capacity = self.ledger.gpu_milli_capacity()
        lat = sorted(self.latencies_ns)
        p50 = nearest_rank(lat, 50)
        p99 = nearest_rank(lat, 99)
        cpu99 = nearest_rank(sorted(self.cpu_ns), 99)
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


def simulate_fill(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = DEFAULT_POLICY, *,
                  numa_policy: str = "strict", seed: int = 0, max_pods: int | None = None,
                  time_limit_s: float | None = None, explain: bool = False,
                  keep_times: bool = False) -> dict[str, Any]:
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
        keep_times: also return every decision's time, in decision order:
            ``decision_ns`` (wall clock, ``time.perf_counter_ns``) and ``decision_cpu_ns``
            (this thread's CPU time, ``time.thread_time_ns``), lists of ints in nanoseconds,
            one per ``reserve`` call (``pods_total`` of them). ``benchmarks/placement.py
            --repeat`` takes each decision's smallest time over runs of the same fill.

    Returns:
        The metrics dict (:data:`METRIC_KEYS`, and the two lists with ``keep_times``);
        ``gpu_allocation_ratio`` and ``unallocated_gpus`` are the state at the end, ``stop``
        says why arrivals stopped (``"capacity"`` normally).

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
    m = run.metrics(policy, "fill", seed, allocated, time.perf_counter() - start, stop)
    if keep_times:
        m.update(decision_ns=run.latencies_ns, decision_cpu_ns=run.cpu_ns)  # run ends here
    return m


def _replay_metrics(run: _Run, policy: str, seed: int, area: float, t_first: float,
                    t_last: float, start: float, stop: str) -> dict[str, Any]:
    """The metrics of a replay (both modes): the time-weighted allocation over the span
    (``area`` in milli-GPU seconds), GPU hours and the span in seconds, after checking that
    the ledger's allocated milli-GPU equal the run's own count.

    Raises:
        RuntimeError: the two counts differ.
    """
    span = t_last - t_first
    mean_allocated = area / span if span > 0 else float(run.allocated_milli)
    allocated = run.ledger.gpu_milli_allocated()
    if allocated != run.allocated_milli:
        raise RuntimeError(f"ledger reports {allocated} milli-GPU allocated, its allocations "
                           f"add up to {run.allocated_milli}")
    m = run.metrics(policy, "replay", seed, mean_allocated, time.perf_counter() - start, stop)
    m.update(gpu_hours=area / GPU_MILLI / 3600, span_s=span)
    return m


def _replay_order(pods: Sequence[Pod], max_pods: int | None) -> list[int]:
    """Indices of ``pods`` by creation time (ties in trace order), the first ``max_pods``.

    Raises:
        ValueError: a pod has no ``creation_time``.
    """
    missing = next((p for p in pods if p.creation_time is None), None)
    if missing is not None:
        raise ValueError(f"replay mode needs creation_time; pod {missing.name} has none "
                         "(use --mode fill for pod lists without times)")
    order = sorted(range(len(pods)), key=lambda i: (pods[i].creation_time, i))
    return order if max_pods is None else order[:max_pods]


def simulate_replay(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = DEFAULT_POLICY, *,
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
    order = _replay_order(pods, max_pods)
    start = time.perf_counter()
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
    return _replay_metrics(run, policy, seed, area, t_first, t_last, start, stop)


def simulate(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = DEFAULT_POLICY,
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



# --------------------------------------------------------------------------------------------
# replay with the wait queue (``--mode replay --queue``)

#: the keys :func:`simulate_replay_queue` adds, and :func:`compare_queue` prints side by side
QUEUE_KEYS: tuple[str, ...] = (
    "pods_total", "pods_placed", "pods_rejected", "pods_waited", "pods_still_waiting",
    "wait_mean_s", "wait_p95_s", "wait_max_s", "gpu_allocation_ratio", "unallocated_gpus",
    "unallocated_gpus_waiting", "waiting_s", "gpu_hours", "span_s", "wall_s",
)

#: ``unallocated_gpus_by_tenth``: the span cut into this many equal parts
SPAN_PARTS = 10


def _by_part(steps: Sequence[tuple[float, int]], t_first: float, t_last: float,
             capacity: int, parts: int = SPAN_PARTS) -> list[float]:
    """Time-weighted mean unallocated GPUs in each of ``parts`` equal parts of the span
    ``[t_first, t_last]``. ``steps``: ``(time, allocated milli-GPU from then on)``, by time,
    the first at ``t_first``; ``capacity`` in milli-GPU. An empty span gives ``parts`` copies
    of the last state."""
    span = t_last - t_first
    if span <= 0 or not steps:
        last = steps[-1][1] if steps else 0
        return [(capacity - last) / GPU_MILLI] * parts
    width = span / parts
    ends = [t for t, _ in steps[1:]] + [t_last]
    out = []
    for k in range(parts):
        lo = t_first + k * width
        hi = t_last if k == parts - 1 else lo + width
        idle = sum((capacity - alloc) * (min(t1, hi) - max(t0, lo))
                   for (t0, alloc), t1 in zip(steps, ends, strict=True) if t0 < hi and t1 > lo)
        out.append(idle / (hi - lo) / GPU_MILLI)
    return out


def user_of(pod_name: str, users: int) -> str:
    """The simulated user of an anonymous trace pod: ``u<k>`` with ``k = crc32(name) % users``
    (:func:`zlib.crc32`, deterministic across runs and machines, unlike ``hash()``)."""
    return f"u{zlib.crc32(pod_name.encode()) % users}"


def _arrive(run: _Run, queue: WaitQueue, admission: dict[Bundle, str | None],
            waiting: dict[str, int], pod: Pod, i: int, users: int) -> None:
    """Pod ``i`` of a queue replay arrives: counted, then refused (its reason counted in
    ``run.reasons``) or added to ``queue`` (``waiting``: queue entry id -> pod index).

    The simulated cluster has no quotas and its capacity never changes (an elastic node that
    is off counts as capacity too), so admission depends on the bundle alone and is memoised
    in ``admission`` (bundle -> refusal reason, None: admissible); ``check_admissible`` plans
    on every node."""
    bundle = run.bundle_of(pod)
    owner = Owner(user_of(pod.name, users), str(i))
    run.arrived += 1
    run.requested_milli += bundle.total_gpu_milli
    if bundle not in admission:
        try:
            queue.check_admissible(bundle, owner)
            admission[bundle] = None
        except PlacementError as e:
            admission[bundle] = getattr(e, "reason", "quota")
    reason = admission[bundle]
    if reason is not None:
        run.rejected += 1
        run.reasons[reason] = run.reasons.get(reason, 0) + 1
    else:
        waiting[queue.add(owner, bundle).id] = i


def _wait_metrics(waits: Sequence[float]) -> dict[str, Any]:
    """Mean, nearest-rank p95 and max of the started pods' waits (seconds; zeros included)."""
    ordered = sorted(waits)
    rank = max(1, math.ceil(0.95 * len(ordered))) if ordered else 0
    return {
        "pods_waited": sum(1 for w in ordered if w > 0),
        "wait_mean_s": (sum(ordered) / len(ordered)) if ordered else None,
        "wait_p95_s": ordered[rank - 1] if ordered else None,
        "wait_max_s": ordered[-1] if ordered else None,
    }


def simulate_replay_queue(nodes: Sequence[Node], pods: Sequence[Pod],
                          policy: str = DEFAULT_POLICY, *,
                          numa_policy: str = "strict", seed: int = 0,
                          max_pods: int | None = None, time_limit_s: float | None = None,
                          explain: bool = False, users: int = 50,
                          max_bypass: int = 3) -> dict[str, Any]:
    """Replay mode with the hub's wait queue (:class:`~gpuspawner.placement.queue.WaitQueue`):
    a pod that fits the cluster's capacity but not what is free now waits instead of being
    dropped.

    Rules (stated here once; ``docs/placement.md``, "Queue replay"):

    * The queue's clock is the trace's time. Each arriving pod is checked with
      :meth:`WaitQueue.check_admissible`: what no node could ever hold is refused, as in the
      hub (``pods_rejected``); everything else joins the queue, and ``schedule()`` runs at
      once, so a pod that may start now starts at its ``creation_time``.
    * ``schedule()`` runs after every event: each arrival and each release.
    * A pod keeps its requested duration: one that started after waiting ``w`` seconds runs
      ``deletion_time - creation_time`` seconds from its start, i.e. its release is shifted
      by ``w`` (a pod that did not wait is released at exactly ``deletion_time``). A pod
      with no ``deletion_time`` never leaves; one whose deletion is not after its creation
      leaves right after it starts.
    * Events at equal times: releases first, then arrivals in trace order. The run goes on
      past the trace's last event until the queue is empty (or ``time_limit_s``).
    * The trace's pods are anonymous: pod ``i`` is server ``str(i)`` of user
      :func:`user_of` (``users`` users), so that the queue's dominant-resource fairness has
      users to be fair between; every user has weight 1, no quotas.

    Metrics: those of :func:`simulate_replay` (``pods_placed`` = started pods; the
    ``decision_*us_*`` figures time whole ``schedule()`` calls, arrivals' and releases') plus
    ``pods_waited`` (started after a wait > 0), ``pods_still_waiting`` (queued when the run
    stopped: 0 unless ``time_limit_s``), ``wait_mean_s``, ``wait_p95_s`` (nearest rank),
    ``wait_max_s`` over the started pods (zeros included), ``gpu_hours`` (GPU time served,
    the integral of allocated GPUs) and ``span_s`` (first to last event, over which
    ``gpu_allocation_ratio`` and ``unallocated_gpus`` are time-weighted means), and the idle
    GPUs over time: ``waiting_s`` (seconds during which at least one pod waited),
    ``unallocated_gpus_waiting`` (time-weighted mean of unallocated GPUs over those seconds:
    GPUs idle while a request waits, what fragmentation costs; None when nobody waited) and
    ``unallocated_gpus_by_tenth`` (time-weighted mean unallocated GPUs in each tenth of the
    span, :data:`SPAN_PARTS`).

    Args:
        users: how many simulated users the pods are spread over (>= 1).
        max_bypass: the queue's backfill bound (:class:`WaitQueue`).
        max_pods, time_limit_s, explain: as for :func:`simulate_replay` (``explain`` only
            changes the admission refusals' reason keys here).

    Raises:
        ValueError: a pod has no ``creation_time``, ``users < 1`` or ``max_bypass < 0``.
    """
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    order = _replay_order(pods, max_pods)
    start = time.perf_counter()
    run = _Run(nodes, policy, numa_policy, seed, explain)
    clock = [0.0]
    queue = WaitQueue(run.ledger, max_bypass=max_bypass, clock=lambda: clock[0])
    # (time, kind, tie, index): kind 0 = release, 1 = arrival; ties by trace order, then by
    # the order releases were booked
    events: list[tuple[float, int, int, int]] = [
        (float(pods[i].creation_time), 1, n, i)  # type: ignore[arg-type]
        for n, i in enumerate(order)]
    heapq.heapify(events)
    tie = itertools.count(len(order))
    deadline = None if time_limit_s is None else start + time_limit_s
    live: dict[int, Allocation] = {}
    waiting: dict[str, int] = {}  # queue entry id -> pod index
    waits: list[float] = []
    admission: dict[Bundle, str | None] = {}  # bundle -> refusal reason, None = may wait
    area = 0.0  # integral of allocated milli-GPU over time
    capacity = run.ledger.gpu_milli_capacity()
    idle_waiting = 0.0  # integral of unallocated milli-GPU while a pod waits
    waiting_s = 0.0
    t_first = events[0][0] if events else 0.0
    t_last = t_first
    steps: list[tuple[float, int]] = [(t_first, 0)]  # (time, allocated milli-GPU from then)
    stop = "end"
    while events:
        if deadline is not None and time.perf_counter() >= deadline:
            stop = "time_limit"
            break
        t, kind, _, i = heapq.heappop(events)
        area += run.allocated_milli * (t - t_last)
        if len(queue):
            idle_waiting += (capacity - run.allocated_milli) * (t - t_last)
            waiting_s += t - t_last
        t_last = clock[0] = t
        if kind == 0:
            run.release(live.pop(i))
        else:
            _arrive(run, queue, admission, waiting, pods[i], i, users)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        outcomes = queue.schedule()
        run.latencies_ns.append(time.perf_counter_ns() - t0)
        run.cpu_ns.append(time.thread_time_ns() - c0)
        for out in outcomes:
            j = waiting.pop(out.entry.id)
            p = pods[j]
            if out.allocation is None:  # e.g. a quota: not in the simulator, but counted
                run.rejected += 1
                key = getattr(out.error, "reason", "error")
                run.reasons[key] = run.reasons.get(key, 0) + 1
                continue
            run.book(p, out.entry.bundle, out.allocation)
            live[j] = out.allocation
            created = float(p.creation_time)  # type: ignore[arg-type]
            waits.append(t - created)
            if p.deletion_time is None:
                continue
            if t == created:
                end = max(p.deletion_time, t)
            else:
                end = t + max(0.0, p.deletion_time - created)
            heapq.heappush(events, (end, 0, next(tie), j))
        if run.allocated_milli != steps[-1][1]:
            steps.append((t, run.allocated_milli))
    m = _replay_metrics(run, policy, seed, area, t_first, t_last, start, stop)
    m.update(queue=True, queue_users=users, max_bypass=max_bypass,
             pods_still_waiting=len(queue), waiting_s=waiting_s,
             unallocated_gpus_waiting=(idle_waiting / waiting_s / GPU_MILLI
                                       if waiting_s > 0 else None),
             unallocated_gpus_by_tenth=_by_part(steps, t_first, t_last, capacity),
             **_wait_metrics(waits))
    return m


def compare_queue(nodes: Sequence[Node], pods: Sequence[Pod], policy: str = DEFAULT_POLICY, *,
                  numa_policy: str = "strict", seed: int = 0, max_pods: int | None = None,
                  time_limit_s: float | None = None, explain: bool = False, users: int = 50,
                  max_bypass: int = 3) -> list[dict[str, Any]]:
    """The same trace replayed without the queue (:func:`simulate_replay`; a refused pod is
    dropped) and with it (:func:`simulate_replay_queue`): two metrics dicts, in that order,
    both with the keys of :data:`QUEUE_KEYS` (without the queue nobody waits: waits are 0).

    Raises:
        ValueError: as the two functions.
    """
    plain = simulate_replay(nodes, pods, policy, numa_policy=numa_policy, seed=seed,
                            max_pods=max_pods, time_limit_s=time_limit_s, explain=explain)
    placed = plain["pods_placed"]
    plain.update(queue=False, queue_users=None, max_bypass=None, pods_still_waiting=0,
                 waiting_s=0.0, unallocated_gpus_waiting=None, unallocated_gpus_by_tenth=None,
                 **_wait_metrics([0.0] * placed))
    queued = simulate_replay_queue(nodes, pods, policy, numa_policy=numa_policy, seed=seed,
                                   max_pods=max_pods, time_limit_s=time_limit_s,
                                   explain=explain, users=users, max_bypass=max_bypass)
    return [plain, queued]
