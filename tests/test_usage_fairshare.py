"""Fair share over time and the usage counters (issue 41, items 5 and 6) on a real ledger and a
real SQLite usage database, no hub:

- decayed past GPU usage (:mod:`gpuspawner.usage.fairshare`): the closed form of one interval
  against a fine Riemann sum of Slurm's per-period decay, the database's grouped sum against
  the rows summed in Python, open records running until now, CPU-only and too-old records
  left out;
- the feed: the wait queue of the hub (``SpawnQueue``) gets the figures off the loop; of two
  users waiting for one GPU, the one with heavy past usage goes after the other though it
  came first, and the queue's API view says each one's factor; a closing record asks for a
  refresh;
- the counters (:class:`gpuspawner.hub.metrics.UsageCounters`): after an interval closes, the
  reserved GPU- and core-seconds grew by its seconds (within 2 %), by group and profile, with
  no user label unless asked, bounded label sets;
- ``c.GPUSpawner.fairshare_half_life``: seconds or a duration, 0/None = off, bad values named.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from traitlets import TraitError

from gpuspawner.hub.config_check import HubConfigError, check_spawner_settings
from gpuspawner.hub.metrics import UsageCounters
from gpuspawner.hub.service.views import queue_view
from gpuspawner.hub.settings import queue_settings
from gpuspawner.hub.spawn_queue import QueueSettings, SpawnQueue
from gpuspawner.hub.spawner import GPUSpawner
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.placement.queue import WaitQueue
from gpuspawner.usage.fairshare import (
    HORIZON_HALF_LIVES,
    FairShareFeed,
    decayed_gpu_seconds,
    decayed_interval,
)
from gpuspawner.usage.recorder import ClosedInterval, UsageRecorder
from gpuspawner.usage.store import UsageStore
from tests.factories import GiB, make_node

T0 = 1_790_000_000.0
HOUR, DAY = 3600.0, 86400.0
WEEK = 7 * DAY
ONE = Bundle(cores=1, gpus=1, memory_bytes=GiB, numa_policy="none")


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path: Path) -> UsageStore:
    return UsageStore(f"sqlite:///{tmp_path / 'state' / 'usage.sqlite'}")


def put(store: UsageStore, user: str, gpu_milli: int, start: float, end: float | None,
        cpu_milli: int = 1000) -> int:
    rid = store.open({"allocation_id": f"{user}-{start}", "user": user, "groups": [],
                      "kind": "server", "name": "", "profile": "p", "node": "n1",
                      "gpu_milli": gpu_milli, "cpu_milli": cpu_milli, "started": start})
    if end is not None:
        store.close(rid, end)
    return rid


# -- the figure ------------------------------------------------------------------------------
def test_one_interval_decays_as_slurms_per_period_recurrence_in_the_limit():
    """Slurm decays the usage so far by one period's factor every PriorityCalcPeriod and adds
    the period's usage; with 1-second periods that sum equals the closed form within 0.01 %."""
    now, h = T0, DAY
    start, end = now - 3 * DAY, now - DAY  # 2 GPUs for two days, ended a day ago
    exact = decayed_interval(2000, start, end, now, h)
    step, total, t = 1.0, 0.0, start
    decay = 0.5 ** (step / h)
    while t < now:  # Slurm's recurrence: usage = usage * D + this period's usage
        total = total * decay + (2.0 * step if t < end else 0.0)
        t += step
    assert exact == pytest.approx(total, rel=1e-4)
    # a day old counts half, two days a quarter: between them for a 2-day interval
    assert 2 * 2 * DAY * 0.25 < exact < 2 * 2 * DAY * 0.5
    assert decayed_interval(1000, now - HOUR, now, now, 0) == HOUR  # no half-life: no decay
    assert decayed_interval(0, start, end, now, h) == 0.0
    assert decayed_interval(1000, now, now + HOUR, now, h) == 0.0  # not begun


