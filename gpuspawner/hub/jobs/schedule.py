"""Job definitions: a notebook on a cron schedule, each tick an ordinary job.

A definition (:class:`~gpuspawner.hub.jobs.store.DefinitionRow`) carries what every run runs
(the notebook snapshot, parameters, profile, time limit, name) and when: a cron expression
read by croniter in an IANA time zone, with Kubernetes CronJob's conventions
(https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/):

- ``concurrency_policy``: while a job the definition made is still active, a tick starts
  another (``Allow``), is skipped (``Forbid``, the default here: a GPU bundle should not pile
  up), or cancels the active one(s) and then starts (``Replace``).
- ``starting_deadline`` (``startingDeadlineSeconds``): a tick that comes later than this many
  seconds after its time (the hub was down) is skipped; of several missed ticks only the
  latest may run (once, late), the older ones are skipped. None: no deadline.
- ``paused`` (``suspend``): no tick runs; ticks that pass while paused never run (resume
  counts from the resume time).

Exactly-once per tick: ``last_tick`` (the latest tick handled) is stored on the definition and
written in the same database commit as the job the tick makes (the store has one session:
:meth:`JobRunner.submit`'s commit of the new job carries the definition's change), so a
restart of the hub never runs a tick twice; a crash between can only lose a tick, never
repeat one.

Each local wall-clock time runs at most once: on the day a time zone's clocks go back, a time
of the repeated hour runs once, at its first occurrence (croniter 7 with a tz-aware start gives
both); a time the clocks skip runs at the same distance after the change (02:30 -> 03:30).

The :class:`Scheduler` is driven by :meth:`Scheduler.tick` with an injectable clock (unit
tests call it with made-up times); in the hub it runs as one asyncio task
(:meth:`Scheduler.run`) that sleeps until the earliest next tick, at most
``c.GPUJobs.schedule_interval`` seconds, and wakes when a definition is made or changed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from ...jobs.model import (
    IMAGE_KEYS,
    OUTPUT_FORMATS,
    DefinitionRequest,
    JobInputError,
    JobRequest,
    check_time_limit,
)
from ..profiles import OptionsError, choose_profile
from .runner import (
    Account,
    JobRefused,
    JobRunner,
    NoRights,
    check_access,
    check_backend,
    iso,
    options_view,
)
from .store import DefinitionRow, JobRow, JobStore, pack

log = logging.getLogger("gpuspawner")

__all__ = ["Scheduler", "TickOutcome", "definition_view", "latest_tick", "next_tick"]

#: ticks of one wall-clock time skipped at most while looking for the next one (the repeated
#: hour of a DST fall-back holds 3600 of a seconds schedule)
MAX_REPEATS = 4000
#: missed ticks counted one by one before the latest is found from the other end
MAX_CATCH_UP = 100


def _instant(wall: datetime, tz: ZoneInfo) -> float:
    """A local wall-clock time as seconds since the epoch: its first occurrence when the
    clocks go back (fold 0); a time the clocks skip counts with the offset before the change
    (02:30 that does not exist is 03:30 of the new offset)."""
    return float(wall.replace(tzinfo=tz, fold=0).timestamp())


def next_tick(schedule: str, timezone: str, after: float) -> float | None:
    """The first tick of ``schedule`` read in ``timezone`` strictly after ``after`` (seconds
    since the epoch), as seconds since the epoch; None when croniter finds none (it looks
    50 years ahead).

    croniter walks the local wall clock (naive times: the same in croniter 1.4, which
    jupyter-scheduler pins, and 7), and each wall-clock time is mapped to its instant by
    :func:`_instant`: when the clocks go back, the repeated hour's times run once (their
    first occurrence); a tick that would fall before ``after`` is passed over."""
    tz = ZoneInfo(timezone)
    wall = datetime.fromtimestamp(after, tz).replace(tzinfo=None)
    it = croniter(schedule, wall)
    try:
        for _ in range(MAX_REPEATS):
            t = _instant(it.get_next(datetime), tz)
            if t > after:
                return t
    except (ValueError, KeyError, OverflowError):  # CroniterBadDateError: no next date
        return None
    return None


def latest_tick(schedule: str, timezone: str, first: float, now: float
                ) -> tuple[float, int]:
    """The latest tick at or before ``now``, counting from ``first`` (a tick, <= ``now``),
    and how many ticks there are from ``first`` to it (1: ``first`` itself; more than
    :data:`MAX_CATCH_UP` are not counted one by one)."""
    t, count = first, 1
    while count <= MAX_CATCH_UP:
        n = next_tick(schedule, timezone, t)
        if n is None or n > now:
            return t, count
        t, count = n, count + 1
    # a long downtime: the latest one from the other end
    tz = ZoneInfo(timezone)
    wall = datetime.fromtimestamp(now, tz).replace(tzinfo=None)
    prev = _instant(croniter(schedule, wall).get_prev(datetime), tz)
    n = next_tick(schedule, timezone, prev)
    if n is not None and n <= now:
        prev = n
    return (prev if t < prev <= now else t), count


@dataclass(frozen=True)
class TickOutcome:
    """What one tick of one definition did.

    Attributes:
        definition_id: the definition.
        tick: the tick's time (seconds since the epoch).
        action: ``run`` (a job was made), ``skipped`` (starting deadline passed, or
            ``Forbid`` with an active job), ``paused`` (its owner may no longer run it: gone,
            or the profile is no longer for their groups; the definition is paused) or
            ``refused`` (the job was refused: too many active jobs, ...).
        job_id: the job made, for ``run``.
        message: what happened, as the definition's ``message`` says it.
    """

    definition_id: str
    tick: float
    action: str
    job_id: str | None
    message: str


class Scheduler:
    """Makes the jobs of the job definitions on their ticks.

    Args:
        runner: the job runner (its store holds the definitions too; its ``submit`` makes
            each tick's job, its ``cancel`` ends the jobs a ``Replace`` tick replaces).
        clock: seconds since the epoch (tests inject their own).
        groups_of: user name -> the user's groups now (the hub's database), None for a
            user the hub does not know (no rights: the definition is paused).
        account: user name -> the user's :class:`~gpuspawner.hub.jobs.runner.Account` now
            (None: no such user), read at each tick (:func:`check_access`); wins over
            ``groups_of``. Neither: the groups stored with the definition (no hub to ask).
    """

    def __init__(self, runner: JobRunner, clock: Callable[[], float] = time.time,
                 groups_of: Callable[[str], list[str] | None] | None = None,
                 account: Callable[[str], Account | None] | None = None) -> None:
        self.runner = runner
        self.clock = clock
        self._groups_of = groups_of
        self._account = account
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def store(self) -> JobStore:
        return self.runner.store

    # -- definitions -----------------------------------------------------------------------
    def check(self, groups: list[str], req: DefinitionRequest) -> tuple[str, int]:
        """The profile, time limit and image of a definition's jobs, checked as a job's are
        at submission (profile allowed for ``groups``, a bundle some node can ever hold, time
        limit within the profile's maximum, the image by the spawn form's rules). The quota
        is checked at each tick.

        Returns:
            (profile slug, time limit in seconds).

        Raises:
            JobInputError: field ``profile``, ``time_limit``, ``image`` or
                ``image--unlisted-choice``.
            JobRefused: 503, jobs cannot run on this hub's backend.
        """
        job = req.job
        try:
            profile = choose_profile({"profile": job.profile} if job.profile else {},
                                     self.runner.profiles(), groups)
        except OptionsError as e:
            raise JobInputError("profile", e.reason) from None
        default, maximum = self.runner.settings.time_limits(profile.slug)
        limit = check_time_limit(job.time_limit, default, maximum,
                                 f"profile {profile.slug!r}")
        self.runner.image_of(job.image_options, profile)
        cluster = self.runner.cluster
        check_backend(cluster)
        problem = cluster.ledger.capacity_refusal(profile.bundle, profile.nodes or None)
        if problem is not None:
            raise JobInputError("profile", f"{profile.slug!r} can never be placed: {problem}")
        return profile.slug, limit

    def create(self, user: str, groups: list[str], req: DefinitionRequest) -> DefinitionRow:
        """Check and store a definition (its first tick is the first after now).

        Raises:
            JobInputError: a field (HTTP 400), see :meth:`check`.
            JobRefused: 429, the user has as many definitions as allowed
                (``c.GPUJobs.max_definitions_per_user`` / ``max_definitions_per_group``);
                503 as :meth:`check`.
        """
        slug, limit = self.check(groups, req)
        allowed = self.runner.settings.definition_limit(groups)
        have = self.store.count_definitions(user)
        if allowed and have >= allowed:
            raise JobRefused(429, f"{user} has {have} job definitions, the most allowed "
                                  "(GPUJobs.max_definitions_per_user); delete one first")
        now = self.clock()
        job = req.job
        row = DefinitionRow(
            id=secrets.token_hex(16), user=user, name=job.name, profile=slug,
            time_limit=limit, notebook=pack(job.notebook), schedule=req.schedule,
            timezone=req.timezone, concurrency_policy=req.concurrency_policy,
            starting_deadline=req.starting_deadline, paused=req.paused, created=now,
            updated=now, last_tick=now,
            next_tick=None if req.paused else next_tick(req.schedule, req.timezone, now),
            message="paused" if req.paused else "", runs=0, skipped=0)
        row.set_json("groups", list(groups))
        row.set_json("parameters", job.parameters)
        row.set_json("options", job.options())
        self.store.add_definition(row)
        log.info("job definition %s of %s: %s, %r in %s, profile %s", row.id, user, row.name,
                 row.schedule, row.timezone, slug)
        self.wake()
        return row

    def request_of(self, row: DefinitionRow, changes: dict[str, Any] | None = None,
                   at: float | None = None) -> JobRequest:
        """The job a run of the definition makes (its snapshot, parameters, profile, time
        limit, name, image, output formats, input folder), with ``changes`` (checked fields of
        :func:`~gpuspawner.jobs.model.parse_definition_update`) over the stored ones."""
        c = changes or {}
        options = dict(row.get_json("options", {}))
        for key in IMAGE_KEYS:
            if key in c:
                options[key] = c[key]
        for key in ("output_formats", "input_folder"):
            if key in c:
                options[key] = c[key]
        formats = options.get("output_formats")
        return JobRequest(
            notebook=c["notebook"] if "notebook" in c else row.notebook_dict,
            parameters=c["parameters"] if "parameters" in c else row.get_json("parameters",
                                                                               {}),
            profile=c.get("profile", row.profile),
            time_limit=c["time_limit"] if "time_limit" in c else row.time_limit,
            name=c.get("name", row.name), at=at, definition_id=row.id,
            image_options={k: options[k] for k in IMAGE_KEYS if options.get(k)},
            output_formats=tuple(formats) if formats else OUTPUT_FORMATS,
            input_folder=options.get("input_folder"))

    def update(self, row: DefinitionRow, changes: dict[str, Any],
               groups: list[str] | None = None) -> DefinitionRow:
        """Apply checked changes (:func:`~gpuspawner.jobs.model.parse_definition_update`):
        a new schedule or time zone counts from now; resuming counts from now (ticks that
        passed while paused never run); pausing clears the next tick. A new notebook,
        parameters, profile, time limit, name, image, output formats or input folder is
        what the next runs get; the profile, time limit and image are checked as at
        creation (:meth:`check`, with ``groups``: the owner's now, default the stored
        ones), and a change of the profile without a time limit takes the new profile's
        default. Nothing is stored when a check fails.

        Raises:
            JobInputError: a field the hub refuses (HTTP 400).
            JobRefused: 503, as :meth:`check`.
        """
        now = self.clock()
        job_keys = {"notebook", "parameters", "profile", "time_limit", "name",
                    "output_formats", "input_folder", *IMAGE_KEYS}
        if job_keys & set(changes):
            if "profile" in changes and "time_limit" not in changes:
                changes = {**changes, "time_limit": None}
            req = self.request_of(row, changes)
            slug, limit = self.check(list(groups if groups is not None else
                                          row.get_json("groups", [])),
                                     DefinitionRequest(job=req, schedule=row.schedule))
            row.profile, row.time_limit, row.name = slug, limit, req.name
            row.notebook = pack(req.notebook)
            row.set_json("parameters", req.parameters)
            row.set_json("options", req.options())
            changes = {k: v for k, v in changes.items() if k not in job_keys}
        resumed = row.paused and changes.get("paused") is False
        for key, value in changes.items():
            setattr(row, key, value)
        if resumed or "schedule" in changes or "timezone" in changes:
            row.last_tick = max(row.last_tick, now)
        if row.paused:
            row.next_tick = None
            row.message = "paused"
        else:
            row.next_tick = next_tick(row.schedule, row.timezone, row.last_tick)
            if resumed:
                row.message = f"resumed at {iso(now)}"
        row.updated = now
        self.store.save()
        self.wake()
        return row

    def delete(self, row: DefinitionRow) -> None:
        """Remove a definition; its jobs stay (and run to their end)."""
        self.store.delete_definition(row)
        self.wake()

    def remove_owner(self, user: str) -> list[str]:
        """Delete every definition of ``user`` (deleted from the hub); returns their ids."""
        ids = []
        for row in self.store.definitions(user):
            ids.append(row.id)
            self.store.delete_definition(row)
        if ids:
            log.warning("job definitions of deleted user %s deleted: %s", user,
                        ", ".join(ids))
            self.wake()
        return ids

    # -- ticks -----------------------------------------------------------------------------
    async def tick(self, now: float | None = None) -> list[TickOutcome]:
        """Handle every definition whose next tick has come by ``now`` (default: the
        clock): at most one job per definition and tick, see the module's docstring."""
        now = self.clock() if now is None else now
        outcomes = []
        for row in self.store.due_definitions(now):
            try:
                outcomes.append(await self._tick_one(row, now))
            except Exception as e:  # the tick counts as handled: never retried in a loop
                log.exception("job definition %s: its tick failed", row.id)
                due = row.next_tick or now
                self._advance(row, due)
                row.message = f"tick {iso(due)} failed in the hub: {e}"
                self.store.save()
                outcomes.append(TickOutcome(row.id, due, "refused", None, row.message))
        return outcomes

    def _advance(self, row: DefinitionRow, due: float) -> None:
        row.last_tick = due
        row.next_tick = next_tick(row.schedule, row.timezone, due)

    def _groups(self, row: DefinitionRow) -> list[str]:
        """The groups the definition's owner has now, with access to its profile checked
        (:func:`~gpuspawner.hub.jobs.runner.check_access`): never the groups stored when it
        was made, unless there is no hub to ask.

        Raises:
            NoRights: the owner is gone (or the account is newer than the definition), the
                profile is not theirs to use now, or the hub could not be asked.
        """
        stored = list(row.get_json("groups", []))
        try:
            if self._account is not None:
                account = self._account(row.user)
            elif self._groups_of is not None:
                groups = self._groups_of(row.user)
                account = None if groups is None else Account(tuple(groups))
            else:
                account = Account(tuple(stored))
        except Exception as e:  # fail closed
            raise NoRights(f"the hub could not tell the rights of {row.user}: {e}") from None
        groups, _ = check_access(account, row.user, row.created, row.profile,
                                 self.runner.profiles())
        return groups

    def _pause(self, row: DefinitionRow, due: float, why: str) -> TickOutcome:
        """Pause the definition at a tick its owner may not run: ``message`` says why (the
        API's and the Lab panel's status of it); resuming asks again at the next tick."""
        self._advance(row, due)
        row.paused = True
        row.next_tick = None
        row.skipped += 1
        row.message = f"paused at tick {iso(due)}: {why}"
        row.updated = self.clock()
        self.store.save()
        log.warning("job definition %s of %s: %s", row.id, row.user, row.message)
        return TickOutcome(row.id, due, "paused", None, row.message)

    def _skip(self, row: DefinitionRow, due: float, why: str) -> TickOutcome:
        self._advance(row, due)
        row.skipped += 1
        row.message = f"tick {iso(due)} skipped: {why}"
        self.store.save()
        log.info("job definition %s: %s", row.id, row.message)
        return TickOutcome(row.id, due, "skipped", None, row.message)

    async def _tick_one(self, row: DefinitionRow, now: float) -> TickOutcome:
        assert row.next_tick is not None
        due, count = latest_tick(row.schedule, row.timezone, row.next_tick, now)
        missed = ""
        if count > 1:
            row.skipped += count - 1
            more = "more than " if count > MAX_CATCH_UP else ""
            missed = f"; {more}{count - 1} earlier missed tick(s) skipped"
        late = now - due
        try:  # the owner's rights now: a tick of an owner who lost them pauses it
            groups = self._groups(row)
        except NoRights as e:
            return self._pause(row, due, f"{e}{missed}")
        if row.starting_deadline is not None and late > row.starting_deadline:
            return self._skip(row, due, f"{late:.0f} s late, more than its starting_deadline "
                                        f"of {row.starting_deadline} s{missed}")
        active = self.store.active_of(row.id)
        if active and row.concurrency_policy == "Forbid":
            return self._skip(row, due, f"job {active[0].id} is still {active[0].state} "
                                        f"(concurrency_policy Forbid){missed}")
        replaced = ""
        if active and row.concurrency_policy == "Replace":
            for job in active:
                await self._replace(row, job)
            replaced = f"; replaced job(s) {', '.join(j.id for j in active)}"
        self._advance(row, due)  # committed with the job's row (one session)
        req = self.request_of(row, at=due)
        try:
            job = await self.runner.submit(row.user, groups, req)
        except (JobInputError, JobRefused) as e:
            row.skipped += 1
            row.message = f"tick {iso(due)} not run: {e}{missed}"
            self.store.save()
            log.warning("job definition %s: %s", row.id, row.message)
            return TickOutcome(row.id, due, "refused", None, row.message)
        job.definition_id = row.id  # (a runner that does not store req.definition_id)
        row.last_job_id = job.id
        row.runs += 1
        row.message = (f"tick {iso(due)}: job {job.id}"
                       + (f", {late:.0f} s late" if late >= 1 else "") + replaced + missed)
        self.store.save()
        log.info("job definition %s: %s", row.id, row.message)
        return TickOutcome(row.id, due, "run", job.id, row.message)

    async def run_now(self, row: DefinitionRow, groups: list[str],
                      parameters: dict[str, Any] | None = None) -> JobRow:
        """A job of the definition now, outside its schedule ("Run job" of a definition,
        jupyter-scheduler's ``create_job_from_definition``): its snapshot, profile, image and
        the rest, ``parameters`` (checked) over its own; submitted as the owner's job
        (:meth:`JobRunner.submit`: ``groups`` are the owner's now, quota and active-job
        limits apply). Its ticks, ``last_tick`` and ``concurrency_policy`` are not touched.

        Raises:
            JobInputError, JobRefused: as :meth:`JobRunner.submit`.
        """
        changes = {} if parameters is None else {"parameters": {
            **row.get_json("parameters", {}), **parameters}}
        job = await self.runner.submit(row.user, groups, self.request_of(row, changes))
        job.definition_id = row.id
        row.last_job_id = job.id
        row.runs += 1
        self.store.save()
        log.info("job definition %s: run now as job %s", row.id, job.id)
        return job

    async def _replace(self, row: DefinitionRow, job: JobRow) -> None:
        try:
            await self.runner.cancel(job, f"job definition {row.id} (concurrency_policy "
                                          "Replace)")
        except JobRefused:  # it ended meanwhile
            pass

    # -- in the hub ------------------------------------------------------------------------
    def wake(self) -> None:
        """Look again now (a definition was made or changed)."""
        self._wake.set()

    def start(self) -> None:
        """Run :meth:`run` as a task on the running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        """Tick, then sleep until the earliest next tick (at most
        ``c.GPUJobs.schedule_interval`` seconds) or a :meth:`wake`; forever."""
        interval = float(self.runner.settings.schedule_interval)
        while True:
            self._wake.clear()
            try:
                await self.tick()
                nxt = self.store.next_tick()
            except Exception:
                log.exception("job definitions: a tick failed")
                nxt = None
            wait = interval if nxt is None else min(interval, max(0.0, nxt - self.clock()))
            try:
                await asyncio.wait_for(self._wake.wait(), wait + 0.01)
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        """Stop :meth:`run` (tests; at hub shutdown)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def definition_view(row: DefinitionRow, active: list[JobRow] | None = None) -> dict[str, Any]:
    """A definition as the REST API answers it (``active``: its active jobs)."""
    return {
        "id": row.id, "user": row.user, "name": row.name, "profile": row.profile,
        "time_limit": row.time_limit, "parameters": row.get_json("parameters", {}),
        "schedule": row.schedule, "timezone": row.timezone,
        "concurrency_policy": row.concurrency_policy,
        "starting_deadline": row.starting_deadline, "paused": bool(row.paused),
        "created": iso(row.created), "updated": iso(row.updated),
        "last_tick": iso(row.last_tick), "next_tick": iso(row.next_tick),
        "message": row.message, "last_job_id": row.last_job_id, "runs": row.runs,
        "skipped": row.skipped, "active_jobs": [j.id for j in active or []],
        **options_view(row.get_json("options", {})),
    }
