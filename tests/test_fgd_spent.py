"""``fgd``'s node walk remembers the buckets all of whose nodes failed a bundle shape
(``LedgerIndex.spent``, :func:`gpuspawner.placement.policies._try_keys`).

The case it is for: strict NUMA. A bucket key counts a node's free cores over all its NUMA
nodes, so a node with 1 + 1 free cores shares its bucket with nodes that have 2 on one NUMA
node, while a strict 2-core bundle needs them on one. Every later request of that shape walked
the same failing nodes again before this (at 10,000 nodes near capacity, ~110 nodes a
decision in the slowest 1 %). A spent bucket is skipped until a node joins it or grows there,
so the node chosen is the one the full walk would choose.

The cluster: nodes without GPUs (every node has the same fragmentation, so the choice is the
smallest node name with room), 2 NUMA nodes x 4 cores each."""

from __future__ import annotations

import pytest

import gpuspawner.placement.policies as policies
from gpuspawner.placement import Bundle, Ledger, Owner
from tests.factories import make_node

R = Bundle(cores=2, numa_policy="strict")  # 2 cores on one NUMA node


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The node names the policies' node walk checks, in order."""
    names: list[str] = []
    quick_fit = policies.quick_fit

    def counting(st, bundle, aligned=False):
        names.append(st.name)
        return quick_fit(st, bundle, aligned)

    monkeypatch.setattr(policies, "quick_fit", counting)
    return names


def split(ledger: Ledger, name: str) -> None:
    """Leave 1 + 1 free cores on ``name``: 3 booked on each NUMA node."""
    for i in range(2):
        ledger.reserve(Bundle(cores=3), Owner("setup", f"{name}-{i}"), nodes=[name])


@pytest.mark.parametrize("policy", ["fgd", "fgd-lookahead"])
def test_a_spent_bucket_is_skipped_until_a_node_joins_it(policy: str,
                                                         tried: list[str]) -> None:
    ledger = Ledger([make_node(n, gpus=0, cores=8) for n in ("a1", "a2", "a3", "a4", "b")],
                    policy)
    for n in ("a1", "a2", "a3"):
        split(ledger, n)
    a4 = [ledger.reserve(Bundle(cores=4), Owner("setup", f"a4-{i}"), nodes=["a4"])
          for i in range(2)]  # a4 full

    # a1-a3 have 2 free cores, 1 per NUMA node: the walk tries them, in name order, then b
    tried.clear()
    assert ledger.reserve(R, Owner("u", "r1")).node == "b"
    assert tried == ["a1", "a2", "a3", "b"]

    # the same shape again: a1-a3's bucket is spent, only b is checked (before: all four)
    tried.clear()
    assert ledger.reserve(R, Owner("u", "r2")).node == "b"
    assert tried == ["b"]

    # a4 joins that bucket (2 free cores) with both on one NUMA node: the bucket's version
    # moves, so it is walked again and a4, smaller than b, is chosen
    ledger.release(a4[0].id)
    ledger.reserve(Bundle(cores=2), Owner("setup", "a4-2"), nodes=["a4"])
    assert ledger._c.by_name["a4"].free_cpu_count() == 2
    tried.clear()
    assert ledger.reserve(R, Owner("u", "r3")).node == "a4"
    assert tried == ["a1", "a2", "a3", "a4"]

    # a node that grows out of the bucket (a release on a2: 4 + 1 free) is found too
    ledger.release(ledger.find("setup", "a2-0").id)
    assert ledger.reserve(R, Owner("u", "r4")).node == "a2"


def test_a_filtered_walk_does_not_spend_buckets(tried: list[str]) -> None:
    """A walk under a node filter (``reserve(..., nodes=...)``) rejects nodes for a reason
    of that call only: it must not mark their buckets for the unfiltered walks."""
    ledger = Ledger([make_node(n, gpus=0, cores=8) for n in ("a1", "a2", "b")], "fgd")
    ledger.reserve(Bundle(cores=3), Owner("setup", "x"), nodes=["b"])  # b in its own bucket
    assert ledger.reserve(R, Owner("u", "f"), nodes=["b"]).node == "b"  # a1, a2 filtered out
    tried.clear()
    assert ledger.reserve(R, Owner("u", "g")).node == "a1"
    assert tried == ["a1"]
