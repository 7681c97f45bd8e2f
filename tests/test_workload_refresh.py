"""The learned workload of the fragmentation model is replaced only when it has moved by at
least ``refresh_tolerance`` (total variation distance), so a mix that drifts by a percent does
not clear every cached score (the cold decisions after a refresh were most of the ledger's p99
decision time, docs/placement.md "Speed")."""

from __future__ import annotations

import pytest

from gpuspawner.placement.fragmentation import REFRESH_TOLERANCE, FragmentationModel
from gpuspawner.placement.workload import PodType, workload_distance

A = PodType(4000, 1000, 1)  # one whole GPU, 4 CPUs
B = PodType(8000, 500, 1)  # a half-GPU share, 8 CPUs


def test_workload_distance() -> None:
    assert workload_distance([(A, 0.5), (B, 0.5)], [(B, 0.5), (A, 0.5)]) == 0.0
    assert workload_distance([(A, 1.0)], [(B, 1.0)]) == 1.0
    assert workload_distance([(A, 0.6), (B, 0.4)], [(A, 0.5), (B, 0.5)]) == pytest.approx(0.1)
    assert workload_distance([(A, 1.0)], [(A, 0.8), (B, 0.2)]) == pytest.approx(0.2)


def _observe(frag: FragmentationModel, a: int, b: int) -> None:
    for _ in range(a):
        frag.observe(A)
    for _ in range(b):
        frag.observe(B)


def test_small_drift_keeps_the_workload_and_a_large_one_replaces_it() -> None:
    frag = FragmentationModel()
    assert frag.refresh_tolerance == REFRESH_TOLERANCE == 0.05
    _observe(frag, 8, 8)  # the first refresh, after 16: half and half
    first = frag.workload
    assert dict(first) == {A: 0.5, B: 0.5}
    sid = frag.intern(((("a100", 1000, True), ("a100", 1000, True)),))
    before = frag.score(sid, 16_000)
    # the next refresh comes 32 observations later: 25 A / 23 B is 2.1 % of mass moved
    _observe(frag, 17, 15)
    assert frag.workload is first
    assert frag.score(sid, 16_000) == before
    # 64 more A: 89 / 23, 29.5 % moved: the new mix is the workload
    _observe(frag, 64, 0)
    assert dict(frag.workload) == pytest.approx({A: 89 / 112, B: 23 / 112})


def test_tolerance_zero_adopts_every_change() -> None:
    frag = FragmentationModel(refresh_tolerance=0.0)
    _observe(frag, 8, 8)
    first = frag.workload
    _observe(frag, 17, 15)
    assert frag.workload is not first
    assert dict(frag.workload) == pytest.approx({A: 25 / 48, B: 23 / 48})


def test_a_static_workload_is_never_replaced() -> None:
    frag = FragmentationModel([(A, 1.0)])
    _observe(frag, 0, 600)
    assert frag.workload == [(A, 1.0)]
