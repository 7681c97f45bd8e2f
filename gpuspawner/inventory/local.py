"""Inventory of the local host: NUMA nodes from sysfs, disk from ``statvfs``, GPUs from NVML.

Sources and the rules taken from them:

* NUMA nodes: ``/sys/devices/system/node/nodeN/cpulist`` and ``.../nodeN/meminfo`` (kernel
  ``Documentation/ABI/stable/sysfs-devices-node``; meminfo lines read ``Node 0 MemTotal:
  263842032 kB`` where kB means KiB). CPUs are intersected with
  ``/sys/devices/system/cpu/online`` (``Documentation/ABI/testing/sysfs-devices-system-cpu``).
  NUMA nodes without CPUs (memory-only nodes: CXL memory, the GPU memory that Grace Hopper
  exposes as NUMA nodes) are left out: containers get memory bound to their cpuset's nodes, and
  that memory is not host RAM to hand out. A kernel without NUMA support (no ``node`` dir or no
  ``nodeN`` in it) gives one NUMA node 0 holding all online CPUs and ``MemTotal`` of
  ``/proc/meminfo`` (``proc(5)``).
* disk: ``shutil.disk_usage(path).total`` of Docker's default data root ``/var/lib/docker`` when
  it exists, else ``/``. This module never talks to Docker; pass ``disk_path`` for another root.
* GPUs: NVML through ``nvidia-ml-py`` (module ``pynvml``), functions as named in the NVML API
  reference (https://docs.nvidia.com/deploy/nvml-api/): ``nvmlDeviceGetCount``,
  ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetName``,
  ``nvmlDeviceGetMemoryInfo(h).total`` (bytes), ``nvmlDeviceGetPciInfo(h).busId``,
  ``nvmlDeviceGetNumaNodeId`` (NVML >= 12.x drivers; see below),
  ``nvmlDeviceGetTopologyCommonAncestor`` (pairwise PCIe level) and
  ``nvmlDeviceGetNvLinkState`` / ``nvmlDeviceGetNvLinkRemotePciInfo`` (the Python binding of the
  C ``nvmlDeviceGetNvLinkRemotePciInfo_v2``) over links ``0 .. NVML_NVLINK_MAX_LINKS - 1``.

GPU NUMA node rule: ``nvmlDeviceGetNumaNodeId`` when the binding has it and the driver answers;
otherwise the PCI device's ``numa_node`` file, ``/sys/bus/pci/devices/0000:3b:00.0/numa_node``
(``Documentation/ABI/testing/sysfs-bus-pci``). A value of ``-1`` means the firmware did not say
(typical of single-socket machines and some VMs): on a host with exactly one NUMA node the GPU is
put on that node; otherwise, and for an id that is not one of the host's NUMA nodes with CPUs,
the GPU gets ``numa_node=None`` ("unknown", placement treats it as any node) and a warning is
logged.

NVLink rule: a pair of GPUs is ``GPULink.NVLINK`` when an active link of one reports the other's
PCI bus id as its remote end (direct NVLink / NVLink bridge), or when both have active links to
a common remote end that is not a GPU (an NVSwitch, as in DGX/HGX systems). Other pairs take the
level of ``nvmlDeviceGetTopologyCommonAncestor``, whose ``nvmlGpuTopologyLevel_t`` values are
the values of :class:`~gpuspawner.placement.model.GPULink`.

MIG rule (NVML API reference, "Multi Instance GPU Management"): a GPU whose
``nvmlDeviceGetMigMode`` current mode is ``NVML_DEVICE_MIG_ENABLE`` is MIG-enabled; its MIG
devices are the handles ``nvmlDeviceGetMigDeviceHandleByIndex(h, i)`` for ``i`` below
``nvmlDeviceGetMaxMigDeviceCount(h)`` (an empty slot raises NotFound and is skipped). Each is a
:class:`~gpuspawner.placement.model.MigInstance`: ``nvmlDeviceGetUUID`` (``MIG-...``),
``nvmlDeviceGetMemoryInfo(m).total`` (bytes), ``nvmlDeviceGetAttributes(m)``
``.gpuInstanceSliceCount`` (compute slices) and the profile name: the ``<n>g.<m>gb`` part of
``nvmlDeviceGetName(m)`` (``"NVIDIA A100-SXM4-80GB MIG 1g.10gb"``), else made from the
attributes (``<gpuInstanceSliceCount>g.<memorySizeMB / 1024, rounded up>gb``, NVIDIA's MIG user
guide, "MIG Device Names"). NotSupported from ``nvmlDeviceGetMigMode`` (a GPU without MIG) or a
binding without these functions means no MIG; an error on one MIG device skips that device.

Failure rule: NVML missing or unusable at ``nvmlInit`` (library not found, driver not loaded, no
permission, ``pynvml`` not importable) means a host without GPUs: zero GPUs, logged at INFO.
An NVML error for one device logs a warning and skips that device. ``nvmlShutdown`` is always
called after a successful ``nvmlInit``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ..placement.model import GPU, GPULink, MigInstance, Node, NumaNode, parse_cpu_list

__all__ = ["gpu_model_alias", "read_gpus", "read_local_node", "read_numa_nodes",
           "sysfs_pci_address"]

log = logging.getLogger(__name__)

_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_SUFFIX_RE = re.compile(
    r"^(\d+(\.\d+)?[GMT]I?B|PCIE|SXM\d*|HBM\d*E?|NVL|MIG|\d+G|DGXS|MAX-Q|CMP)$", re.IGNORECASE
)


def gpu_model_alias(name: str) -> str:
    """The short model name that profiles match on, from NVML's product name.

    Rule: drop the leading vendor/brand words ``NVIDIA``, ``Tesla``, ``GeForce``, ``Quadro``;
    then keep words up to the first variant word — a memory size (``80GB``), a form factor
    (``PCIe``, ``SXM4``, ``NVL``), a memory type (``HBM3``) or ``MIG`` — and cut the word that
    holds the first ``-`` at that dash (NVML writes variants as ``A100-SXM4-80GB``).

    Examples: ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``, ``"NVIDIA A100 80GB PCIe"`` ->
    ``"A100"``, ``"Tesla T4"`` -> ``"T4"``, ``"Tesla V100S-PCIE-32GB"`` -> ``"V100S"``,
    ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA GeForce RTX 4090"`` -> ``"RTX 4090"``,
    ``"NVIDIA RTX A6000"`` -> ``"RTX A6000"``. A name that the rule would empty is returned
    stripped but otherwise unchanged.
    """
    words = name.split()
    while words and words[0].upper() in _VENDOR_WORDS:
        words = words[1:]
    kept: list[str] = []
    for word in words:
        if _SUFFIX_RE.match(word):
            break
        if "-" in word:
            head = word.split("-", 1)[0]
            if head:
                kept.append(head)
            break
        kept.append(word)
    return " ".join(kept) if kept else name.strip()


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's PCI bus id (``"00000000:3B:00.0"``, 8 hex digit domain, upper case) as the kernel
    names the device under ``/sys/bus/pci/devices`` (``"0000:3b:00.0"``: 4 digit domain, lower
    case).

    Raises:
        ValueError: not of the form ``domain:bus:device.function``.
    """
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:  # no domain
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    try:
        domain = int(parts[0], 16)
        bus = int(parts[1], 16)
        dev_s, fn_s = parts[2].split(".", 1)
        dev, fn = int(dev_s, 16), int(fn_s, 16)
    except ValueError:
        raise ValueError(f"not a PCI bus id: {bus_id!r}") from None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def _text(value: Any) -> str:
    """NVML strings: ``str`` from nvidia-ml-py >= 11.515, ``bytes`` from older bindings."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return str(value)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


# --------------------------------------------------------------------------- NUMA


def _meminfo_total(text: str) -> int | None:
    """``MemTotal`` in bytes from ``/proc/meminfo`` or a node's ``meminfo`` (values in KiB)."""
    m = re.search(r"MemTotal:\s*(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else None


def read_numa_nodes(sysfs_root: str = "/sys", proc_root: str = "/proc") -> tuple[NumaNode, ...]:
    """The host's NUMA nodes with their online CPU ids and memory in bytes, sorted by id.

    Args:
        sysfs_root: where sysfs is mounted (a fake tree in tests).
        proc_root: where procfs is mounted; only ``meminfo`` is read, for the no-NUMA fallback.

    Returns:
        One :class:`NumaNode` per ``nodeN`` directory with at least one online CPU, or a single
        node 0 with all online CPUs and ``/proc/meminfo`` MemTotal when sysfs shows no NUMA
        nodes.

    Raises:
        OSError: the fallback needs ``cpu/online`` or ``/proc/meminfo`` and cannot read it.
        ValueError: a cpulist or meminfo file is malformed.
    """
    online_text = _read(os.path.join(sysfs_root, "devices/system/cpu/online"))
    online = set(parse_cpu_list(online_text)) if online_text is not None else None

    node_dir = os.path.join(sysfs_root, "devices/system/node")
    ids: list[int] = []
    if os.path.isdir(node_dir):
        for entry in os.listdir(node_dir):
            m = re.fullmatch(r"node(\d+)", entry)
            if m and os.path.isdir(os.path.join(node_dir, entry)):
                ids.append(int(m.group(1)))
    nodes: list[NumaNode] = []
    for nid in sorted(ids):
        base = os.path.join(node_dir, f"node{nid}")
        cpulist = _read(os.path.join(base, "cpulist"))
        cpus = parse_cpu_list(cpulist or "")
        if online is not None:
            cpus = tuple(c for c in cpus if c in online)
        if not cpus:
            log.debug("NUMA node %d has no online CPUs (memory-only node); left out", nid)
            continue
        meminfo = _read(os.path.join(base, "meminfo"))
        mem = _meminfo_total(meminfo) if meminfo is not None else None
        if mem is None:
            raise ValueError(f"{base}/meminfo has no 'Node {nid} MemTotal: N kB' line")
        nodes.append(NumaNode(id=nid, cpus=cpus, memory_bytes=mem))
    if nodes:
        return tuple(nodes)

    # no NUMA in sysfs: one node 0 with everything
    if online is None:
        raise OSError(f"cannot read {os.path.join(sysfs_root, 'devices/system/cpu/online')}")
    meminfo_path = os.path.join(proc_root, "meminfo")
    text = _read(meminfo_path)
    if text is None:
        raise OSError(f"cannot read {meminfo_path}")
    mem = _meminfo_total(text)
    if mem is None:
        raise ValueError(f"{meminfo_path} has no 'MemTotal: N kB' line")
    return (NumaNode(id=0, cpus=tuple(sorted(online)), memory_bytes=mem),)


# --------------------------------------------------------------------------- GPUs


class _Dev:
    """What was read for one device before links are worked out."""

    def __init__(self, handle: Any, gpu: GPU) -> None:
        self.handle = handle
        self.gpu = gpu
        self.addr = sysfs_pci_address(gpu.pci_bus_id) if gpu.pci_bus_id else ""
        self.remotes: set[str] = set()  # sysfs addresses at the far end of active NVLinks


def _gpu_numa_node(nvml: Any, handle: Any, bus_id: str, sysfs_root: str,
                   numa_ids: list[int]) -> int | None:
    """NUMA node of one GPU by the rule in the module docstring."""
    value: int | None = None
    getter = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if getter is not None:
        try:
            value = int(getter(handle))
        except nvml.NVMLError as e:  # FunctionNotFound on older drivers, NotSupported
            log.debug("nvmlDeviceGetNumaNodeId(%s): %s; reading sysfs", bus_id, e)
    if value is None and bus_id:
        path = os.path.join(sysfs_root, "bus/pci/devices", sysfs_pci_address(bus_id),
                            "numa_node")
        text = _read(path)
        if text is not None:
            try:
                value = int(text.strip())
            except ValueError:
                log.warning("%s: not a number: %r", path, text)
    if value is None or value < 0:
        if len(numa_ids) == 1:
            return numa_ids[0]
        log.warning("GPU %s: NUMA node unknown (firmware reports -1); treated as any node",
                    bus_id)
        return None
    if value not in numa_ids:
        log.warning("GPU %s: NUMA node %d has no online CPUs here; treated as any node",
                    bus_id, value)
        return None
    return value


def _nvlink_remotes(nvml: Any, handle: Any) -> set[str]:
    """sysfs PCI addresses at the far end of the device's active NVLinks (empty: no NVLink)."""
    remote_fn = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None) or getattr(
        nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None)
    state_fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    if remote_fn is None or state_fn is None:
        return set()
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    out: set[str] = set()
    for link in range(max_links):
        try:
            if state_fn(handle, link) != enabled:
                continue
            out.add(sysfs_pci_address(_text(remote_fn(handle, link).busId)))
        except nvml.NVMLError as e:
            # NotSupported: no NVLink on this GPU at all; InvalidArgument: past its last link
            if isinstance(e, getattr(nvml, "NVMLError_NotSupported", ())) and link == 0:
                break
            continue
        except ValueError:
            continue
    return out


