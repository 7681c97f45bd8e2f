"""``fgd-lookahead`` (gpuspawner.simulate.paper.PaperCluster._lookahead): FGD's score first,
then, among the near-best nodes, the one after which the likely next requests can be placed
with the least fragmentation growth (docs/placement.md "Beyond FGD")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.simulate.paper import PAPER_POLICIES, PaperCluster, PaperNode, PodType


def node(name: str, left: list[int]) -> PaperNode:
    n = PaperNode(name, "T4", 32_000, 65_536, len(left))
    n.gpu_left = list(left)
    return n


def cluster(policy: str, typical) -> PaperCluster:
    return PaperCluster([node("a", [200, 1000]), node("b", [500])], policy, typical, seed=1)


#: shares of 300 and 500 milli-GPU, and a whole V100 that no node here has
SHARES = [(PodType(1000, 300, 1), 0.45), (PodType(1000, 500, 1), 0.45)]
V100 = (PodType(1000, 1000, 1, "V100"), 0.1)


def test_an_exact_fit_keeps_a_whole_gpu_for_the_next_requests() -> None:
    # Workload: shares of 300 and 500 milli-GPU, and a whole V100 (no node here has one, so
    # for it every idle milli-GPU counts: the same growth, -50, on every node for a 500
    # share). A 500 share arrives; a has a 200 hole and a free GPU, b one GPU with 500 free.
    # On a's free GPU the shares' F stays 200 (only the 200 hole is a fragment), on b it
    # stays 0: the same growth both, FGD score the same, a tie that fgd gives to a. The
    # look-ahead asks what the next request then costs: after a, a 300 share must cut a 500
    # GPU down to a useless 200 (growth +200); after b, a keeps its whole GPU and a 300 share
    # leaves 700 there (growth 0), a 500 share 500 (growth 0); the V100 fits nowhere either
    # way. So fgd-lookahead fills b exactly.
    typical = [*SHARES, V100]
    share = PodType(1000, 500, 1)
    assert "fgd-lookahead" in PAPER_POLICIES
    got = {}
    for policy in ("fgd", "fgd-lookahead"):
        c = cluster(policy, typical)
        n, gpu = c.choose(share)
        got[policy] = (n.name, gpu)
    assert got == {"fgd": ("a", 1), "fgd-lookahead": ("b", 0)}
    # Then three 300 shares: after fgd two 500 holes take one each and the third is refused;
    # after fgd-lookahead a's whole GPU takes all three (1000 -> 700 -> 400 -> 100).
    for policy, served in (("fgd", 2), ("fgd-lookahead", 3)):
        c = cluster(policy, typical)
        c.place(share)
        assert sum(c.place(PodType(1000, 300, 1)) is not None for _ in range(3)) == served


@pytest.mark.parametrize("policy", ["fgd-lookahead", "fgd-mem", "fgd-mem-lookahead"])
def test_on_shares_alone_the_policy_is_fgd(policy: str) -> None:
    # The same case with the shares alone in the workload (no type asks for whole GPUs): our
    # additions stand aside and the pick is fgd's, a's free GPU. On the paper's gpushare100
    # trace (shares and CPU-only pods only) the look-ahead and the memory term left more GPUs
    # idle than fgd (fgd-mem-lookahead +0.6 %, worse on 7 of 10 seeds, p = 0.033;
    # docs/placement.md "Share-only workloads"), and in a case like this one that is the
    # rule that holds.
    typical = [(t, 0.5) for t, _p in SHARES]
    c = cluster(policy, typical)
    assert not c.lookahead and not c.mem_aware
    n, gpu = c.choose(PodType(1000, 500, 1))
    assert (n.name, gpu) == ("a", 1)


def test_without_a_difference_ahead_the_pick_is_fgds() -> None:
    # Whole single GPUs only, both nodes untouched: every placement grows F by 0 now and
    # after, so the look-ahead sees no difference and the tie order decides, as for fgd.
    typical = [(PodType(1000, 1000, 1), 1.0)]
    one = PodType(1000, 1000, 1)
    for policy in ("fgd", "fgd-lookahead"):
        c = PaperCluster([node("a", [1000, 1000]), node("b", [1000, 1000])], policy, typical)
        assert c.choose(one) == (c.nodes[0], -1)


TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"


@pytest.mark.skipif(not (TRACES / "openb_pod_list_default.csv").exists(),
                    reason="the Alibaba trace is not beside the checkout (../shared/data)")
def test_default_trace_seed_42_is_pinned() -> None:
    # The per-seed figures docs/placement.md quotes for `--compare --seeds 42-51`: on
    # `default`, seed 42, fgd leaves 283.8 GPUs unallocated at 100 % arrived and
    # fgd-lookahead 272.4. A change to the rule, its settings or the method moves them.
    from gpuspawner.simulate import paper_method
    from gpuspawner.simulate.traces import load_pods, read_node_rows

    rows = read_node_rows(TRACES / "openb_node_list_gpu_node.csv")
    tasks = paper_method.tasks_of(load_pods(TRACES / "openb_pod_list_default.csv"))
    got = {p: paper_method.run_paper(rows, tasks, p, 42)["unallocated_gpus"]
           for p in ("fgd", "fgd-lookahead")}
    assert got == {"fgd": pytest.approx(283.8, abs=0.05),
                   "fgd-lookahead": pytest.approx(272.4, abs=0.05)}
