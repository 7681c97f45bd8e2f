"""``fgd-mem-lookahead-numa``: the memory-aware look-ahead that reads a strict bundle's
candidates per NUMA node (gpuspawner.placement.numa_local; docs/placement.md "Strict NUMA and
its cost"): F per NUMA node against a direct count; under NUMA ``none`` and ``prefer`` it decides
as the default, under ``strict`` it does not, and no other policy changes."""

from __future__ import annotations

import random

import pytest

from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused, policies
from gpuspawner.placement.fragmentation import FragmentationModel, allowed_models
from gpuspawner.placement.model import GPU_MILLI
from gpuspawner.placement.numa_local import LocalF
from gpuspawner.placement.workload import PodType
from gpuspawner.simulate.traces import make_node

WORKLOAD = [(PodType(12000, 1000, 1), 0.3), (PodType(4000, 500, 1), 0.2),
            (PodType(8000, 1000, 2), 0.15), (PodType(16000, 1000, 8), 0.1),
            (PodType(6000, 1000, 1, "T4"), 0.1), (PodType(13000), 0.15)]
MEMORY = {t: m for (t, _p), m in zip(WORKLOAD, (48_000, 5_600, 30_000, 90_000, 16_000,
                                                  57_000), strict=True)}


def _direct(frag: FragmentationModel, numas) -> float:
    """F per NUMA node, counted type by type from the rule's words."""
    total = sum(f for g, _c, _m in numas for _mo, f, _s in g)
    s = 0.0
    for t, p in frag.workload:
        models = allowed_models(t)
        mib = frag.memory.get(t, 0)
        cores = -(-t.milli_cpu // 1000)
        ok = [c >= cores and m >= mib for _g, c, m in numas]
        usable = 0
        if not t.milli_gpu:
            usable = 0
        elif t.is_share:
            usable = sum(f for (g, _c, _m), fit in zip(numas, ok, strict=True) if fit
                         for mo, f, sh in g if sh and f >= t.milli_gpu
                         and (not models or mo.lower() in models))
        else:
            k = t.gpu_number
            caps = [sum(1 for mo, _f, _s in g if not models or mo.lower() in models)
                    for g, _c, _m in numas]
            fulls = [sum(1 for mo, f, _s in g if f == GPU_MILLI
                         and (not models or mo.lower() in models)) for g, _c, _m in numas]
            if max(caps) >= k:
                usable = sum(n for n, fit in zip(fulls, ok, strict=True) if fit and n >= k)
            elif (sum(c for _g, c, _m in numas) >= cores
                  and sum(m for _g, _c, m in numas) >= mib and sum(fulls) >= k):
                usable = sum(fulls)
            usable *= GPU_MILLI
        s += p * (total - usable)
    return s


def test_f_per_numa_node_is_the_direct_count() -> None:
    frag = FragmentationModel(WORKLOAD, memory_aware=True, memory=MEMORY)
    lf = LocalF(frag)
    rng = random.Random(7)
    for _ in range(400):
        numas = []
        for _n in range(rng.choice((1, 2, 2, 4))):
            gpus = tuple(sorted((rng.choice(("V100", "T4")), rng.choice((0, 0, 300, 700, 1000,
                                                                          1000)), True)
                                for _g in range(rng.choice((0, 1, 2, 4)))))
            numas.append((gpus, rng.randrange(0, 40), rng.randrange(0, 200_000)))
        numas = tuple(numas)
        assert lf.value(numas) == pytest.approx(_direct(frag, numas), abs=1e-6)


def _decisions(policy: str, numa: str, steps: int = 500) -> list[str]:
    rng = random.Random(3)
    nodes = [make_node(f"n{i:02d}", rng.choice((32, 64, 96)) * 1000,
                       rng.choice((128, 256, 512)) * 1024, rng.choice((2, 4, 8)),
                       rng.choice(("V100", "T4"))) for i in range(24)]
    led = Ledger(nodes, policy, seed=1, workload=WORKLOAD)
    led._c.frag.set_workload(WORKLOAD, memory=MEMORY)
    out = []
    for i in range(steps):
        t, _p = rng.choices(WORKLOAD, [p for _t, p in WORKLOAD])[0]
        whole = 0 if t.is_share else (t.gpu_number if t.milli_gpu else 0)
        b = Bundle(cores=t.milli_cpu // 1000, memory_bytes=MEMORY[t] << 20, gpus=whole,
                   gpu_milli=t.milli_gpu if t.is_share else 0,
                   gpu_models=tuple(x for x in t.gpu_type.split("|") if x),
                   numa_policy=numa)  # type: ignore[arg-type]
        try:
            a = led.reserve(b, Owner("u", str(i)))
        except PlacementRefused:
            out.append("-")
            continue
        out.append(f"{a.node} {sorted(a.gpu_uuids)} {sorted(a.cpuset)}")
    return out


@pytest.mark.parametrize("numa", ["none", "prefer"])
def test_it_decides_as_the_default_where_nothing_is_strict(numa: str) -> None:
    assert _decisions("fgd-mem-lookahead-numa", numa) == _decisions("fgd-mem-lookahead", numa)


def test_under_strict_numa_it_reads_numa_nodes() -> None:
    # the same arrivals: the per-NUMA reading changes some of the default's choices
    on, off = (_decisions(p, "strict") for p in ("fgd-mem-lookahead-numa", "fgd-mem-lookahead"))
    assert on != off
    # and it places at least as many of them here (a check of this mix, not a proof)
    assert on.count("-") <= off.count("-")


def test_it_is_a_memory_policy_with_the_defaults_settings() -> None:
    assert "fgd-mem-lookahead-numa" in policies.MEMORY_POLICIES
    assert policies.DEFAULT_POLICY == "fgd-mem-lookahead"
    assert policies.NUMA_LOCAL_POLICIES == {"fgd-mem-lookahead-numa": "fgd-mem-lookahead"}
