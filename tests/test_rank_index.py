"""``fgd``'s candidate buckets kept across decisions (:mod:`gpuspawner.placement.rank_index`)
decide as the pass over every bucket does.

Two ledgers take the same random bookings, releases, GPU drains and undrains. One decides
from its per-shape heaps, change log, no-fit and spent caches kept across decisions; the other
takes ``fgd``'s other path, a pass over every bucket, either with the same caches
(``policies.RANK_INDEX`` off) or with caches local to the decision (asked with a node filter
that admits every node, ``reserve(..., nodes=all)``). Every grant (node, GPUs, cores, memory)
and every refusal must agree. The look-ahead policies are checked against the first only:
their candidates are the near-best buckets not known to refuse the shape, and only kept
caches know which refused. The nodes come in groups of equal
hardware, so buckets hold several nodes, and the smallest-name rule, strict NUMA failures (a
bucket key counts free cores over both NUMA nodes) and names leaving and joining buckets all
occur."""

from __future__ import annotations

import random

import pytest

import gpuspawner.placement.policies as policies
import gpuspawner.placement.rank_index as rank_index
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.workload import PodType
from tests.factories import GiB, make_node

WORKLOAD = [(PodType(2000, 1000, 1), 0.3), (PodType(2000, 500, 1), 0.3),
            (PodType(4000, 1000, 2), 0.2), (PodType(3000), 0.1), (PodType(1000, 250, 1), 0.1)]

SHAPES = [Bundle(cores=2, gpus=1), Bundle(cores=2, gpu_milli=500),
          Bundle(cores=4, gpus=2), Bundle(cores=3), Bundle(cores=1, gpu_milli=250),
          Bundle(cores=6), Bundle(cores=2, memory_bytes=20 * GiB),
          Bundle(cores=1, gpu_milli=500, numa_policy="none"),
          Bundle(cores=4, gpus=2, numa_policy="prefer"),
          Bundle(cores=2, gpus=1, memory_bytes=24 * GiB),
          Bundle(cores=1, gpu_milli=500, memory_bytes=10 * GiB + 123 * 2**20)]


def nodes() -> list:
    out = []
    for g, (gpus, cores, share) in enumerate([(4, 16, True), (2, 8, True), (8, 32, False),
                                             (0, 8, False)]):
        out += [make_node(f"g{g}n{i}", gpus=gpus, cores=cores, shareable=share, memory_gib=64)
                for i in range(6)]
    return out


def step(led: Ledger, op: tuple, held: dict[int, str], every: list[str] | None = None,
         index: bool = True) -> str:
    kind, i, arg = op
    if kind == "reserve":
        policies.RANK_INDEX = index
        try:
            a = led.reserve(arg, Owner("u", str(i)), nodes=every)
        except PlacementRefused as e:
            return f"! {e.reason}"
        finally:
            policies.RANK_INDEX = True
        held[i] = a.id
        return f"+ {a.node} {[(g.uuid, g.milli) for g in a.gpus]} {a.cpuset} {a.memory_by_numa}"
    if kind == "release":
        led.release(held.pop(arg))
        return "-"
    if kind == "drain":
        led.drain_gpu(arg, "test")
    else:
        led.undrain_gpu(arg)
    return kind


#: MiB each workload type asks, for the memory-aware policies (so their ranks read memory)
MEMORY = {t: mib for (t, _p), mib in zip(WORKLOAD, (8192, 12288, 20480, 4096, 2048),
                                          strict=True)}


@pytest.mark.parametrize(("policy", "fresh"), [
    ("fgd", False), ("fgd", True), ("fgd-mem", False), ("fgd-mem", True),
    ("fgd-lookahead", False), ("fgd-mem-lookahead", False)],
    ids=lambda v: {False: "same-caches", True: "fresh-caches"}.get(v, v))
@pytest.mark.parametrize("small", [False, True], ids=["defaults", "small-store"])
def test_kept_candidates_decide_as_a_fresh_pass(policy: str, small: bool, fresh: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if small:  # the store of indexes emptied, many times over
        monkeypatch.setattr(rank_index, "MAX_SHAPES", 3)
    kept = Ledger(nodes(), policy, workload=WORKLOAD)
    ref = Ledger(nodes(), policy, workload=WORKLOAD)
    if "mem" in policy:
        for led in (kept, ref):
            led._c.frag.set_workload(WORKLOAD, memory=MEMORY)
        assert kept._c.frag._parsed() and len(kept._c.frag._mem_levels) == 5
    uuids = [g.uuid for n in kept.nodes for g in n.gpus]
    names = [n.name for n in kept.nodes]
    rng = random.Random(11)
    held_k: dict[int, str] = {}
    held_r: dict[int, str] = {}
    drained: set[str] = set()
    seen = set()
    for i in range(1500):
        x = rng.random()
        if held_k and x < 0.3:
            op = ("release", i, rng.choice(sorted(held_k)))
        elif x < 0.33:
            u = rng.choice(uuids)
            op = ("undrain" if u in drained else "drain", i, u)
            drained ^= {u}
        else:
            op = ("reserve", i, rng.choice(SHAPES))
        got = step(kept, op, held_k)
        want = step(ref, op, held_r, names) if fresh else step(ref, op, held_r, index=False)
        assert got == want, (i, op)
        seen.add(got[0])
    assert {"+", "!", "-", "d", "u"} <= seen  # grants, refusals, releases, drains happened
    c = kept._c
    assert c.rank_heaps  # the kept ledger did keep indexes
    # the changed buckets are existing ones, each once, in the order of their latest change
    assert set(c.changed) <= set(c.buckets)
    seqs = list(c.changed.values())
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[-1] < c.change_seq
