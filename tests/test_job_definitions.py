"""Job definitions without a hub or an engine: the scheduler's ticks with an injected clock
(Forbid skips while a run is active, Replace cancels it, Allow runs both, a starting deadline
runs a missed tick once late or skips it, pause/resume, a restarted scheduler never runs one
tick twice, the clocks going back do not run one wall-clock time twice), every bad input of a
definition refused naming its field, the per-user and per-group limit, the jobs database's
step to schema 3, the CLI's request."""

from __future__ import annotations

import asyncio
import copy
import secrets
from datetime import datetime, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip("croniter")
pytest.importorskip("sqlalchemy")
pytest.importorskip("traitlets")

from gpuspawner.hub.jobs.runner import JobRefused, JobRunner  # noqa: E402
from gpuspawner.hub.jobs.schedule import (  # noqa: E402
    Scheduler,
    definition_view,
    latest_tick,
    next_tick,
)
from gpuspawner.hub.jobs.settings import GPUJobs  # noqa: E402
from gpuspawner.hub.jobs.store import JobRow, JobStore, pack  # noqa: E402
from gpuspawner.hub.profiles import load_profiles  # noqa: E402
from gpuspawner.jobs.model import (  # noqa: E402
    JobInputError,
    check_schedule,
    check_timezone,
    parse_definition,
    parse_definition_update,
)
from gpuspawner.placement import Ledger  # noqa: E402
from tests.factories import make_node  # noqa: E402
from tests.test_jobs_units import LIMITS, notebook  # noqa: E402

UTC = timezone.utc
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M", "default": True},
    {"slug": "staff", "cpu": 1, "memory": "256M", "groups": ["staff"]},
    {"slug": "huge", "cpu": 1, "memory": "64T"},
]


def ts(text: str) -> float:
    """ISO 8601 with its zone -> seconds since the epoch."""
    return datetime.fromisoformat(text).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """The job runner's surface the scheduler uses: submit stores a queued job, cancel ends
    it; no cluster work."""

    def __init__(self, store: JobStore, settings: GPUJobs | None = None) -> None:
        self.store = store
        self.settings = settings or GPUJobs()
        self.refuse: Exception | None = None
        self.submitted: list[tuple[str, list[str], object]] = []
        self.cancelled: list[tuple[str, str]] = []
        ledger = Ledger([make_node("n1", gpus=0, cores=4, memory_gib=8, numa=1)],
                        policy="first-fit")
        self.cluster = SimpleNamespace(backend=SimpleNamespace(backend_name="docker"),
                                       ledger=ledger)

    def profiles(self):
        return load_profiles(PROFILES)

    def image_of(self, options, profile):  # the real rules, no site settings
        return JobRunner.image_of(SimpleNamespace(spawner={}), options, profile)

    async def submit(self, user, groups, req):
        await asyncio.sleep(0)  # a real submit awaits the cluster
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append((user, list(groups), req))
        row = JobRow(id=secrets.token_hex(16), user=user, name=req.name, profile=req.profile,
                     state="queued", time_limit=req.time_limit, notebook=pack(req.notebook),
                     created=req.at, not_before=req.at, definition_id=req.definition_id)
        row.set_json("parameters", req.parameters)
        row.set_json("history", [["queued", req.at]])
        self.store.add(row)
        return row

    async def cancel(self, row, by):
        if not row.active:
            raise JobRefused(409, "ended")
        self.cancelled.append((row.id, by))
        row.set_state("cancelled", f"cancelled by {by}")
        self.store.save()
        return row


def definition(schedule="0 * * * *", **fields):
    body = {"notebook": notebook("print(x)"), "profile": "cpu", "parameters": {"x": 1},
            "name": "hourly", "schedule": schedule, **fields}
    return parse_definition(body, LIMITS, seconds=True)


@pytest.fixture
def store(tmp_path):
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite'}")
    yield s
    s.close()


