"""Reading the Alibaba GPU trace: node and pod lists as placement nodes and bundles.

The input is the 2023 Alibaba GPU trace ("openb", ``cluster-trace-gpu-v2023`` in
github.com/alibaba/clusterdata) published with Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23. A node
list (``sn,cpu_milli,memory_mib,gpu,model``) becomes :class:`~gpuspawner.placement.model.Node`
objects, a pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,
creation_time,deletion_time,scheduled_time]``) becomes :class:`Pod` objects, and every pod is
offered to a :class:`~gpuspawner.placement.Ledger` as a :class:`Bundle`
(:mod:`gpuspawner.simulate.engine`). The paper method (:mod:`gpuspawner.simulate.paper_method`)
reads the same files: :func:`read_node_rows` gives it the node rows through the same reader,
:func:`trace_path` and :func:`trace_name` name its pod lists.

A malformed file raises :class:`TraceFormatError`, naming the file, the line and the column.

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
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuspawner.placement.model import GPU, GPU_MILLI, Bundle, GPULink, Node, NumaNode

NODE_COLUMNS: tuple[str, ...] = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS: tuple[str, ...] = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS: tuple[str, ...] = ("gpu_spec", "creation_time", "deletion_time")


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


def sample_nodes(nodes: Sequence[Node], count: int) -> list[Node]:
    """``count`` nodes spread evenly over the list (those at ``floor(k * len / count)`` for
    ``k = 0..count-1``), so a small cluster keeps the list's mix of models and sizes; all of
    them when ``count >= len(nodes)``. Used to make a trace contend (``--sample-nodes``).

    Raises:
        ValueError: ``count < 1``.
    """
    if count < 1:
        raise ValueError(f"the node sample must be >= 1 node, got {count}")
    if count >= len(nodes):
        return list(nodes)
    return [nodes[k * len(nodes) // count] for k in range(count)]


def replicate_nodes(nodes: Sequence[Node], count: int, numa_split: int = 2) -> list[Node]:
    """``count`` nodes: ``nodes`` repeated, copy ``k >= 1`` of node ``sn`` renamed
    ``sn-c<k>`` (GPU UUIDs follow the name) and rebuilt from its sizes with the NUMA rule of
    :func:`make_node`; copy 0 is ``nodes`` themselves. Builds the 10,000-node cluster of
    ``benchmarks/placement.py`` and of the decision-replay test."""
    out: list[Node] = []
    k = 0
    while len(out) < count and nodes:
        for node in nodes:
            if len(out) == count:
                break
            if k == 0:
                out.append(node)
                continue
            model = node.gpus[0].model if node.gpus else ""
            out.append(make_node(f"{node.name}-c{k}", node.cpu_count * 1000,
                                 node.memory_bytes // 2**20, len(node.gpus), model, numa_split))
        k += 1
    return out


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
# the paper method's node rows and pod list names


def read_node_rows(path: str | Path) -> list[tuple[str, int, int, int, str]]:
    """``(sn, cpu_milli, memory_mib, gpu, model)`` rows of a trace node list, validated by
    :func:`load_nodes`'s reader.

    Raises:
        TraceFormatError: malformed file.
    """
    rows = []
    for line, row in _read_rows(path, NODE_COLUMNS):
        rows.append((row["sn"], _int_field(path, line, row, "cpu_milli"),
                     _int_field(path, line, row, "memory_mib"),
                     _int_field(path, line, row, "gpu"), row["model"]))
    return rows


def trace_path(name: str, folder: Path) -> Path:
    """A pod list by short name (``default`` -> ``folder/openb_pod_list_default.csv``) or
    path."""
    p = Path(name)
    if p.suffix == ".csv":
        return p if p.is_absolute() or p.exists() else folder / p
    return folder / f"openb_pod_list_{name}.csv"


def trace_name(path: str | Path) -> str:
    """``.../openb_pod_list_default.csv`` -> ``default``; other files: their stem."""
    stem = Path(path).stem
    return stem[len("openb_pod_list_"):] if stem.startswith("openb_pod_list_") else stem

