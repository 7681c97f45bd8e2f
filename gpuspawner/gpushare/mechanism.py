"""Which mechanism holds a GPU share on a node, and the limits a share's server starts with.

Mechanisms, strongest first (docs/gpu-sharing.md):

* ``dmem``: the cgroup v2 ``dmem`` controller (Linux 6.14, ``Documentation/admin-guide/
  cgroup-v2.rst``, "DMEM"). Present when ``<cgroup root>/cgroup.controllers`` lists ``dmem``;
  the root's ``dmem.capacity`` lists the device memory regions drivers registered, one per line,
  ``<region> <bytes>`` (e.g. ``drm/0000:03:00.0/vram0 12550144``). A GPU counts as registered
  when a region's name holds its PCI address in sysfs form (``0000:3b:00.0``); NVIDIA drivers
  register with it from r615 on (the issue's premise; not seen on a GPU here). Each server with
  a share then runs under a cgroup parent of its own whose ``dmem.max`` for the GPU's region is
  its share of the GPU's memory: the kernel refuses allocations past it.
* ``mps``: NVIDIA's Multi-Process Service, when the admin enables it and the MPS control
  daemon's pipe directory exists; each client gets ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``"0=<MiB>M"``: device ordinal 0 as the client sees it, its share of the memory) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its share in percent of the SMs), the names and forms of
  NVIDIA's MPS documentation, "Environment Variables". Asked for as ``mps-daemon``, the
  daemons are gpuspawner's: one per shared GPU in a container of its own, started before the
  GPU's first client and stopped after its last (:mod:`gpuspawner.gpushare.mps`).
* ``watchdog``: everywhere; :mod:`gpuspawner.gpushare.watchdog` reads the per-process memory
  NVML reports and interrupts the kernel of a share over its memory after a grace period.

Every server with a share also gets ``GPUSPAWNER_GPU_MEMORY_LIMIT`` (bytes),
``GPUSPAWNER_GPU_MEMORY_FRACTION`` (0..1) and ``GPUSPAWNER_GPU_SHARE_MECHANISM``, so that a
framework can hold itself to the share (PyTorch: ``torch.cuda.set_per_process_memory_fraction``
at kernel start, :mod:`gpuspawner.singleuser.kernel`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..inventory.local import sysfs_pci_address
from ..placement.model import GPU, GPU_MILLI, Allocation
from .mps import PIPE_MOUNT

__all__ = [
    "MECHANISMS",
    "SHARE_MODES",
    "Mechanism",
    "ShareLimits",
    "ShareModeUnavailable",
    "dmem_capacity",
    "dmem_region",
    "detect_mechanism",
    "prepare_dmem_cgroup",
    "remove_dmem_cgroup",
    "share_limits",
]

#: what an admin may set (``c.GPUSpawner.gpu_share_mode``, a node's ``gpu_share``)
SHARE_MODES = ("auto", "dmem", "mps", "mps-daemon", "watchdog")
#: what a node ends up with, strongest first
MECHANISMS = ("dmem", "mps", "watchdog")
#: the MPS control daemon's default pipe directory (NVIDIA MPS docs, CUDA_MPS_PIPE_DIRECTORY)
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
#: where the cgroup parents of servers with a dmem limit live, under the cgroup root
CGROUP_PARENT = "gpuspawner"
MiB = 1024**2


class ShareModeUnavailable(ValueError):
    """The admin asked for a mechanism (``dmem``, ``mps``) the node does not have; the
    message says what is missing."""


@dataclass(frozen=True)
class Mechanism:
    """What holds shares on one node.

    Attributes:
        name: ``"dmem"`` | ``"mps"`` | ``"watchdog"``.
        reason: one sentence, why this one (shown on the admin map).
        regions: GPU UUID -> dmem region name (``dmem`` only).
        mps_pipe_directory: the MPS control daemon's pipe directory (``mps`` only).
        mps_daemon: the daemons are gpuspawner's, one per shared GPU (``mps-daemon`` asked
            for; :mod:`gpuspawner.gpushare.mps`); ``mps_pipe_directory`` is then where the
            GPU's pipe volume is mounted in each client.
    """

    name: str
    reason: str
    regions: Mapping[str, str] = field(default_factory=dict)
    mps_pipe_directory: str = ""
    mps_daemon: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: ``{"mechanism", "reason"}`` (what the admin map and api/nodes show)."""
        return {"mechanism": self.name, "reason": self.reason}


def dmem_capacity(cgroup_root: str = "/sys/fs/cgroup") -> dict[str, int] | None:
    """The dmem regions of the host and their capacity in bytes, or None when the kernel has
    no dmem controller (no cgroup v2 at ``cgroup_root``, or ``cgroup.controllers`` without
    ``dmem``).

    Raises:
        ValueError: a ``dmem.capacity`` line that is not ``<region> <bytes>``.
    """
    try:
        with open(os.path.join(cgroup_root, "cgroup.controllers"), encoding="ascii") as f:
            if "dmem" not in f.read().split():
                return None
        with open(os.path.join(cgroup_root, "dmem.capacity"), encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"{cgroup_root}/dmem.capacity: not '<region> <bytes>': {line!r}")
        out[parts[0]] = int(parts[1])
    return out