_MIG_NAME = re.compile(r"(\d+g\.\d+gb(?:\+[a-z]+)?)", re.IGNORECASE)


def read_mig(nvml: ModuleType | Any, handle: Any) -> tuple[bool, tuple[MigInstance, ...]]:
    """(MIG mode on, its MIG instances) of one GPU handle, by the MIG rule of the module
    docstring; ``(False, ())`` for a GPU without MIG or a binding without the MIG functions."""
    try:
        mode = nvml.nvmlDeviceGetMigMode(handle)[0]
    except AttributeError:
        return False, ()
    except nvml.NVMLError as e:
        if not isinstance(e, getattr(nvml, "NVMLError_NotSupported", ())):
            log.warning("nvmlDeviceGetMigMode failed (%s); MIG taken as off", e)
        return False, ()
    if mode != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return False, ()
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError as e:
        log.warning("nvmlDeviceGetMaxMigDeviceCount failed (%s); no MIG devices read", e)
        return True, ()
    out: list[MigInstance] = []
    for i in range(count):
        try:
            mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError as e:
            if not isinstance(e, getattr(nvml, "NVMLError_NotFound", ())):
                log.warning("MIG device %d: %s; skipped", i, e)
            continue
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(mh))
            memory = int(nvml.nvmlDeviceGetMemoryInfo(mh).total)
            attrs = nvml.nvmlDeviceGetAttributes(mh)
            slices = int(attrs.gpuInstanceSliceCount)
            found = _MIG_NAME.search(_text(nvml.nvmlDeviceGetName(mh)))
            profile = (found.group(1).lower() if found else
                       f"{slices}g.{-(-int(attrs.memorySizeMB) // 1024)}gb")
            out.append(MigInstance(uuid=uuid, profile=profile, memory_bytes=memory,
                                   slices=slices, index=i))
        except (nvml.NVMLError, ValueError) as e:
            log.warning("MIG device %d: NVML error (%s); skipped", i, e)
    return True, tuple(out)


