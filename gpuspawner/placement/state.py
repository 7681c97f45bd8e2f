"""Free/used bookkeeping of one node: free CPU ids and memory per NUMA node, milli-GPU used per
GPU UUID, free disk. Not thread-safe on its own: the :class:`~.ledger.Ledger` holds the lock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .model import GPU, GPU_MILLI, Allocation, MigInstance, Node


class Conflict(NamedTuple):
    """Why an allocation cannot be booked (:meth:`NodeState.conflict`).

    Attributes:
        text: the reason, e.g. "CPU 3 is already held".
        held: True when another allocation holds what it names (a double booking), False
            when it does not fit the node at all (unknown device, malformed).
    """

    text: str
    held: bool = False


@dataclass
class Plan:
    """Devices chosen for a bundle on one node, before they are booked.

    Attributes:
        gpus: (UUID, milli-GPU) pairs.
        cpus: CPU ids.
        memory_by_numa: (NUMA id, bytes) pairs; their NUMA ids are the ``mems``.
        aligned: GPUs, cores and memory sit on the same fewest NUMA nodes.
        note: why not aligned, else "".
        mig: the MIG instances chosen (``MIG-`` UUIDs).
    """

    gpus: list[tuple[str, int]]
    cpus: list[int]
    memory_by_numa: list[tuple[int, int]]
    aligned: bool
    note: str = ""
    mig: list[str] = field(default_factory=list)


class NodeState:
    """Mutable free/used state of one :class:`~.model.Node`.

    GPUs whose NUMA node is unknown (``None``) are booked against the node's first NUMA node; on a
    one-NUMA-node host (the common case for unknown values) that is exact.

    MIG: a GPU with MIG mode on counts as fully used in ``gpu_used`` (1000 milli-GPU, so no
    whole-GPU or share placement, fragmentation signature or free-GPU count sees it as free);
    its instances are booked by UUID in ``mig_used``, each whole; a drained MIG-enabled GPU
    (``mig_drained``) offers none of its instances.

    Shares of one user per GPU (``one_user_shares``, set by the ledger for nodes whose shares
    run under gpuspawner's MPS daemons, ``gpu_share: mps-daemon``): ``share_users`` counts,
    per GPU, the share allocations of each user on it, and :func:`~.devices.share_blocked`
    keeps another user's share off such a GPU (docs/gpu-sharing.md, MPS).
    """

    __slots__ = ("node", "numa_ids", "free_cpus", "free_mem", "gpu_used", "free_disk",
                 "gpus_by_numa", "gpu_numa", "gpu_by_uuid", "sig", "allocation_ids", "order",
                 "cpu_numa", "cache", "mig_by_uuid", "mig_used", "mig_by_numa", "mig_drained",
                 "share_users", "one_user_shares")

    def __init__(self, node: Node, order: int = 0) -> None:
        self.node = node
        self.order = order
        self.numa_ids: tuple[int, ...] = tuple(n.id for n in node.numa_nodes)
        self.free_cpus: dict[int, set[int]] = {n.id: set(n.cpus) for n in node.numa_nodes}
        self.cpu_numa: dict[int, int] = {c: n.id for n in node.numa_nodes for c in n.cpus}
        self.free_mem: dict[int, int] = {n.id: n.memory_bytes for n in node.numa_nodes}
        self.free_disk: int = node.disk_bytes
        self.gpu_used: dict[str, int] = {g.uuid: GPU_MILLI if g.mig_enabled else 0
                                         for g in node.gpus}
        first = self.numa_ids[0] if self.numa_ids else 0
        self.gpu_numa: dict[str, int] = {
            g.uuid: (g.numa_node if g.numa_node in self.free_cpus else first) for g in node.gpus
        }
        self.gpus_by_numa: dict[int, tuple[GPU, ...]] = {
            nid: tuple(sorted((g for g in node.gpus if self.gpu_numa[g.uuid] == nid),
                              key=lambda g: (g.index, g.uuid)))
            for nid in self.numa_ids
        }
        self.gpu_by_uuid: dict[str, GPU] = {g.uuid: g for g in node.gpus}
        #: MIG instances by ``MIG-`` UUID, the booked ones, and per NUMA node (parent's order)
        self.mig_by_uuid: dict[str, MigInstance] = {m.uuid: m for g in node.gpus for m in g.mig}
        self.mig_used: set[str] = set()
        #: MIG-enabled GPUs that are drained: none of their instances is placed
        self.mig_drained: set[str] = set()
        self.mig_by_numa: dict[int, tuple[MigInstance, ...]] = {
            nid: tuple(m for g in self.gpus_by_numa[nid] for m in g.mig)
            for nid in self.numa_ids
        }
        self.allocation_ids: set[str] = set()
        #: GPU UUID -> user -> share allocations (under 1000 milli-GPU) of that user on it;
        #: a GPU without shares has no key
        self.share_users: dict[str, dict[str, int]] = {}
        #: a GPU's shares serve one user at a time (``gpu_share: mps-daemon``)
        self.one_user_shares: bool = False
        #: results that depend only on the node's hardware (see devices.min_numa_count)
        self.cache: dict = {}
        self.sig: tuple = ()
        self.refresh_signature()

    # -- aggregate views -------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The node's name."""
        return self.node.name

    def free_cpu_count(self) -> int:
        """Free logical CPUs on the node."""
        return sum(len(s) for s in self.free_cpus.values())

    def free_memory(self) -> int:
        """Free memory bytes on the node (all NUMA nodes)."""
        return sum(self.free_mem.values())

    def gpu_free_milli(self, uuid: str) -> int:
        """Free milli-GPU of one GPU (1000 = untouched)."""
        return GPU_MILLI - self.gpu_used[uuid]

    def free_gpu_milli(self) -> int:
        """Free milli-GPU summed over the node's GPUs."""
        return len(self.gpu_used) * GPU_MILLI - sum(self.gpu_used.values())

    def mig_free(self, m: MigInstance) -> bool:
        """True when MIG instance ``m`` of this node may be placed now: not booked, its GPU
        not drained."""
        return m.uuid not in self.mig_used and m.gpu not in self.mig_drained

    def free_mig(self, profile: str) -> int:
        """Free MIG instances of ``profile`` on the node."""
        return sum(1 for m in self.mig_by_uuid.values()
                   if m.profile == profile and self.mig_free(m))

    def free_mig_slices(self) -> int:
        """Compute slices of the node's free MIG instances."""
        return sum(m.slices for m in self.mig_by_uuid.values() if self.mig_free(m))

    def refresh_signature(self) -> None:
        """Recompute :attr:`sig`, the node's GPU state as the fragmentation measure sees it: per
        NUMA node, the sorted (model, free milli, shareable) of its GPUs. Nodes with equal
        signatures have equal GPU fragmentation, so the default policy scores them once."""
        self.sig = tuple(
            tuple(sorted((g.model, GPU_MILLI - self.gpu_used[g.uuid], g.shareable)
                         for g in self.gpus_by_numa[nid]))
            for nid in self.numa_ids
        )

    def is_idle(self) -> bool:
        """True when nothing is booked on the node."""
        return not self.allocation_ids

    # -- booking ----------------------------------------------------------------------------
    def conflict(self, alloc: Allocation) -> Conflict | None:
        """Why ``alloc`` cannot be booked on top of the current state, or None if it can.
        ``Conflict.held`` is True when devices it names are held by another allocation (as
        opposed to an allocation that does not fit this node at all)."""
        for g in alloc.gpus:
            if g.uuid not in self.gpu_used:
                return Conflict(f"GPU {g.uuid} is not on node {self.name}")
            if g.milli <= 0 or g.milli > GPU_MILLI:
                return Conflict(f"GPU {g.uuid}: {g.milli} milli-GPU is out of range")
            if g.milli < GPU_MILLI and not self.gpu_by_uuid[g.uuid].shareable:
                return Conflict(f"GPU {g.uuid} is exclusive, a share of {g.milli} milli-GPU "
                                "is not allowed")
            if self.gpu_used[g.uuid] + g.milli > GPU_MILLI:
                return Conflict(f"GPU {g.uuid} has {self.gpu_free_milli(g.uuid)} milli-GPU "
                                f"free, {g.milli} asked", held=True)
        if len({g.uuid for g in alloc.gpus}) != len(alloc.gpus):
            return Conflict("the same GPU appears twice")
        for m in alloc.mig:
            inst = self.mig_by_uuid.get(m.uuid)
            if inst is None:
                return Conflict(f"MIG instance {m.uuid} is not on node {self.name}")
            if inst.profile != m.profile or inst.gpu != m.gpu:
                return Conflict(f"MIG instance {m.uuid} is a {inst.profile} on GPU {inst.gpu}, "
                                f"not a {m.profile} on GPU {m.gpu}")
            if m.uuid in self.mig_used:
                return Conflict(f"MIG instance {m.uuid} is already held", held=True)
        if len({m.uuid for m in alloc.mig}) != len(alloc.mig):
            return Conflict("the same MIG instance appears twice")
        for c in alloc.cpuset:
            if c not in self.cpu_numa:
                return Conflict(f"CPU {c} is not on node {self.name}")
            if c not in self.free_cpus[self.cpu_numa[c]]:
                return Conflict(f"CPU {c} is already held", held=True)
        if len(set(alloc.cpuset)) != len(alloc.cpuset):
            return Conflict("the same CPU appears twice")
        for nid, b in alloc.memory_by_numa:
            if nid not in self.free_mem:
                return Conflict(f"NUMA node {nid} is not on node {self.name}")
            if b < 0 or b > self.free_mem[nid]:
                return Conflict(f"NUMA node {nid} has {self.free_mem[nid]} bytes free, {b} asked")
        if sum(b for _, b in alloc.memory_by_numa) != alloc.memory_bytes:
            return Conflict("memory_by_numa does not add up to memory_bytes")
        if alloc.disk_bytes > self.free_disk:
            return Conflict(f"{self.free_disk} bytes of disk free, {alloc.disk_bytes} asked")
        if alloc.id in self.allocation_ids:
            return Conflict(f"allocation {alloc.id} is already booked")
        return None

    def book(self, alloc: Allocation) -> None:
        """Take the allocation's devices. The caller checked :meth:`conflict` first."""
        for g in alloc.gpus:
            self.gpu_used[g.uuid] += g.milli
            if g.milli < GPU_MILLI:
                users = self.share_users.setdefault(g.uuid, {})
                users[alloc.owner.user] = users.get(alloc.owner.user, 0) + 1
        for m in alloc.mig:
            self.mig_used.add(m.uuid)
        for c in alloc.cpuset:
            self.free_cpus[self.cpu_numa[c]].discard(c)
        for nid, b in alloc.memory_by_numa:
            self.free_mem[nid] -= b
        self.free_disk -= alloc.disk_bytes
        self.allocation_ids.add(alloc.id)
        if alloc.gpus:
            self.refresh_signature()

    def unbook(self, alloc: Allocation) -> None:
        """Give the allocation's devices back (the inverse of :meth:`book`)."""
        for g in alloc.gpus:
            self.gpu_used[g.uuid] -= g.milli
            users = self.share_users.get(g.uuid) if g.milli < GPU_MILLI else None
            if users is not None and alloc.owner.user in users:
                users[alloc.owner.user] -= 1
                if not users[alloc.owner.user]:
                    del users[alloc.owner.user]
                if not users:
                    del self.share_users[g.uuid]
        for m in alloc.mig:
            self.mig_used.discard(m.uuid)
        for c in alloc.cpuset:
            self.free_cpus[self.cpu_numa[c]].add(c)
        for nid, b in alloc.memory_by_numa:
            self.free_mem[nid] += b
        self.free_disk += alloc.disk_bytes
        self.allocation_ids.discard(alloc.id)
        if alloc.gpus:
            self.refresh_signature()