def dmem_region(regions: Iterable[str], gpu: GPU) -> str | None:
    """The device memory region of ``gpu`` among ``regions``: the first whose name holds the
    GPU's PCI address in sysfs form and ends in ``vram<n>`` when any does (a driver may also
    register e.g. ``stolen`` memory); None when none names it."""
    if not gpu.pci_bus_id:
        return None
    try:
        addr = sysfs_pci_address(gpu.pci_bus_id)
    except ValueError:
        return None
    mine = [r for r in regions if addr in r.lower().split("/")]
    vram = [r for r in mine if r.rsplit("/", 1)[-1].startswith("vram")]
    return (vram or mine or [None])[0]


def detect_mechanism(
    mode: str,
    gpus: Iterable[GPU],
    *,
    local: bool = True,
    cgroup_root: str = "/sys/fs/cgroup",
    mps_pipe_directory: str = MPS_PIPE_DIRECTORY,
) -> Mechanism:
    """The mechanism of one node, chosen when the hub starts.

    Rule: ``auto`` takes ``dmem`` when the node is this host (``local``: its engine on a unix
    socket here), the kernel has the controller and every shareable GPU (every GPU when none is
    marked shareable) has a region; else ``watchdog`` (MPS is never chosen by itself: it changes
    how every process on the GPU runs, and its one-uid rule, docs/gpu-sharing.md, is the
    admin's call). ``mps-daemon`` is MPS with gpuspawner's own daemons (nothing to look for
    on the node). ``dmem`` and ``mps`` asked for explicitly must be present on a local node;
    on a remote node they are taken as the admin says (this host cannot look).

    Args:
        mode: one of :data:`SHARE_MODES`.
        gpus: the node's GPUs (inventory).
        local: whether the node is this host.
        cgroup_root: where cgroup v2 is mounted (a fake tree in tests).
        mps_pipe_directory: the MPS control daemon's pipe directory.

    Raises:
        ShareModeUnavailable: ``dmem`` or ``mps`` asked for on a local node that lacks it.
        ValueError: ``mode`` is not one of :data:`SHARE_MODES`.
    """
    if mode not in SHARE_MODES:
        raise ValueError(f"must be one of {', '.join(SHARE_MODES)}, got {mode!r}")
    gpus = list(gpus)
    shared = [g for g in gpus if g.shareable] or gpus
    if mode == "watchdog":
        return Mechanism("watchdog", "set by the admin: per-process GPU memory watched")
    if mode == "mps-daemon":
        return Mechanism(
            "mps",
            "set by the admin: MPS memory and thread limits per client, one MPS control "
            "daemon per shared GPU run by gpuspawner (a container each)",
            mps_pipe_directory=PIPE_MOUNT,
            mps_daemon=True,
        )
    if mode == "mps":
        if local and not os.path.isdir(mps_pipe_directory):
            raise ShareModeUnavailable(
                f"'mps' asked for, but the MPS control daemon's pipe directory "
                f"{mps_pipe_directory} does not exist: start nvidia-cuda-mps-control -d "
                "(docs/gpu-sharing.md)"
            )
        return Mechanism(
            "mps",
            "set by the admin: MPS memory and thread limits per client",
            mps_pipe_directory=mps_pipe_directory,
        )
    if not local:
        if mode == "dmem":
            return Mechanism("dmem", "set by the admin (remote node, not checked from here)")
        return Mechanism(
            "watchdog",
            "remote node: this host cannot look for dmem; set the node's gpu_share to choose",
        )
    caps = dmem_capacity(cgroup_root)
    missing = ""
    regions: dict[str, str] = {}
    if caps is None:
        missing = f"the kernel has no cgroup v2 dmem controller ({cgroup_root}/cgroup.controllers)"
    else:
        for g in shared:
            region = dmem_region(caps, g)
            if region is None:
                missing = (
                    f"GPU {g.uuid} ({g.pci_bus_id}) has no region in "
                    f"{cgroup_root}/dmem.capacity (driver before r615?)"
                )
                break
            regions[g.uuid] = region
        if not shared:
            missing = "no GPUs"
    if not missing:
        return Mechanism("dmem", "kernel-enforced: cgroup dmem.max per server", regions=regions)
    if mode == "dmem":
        raise ShareModeUnavailable(f"'dmem' asked for, but {missing}")
    return Mechanism("watchdog", f"no dmem: {missing}; per-process GPU memory watched")


