"""``fgd-mem`` and ``fgd-mem-lookahead`` on the ledger (gpuspawner.placement): FGD whose
fragmentation also counts the free GPUs a workload type cannot use because its memory no
longer fits the node (docs/placement.md "Memory-aware fragmentation"). The types' memory is
learned from the bundles seen (lower median per type) unless given; bucket keys hold a finer
memory class under these policies so that a bucket's rank stays a function of its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.fragmentation import (
    FragmentationModel,
    mem_class,
    mem_low,
)
from gpuspawner.placement.policies import MEMORY_POLICIES, POLICIES
from gpuspawner.placement.prior import LivePrior
from gpuspawner.placement.workload import PodType
from tests.factories import GiB, make_node

GPU_POD = PodType(1000, 1000, 1)  # one whole GPU; asks 40 GiB below
CPU_POD = PodType(1000)  # CPU only; asks 30 GiB
WORKLOAD = [(GPU_POD, 0.5), (CPU_POD, 0.5)]
MEMORY = {GPU_POD: 40 * 1024, CPU_POD: 30 * 1024}
CPU_BUNDLE = Bundle(cores=1, memory_bytes=30 * GiB)
GPU_BUNDLE = Bundle(cores=1, gpus=1, memory_bytes=40 * GiB)


def ledger(policy: str, memory: dict | None = MEMORY) -> Ledger:
    # a: 60 GiB, b: 100 GiB; one free GPU and 8 cores each, one NUMA node
    led = Ledger([make_node("a", gpus=1, numa=1, cores=8, memory_gib=60),
                  make_node("b", gpus=1, numa=1, cores=8, memory_gib=100)], policy,
                 workload=WORKLOAD)
    if memory is not None:
        led._c.frag.set_workload(WORKLOAD, memory=memory)
    return led


@pytest.mark.parametrize("policy", ["fgd-mem", "fgd-mem-lookahead"])
def test_a_cpu_bundle_does_not_take_the_memory_a_free_gpu_needs(policy: str) -> None:
    # A CPU-only bundle of 30 GiB changes no node's GPU fragmentation as the paper counts it
    # (growth 0 on both nodes, a tie that goes to the smaller name, a). But on a it leaves
    # 30 GiB, under the 40 GiB the GPU type asks: a's GPU is stranded, F grows by the GPU
    # type's half of 1000 milli-GPU. On b it leaves 70 GiB (read as 66: b's memory class
    # starts at 96 GiB) and both GPUs stay usable, so the memory-aware policies pick b.
    assert policy in POLICIES and policy in MEMORY_POLICIES
    picks = {p: ledger(p).reserve(CPU_BUNDLE, Owner("c")).node
             for p in ("fgd", "fgd-lookahead", policy)}
    assert picks == {"fgd": "a", "fgd-lookahead": "a", policy: "b"}
    # Then two GPU bundles of 40 GiB: after fgd's pick the second is refused, after ours
    # both are served.
    for p, served in (("fgd", 1), (policy, 2)):
        led = ledger(p)
        led.reserve(CPU_BUNDLE, Owner("c"))
        got = 0
        for i in range(2):
            try:
                led.reserve(GPU_BUNDLE, Owner("g", str(i)))
                got += 1
            except PlacementRefused:
                pass
        assert got == served, p


def test_on_shares_alone_the_memory_term_stands_aside() -> None:
    # The case above with a 500-milli share in place of the whole GPU: the memory term would
    # strand a's GPU for the share type as it does for a whole one and pick b, but on a
    # workload without a type asking for whole GPUs our additions to fgd stand aside (on the
    # paper's gpushare100 trace they left more GPUs idle than fgd, docs/placement.md
    # "Share-only workloads"), so the CPU bundle goes where fgd puts it, a.
    share = PodType(1000, 500, 1)
    workload = [(share, 0.5), (CPU_POD, 0.5)]
    for policy in ("fgd", "fgd-mem", "fgd-mem-lookahead"):
        led = Ledger([make_node("a", gpus=1, numa=1, cores=8, memory_gib=60, shareable=True),
                      make_node("b", gpus=1, numa=1, cores=8, memory_gib=100,
                                shareable=True)], policy, workload=workload)
        led._c.frag.set_workload(workload, memory={share: 40 * 1024, CPU_POD: 30 * 1024})
        assert led.reserve(CPU_BUNDLE, Owner("c")).node == "a", policy
    # with a whole-GPU type in the mix the term is back (the test above, b)
    assert ledger("fgd-mem").reserve(CPU_BUNDLE, Owner("c")).node == "b"


@pytest.mark.parametrize("gpu_bundle, node", [
    (GPU_BUNDLE, "b"),
    (Bundle(cores=1, gpu_milli=500, memory_bytes=40 * GiB), "a"),
])
def test_the_hubs_live_prior_feeds_the_memory_term(gpu_bundle: Bundle, node: str) -> None:
    # The hub's path: no static workload; a LivePrior whose fallback is the profiles'
    # bundles (as GPUSpawner builds it for a new hub), read into the fragmentation model at
    # the first reservation, and each type's memory learned from the bundles seen. With a
    # whole-GPU profile of 40 GiB beside the 30 GiB CPU-only one, the CPU bundle keeps a's
    # free GPU usable and goes to b (the first test's case); with a 40 GiB share profile
    # instead, the workload has no whole-GPU type and the pick is fgd's, a.
    prior = LivePrior.from_bundles([gpu_bundle, CPU_BUNDLE])
    shareable = gpu_bundle.gpu_milli > 0
    led = Ledger([make_node("a", gpus=1, numa=1, cores=8, memory_gib=60, shareable=shareable),
                  make_node("b", gpus=1, numa=1, cores=8, memory_gib=100,
                            shareable=shareable)], "fgd-mem-lookahead", prior=prior)
    for _ in range(8):  # 16 bundles seen: the model's first refresh point
        led.observe(gpu_bundle)
        led.observe(CPU_BUNDLE)
    assert led.reserve(CPU_BUNDLE, Owner("c")).node == node
    frag = led._c.frag
    assert {t for t, _p in frag.workload} == {t for t, _p in prior.workload()}
    assert sorted(frag.memory.values()) == [30 * 1024, 40 * 1024]
    assert frag.asks_whole_gpus() == (not shareable)


def test_the_types_memory_is_learned_as_the_lower_median() -> None:
    # No memory given: the model reads it from the bundles it sees, at its refresh points
    # (after 16, then 32, 64, ... more observations; the workload here is static). GPU
    # bundles asked 8 GiB seven times and 40 GiB nine times: the lower median (the 8th
    # smallest of 16) is 40 GiB; CPU bundles 30 GiB always. With that learned, the decision
    # above is the memory-aware one.
    led = ledger("fgd-mem", memory=None)
    frag = led._c.frag
    assert frag.memory == {}
    for _ in range(7):
        led.observe(Bundle(cores=1, gpus=1, memory_bytes=8 * GiB))
    for _ in range(8):
        led.observe(GPU_BUNDLE)
    assert frag.memory == {}  # 15 observations: the first refresh comes with the 16th
    led.observe(GPU_BUNDLE)
    assert frag.memory == {GPU_POD: 40 * 1024}
    for _ in range(31):
        led.observe(CPU_BUNDLE)
    assert frag.memory == {GPU_POD: 40 * 1024}  # the next refresh comes 32 later
    led.observe(CPU_BUNDLE)
    assert frag.memory == MEMORY
    assert led.reserve(CPU_BUNDLE, Owner("c")).node == "b"


def test_without_the_memory_term_f_is_fgds() -> None:
    # The same model with and without memory_aware, given the same memory map: without it
    # the memory arguments are ignored and F is the plain one, bit for bit.
    sig = ((("a100", 1000, False), ("a100", 1000, False)),)
    plain = FragmentationModel(WORKLOAD, memory=MEMORY)
    aware = FragmentationModel(WORKLOAD, memory=MEMORY, memory_aware=True)
    sp, sa = plain.intern(sig), aware.intern(sig)
    for cpu in (500, 8000):
        assert plain.score(sp, cpu, 10 * 1024) == plain.score(sp, cpu)
        assert aware.score(sa, cpu) == plain.score(sp, cpu)
    # memory-aware: under 40 GiB the GPU type (p 0.5) cannot use the 2000 free milli-GPU
    assert aware.score(sa, 8000, 50 * 1024) == 1000.0  # only the CPU type's half
    assert aware.score(sa, 8000, 39 * 1024) == 2000.0


def test_memory_classes_are_monotone_and_within_an_eighth() -> None:
    # The fine classes read a node's free memory as its class's lower bound: never more than
    # it has, never less than 7/8 of it (above 16 MiB), and classes keep the order of amounts,
    # so a bundle may fit only buckets of at least its own class.
    prev = -1
    for mib in [*range(0, 70_000, 97), 262_144, 786_432, 1 << 21]:
        c = mem_class(mib, True)
        assert c >= prev
        prev = c
        low = mem_low(c, True)
        assert low <= mib and mem_class(low, True) == c
        assert mib < 16 or 8 * (mib - low) <= mib
        # the coarse classes are the bit length, as before these policies
        assert mem_class(mib, False) == mib.bit_length()
        assert mem_low(mem_class(mib, False), False) <= mib


def test_switching_policy_rekeys_every_bucket() -> None:
    # fgd -> fgd-mem -> fgd on a ledger with bookings: each node stays in exactly one bucket,
    # that of its key under the policy in force, and the decision is the new policy's.
    led = ledger("fgd")
    led.reserve(Bundle(cores=2, memory_bytes=5 * GiB), Owner("x"), nodes=["b"])

    def check(fine: bool) -> None:
        c = led._c
        seen = {}
        for key, bucket in c.buckets.items():
            for name, st in bucket.items():
                assert name not in seen
                seen[name] = key
                assert key == led._bucket_key(st)
                assert key[2] == mem_class(st.free_memory() >> 20, fine)
        assert sorted(seen) == ["a", "b"]

    check(False)
    led.set_policy("fgd-mem")
    assert led._c.frag.memory_aware
    check(True)
    led._c.frag.set_workload(WORKLOAD, memory=MEMORY)
    assert led.reserve(CPU_BUNDLE, Owner("c")).node == "b"
    led.set_policy("fgd")
    assert not led._c.frag.memory_aware
    check(False)


TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"


@pytest.mark.skipif(not (TRACES / "openb_pod_list_multigpu50.csv").exists(),
                    reason="the Alibaba trace is not beside the checkout (../shared/data)")
def test_ledger_fill_on_multigpu50_seed_0_is_pinned() -> None:
    # The ledger's fill mode (whole cores, workload and memory learned online) on the
    # trace's GPU nodes, `multigpu50`, seed 0, NUMA policy none, as `gpuspawner simulate
    # --policy P --numa-policy none` prints it: fgd leaves 205.1 GPUs unallocated,
    # fgd-mem-lookahead 187.28 (docs/placement.md "Memory-aware fragmentation").
    from gpuspawner.simulate import load_nodes, load_pods, simulate_fill

    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(TRACES / "openb_pod_list_multigpu50.csv")
    got = {p: simulate_fill(nodes, pods, p, numa_policy="none", seed=0)["unallocated_gpus"]
           for p in ("fgd", "fgd-mem-lookahead")}
    assert got == {"fgd": pytest.approx(205.1, abs=0.005),
                   "fgd-mem-lookahead": pytest.approx(187.28, abs=0.005)}
