"""The ledger's ``fgd`` decides exactly as recorded: every grant (node, GPUs, cores, NUMA
memory) and refusal of fixed scenarios (tests/placement_decisions.py), with departures, node
restrictions, drained GPUs and node states among them, matches the fixture written by the code
before the decision-latency work (50b89f7), so speed-ups cannot change decisions. The same for
``fgd-mem-lookahead`` (the default since issue 44) against decisions recorded before its speed
work."""

from __future__ import annotations

import gzip
import json

import pytest

from tests import placement_decisions as pd

EXPECTED = json.loads(gzip.open(pd.FIXTURE, "rt", encoding="utf-8").read())


def _first_difference(got: list[str], want: list[str]) -> str:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"step {i}: got {g!r}, recorded {w!r}"
    return f"lengths differ: {len(got)} vs {len(want)}"


@pytest.mark.parametrize("name", sorted(pd.SCENARIOS))
def test_fgd_decides_as_recorded(name):
    got = pd.record(name)
    assert got == EXPECTED[name], _first_difference(got, EXPECTED[name])


def test_scenarios_exercise_grants_refusals_and_departures():
    """The fixture is not trivial: each kind of step occurs, refusals with their reasons,
    drains and node states."""
    lines = [x for v in EXPECTED.values() for x in v]
    kinds = {x[0] for x in lines}
    assert kinds == {"+", "-", "!", "~"}
    reasons = {x.split()[1] for x in lines if x.startswith("!")}
    assert {"unplaced", "numa", "gpus", "cores", "no_gpu_model"} <= reasons
    health = {x.split()[1] for x in lines if x.startswith("~")}
    assert health == {"gpu", "node"}


@pytest.mark.skipif(not pd.TRACE.is_dir(), reason=f"{pd.TRACE} not present")
@pytest.mark.parametrize("name", [n for n, (size, _s, _p) in pd.TRACE_RUNS.items() if not size])
def test_fgd_decides_as_recorded_on_the_trace(name):
    size, steps, numa = pd.TRACE_RUNS[name]
    want = json.loads(pd.TRACE_DIGESTS.read_text())[name]
    got = pd.record_trace(pd.TRACE, size, steps, numa)
    assert (len(got), pd.digest(got)) == (want["steps"], want["sha256"])


@pytest.mark.slow
@pytest.mark.skipif(not pd.TRACE.is_dir(), reason=f"{pd.TRACE} not present")
@pytest.mark.parametrize("name", [n for n, (size, _s, _p) in pd.TRACE_RUNS.items() if size])
def test_fgd_decides_as_recorded_on_the_replicated_trace(name):
    size, steps, numa = pd.TRACE_RUNS[name]
    want = json.loads(pd.TRACE_DIGESTS.read_text())[name]
    got = pd.record_trace(pd.TRACE, size, steps, numa)
    assert (len(got), pd.digest(got)) == (want["steps"], want["sha256"])


# -- the default policy (fgd-mem-lookahead): the same, against decisions recorded with the code
# -- before the look-ahead's speed work (issue 44), so that work cannot change a decision --

LOOKAHEAD_EXPECTED = json.loads(gzip.open(pd.LOOKAHEAD_FIXTURE, "rt", encoding="utf-8").read())


@pytest.mark.parametrize("name", sorted(pd.SCENARIOS))
def test_lookahead_decides_as_recorded(name):
    got = pd.record(name, pd.LOOKAHEAD_POLICY)
    want = LOOKAHEAD_EXPECTED[name]
    assert got == want, _first_difference(got, want)


def test_lookahead_fixture_differs_from_fgd():
    """The recorded look-ahead decisions are not fgd's (the look-ahead acted on them)."""
    assert any(LOOKAHEAD_EXPECTED[n] != EXPECTED[n] for n in pd.SCENARIOS)


@pytest.mark.skipif(not pd.TRACE.is_dir(), reason=f"{pd.TRACE} not present")
@pytest.mark.parametrize("name", [n for n, (size, _s, _p) in pd.LOOKAHEAD_TRACE_RUNS.items()
                                  if not size])
def test_lookahead_decides_as_recorded_on_the_trace(name):
    """The benchmark's fill (benchmarks/placement.py, seed 0) to capacity, every decision."""
    size, steps, numa = pd.LOOKAHEAD_TRACE_RUNS[name]
    want = json.loads(pd.LOOKAHEAD_TRACE_DIGESTS.read_text())[name]
    got = pd.record_trace(pd.TRACE, size, steps, numa, refresh_tolerance=None,
                          policy=pd.LOOKAHEAD_POLICY)
    assert (len(got), pd.digest(got)) == (want["steps"], want["sha256"])


@pytest.mark.slow
@pytest.mark.skipif(not pd.TRACE.is_dir(), reason=f"{pd.TRACE} not present")
@pytest.mark.parametrize("name", [n for n, (size, _s, _p) in pd.LOOKAHEAD_TRACE_RUNS.items()
                                  if size])
def test_lookahead_decides_as_recorded_on_the_replicated_trace(name):
    size, steps, numa = pd.LOOKAHEAD_TRACE_RUNS[name]
    want = json.loads(pd.LOOKAHEAD_TRACE_DIGESTS.read_text())[name]
    got = pd.record_trace(pd.TRACE, size, steps, numa, refresh_tolerance=None,
                          policy=pd.LOOKAHEAD_POLICY)
    assert (len(got), pd.digest(got)) == (want["steps"], want["sha256"])
