"""The ledger's fragmentation model computes F(n) from per-signature, per-GPU-kind values
(``FragmentationModel._kind_values``) for speed; these tests check that it is the same float
as the definition, ``sum_m p_m F(n, m)`` with :func:`type_fragmentation` per task type summed in
the workload's order (frag.go's ``NodeGpuShareFragAmountScore``), on random signatures and
workloads: several models per node, exclusive GPUs, multi-GPU and model-constrained types,
NUMA-aware or not; and that a workload refresh gives the new workload's values."""

from __future__ import annotations

import random

import pytest

from gpuspawner.placement.fragmentation import Demand, FragmentationModel, apply, type_fragmentation
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


def _apply_reference(sig: tuple, d: Demand) -> tuple | None:
    """:func:`apply` as it was first written (a list per NUMA node, ``Demand.allows`` per GPU),
    before it was made cheaper for the look-ahead's new signatures."""
    if d.gpus:
        numas = [list(n) for n in sig]
        cands = []
        for i, numa in enumerate(numas):
            full = [j for j, (m, f, _s) in enumerate(numa) if f == 1000 and d.allows(m)]
            cands.append((i, full))
        single = [(len(full), i, full) for i, full in cands if len(full) >= d.gpus]
        changed = set()
        if single:
            _, i, full = min(single)
            for j in full[: d.gpus]:
                m, _f, s = numas[i][j]
                numas[i][j] = (m, 0, s)
            changed.add(i)
        else:
            left = d.gpus
            for i, full in sorted(cands, key=lambda c: -len(c[1])):
                for j in full[:left]:
                    m, _f, s = numas[i][j]
                    numas[i][j] = (m, 0, s)
                    changed.add(i)
                left -= min(left, len(full))
            if left:
                return None
        return tuple(tuple(sorted(n)) if i in changed else sig[i]
                     for i, n in enumerate(numas))
    if d.milli:
        best = None
        for i, numa in enumerate(sig):
            for j, (m, f, s) in enumerate(numa):
                if s and f >= d.milli and (best is None or f < best[0]) and d.allows(m):
                    best = (f, i, j)
        if best is None:
            return None
        f, i, j = best
        numa = list(sig[i])
        m, _f, s = numa[j]
        numa[j] = (m, f - d.milli, s)
        out = list(sig)
        out[i] = tuple(sorted(numa))
        return tuple(out)
    return sig


def test_apply_and_after_match_the_first_apply():
    """:func:`apply` (the signature after placing a demand: a NUMA node with enough full GPUs
    and the fewest, else spread from the fullest; the fullest GPU with room for a share) gives
    the signature the first version gave, on random signatures (several models, exclusive
    GPUs, 1-4 NUMA nodes) and demands (whole GPUs 1-8, shares, allowed models in either
    case, none), including the ones that do not fit; and :meth:`FragmentationModel.after`
    interns it with its free milli-GPU counted as :meth:`~FragmentationModel.intern` sums
    them."""
    rng = random.Random(21)
    model = FragmentationModel()
    fits = 0
    for _ in range(3000):
        sig = _signature(rng)
        models = frozenset(m.lower() for m in rng.sample(MODELS, rng.choice((0, 0, 1, 2))))
        if rng.random() < 0.5:
            d = Demand(rng.choice((1, 1, 2, 3, 4, 8)), 0, models, rng.random() < 0.5)
        else:
            d = Demand(0, rng.choice((0, 100, 250, 340, 500, 780, 1000)), models, False)
        want = _apply_reference(sig, d)
        assert apply(sig, d) == want, (sig, d)
        after = model.after(model.intern(sig), d)
        if want is None:
            assert after is None
            continue
        fits += 1
        assert model.signature(after) == want
        assert model.free[after] == sum(f for numa in want for _m, f, _s in numa)
    assert 1000 < fits < 2900


def test_levels_with_the_same_fitting_types_share_one_cached_score():
    """Memory-aware, where no GPU type asks 0 MiB: levels at which the same GPU types fit
    share one entry of the score cache and of the growers' memo (the caches key a level by
    its canonical one, :meth:`FragmentationModel._canonical_levels`), and every score and
    growth is still the definition's. The code before kept one entry per level (fails
    there: 1 entry per level asked)."""
    rng = random.Random(17)
    for _ in range(20):
        workload = _workload(rng)
        if not any(t.milli_gpu == 1000 for t, _p in workload):
            workload.append((PodType(4000, 1000, 1), 0.1))
        memory = {t: rng.choice((2048, 8192, 16384, 65536)) for t, _p in workload}
        model = FragmentationModel(workload, memory_aware=True, memory=memory)
        cpus = (0, 700, 4000, 5000, 12000, 20000, 64000)
        mems = (0, 2047, 2048, 5000, 9000, 16384, 30000, 70000)
        sig = ((("T4", 1000, True), ("T4", 500, True)), (("A100", 1000, True),))
        sid = model.intern(sig)
        fits = set()
        for cpu_left in cpus:
            for mem_left in mems:
                want = _reference_mem(sig, cpu_left, mem_left, workload, memory)
                assert model.score(sid, cpu_left, mem_left) == want
                fits.add(frozenset(t for t, _p in workload if t.milli_gpu
                                   and t.milli_cpu <= cpu_left and memory[t] <= mem_left))
        assert len(model._score) == len(fits) < len(cpus) * len(mems)
        d = Demand(1, 0, frozenset(), False)
        grow = model.grower(d, 4000, 2048)
        after = apply(sig, d)
        for cpu_left in cpus[2:]:
            for mem_left in mems[3:]:
                want = (_reference_mem(after, cpu_left - 4000, mem_left - 2048, workload,
                                       memory)
                        - _reference_mem(sig, cpu_left, mem_left, workload, memory))
                assert grow(sid, cpu_left, mem_left) == want
