"""The simulator's replay with elastic nodes (``gpuspawner simulate --mode replay --elastic``,
gpuspawner.simulate.elastic): hand-made traces whose waits, starts and node-hours are known
exactly. Pure and fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner import simulate as sim
from gpuspawner.simulate.cli import main
from gpuspawner.simulate.elastic import compare_elastic, simulate_replay_elastic

SAMPLE = Path(__file__).parent / "data" / "alibaba-gpu-v2023-sample"


def two() -> list[sim.Node]:
    """Node f (fixed) and node e (elastic): 8 cores, 32 GiB, 2 T4 each."""
    return [sim.make_node(n, 8000, 32768, 2, "T4", numa_split=1) for n in ("f", "e")]


def pod(name: str, created: float, deleted: float) -> sim.Pod:
    return sim.Pod(name, 1000, 1024, 2, 1000, creation_time=created, deletion_time=deleted)


def test_a_request_no_running_node_fits_waits_the_start_time_and_the_node_stops_when_idle():
    # a fills f [0, 1000); b arrives at 10: e starts at once, ready at 310, b runs 100 s
    # there [310, 410); e idles from 410 and stops at 410 + 60 = 470
    pods = [pod("a", 0, 1000), pod("b", 10, 110)]
    m = simulate_replay_elastic(
        two(), pods, "first-fit", elastic=1, start_s=300, idle_shutdown_s=60, numa_policy="none"
    )
    assert (m["pods_placed"], m["pods_rejected"], m["node_starts"]) == (2, 0, 1)
    assert m["wait_max_s"] == pytest.approx(300)
    # f for the whole span [0, 1000], e from 10 to 470
    assert m["node_hours"] == pytest.approx((1000 + 460) / 3600)


def test_idle_shutdown_trades_starts_and_waits_for_node_hours():
    # b and c need e, 500 s apart: with a short idle_shutdown e stops in between and c waits
    # for a second start; with a long one e keeps running and c starts at once
    pods = [pod("a", 0, 2000), pod("b", 10, 110), pod("c", 900, 1000)]
    fixed, short, long_ = compare_elastic(
        two(),
        pods,
        "first-fit",
        elastic=1,
        start_s=300,
        idle_shutdowns=[60, 1000],
        numa_policy="none",
    )
    assert fixed["node_hours"] == pytest.approx(2 * 2000 / 3600)
    assert (fixed["node_starts"], fixed["wait_max_s"]) == (0, 0)
    assert (short["node_starts"], short["wait_max_s"]) == (2, pytest.approx(300))
    assert (long_["node_starts"], long_["wait_max_s"]) == (1, pytest.approx(300))
    assert long_["wait_mean_s"] < short["wait_mean_s"]
    # e with 60 s: [10, 470), then c's start at 900, ready 1200, c [1200, 1300), off at 1360;
    # with 1000 s: [10, 2000), the trace's end
    assert short["node_hours"] == pytest.approx((2000 + 460 + 460) / 3600)
    assert long_["node_hours"] == pytest.approx((2000 + 1990) / 3600)
    assert short["node_hours"] < long_["node_hours"] < fixed["node_hours"]


def test_what_only_a_larger_elastic_node_could_hold_waits_instead_of_being_refused():
    nodes = [
        sim.make_node("f", 8000, 32768, 1, "T4", numa_split=1),
        sim.make_node("e", 8000, 32768, 4, "T4", numa_split=1),
    ]
    pods = [sim.Pod("big", 1000, 1024, 4, 1000, creation_time=0, deletion_time=50)]
    m = simulate_replay_elastic(
        nodes, pods, "first-fit", elastic=1, start_s=120, idle_shutdown_s=60, numa_policy="none"
    )
    assert (m["pods_placed"], m["pods_rejected"], m["wait_max_s"]) == (1, 0, 120)


def test_the_command_prints_the_curve(capsys):
    rc = main(
        [
            "--mode",
            "replay",
            "--elastic",
            "58",
            "--idle-shutdown",
            "300,3600",
            "--nodes",
            str(SAMPLE / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(SAMPLE / "openb_pod_list_default.csv"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["setting", "pods_placed"]
    assert lines[2].startswith("fixed (every node on)")
    assert [ln.split(",")[0] for ln in lines[3:]] == ["elastic 58", "elastic 58"]
    with pytest.raises(ValueError, match="elastic must be 1..2"):
        simulate_replay_elastic(two(), [], elastic=3, start_s=1, idle_shutdown_s=1)


def test_the_command_draws_the_curve_to_a_png(tmp_path, capsys):
    """``--plot FILE``: a PNG (its signature, an image of the size drawn) beside the table;
    a plot that cannot be written is an error (exit status 2), not a traceback."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    args = [
        "--mode", "replay", "--elastic", "5", "--sample-nodes", "6",
        "--idle-shutdown", "300,3600,14400",
        "--nodes", str(SAMPLE / "openb_node_list_gpu_node.csv"),
        "--pods", str(SAMPLE / "openb_pod_list_default.csv"),
    ]
    assert main([*args, "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[2].startswith("fixed (every node on)")
    assert f"curve drawn to {png}" in captured.err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (700, 450)
    assert main([*args, "--plot", str(tmp_path / "no-such-folder" / "c.png")]) == 2
    assert "error: --plot" in capsys.readouterr().err
