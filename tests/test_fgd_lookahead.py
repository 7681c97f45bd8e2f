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


def test_an_exact_fit_keeps_a_whole_gpu_for_the_next_requests() -> None:
    # Workload: shares of 300 and 500 milli-GPU, half each. A 500 share arrives; a has a
    # 200 hole and a free GPU, b one GPU with 500 free. On a's free GPU it leaves [200, 500]
    # (F 200 before and after: only the 200 hole is a fragment), on b it leaves 0 (F 0 before
    # and after): growth 0 both, FGD score 50 both, a tie that fgd gives to a. The look-ahead
    # asks what the next request then costs: after a, a 300 share must cut a 500 GPU down to
    # a useless 200 (growth +200); after b, a keeps its whole GPU and a 300 share leaves 700
    # there (growth 0), a 500 share 500 (growth 0). So fgd-lookahead fills b exactly.
    typical = [(PodType(1000, 300, 1), 0.5), (PodType(1000, 500, 1), 0.5)]
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
