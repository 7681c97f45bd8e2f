"""benchmarks/admission_control.py: fgd that refuses GPU shares that fit (admission control),
the experiment behind docs/placement.md "How much there is to win"."""

from __future__ import annotations

import pytest

from benchmarks import admission_control as ac
from gpuspawner.simulate.paper import PaperNode, PodType, typical_pods

BIG, SMALL = PodType(1000, 810, 1), PodType(1000, 470, 1)


def cluster(rule: str, seed: int = 0) -> ac.AdmittingCluster:
    cls = type("A", (ac.AdmittingCluster,), {"rule": ac.parse_rule(rule), "seed": seed})
    nodes = [PaperNode(f"n{i}", "T4", 32_000, 65_536, 1) for i in range(2)]
    return cls(nodes, "fgd", typical_pods([BIG, SMALL]))


def test_late_rule_refuses_big_shares_that_fit_once_the_cluster_is_that_full() -> None:
    # Two GPUs. Under late:40 the first 810 is placed (0 % allocated), the second is refused
    # although the other GPU is free (810 of 2000 milli = 40.5 % allocated), and two 470s
    # then pair on that GPU: 1750 milli placed instead of 1620.
    c = cluster("late:40")
    assert c.place(BIG) is not None
    assert c.place(BIG) is None and c.refused == 1
    assert c.place(SMALL) is not None and c.place(SMALL) is not None
    assert c.gpu_used == 810 + 2 * 470
    # plain fgd places both 810s, and the 470s find no room
    p = cluster("none")
    assert p.place(BIG) is not None and p.place(BIG) is not None
    assert p.place(SMALL) is None and p.gpu_used == 1620


def test_prob_rule_refuses_only_shares_at_least_that_big_and_is_fixed_by_the_seed() -> None:
    c = cluster("prob:1:500")
    assert c.place(SMALL) is not None  # 470 < 500: never refused
    assert c.place(BIG) is None and c.refused == 1
    draws = []
    for _ in range(2):
        c = cluster("prob:0.5", seed=7)
        draws.append([c.place(BIG) is None for _ in range(2)])
    assert draws[0] == draws[1]


@pytest.mark.parametrize("bad", ["prob", "prob:1.5", "late:120", "late:50:1000", "lots:3",
                                 "none:1"])
def test_malformed_rules_are_refused_with_the_rule_named(bad: str) -> None:
    with pytest.raises(ValueError, match="rule"):
        ac.parse_rule(bad)
