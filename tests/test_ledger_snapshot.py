"""The ledger's incremental snapshot (``Ledger.snapshot``) under any sequence of changes
(hypothesis): reserve, release, restore (also with ``replace``), adopt, GPU drains, node states,
new nodes. After each step it equals the whole walk (``Ledger._snapshot_full``) and the
snapshot of a new ledger built from the same state, and no node dict of an earlier snapshot has
changed (a node that changed got a new dict)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from benchmarks.ledger_snapshot import measure
from gpuspawner.placement import (
    GPU_MILLI,
    NODE_STATES,
    Allocation,
    Bundle,
    Ledger,
    Owner,
    PlacementError,
)
from tests.factories import GiB, make_node

NODES = [
    make_node("a", gpus=4, numa=2, cores=8, memory_gib=16, shareable=True, disk_gib=10),
    make_node("b", gpus=2, numa=1, cores=4, memory_gib=8, model="T4", disk_gib=5),
    make_node("c", gpus=0, numa=2, cores=6, memory_gib=8, disk_gib=5),
]
EXTRA = [make_node(f"x{i}", gpus=2, numa=2, cores=4, memory_gib=8, shareable=True)
         for i in range(3)]

bundles = st.builds(
    Bundle,
    cores=st.integers(0, 4),
    memory_bytes=st.integers(0, 8).map(lambda n: n * GiB // 2),
    gpus=st.integers(0, 2),
    gpu_models=st.sampled_from([(), ("A100",), ("T4",)]),
    disk_bytes=st.integers(0, 3).map(lambda n: n * GiB),
    numa_policy=st.sampled_from(["strict", "prefer", "none"]),
) | st.builds(
    Bundle,
    cores=st.integers(0, 2),
    memory_bytes=st.integers(0, 4).map(lambda n: n * GiB // 4),
    gpu_milli=st.integers(1, GPU_MILLI - 1),
    numa_policy=st.sampled_from(["prefer", "none"]),
)


def rebuilt(ledger: Ledger) -> Ledger:
    """A new ledger with the same nodes, allocations (booked in the same order), drains and
    node states as ``ledger``."""
    fresh = Ledger(ledger.nodes)
    report = fresh.restore(list(ledger._allocs.values()))
    assert not report.conflicts
    for uuid, reason in ledger.drained_gpus().items():
        fresh.drain_gpu(uuid, reason)
    for n in ledger.nodes:
        state, reason = ledger.node_state(n.name)
        if state != "up":
            fresh.set_node_state(n.name, state, reason)
    return fresh


class SnapshotMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(NODES, policy="fgd", seed=1)
        self.released: list[Allocation] = []
        self.n = 0
        self.extra = 0
        #: (an earlier snapshot, a deep copy of it then)
        self.earlier: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    @rule(bundle=bundles)
    def reserve(self, bundle):
        self.n += 1
        try:
            self.ledger.reserve(bundle, Owner(f"u{self.n}", "", ("g",)))
        except PlacementError:
            pass

    @precondition(lambda self: self.ledger.allocations())
    @rule(data=st.data())
    def release(self, data):
        a = data.draw(st.sampled_from(self.ledger.allocations()))
        self.released.append(self.ledger.release(a.id))

    @precondition(lambda self: self.released or self.ledger.allocations())
    @rule(data=st.data(), replace=st.booleans())
    def restore(self, data, replace):
        pool = self.released + self.ledger.allocations()
        picked = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        self.ledger.restore(picked, replace=replace)

    @precondition(lambda self: self.ledger.allocations())
    @rule(data=st.data())
    def adopt(self, data):
        a = data.draw(st.sampled_from(self.ledger.allocations()))
        cpus = [c for nn in self.ledger.node(a.node).numa_nodes for c in nn.cpus]
        new = data.draw(st.permutations(cpus))[:len(a.cpuset)]
        try:
            self.ledger.adopt(a.id, cpuset=new)
        except PlacementError:
            pass  # held by another: nothing changed

    @rule(data=st.data(), reason=st.sampled_from(["xid 79", "fan"]))
    def drain_or_undrain(self, data, reason):
        uuids = sorted(g.uuid for n in self.ledger.nodes for g in n.gpus)
        uuid = data.draw(st.sampled_from(uuids))
        if uuid in self.ledger.drained_gpus() and data.draw(st.booleans()):
            self.ledger.undrain_gpu(uuid)
        else:
            self.ledger.drain_gpu(uuid, reason)  # a drained one: the reason changes

    @rule(data=st.data(), state=st.sampled_from(NODE_STATES),
          reason=st.sampled_from(["", "maintenance"]))
    def node_state(self, data, state, reason):
        name = data.draw(st.sampled_from([n.name for n in self.ledger.nodes]))
        self.ledger.set_node_state(name, state, reason)

    @precondition(lambda self: self.extra < len(EXTRA))
    @rule()
    def add_node(self):
        self.ledger.add_node(EXTRA[self.extra])
        self.extra += 1

    @rule()
    def keep_a_snapshot(self):
        snap = self.ledger.snapshot()
        self.earlier.append((snap, copy.deepcopy(snap)))

    @invariant()
    def snapshot_is_the_whole_walk(self):
        snap = self.ledger.snapshot()
        assert snap == self.ledger._snapshot_full()
        assert snap == rebuilt(self.ledger).snapshot()
        assert [n["name"] for n in snap] == [n.name for n in self.ledger.nodes]
        assert self.ledger.snapshot() == snap and self.ledger.snapshot() is not snap

    @invariant()
    def earlier_snapshots_are_unchanged(self):
        for kept, then in self.earlier:
            assert kept == then


SnapshotMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSnapshot = SnapshotMachine.TestCase


def test_a_node_dict_is_replaced_not_changed_and_only_where_something_changed():
    ledger = Ledger(NODES)
    before = ledger.snapshot()
    a = ledger.reserve(Bundle(cores=1, gpus=1, gpu_models=("T4",)), Owner("ann"))
    after = ledger.snapshot()
    assert a.node == "b"
    assert after[0] is before[0] and after[2] is before[2]  # untouched nodes: the same dicts
    assert after[1] is not before[1] and before[1] == Ledger(NODES).snapshot()[1]
    assert [g["holders"] for g in after[1]["gpus"]][0][0]["user"] == "ann"


def test_the_benchmark_runs_and_checks_both_snapshots_equal():
    r = measure(48, 3)
    assert r["nodes"] == 3 and r["repeat"] == 3
    assert r["full"]["p50_us"] > 0 and r["incremental"]["p50_us"] > 0
