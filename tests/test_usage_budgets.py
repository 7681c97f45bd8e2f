"""Usage budgets (gpuspawner.usage.budgets): the setting's checks (at hub start, naming the
field), the periods in the site's time zone (DST), what a user's budgets have used, the
refusal message, and a notebook job run refused past its budget (the jobs runner on a backend
double). The real hub: tests/test_usage_budgets_hub.py."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.hub.config_check import HubConfigError, check_spawner_settings
from gpuspawner.hub.jobs.runner import Account
from gpuspawner.hub.spawner import GPUSpawner
from gpuspawner.usage.budgets import (
    EXEMPT_SCOPE,
    BudgetConfigError,
    BudgetExceeded,
    budget_status,
    check_budgets,
    check_start,
    parse_budgets,
    period_bounds,
)
from gpuspawner.usage.hub import UsageConfigError, attach_usage
from gpuspawner.usage.store import UsageStore
from tests.test_jobs_runner import submit, until
from tests.test_jobs_runner import world as jobs_world

BERLIN = ZoneInfo("Europe/Berlin")


def t(text: str, zone=BERLIN) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


@pytest.fixture
def store(tmp_path):
    s = UsageStore(f"sqlite:///{tmp_path}/u.sqlite")
    yield s
    s.close_store()


def record(store, user, groups, start, end, gpu_milli=1000, cpu_milli=2000):
    rid = store.open({"allocation_id": f"a{start}", "user": user, "groups": groups,
                      "kind": "server", "name": "", "node": "n1", "gpu_milli": gpu_milli,
                      "cpu_milli": cpu_milli, "started": start})
    if end is not None:
        store.close(rid, end)
    return rid


@pytest.mark.parametrize("value, field", [
    ({"default": {"period": "day", "gpu_hours": 1}}, "usage_budgets.default.period"),
    ({"users": {"ann": {"gpu_hours": -1}}}, "usage_budgets.users.ann.gpu_hours"),
    ({"groups": {"phys": {"gpu_hours": True}}}, "usage_budgets.groups.phys.gpu_hours"),
    ({"groups": {"phys": {"period": "week"}}}, "usage_budgets.groups.phys: give"),
    ({"group": {}}, "usage_budgets.group: unknown key"),
    ({"users": {"ann": {"gpu_hour": 3}}}, "usage_budgets.users.ann.gpu_hour: unknown"),
    ({"users": []}, "usage_budgets.users: must be a dict"),
])
def test_bad_settings_name_the_field(value, field):
    with pytest.raises(BudgetConfigError) as e:
        parse_budgets(value)
    assert str(e.value).startswith("GPUSpawner." + field), str(e.value)


def test_bad_time_zone_is_named():
    with pytest.raises(BudgetConfigError, match="^GPUUsage.time_zone: unknown time zone"):
        parse_budgets({}, "Mars/Olympus")
    # a name too long for a file name (zoneinfo raises OSError): named too, not a traceback
    with pytest.raises(BudgetConfigError, match="^GPUUsage.time_zone: unknown time zone"):
        parse_budgets({}, "a" * 300)


def test_periods_in_the_site_zone_across_dst():
    # the week of the change to summer time (Sunday 2026-03-29) is 167 hours long
    start, renews = period_bounds("week", t("2026-03-29T12:00"), BERLIN)
    assert start == t("2026-03-23T00:00") and renews == t("2026-03-30T00:00")
    assert renews - start == 167 * 3600
    # the month of the change back (2026-10-25) has 31 days and 1 hour
    start, renews = period_bounds("month", t("2026-10-31T23:30"), BERLIN)
    assert (start, renews) == (t("2026-10-01T00:00"), t("2026-11-01T00:00"))
    assert renews - start == (31 * 24 + 1) * 3600
    # 23:30 on Oct 31 in Berlin is already November in UTC: still October's budget here
    start, _ = period_bounds("month", t("2026-12-01T00:30"), BERLIN)
    assert start == t("2026-12-01T00:00")  # 2026-11-30T23:30Z: December in Berlin
    start, renews = period_bounds("month", t("2026-12-15T00:00"), BERLIN)
    assert renews == t("2027-01-01T00:00")


def test_use_counts_only_inside_the_period_in_the_site_zone(store):
    # 2 GPU-hours on Nov 30, 22:00-24:00 Berlin (21:00-23:00 UTC): November's, not December's
    record(store, "ann", [], t("2026-11-30T22:00"), t("2026-12-01T00:00"))
    # 1.5 GPU-hours from Dec 1 00:00 Berlin (Nov 30 23:00 UTC, November in UTC)
    record(store, "ann", [], t("2026-12-01T00:00"), t("2026-12-01T01:30"))
    policy = parse_budgets({"default": {"period": "month", "gpu_hours": 2, "core_hours": 10}},
                           "Europe/Berlin")
    status = budget_status(store, policy, "ann", [], now=t("2026-12-01T02:00"))
    gpu, core = status
    assert gpu["name"] == "default" and gpu["unit"] == "gpu_hours"
    assert gpu["used"] == pytest.approx(1.5) and gpu["percent"] == 75.0
    assert not gpu["warning"] and not gpu["exceeded"]
    assert core["used"] == pytest.approx(3.0) and core["percent"] == 30.0
    assert gpu["period_start"] == "2026-12-01T00:00:00+01:00"
    assert gpu["renews_at"] == "2027-01-01T00:00:00+01:00"
    # an open record counts until now: at 02:06 ann has used 1.6 of 2 = 80 %: a warning
    record(store, "ann", [], t("2026-12-01T02:00"), None)
    gpu = budget_status(store, policy, "ann", [], now=t("2026-12-01T02:06"))[0]
    assert gpu["percent"] == 80.0 and gpu["warning"] and not gpu["exceeded"]


def test_group_budget_counts_every_member_and_refuses_with_its_figures(store):
    record(store, "ann", ["phys"], t("2026-11-02T08:00"), t("2026-11-02T12:00"))
    record(store, "bob", ["phys", "chem"], t("2026-11-03T08:00"), t("2026-11-03T14:00"))
    record(store, "cid", ["chem"], t("2026-11-03T08:00"), t("2026-11-03T20:00"))
    policy = parse_budgets({"users": {"ann": {"period": "week", "gpu_hours": 100}},
                            "groups": {"phys": {"period": "week", "gpu_hours": 10}}},
                           "Europe/Berlin")
    now = t("2026-11-04T09:00")
    status = budget_status(store, policy, "ann", ["phys"], now=now)
    assert [(s["name"], s["used"]) for s in status] == [("user ann", 4.0), ("group phys", 10.0)]
    with pytest.raises(BudgetExceeded) as e:
        check_budgets(store, policy, "ann", ["phys"], now=now)
    assert str(e.value) == ("usage budget 'group phys' is used up: 10 of 10 GPU-hours this "
                            "week; it renews at 2026-11-09T00:00:00+01:00")
    # a user out of the group now is not held by its budget; an exempt user never
    assert check_budgets(store, policy, "ann", [], now=now)[0]["used"] == 4.0
    assert check_budgets(store, policy, "ann", ["phys"], [EXEMPT_SCOPE], now=now) == []
    # next Monday the week renews
    assert check_budgets(store, policy, "ann", ["phys"], now=t("2026-11-09T00:00"))[1][
        "used"] == 0.0


world = jobs_world  # the jobs runner on a backend double, two nodes of two GPUs


def test_a_bad_budget_stops_the_hub_at_start_naming_the_field(tmp_path, world):
    """The hub's start-up checks name the field: check_spawner_settings, and attach_usage
    (which reads c.GPUUsage.time_zone beside the budgets)."""
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": [{"slug": "cpu", "cpu": 1, "memory": "1G"}],
                                "usage_budgets": {"users": {"ann": {"period": "year",
                                                                    "gpu_hours": 1}}}})
    assert str(e.value).startswith(
        "GPUSpawner.usage_budgets.users.ann.period: must be week or month"), str(e.value)
    with pytest.raises(TraitError, match="^GPUSpawner.usage_budgets.default.core_hours"):
        GPUSpawner(usage_budgets={"default": {"core_hours": 0}})
    cluster = world[1]
    config = Config({"GPUUsage": {"time_zone": "Europe/Berlln"},
                     "GPUSpawner": {"usage_budgets": {"default": {"gpu_hours": 1}}}})
    with pytest.raises(UsageConfigError, match="^GPUUsage.time_zone: unknown time zone"):
        attach_usage(cluster, config, str(tmp_path))
    config = Config({"GPUUsage": {"enabled": False},
                     "GPUSpawner": {"usage_budgets": {"default": {"gpu_hours": 1}}}})
    with pytest.raises(UsageConfigError, match="^GPUSpawner.usage_budgets: budgets count"):
        attach_usage(cluster, config, str(tmp_path))
    config = Config({"GPUUsage": {"time_zone": "Europe/Berlin"},
                     "GPUSpawner": {"usage_budgets": {"default": {"gpu_hours": 1}}}})
    rec = attach_usage(cluster, config, str(tmp_path))
    assert cluster.usage is rec and cluster.usage_budgets.time_zone == "Europe/Berlin"
    assert cluster.usage_budgets.default.limits == (("gpu_hours", 1.0),)
    rec.store.close_store()


async def test_a_job_run_past_its_budget_fails_naming_it_an_exempt_users_runs(world, store):
    """The jobs runner checks the budget at each run (JobRunner._check_usage_budget): ann's
    job fails with the message as its error and never reaches the engine; eve, exempt by her
    account's scopes, runs."""
    runner, cluster, engine = world
    now = time.time()
    start, _ = period_bounds("month", now, timezone.utc)
    for user in ("ann", "eve"):
        record(store, user, [], max(start, now - 60), now, gpu_milli=round(
            5 * 3600 * 1000 / (now - max(start, now - 60))))
    cluster.usage = SimpleNamespace(store=store)
    cluster.usage_budgets = parse_budgets({"default": {"period": "month", "gpu_hours": 5}})
    runner._account = lambda user: Account(
        (), None, frozenset({EXEMPT_SCOPE}) if user == "eve" else frozenset())
    row = await submit(runner, "ann")
    await until(lambda: row.state == "failed")
    assert row.message.startswith("not started: usage budget 'default' is used up: 5 of 5 "
                                  "GPU-hours this month; it renews at "), row.message
    assert row.get_json("error")["ename"] == "BudgetExceeded"
    assert engine.made == 0 and cluster.ledger.allocations() == []
    row = await submit(runner, "eve")
    await until(lambda: row.state == "running")
    assert engine.made == 1