def test_the_database_sum_equals_the_rows_summed_here(store):
    now = T0
    put(store, "heavy", 2000, now - 10 * DAY, now - 9 * DAY)
    put(store, "heavy", 1000, now - 2 * HOUR, None)  # open: runs until now
    put(store, "light", 500, now - 3 * HOUR, now - 2 * HOUR)  # a half GPU share
    put(store, "cpu", 0, now - DAY, now)  # no GPU: no figure
    put(store, "ancient", 1000, now - 400 * DAY, now - (HORIZON_HALF_LIVES + 1) * WEEK)
    sql = decayed_gpu_seconds(store, now, WEEK)
    rows = decayed_gpu_seconds(store, now, WEEK, in_database=False)
    assert set(sql) == set(rows) == {"heavy", "light"}
    for u in sql:
        assert sql[u] == pytest.approx(rows[u], rel=1e-9)
    expect = (decayed_interval(2000, now - 10 * DAY, now - 9 * DAY, now, WEEK)
              + decayed_interval(1000, now - 2 * HOUR, now, now, WEEK))
    assert sql["heavy"] == pytest.approx(expect, rel=1e-9)
    # half a GPU for an hour, 2 to 3 hours ago: between its weights at those ages
    assert 0.5 * HOUR * 0.5 ** (3 * HOUR / WEEK) < sql["light"] < 0.5 * HOUR * 0.5 ** (
        2 * HOUR / WEEK)
    with pytest.raises(ValueError, match="half_life_s"):
        decayed_gpu_seconds(store, now, 0)


# -- the feed into the hub's queue ---------------------------------------------------------
def recorder_on(store: UsageStore, ledger: Ledger, clock: Clock) -> UsageRecorder:
    rec = UsageRecorder(store, ledger, clock=clock)
    rec.attach(ledger)
    return rec


def test_heavy_past_usage_waits_behind_light_and_the_api_says_each_factor(store):
    """Two users wait for the one GPU; heavy came first but used 40 GPU-hours yesterday,
    light used one: light starts first when the GPU frees. The queue's API view says each
    one's factor; a record that closes asks the feed for a refresh."""
    clock = Clock()
    ledger = Ledger([make_node("n1", gpus=1, numa=1)], policy="first-fit", clock=clock)
    rec = recorder_on(store, ledger, clock)
    # past usage, through the recorder as the hub books and releases
    for user, hours in (("heavy", 40), ("light", 1)):
        clock.t = T0 - DAY - hours * HOUR
        a = ledger.reserve(ONE, Owner(user, "old"))
        clock.t = T0 - DAY
        ledger.release(a.id)
    clock.t = T0
    holder = ledger.reserve(ONE, Owner("holder"))
    q = SpawnQueue(WaitQueue(ledger), QueueSettings(tick_s=0.05), clock=clock)

    class Cluster:  # what queue_view reads
        queue = q

    async def main() -> None:
        feed = FairShareFeed(store, q.set_past_usage, half_life_s=WEEK, refresh_s=30,
                             min_gap_s=0.05, clock=clock)
        rec.on_close.append(feed.poke)
        heavy = asyncio.ensure_future(q.acquire(Owner("heavy"), ONE))
        await asyncio.sleep(0.01)
        light = asyncio.ensure_future(q.acquire(Owner("light"), ONE))
        await asyncio.sleep(0.01)
        assert [e.owner.user for e in q.wq.order()] == ["heavy", "light"]  # FIFO, no figures
        feed.start()
        deadline = time.monotonic() + 5
        while feed.refreshes < 1:
            assert time.monotonic() < deadline, "the feed never refreshed"
            await asyncio.sleep(0.01)
        assert feed.last["heavy"] == pytest.approx(
            decayed_interval(1000, T0 - DAY - 40 * HOUR, T0 - DAY, T0, WEEK), rel=1e-9)
        assert [e.owner.user for e in q.wq.order()] == ["light", "heavy"]
        view = queue_view(Cluster, None, now=T0)  # type: ignore[arg-type]
        got = {e["user"]: (e["position"], e["fairshare_factor"]) for e in view["entries"]}
        assert got["light"][0] == 1 and got["heavy"][0] == 2
        assert 0 < got["heavy"][1] < got["light"][1] <= 1
        mine = queue_view(Cluster, "heavy", now=T0)["entries"]  # type: ignore[arg-type]
        assert [e["user"] for e in mine] == ["heavy"]  # a user sees only their own entry
        before = feed.refreshes
        clock.t = T0 + HOUR
        ledger.release(holder.id)  # the holder's record closes: a refresh soon
        q.kick()
        started = await asyncio.wait_for(light, 5)
        assert started.owner.user == "light" and not heavy.done()
        while feed.refreshes == before:
            assert time.monotonic() < deadline, "a closed record did not refresh the feed"
            await asyncio.sleep(0.01)
        assert feed.last["holder"] == pytest.approx(HOUR, rel=0.01)  # its hour counts now
        feed.stop()
        heavy.cancel()
    asyncio.run(main())


