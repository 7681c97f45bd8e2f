"""The simulator's replay with the wait queue (``gpuspawner simulate --mode replay --queue``,
gpuspawner.simulate.engine.simulate_replay_queue / compare_queue): hand-made traces whose
waits are known exactly. Pure and fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner import simulate as sim
from gpuspawner.simulate import engine
from gpuspawner.simulate.traces import sample_nodes

DATA = Path(__file__).parent / "data" / "trace"
TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "alibaba-gpu-v2023"


def solo(gpus: int = 2) -> list[sim.Node]:
    """One node: 8 cores, 32 GiB, ``gpus`` T4 (NUMA split 1, so a 2-GPU pod is one NUMA
    node's)."""
    return [sim.make_node("solo", 8000, 32768, gpus, "T4", numa_split=1)]


def pod(name: str, gpus: int, created: float, deleted: float | None) -> sim.Pod:
    return sim.Pod(name, 1000, 1024, gpus, 1000 if gpus else 0, creation_time=created,
                   deletion_time=deleted)


def test_three_overlapping_two_gpu_pods_all_run_with_the_queue() -> None:
    # a [0,100), b [50,150), c [100,200) on one node of 2 GPUs; d asks for 4 GPUs
    pods = [pod("a", 2, 0, 100), pod("b", 2, 50, 150), pod("c", 2, 100, 200),
            pod("d", 4, 60, 70)]
    plain, queued = engine.compare_queue(solo(), pods, "first-fit", numa_policy="none")
    # without: b finds both GPUs taken and is dropped; a leaves at 100 before c arrives
    assert (plain["pods_placed"], plain["pods_rejected"]) == (2, 2)
    assert (plain["wait_mean_s"], plain["wait_p95_s"], plain["pods_waited"]) == (0.0, 0.0, 0)
    assert plain["gpu_hours"] == pytest.approx(2 * 200 / 3600)
    # with: d can never fit (refused at once); b waits 50 s and starts when a leaves at 100,
    # keeping its 100 s (until 200); c arrives at 100 after b took the GPUs, waits until 200
    assert (queued["pods_placed"], queued["pods_rejected"]) == (3, 1)
    assert queued["rejected_reasons"] == {"too_large": 1}
    assert queued["pods_waited"] == 2 and queued["pods_still_waiting"] == 0
    assert queued["wait_mean_s"] == pytest.approx(50.0)  # (0 + 50 + 100) / 3
    assert queued["wait_p95_s"] == 100.0 and queued["wait_max_s"] == 100.0
    assert queued["span_s"] == 300.0  # c runs [200, 300)
    assert queued["gpu_allocation_ratio"] == pytest.approx(1.0)
    assert queued["gpu_hours"] == pytest.approx(2 * 300 / 3600)


def test_idle_gpus_while_a_pod_waits_and_by_tenth_of_the_span() -> None:
    # a holds 1 of 2 GPUs over [0, 100); b asks for both at 10 and waits until 100 with one
    # GPU idle, then runs its 50 s until 150
    pods = [pod("a", 1, 0, 100), pod("b", 2, 10, 60)]
    m = engine.simulate_replay_queue(solo(), pods, "first-fit", numa_policy="none")
    assert m["pods_waited"] == 1 and m["span_s"] == 150.0
    assert m["waiting_s"] == pytest.approx(90.0)
    assert m["unallocated_gpus_waiting"] == pytest.approx(1.0)
    assert m["unallocated_gpus"] == pytest.approx(100 / 150)
    assert m["unallocated_gpus_by_tenth"] == pytest.approx([1.0] * 6 + [10 / 15] + [0.0] * 3)
    # nobody waits: no idle-while-waiting figure
    m = engine.simulate_replay_queue(solo(), [pod("a", 1, 0, 100)], "first-fit",
                                     numa_policy="none")
    assert m["waiting_s"] == 0.0 and m["unallocated_gpus_waiting"] is None
    assert m["unallocated_gpus_by_tenth"] == pytest.approx([1.0] * 10)


def test_replay_fixture_with_one_user_is_first_come_first_served() -> None:
    # solo: 2 T4; a [0,100), b [10,200), c [50,300) refused without the queue, d [100,150),
    # e from 160 on (never leaves)
    nodes = sim.load_nodes(DATA / "replay_nodes.csv")
    pods = sim.load_pods(DATA / "replay_pods.csv")
    m = engine.simulate_replay_queue(nodes, pods, "best-fit", users=1)
    # c starts at 100 (a leaves; waited 50) until 350; d arrives at 100 with b and c running,
    # starts at 200 when b leaves (waited 100) until 250; e waits from 160 until d leaves
    assert (m["pods_placed"], m["pods_rejected"], m["pods_waited"]) == (5, 0, 3)
    assert m["wait_mean_s"] == pytest.approx((0 + 0 + 50 + 100 + 90) / 5)
    assert m["wait_p95_s"] == 100.0
    # allocated GPUs: [0,10) 1, [10,350) 2, then e alone: the last event is c leaving at 350
    assert m["span_s"] == 350.0
    assert m["gpu_allocation_ratio"] == pytest.approx((1 * 10 + 2 * 340) / (2 * 350))


@pytest.mark.parametrize(("max_bypass", "waits"), [(0, [0.0, 90.0, 180.0]),
                                                   (1, [0.0, 0.0, 90.0])])
def test_max_bypass_bounds_how_often_small_pods_pass_a_blocked_big_one(
        max_bypass: int, waits: list[float]) -> None:
    # a holds 1 of 2 GPUs until 100; big (2 GPUs, 100 s) arrives at 10, small (1 GPU, 10 s)
    # at 20: it fits now, but only by passing big on big's node
    pods = [pod("a", 1, 0, 100), pod("big", 2, 10, 110), pod("small", 1, 20, 30)]
    m = engine.simulate_replay_queue(solo(), pods, "first-fit", numa_policy="none", users=1,
                                     max_bypass=max_bypass)
    assert m["pods_placed"] == 3
    # max_bypass 0: small waits for big (starts at 100, until 200): 180 s; 1: small passes
    # once and big still starts at 100
    assert m["wait_max_s"] == max(waits)
    assert m["wait_mean_s"] == pytest.approx(sum(waits) / 3)


def test_a_zero_length_pod_that_waited_leaves_right_after_it_starts() -> None:
    pods = [pod("a", 2, 0, 100), pod("z", 2, 10, 10), pod("b", 2, 20, 50)]
    m = engine.simulate_replay_queue(solo(), pods, "first-fit", numa_policy="none", users=1)
    # z starts at 100 and leaves at 100; b starts at 100 too (waited 80), runs 30 s
    assert m["pods_placed"] == 3
    assert m["wait_mean_s"] == pytest.approx((0 + 90 + 80) / 3)
    assert m["span_s"] == 130.0


def test_users_are_a_deterministic_hash_of_the_pod_name() -> None:
    assert engine.user_of("openb-pod-0000", 50) == engine.user_of("openb-pod-0000", 50)
    users = {engine.user_of(f"openb-pod-{i:04d}", 50) for i in range(2000)}
    assert users == {f"u{k}" for k in range(50)}
    assert engine.user_of("anything", 1) == "u0"
    with pytest.raises(ValueError, match="users"):
        engine.simulate_replay_queue(solo(), [pod("a", 1, 0, 1)], users=0)


def test_sample_nodes_spreads_evenly() -> None:
    nodes = [sim.make_node(f"n{i}", 1000, 1024, 1, "T4") for i in range(10)]
    assert [n.name for n in sample_nodes(nodes, 3)] == ["n0", "n3", "n6"]
    assert sample_nodes(nodes, 99) == nodes
    with pytest.raises(ValueError):
        sample_nodes(nodes, 0)


def test_cli_prints_both_runs_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodes", str(DATA / "replay_nodes.csv"), "--pods", str(DATA / "replay_pods.csv"),
            "--mode", "replay", "--queue", "--queue-users", "1", "--policy", "best-fit"]
    assert sim.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# replay replay_pods.csv on 1 nodes (2 GPUs), policy best-fit")
    assert out[1].split() == ["no", "queue", "queue"]
    rows = {line[:38].strip(): line[38:].split() for line in out[2:-1]}
    assert out[-1].startswith("# queue: unallocated GPUs by tenth of the span")
    assert len(out[-1].split(":")[-1].split()) == engine.SPAN_PARTS
    assert rows["pods started"] == ["4", "5"] and rows["pods refused"] == ["1", "0"]
    assert rows["mean wait (s)"] == ["0.0", "48.0"] and rows["p95 wait (s)"] == ["0.0", "100.0"]
    assert set(rows) == {label for label, _ in sim.report.QUEUE_ROWS}
    assert {key for _, key in sim.report.QUEUE_ROWS} == set(engine.QUEUE_KEYS)
    assert sim.main([*args[:-2], "--mode", "fill"]) == 2
    assert "--queue needs --mode replay" in capsys.readouterr().err


@pytest.mark.skipif(not TRACE.is_dir(), reason=f"{TRACE} not present")
def test_without_contention_the_queue_changes_nothing() -> None:
    # the default trace's pods never contend on the whole GPU cluster: no pod waits and the
    # two replays book exactly the same (the queue reserves through the same ledger)
    nodes = sim.load_nodes(TRACE / "openb_node_list_gpu_node.csv")
    pods = sim.load_pods(TRACE / "openb_pod_list_default.csv")
    plain, queued = engine.compare_queue(nodes, pods, "fgd", max_pods=2000)
    assert queued["pods_waited"] == 0 and queued["pods_placed"] == plain["pods_placed"] == 2000
    for key in ("gpu_allocation_ratio", "gpu_hours", "span_s", "numa_aligned_fraction"):
        assert queued[key] == plain[key]