def read_gpus(nvml: ModuleType | Any | None = None, *, sysfs_root: str = "/sys",
              numa_ids: Iterable[int] = (0,)) -> tuple[GPU, ...]:
    """The host's GPUs as NVML reports them, links filled for every pair.

    Args:
        nvml: the ``pynvml`` module or an object with the same functions (tests pass a double);
            None imports ``pynvml``.
        sysfs_root: where sysfs is mounted, for the PCI ``numa_node`` fallback.
        numa_ids: the host's NUMA node ids (with CPUs); GPU NUMA ids are checked against them.

    Returns:
        The GPUs in NVML index order; ``memory_bytes`` in bytes, ``model`` by
        :func:`gpu_model_alias`, ``numa_node`` by the rule in the module docstring. Empty when
        NVML is unavailable.

    Raises:
        nothing for NVML problems (see the failure rule in the module docstring).
    """
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError as e:
            log.info("nvidia-ml-py is not importable (%s); no GPUs", e)
            return ()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        log.info("NVML unavailable (%s); this host has no usable GPUs", e)
        return ()
    numa_list = list(numa_ids)
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as e:
            log.warning("nvmlDeviceGetCount failed (%s); no GPUs", e)
            return ()
        devs: list[_Dev] = []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                name = _text(nvml.nvmlDeviceGetName(handle))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
                bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                numa = _gpu_numa_node(nvml, handle, bus_id, sysfs_root, numa_list)
                mig_mode, mig = read_mig(nvml, handle)
                gpu = GPU(uuid=uuid, index=i, model=gpu_model_alias(name),
                          memory_bytes=memory, pci_bus_id=bus_id, numa_node=numa,
                          mig=mig, mig_mode=mig_mode)
                dev = _Dev(handle, gpu)
            except (nvml.NVMLError, ValueError) as e:
                log.warning("GPU %d: NVML error (%s); device skipped", i, e)
                continue
            dev.remotes = _nvlink_remotes(nvml, handle)
            devs.append(dev)

        gpu_addrs = {d.addr for d in devs if d.addr}
        out: list[GPU] = []
        for d in devs:
            links: dict[str, GPULink] = {}
            for o in devs:
                if o is d:
                    continue
                links[o.gpu.uuid] = _pair_link(nvml, d, o, gpu_addrs)
            g = d.gpu
            out.append(GPU(uuid=g.uuid, index=g.index, model=g.model,
                           memory_bytes=g.memory_bytes, pci_bus_id=g.pci_bus_id,
                           numa_node=g.numa_node, links=links, shareable=False,
                           mig=g.mig, mig_mode=g.mig_mode))
        return tuple(out)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)


