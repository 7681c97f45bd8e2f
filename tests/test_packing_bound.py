"""benchmarks/packing_bound.py: the LP bound on how much GPU demand any scheduler could place
(the cutting-stock relaxation, docs/placement.md "How much there is to win")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.simulate.paper import PodType

pytest.importorskip("scipy", reason="the LP bound needs scipy (a test dependency)")
from benchmarks import packing_bound as pb  # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"


def share(milli: int) -> PodType:
    return PodType(1000, milli, 1)


def test_dropping_the_big_shares_places_more_than_packing_them_first() -> None:
    # Three GPUs; three 810 shares and four 470 shares arrived. Packing the big ones first
    # (first-fit decreasing, or an online rule that got the 810s first) holds 3 x 810 = 2430
    # milli-GPU and refuses every 470. The best packing puts the 470s in pairs on two GPUs
    # (1880) and one 810 on the third: 2690. No fractional packing does better: two pairs use
    # up the 470s and a GPU holds at most one 810.
    types = [share(810)] * 3 + [share(470)] * 4
    assert pb.lp_bound(types, gpus=3) == pytest.approx(2690)


def test_whole_gpu_pods_take_whole_gpus() -> None:
    # Two GPUs: a 2-GPU pod (2000 milli) or a 500 share and at most half of the pod's share of
    # GPUs in the relaxation (0.5 x 2000 + 500 = 1500): the pod wins.
    types = [PodType(8000, 1000, 2), share(500)]
    assert pb.lp_bound(types, gpus=2) == pytest.approx(2000)
    # With three GPUs both fit: 2000 + 500.
    assert pb.lp_bound(types, gpus=3) == pytest.approx(2500)


def test_shares_that_fill_each_other_place_everything() -> None:
    # 600 + 400 and 300 + 300 + 400 fill two GPUs exactly: nothing left idle.
    types = [share(600), share(400), share(300), share(300), share(400)]
    assert pb.lp_bound(types, gpus=2) == pytest.approx(2000)


@pytest.mark.skipif(not (TRACES / "openb_pod_list_default.csv").exists(),
                    reason="the Alibaba trace is not beside the checkout (../shared/data)")
def test_bound_for_default_seed_42_is_pinned() -> None:
    # The figure quoted in docs/placement.md: on `default`, seed 42, no scheduler can leave
    # fewer than 187.0 GPUs unallocated at 100 % arrived (fgd leaves 283.8).
    from gpuspawner.simulate import paper_method
    from gpuspawner.simulate.traces import load_pods, read_node_rows

    rows = read_node_rows(TRACES / "openb_node_list_gpu_node.csv")
    gpus = sum(r[3] for r in rows)
    tasks = paper_method.tasks_of(load_pods(TRACES / "openb_pod_list_default.csv"))
    arrived = pb.arrived_at_100(tasks, gpus * 1000, 42)
    demand = sum(t.total_milli_gpu for t in arrived)
    assert round(demand * 100 / (gpus * 1000)) == 100
    assert (gpus * 1000 - pb.lp_bound(arrived, gpus)) / 1000 == pytest.approx(187.0, abs=0.05)
