"""Trace-driven placement simulator: replay the Alibaba GPU cluster trace through the ledger.

The input is the 2023 Alibaba GPU trace ("openb", ``cluster-trace-gpu-v2023`` in
github.com/alibaba/clusterdata) published with Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23. A node
list (``sn,cpu_milli,memory_mib,gpu,model``) becomes :class:`~gpuspawner.placement.model.Node`
objects, a pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,
creation_time,deletion_time,scheduled_time]``) becomes :class:`Pod` objects, and every pod is
offered to a :class:`~gpuspawner.placement.Ledger` as a :class:`Bundle`.

Rules the trace does not settle, stated once here:

* **NUMA layout** (the trace has none): a node with at least 2 GPUs gets ``numa_split`` NUMA
  nodes (default 2, like a dual-socket server); its GPUs, CPUs and memory are split evenly
  among them, any remainder going one unit each to the lowest NUMA ids. A node with fewer
  than 2 GPUs (CPU-only included) gets one NUMA node. CPU ids run ``0..cores-1`` in contiguous
  blocks per NUMA node (NUMA 0 holds the lowest ids), GPUs are numbered the same way.
* **Cores**: cpusets are whole CPUs, so a node's ``cpu_milli`` and a pod's ``cpu_milli`` are
  rounded up to whole cores (``ceil(cpu_milli / 1000)``).
* **Memory**: ``memory_mib * 2**20`` bytes. Disk is 0 everywhere (the trace has none).
* **GPUs**: UUID ``GPU-<node name>-<i>``; model = the node's ``model`` column; every GPU is
  shareable (the trace shares GPUs); GPU memory and PCI bus ids are unknown (0 and ``""``).
  GPUs on the same NUMA node are linked ``GPULink.NODE``, across NUMA nodes ``GPULink.SYSTEM``;
  the trace records no NVLink, so none is modelled.
* **GPU demand of a pod**: ``num_gpu > 1`` asks for that many whole GPUs; ``num_gpu == 1``
  with ``gpu_milli >= 1000`` one whole GPU; ``num_gpu == 1`` with ``gpu_milli < 1000`` a share
  of ``gpu_milli`` milli-GPU of one GPU; ``num_gpu == 0`` no GPU. ``gpu_spec`` (models
  separated by ``|``) becomes ``Bundle.gpu_models``.

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
  ``decisions_per_s``: calls / summed call time; ``setup_s``: ledger construction, seconds;
  ``wall_s``: the whole run, seconds; ``stop``: why arrivals ended (``capacity``, ``end``,
  ``max_pods``, ``time_limit``).

Run ``python -m gpuspawner.simulate --help`` (or ``gpuspawner simulate``) for the command line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuspawner.placement import POLICIES, Ledger, PlacementRefused
from gpuspawner.placement.model import (
    GPU,
    GPU_MILLI,
    NUMA_POLICIES,
    Allocation,
    Bundle,
    GPULink,
    Node,
    NumaNode,
    Owner,
)
from gpuspawner.placement.paper import PAPER_POLICIES

MODES: tuple[str, ...] = ("fill", "replay")

NODE_COLUMNS: tuple[str, ...] = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS: tuple[str, ...] = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS: tuple[str, ...] = ("gpu_spec", "creation_time", "deletion_time")

#: metric keys, in the order the text table prints them
METRIC_KEYS: tuple[str, ...] = (
    "policy", "mode", "numa_policy", "seed", "explain_refusals", "nodes", "gpus",
    "pods_total", "pods_placed", "pods_rejected", "rejected_reasons", "gpu_milli_requested",
    "gpu_allocation_ratio", "unallocated_gpus", "numa_aligned_fraction", "numa_aligned_eligible",
    "decision_us_p50", "decision_us_p99", "decisions_per_s", "setup_s", "wall_s", "stop",
)


class TraceFormatError(ValueError):
    """A malformed trace CSV; the message names the file, the line (1 = header) and the column.

    Attributes:
        path: the file.
        line: 1-based line number.
        column: column name, or None when the problem is not one column's.
    """

    def __init__(self, path: str | Path, line: int, column: str | None, message: str) -> None:
        where = f"{path}, line {line}" + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line
        self.column = column


# --------------------------------------------------------------------------------------------
# CSV reading


def _read_rows(path: str | Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line number, {column: stripped text})`` for each non-blank data row.

    Raises:
        TraceFormatError: empty file, missing header columns, or a row whose field count
            differs from the header's.
        OSError: the file cannot be read.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip().lstrip("\ufeff") for h in next(reader)]
        except StopIteration:
            raise TraceFormatError(path, 1, None, "empty file; expected a header row with "
                                   f"columns {','.join(required)}") from None
        except csv.Error as e:
            raise TraceFormatError(path, 1, None, f"unreadable CSV: {e}") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(path, 1, missing[0], "missing from the header; expected "
                                   f"columns {','.join(required)}, got {','.join(header)}")
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) < len(header):
                    raise TraceFormatError(path, line, header[len(row)],
                                           f"missing: the row has {len(row)} fields, the "
                                           f"header {len(header)}")
                if len(row) > len(header):
                    raise TraceFormatError(path, line, None,
                                           f"the row has {len(row)} fields, the header "
                                           f"only {len(header)}")
                yield line, {h: cell.strip() for h, cell in zip(header, row, strict=False)}
        except csv.Error as e:
            raise TraceFormatError(path, reader.line_num, None, f"unreadable CSV: {e}") from None


def _int_field(path: str | Path, line: int, row: dict[str, str], column: str) -> int:
    """A non-negative integer field, or TraceFormatError naming where."""
    text = row[column]
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(path, line, column,
                               f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise TraceFormatError(path, line, column, f"expected a whole number >= 0, got {value}")
    return value


def _time_field(path: str | Path, line: int, row: dict[str, str], column: str) -> float | None:
    """A time in seconds, None when the column is absent or empty."""
    text = row.get(column, "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(path, line, column,
                               f"expected a time in seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise TraceFormatError(path, line, column, f"expected a finite time, got {text!r}")
    return value


# --------------------------------------------------------------------------------------------
# nodes


def _split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal integers, remainder one each to the first."""
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def make_node(name: str, cpu_milli: int, memory_mib: int, gpu_count: int, model: str = "",
              numa_split: int = 2) -> Node:
    """One trace node as a :class:`Node`, following the NUMA rule of the module docstring.

    Args:
        name: node name (the ``sn`` column).
        cpu_milli: CPUs x 1000; rounded up to whole cores.
        memory_mib: memory in MiB (2**20 bytes).
        gpu_count: number of GPUs.
        model: the GPUs' model ("" for CPU-only nodes).
        numa_split: NUMA nodes given to a node with at least 2 GPUs (>= 1).

    Raises:
        ValueError: ``numa_split < 1`` or a negative size.
    """
    if numa_split < 1:
        raise ValueError(f"numa_split must be >= 1, got {numa_split}")
    if min(cpu_milli, memory_mib, gpu_count) < 0:
        raise ValueError(f"node {name}: sizes must be >= 0")
    cores = -(-cpu_milli // 1000)
    parts = numa_split if gpu_count >= 2 else 1
    cpu_counts = _split_evenly(cores, parts)
    mem_parts = _split_evenly(memory_mib * 2**20, parts)
    gpu_counts = _split_evenly(gpu_count, parts)
    numa_nodes: list[NumaNode] = []
    gpu_numa: list[int] = []
    first_cpu = 0
    for nid in range(parts):
        numa_nodes.append(NumaNode(nid, tuple(range(first_cpu, first_cpu + cpu_counts[nid])),
                                   mem_parts[nid]))
        first_cpu += cpu_counts[nid]
        gpu_numa.extend([nid] * gpu_counts[nid])
    uuids = [f"GPU-{name}-{i}" for i in range(gpu_count)]
    gpus = []
    for i, uid in enumerate(uuids):
        links = {other: (GPULink.NODE if gpu_numa[j] == gpu_numa[i] else GPULink.SYSTEM)
                 for j, other in enumerate(uuids) if j != i}
        gpus.append(GPU(uuid=uid, index=i, model=model, memory_bytes=0, pci_bus_id="",
                        numa_node=gpu_numa[i], links=links, shareable=True))
    return Node(name=name, numa_nodes=tuple(numa_nodes), gpus=tuple(gpus), disk_bytes=0)


def load_nodes(path: str | Path, numa_split: int = 2) -> list[Node]:
    """Read a trace node list (``sn,cpu_milli,memory_mib,gpu,model``) into nodes.

    See the module docstring for the NUMA rule: nodes with >= 2 GPUs get ``numa_split`` NUMA
    nodes with GPUs, cores and memory split evenly (remainder to the lowest ids), other nodes
    one NUMA node.

    Raises:
        TraceFormatError: a malformed row or header, or a duplicate node name (the message
            names the file, line and column).
        ValueError: ``numa_split < 1``.
        OSError: the file cannot be read.
    """
    if numa_split < 1:
        raise ValueError(f"numa_split must be >= 1, got {numa_split}")
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for line, row in _read_rows(path, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceFormatError(path, line, "sn", "empty node name")
        if name in seen:
            raise TraceFormatError(path, line, "sn",
                                   f"duplicate node {name!r} (first on line {seen[name]})")
        seen[name] = line
        cpu = _int_field(path, line, row, "cpu_milli")
        mem = _int_field(path, line, row, "memory_mib")
        gpu = _int_field(path, line, row, "gpu")
        nodes.append(make_node(name, cpu, mem, gpu, row["model"], numa_split))
    return nodes


# --------------------------------------------------------------------------------------------
# pods


@dataclass(frozen=True)
class Pod:
    """One task of the trace.

    Attributes:
        name: pod name.
        cpu_milli: CPUs x 1000.
        memory_mib: memory in MiB.
        num_gpu: number of GPUs (0-8 in the trace).
        gpu_milli: for ``num_gpu == 1``, the share of one GPU in milli-GPU (1..1000).
        gpu_spec: allowed GPU models (empty = any).
        creation_time: arrival, seconds from the trace's start; None when the file has none.
        deletion_time: departure, seconds; None when missing (the pod never leaves).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()
    creation_time: float | None = None
    deletion_time: float | None = None

    @property
    def cores(self) -> int:
        """Whole CPUs asked for: ``ceil(cpu_milli / 1000)`` (cpusets are whole CPUs)."""
        return -(-self.cpu_milli // 1000)

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs: ``num_gpu`` when > 1, 1 for ``num_gpu == 1, gpu_milli >= 1000``, else 0."""
        if self.num_gpu > 1 or (self.num_gpu == 1 and self.gpu_milli >= GPU_MILLI):
            return self.num_gpu
        return 0

    @property
    def share_milli(self) -> int:
        """The share of one GPU in milli-GPU (``num_gpu == 1, gpu_milli < 1000``), else 0."""
        return self.gpu_milli if self.num_gpu == 1 and self.gpu_milli < GPU_MILLI else 0

    @property
    def gpu_demand_milli(self) -> int:
        """GPU demand in milli-GPU: ``whole_gpus * 1000 + share_milli``."""
        return self.whole_gpus * GPU_MILLI + self.share_milli

    def bundle(self, numa_policy: str = "strict") -> Bundle:
        """The pod as a ledger :class:`Bundle` (rules in the module docstring)."""
        return Bundle(cores=self.cores, memory_bytes=self.memory_mib * 2**20,
                      gpus=self.whole_gpus, gpu_milli=self.share_milli,
                      gpu_models=self.gpu_spec, numa_policy=numa_policy)  # type: ignore[arg-type]


def load_pods(path: str | Path) -> list[Pod]:
    """Read a trace pod list. Required columns: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli``;
    ``gpu_spec``, ``creation_time`` and ``deletion_time`` are read when present (other columns
    are ignored).

    Raises:
        TraceFormatError: a malformed row or header (the message names file, line and column),
            including ``num_gpu == 1`` with ``gpu_milli`` 0 and ``num_gpu == 0`` with
            ``gpu_milli`` > 0, which the trace's definition excludes.
        OSError: the file cannot be read.
    """
    pods: list[Pod] = []
    for line, row in _read_rows(path, POD_COLUMNS):
        name = row["name"]
        if not name:
            raise TraceFormatError(path, line, "name", "empty pod name")
        cpu = _int_field(path, line, row, "cpu_milli")
        mem = _int_field(path, line, row, "memory_mib")
        num_gpu = _int_field(path, line, row, "num_gpu")
        gpu_milli = _int_field(path, line, row, "gpu_milli")
        if num_gpu == 1 and gpu_milli == 0:
            raise TraceFormatError(path, line, "gpu_milli",
                                   "num_gpu is 1 but gpu_milli is 0; expected 1..1000")
        if num_gpu == 0 and gpu_milli > 0:
            raise TraceFormatError(path, line, "gpu_milli",
                                   f"num_gpu is 0 but gpu_milli is {gpu_milli}; expected 0")
        spec = tuple(s.strip() for s in row.get("gpu_spec", "").split("|") if s.strip())
        pods.append(Pod(name=name, cpu_milli=cpu, memory_mib=mem, num_gpu=num_gpu,
                        gpu_milli=gpu_milli, gpu_spec=spec,
                        creation_time=_time_field(path, line, row, "creation_time"),
                        deletion_time=_time_field(path, line, row, "deletion_time")))
    return pods


# --------------------------------------------------------------------------------------------
# simulation


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
        t0 = time.perf_counter_ns()
        try:
            alloc = self.ledger.reserve(bundle, owner, explain=self.explain)
        except PlacementRefused as e:
            self.latencies_ns.append(time.perf_counter_ns() - t0)
            self.rejected += 1
            self.reasons[e.reason] = self.reasons.get(e.reason, 0) + 1
            return None
        self.latencies_ns.append(time.perf_counter_ns() - t0)
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


# --------------------------------------------------------------------------------------------
# output and command line


def _fmt(key: str, value: Any) -> str:
    """A metric value as table text."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        if key in ("gpu_allocation_ratio", "numa_aligned_fraction"):
            return f"{value:.4f}"
        if key in ("setup_s", "wall_s"):
            return f"{value:.2f}"
        if key == "decisions_per_s":
            return f"{value:,.0f}"
        return f"{value:.1f}"
    return str(value)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Metrics as an aligned text table: one row per metric, one column per run."""
    keys = [k for k in METRIC_KEYS if any(k in r for r in results)]
    keys += [k for r in results for k in r if k not in keys]
    rows = [[k] + [_fmt(k, r.get(k)) for r in results] for k in keys]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser`` (used by ``gpuspawner simulate``)."""
    parser.add_argument("--nodes", required=True, metavar="NODES.csv",
                        help="node list: sn,cpu_milli,memory_mib,gpu,model")
    parser.add_argument("--pods", default=None, metavar="PODS.csv",
                        help="pod list: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,"
                             "...,creation_time,deletion_time,...]")
    parser.add_argument("--policy", default="fgd",
                        choices=[*POLICIES, *(p for p in PAPER_POLICIES if p not in POLICIES),
                                 "all"],
                        help="placement policy, or 'all' for every policy side by side "
                             "(default: fgd)")
    parser.add_argument("--mode", default="fill", choices=MODES,
                        help="fill: draw pods until demand reaches GPU capacity (Weng et al., "
                             "ATC '23); replay: place and release at the trace's times "
                             "(default: fill)")
    parser.add_argument("--numa-split", type=_positive_int, default=2, metavar="N",
                        help="NUMA nodes per node with >= 2 GPUs (default: 2)")
    parser.add_argument("--numa-policy", default="strict", choices=NUMA_POLICIES,
                        help="the bundles' NUMA policy (default: strict)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for fill-mode sampling and the random policy (default: 0)")
    parser.add_argument("--max-pods", type=_positive_int, default=None, metavar="N",
                        help="stop after N arriving pods (fill) / replay the first N pods")
    parser.add_argument("--explain-refusals", action="store_true",
                        help="have the ledger explain each refusal (slower, O(nodes) per "
                             "refusal, as in the spawner) and count refusals by reason")
    parser.add_argument("--json", action="store_true",
                        help="print JSON (an object, or a list with --policy all)")
    paper = parser.add_argument_group(
        "paper method", "the FGD paper's experiment (Weng et al., ATC '23) on a milli-CPU "
        "cluster model: see gpuspawner.simulate_paper")
    paper.add_argument("--method", default="ledger", choices=("ledger", "paper"),
                       help="ledger: --mode fill/replay through the Ledger (whole cores, NUMA); "
                            "paper: tune the pod list to 130%% of GPU capacity, shuffle, place "
                            "once each, read the allocation at 100%% arrived (default: ledger)")
    paper.add_argument("--compare", action="store_true",
                       help="paper method: every policy on every trace of --traces for every "
                            "seed of --seeds, one summary table with the paper's means")
    paper.add_argument("--seeds", default=None, metavar="LIST",
                       help="paper method seeds, e.g. 42-51 or 42,43 (default: 42-51)")
    paper.add_argument("--traces", default=None, metavar="LIST",
                       help="--compare: pod lists, comma separated, by short name "
                            "(default -> openb_pod_list_default.csv beside --nodes) or path "
                            "(default: default,multigpu50,gpushare100)")
    paper.add_argument("--policies", default=None, metavar="LIST",
                       help="--compare: policies, comma separated (default: all paper-method "
                            "policies)")
    paper.add_argument("--cpu-rounding", default="none", choices=("none", "ceil"),
                       help="paper method: none keeps milli-CPU (the paper); ceil rounds pods "
                            "and nodes up to whole CPUs (what cpusets can give) (default: none)")
    paper.add_argument("--until", type=float, default=100.5, metavar="PERCENT",
                       help="paper method: stop once arrived GPU demand passes this percent of "
                            "capacity; 130 offers the whole tuned list (default: 100.5, later "
                            "pods cannot change the 100%% reading)")
    paper.add_argument("--exact-fgd", action="store_true",
                       help="paper method: fgd picks the smallest exact fragmentation growth "
                            "instead of the Go plugin's integer sigmoid score")
    paper.add_argument("--paper-numa", default="none", choices=("none", "strict"),
                       help="paper method: none (the paper: no NUMA) or strict (nodes with >= 2 "
                            "GPUs get --numa-split NUMA nodes; a whole-GPU pod that fits one "
                            "NUMA node must take its GPUs from one) (default: none)")
    paper.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                       help="--compare: processes to run in parallel (default: 1)")


def run(args: argparse.Namespace) -> int:
    """Run the simulation the parsed arguments describe and print the result.

    Returns:
        0 on success, 2 when an input file is missing or malformed (message on stderr).
    """
    if getattr(args, "method", "ledger") == "paper" or getattr(args, "compare", False):
        return _run_paper(args)
    if args.pods is None:
        print("error: --pods is required (or use --method paper --compare with --traces)",
              file=sys.stderr)
        return 2
    if args.policy not in POLICIES and args.policy != "all":
        print(f"error: policy {args.policy!r} exists only in --method paper", file=sys.stderr)
        return 2
    try:
        nodes = load_nodes(args.nodes, numa_split=args.numa_split)
        pods = load_pods(args.pods)
        policies = list(POLICIES) if args.policy == "all" else [args.policy]
        results = [simulate(nodes, pods, policy, args.mode, numa_policy=args.numa_policy,
                            seed=args.seed, max_pods=args.max_pods,
                            explain=args.explain_refusals) for policy in policies]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        payload: Any = results if args.policy == "all" else results[0]
        print(json.dumps(payload, indent=2))
    else:
        print(format_table(results))
    return 0


def _run_paper(args: argparse.Namespace) -> int:
    """``--method paper`` and ``--compare`` (see :mod:`gpuspawner.simulate_paper`)."""
    from gpuspawner import simulate_paper as sp

    numa = args.paper_numa
    try:
        seeds = sp.parse_seeds(args.seeds) if args.seeds else list(sp.DEFAULT_SEEDS)
        rows = sp.read_node_rows(args.nodes)
        folder = Path(args.nodes).parent
        if args.compare:
            names = ([t.strip() for t in args.traces.split(",") if t.strip()] if args.traces
                     else list(sp.DEFAULT_TRACES))
            paths = [sp.trace_path(n, folder) for n in names]
        else:
            if args.pods is None:
                raise ValueError("--pods is required without --compare")
            paths = [Path(args.pods)]
        if args.policies:
            policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        elif args.compare or args.policy == "all":
            policies = list(PAPER_POLICIES)
        else:
            policies = [args.policy]
        unknown = [p for p in policies if p not in PAPER_POLICIES]
        if unknown:
            raise ValueError(f"unknown paper-method policy {unknown[0]!r}; choose from "
                             f"{', '.join(PAPER_POLICIES)}")
        traces = {sp.trace_name(p): sp.tasks_of(load_pods(p), args.cpu_rounding)
                  for p in paths}
        t0 = time.perf_counter()
        results = sp.compare(rows, traces, policies, seeds, jobs=args.jobs,
                             cpu_rounding=args.cpu_rounding, until=args.until,
                             exact_fgd=args.exact_fgd, numa=numa,
                             numa_split=args.numa_split)
        wall = time.perf_counter() - t0
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    comparable = (Path(args.nodes).name == "openb_node_list_gpu_node.csv" and numa == "none"
                  and args.cpu_rounding == "none")
    summary = sp.summarize(results, paper=comparable)
    if args.json:
        print(json.dumps({"runs": results, "summary": summary, "wall_s": wall}, indent=2))
    else:
        print(f"# paper method: nodes {args.nodes}, seeds {','.join(map(str, seeds))}, "
              f"cpu_rounding {args.cpu_rounding}, numa {numa}, exact_fgd {args.exact_fgd}, "
              f"until {args.until:g}%, wall {wall:.1f} s")
        print(sp.format_compare(summary))
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    """Entry point of ``python -m gpuspawner.simulate``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner.simulate",
        description="Replay the Alibaba GPU trace (Weng et al., ATC '23) through the ledger "
                    "and report GPU allocation, refusals, NUMA alignment and decision latency.")
    add_arguments(parser)
    return run(parser.parse_args(None if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