def scheduler(store, now: str, settings: GPUJobs | None = None):
    clock = Clock(ts(now))
    runner = FakeRunner(store, settings)
    return Scheduler(runner, clock=clock), runner, clock


def finish(store, job_id: str) -> None:
    row = store.get(job_id)
    row.set_state("completed", "done")
    store.save()


# -- ticks -------------------------------------------------------------------------------------
async def test_each_tick_makes_one_ordinary_job_linked_to_its_definition(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-alice", ["users"], definition("0 * * * *"))
    assert definition_view(d)["next_tick"] == "2026-03-01T10:00:00Z"
    assert await s.tick() == []  # nothing due yet
    clock.now = ts("2026-03-01T10:00:02+00:00")
    (out,) = await s.tick()
    assert out.action == "run" and out.tick == ts("2026-03-01T10:00:00+00:00")
    job = store.get(out.job_id)
    assert job.definition_id == d.id and job.user == "jd-alice" and job.name == "hourly"
    assert job.not_before == out.tick  # its "at" is the tick's time
    assert job.profile == "cpu" and job.time_limit == 3600 and job.get_json("parameters") == \
        {"x": 1}
    assert job.notebook_dict == d.notebook_dict
    assert runner.submitted[0][1] == ["users"]
    assert await s.tick() == []  # the same tick never again
    assert definition_view(d)["next_tick"] == "2026-03-01T11:00:00Z" and d.runs == 1
    assert [r.id for r in store.list(definition_id=d.id)] == [job.id]
    assert store.list(definition_id="0" * 32) == []


async def test_forbid_skips_a_tick_while_a_run_is_active(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *"))  # Forbid is the default
    assert d.concurrency_policy == "Forbid"
    clock.now = ts("2026-03-01T10:00:00+00:00")
    (first,) = await s.tick()
    clock.now = ts("2026-03-01T11:00:00+00:00")
    (second,) = await s.tick()
    assert second.action == "skipped" and first.job_id in second.message
    assert "concurrency_policy Forbid" in d.message and d.skipped == 1
    assert len(runner.submitted) == 1
    finish(store, first.job_id)
    clock.now = ts("2026-03-01T12:00:00+00:00")
    (third,) = await s.tick()
    assert third.action == "run" and len(runner.submitted) == 2


async def test_replace_cancels_the_active_run_then_starts(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *", concurrency_policy="Replace"))
    clock.now = ts("2026-03-01T10:00:00+00:00")
    (first,) = await s.tick()
    clock.now = ts("2026-03-01T11:00:00+00:00")
    (second,) = await s.tick()
    assert second.action == "run" and second.job_id != first.job_id
    assert store.get(first.job_id).state == "cancelled"
    assert runner.cancelled == [(first.job_id, f"job definition {d.id} (concurrency_policy "
                                                "Replace)")]
    assert [j.id for j in store.active_of(d.id)] == [second.job_id]


async def test_allow_runs_both(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *", concurrency_policy="Allow"))
    for hour in (10, 11):
        clock.now = ts(f"2026-03-01T{hour}:00:00+00:00")
        (out,) = await s.tick()
        assert out.action == "run"
    assert len(store.active_of(d.id)) == 2 and runner.cancelled == []


async def test_a_missed_tick_within_the_deadline_runs_once_late(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *", starting_deadline=600))
    # the hub was down from 09:50 to 12:05: 10:00 and 11:00 are too old, 12:00 is 300 s late
    clock.now = ts("2026-03-01T12:05:00+00:00")
    (out,) = await s.tick()
    assert out.action == "run" and out.tick == ts("2026-03-01T12:00:00+00:00")
    assert "300 s late" in d.message and "2 earlier missed tick(s) skipped" in d.message
    assert d.skipped == 2 and len(runner.submitted) == 1
    assert await s.tick() == []
    assert definition_view(d)["next_tick"] == "2026-03-01T13:00:00Z"


async def test_a_missed_tick_past_the_deadline_is_skipped(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *", starting_deadline=60))
    clock.now = ts("2026-03-01T12:05:00+00:00")
    (out,) = await s.tick()
    assert out.action == "skipped" and out.tick == ts("2026-03-01T12:00:00+00:00")
    assert "300 s late, more than its starting_deadline of 60 s" in d.message
    assert runner.submitted == [] and d.skipped == 3
    clock.now = ts("2026-03-01T13:00:30+00:00")
    (out,) = await s.tick()
    assert out.action == "run"  # 30 s late: within the deadline


async def test_no_deadline_runs_the_latest_of_many_missed_ticks_once(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("*/5 * * * *"))
    clock.now = ts("2026-03-03T09:41:00+00:00")  # two days down: 576 ticks missed
    (out,) = await s.tick()
    assert out.action == "run" and out.tick == ts("2026-03-03T09:40:00+00:00")
    assert "more than 100 earlier missed tick(s) skipped" in d.message
    assert len(runner.submitted) == 1


async def test_pause_and_resume(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *"))
    s.update(d, parse_definition_update({"paused": True}))
    assert d.paused and d.next_tick is None and d.message == "paused"
    clock.now = ts("2026-03-01T12:30:00+00:00")
    assert await s.tick() == []
    s.update(d, parse_definition_update({"paused": False}))
    # ticks that passed while paused never run: the next is the first after the resume
    assert definition_view(d)["next_tick"] == "2026-03-01T13:00:00Z"
    assert await s.tick() == []
    clock.now = ts("2026-03-01T13:00:01+00:00")
    (out,) = await s.tick()
    assert out.action == "run" and len(runner.submitted) == 1
    # made paused
    p = s.create("jd-u", [], definition("0 * * * *", paused=True))
    assert p.next_tick is None and definition_view(p)["paused"] is True


async def test_a_restarted_scheduler_does_not_run_a_tick_twice(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    store = JobStore(url)
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *", concurrency_policy="Allow",
                                        starting_deadline=3600))
    clock.now = ts("2026-03-01T10:00:05+00:00")
    (out,) = await s.tick()
    store.close()
    # the hub restarts a few seconds later: a new store and scheduler on the same database
    store = JobStore(url)
    s, runner, clock = scheduler(store, "2026-03-01T10:00:09+00:00")
    assert await s.tick() == [] and runner.submitted == []
    again = store.get_definition(d.id)
    assert again.last_tick == ts("2026-03-01T10:00:00+00:00") and again.last_job_id == out.job_id
    assert store.get(out.job_id).definition_id == d.id
    clock.now = ts("2026-03-01T11:00:00+00:00")
    assert [o.action for o in await s.tick()] == ["run"]
    assert len(store.list(definition_id=d.id)) == 2
    store.close()


async def test_a_refused_tick_is_recorded_and_not_retried(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition("0 * * * *"))
    runner.refuse = JobRefused(429, "jd-u has 20 active jobs, the most allowed")
    clock.now = ts("2026-03-01T10:00:00+00:00")
    (out,) = await s.tick()
    assert out.action == "refused" and "not run: jd-u has 20 active jobs" in d.message
    assert await s.tick() == []
    runner.refuse = None
    clock.now = ts("2026-03-01T11:00:00+00:00")
    assert [o.action for o in await s.tick()] == ["run"]


async def test_ticks_in_a_time_zone_and_when_the_clocks_go_back():
    rome = "Europe/Rome"
    # 02:30 every day, Rome: 2026-10-25 has 02:30 twice (CEST, then CET): it runs once
    t = next_tick("30 2 * * *", rome, ts("2026-10-24T12:00:00+02:00"))
    assert t == ts("2026-10-25T02:30:00+02:00")
    t = next_tick("30 2 * * *", rome, t)
    assert t == ts("2026-10-26T02:30:00+01:00")
    # every 30 minutes: the repeated hour runs once by the wall clock
    seen, t = [], ts("2026-10-25T01:45:00+02:00")
    for _ in range(4):
        t = next_tick("*/30 * * * *", rome, t)
        seen.append(datetime.fromtimestamp(t, ZoneInfo(rome)).isoformat())
    assert seen == ["2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00",
                    "2026-10-25T03:00:00+01:00", "2026-10-25T03:30:00+01:00"]
    # the clocks go forward: 02:30 does not exist on 2026-03-29: it runs at 03:30, once
    t = next_tick("30 2 * * *", rome, ts("2026-03-28T12:00:00+01:00"))
    assert t == ts("2026-03-29T03:30:00+02:00")
    assert next_tick("30 2 * * *", rome, t) == ts("2026-03-30T02:30:00+02:00")
    # a tick after one of the repeated hour's second pass is not a time gone by
    assert next_tick("*/30 * * * *", rome, ts("2026-10-25T02:10:00+01:00")) == \
        ts("2026-10-25T03:00:00+01:00")
    # seconds, last (c.GPUJobs.cron_seconds)
    assert next_tick("* * * * * */10", "UTC", ts("2026-01-01T00:00:01+00:00")) == \
        ts("2026-01-01T00:00:10+00:00")
    assert latest_tick("0 * * * *", "UTC", ts("2026-01-01T01:00:00+00:00"),
                       ts("2026-01-01T03:30:00+00:00")) == (ts("2026-01-01T03:00:00+00:00"), 3)


async def test_the_scheduler_task_wakes_on_the_next_tick(store):
    """In the hub, Scheduler.run sleeps until the earliest next tick (real time here: a
    seconds schedule, two ticks within about 2 s)."""
    import time

    settings = GPUJobs(schedule_interval=30.0)
    runner = FakeRunner(store, settings)
    s = Scheduler(runner)
    d = s.create("jd-u", [], definition("* * * * * *", concurrency_policy="Allow"))
    s.start()
    try:
        end = time.monotonic() + 10
        while len(runner.submitted) < 2 and time.monotonic() < end:
            await asyncio.sleep(0.05)
    finally:
        await s.stop()
    assert len(runner.submitted) >= 2
    ats = [req.at for _, _, req in runner.submitted]
    assert len(set(ats)) == len(ats) and d.runs == len(ats)


# -- bad input ---------------------------------------------------------------------------------
GOOD = {"notebook": notebook("print(x)"), "profile": "cpu", "parameters": {"x": 2},
        "time_limit": 60, "name": "nightly", "schedule": "0 2 * * *",
        "timezone": "Europe/Rome", "concurrency_policy": "Forbid", "starting_deadline": 300,
        "paused": False}


def with_(**changes) -> dict:
    body = copy.deepcopy(GOOD)
    for k, v in changes.items():
        if v is ...:
            body.pop(k)
        else:
            body[k] = v
    return body


BAD = [
    ([1], "body", "JSON object"),
    (with_(schedule=...), "schedule", "missing"),
    (with_(schedule=5), "schedule", "cron expression"),
    (with_(schedule=""), "schedule", "cron expression"),
    (with_(schedule="61 * * * *"), "schedule", "not a valid cron"),
    (with_(schedule="* * * *"), "schedule", "has 4 fields"),
    (with_(schedule="* * * * * * *"), "schedule", "has 7 fields"),
    (with_(schedule="every day"), "schedule", "has 2 fields"),
    (with_(schedule="0 0 31 2 *"), "schedule", "never matches"),
    (with_(schedule="R 2 * * *"), "schedule", "random"),
    (with_(schedule="* " * 120), "schedule", "longer than"),
    (with_(timezone="Mars/Olympus"), "timezone", "unknown time zone"),
    (with_(timezone="../../etc/passwd"), "timezone", "unknown time zone"),
    (with_(timezone=""), "timezone", "IANA"),
    (with_(timezone=1), "timezone", "IANA"),
    (with_(concurrency_policy="forbid"), "concurrency_policy", "one of Allow, Forbid, "
                                                               "Replace"),
    (with_(concurrency_policy=None), "concurrency_policy", "one of"),
    (with_(starting_deadline=-1), "starting_deadline", "0 or more"),
    (with_(starting_deadline="60"), "starting_deadline", "whole number"),
    (with_(starting_deadline=1.5), "starting_deadline", "whole number"),
    (with_(starting_deadline=10**9), "starting_deadline", "at most"),
    (with_(paused="yes"), "paused", "true or false"),
    (with_(at="2030-01-01T00:00:00Z"), "at", "unknown field"),
    (with_(colour="red"), "colour", "unknown field"),
    # what a one-off job checks too
    (with_(notebook=...), "notebook", "missing"),
    (with_(notebook={"cells": 1}), "notebook", "not a valid notebook"),
    (with_(parameters={"a-b": 1}), "parameters.a-b", "identifier"),
    (with_(parameters={"x": {"a": 1}}), "parameters.x", "scalar"),
    (with_(profile=""), "profile", "slug"),
    (with_(time_limit=0), "time_limit", "at least 1"),
    (with_(name="../x"), "name", "no '/'"),
]


@pytest.mark.parametrize("body,field,words", BAD, ids=[f"{b[1]}-{i}" for i, b in
                                                        enumerate(BAD)])
def test_every_bad_definition_names_its_field(body, field, words):
    with pytest.raises(JobInputError) as e:
        parse_definition(body, LIMITS)
    assert e.value.field == field, e.value
    assert str(e.value).startswith(f"{field}: ") and words in str(e.value)


def test_defaults_and_seconds():
    req = parse_definition({"notebook": notebook("1"), "schedule": "  0  2 * * * "}, LIMITS)
    assert (req.schedule, req.timezone, req.concurrency_policy, req.starting_deadline,
            req.paused) == ("0 2 * * *", "UTC", "Forbid", None, False)
    assert req.job.at is None and req.job.name == "notebook"
    with pytest.raises(JobInputError, match="has 6 fields; a cron expression has 5:"):
        check_schedule("* * * * * */10")
    assert check_schedule("* * * * * */10", seconds=True) == "* * * * * */10"
    assert check_schedule("@daily") == "@daily"
    assert check_timezone("America/New_York") == "America/New_York"


@pytest.mark.parametrize("body,field", [
    ({}, "body"), ([], "body"), ({"name": "a/b"}, "name"), ({"profile": 5}, "profile"),
    ({"notebook": 3}, "notebook"), ({"parameters": {"1x": 1}}, "parameters.1x"),
    ({"time_limit": "1h"}, "time_limit"), ({"output_formats": ["pdf"]}, "output_formats"),
    ({"input_folder": "../up"}, "input_folder"), ({"input_folder": "/etc"}, "input_folder"),
    ({"image": 7}, "image"), ({"user": "other"}, "user"), ({"id": "x"}, "id"),
    ({"schedule": "bad"}, "schedule"), ({"timezone": "Nowhere/X"}, "timezone"),
    ({"paused": 1}, "paused"), ({"starting_deadline": -5}, "starting_deadline"),
    ({"concurrency_policy": "Never"}, "concurrency_policy")])
def test_every_bad_update_names_its_field(body, field):
    with pytest.raises(JobInputError) as e:
        parse_definition_update(body)
    assert e.value.field == field


def test_the_hub_checks_profile_time_limit_and_stores_nothing(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00", GPUJobs(
        profile_time_limits={"cpu": {"max": 600}}))
    for fields, field, words in [
            ({"profile": "nope"}, "profile", "nope"),
            ({"profile": "staff"}, "profile", "not available to your groups"),
            ({"profile": "huge"}, "profile", "can never be placed"),
            ({"time_limit": 601}, "time_limit", "at most 600 seconds for profile 'cpu'")]:
        with pytest.raises(JobInputError) as e:
            s.create("jd-u", ["users"], definition(**fields))
        assert e.value.field == field and words in str(e.value), e.value
    assert store.definitions() == []
    d = s.create("jd-u", ["staff"], definition(profile="staff"))
    assert d.profile == "staff" and d.time_limit == 3600


def test_the_number_of_definitions_per_user_and_per_group(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00", GPUJobs(
        max_definitions_per_user=2, max_definitions_per_group={"staff": 3, "free": 0}))
    for _ in range(2):
        s.create("jd-a", ["users"], definition())
    with pytest.raises(JobRefused) as e:
        s.create("jd-a", ["users"], definition())
    assert e.value.status == 429 and "jd-a has 2 job definitions" in str(e.value)
    for _ in range(3):
        s.create("jd-b", ["users", "staff"], definition())
    with pytest.raises(JobRefused):
        s.create("jd-b", ["staff"], definition())
    for _ in range(4):  # 0: no limit
        s.create("jd-c", ["free", "staff"], definition())
    assert len(store.definitions("jd-c")) == 4 and len(store.definitions()) == 9
    settings = GPUJobs(max_definitions_per_user=0)
    assert settings.definition_limit([]) == 0
    with pytest.raises(Exception, match="max_definitions_per_group.g"):
        GPUJobs(max_definitions_per_group={"g": -1})


async def test_deleting_a_definition_keeps_its_jobs(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    d = s.create("jd-u", [], definition())
    clock.now = ts("2026-03-01T10:00:00+00:00")
    (out,) = await s.tick()
    s.delete(d)
    assert store.get_definition(d.id) is None and store.definitions() == []
    assert store.get(out.job_id).definition_id == d.id


# -- the database ------------------------------------------------------------------------------
def legacy_database(url: str, version: int, runs_table: bool = False) -> None:
    """A database as the version table before alembic left it at ``version`` (the revision
    of that version, without alembic's version table); ``runs_table``: with the job
    runner's table, which ``create_all`` made then."""
    import sqlalchemy
    from alembic import command
    from alembic.config import Config

    from gpuspawner.hub.jobs.store import LEGACY_REVISIONS, MIGRATIONS, JobRun

    engine = sqlalchemy.create_engine(url)
    with engine.begin() as c:
        cfg = Config()
        cfg.set_main_option("script_location", MIGRATIONS)
        cfg.attributes["connection"] = c
        command.upgrade(cfg, LEGACY_REVISIONS[version])
        c.execute(sqlalchemy.text("DROP TABLE gpuspawner_jobs_alembic_version"))
        c.execute(sqlalchemy.text(
            "INSERT INTO gpuspawner_jobs (id, user, groups, name, profile, state, message, "
            "time_limit, parameters, notebook, created, history, node, gpu_uuids, "
            "output_dir) VALUES ('" + "b" * 32 + "', 'jd-u', '[]', 'n', 'cpu', 'completed', "
            "'', 60, '{}', x'00', 1.0, '[]', '', '[]', '')"))
        if runs_table:
            JobRun.__table__.create(c)
    engine.dispose()


@pytest.mark.parametrize("version,runs_table", [(1, False), (2, False), (2, True), (3, True)])
def test_a_database_of_the_old_version_table_is_migrated_by_alembic(tmp_path, version,
                                                                     runs_table):
    import sqlalchemy

    from gpuspawner.hub.jobs.store import SCHEMA_VERSION, VERSION_TABLE

    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    legacy_database(url, version, runs_table)
    store = JobStore(url)
    insp = sqlalchemy.inspect(store.engine)
    assert {"not_before", "definition_id"} <= {c["name"] for c in
                                               insp.get_columns("gpuspawner_jobs")}
    assert "ix_gpuspawner_jobs_definition_id" in {i["name"] for i in
                                                  insp.get_indexes("gpuspawner_jobs")}
    assert {"gpuspawner_job_definitions", "gpuspawner_job_runs", VERSION_TABLE} <= set(
        insp.get_table_names())
    assert store.revision == "0005"
    assert store.session.execute(sqlalchemy.text(
        "SELECT version FROM gpuspawner_jobs_schema")).scalar() == SCHEMA_VERSION == 3
    assert store.get("b" * 32).definition_id is None and store.definitions() == []
    store.close()
    assert JobStore(url).revision == "0005"  # opened again: nothing to do


def test_the_migrated_schema_is_the_models(tmp_path):
    """Every change of the models in store.py needs an alembic revision."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from gpuspawner.hub.jobs.store import VERSION_TABLE, Base

    store = JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite'}")
    with store.engine.connect() as c:
        ctx = MigrationContext.configure(c, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff
    store.close()


def test_an_unknown_alembic_revision_is_refused(tmp_path):
    import sqlalchemy

    from gpuspawner.hub.jobs.store import StoreError

    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    JobStore(url).close()
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as c:
        c.execute(sqlalchemy.text("UPDATE gpuspawner_jobs_alembic_version SET "
                                  "version_num = '9999'"))
    engine.dispose()
    with pytest.raises(StoreError, match="revision '9999', which this gpuspawner does not "
                                         "know"):
        JobStore(url)


# -- the CLI -----------------------------------------------------------------------------------
def test_the_cli_sends_a_definition(monkeypatch, tmp_path, capsys):
    import json

    from gpuspawner.jobs import client

    sent = []

    def request(self, method, path, body=None):
        sent.append((method, path, body))
        if path == "api/job_definitions" and method == "POST":
            return {"id": "d" * 32, **body}
        if path == "api/jobs" and method == "POST":
            return {"id": "j" * 32, **body}
        if path == "api/job_definitions":
            return {"job_definitions": [{
                "id": "d" * 32, "name": "nb", "schedule": "0 2 * * *", "timezone": "UTC",
                "paused": True, "next_tick": None, "profile": "cpu", "message": "paused"}]}
        return {"id": path.rsplit("/", 1)[1], "paused": body["paused"], "next_tick": None}

    monkeypatch.setattr(client.JobsClient, "request", request)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    monkeypatch.setenv("GPUSPAWNER_SERVICE_URL", "http://127.0.0.1:1/services/gpuspawner/")
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(notebook("1")))
    assert client.main(["jobs", "submit", str(nb), "--profile", "cpu", "--cron", "0 2 * * *",
                        "--timezone", "Europe/Rome", "--concurrency-policy", "Replace",
                        "--starting-deadline", "600", "-p", "x=3"]) == 0
    method, path, body = sent[-1]
    assert (method, path) == ("POST", "api/job_definitions")
    assert body["schedule"] == "0 2 * * *" and body["timezone"] == "Europe/Rome"
    assert body["concurrency_policy"] == "Replace" and body["starting_deadline"] == 600
    assert body["parameters"] == {"x": 3} and body["name"] == "nb" and "at" not in body
    assert capsys.readouterr().out.strip() == "d" * 32
    assert client.main(["jobs", "pause", "d" * 32]) == 0
    assert sent[-1] == ("PATCH", f"api/job_definitions/{'d' * 32}", {"paused": True})
    assert client.main(["jobs", "resume", "d" * 32]) == 0
    assert sent[-1] == ("PATCH", f"api/job_definitions/{'d' * 32}", {"paused": False})
    capsys.readouterr()
    assert client.main(["jobs", "definitions"]) == 0
    assert "0 2 * * *" in capsys.readouterr().out
    assert client.main(["jobs", "definitions", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == "d" * 32
    # --at and --cron together: refused before anything is sent
    n = len(sent)
    assert client.main(["jobs", "submit", str(nb), "--cron", "* * * * *", "--at",
                        "2030-01-01T00:00:00Z"]) == 1
    assert "--at or --cron, not both" in capsys.readouterr().err
    assert client.main(["jobs", "submit", str(nb), "--timezone", "UTC"]) == 1
    assert "--timezone" in capsys.readouterr().err
    # --max-retries is a job's, not a definition's
    assert client.main(["jobs", "submit", str(nb), "--cron", "* * * * *",
                        "--max-retries", "2"]) == 1
    assert "--max-retries applies to one job" in capsys.readouterr().err
    assert len(sent) == n
    # a one-off job sends it
    assert client.main(["jobs", "submit", str(nb), "--max-retries", "0"]) == 0
    assert sent[-1][:2] == ("POST", "api/jobs") and sent[-1][2]["max_retries"] == 0


# -- the owner's rights at each tick (issue 46 items 2 and 3) --------------------------------
async def test_a_tick_of_an_owner_who_lost_the_profile_pauses_the_definition(store):
    """A definition's tick ran with the groups stored at its creation when the hub did not
    know the user (deleted), and a new account of the same name inherited it. Now each tick
    reads the owner's rights: gone, newer than the definition, or no longer in the profile's
    group pauses the definition with the reason (the API's ``paused`` and ``message``)."""
    from gpuspawner.hub.jobs.runner import Account

    clock = Clock(ts("2026-03-01T09:40:00+00:00"))
    runner = FakeRunner(store)
    accounts = {u: Account(("staff",), clock.now - 60) for u in ("jd-a", "jd-b", "jd-c")}
    s = Scheduler(runner, clock=clock, account=accounts.get)
    da, db, dc = (s.create(u, ["staff"], definition("0 * * * *", profile="staff"))
                  for u in ("jd-a", "jd-b", "jd-c"))
    clock.now = ts("2026-03-01T10:00:00+00:00")
    assert sorted(o.action for o in await s.tick()) == ["run"] * 3
    del accounts["jd-a"]  # deleted
    accounts["jd-b"] = Account(("staff",), clock.now)  # deleted, then made again
    accounts["jd-c"] = Account(("users",), accounts["jd-c"].created)  # left staff
    for d in (da, db, dc):
        finish(store, d.last_job_id)
    clock.now = ts("2026-03-01T11:00:00+00:00")
    outs = await s.tick()
    assert [o.action for o in outs] == ["paused"] * 3 and len(runner.submitted) == 3
    assert "its owner jd-a no longer exists" in da.message
    assert "its owner jd-b was deleted" in db.message
    assert "jd-c may no longer use it" in dc.message and "'staff'" in dc.message
    for d in (da, db, dc):
        view = definition_view(d)
        assert view["paused"] is True and view["next_tick"] is None
        assert view["message"].startswith("paused at tick 2026-03-01T11:00:00Z: "), view
    clock.now = ts("2026-03-01T12:00:00+00:00")
    assert await s.tick() == []


async def test_a_user_the_hub_does_not_know_has_no_rights_with_groups_of(store):
    clock = Clock(ts("2026-03-01T09:40:00+00:00"))
    runner = FakeRunner(store)
    s = Scheduler(runner, clock=clock, groups_of=lambda user: None)
    d = s.create("jd-gone", ["staff"], definition("0 * * * *", profile="staff"))
    clock.now = ts("2026-03-01T10:00:00+00:00")
    (out,) = await s.tick()
    assert out.action == "paused" and runner.submitted == [] and d.paused


async def test_deleting_an_owner_deletes_their_definitions(store):
    s, runner, clock = scheduler(store, "2026-03-01T09:40:00+00:00")
    mine = s.create("jd-del", [], definition("0 * * * *"))
    other = s.create("jd-keep", [], definition("0 * * * *"))
    assert s.remove_owner("jd-del") == [mine.id]
    assert [d.id for d in store.definitions()] == [other.id]