def test_the_feed_reads_nothing_while_nobody_waits():
    """While the queue is empty the feed never refreshes (no query of the usage database);
    it refreshes within ``min_gap_s`` of the first wait."""
    waiting = {"n": 0}
    refreshed: list[float] = []

    async def main() -> None:
        feed = FairShareFeed(None, dict, half_life_s=WEEK,  # type: ignore[arg-type]
                             refresh_s=0.05, min_gap_s=0.05, needed=lambda: waiting["n"] > 0)

        async def refresh() -> dict[str, float]:  # the database read, counted
            refreshed.append(time.monotonic())
            return {}

        feed.refresh = refresh  # type: ignore[method-assign]
        feed.start()
        await asyncio.sleep(0.4)  # eight turns of the loop with nobody waiting
        assert refreshed == []
        waiting["n"] = 1
        began = time.monotonic()
        deadline = began + 5
        while not refreshed:
            assert time.monotonic() < deadline, "no refresh after someone began to wait"
            await asyncio.sleep(0.01)
        assert refreshed[0] - began < 1.0
        feed.stop()
    asyncio.run(main())


def test_set_past_usage_leaves_the_queue_alone_when_nothing_changed():
    ledger = Ledger([make_node("n1", gpus=1, numa=1)], policy="first-fit")
    q = SpawnQueue(WaitQueue(ledger), QueueSettings())
    q.wq.add(Owner("a"), ONE)
    g = q._generation
    q.set_past_usage({"a": 5.0})
    assert q._generation == g + 1 and q.wq.past_usage == {"a": 5.0}
    q.set_past_usage({"a": 5.0})
    assert q._generation == g + 1
    with pytest.raises(ValueError):
        q.set_past_usage({"a": -1.0})


# -- the counters ---------------------------------------------------------------------------
def scrape(counters: UsageCounters) -> str:
    reg = CollectorRegistry()
    reg.register(counters)
    return generate_latest(reg).decode()


