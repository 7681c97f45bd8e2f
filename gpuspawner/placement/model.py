"""The placement module's data model: nodes, GPUs, NUMA nodes, bundles and allocations.

Units are in the field names: ``*_bytes`` are bytes, ``*_milli`` are thousandths of one GPU
(1000 milli-GPU = one whole GPU), ``cores`` are whole logical CPUs (cpuset entries), times are
seconds since the Unix epoch.

A GPU is identified by its UUID (``GPU-xxxxxxxx-...`` as NVML's ``nvmlDeviceGetUUID`` returns it),
never by its index: indices change with ``CUDA_VISIBLE_DEVICES``, driver reloads and hardware
changes, UUIDs do not.

Device kinds: a whole GPU (``Bundle.gpus``), a share of a shareable GPU (``Bundle.gpu_milli``)
and a MIG instance (``Bundle.mig``, :class:`MigInstance`). A MIG instance is named by the UUID
NVML gives its handle (``MIG-xxxxxxxx-...``, ``nvmlDeviceGetUUID`` on a handle from
``nvmlDeviceGetMigDeviceHandleByIndex``); a GPU with MIG mode on is never allocated whole or
shared, only its instances, one per requested unit. A MIG instance counts as
``slices / 7 * 1000`` milli-GPU (:func:`mig_milli`) wherever GPU amounts are summed (quotas,
metrics): ``1g.10gb`` = 143, ``3g.40gb`` = 429, ``7g.80gb`` = 1000.
"""

from __future__ import annotations

import json
import re
import time
import uuid as _uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any, Literal

from .units import GPU_MILLI, format_bytes

NumaPolicy = Literal["strict", "prefer", "none"]
NUMA_POLICIES: tuple[str, ...] = ("strict", "prefer", "none")



