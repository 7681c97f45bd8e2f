"""The ledger's indexes (a part of :class:`~.ledger.Ledger`): its nodes grouped in buckets by
(GPU signature, free cores, free-memory class), so that a policy skips whole buckets of nodes
that are too small; the no-fit cache per bundle shape; the GPU-affinity counts of
``gpu-clustering``; the nodes by hardware profile. Bookings only shrink a node, so they keep the
no-fit results; a release or a new node bumps its bucket's version."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .fragmentation import FragmentationModel, mem_class
from .model import GPU_MILLI, Allocation
from .state import NodeState


def affinity_tag(a: Allocation) -> str:
    """The GPU-affinity tag of an allocation (``GetGpuAffinityFromPodAnnotation``): "" for no
    GPU, ``share`` for a share of one GPU, ``<n>-gpu`` for n whole GPUs."""
    if not a.gpus:
        return ""
    if len(a.gpus) == 1 and a.gpus[0].milli < GPU_MILLI:
        return "share"
    return f"{len(a.gpus)}-gpu"


def node_profile(st: NodeState) -> tuple:
    """What :func:`~.devices.min_numa_count` reads of a node: per NUMA node its cores,
    memory and the (model, shareable) of its GPUs."""
    return tuple((len(n.cpus), n.memory_bytes,
                  tuple(sorted((g.model, g.shareable) for g in st.gpus_by_numa[n.id])))
                 for n in st.node.numa_nodes)


@dataclass
class LedgerIndex:
    """The indexes of one ledger (its ``_c``)."""

    states: list[NodeState] = field(default_factory=list)
    buckets: dict[tuple[int, int, int], dict[str, NodeState]] = field(default_factory=dict)
    frag: FragmentationModel = field(default_factory=FragmentationModel)
    rng: random.Random = field(default_factory=random.Random)
    #: bucket key -> version, bumped whenever a node that might now fit more joins or grows
    versions: dict[tuple[int, int, int], int] = field(default_factory=dict)
    #: bundle shape id -> {bucket key: version at which no node of it fitted}
    no_fit: dict[int, dict[tuple[int, int, int], int]] = field(default_factory=dict)
    #: bundle shape id -> {bucket key: version at which each of its nodes had failed}
    #: (``fgd``'s node walk, :func:`~.policies._try_keys`)
    spent: dict[int, dict[tuple[int, int, int], int]] = field(default_factory=dict)
    shapes: dict[tuple, int] = field(default_factory=dict)
    #: node name -> GPU-affinity tag -> allocations with it (for ``gpu-clustering``)
    affinity: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``fgd`` compares the FGD plugin's integer score (True) or the exact growth (False)
    quantize: bool = True
    #: bundle shape -> (profile count, whether some node can hold it on one NUMA node)
    one_numa: dict[tuple, tuple[int, bool]] = field(default_factory=dict)
    #: signature id -> the keys of its buckets (an ordered set)
    by_sid: dict[int, dict[tuple[int, int, int], None]] = field(default_factory=dict)
    #: node name -> state (the ledger's own index)
    by_name: dict[str, NodeState] = field(default_factory=dict)
    #: bucket key -> the smallest node name in it (kept where known; see _rebucket)
    first_name: dict[tuple[int, int, int], str] = field(default_factory=dict)
    #: hardware profile (per NUMA node: cores, memory, GPU models and shareability) -> the
    #: first node of it
    profiles: dict[tuple, NodeState] = field(default_factory=dict)
    #: bucket keys in the order their buckets were created while ``lookahead`` holds state
    #: (read, and cleared when it has grown long, by :mod:`.lookahead`, whose per-type heaps
    #: it keeps up to date; cleared here with ``lookahead`` when no look-ahead reads it)
    created: list[tuple[int, int, int]] = field(default_factory=list)
    #: :mod:`.lookahead`'s state: per next-request type a heap of (growth, bucket key)
    lookahead: dict = field(default_factory=dict)
    #: for :mod:`.rank_index`: the keys of the buckets that exist and changed (created, a node
    #: joined or left, version bumped), each with the number of its latest change
    #: (``change_seq`` then), in that order; a bucket's key leaves it with the bucket
    changed: dict[tuple[int, int, int], int] = field(default_factory=dict)
    #: the number the next change gets
    change_seq: int = 0
    #: bundle shape id -> its :class:`~.rank_index.RankHeaps`
    rank_heaps: dict = field(default_factory=dict)




class IndexMaintenance:
    """Keep a node in the bucket of its current key.

    A part of :class:`~.ledger.Ledger` (its lock ``_lock``, node states and indexes ``_c``, and
    allocations are the ledger's), kept in its own module by concern."""

    def _bucket_key(self, st: NodeState) -> tuple[int, int, int]:
        """(GPU signature id, free cores, free-memory class); the class is the bit length of
        the free MiB, so class c holds amounts in [2**(c-1), 2**c - 1] and the ``fgd`` policy
        can skip a whole bucket whose nodes are all too small. Free cores are exact: the
        fragmentation depends on them (a task type that no longer fits the CPU). Under a
        memory-aware policy the fragmentation reads free memory too, so the class is finer
        (:func:`~.fragmentation.mem_class`: 8 per power of two)."""
        frag = self._c.frag
        return (frag.intern(st.sig), st.free_cpu_count(),
                mem_class(st.free_memory() >> 20, frag.memory_aware))

    def _rebucket_all(self) -> None:
        """Put every node in a new bucket of its current key, every index and cache that
        reads bucket keys started afresh (a switch to or from a memory-aware policy changes
        what the keys' memory class means)."""
        c = self._c
        for d in (c.buckets, c.versions, c.no_fit, c.spent, c.first_name, c.by_sid,
                  c.rank_heaps, c.lookahead, c.shapes, c.changed):
            d.clear()
        c.created.clear()
        for st in c.states:
            self._rebucket(st, grew=False)

    def _rebucket(self, st: NodeState, old: tuple[int, int, int] | None = None,
                  grew: bool = True) -> None:
        """Move a node to the bucket of its current key. ``grew`` says the node may fit more
        than before (added, or something released), which invalidates the bucket's cached
        no-fit results; bookings only shrink a node, so they keep them."""
        key = self._bucket_key(st)
        c = self._c
        if grew:
            self._grown += 1
        if key != old:
            if old is not None:
                bucket = c.buckets.get(old)
                if bucket is not None:
                    bucket.pop(st.name, None)
                    if not bucket:
                        del c.buckets[old]
                        c.changed.pop(old, None)
                        same_sig = c.by_sid[old[0]]
                        del same_sig[old]
                        if not same_sig:
                            del c.by_sid[old[0]]
                    first = c.first_name.get(old)
                    if first == st.name:
                        del c.first_name[old]  # recomputed when next asked for
                    if bucket and first in (None, st.name):
                        _changed(c, old)  # its smallest name may have changed
            bucket = c.buckets.get(key)
            if bucket is None:
                bucket = c.buckets[key] = {}
                c.by_sid.setdefault(key[0], {})[key] = None
                if c.lookahead:  # only while fgd-lookahead keeps its heaps
                    c.created.append(key)
                    if len(c.created) > 4 * len(c.buckets) + 4096:
                        c.created.clear()  # the look-ahead rebuilds its heaps
                        c.lookahead.clear()
            bucket[st.name] = st
            first = c.first_name.get(key)
            if first is not None and st.name < first:
                c.first_name[key] = st.name
            c.versions[key] = c.versions.get(key, 0) + 1
            _changed(c, key)
        elif grew:
            c.versions[key] = c.versions.get(key, 0) + 1
            _changed(c, key)


def _changed(c: LedgerIndex, key: tuple[int, int, int]) -> None:
    """Record that bucket ``key`` changed: it moves to the end of ``c.changed`` with the next
    change number, so that the buckets changed since any number are the end of it, each
    once (:class:`~.rank_index.ShapeRanks` reads them from there)."""
    changed = c.changed
    changed.pop(key, None)
    changed[key] = c.change_seq
    c.change_seq += 1
