"""``fgd``'s candidate buckets per bundle shape, kept across decisions (ours).

Without it, every ``fgd`` decision passes over all of the ledger's buckets (one per GPU
signature, free cores and memory class, :class:`~.ledger_index.LedgerIndex`) to find the best
rank, and then over the best rank's buckets to find their smallest node name. Near capacity a
10,000-node cluster has ~4,000 buckets, and for a CPU-only bundle nearly all of them have the
best rank (placing it changes no node's GPU fragmentation), so those passes were most of the
slowest decisions' time.

A bucket's rank for a bundle shape depends only on its key and the fragmentation model's
workload (:meth:`~.fragmentation.FragmentationModel.keys`), so it stays right while the bucket
exists. Per shape this keeps, for each rank, a heap of ``(smallest node name, bucket key)``.
Buckets that change (created, a node joins or leaves, a version bump) are recorded by the
ledger in ``LedgerIndex.changed``: each existing bucket's key once, with the number of its
latest change, in that order (a change moves the key to the end; a bucket that goes leaves
it). Before its next decision each shape's index reads the end of it back to the first change
it has seen, so it meets each changed bucket that still exists once, and pushes a fresh entry
for each. Old entries are dropped when they reach a heap's top (lazy deletion): an entry is
current while its bucket exists, its name is still the bucket's smallest and the bucket is not
in the shape's no-fit cache at its version. An index is rebuilt from all buckets when the
workload changes (its rank table is a new one), when more buckets changed since it last read
than half the buckets (it stops reading there), or when stale entries have piled up.

Before, the ledger kept a plain log of changes (a bucket once per change, gone ones included),
and an index more entries behind than half the buckets rebuilt; on the trace's fill most of a
fill's slowest decisions held such a rebuild, though the buckets that had changed and still
existed were a median 22 % of the buckets (docs/placement.md "The default's decision
latency").

The decisions are the same as the full pass's: the same best rank, and its buckets' nodes in
name order (tests/test_placement_decisions.py, and a check to capacity on the trace).

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

Key = tuple[int, int, int]  # (signature id, free cores, memory class): a ledger bucket
Entry = tuple[str, Key]  # (the bucket's smallest node name, its key)

_MISS = object()

#: at most this many shapes keep an index: a new one evicts the least recently used (memory:
#: about 64 bytes per bucket per shape, so 256 shapes of 4,000 buckets hold ~65 MB)
MAX_SHAPES = 256


@dataclass(slots=True)
class RankHeaps:
    """One bundle shape's candidate buckets: rank -> heap of :data:`Entry`."""

    #: the fragmentation model's rank table these ranks came from (a new one: new workload)
    table: dict
    #: the change number (``LedgerIndex.change_seq``) up to which this index has read the
    #: changed buckets (``LedgerIndex.changed``)
    pos: int
    heaps: dict[int, list[Entry]] = field(default_factory=dict)
    #: entries in the heaps, stale ones included
    entries: int = 0


def first_name(c, key: Key) -> str:
    """The smallest node name of bucket ``key`` of ``c`` (a :class:`~.policies.ClusterView`),
    cached in ``c.first_name`` (the ledger drops the cached name when that node leaves)."""
    name = c.first_name.get(key)
    if name is None:
        name = c.first_name[key] = min(c.buckets[key])
    return name