class GPULink(IntEnum):
    """How two GPUs of one node are connected; lower is closer.

    The PCIe levels are NVML's ``nvmlGpuTopologyLevel_t`` values as returned by
    ``nvmlDeviceGetTopologyCommonAncestor`` (NVML API reference, "Topology queries"):
    ``INTERNAL`` (0, same board), ``SINGLE`` (10, one PCIe switch, ``PIX`` in ``nvidia-smi topo``),
    ``MULTIPLE`` (20, several switches, ``PXB``), ``HOSTBRIDGE`` (30, ``PHB``), ``NODE`` (40, same
    NUMA node / socket across host bridges) and ``SYSTEM`` (50, across sockets, ``SYS``).
    NVML reports NVLink separately (``nvmlDeviceGetNvLinkRemotePciInfo_v2``); we give it the value
    5 so that an NVLink pair sorts before any PCIe path, as ``nvidia-smi topo -m`` ranks ``NV#``.
    """

    INTERNAL = 0
    NVLINK = 5
    SINGLE = 10
    MULTIPLE = 20
    HOSTBRIDGE = 30
    NODE = 40
    SYSTEM = 50

    @classmethod
    def parse(cls, value: str | int) -> GPULink:
        """Parse a link from its name (any case, ``nvidia-smi`` short names accepted) or value.

        Raises:
            ValueError: the value names no link.
        """
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        text = str(value).strip().upper()
        aliases = {"NV": "NVLINK", "PIX": "SINGLE", "PXB": "MULTIPLE", "PHB": "HOSTBRIDGE",
                   "SYS": "SYSTEM", "SOCKET": "NODE", "SAME_SOCKET": "NODE",
                   "PCIE_SWITCH": "SINGLE"}
        if text.startswith("NV") and text[2:].isdigit():
            text = "NVLINK"
        text = aliases.get(text, text)
        try:
            return cls[text]
        except KeyError:
            names = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown GPU link {value!r}; expected one of {names}") from None


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node of a host: its id (as in ``/sys/devices/system/node/nodeN``), the logical
    CPU ids it holds and its memory in bytes."""

    id: int
    cpus: tuple[int, ...]
    memory_bytes: int


#: compute slices of a whole MIG-capable GPU (A100, A30 has 4, H100, H200: NVIDIA's MIG user
#: guide, "Supported MIG Profiles": the ``7g.*`` profile is the whole GPU)
MIG_SLICES = 7

# NVIDIA's profile names: "<compute slices>g.<memory>gb" with an optional "+me" / "+gfx" suffix
# (media extensions), e.g. 1g.5gb, 1g.10gb, 1g.10gb+me, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb
_MIG_PROFILE_RE = re.compile(r"^([1-8])g\.(\d+)gb(\+[a-z]+)?$")


def mig_slices(profile: str) -> int:
    """Compute slices of a MIG profile name (``"3g.40gb"`` -> 3).

    Raises:
        ValueError: not a MIG profile name of the form ``<n>g.<m>gb``.
    """
    m = _MIG_PROFILE_RE.match(str(profile).strip().lower())
    if m is None:
        raise ValueError(f"{profile!r} is not a MIG profile name like 1g.10gb or 3g.40gb")
    return int(m.group(1))


def mig_milli(slices: int) -> int:
    """Milli-GPU a MIG instance of ``slices`` compute slices counts as: ``slices / 7 * 1000``,
    rounded (quotas and metrics; the device itself is booked by UUID, not by milli-GPU)."""
    return min(GPU_MILLI, round(slices * GPU_MILLI / MIG_SLICES))


@dataclass(frozen=True)
class MigInstance:
    """One MIG instance (a GPU instance with its compute instance) of a MIG-enabled GPU.

    Attributes:
        uuid: ``MIG-...`` as NVML's ``nvmlDeviceGetUUID`` returns it for the MIG device handle;
            the identity in allocations, docker ``device_ids`` and ``NVIDIA_VISIBLE_DEVICES``.
        profile: NVIDIA's profile name, e.g. ``"1g.10gb"`` (lower case).
        memory_bytes: the instance's framebuffer, bytes.
        slices: compute slices (of :data:`MIG_SLICES`); 0 = read from the profile name.
        gpu: UUID of the parent GPU (filled in by :class:`GPU`).
        index: NVML's MIG device index on the parent; informational only.
        files: the device files a job needs for this instance (the parent's ``/dev/nvidiaN``
            and its ``/dev/nvidia-caps/nvidia-capN`` files), for Slurm's gres.conf
            ``MultipleFiles=``; empty when unknown.
    """

    uuid: str
    profile: str
    memory_bytes: int = 0
    slices: int = 0
    gpu: str = ""
    index: int = 0
    files: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        profile = str(self.profile).strip().lower()
        object.__setattr__(self, "profile", profile)
        if not self.slices:
            object.__setattr__(self, "slices", mig_slices(profile))
        if not 1 <= self.slices <= 8:
            raise ValueError(f"MIG instance {self.uuid}: slices must be 1..8, got {self.slices}")

    @property
    def milli(self) -> int:
        """What the instance counts as in milli-GPU (:func:`mig_milli`)."""
        return mig_milli(self.slices)


@dataclass(frozen=True)
class GPU:
    """One physical GPU (or a MIG instance, which NVML also names by a UUID).

    Attributes:
        uuid: NVML UUID, the identity used everywhere (docker ``device_ids``, allocations).
        index: NVML index at inventory time; informational only.
        model: product name as the admin wants to match it in profiles ("A100", "T4", ...).
        memory_bytes: framebuffer size in bytes.
        pci_bus_id: e.g. ``"00000000:3B:00.0"``.
        numa_node: NUMA node id of the PCI device, None when unknown (treated as "any").
        links: link level to every other GPU of the node, keyed by the other GPU's UUID; a
            missing pair counts as ``GPULink.SYSTEM``.
        shareable: True if time-sliced sharing is allowed (capacity 1000 milli-GPU split among
            bundles asking for less than 1000); False for exclusive use only.
        mig: the GPU's MIG instances (empty when MIG is off).
        mig_mode: MIG mode is on (``nvmlDeviceGetMigMode`` current mode); implied by ``mig``.
            A GPU with MIG mode on is never allocated whole or shared, only its instances.
    """

    uuid: str
    index: int = 0
    model: str = ""
    memory_bytes: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = 0
    links: Mapping[str, GPULink] = field(default_factory=dict, hash=False, compare=False)
    shareable: bool = False
    mig: tuple[MigInstance, ...] = ()
    mig_mode: bool = False

    def __post_init__(self) -> None:
        if self.mig:
            object.__setattr__(self, "mig", tuple(
                m if m.gpu == self.uuid else replace(m, gpu=self.uuid) for m in self.mig))

    @property
    def mig_enabled(self) -> bool:
        """True when MIG mode is on: only the instances are allocatable."""
        return self.mig_mode or bool(self.mig)

    def link_to(self, other_uuid: str) -> GPULink:
        """Link level to another GPU of the same node (``SYSTEM`` when not recorded)."""
        if other_uuid == self.uuid:
            return GPULink.INTERNAL
        return self.links.get(other_uuid, GPULink.SYSTEM)


@dataclass(frozen=True)
class Node:
    """A host that can run single-user servers.

    Attributes:
        name: unique node name (the spawner's ``nodes[].name``).
        numa_nodes: the NUMA nodes, each with CPU ids and memory bytes.
        gpus: the GPUs (any order; identity is the UUID).
        disk_bytes: disk that containers on this node may use in total, bytes.
        labels: free-form key/value labels (site, rack, "burst": "true", ...).
    """

    name: str
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[GPU, ...] = ()
    disk_bytes: int = 0
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def cpu_count(self) -> int:
        """Number of logical CPUs."""
        return sum(len(n.cpus) for n in self.numa_nodes)

    @property
    def memory_bytes(self) -> int:
        """Total memory of all NUMA nodes, bytes."""
        return sum(n.memory_bytes for n in self.numa_nodes)

    def gpu(self, uuid: str) -> GPU:
        """The GPU with this UUID. Raises KeyError when the node has none."""
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(f"node {self.name} has no GPU {uuid}")


class InvalidBundle(ValueError):
    """A bundle whose fields contradict each other or are out of range; ``field`` names the
    offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Bundle:
    """A request for resources, granted all together or not at all.

    Attributes:
        cores: whole logical CPUs (they become the container's cpuset), >= 0.
        memory_bytes: memory limit in bytes, bound to the cpuset's NUMA nodes (``cpuset.mems``).
        gpus: number of whole, exclusive GPUs.
        gpu_milli: a share of one shareable GPU in milli-GPU (1..999); only when ``gpus == 0``.
        gpu_models: allowed GPU models (empty = any).
        disk_bytes: container disk in bytes.
        numa_policy: ``strict``: GPUs on the fewest NUMA nodes that can hold them and cores and
            memory on exactly those NUMA nodes, else refuse; ``prefer``: the same when any node
            allows it, else spill across NUMA nodes and say so; ``none``: ignore NUMA.
        mig: a MIG profile name (``"1g.10gb"``): ``mig_count`` MIG instances of that profile
            instead of GPUs; "" = none. ``gpu_models`` then filters the parent GPUs' models.
        mig_count: how many instances of ``mig`` (default 1); ignored without ``mig``.

    Raises:
        InvalidBundle: on construction, for negative sizes, ``gpus`` and ``gpu_milli`` both set,
            ``gpu_milli`` outside 1..999, ``mig`` with ``gpus`` or ``gpu_milli`` or not a MIG
            profile name, ``mig_count`` below 1, or an unknown ``numa_policy``.
    """

    cores: int = 1
    memory_bytes: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()
    disk_bytes: int = 0
    numa_policy: NumaPolicy = "strict"
    mig: str = ""
    mig_count: int = 1

    def __post_init__(self) -> None:
        for name in ("cores", "memory_bytes", "gpus", "gpu_milli", "disk_bytes", "mig_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidBundle(name, f"must be an integer, got {value!r}")
            if value < 0:
                raise InvalidBundle(name, f"must be >= 0, got {value}")
        if self.gpus and self.gpu_milli:
            raise InvalidBundle("gpu_milli", "set either gpus (whole GPUs) or gpu_milli "
                                "(a share of one GPU), not both")
        if self.gpu_milli >= GPU_MILLI:
            raise InvalidBundle("gpu_milli", f"a share must be 1..999 milli-GPU, got "
                                f"{self.gpu_milli}; ask for gpus={self.gpu_milli // GPU_MILLI} "
                                "whole GPUs instead")
        if self.mig:
            if not isinstance(self.mig, str):
                raise InvalidBundle("mig", f"must be a MIG profile name, got {self.mig!r}")
            try:
                mig_slices(self.mig)
            except ValueError as e:
                raise InvalidBundle("mig", str(e)) from None
            object.__setattr__(self, "mig", self.mig.strip().lower())
            if self.gpus or self.gpu_milli:
                raise InvalidBundle("mig", "set either mig (MIG instances) or gpus/gpu_milli, "
                                    "not both")
            if self.mig_count < 1:
                raise InvalidBundle("mig_count", f"must be >= 1, got {self.mig_count}")
        if self.numa_policy not in NUMA_POLICIES:
            raise InvalidBundle("numa_policy", f"must be one of {', '.join(NUMA_POLICIES)}, "
                                f"got {self.numa_policy!r}")
        if isinstance(self.gpu_models, str):
            object.__setattr__(self, "gpu_models", (self.gpu_models,) if self.gpu_models else ())
        else:
            object.__setattr__(self, "gpu_models", tuple(self.gpu_models))

    @property
    def mig_units(self) -> int:
        """MIG instances asked for (0 without ``mig``)."""
        return self.mig_count if self.mig else 0

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU: ``gpus * 1000``, the share, or the MIG instances at
        :func:`mig_milli` each."""
        if self.mig:
            return self.mig_count * mig_milli(mig_slices(self.mig))
        return self.gpus * GPU_MILLI + self.gpu_milli

    def describe(self) -> str:
        """Short human text, e.g. ``"2 x A100, 8 cores, 64.0 GiB, 50.0 GiB disk"``."""
        parts = []
        models = "|".join(self.gpu_models) if self.gpu_models else "GPU"
        if self.gpus:
            parts.append(f"{self.gpus} x {models}")
        elif self.gpu_milli:
            parts.append(f"{self.gpu_milli / GPU_MILLI:.3g} of a {models}")
        elif self.mig:
            on = f" on {models}" if self.gpu_models else ""
            parts.append(f"{self.mig_count} x MIG {self.mig}{on}")
        parts.append(f"{self.cores} cores")
        parts.append(format_bytes(self.memory_bytes))
        if self.disk_bytes:
            parts.append(f"{format_bytes(self.disk_bytes)} disk")
        return ", ".join(parts)


@dataclass(frozen=True)
class Owner:
    """Who holds an allocation: the JupyterHub user, the server name ("" = default server) and
    the user's groups at reservation time (quotas are checked per group)."""

    user: str
    server: str = ""
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))