def test_a_closed_interval_grows_the_counters_by_its_seconds(store):
    clock = Clock()
    ledger = Ledger([make_node("n1", gpus=2, numa=1)], policy="first-fit", clock=clock)
    rec = UsageRecorder(store, ledger, profile_of=lambda a: "a100-2", clock=clock)
    rec.attach(ledger)
    counters = UsageCounters(clock=clock)
    rec.on_close.append(counters.count)
    counters.open_intervals = rec.open_intervals
    a = ledger.reserve(Bundle(cores=2, gpus=2, memory_bytes=GiB, numa_policy="none"),
                       Owner("ann", "", ("lab", "ai")))
    rec.add_gpu_sample(a.gpu_uuids[0], 50.0)
    rec.add_gpu_sample(a.gpu_uuids[1], 50.0)
    rec.set_cpu_seconds(a.id, 30.0)
    seen = []
    for _ in range(4):  # while it runs, the reserved counters grow with it, never back
        clock.t += 25.0
        seen.append(counters.value("reserved_gpu_seconds", "lab", "a100-2"))
    assert seen == [50.0, 100.0, 150.0, 200.0]
    assert counters.value("used_gpu_seconds", "lab", "a100-2") == 0.0  # counted at the close
    ledger.release(a.id)
    [row] = store.records()
    seconds = row.ended - row.started
    for group in ("lab", "ai"):  # in each group of the user
        assert counters.value("reserved_gpu_seconds", group, "a100-2") == pytest.approx(
            2 * seconds, rel=0.02)
        assert counters.value("reserved_core_seconds", group, "a100-2") == pytest.approx(
            2 * seconds, rel=0.02)
        assert counters.value("used_gpu_seconds", group, "a100-2") == pytest.approx(
            seconds, rel=0.02)  # 2 GPUs at 50 %
        assert counters.value("used_core_seconds", group, "a100-2") == 30.0
    text = scrape(counters)
    assert 'gpuspawner_usage_reserved_gpu_seconds_total{group="lab",profile="a100-2"} 200.0' \
        in text
    assert "# TYPE gpuspawner_usage_reserved_gpu_seconds_total counter" in text
    assert "user=" not in text and "ann" not in text  # no user label by default
    # a CPU-only interval of a user in no group: group "-", no GPU-seconds used
    b = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, numa_policy="none"), Owner("bob"))
    clock.t += 10.0
    ledger.release(b.id)
    assert counters.value("reserved_core_seconds", "-", "a100-2") == pytest.approx(10.0)
    assert counters.value("reserved_gpu_seconds", "-", "a100-2") == 0.0


def test_an_interval_adopted_after_a_restart_counts_from_the_restart():
    counters = UsageCounters(clock=Clock(T0))
    counters.count(ClosedInterval("ann", (), "p", 1000, 2000, T0 - DAY, T0 + 10.0))
    assert counters.value("reserved_gpu_seconds", "-", "p") == 10.0
    assert counters.value("reserved_core_seconds", "-", "p") == 20.0


def test_user_label_only_when_asked_and_label_sets_bounded():
    def interval(user: str, group: str) -> ClosedInterval:
        return ClosedInterval(user, (group,), "p", 1000, 1000, T0, T0 + 10.0)

    counters = UsageCounters(user_label=True, max_series=3, clock=Clock(T0 - 1))
    for i in range(5):
        counters.count(interval(f"u{i}", f"g{i}"))
    text = scrape(counters)
    assert 'user="u0"' in text and 'user="u2"' in text and 'user="u3"' not in text
    # the two over the bound count under _other: nothing is lost
    assert counters.value("reserved_gpu_seconds", "_other", "p", "_other") == 20.0
    assert text.count("gpuspawner_usage_intervals_total{") == 4


# -- the setting ----------------------------------------------------------------------------
@pytest.mark.parametrize("value, seconds", [
    ("7d", 7 * DAY), (3600, 3600.0), ("12h", 12 * HOUR), (0, 0.0), (None, 0.0)])
def test_fairshare_half_life_takes_seconds_or_a_duration(value, seconds, tmp_path):
    got = queue_settings({"fairshare_half_life": value}, f"sqlite:///{tmp_path}/h.sqlite")
    assert got.fairshare_half_life_s == seconds
    assert queue_settings({}, f"sqlite:///{tmp_path}/h.sqlite").fairshare_half_life_s == WEEK


@pytest.mark.parametrize("bad", ["soon", -1, "-2d"])
def test_a_bad_fairshare_half_life_is_named(bad):
    with pytest.raises(TraitError, match="GPUSpawner.fairshare_half_life"):
        GPUSpawner(fairshare_half_life=bad)


def test_the_default_is_a_week_as_slurms_example():
    assert math.isclose(GPUSpawner().queue_settings("sqlite:////tmp/x.sqlite")
                        .fairshare_half_life_s, WEEK)


def test_a_bad_fairshare_half_life_stops_the_hub_at_start():
    """The hub's start-up check (check_spawner_settings) names the setting."""
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": [{"slug": "cpu", "cpu": 1, "memory": "1G"}],
                                "fairshare_half_life": "soon"})
    assert str(e.value).startswith(
        "GPUSpawner.fairshare_half_life: not a duration: 'soon'"), str(e.value)
