"""Property tests (hypothesis): under any sequence of reserve / release / restore, nothing is
handed out beyond capacity, and releasing everything returns every node to its initial state."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuspawner.placement import (
    GPU_MILLI,
    POLICIES,
    Allocation,
    Bundle,
    Ledger,
    Owner,
    PlacementError,
)
from tests.factories import GiB, make_node

NODES = [
    make_node("a", gpus=4, numa=2, cores=8, memory_gib=16, shareable=True, disk_gib=10,
              nvlink_pairs=[(0, 1)]),
    make_node("b", gpus=2, numa=1, cores=4, memory_gib=8, model="T4", disk_gib=5),
    make_node("c", gpus=0, numa=2, cores=6, memory_gib=8, disk_gib=5),
]

bundles = st.builds(
    Bundle,
    cores=st.integers(0, 6),
    memory_bytes=st.integers(0, 10).map(lambda n: n * GiB // 2),
    gpus=st.integers(0, 3),
    gpu_milli=st.just(0),
    gpu_models=st.sampled_from([(), ("A100",), ("T4",), ("A100", "T4")]),
    disk_bytes=st.integers(0, 4).map(lambda n: n * GiB),
    numa_policy=st.sampled_from(["strict", "prefer", "none"]),
) | st.builds(
    Bundle,
    cores=st.integers(0, 2),
    memory_bytes=st.integers(0, 4).map(lambda n: n * GiB // 4),
    gpu_milli=st.integers(1, 999),
    numa_policy=st.sampled_from(["strict", "prefer", "none"]),
)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger: Ledger | None = None
        self.live: dict[str, Allocation] = {}
        self.released: list[Allocation] = []
        self.drained: set[str] = set()
        self.n = 0

    @precondition(lambda self: self.ledger is None)
    @rule(policy=st.sampled_from(sorted(POLICIES)))
    def start(self, policy):
        self.ledger = Ledger(NODES, policy=policy, seed=1)

    @precondition(lambda self: self.ledger is not None)
    @rule(bundle=bundles)
    def reserve(self, bundle):
        self.n += 1
        try:
            a = self.ledger.reserve(bundle, Owner(f"u{self.n}"))
        except PlacementError:
            return
        assert a.memory_bytes == bundle.memory_bytes
        assert len(a.cpuset) == bundle.cores
        assert not set(a.gpu_uuids) & self.drained  # a drained GPU is never handed out
        assert a.total_gpu_milli == bundle.total_gpu_milli
        self.live[a.id] = a

    @precondition(lambda self: self.ledger is not None and self.live)
    @rule(data=st.data())
    def release(self, data):
        aid = data.draw(st.sampled_from(list(self.live)))
        self.released.append(self.ledger.release(aid))
        del self.live[aid]

    @precondition(lambda self: self.ledger is not None and (self.released or self.live))
    @rule(data=st.data())
    def restore(self, data):
        pool = self.released + list(self.live.values())
        picked = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        report = self.ledger.restore(picked)
        for aid in report.restored:
            a = next(x for x in picked if x.id == aid)
            assert aid not in self.live
            self.live[aid] = a
            self.released = [x for x in self.released if x.id != aid]

    @precondition(lambda self: self.ledger is not None)
    @rule(data=st.data())
    def drain_or_undrain(self, data):
        uuid = data.draw(st.sampled_from(sorted(g.uuid for n in NODES for g in n.gpus)))
        if uuid in self.drained:
            self.ledger.undrain_gpu(uuid)
            self.drained.discard(uuid)
        else:
            self.ledger.drain_gpu(uuid, "test")
            self.drained.add(uuid)

    @invariant()
    def never_beyond_capacity(self):
        if self.ledger is None:
            return
        assert {a.id for a in self.ledger.allocations()} == set(self.live)
        for node in NODES:
            allocs = [a for a in self.live.values() if a.node == node.name]
            milli: dict[str, int] = {}
            for a in allocs:
                for g in a.gpus:
                    milli[g.uuid] = milli.get(g.uuid, 0) + g.milli
                    if g.milli < GPU_MILLI:
                        assert node.gpu(g.uuid).shareable
            assert all(v <= GPU_MILLI for v in milli.values())
            cpus = [c for a in allocs for c in a.cpuset]
            assert len(cpus) == len(set(cpus))
            assert set(cpus) <= {c for n in node.numa_nodes for c in n.cpus}
            for numa in node.numa_nodes:
                booked = sum(b for a in allocs for nid, b in a.memory_by_numa if nid == numa.id)
                assert booked <= numa.memory_bytes
            assert sum(a.disk_bytes for a in allocs) <= node.disk_bytes
            snap = next(s for s in self.ledger.snapshot() if s["name"] == node.name)
            assert {g["uuid"]: g["milli_used"] for g in snap["gpus"] if g["milli_used"]} == milli

    def teardown(self):
        if self.ledger is None:
            return
        for aid in list(self.live):
            self.ledger.release(aid)
        for uuid in self.drained:
            self.ledger.undrain_gpu(uuid)
        fresh = Ledger(NODES).snapshot()
        assert self.ledger.snapshot() == fresh
        assert self.ledger.gpu_milli_allocated() == 0


LedgerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLedgerProperties = LedgerMachine.TestCase