def _pair_link(nvml: Any, a: _Dev, b: _Dev, gpu_addrs: set[str]) -> GPULink:
    """Link level between two GPUs by the NVLink and PCIe rules of the module docstring."""
    if (b.addr and b.addr in a.remotes) or (a.addr and a.addr in b.remotes):
        return GPULink.NVLINK
    if (a.remotes & b.remotes) - gpu_addrs:  # common NVSwitch
        return GPULink.NVLINK
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
        return GPULink(level)
    except (nvml.NVMLError, ValueError) as e:
        fallback = (GPULink.NODE if a.gpu.numa_node is not None
                    and a.gpu.numa_node == b.gpu.numa_node else GPULink.SYSTEM)
        log.warning("topology of %s and %s unknown (%s); assuming %s", a.gpu.uuid,
                    b.gpu.uuid, e, fallback.name.lower())
        return fallback


# --------------------------------------------------------------------------- node


def _default_disk_path() -> str:
    return "/var/lib/docker" if os.path.isdir("/var/lib/docker") else "/"


def read_local_node(name: str | None = None, *, sysfs_root: str = "/sys",
                    proc_root: str = "/proc", disk_path: str | None = None,
                    nvml: ModuleType | Any | None = None) -> Node:
    """Describe this host as a :class:`Node`.

    Args:
        name: node name; default ``socket.gethostname()``.
        sysfs_root: where sysfs is mounted (tests pass a fake tree).
        proc_root: where procfs is mounted (``meminfo`` for the no-NUMA fallback).
        disk_path: a path on the filesystem containers use; default ``/var/lib/docker`` when it
            exists, else ``/``. ``disk_bytes`` is its filesystem's total size in bytes.
        nvml: the ``pynvml`` module or a stand-in with the same API; None imports ``pynvml``.

    Returns:
        The node: NUMA nodes (CPU ids, memory bytes), GPUs (UUID, index, short model, memory
        bytes, PCI bus id, NUMA node, pairwise links; all ``shareable=False``), disk bytes and
        no labels. Rules and sources are in the module docstring.

    Raises:
        OSError / ValueError: the CPU or memory files cannot be read or parsed, or ``disk_path``
            does not exist. NVML problems never raise (zero or fewer GPUs, logged).
    """
    numa = read_numa_nodes(sysfs_root, proc_root)
    gpus = read_gpus(nvml, sysfs_root=sysfs_root, numa_ids=[n.id for n in numa])
    disk = shutil.disk_usage(disk_path or _default_disk_path()).total
    return Node(name=name or socket.gethostname(), numa_nodes=numa, gpus=gpus,
                disk_bytes=int(disk), labels={})