@dataclass(frozen=True)
class GPUShare:
    """One GPU of an allocation: its UUID and the milli-GPU held (1000 = exclusive)."""

    uuid: str
    milli: int = GPU_MILLI


@dataclass(frozen=True)
class MigShare:
    """One MIG instance of an allocation: its ``MIG-`` UUID, the parent GPU's UUID, the
    profile name and compute slices (the allocation holds the whole instance)."""

    uuid: str
    gpu: str
    profile: str
    slices: int

    @property
    def milli(self) -> int:
        """What the instance counts as in milli-GPU (:func:`mig_milli`)."""
        return mig_milli(self.slices)


@dataclass(frozen=True)
class Allocation:
    """What a reservation granted: exact devices on one node.

    Attributes:
        id: unique id (a UUID4 hex string).
        owner: user, server name, groups.
        node: node name.
        gpus: GPU UUIDs with the milli-GPU held on each.
        cpuset: exact logical CPU ids (docker ``cpuset_cpus``).
        mems: NUMA node ids (docker ``cpuset_mems``).
        memory_bytes: memory limit, bytes.
        memory_by_numa: how ``memory_bytes`` is booked against each NUMA node of ``mems``.
        disk_bytes: disk, bytes.
        created: seconds since the epoch.
        numa_aligned: True when GPUs, cores and memory sit on the same fewest NUMA nodes.
        note: why placement was not aligned (``prefer`` spill), else "".
        mig: MIG instances held (each whole); in JSON the key ``mig``, a list of
            ``{"uuid", "gpu", "profile", "slices"}``, written only when not empty.
    """

    id: str
    owner: Owner
    node: str
    gpus: tuple[GPUShare, ...]
    cpuset: tuple[int, ...]
    mems: tuple[int, ...]
    memory_bytes: int
    disk_bytes: int
    memory_by_numa: tuple[tuple[int, int], ...] = ()
    created: float = 0.0
    numa_aligned: bool = True
    note: str = ""
    mig: tuple[MigShare, ...] = ()

    @staticmethod
    def new_id() -> str:
        """A fresh allocation id."""
        return _uuid.uuid4().hex

    @property
    def gpu_uuids(self) -> list[str]:
        """The allocated GPU UUIDs, in allocation order."""
        return [g.uuid for g in self.gpus]

    @property
    def mig_uuids(self) -> list[str]:
        """The allocated MIG instances' ``MIG-`` UUIDs, in allocation order."""
        return [m.uuid for m in self.mig]

    @property
    def device_ids(self) -> list[str]:
        """Every device UUID to hand to the container: GPUs, then MIG instances (docker
        ``DeviceRequest.device_ids``, ``NVIDIA_VISIBLE_DEVICES``)."""
        return [g.uuid for g in self.gpus] + [m.uuid for m in self.mig]

    @property
    def total_gpu_milli(self) -> int:
        """Milli-GPU held in all (a MIG instance counts :func:`mig_milli` of its slices)."""
        return sum(g.milli for g in self.gpus) + sum(m.milli for m in self.mig)

    def cpuset_str(self) -> str:
        """The cpuset as docker's ``--cpuset-cpus`` list syntax, e.g. ``"0-3,8"``."""
        return format_cpu_list(self.cpuset)

    def mems_str(self) -> str:
        """The NUMA nodes as docker's ``--cpuset-mems`` syntax."""
        return format_cpu_list(self.mems)

    def summary(self) -> str:
        """One line for spawn progress, e.g. ``"node-1: GPU-5c3e..., cores 0-7, NUMA 0"``."""
        gpus = ", ".join(
            (g.uuid if g.milli == GPU_MILLI else f"{g.uuid} ({g.milli} milli)") for g in self.gpus
        )
        if self.mig:
            migs = ", ".join(f"{m.uuid} ({m.profile})" for m in self.mig)
            gpus = f"{gpus}, {migs}" if gpus else migs
        text = f"{self.node}: " + (gpus + ", " if gpus else "")
        text += f"cores {self.cpuset_str() or 'none'}, NUMA {self.mems_str() or 'none'}"
        if self.note:
            text += f" ({self.note})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the inverse of :meth:`from_dict`)."""
        out: dict[str, Any] = {
            "id": self.id,
            "owner": {"user": self.owner.user, "server": self.owner.server,
                      "groups": list(self.owner.groups)},
            "node": self.node,
            "gpus": [{"uuid": g.uuid, "milli": g.milli} for g in self.gpus],
            "cpuset": list(self.cpuset),
            "mems": list(self.mems),
            "memory_bytes": self.memory_bytes,
            "memory_by_numa": {str(k): v for k, v in self.memory_by_numa},
            "disk_bytes": self.disk_bytes,
            "created": self.created,
            "numa_aligned": self.numa_aligned,
            "note": self.note,
        }
        if self.mig:
            out["mig"] = [{"uuid": m.uuid, "gpu": m.gpu, "profile": m.profile,
                           "slices": m.slices} for m in self.mig]
        return out

    def to_json(self) -> str:
        """Compact JSON (stored as the container label ``gpuspawner.allocation``)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Allocation:
        """Rebuild an allocation from :meth:`to_dict` output.

        Raises:
            ValueError: a field is missing or has the wrong type (the message names it).
        """
        try:
            owner = data["owner"]
            mem = data["memory_bytes"]
            by_numa = data.get("memory_by_numa") or {}
            mems = tuple(int(m) for m in data["mems"])
            if not by_numa and mems:
                # spread evenly, remainder on the first node (older labels had no split)
                share, rest = divmod(int(mem), len(mems))
                by_numa = {m: share + (rest if i == 0 else 0) for i, m in enumerate(mems)}
            return cls(
                id=str(data["id"]),
                owner=Owner(str(owner["user"]), str(owner.get("server", "")),
                            tuple(owner.get("groups", ()))),
                node=str(data["node"]),
                gpus=tuple(GPUShare(str(g["uuid"]), int(g.get("milli", GPU_MILLI)))
                           for g in data.get("gpus", ())),
                cpuset=tuple(int(c) for c in data["cpuset"]),
                mems=mems,
                memory_bytes=int(mem),
                memory_by_numa=tuple(sorted((int(k), int(v)) for k, v in by_numa.items())),
                disk_bytes=int(data.get("disk_bytes", 0)),
                created=float(data.get("created", 0.0)),
                numa_aligned=bool(data.get("numa_aligned", True)),
                note=str(data.get("note", "")),
                mig=tuple(MigShare(str(m["uuid"]), str(m["gpu"]), str(m["profile"]),
                                   int(m.get("slices") or mig_slices(m["profile"])))
                          for m in data.get("mig") or ()),
            )
        except KeyError as e:
            raise ValueError(f"allocation is missing field {e.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"allocation has a malformed field: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> Allocation:
        """Parse :meth:`to_json` output. Raises ValueError on malformed input."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"allocation is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError("allocation JSON must be an object")
        return cls.from_dict(data)


def now() -> float:
    """Current time in seconds since the epoch (one place to patch in tests)."""
    return time.time()


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse the kernel's CPU list syntax (``"0-3,8,10-11"``, as in sysfs ``cpulist`` files and
    docker ``--cpuset-cpus``) into sorted ids.

    Raises:
        ValueError: malformed text.
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError(f"bad CPU range {part!r}")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def format_cpu_list(ids: Iterable[int]) -> str:
    """Format ids as the kernel's CPU list syntax, collapsing runs: ``[0,1,2,3,8] -> "0-3,8"``."""
    ids = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)
