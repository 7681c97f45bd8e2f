"""Usage budgets (gpuspawner.usage.budgets): the setting's checks, the periods in the site's
time zone (DST), what a user's budgets have used, and the refusal message."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpuspawner.usage.budgets import (
    EXEMPT_SCOPE,
    BudgetConfigError,
    BudgetExceeded,
    budget_status,
    check_budgets,
    parse_budgets,
    period_bounds,
)
from gpuspawner.usage.store import UsageStore

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
