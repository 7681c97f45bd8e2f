"""Topology files: one YAML file describes one node completely (NUMA nodes, GPUs, links).

They stand in for :func:`gpuspawner.inventory.local.read_local_node` where the hub cannot
look at the hardware itself (remote nodes) and in tests. The schema is documented in
``docs/topology-files.md``; in short::

    name: node-1
    labels: {rack: r1}
    disk: 500G
    numa_nodes:
      - {id: 0, cpus: "0-15", memory: 256G}
    gpus:
      - {uuid: GPU-..., index: 0, model: A100, memory: 80G, pci_bus_id: "00000000:3B:00.0",
         numa_node: 0, shareable: false}
      - uuid: GPU-...                     # a MIG-enabled GPU: only its instances are allocated
        mig:
          - {uuid: MIG-..., profile: 3g.40gb, memory: 40G}
          - {uuid: MIG-..., profile: 1g.10gb, memory: 10G, slices: 1}
    links:
      - [GPU-a, GPU-b, nvlink]

Sizes are parsed by :func:`gpuspawner.placement.units.parse_bytes` (``G`` = 1024**3, as in
JupyterHub), CPU lists by :func:`gpuspawner.placement.model.parse_cpu_list` (the kernel's cpulist
syntax, ``Documentation/ABI/stable/sysfs-devices-node``), link names by
:meth:`gpuspawner.placement.model.GPULink.parse`.

Every problem is reported as a :class:`TopologyError` naming the file and the dotted field path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NoReturn

import yaml

from ..placement.model import (
    GPU,
    MIG_SLICES,
    GPULink,
    MigInstance,
    Node,
    NumaNode,
    format_cpu_list,
    mig_slices,
    parse_cpu_list,
)
from ..placement.units import parse_bytes

__all__ = [
    "TopologyError",
    "default_link",
    "dump_topology",
    "load_topology_file",
    "node_from_dict",
    "node_to_dict",
]

_NODE_KEYS = {"name", "labels", "disk", "numa_nodes", "gpus", "links"}
_NUMA_KEYS = {"id", "cpus", "memory"}
_GPU_KEYS = {"uuid", "index", "model", "memory", "pci_bus_id", "numa_node", "shareable", "mig"}
_MIG_KEYS = {"uuid", "profile", "memory", "slices", "index", "files"}


class TopologyError(ValueError):
    """A topology file (or dict) that cannot describe a node.

    Attributes:
        source: the file path (or ``"<dict>"`` / whatever the caller passed as ``source``).
        field: dotted path of the offending field, e.g. ``"gpus[1].numa_node"``; ``""`` when the
            problem concerns the whole file (not found, YAML syntax).
        problem: what is wrong, in words.
        line: 1-based line of a YAML syntax error, else None.
    """

    def __init__(self, source: str, field: str, problem: str, line: int | None = None) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        self.line = line
        text = f"{source}: {field}: {problem}" if field else f"{source}: {problem}"
        super().__init__(text)


def default_link(a: GPU, b: GPU) -> GPULink:
    """The link level assumed for a pair of GPUs that a topology file does not list.

    ``NODE`` (same NUMA node, across host bridges) when both GPUs sit on the same known NUMA node,
    else ``SYSTEM`` (across sockets, NVML's most distant level). Conservative on purpose: a
    closer link (PCIe switch, NVLink) must be written down.
    """
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return GPULink.NODE
    return GPULink.SYSTEM


# --------------------------------------------------------------------------- loading


def load_topology_file(path: str | os.PathLike[str]) -> Node:
    """Read one node from a YAML topology file.

    Args:
        path: the file; its text is parsed with ``yaml.safe_load``.

    Returns:
        The node, with ``GPU.links`` filled for every ordered pair of distinct GPUs.

    Raises:
        TopologyError: file missing or unreadable, YAML syntax error (with the line), or any
            schema problem (see :func:`node_from_dict`); ``source`` is ``str(path)``.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise TopologyError(source, "", "file not found") from None
    except IsADirectoryError:
        raise TopologyError(source, "", "is a directory, not a topology file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(source, "", f"cannot read file: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        where = f" at line {line}, column {mark.column + 1}" if mark is not None else ""
        what = e.problem or e.context or "malformed YAML"
        raise TopologyError(source, "", f"YAML syntax error{where}: {what}", line=line) from None
    except yaml.YAMLError as e:
        raise TopologyError(source, "", f"YAML error: {e}") from None
    if data is None:
        raise TopologyError(source, "", "file is empty")
    return node_from_dict(data, source=source)


def node_from_dict(data: Any, source: str = "<dict>") -> Node:
    """Build a node from the parsed YAML structure (the schema of ``docs/topology-files.md``).

    Args:
        data: a mapping with ``name``, ``numa_nodes`` and optionally ``labels``, ``disk``,
            ``gpus``, ``links``.
        source: what :class:`TopologyError` names as the file.

    Returns:
        The node. ``GPU.links`` holds a level for every ordered pair of distinct GPUs: the
        ``links`` entry when listed, else :func:`default_link`.

    Raises:
        TopologyError: missing or unknown keys, wrong types, bad sizes or CPU lists, duplicate
            NUMA ids / CPU ids / GPU UUIDs / GPU indices, a GPU on an undeclared NUMA node,
            bad link names, links to unknown GPUs or contradicting each other.
    """
    p = _Parser(source)
    m = p.mapping(data, "", required={"name", "numa_nodes"}, allowed=_NODE_KEYS)

    name = m["name"]
    if not isinstance(name, str) or not name.strip():
        p.fail("name", f"must be a non-empty string, got {name!r}")

    labels = p.labels(m.get("labels"), "labels")
    disk = p.size(m["disk"], "disk") if "disk" in m else 0
    numa_nodes = p.numa_nodes(m["numa_nodes"])
    gpus = p.gpus(m.get("gpus"), numa_nodes)
    links = p.links(m.get("links"), gpus)

    full: list[GPU] = []
    for g in gpus:
        table = {}
        for o in gpus:
            if o.uuid != g.uuid:
                table[o.uuid] = links.get(frozenset((g.uuid, o.uuid)), default_link(g, o))
        full.append(_replace_links(g, table))
    return Node(name=name.strip(), numa_nodes=numa_nodes, gpus=tuple(full), disk_bytes=disk,
                labels=labels)


def _replace_links(g: GPU, links: Mapping[str, GPULink]) -> GPU:
    return GPU(uuid=g.uuid, index=g.index, model=g.model, memory_bytes=g.memory_bytes,
               mig=g.mig, mig_mode=g.mig_mode,
               pci_bus_id=g.pci_bus_id, numa_node=g.numa_node, links=dict(links),
               shareable=g.shareable)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Parser:
    """Validation helpers that raise :class:`TopologyError` for one source."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> NoReturn:
        raise TopologyError(self.source, field, problem)

    def mapping(self, data: Any, field: str, *, required: set[str],
                allowed: set[str]) -> dict[str, Any]:
        what = field or "top level"
        if not isinstance(data, dict):
            self.fail(field, f"{what} must be a mapping, got {type(data).__name__}")
        for key in data:
            if not isinstance(key, str) or key not in allowed:
                sub = f"{field}.{key}" if field else str(key)
                self.fail(sub, f"unknown key; allowed keys: {', '.join(sorted(allowed))}")
        for key in sorted(required):
            if key not in data:
                sub = f"{field}.{key}" if field else key
                self.fail(sub, "required key is missing")
        return data

    def size(self, value: Any, field: str) -> int:
        if value is None:
            self.fail(field, "size is missing (use e.g. 256G or a number of bytes)")
        try:
            return parse_bytes(value)
        except (ValueError, TypeError) as e:
            self.fail(field, str(e))

    def nonneg_int(self, value: Any, field: str) -> int:
        if not _is_int(value) or value < 0:
            self.fail(field, f"must be an integer >= 0, got {value!r}")
        return value

    def labels(self, value: Any, field: str) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(field, f"must be a mapping of strings, got {type(value).__name__}")
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                self.fail(f"{field}.{k}", "label keys must be strings")
            if isinstance(v, bool):
                out[k] = "true" if v else "false"
            elif isinstance(v, (str, int, float)):
                out[k] = str(v)
            else:
                self.fail(f"{field}.{k}", f"label values must be scalars, got {type(v).__name__}")
        return out

    def numa_nodes(self, value: Any) -> tuple[NumaNode, ...]:
        if not isinstance(value, list) or not value:
            self.fail("numa_nodes", "must be a non-empty list of NUMA nodes")
        out: list[NumaNode] = []
        seen_ids: dict[int, int] = {}
        cpu_owner: dict[int, int] = {}
        for i, item in enumerate(value):
            f = f"numa_nodes[{i}]"
            m = self.mapping(item, f, required=_NUMA_KEYS, allowed=_NUMA_KEYS)
            nid = self.nonneg_int(m["id"], f"{f}.id")
            if nid in seen_ids:
                self.fail(f"{f}.id", f"NUMA node {nid} is declared twice "
                          f"(also numa_nodes[{seen_ids[nid]}])")
            seen_ids[nid] = i
            cpus = self.cpus(m["cpus"], f"{f}.cpus")
            for c in cpus:
                if c in cpu_owner:
                    self.fail(f"{f}.cpus", f"CPU {c} is already in NUMA node {cpu_owner[c]}")
                cpu_owner[c] = nid
            mem = self.size(m["memory"], f"{f}.memory")
            out.append(NumaNode(id=nid, cpus=cpus, memory_bytes=mem))
        if not cpu_owner:
            self.fail("numa_nodes", "the node has no CPUs at all")
        return tuple(out)

    def cpus(self, value: Any, field: str) -> tuple[int, ...]:
        if isinstance(value, str):
            try:
                return parse_cpu_list(value)
            except ValueError:
                self.fail(field, f"not a CPU list: {value!r} (use e.g. \"0-15,32-47\")")
        if _is_int(value):
            value = [value]
        if isinstance(value, list):
            ids: list[int] = []
            for j, c in enumerate(value):
                if not _is_int(c) or c < 0:
                    self.fail(f"{field}[{j}]", f"CPU id must be an integer >= 0, got {c!r}")
                if c in ids:
                    self.fail(f"{field}[{j}]", f"CPU {c} is listed twice")
                ids.append(c)
            return tuple(sorted(ids))
        self.fail(field, f"must be a CPU list string like \"0-15\" or a list of integers, "
                  f"got {value!r}")

    def gpus(self, value: Any, numa_nodes: tuple[NumaNode, ...]) -> list[GPU]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail("gpus", f"must be a list of GPUs, got {type(value).__name__}")
        numa_ids = [n.id for n in numa_nodes]
        out: list[GPU] = []
        uuids: dict[str, int] = {}
        uuids_seen: dict[str, str] = {}
        indices: dict[int, int] = {}
        for i, item in enumerate(value):
            f = f"gpus[{i}]"
            m = self.mapping(item, f, required={"uuid"}, allowed=_GPU_KEYS)
            uuid = m["uuid"]
            if not isinstance(uuid, str) or not uuid.strip():
                self.fail(f"{f}.uuid", f"must be a non-empty string, got {uuid!r}")
            uuid = uuid.strip()
            if uuid in uuids:
                self.fail(f"{f}.uuid", f"duplicate GPU UUID {uuid} (also gpus[{uuids[uuid]}])")
            uuids[uuid] = i
            index = self.nonneg_int(m["index"], f"{f}.index") if "index" in m else i
            if index in indices:
                self.fail(f"{f}.index", f"duplicate GPU index {index} "
                          f"(also gpus[{indices[index]}])")
            indices[index] = i
            model = m.get("model", "")
            if model is None:
                model = ""
            if not isinstance(model, (str, int)) or isinstance(model, bool):
                self.fail(f"{f}.model", f"must be a string, got {model!r}")
            mem = self.size(m["memory"], f"{f}.memory") if "memory" in m else 0
            bus = m.get("pci_bus_id", "")
            if bus is None:
                bus = ""
            if not isinstance(bus, str):
                self.fail(f"{f}.pci_bus_id", f"must be a string like \"00000000:3B:00.0\", "
                          f"got {bus!r}")
            if "numa_node" in m:
                numa = m["numa_node"]
                if numa is not None:
                    numa = self.nonneg_int(numa, f"{f}.numa_node")
                    if numa not in numa_ids:
                        self.fail(f"{f}.numa_node", f"NUMA node {numa} is not declared "
                                  f"(declared: {', '.join(map(str, numa_ids))})")
            elif len(numa_ids) == 1:
                numa = numa_ids[0]
            else:
                self.fail(f"{f}.numa_node", "required when the node has more than one NUMA "
                          "node (write null if it is unknown)")
            shareable = m.get("shareable", False)
            if not isinstance(shareable, bool):
                self.fail(f"{f}.shareable", f"must be true or false, got {shareable!r}")
            mig: tuple[MigInstance, ...] = ()
            mig_mode = "mig" in m
            if mig_mode:
                if shareable:
                    self.fail(f"{f}.shareable", "a MIG-enabled GPU is never shared; its MIG "
                              "instances are the devices")
                mig = self.mig(m["mig"], f"{f}.mig", uuids_seen)
            out.append(GPU(uuid=uuid, index=index, model=str(model).strip(), memory_bytes=mem,
                           pci_bus_id=bus.strip(), numa_node=numa, shareable=shareable,
                           mig=mig, mig_mode=mig_mode))
        return out

    def mig(self, value: Any, field: str, seen: dict[str, str]) -> tuple[MigInstance, ...]:
        """A GPU's MIG layout: a list of ``{uuid, profile, memory, slices, index, files}``."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(field, f"must be a list of MIG instances, got {type(value).__name__}")
        out: list[MigInstance] = []
        total = 0
        for i, item in enumerate(value):
            f = f"{field}[{i}]"
            m = self.mapping(item, f, required={"uuid", "profile"}, allowed=_MIG_KEYS)
            uuid = m["uuid"]
            if not isinstance(uuid, str) or not uuid.strip().startswith("MIG-"):
                self.fail(f"{f}.uuid", f"must be the instance's UUID as NVML reports it "
                          f"(MIG-...), got {uuid!r}")
            uuid = uuid.strip()
            if uuid in seen:
                self.fail(f"{f}.uuid", f"duplicate MIG UUID {uuid} (also {seen[uuid]})")
            seen[uuid] = f
            profile = m["profile"]
            try:
                slices = mig_slices(str(profile))
            except ValueError as e:
                self.fail(f"{f}.profile", str(e))
            if "slices" in m:
                slices = self.nonneg_int(m["slices"], f"{f}.slices")
                if not 1 <= slices <= MIG_SLICES + 1:
                    self.fail(f"{f}.slices", f"must be 1..{MIG_SLICES + 1}, got {slices}")
            total += slices
            mem = self.size(m["memory"], f"{f}.memory") if "memory" in m else 0
            index = self.nonneg_int(m["index"], f"{f}.index") if "index" in m else i
            files = m.get("files") or []
            if not isinstance(files, list) or not all(
                    isinstance(p, str) and p.startswith("/") and not any(c.isspace() for c in p)
                    for p in files):
                self.fail(f"{f}.files", f"must be a list of absolute device file paths, "
                          f"got {files!r}")
            out.append(MigInstance(uuid, str(profile), mem, slices, index=index,
                                   files=tuple(files)))
        if total > MIG_SLICES + 1:
            self.fail(field, f"the instances hold {total} compute slices; a GPU has at most "
                      f"{MIG_SLICES} (8 on some products)")
        return tuple(out)

    def links(self, value: Any, gpus: list[GPU]) -> dict[frozenset[str], GPULink]:
        if value is None:
            return {}
        if not isinstance(value, list):
            self.fail("links", f"must be a list of [gpu, gpu, link] entries, "
                      f"got {type(value).__name__}")
        by_uuid = {g.uuid: g for g in gpus}
        by_index = {g.index: g for g in gpus}
        out: dict[frozenset[str], GPULink] = {}
        where: dict[frozenset[str], int] = {}
        for i, item in enumerate(value):
            f = f"links[{i}]"
            if not isinstance(item, list) or len(item) != 3:
                self.fail(f, f"must be a list [gpu, gpu, link], got {item!r}")
            ends: list[str] = []
            for j in (0, 1):
                ref = item[j]
                if _is_int(ref):
                    if ref not in by_index:
                        self.fail(f"{f}[{j}]", f"no GPU has index {ref}")
                    ends.append(by_index[ref].uuid)
                elif isinstance(ref, str):
                    if ref.strip() not in by_uuid:
                        self.fail(f"{f}[{j}]", f"no GPU has UUID {ref}")
                    ends.append(ref.strip())
                else:
                    self.fail(f"{f}[{j}]", f"must be a GPU UUID or index, got {ref!r}")
            if ends[0] == ends[1]:
                self.fail(f, "a link must join two different GPUs")
            raw = item[2]
            if isinstance(raw, bool) or not isinstance(raw, (str, int)):
                self.fail(f"{f}[2]", f"must be a link name, got {raw!r}")
            try:
                level = GPULink.parse(raw)
            except ValueError as e:
                self.fail(f"{f}[2]", str(e))
            pair = frozenset(ends)
            if pair in out and out[pair] != level:
                self.fail(f, f"contradicts links[{where[pair]}] "
                          f"({out[pair].name.lower()} vs {level.name.lower()})")
            out[pair] = level
            where.setdefault(pair, i)
        return out


# --------------------------------------------------------------------------- dumping

_SIZE_UNITS = (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024))


def _size_text(n: int) -> str | int:
    """``n`` bytes as the shortest exact size string (``"256G"``) or the plain integer."""
    for suffix, unit in _SIZE_UNITS:
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return n


def node_to_dict(node: Node) -> dict[str, Any]:
    """The node as the topology file's structure (the inverse of :func:`node_from_dict`).

    Sizes are written as exact size strings (``"80G"``) or byte counts, CPU lists in the
    kernel's cpulist syntax, GPU numa_node as an int or None. ``links`` lists, by UUID, every
    pair of GPUs whose level (``GPU.link_to`` as seen from the GPU listed first) differs from
    :func:`default_link`, so loading the result gives the same ``link_to`` for every pair.
    """
    data: dict[str, Any] = {"name": node.name}
    if node.labels:
        data["labels"] = {str(k): str(v) for k, v in node.labels.items()}
    data["disk"] = _size_text(node.disk_bytes)
    data["numa_nodes"] = [
        {"id": n.id, "cpus": format_cpu_list(n.cpus), "memory": _size_text(n.memory_bytes)}
        for n in node.numa_nodes
    ]
    if node.gpus:
        data["gpus"] = [
            {"uuid": g.uuid, "index": g.index, "model": g.model,
             "memory": _size_text(g.memory_bytes), "pci_bus_id": g.pci_bus_id,
             "numa_node": g.numa_node, "shareable": g.shareable}
            for g in node.gpus
        ]
        for entry, g in zip(data["gpus"], node.gpus, strict=True):
            if g.mig_enabled:
                entry["mig"] = [
                    {"uuid": m.uuid, "profile": m.profile, "memory": _size_text(m.memory_bytes),
                     "slices": m.slices, "index": m.index,
                     **({"files": list(m.files)} if m.files else {})}
                    for m in g.mig
                ]
    links = []
    for i, a in enumerate(node.gpus):
        for b in node.gpus[i + 1:]:
            level = a.link_to(b.uuid)
            if level != default_link(a, b):
                links.append([a.uuid, b.uuid, level.name.lower()])
    if links:
        data["links"] = links
    return data


class _Dumper(yaml.SafeDumper):
    """Block style, except that each link entry is one flow-style line."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = len(data) == 3 and all(isinstance(x, (str, int)) for x in data) and \
        isinstance(data[2], str) and not isinstance(data[0], dict)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_topology(node: Node) -> str:
    """The node as topology-file YAML; :func:`load_topology_file` reads it back to an equal
    node with the same link levels for every GPU pair.

    Raises:
        nothing for nodes built by this package (all fields are plain data).
    """
    header = f"# topology of node {node.name} (gpuspawner topology file, see " \
             "docs/topology-files.md)\n"
    return header + yaml.dump(node_to_dict(node), Dumper=_Dumper, sort_keys=False,
                              default_flow_style=False, allow_unicode=True, width=100)