@dataclass(frozen=True)
class ShareLimits:
    """What a server with a GPU share starts with.

    Attributes:
        env: environment variables (``GPUSPAWNER_GPU_*``, and the MPS client limits).
        memory_bytes: GPU UUID -> the share's GPU memory in bytes.
        cgroup_parent: the cgroup parent to run under (``dmem``), relative to the cgroup root
            (the Docker cgroupfs driver's form, ``/gpuspawner/<name>``); "" for none.
        dmem_max: dmem region -> bytes, written to ``<parent>/dmem.max`` before the start.
        mps_pipe_directory: to mount into the server (``mps``); "" for none.
        mps_daemon_gpu: the GPU whose gpuspawner-run MPS daemon the server is a client of
            (``mps-daemon``; the backend mounts that daemon's pipe volume and joins its IPC
            namespace); "" for none.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    memory_bytes: Mapping[str, int] = field(default_factory=dict)
    cgroup_parent: str = ""
    dmem_max: Mapping[str, int] = field(default_factory=dict)
    mps_pipe_directory: str = ""
    mps_daemon_gpu: str = ""


def share_limits(
    alloc: Allocation, gpus: Mapping[str, GPU], mechanism: Mechanism, name: str
) -> ShareLimits:
    """The limits of one server (pure).

    A share (an allocation's GPU with fewer than 1000 milli-GPU) gets ``milli / 1000`` of the
    GPU's memory (bytes, rounded down) and ``milli / 10`` percent of its SMs under MPS. A server
    with whole GPUs or none gets only ``GPUSPAWNER_GPU_SHARE_MECHANISM``: nothing to hold.

    Args:
        alloc: the allocation. gpus: the node's GPUs by UUID (memory sizes).
        mechanism: the node's. name: the server's object name (its cgroup parent's name).

    Raises:
        KeyError: a GPU of the allocation is not among ``gpus``.
    """
    env = {"GPUSPAWNER_GPU_SHARE_MECHANISM": mechanism.name}
    shares = [g for g in alloc.gpus if g.milli < GPU_MILLI]
    if not shares:
        return ShareLimits(env=env)
    share = shares[0]  # a share is of one GPU (Bundle.gpu_milli)
    total = gpus[share.uuid].memory_bytes
    limit = total * share.milli // GPU_MILLI
    env.update(
        {
            "GPUSPAWNER_GPU_MEMORY_LIMIT": str(limit),
            "GPUSPAWNER_GPU_MEMORY_FRACTION": f"{share.milli / GPU_MILLI:.3f}",
        }
    )
    if mechanism.name == "mps":
        env.update(
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit // MiB}M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, share.milli // 10)),
                "CUDA_MPS_PIPE_DIRECTORY": mechanism.mps_pipe_directory,
            }
        )
        if mechanism.mps_daemon:
            return ShareLimits(env=env, memory_bytes={share.uuid: limit},
                               mps_daemon_gpu=share.uuid)
        return ShareLimits(
            env=env,
            memory_bytes={share.uuid: limit},
            mps_pipe_directory=mechanism.mps_pipe_directory,
        )
    if mechanism.name == "dmem" and share.uuid in mechanism.regions:
        return ShareLimits(
            env=env,
            memory_bytes={share.uuid: limit},
            cgroup_parent=f"/{CGROUP_PARENT}/{name}",
            dmem_max={mechanism.regions[share.uuid]: limit},
        )
    return ShareLimits(env=env, memory_bytes={share.uuid: limit})


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def prepare_dmem_cgroup(limits: ShareLimits, cgroup_root: str = "/sys/fs/cgroup") -> str:
    """Make the server's cgroup parent and write its ``dmem.max`` (one ``<region> <bytes>``
    line per region, the kernel's nested-keyed form), enabling ``+dmem`` in the
    ``cgroup.subtree_control`` of the root and of ``gpuspawner/`` on the way (the kernel
    applies a controller's files only below a parent that enables it). Returns the parent's
    path; "" when ``limits`` has none.

    Raises:
        OSError: the cgroup tree refuses (not root, no dmem controller).
    """
    if not limits.cgroup_parent:
        return ""
    path = os.path.join(cgroup_root, limits.cgroup_parent.strip("/"))
    top = os.path.dirname(path)
    os.makedirs(path, exist_ok=True)
    for parent in (cgroup_root, top):
        control = os.path.join(parent, "cgroup.subtree_control")
        with open(control, encoding="ascii") as f:
            enabled = f.read().split()
        if "dmem" not in enabled:
            _write(control, "+dmem")
    for region, value in limits.dmem_max.items():
        _write(os.path.join(path, "dmem.max"), f"{region} {value}\n")
    return path


def remove_dmem_cgroup(cgroup_parent: str, cgroup_root: str = "/sys/fs/cgroup") -> None:
    """Remove a server's cgroup parent once its container is gone (``rmdir``: the kernel
    refuses while processes are in it; never raises)."""
    if not cgroup_parent:
        return
    path = os.path.join(cgroup_root, cgroup_parent.strip("/"))
    try:
        for entry in os.scandir(path):  # the container's own cgroup, left by the engine
            if entry.is_dir(follow_symlinks=False):
                os.rmdir(entry.path)
        os.rmdir(path)
    except OSError:
        pass