def test_a_record_across_the_week_boundary_after_a_dst_change_is_cut_at_local_midnight(store):
    # Sunday 2026-03-29 (summer time from 02:00) 23:00 to Monday 01:00 Berlin: 2 hours, one
    # in each week; the week starts at Monday 00:00 Berlin = 2026-03-29T22:00Z, not at 00:00Z
    record(store, "ann", [], t("2026-03-29T23:00"), t("2026-03-30T01:00"))
    policy = parse_budgets({"default": {"period": "week", "gpu_hours": 4}}, "Europe/Berlin")
    [gpu] = budget_status(store, policy, "ann", [], now=t("2026-03-30T02:00"))
    assert gpu["used"] == pytest.approx(1.0) and gpu["period_start"] == (
        "2026-03-30T00:00:00+02:00")
    [gpu] = budget_status(store, policy, "ann", [], now=t("2026-03-29T23:30"))
    assert gpu["used"] == pytest.approx(0.5) and gpu["renews_at"] == "2026-03-30T00:00:00+02:00"
    # at 01:30 Berlin (23:30Z Sunday) the site's week holds 1 hour; a UTC week both hours
    assert budget_status(store, policy, "ann", [], now=t("2026-03-30T01:30"))[0]["used"] == 1.0
    utc = parse_budgets({"default": {"period": "week", "gpu_hours": 4}})
    assert budget_status(store, utc, "ann", [], now=t("2026-03-30T01:30"))[0]["used"] == 2.0


