"""The hub's live workload prior (gpuspawner.placement.prior): decay, fallback, typical pods,
and the ledger feeding it."""

from __future__ import annotations

import pytest

from gpuspawner.placement import Bundle, Ledger, LivePrior, Owner, PodType
from gpuspawner.placement.prior import DAY, pod_type_of_allocation
from tests.factories import make_node

ONE = PodType(4000, 1000, 1)
SHARE = PodType(2000, 500, 1)
CPU = PodType(2000)


def test_weights_halve_every_half_life() -> None:
    p = LivePrior(half_life_days=2, min_weight=0)
    p.record(ONE, when=0.0)
    p.record(ONE, when=0.0)
    p.record(SHARE, when=2 * DAY)
    c = p.counts(when=2 * DAY)
    assert c[ONE] == pytest.approx(1.0) and c[SHARE] == pytest.approx(1.0)
    assert p.weight(when=6 * DAY) == pytest.approx(2 * 2**-3 + 2**-2)
    w = dict(p.workload(when=6 * DAY))
    assert w[SHARE] / w[ONE] == pytest.approx(1.0)  # 2 old ones weigh as much as 1 newer
    p.record(CPU, when=6 * DAY)
    w = dict(p.workload(when=6 * DAY))
    assert w[CPU] == pytest.approx(1 / 1.5)


def test_fallback_fills_a_new_hub_and_fades_out() -> None:
    p = LivePrior.from_bundles([Bundle(cores=4, gpus=1), Bundle(cores=2)], min_weight=10,
                               half_life_days=7)
    assert p.workload(when=0) == [(ONE, 0.5), (CPU, 0.5)]
    for _ in range(5):
        p.record(SHARE, when=0)
    w = dict(p.workload(when=0))  # 5 shares + 5 of fallback split over 2 types
    assert w[SHARE] == pytest.approx(0.5) and w[ONE] == pytest.approx(0.25)
    for _ in range(20):
        p.record(SHARE, when=0)
    assert p.workload(when=0) == [(SHARE, 1.0)]  # history weight >= min_weight: no fallback
    assert LivePrior().workload(when=0) is None  # no history, no fallback: learn online


def test_state_round_trip_and_errors() -> None:
    p = LivePrior(half_life_days=3)
    p.record(ONE, when=100.0)
    q = LivePrior(half_life_days=3)
    q.load(p.to_dict())
    assert q.counts(when=5 * DAY) == p.counts(when=5 * DAY)
    with pytest.raises(ValueError, match="half-life"):
        LivePrior(half_life_days=1).load(p.to_dict())
    with pytest.raises(ValueError, match="malformed"):
        q.load({"weights": 3})
    with pytest.raises(ValueError):
        LivePrior(half_life_days=0)


def test_long_gaps_stay_finite() -> None:
    p = LivePrior(half_life_days=1, min_weight=0)
    p.record(ONE, when=0.0)
    p.record(SHARE, when=2000 * DAY)  # 2**2000 would overflow without re-basing
    assert p.workload(when=2000 * DAY) == [(SHARE, 1.0)]


def test_ledger_feeds_the_prior_and_reads_it_back() -> None:
    clock = [1000.0]
    prior = LivePrior(min_weight=0, clock=lambda: clock[0])
    prior.record(PodType(8000, 1000, 2), when=0.0)  # history: pairs
    ledger = Ledger([make_node("a", gpus=4), make_node("b", gpus=4)], clock=lambda: clock[0],
                    prior=prior, prior_refresh_s=60)
    a = ledger.reserve(Bundle(cores=4, gpus=1), Owner("u"))
    assert ledger.workload == [(PodType(8000, 1000, 2), 1.0)]  # read at the first reservation
    assert prior.counts(when=clock[0])[ONE] == pytest.approx(1.0)
    assert pod_type_of_allocation(a) == ONE
    clock[0] += 61
    ledger.reserve(Bundle(cores=4, gpus=1), Owner("v"))
    assert dict(ledger.workload).keys() == {PodType(8000, 1000, 2), ONE}
    # a restart: a new ledger restores the allocations and records them again
    fresh = LivePrior(min_weight=0, clock=lambda: clock[0])
    again = Ledger([make_node("a", gpus=4), make_node("b", gpus=4)], prior=fresh)
    assert again.restore(ledger.allocations()).ok
    assert fresh.weight(when=clock[0]) == pytest.approx(2.0, rel=1e-3)
