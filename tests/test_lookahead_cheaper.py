"""The cheaper variants of ``fgd-mem-lookahead`` (gpuspawner.placement.lookahead.SETTINGS):
the same rule over fewer next-request types (``-t3``, ``-t2``) and/or fewer candidate buckets
(``-c4``, ``-t2c4``); docs/placement.md "A cheaper look-ahead". Hand-made clusters where the
cut decides, and the simulator's paper model reading the same settings."""

from __future__ import annotations

import pytest

from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.placement import lookahead as la
from gpuspawner.placement.policies import MEMORY_POLICIES, POLICIES, demand_of
from gpuspawner.placement.workload import PodType
from gpuspawner.simulate.paper import LOOKAHEAD_POLICIES, PaperCluster, PaperNode
from gpuspawner.simulate.paper import MEMORY_POLICIES as PAPER_MEMORY
from tests.factories import make_node

SHARE_500 = PodType(1000, 500, 1)
SHARE_300 = PodType(1000, 300, 1)
V100 = PodType(1000, 1000, 1, "V100")  # a whole GPU no node here has: its F is every idle GPU
#: the 300 share, which is what separates the candidates below, is the third most likely type
WORKLOAD = [(SHARE_500, 0.4), (V100, 0.35), (SHARE_300, 0.25)]
VARIANTS = [n for n in la.SETTINGS if n not in ("fgd-lookahead", "fgd-mem-lookahead")]


def test_every_variant_is_a_memory_aware_lookahead_policy_in_both_models() -> None:
    assert la.SETTINGS["fgd-mem-lookahead"] == (la.TYPES, la.CANDIDATES) == (5, 8)
    assert VARIANTS
    for name in VARIANTS:
        types, cands = la.SETTINGS[name]
        assert types <= la.TYPES and cands <= la.CANDIDATES and (types, cands) != (5, 8)
        assert name in POLICIES and name in MEMORY_POLICIES
        assert name in LOOKAHEAD_POLICIES and name in PAPER_MEMORY


def two_nodes(policy: str, names: tuple[str, ...] = ("a",)) -> Ledger:
    """Nodes ``names`` with two shareable GPUs, one holding an 800 share (200 and 1000
    milli free), distinct by their free cores (so each is its own bucket), and ``b``: one GPU
    holding a 500 share (500 free)."""
    nodes = [make_node(n, gpus=2, cores=16 + 2 * i, shareable=True)
             for i, n in enumerate(names)]
    nodes.append(make_node("b", gpus=1, numa=1, shareable=True))
    led = Ledger(nodes, policy, workload=WORKLOAD)
    for i, n in enumerate(names):
        led.reserve(Bundle(cores=1, gpu_milli=800), Owner("x", str(i)), nodes=[n])
    led.reserve(Bundle(cores=1, gpu_milli=500), Owner("x", "b"), nodes=["b"])
    return led


def test_two_next_types_miss_what_the_third_sees() -> None:
    # A 500 share: on a it takes the free GPU (a: 200 and 500 left), on b the 500 left there.
    # Its own growth is the same on both (the shares' F does not move, the V100's falls by
    # 500), a tie fgd gives to a. After a, the next 300 share grows F by 200 wherever it goes;
    # after b, by 0 (a's whole GPU takes it). The 500 share and the V100 cost the same after
    # either. So the look-ahead over the three types fills b; over the two most likely (the
    # 500 share and the V100) it sees no difference and keeps fgd's a.
    got = {p: two_nodes(p).reserve(Bundle(cores=1, gpu_milli=500), Owner("y")).node
           for p in ("fgd-mem", "fgd-mem-lookahead", "fgd-mem-lookahead-t3",
                     "fgd-mem-lookahead-t2", "fgd-mem-lookahead-c4",
                     "fgd-mem-lookahead-t2c4")}
    assert got == {"fgd-mem": "a", "fgd-mem-lookahead": "b", "fgd-mem-lookahead-t3": "b",
                   "fgd-mem-lookahead-t2": "a", "fgd-mem-lookahead-c4": "b",
                   "fgd-mem-lookahead-t2c4": "a"}


def test_four_candidates_order_the_first_four_buckets_by_name() -> None:
    # Four a-like nodes (a0..a3, each its own bucket by its free cores) and b: over eight
    # candidates the look-ahead orders all five buckets, over four only the first four by
    # smallest node name, so b (the fifth) is left to fgd's order after them.
    names = ("a0", "a1", "a2", "a3")
    for policy, want in (("fgd-mem-lookahead", 5), ("fgd-mem-lookahead-c4", 4),
                         ("fgd-mem-lookahead-t2c4", 4)):
        led = two_nodes(policy, names)
        c = led._c
        near = [(min(nodes), key) for key, nodes in c.buckets.items()]
        assert sorted(name for name, _k in near) == [*names, "b"]
        types, cands = la.SETTINGS[policy]
        got = la.order(c.frag, c.buckets, c.created, c.lookahead, near,
                       demand_of(Bundle(cores=1, gpu_milli=500), True), 1, 0, types, cands)
        assert len(got) == want, policy
        firsts = sorted(min(c.buckets[k]) for k in got)
        assert firsts == sorted([*names, "b"])[:want], policy


def test_next_types_are_the_most_likely_k() -> None:
    led = two_nodes("fgd-mem-lookahead-t2")
    frag = led._c.frag
    assert [round(p, 6) for _d, _c, p, _m, _mu in la.next_types(frag, 2)] == [
        round(0.4 / 0.75, 6), round(0.35 / 0.75, 6)]
    assert len(la.next_types(frag)) == 3  # TYPES = 5, the workload has three


@pytest.mark.parametrize("policy, want", [("fgd-mem-lookahead", "b"),
                                          ("fgd-mem-lookahead-t2", "a"),
                                          ("fgd-mem-lookahead-t3", "b")])
def test_the_paper_model_reads_the_same_settings(policy: str, want: str) -> None:
    # The same case in the simulator's paper model (milli-CPU, exact free amounts).
    a = PaperNode("a", "A100", 16000, 65536, 2)
    a.gpu_left = [200, 1000]
    a.cpu_left = 15000
    b = PaperNode("b", "A100", 16000, 65536, 1)
    b.gpu_left = [500]
    b.cpu_left = 15000
    cluster = PaperCluster([a, b], policy, WORKLOAD)
    assert cluster.la_settings == la.SETTINGS[policy]
    assert cluster.place(SHARE_500).name == want
