"""``fgd-mem`` and ``fgd-mem-lookahead`` (gpuspawner.simulate.paper): FGD whose fragmentation
also counts the free GPUs a type cannot use because its memory no longer fits the node
(docs/placement.md "Memory-aware fragmentation"). The paper's F looks at CPU and GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.simulate import paper_method
from gpuspawner.simulate.paper import (
    MEMORY_POLICIES,
    PAPER_POLICIES,
    Fragmentation,
    PaperCluster,
    PaperNode,
    PodType,
)

GPU_POD = PodType(1000, 1000, 1)  # one whole GPU; asks 40 GiB of memory below
CPU_POD = PodType(1000)  # CPU only; asks 30 GiB
TYPICAL = [(GPU_POD, 0.5), (CPU_POD, 0.5)]
MEMORY = {GPU_POD: 40 * 1024, CPU_POD: 30 * 1024}


def node(name: str, memory_left_gib: int) -> PaperNode:
    n = PaperNode(name, "T4", 32_000, 256 * 1024, 1)
    n.memory_left = memory_left_gib * 1024
    return n


def cluster(policy: str) -> PaperCluster:
    return PaperCluster([node("a", 60), node("b", 100)], policy, TYPICAL, seed=1,
                        type_memory=MEMORY)


@pytest.mark.parametrize("policy", ["fgd-mem", "fgd-mem-lookahead"])
def test_a_cpu_pod_does_not_take_the_memory_a_free_gpu_needs(policy: str) -> None:
    # Two nodes, one free GPU each: a has 60 GiB of memory free, b 100 GiB. A CPU-only pod of
    # 30 GiB arrives. For the paper's FGD it changes no GPU fragmentation anywhere (growth 0
    # on both, a tie that goes to a), but on a it leaves 30 GiB, under the 40 GiB the GPU
    # type asks: a's GPU is stranded (F grows by the GPU type's share of 1000 milli-GPU).
    # On b it leaves 70 GiB and both GPUs stay usable, so the memory-aware policies pick b.
    assert policy in PAPER_POLICIES and policy in MEMORY_POLICIES
    got = {}
    for p in ("fgd", "fgd-lookahead", policy):
        n, _gpu = cluster(p).choose(CPU_POD, 30 * 1024)
        got[p] = n.name
    assert got == {"fgd": "a", "fgd-lookahead": "a", policy: "b"}
    # Then two GPU pods of 40 GiB: after fgd's pick the second is refused, after ours both
    # are served.
    for p, served in (("fgd", 1), (policy, 2)):
        c = cluster(p)
        c.place(CPU_POD, 30 * 1024)
        assert sum(c.place(GPU_POD, 40 * 1024) is not None for _ in range(2)) == served


def test_without_memory_the_fragmentation_is_the_papers() -> None:
    # No memory map, or no free memory given: F is the paper's to the last bit.
    paper = Fragmentation(TYPICAL)
    ours = Fragmentation(TYPICAL, MEMORY)
    for cpu, gpus in ((32_000, [1000]), (500, [1000]), (32_000, [300, 1000])):
        assert ours.score("T4", cpu, gpus) == paper.score("T4", cpu, gpus)
    # with memory: the GPU type (p 0.5) no longer fits under 40 GiB, so half the idle GPU
    # counts on top of the CPU type's half (a CPU-only type counts all idle GPU anyway)
    assert ours.score("T4", 32_000, [1000], 50 * 1024) == 500.0
    assert ours.score("T4", 32_000, [1000], 39 * 1024) == 1000.0


def test_type_memory_is_the_lower_median_of_the_types_pods() -> None:
    tasks = [("p1", GPU_POD, 100), ("p2", GPU_POD, 300), ("p3", GPU_POD, 200),
             ("p4", GPU_POD, 400), ("p5", CPU_POD, 7)]
    assert paper_method.type_memory(tasks) == {GPU_POD: 200, CPU_POD: 7}


TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"


@pytest.mark.skipif(not (TRACES / "openb_pod_list_multigpu50.csv").exists(),
                    reason="the Alibaba trace is not beside the checkout (../shared/data)")
def test_multigpu50_seed_42_is_pinned() -> None:
    # The per-seed figures behind docs/placement.md's `--compare --seeds 42-51` on
    # `multigpu50`, seed 42: fgd leaves 188.2 GPUs unallocated at 100 % arrived, fgd-mem
    # 174.08 and fgd-mem-lookahead 164.13. A change to the rule or the method moves them.
    from gpuspawner.simulate.traces import load_pods, read_node_rows

    rows = read_node_rows(TRACES / "openb_node_list_gpu_node.csv")
    tasks = paper_method.tasks_of(load_pods(TRACES / "openb_pod_list_multigpu50.csv"))
    got = {p: paper_method.run_paper(rows, tasks, p, 42)["unallocated_gpus"]
           for p in ("fgd", "fgd-mem", "fgd-mem-lookahead")}
    assert got == {"fgd": pytest.approx(188.2, abs=0.05),
                   "fgd-mem": pytest.approx(174.08, abs=0.005),
                   "fgd-mem-lookahead": pytest.approx(164.13, abs=0.005)}