def test_a_group_budget_counts_its_group_only_whatever_the_name_holds(store):
    # the SQL pre-filter (LIKE on the groups' JSON) must not read '_' or '%' as wildcards
    record(store, "ann", ["a_b"], t("2026-11-02T08:00"), t("2026-11-02T09:00"))
    record(store, "bob", ["axb"], t("2026-11-02T08:00"), t("2026-11-02T10:00"))
    record(store, "cid", ["50%"], t("2026-11-02T08:00"), t("2026-11-02T11:00"))
    record(store, "dan", ["50", "5000"], t("2026-11-02T08:00"), t("2026-11-02T12:00"))
    record(store, "eve", ["Ümlaut\\"], t("2026-11-02T08:00"), t("2026-11-02T13:00"))
    spec = {"period": "month", "gpu_hours": 100}
    policy = parse_budgets({"groups": {g: spec for g in ("a_b", "axb", "50%", "Ümlaut\\")}})
    now = t("2026-11-03T00:00")
    got = {s["key"]: s["used"] for g in ("a_b", "axb", "50%", "Ümlaut\\")
           for s in budget_status(store, policy, "zed", [g], now=now)}
    assert got == {"a_b": 1.0, "axb": 2.0, "50%": 3.0, "Ümlaut\\": 5.0}


async def test_a_usage_database_that_cannot_be_read_lets_the_start_pass(store, caplog):
    policy = parse_budgets({"default": {"period": "month", "gpu_hours": 1}})
    now = time.time()  # 2 GPU-hours in the last minute (120 GPUs): past 1 GPU-hour
    record(store, "ann", [], now - 60, now, gpu_milli=120_000)
    with pytest.raises(BudgetExceeded):
        await check_start(store, policy, "ann", [])
    with store.engine.begin() as c:
        c.exec_driver_sql("DROP TABLE gpuspawner_usage")
    assert await check_start(store, policy, "ann", []) == []
    assert "usage budgets of ann not checked" in caplog.text
