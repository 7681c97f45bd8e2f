"""Tests of the trace simulator (the gpuspawner.simulate package) on small fixtures in
tests/data/trace/ and, when the shared data folder is there, on the Alibaba GPU trace itself."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuspawner import simulate as sim
from gpuspawner.placement import POLICIES, PlacementRefused
from gpuspawner.placement.model import Allocation, Bundle, GPULink, GPUShare, Node, Owner
from gpuspawner.simulate import engine

DATA = Path(__file__).parent / "data" / "trace"
TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "alibaba-gpu-v2023"

REQUIRED_KEYS = {
    "policy", "mode", "numa_policy", "nodes", "gpus", "pods_total", "pods_placed",
    "pods_rejected", "gpu_allocation_ratio", "unallocated_gpus", "numa_aligned_fraction",
    "decision_us_p50", "decision_us_p99", "wall_s",
}


def by_name(nodes: Sequence[Node]) -> dict[str, Node]:
    return {n.name: n for n in nodes}


# -------------------------------------------------------------------------------- loading


def test_numa_split_four_gpus_two_numa_nodes() -> None:
    node = by_name(sim.load_nodes(DATA / "numa_nodes.csv"))["gpu4"]
    assert [n.id for n in node.numa_nodes] == [0, 1]
    assert [n.cpus for n in node.numa_nodes] == [tuple(range(0, 8)), tuple(range(8, 16))]
    assert [n.memory_bytes for n in node.numa_nodes] == [32 * 2**30, 32 * 2**30]
    assert [g.numa_node for g in node.gpus] == [0, 0, 1, 1]
    assert [g.uuid for g in node.gpus] == [f"GPU-gpu4-{i}" for i in range(4)]
    assert all(g.shareable and g.model == "T4" for g in node.gpus)
    g0, g1, g2, _ = node.gpus
    assert g0.link_to(g1.uuid) == GPULink.NODE
    assert g0.link_to(g2.uuid) == GPULink.SYSTEM
    assert node.disk_bytes == 0


def test_numa_split_remainder_goes_to_lowest_ids() -> None:
    # 10500 milli-CPU -> 11 cores (rounded up): 6 + 5; 3 GPUs: 2 + 1; 1001 MiB in halves
    node = by_name(sim.load_nodes(DATA / "numa_nodes.csv"))["gpu3"]
    assert [len(n.cpus) for n in node.numa_nodes] == [6, 5]
    assert node.numa_nodes[1].cpus == tuple(range(6, 11))
    assert [g.numa_node for g in node.gpus] == [0, 0, 1]
    assert [n.memory_bytes for n in node.numa_nodes] == [1001 * 2**19] * 2
    # 5 GPUs and 7 cores in 3 NUMA nodes: 2, 2, 1 GPUs and 3, 2, 2 cores; 1 MiB = 2**20 bytes
    # is 349526 + 349525 + 349525
    odd = sim.make_node("odd", 7000, 1, 5, "T4", numa_split=3)
    assert [len(n.cpus) for n in odd.numa_nodes] == [3, 2, 2]
    assert [g.numa_node for g in odd.gpus] == [0, 0, 1, 1, 2]
    assert [n.memory_bytes for n in odd.numa_nodes] == [349526, 349525, 349525]


def test_cpu_only_and_single_gpu_nodes_get_one_numa_node() -> None:
    nodes = by_name(sim.load_nodes(DATA / "numa_nodes.csv"))
    cpu = nodes["cpu"]
    assert len(cpu.numa_nodes) == 1 and cpu.gpus == ()
    assert cpu.numa_nodes[0].cpus == tuple(range(32))
    assert cpu.memory_bytes == 131072 * 2**20
    one = nodes["gpu1"]
    assert len(one.numa_nodes) == 1
    assert [g.numa_node for g in one.gpus] == [0]


def test_numa_split_parameter() -> None:
    node = by_name(sim.load_nodes(DATA / "numa_nodes.csv", numa_split=4))["gpu4"]
    assert [len(n.cpus) for n in node.numa_nodes] == [4, 4, 4, 4]
    assert [g.numa_node for g in node.gpus] == [0, 1, 2, 3]
    assert node.gpus[0].link_to(node.gpus[1].uuid) == GPULink.SYSTEM
    flat = by_name(sim.load_nodes(DATA / "numa_nodes.csv", numa_split=1))["gpu4"]
    assert len(flat.numa_nodes) == 1
    with pytest.raises(ValueError, match="numa_split"):
        sim.load_nodes(DATA / "numa_nodes.csv", numa_split=0)


def test_pod_bundles() -> None:
    pods = {p.name: p for p in sim.load_pods(DATA / "fill_pods.csv")}
    whole = pods["whole"].bundle("prefer")
    assert (whole.cores, whole.gpus, whole.gpu_milli, whole.numa_policy) == (2, 1, 0, "prefer")
    assert whole.memory_bytes == 4096 * 2**20
    share = pods["share"].bundle()
    assert (share.cores, share.gpus, share.gpu_milli) == (2, 0, 500)  # 1500 milli-CPU -> 2
    assert pods["cpu"].bundle().total_gpu_milli == 0
    pair = pods["pair"].bundle()
    assert (pair.gpus, pair.gpu_models) == (2, ("T4",))
    assert pods["whole"].creation_time == 0 and pods["whole"].deletion_time == 100
    replay = {p.name: p for p in sim.load_pods(DATA / "replay_pods.csv")}
    assert replay["e"].deletion_time is None


def test_pods_without_times(tmp_path: Path) -> None:
    path = tmp_path / "multigpu.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,8000,1024,8,1000\n")
    (pod,) = sim.load_pods(path)
    assert pod.creation_time is None and pod.deletion_time is None
    assert pod.bundle().gpus == 8
    nodes = sim.load_nodes(DATA / "fill_nodes.csv")
    with pytest.raises(ValueError, match="creation_time"):
        sim.simulate(nodes, [pod], "first-fit", "replay")


def test_malformed_csv_names_file_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(sim.TraceFormatError) as info:
        sim.load_nodes(DATA / "bad_nodes.csv")
    text = str(info.value)
    assert "bad_nodes.csv" in text and "line 3" in text and "memory_mib" in text
    assert info.value.line == 3 and info.value.column == "memory_mib"

    short = tmp_path / "short.csv"
    short.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,1000,1024,1,T4\n\ny,1000,1024\n")
    with pytest.raises(sim.TraceFormatError, match=r"short\.csv, line 4, column 'gpu'"):
        sim.load_nodes(short)

    header = tmp_path / "header.csv"
    header.write_text("name,cpu_milli,memory_mib,gpus,gpu_milli\np,1000,1024,1,1000\n")
    with pytest.raises(sim.TraceFormatError, match=r"line 1, column 'num_gpu'"):
        sim.load_pods(header)

    share = tmp_path / "share.csv"
    share.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,0\n")
    with pytest.raises(sim.TraceFormatError, match=r"line 2, column 'gpu_milli'"):
        sim.load_pods(share)

    dup = tmp_path / "dup.csv"
    dup.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,1000,1024,1,T4\nx,1000,1024,1,T4\n")
    with pytest.raises(sim.TraceFormatError, match=r"line 3, column 'sn'.*line 2"):
        sim.load_nodes(dup)

    times = tmp_path / "times.csv"
    times.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\n"
                     "p,1000,1024,0,0,soon\n")
    with pytest.raises(sim.TraceFormatError, match=r"line 2, column 'creation_time'"):
        sim.load_pods(times)


# -------------------------------------------------------------------------------- fill


def fill(policy: str = "fgd", seed: int = 0, **kw: Any) -> dict[str, Any]:
    nodes = sim.load_nodes(DATA / "fill_nodes.csv")
    pods = sim.load_pods(DATA / "fill_pods.csv")
    return sim.simulate(nodes, pods, policy, "fill", seed=seed, **kw)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_fill_stops_when_demand_reaches_capacity(policy: str) -> None:
    m = fill(policy, seed=3)
    capacity = 6000  # 4 + 2 GPUs
    assert m["nodes"] == 3 and m["gpus"] == 6
    assert m["stop"] == "capacity"
    # stops at the first arrival that brings demand to capacity: before it, demand was below
    assert capacity <= m["gpu_milli_requested"] < capacity + 2000
    assert m["pods_placed"] + m["pods_rejected"] == m["pods_total"]
    assert 0.0 < m["gpu_allocation_ratio"] <= 1.0
    assert m["unallocated_gpus"] == pytest.approx(6 * (1 - m["gpu_allocation_ratio"]))
    assert m["decision_us_p50"] <= m["decision_us_p99"]
    assert 0 < m["decision_cpu_us_p99"]
    assert m["mode"] == "fill" and m["policy"] == policy and m["numa_policy"] == "strict"


def test_fill_with_only_whole_gpu_pods_requests_exactly_capacity(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    "g,1000,1024,1,1000\nc,1000,1024,0,0\n")
    nodes = sim.load_nodes(DATA / "fill_nodes.csv")
    m = sim.simulate(nodes, sim.load_pods(pods), "first-fit", "fill", seed=1)
    assert m["gpu_milli_requested"] == 6000
    assert m["pods_rejected"] == 0
    assert m["gpu_allocation_ratio"] == 1.0 and m["unallocated_gpus"] == 0.0
    assert m["pods_total"] > 6  # CPU-only pods arrive too and add no demand


def test_fill_seed_determinism() -> None:
    timing = {"decision_us_p50", "decision_us_p99", "decision_cpu_us_p99", "decisions_per_s",
              "setup_s", "wall_s"}

    def strip(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if k not in timing}

    assert strip(fill("random", seed=7)) == strip(fill("random", seed=7))
    assert strip(fill("fgd", seed=7)) == strip(fill("fgd", seed=7))
    runs = {json.dumps(strip(fill("first-fit", seed=s)), sort_keys=True) for s in range(6)}
    assert len(runs) > 1  # the seed does change the arrival sequence


def test_refusal_reasons() -> None:
    nodes = sim.load_nodes(DATA / "replay_nodes.csv")
    pods = sim.load_pods(DATA / "replay_pods.csv")
    quick = sim.simulate(nodes, pods, "fgd", "replay")
    assert quick["rejected_reasons"] == {"unplaced": 1} and not quick["explain_refusals"]
    told = sim.simulate(nodes, pods, "fgd", "replay", explain=True)
    assert sum(told["rejected_reasons"].values()) == 1
    assert "unplaced" not in told["rejected_reasons"]


def test_fill_max_pods_cap() -> None:
    m = fill("first-fit", seed=0, max_pods=3)
    assert m["pods_total"] == 3 and m["stop"] == "max_pods"


def test_fill_needs_gpu_pods(tmp_path: Path) -> None:
    pods = tmp_path / "cpu.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nc,1000,1024,0,0\n")
    with pytest.raises(ValueError, match="ask for GPUs"):
        sim.simulate(sim.load_nodes(DATA / "fill_nodes.csv"), sim.load_pods(pods), "fgd")


def test_fill_strict_numa_keeps_pairs_on_one_numa_node(tmp_path: Path) -> None:
    pods = tmp_path / "pairs.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\npair,2000,2048,2,1000\n")
    nodes = [sim.make_node("quad", 32000, 65536, 4, "T4")]
    m = sim.simulate(nodes, sim.load_pods(pods), "first-fit", "fill", numa_policy="strict")
    assert m["pods_placed"] == 2
    assert m["numa_aligned_eligible"] == 2
    assert m["numa_aligned_fraction"] == 1.0


# -------------------------------------------------------------------------------- replay


@pytest.mark.parametrize("policy", list(POLICIES))
def test_replay_releases_at_deletion_time(policy: str) -> None:
    nodes = sim.load_nodes(DATA / "replay_nodes.csv")
    pods = sim.load_pods(DATA / "replay_pods.csv")
    m = sim.simulate(nodes, pods, policy, "replay")
    # a@0 and b@10 take both GPUs; c@50 is refused and dropped; a leaves @100 and d@100 fits;
    # d leaves @150 and e@160 fits (and never leaves)
    assert (m["pods_total"], m["pods_placed"], m["pods_rejected"]) == (5, 4, 1)
    # allocated milli-GPU over [0, 300]: 1000*10 + 2000*90 + 2000*50 + 1000*10 + 2000*40
    # + 1000*100 = 480000 -> mean 1600 of 2000
    assert m["gpu_allocation_ratio"] == pytest.approx(0.8)
    assert m["unallocated_gpus"] == pytest.approx(0.4)
    assert m["stop"] == "end"
    assert m["numa_aligned_fraction"] is None and m["numa_aligned_eligible"] == 0


def test_replay_without_departures_refuses_the_late_pods() -> None:
    nodes = sim.load_nodes(DATA / "replay_nodes.csv")
    pods = [sim.Pod(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli,
                    creation_time=p.creation_time)
            for p in sim.load_pods(DATA / "replay_pods.csv")]
    m = sim.simulate(nodes, pods, "best-fit", "replay")
    assert (m["pods_placed"], m["pods_rejected"]) == (2, 3)


def test_replay_max_pods_takes_the_earliest() -> None:
    nodes = sim.load_nodes(DATA / "replay_nodes.csv")
    m = sim.simulate(nodes, sim.load_pods(DATA / "replay_pods.csv"), "spread", "replay",
                     max_pods=3)
    assert (m["pods_total"], m["pods_placed"], m["pods_rejected"]) == (3, 2, 1)


class ScriptedLedger:
    """Stands in for the ledger: grants each bundle the next scripted (node, GPU indices)."""

    script: list[tuple[str, list[int]]] = []

    def __init__(self, nodes: Sequence[Node], policy: str = "fgd", *,
                 seed: int | None = None) -> None:
        self.nodes = by_name(nodes)
        self.script = list(type(self).script)
        self.allocated = 0

    def reserve(self, bundle: Bundle, owner: Owner, *, explain: bool = True) -> Allocation:
        if not self.script:
            raise PlacementRefused("gpus", "script exhausted")
        node, indices = self.script.pop(0)
        gpus = tuple(GPUShare(self.nodes[node].gpus[i].uuid) for i in indices)
        self.allocated += 1000 * len(gpus)
        return Allocation(Allocation.new_id(), owner, node, gpus, (), (), 0, 0)

    def release(self, allocation_id: str) -> None:
        raise AssertionError("nothing is released in this test")

    def gpu_milli_capacity(self) -> int:
        return 1000 * sum(len(n.gpus) for n in self.nodes.values())

    def gpu_milli_allocated(self) -> int:
        return self.allocated


def test_numa_aligned_fraction_counts_only_eligible_bundles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = sim.load_nodes(DATA / "fill_nodes.csv")  # n4: GPUs 0,1 on NUMA 0, 2,3 on NUMA 1
    monkeypatch.setattr(engine, "Ledger", ScriptedLedger)
    monkeypatch.setattr(ScriptedLedger, "script", [
        ("n4", [0, 1]),  # eligible, aligned
        ("n4", [1, 2]),  # eligible, split
        ("n2", [0, 1]),  # n2 has one GPU per NUMA node: not eligible
        ("n4", [0, 1, 2, 3]),  # 4 GPUs, at most 2 on one NUMA node: not eligible
    ])
    pods = [sim.Pod(f"p{i}", 1000, 1024, gpus, 1000, creation_time=float(i))
            for i, gpus in enumerate([2, 2, 2, 4, 2])]
    m = sim.simulate(nodes, pods, "fgd", "replay", numa_policy="none")
    assert (m["pods_placed"], m["pods_rejected"]) == (4, 1)
    assert m["numa_aligned_eligible"] == 2
    assert m["numa_aligned_fraction"] == 0.5


# -------------------------------------------------------------------------------- CLI


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = sim.main(["--nodes", str(DATA / "fill_nodes.csv"), "--pods",
                   str(DATA / "fill_pods.csv"), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_has_all_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "--json", "--seed", "2")
    assert rc == 0
    data = json.loads(out)
    assert REQUIRED_KEYS <= set(data)
    assert data["policy"] == "fgd-mem-lookahead" and data["mode"] == "fill" and data["seed"] == 2
    assert data["pods_placed"] + data["pods_rejected"] == data["pods_total"]


def test_cli_all_policies_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "--policy", "all", "--json", "--mode", "replay")
    assert rc == 0
    data = json.loads(out)
    assert [d["policy"] for d in data] == list(POLICIES)
    assert all(REQUIRED_KEYS <= set(d) and d["mode"] == "replay" for d in data)

    rc, out, _ = cli(capsys, "--policy", "all", "--numa-policy", "prefer")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["policy", *POLICIES]
    assert any(line.split()[:2] == ["numa_policy", "prefer"] for line in lines)
    assert len({len(line) for line in lines}) <= 2  # aligned columns (rstrip may shorten)
    names = [line.split()[0] for line in lines]
    assert len(names) == len(set(names))  # each metric once (replay's gpu_hours was repeated)

    rc, out, _ = cli(capsys, "--policy", "all", "--mode", "replay")
    names = [line.split()[0] for line in out.splitlines()]
    assert rc == 0 and names.count("gpu_hours") == 1 and names.count("span_s") == 1


def test_cli_reports_malformed_input(capsys: pytest.CaptureFixture[str]) -> None:
    rc = sim.main(["--nodes", str(DATA / "bad_nodes.csv"), "--pods",
                   str(DATA / "fill_pods.csv")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "bad_nodes.csv, line 3, column 'memory_mib'" in err


def test_add_arguments_defaults() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    args = parser.parse_args(["--nodes", "n.csv", "--pods", "p.csv"])
    assert (args.policy, args.mode, args.numa_split, args.numa_policy, args.seed, args.json) == (
        "fgd-mem-lookahead", "fill", 2, "strict", 0, False)


# -------------------------------------------------------------------------------- real trace


@pytest.mark.skipif(not TRACE.is_dir(), reason=f"{TRACE} not present")
def test_real_trace_smoke() -> None:
    nodes = sim.load_nodes(TRACE / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523
    assert sum(len(n.gpus) for n in nodes) == 6212
    eight = next(n for n in nodes if len(n.gpus) == 8)
    assert [len([g for g in eight.gpus if g.numa_node == i]) for i in (0, 1)] == [4, 4]
    pods = sim.load_pods(TRACE / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    multi = sim.load_pods(TRACE / "openb_pod_list_multigpu50.csv")
    assert len(multi) == 9061 and multi[0].creation_time is None
    m = sim.simulate(nodes, pods, "fgd", "fill", seed=0, max_pods=1500)
    assert m["pods_total"] == 1500 and m["stop"] == "max_pods"
    assert m["pods_placed"] + m["pods_rejected"] == 1500
    assert m["pods_placed"] > 1400  # an empty cluster of 6,212 GPUs takes nearly all of them
    r = sim.simulate(nodes, pods, "first-fit", "replay", max_pods=1000)
    assert r["pods_total"] == 1000
    assert 0.0 < r["gpu_allocation_ratio"] < 1.0


def test_paper_method_on_pods_without_gpus_is_an_error_not_a_hang(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pod list with no GPU demand cannot be tuned to 1.3 x GPU capacity (the method's
    step 2 would add pods for ever): the command says so and exits 2."""
    sample = Path(__file__).parent / "data" / "alibaba-gpu-v2023-sample"
    rows = (sample / "openb_pod_list_default.csv").read_text().splitlines()
    cpu_only = [rows[0]] + [r for r in rows[1:] if r.split(",")[3] == "0"]
    assert len(cpu_only) > 1
    pods = tmp_path / "cpu_pods.csv"
    pods.write_text("\n".join(cpu_only) + "\n")
    rc = sim.main(["--nodes", str(sample / "openb_node_list_gpu_node.csv"), "--pods",
                   str(pods), "--method", "paper", "--seeds", "1"])
    _, err = capsys.readouterr()
    assert rc != 0 and "needs pods that ask for GPUs" in err
