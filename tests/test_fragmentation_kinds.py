"""The ledger's fragmentation model computes F(n) from per-signature, per-GPU-kind values
(``FragmentationModel._kind_values``) for speed; these tests check that it is the same float
as the definition, ``sum_m p_m F(n, m)`` with :func:`type_fragmentation` per task type summed in
the workload's order (frag.go's ``NodeGpuShareFragAmountScore``), on random signatures and
workloads: several models per node, exclusive GPUs, multi-GPU and model-constrained types,
NUMA-aware or not; and that a workload refresh gives the new workload's values."""

from __future__ import annotations

import random

import pytest

from gpuspawner.placement.fragmentation import FragmentationModel, type_fragmentation
from gpuspawner.placement.workload import PodType

MODELS = ("T4", "A100", "V100M16")


def _signature(rng: random.Random) -> tuple:
    numas = []
    for _ in range(rng.choice((1, 2, 2, 4))):
        gpus = []
        for _ in range(rng.choice((0, 1, 2, 4))):
            free = rng.choice((0, 1000, 1000, 1000, 500, 340, 90, 780))
            gpus.append((rng.choice(MODELS), free, rng.random() < 0.8))
        numas.append(tuple(sorted(gpus)))
    return tuple(numas)


def _workload(rng: random.Random) -> list[tuple[PodType, float]]:
    types = set()
    while len(types) < rng.randint(3, 30):
        cpu = rng.choice((500, 1000, 4000, 8000, 16000, 32000))
        models = "|".join(rng.sample(MODELS, rng.choice((1, 2)))) if rng.random() < 0.3 else ""
        kind = rng.random()
        if kind < 0.2:
            types.add(PodType(cpu))
        elif kind < 0.6:
            types.add(PodType(cpu, rng.choice((100, 250, 340, 500, 780, 900)), 1, models))
        else:
            types.add(PodType(cpu, 1000, rng.choice((1, 2, 3, 4, 8)), models))
    weights = [rng.random() for _ in types]
    return [(t, w / sum(weights)) for t, w in zip(sorted(types, key=repr), weights,
                                                     strict=True)]


def _reference(sig: tuple, cpu_left: int, workload, numa_aware: bool) -> float:
    total = sum(f for numa in sig for _m, f, _s in numa)
    if total == 0:
        return 0.0
    return sum(p * (total if t.milli_gpu == 0 else type_fragmentation(sig, cpu_left, t,
                                                                      numa_aware))
               for t, p in workload)


@pytest.mark.parametrize("numa_aware", [True, False])
def test_score_is_the_sum_of_type_fragmentation(numa_aware):
    rng = random.Random(5 if numa_aware else 6)
    checked = nonzero = 0
    for _ in range(40):
        workload = _workload(rng)
        model = FragmentationModel(workload, numa_aware=numa_aware)
        for _ in range(60):
            sig = _signature(rng)
            sid = model.intern(sig)
            for cpu_left in (0, 700, 4000, 12000, 64000):
                want = _reference(sig, cpu_left, workload, numa_aware)
                assert model.score(sid, cpu_left) == want, (sig, cpu_left, workload)
                checked += 1
                nonzero += want != 0
    assert checked == 40 * 60 * 5 and nonzero > checked // 2


def test_a_new_workload_gives_its_own_values():
    rng = random.Random(9)
    sigs = [_signature(rng) for _ in range(50)]
    first, second = _workload(rng), _workload(rng)
    model = FragmentationModel(first)
    ids = [model.intern(s) for s in sigs]
    for workload in (first, second, first):
        model.set_workload(workload)
        for sid, sig in zip(ids, sigs, strict=True):
            assert model.score(sid, 8000) == _reference(sig, 8000, workload, True)


def _reference_mem(sig: tuple, cpu_left: int, mem_left: int, workload, memory) -> float:
    """The memory-aware F by its definition: a type whose milli-CPU or MiB does not fit
    counts all free milli-GPU."""
    total = sum(f for numa in sig for _m, f, _s in numa)
    if total == 0:
        return 0.0
    return sum(p * (total if t.milli_gpu == 0 or mem_left < memory.get(t, 0)
                    else type_fragmentation(sig, cpu_left, t, True))
               for t, p in workload)


def test_memory_aware_score_is_the_definition():
    """The memory-aware score, computed from which types fit a node's level (a cached index
    per level), equals the definition on random signatures, free CPU and free memory, with
    types of no memory among them, whatever order the values are asked in. Free memory below
    0 (a task's memory taken from a class's lower bound) is asked of its own model: the score
    cache keys it as memory level 0, so there the first value asked of a level is kept (as
    before the index; the decisions recorded in tests/test_placement_decisions.py depend on
    that)."""
    rng = random.Random(13)
    checked = 0
    for _ in range(25):
        workload = _workload(rng)
        memory = {t: rng.choice((0, 2048, 8192, 16384, 65536)) for t, _p in workload}
        if not any(t.milli_gpu == 1000 for t, _p in workload):
            workload.append((PodType(4000, 1000, 1), 0.1))
            memory[workload[-1][0]] = 4096
        model = FragmentationModel(workload, memory_aware=True, memory=memory)
        below = FragmentationModel(workload, memory_aware=True, memory=memory)
        asked = []
        for _ in range(40):
            sig = _signature(rng)
            sid = model.intern(sig)
            assert below.intern(sig) == sid
            for cpu_left in (0, 700, 4000, 12000, 64000):
                for mem_left in (0, 2047, 2048, 9000, 70000):
                    want = _reference_mem(sig, cpu_left, mem_left, workload, memory)
                    assert model.score(sid, cpu_left, mem_left) == want, (sig, cpu_left,
                                                                          mem_left)
                    asked.append((sid, cpu_left, mem_left, want))
                    checked += 1
                want = _reference_mem(sig, cpu_left, -100, workload, memory)
                assert below.score(sid, cpu_left, -100) == want
        fresh = FragmentationModel(workload, memory_aware=True, memory=memory)
        for sid, _cpu, _mem, _want in sorted(asked):
            fresh.intern(model.signature(sid))
        for sid, cpu_left, mem_left, want in reversed(asked):
            assert fresh.score(sid, cpu_left, mem_left) == want
    assert checked == 25 * 40 * 25