class ShapeRanks:
    """The candidate buckets of one decision's bundle shape, by rank then smallest node name.

    ``c`` is the policy's :class:`~.policies.ClusterView`; ``shape`` the bundle shape's id
    (``ClusterView.shapes``); ``d`` its GPU demand, ``cores`` and ``need`` the free cores
    and the memory class (:meth:`~.fragmentation.FragmentationModel.mem_need`) a bucket must
    have at least; ``ranks`` the fragmentation model's rank table for the shape
    (:meth:`~.fragmentation.FragmentationModel.keys`: bucket key -> rank, lower is better; its
    identity says the workload is unchanged) and ``rank_of`` the function that fills it
    (:meth:`~.fragmentation.FragmentationModel.ranker`); ``no_fit`` the shape's no-fit cache
    (bucket key -> version)."""

    def __init__(self, c, shape: int, d, cores: int, need: int, ranks: dict,
                 rank_of: Callable[[int, int, int], int | float | None],
                 no_fit: dict[Key, int]) -> None:
        self.c = c
        self.no_fit = no_fit
        self._args = (d, cores, need, ranks, rank_of)
        store = c.rank_heaps
        idx = store.pop(shape, None)  # put back last: the store is in order of use
        unread: list[Key] = []
        if idx is not None and idx.table is ranks:
            pos = idx.pos
            if pos < c.change_seq:
                # the buckets changed since this index last read, each once and only those
                # that exist: the end of c.changed (in order of their latest change), read
                # back to the first one this index has seen; more than half the buckets (and
                # 64): as cheap to rebuild
                limit = len(c.buckets) // 2 + 64
                for key, seq in reversed(c.changed.items()):
                    if seq < pos:
                        break
                    unread.append(key)
                    if len(unread) > limit:
                        idx = None
                        break
            if idx is not None and idx.entries > 2 * len(c.buckets) + 1024:
                idx = None  # stale entries piled up
        else:
            idx = None
        if idx is None:
            while len(store) >= MAX_SHAPES:
                del store[next(iter(store))]  # the least recently used
            idx = RankHeaps(ranks, c.change_seq)
            self._build(idx)
        elif unread:
            self._add(idx, unread)
            idx.pos = c.change_seq
        store[shape] = idx
        self.idx = idx

    def _build(self, idx: RankHeaps) -> None:
        """Fill new heaps from every bucket: signature by signature (``c.by_sid``), so that a
        signature whose GPUs cannot take the shape is skipped with all its buckets (e.g. the
        nodes with no free GPU, for a GPU bundle), then as :meth:`_add`; appended, then each
        heap heapified once."""
        c = self.c
        buckets = c.buckets
        first = c.first_name
        frag = c.frag
        d, cores, need, ranks, rank_of = self._args
        afters = frag.after_table(d)
        heaps = idx.heaps
        miss = _MISS
        added = 0
        for sid, keys in c.by_sid.items():
            after = miss
            for key in keys:
                _sid, free, mem = key
                if cores > free or mem < need:
                    continue
                if after is miss:
                    # asked only for a signature with a bucket that has the cores and memory
                    # (placing the GPUs is a new signature to score; most signatures near
                    # capacity have none), and the after-table first, as policies._fgd's
                    # pass does: calling frag.after for every signature made a rebuild ~30 %
                    # slower (thread time over a 1,523-node fill)
                    after = afters.get(sid, miss)
                    if after is miss:
                        after = frag.after(sid, d)
                if after is None:
                    break
                r = ranks.get(key, miss)
                if r is miss:
                    r = ranks[key] = rank_of(sid, free * 1000, mem)
                if r is None:
                    continue
                name = first.get(key)  # first_name(c, key), without a call per bucket
                if name is None:
                    name = first[key] = min(buckets[key])
                h = heaps.get(r)
                if h is None:
                    heaps[r] = [(name, key)]
                else:
                    h.append((name, key))
                added += 1
        for h in heaps.values():
            heapify(h)
        idx.entries += added

    def _add(self, idx: RankHeaps, keys) -> None:
        """Push an entry for each of ``keys`` (bucket keys read from the change log; gone ones
        skipped) that can take the shape."""
        c = self.c
        buckets = c.buckets
        first = c.first_name
        frag = c.frag
        d, cores, need, ranks, rank_of = self._args
        afters = frag.after_table(d)
        heaps = idx.heaps
        miss = _MISS
        added = 0
        for key in keys:
            sid, free, mem = key
            if cores > free or mem < need:
                continue
            bucket = buckets.get(key)
            if bucket is None:
                continue
            r = ranks.get(key, miss)
            if r is miss:
                after = afters.get(sid, miss)
                if after is miss:
                    after = frag.after(sid, d)
                r = ranks[key] = None if after is None else rank_of(sid, free * 1000, mem)
            if r is None:
                continue
            name = first.get(key)  # first_name(c, key), without a call per bucket
            if name is None:
                name = first[key] = min(bucket)
            h = heaps.get(r)
            if h is None:
                h = heaps[r] = []
            heappush(h, (name, key))
            added += 1
        idx.entries += added

    def current(self, e: Entry) -> bool:
        """True when entry ``e`` is current: its bucket exists, ``e``'s name is still the
        bucket's smallest, and the bucket is not in the shape's no-fit cache."""
        name, key = e
        c = self.c
        if key not in c.buckets or first_name(c, key) != name:
            return False
        v = self.no_fit.get(key)
        return v is None or v != c.versions[key]

    def best(self) -> int | None:
        """The best (lowest) rank that has a current entry, or None when none has."""
        heaps = self.idx.heaps
        for r in sorted(heaps):
            if self.peek(r) is not None:
                return r
            del heaps[r]
        return None

    def ranks_from(self, r: int) -> list[int]:
        """The ranks above ``r`` that have entries, in order."""
        return sorted(x for x in self.idx.heaps if x > r)

    def smallest(self, r: int, n: int) -> list[Entry]:
        """Up to ``n`` current entries of rank ``r``, by name (one per bucket); the heap is
        left as it was, less stale entries."""
        h = self.idx.heaps.get(r)
        if not h:
            return []
        out: list[Entry] = []
        seen: set[Key] = set()
        while h and len(out) < n:
            e = heappop(h)
            self.idx.entries -= 1
            if e[1] in seen or not self.current(e):
                continue
            seen.add(e[1])
            out.append(e)
        for e in out:
            heappush(h, e)
        self.idx.entries += len(out)
        return out

    def peek(self, r: int) -> Entry | None:
        """The next current entry of rank ``r`` (stale ones above it are dropped), or None."""
        h = self.idx.heaps.get(r)
        while h and not self.current(h[0]):
            heappop(h)
            self.idx.entries -= 1
        return h[0] if h else None

    def pop(self, r: int) -> None:
        """Take the entry :meth:`peek` returned off rank ``r``'s heap; :meth:`put_back` returns
        the ones still wanted."""
        heappop(self.idx.heaps[r])
        self.idx.entries -= 1

    def put_back(self, r: int, entries: list[Entry]) -> None:
        """Push entries taken with :meth:`pop` back onto rank ``r``'s heap."""
        h = self.idx.heaps.get(r)
        if h is None:
            h = self.idx.heaps[r] = []
        for e in entries:
            heappush(h, e)
        self.idx.entries += len(entries)


__all__ = ["MAX_SHAPES", "RankHeaps", "ShapeRanks", "first_name"]
