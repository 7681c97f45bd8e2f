"""Runs notebook jobs through the hub's one cluster: the same ledger, quotas, wait queue and
backend as servers, a second kind of request.

A job's owner in the ledger is ``Owner(user, "job/<id>", groups)``
(:func:`~gpuspawner.hub.identity.job_server`: no JupyterHub server can have that name), its
engine objects are named :func:`~gpuspawner.hub.identity.job_object_name`. Its life, one
asyncio task per job in the hub process::

    queued -> (waiting: in the wait queue) -> starting: placed, backend.prepare (its own
    network), backend.launch (the user's uid, the home mounted, no port; inside, papermill:
    gpuspawner.jobs.execute; on Slurm an sbatch job with the bundle's GRES, cores and
    memory and --time from the time limit) -> running: backend.poll every
    GPUJobs.poll_interval
    -> completed (exit 0) | failed (a cell raised, or it could not start)
     | timed_out (its time limit: backend.stop, SIGTERM then SIGKILL) | cancelled (DELETE)
     | lost (its node stopped answering or is down when the program ended without a
       result, e.g. Slurm's NODE_FAIL; its container or Slurm job was gone or killed from
       outside the hub; or a GPU of it was drained as unhealthy) -> queued again after a
       back-off while it has retries left (``max_retries``, Kubernetes Job backoffLimit),
       else final

When an attempt ends, the executed notebook, its HTML export and the log (everything before
the result frame) are read back from the program's standard output (``backend.read_output``:
the container's log, the Slurm job's output file), the container and its network or the
Slurm job and its output file are removed (``backend.cleanup``), the allocation is released
and its GPU-seconds counted (:mod:`gpuspawner.hub.jobs.metrics`). Each attempt's summary and
log stay in the job's :class:`~gpuspawner.hub.jobs.store.JobRun`; each attempt writes a
folder of its own in the home.

After a hub restart (:meth:`JobRunner.restore`): the ledger is rebuilt from the running
containers' labels or Slurm jobs' AdminComment
(:meth:`~gpuspawner.hub.cluster.Cluster.ensure_restored`, which leaves jobs' allocations
alone), a running job is adopted (watched again from the backend state kept in the jobs
database), a queued one claims its place in the restored wait queue, and a job
allocation that no active job owns is removed and released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select

from ...backends.base import BackendError, BackendUnavailable, ServerRef, current_spawner
from ...backends.spec import HomeMount, launch_spec
from ...jobs import execute
from ...jobs.model import (
    ACTIVE_STATES,
    IMAGE_KEYS,
    OUTPUT_BEGIN,
    OUTPUT_END,
    OUTPUT_FORMATS,
    JobInputError,
    JobRequest,
    ResultTooLarge,
    check_time_limit,
    notebook_env,
    output_dir,
    parse_output,
)
from ...placement import Allocation, Owner, PlacementError, QuotaExceeded
from ...usage.budgets import BudgetExceeded, check_start
from ..cluster import HEALTH, Cluster
from ..identity import (
    home_path,
    ids_from_auth_state,
    is_job_server,
    job_object_name,
    job_server,
    safe_name,
)
from ..images import (
    ImageRequestError,
    check_allowed_registries,
    check_deny_patterns,
    choose_image,
)
from ..profiles import OptionsError, Profile, choose_profile, load_profiles
from ..volumes import mounts_for, site_volumes
from . import metrics as job_metrics
from .settings import GPUJobs
from .store import JobRow, JobRun, JobStore, pack

log = logging.getLogger("gpuspawner")

#: the program the job's container runs (``python3 -c``)
EXECUTE_SOURCE = __import__("inspect").getsource(execute)
#: exit statuses of a program killed by a signal it was not sent by the hub (the hub's own
#: stops end the job before it is polled): the engine stopped, or someone stopped the
#: container; without an OOM kill, the job is lost, not failed
KILLED_FROM_OUTSIDE = {137: "SIGKILL", 143: "SIGTERM"}
#: the exit status of a job's program ended by a signal sent from inside the job (``kill
#: -TERM 1``; :data:`gpuspawner.jobs.execute.KILLED_FROM_INSIDE`): failed, never lost, so a
#: job cannot earn its own retries
KILLED_FROM_INSIDE = execute.KILLED_FROM_INSIDE
#: seconds a read of a job's log may take
LOG_READ_TIMEOUT_S = 15.0
#: the backends (``backend_name``) that run notebook jobs; a hub on another one answers a
#: submission with 503
JOB_BACKENDS = ("docker", "slurm")
#: the keys of a backend state that name a launched program (a container, a Slurm job)
HANDLE_KEYS = ("container_id", "job_id")
#: the longest back-off before a retry (seconds; Kubernetes Job's 6 minutes)
RETRY_BACKOFF_MAX_S = 360.0


def launched(state: Any) -> bool:
    """Whether a job's backend state names a launched program (a container id, a Slurm job
    id): there is something to read a log from and to stop."""
    return bool(state) and any(state.get(k) for k in HANDLE_KEYS)


def check_backend(cluster: Cluster) -> None:
    """Refuse jobs on a hub whose backend does not run them (:data:`JOB_BACKENDS`).

    Raises:
        JobRefused: 503, naming the backend.
    """
    name = cluster.backend.backend_name
    if name not in JOB_BACKENDS:
        raise JobRefused(503, f"notebook jobs run on the Docker and Slurm backends only; "
                              f"this hub uses {name!r}")


class JobRefused(Exception):
    """A submission or a cancel the service answers with ``status`` (not 400: those are
    :class:`~gpuspawner.jobs.model.JobInputError`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_max_retries(value: Any, default: int, maximum: int) -> int:
    """A submission's ``max_retries``: how often a lost job (its node failed, its container
    vanished) is run again, Kubernetes Job ``backoffLimit`` style: 0 = never; None =
    ``default``; at most ``maximum`` (``c.GPUJobs.max_retries_max``).

    Raises:
        JobInputError: field ``max_retries``.
    """
    if value is None:
        return min(default, maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobInputError("max_retries", f"must be a whole number, got {value!r}")
    if not 0 <= value <= maximum:
        raise JobInputError("max_retries", f"must be 0 to {maximum} "
                                           f"(GPUJobs.max_retries_max), got {value}")
    return value


@dataclass(frozen=True)
class Account:
    """A hub user as the jobs see them now (:func:`check_access`).

    Attributes:
        groups: the user's groups now (the hub's database).
        created: when the hub account was made (seconds since the epoch); None when the hub
            does not say. A job or definition older than its owner's account is not theirs:
            its owner was deleted and a new account took the name.
    """

    groups: tuple[str, ...]
    created: float | None = None
    #: the scopes the user holds through roles and groups (exemptions such as
    #: ``custom:gpuspawner:budget-exempt``); empty when the hub does not say
    scopes: frozenset[str] = frozenset()


class NoRights(Exception):
    """The owner of a job or a definition may no longer run it (deleted, or no longer in a
    group of its profile); the message says why."""


#: seconds an account may seem newer than a job of its own (clocks, rounding)
ACCOUNT_SLACK_S = 1.0


def check_access(account: Account | None, user: str, since: float, slug: str,
                 profiles: list[Profile]) -> tuple[list[str], Profile]:
    """The rights a job or a definition of ``user`` has now, read when it is placed (its
    first run, each retry, each tick of a definition), never the groups stored when it was
    submitted.

    Args:
        account: the user's account now; None when the hub has no such user.
        user: the owner's name (for the message).
        since: when the job or definition was made (seconds since the epoch).
        slug: its profile.
        profiles: the hub's profiles now.

    Returns:
        (the user's groups now, the profile).

    Raises:
        NoRights: the user is gone, the account is newer than ``since`` (deleted and made
            again), or the profile is no longer available to the user's groups (or no longer
            configured).
    """
    if account is None:
        raise NoRights(f"its owner {user} no longer exists on the hub")
    if account.created is not None and account.created > since + ACCOUNT_SLACK_S:
        raise NoRights(f"its owner {user} was deleted (the account of that name now is "
                       f"newer, made {iso(account.created)})")
    groups = sorted(account.groups)
    try:
        profile = choose_profile({"profile": slug}, profiles, groups)
    except OptionsError as e:
        raise NoRights(f"{user} may no longer use it: {e.reason}") from None
    return groups, profile


def strip_result(text: str) -> str:
    """A job's output without its result frame (the last one; a frame cut at the end too):
    its log."""
    begin = text.rfind(OUTPUT_BEGIN)
    if begin < 0:
        return text
    end = text.find(OUTPUT_END, begin)
    return text[:begin] + (text[end + len(OUTPUT_END):].lstrip("\n") if end >= 0 else "")


def unpack(data: bytes | None, default: Any) -> Any:
    """What :func:`~gpuspawner.hub.jobs.store.pack` packed, or ``default`` for None."""
    return json.loads(zlib.decompress(data)) if data else default


class JobRunner:
    """The jobs of one hub process.

    Args:
        settings: ``c.GPUJobs``.
        store: the jobs database.
        cluster: returns the hub's cluster.
        spawner: the GPUSpawner settings jobs share with servers
            (:func:`~gpuspawner.hub.jobs.settings.spawner_values`).
        auth_state: user name -> the user's auth_state (awaitable; None without one).
        account: user name -> the user's :class:`Account` now (None: no such user), read at
            each placement of a job (:meth:`access`); None: no hub to ask (the groups stored
            at submission count).
    """

    def __init__(self, settings: GPUJobs, store: JobStore, cluster: Callable[[], Cluster],
                 spawner: dict[str, Any],
                 auth_state: Callable[[str], Any] | None = None,
                 account: Callable[[str], Account | None] | None = None) -> None:
        self.settings = settings
        self.store = store
        self._cluster = cluster
        self.spawner = spawner
        self._auth_state = auth_state
        self._account = account
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: job id -> who asked to cancel it
        self._cancel: dict[str, str] = {}
        #: job id -> when a retry of it was due (the wait metric counts from there)
        self._due: dict[str, float] = {}
        self.restored = False

    @property
    def cluster(self) -> Cluster:
        return self._cluster()

    def profiles(self) -> list[Profile]:
        return load_profiles(self.spawner["profiles"])

    def image_of(self, options: dict[str, Any], profile: Profile) -> tuple[str, bool]:
        """The image a job with ``options`` (its stored ``options``: ``image``,
        ``image--unlisted-choice``) runs in on ``profile``, checked by the spawn form's rules
        (:func:`~gpuspawner.hub.images.choose_image`: the profile's choices, its
        ``validation_regex``, ``c.GPUSpawner.image_deny_patterns`` and
        ``allowed_registries``), and whether the user typed it. No choice: the profile's
        image, else ``c.GPUSpawner.image``.

        Raises:
            JobInputError: field ``image`` or ``image--unlisted-choice``.
        """
        sp = self.spawner
        try:
            image, unlisted = choose_image(
                {k: v for k, v in options.items() if k in IMAGE_KEYS}, profile.image_option,
                profile.slug, check_deny_patterns(sp.get("image_deny_patterns") or []),
                check_allowed_registries(sp.get("allowed_registries") or []))
        except ImageRequestError as e:
            raise JobInputError(e.field, e.reason) from None
        return image or profile.image or str(sp.get("image") or ""), unlisted

    def access(self, user: str, since: float, slug: str,
               stored: list[str]) -> tuple[list[str], Profile]:
        """The groups ``user`` has now and the profile ``slug``, for a job or definition made
        at ``since`` (:func:`check_access` with the hub's account of the user); without a hub
        to ask (``account`` None), the ``stored`` groups.

        Raises:
            NoRights: see :func:`check_access`; also when the hub cannot be asked.
        """
        if self._account is None:
            return check_access(Account(tuple(stored)), user, since, slug, self.profiles())
        try:
            account = self._account(user)
        except Exception as e:  # fail closed: no rights that cannot be read
            raise NoRights(f"the hub could not tell the rights of {user}: {e}") from None
        return check_access(account, user, since, slug, self.profiles())

    async def _check_usage_budget(self, user: str, groups: list[str]) -> None:
        """Refuse a run of ``user``'s while one of their usage budgets is used up
        (:func:`gpuspawner.usage.budgets.check_budgets`; the store is read off the event
        loop). Holders of ``custom:gpuspawner:budget-exempt`` (the hub's account, read now)
        pass.

        Raises:
            BudgetExceeded: naming the budget, its use and when it renews.
        """
        cluster = self.cluster
        policy = getattr(cluster, "usage_budgets", None)
        recorder = getattr(cluster, "usage", None)
        if not policy or recorder is None:
            return
        account = self._account(user) if self._account is not None else None
        scopes = set(account.scopes) if account is not None else set()
        await check_start(recorder.store, policy, user, groups, scopes)

    # -- submission ----------------------------------------------------------------------
    async def submit(self, user: str, groups: list[str], req: JobRequest,
                     max_retries: int | None = None) -> JobRow:
        """Check the request against the hub (profile allowed for the user's groups, time
        limit within the profile's maximum, a bundle that can ever fit, the user's quota and
        active jobs), store the job and start it. ``max_retries``: how often a lost job is
        run again (None: ``c.GPUJobs.default_max_retries``; checked by
        :func:`check_max_retries`).

        Raises:
            JobInputError: field ``profile``, ``time_limit`` or ``max_retries`` (HTTP 400).
            JobRefused: too many active jobs (429, :meth:`check_active_limits`), jobs cannot
                run on this backend (503).
        """
        retries = check_max_retries(max_retries, self.settings.default_max_retries,
                                    self.settings.max_retries_max)
        try:
            profile = choose_profile({"profile": req.profile} if req.profile else {},
                                     self.profiles(), groups)
        except OptionsError as e:
            raise JobInputError("profile", e.reason) from None
        default, maximum = self.settings.time_limits(profile.slug)
        limit = check_time_limit(req.time_limit, default, maximum,
                                 f"profile {profile.slug!r}")
        self.image_of(req.image_options, profile)
        cluster = self.cluster
        check_backend(cluster)
        await cluster.ensure_restored()
        job_id = secrets.token_hex(16)
        owner = Owner(user, job_server(job_id), tuple(groups))
        problem = cluster.ledger.capacity_refusal(profile.bundle, profile.nodes or None)
        if problem is not None:
            raise JobInputError("profile", f"{profile.slug!r} can never be placed: {problem}")
        try:
            if req.at is None:  # a later start is checked then (its turn may find room)
                cluster.ledger.check_quota(profile.bundle, owner)
        except QuotaExceeded as e:
            raise JobInputError("profile", f"{profile.slug!r}: {e}") from None
        self.check_active_limits(user, groups)
        now = time.time()
        row = JobRow(id=job_id, user=user, name=req.name, profile=profile.slug, state="queued",
                     message="", time_limit=limit, notebook=pack(req.notebook), created=now,
                     not_before=req.at)
        if req.at is not None and req.at > now:  # (stored now: no second commit for it)
            row.message = f"scheduled for {iso(req.at)}"
        row.set_json("groups", list(groups))
        row.set_json("parameters", req.parameters)
        row.set_json("gpu_uuids", [])
        row.set_json("history", [["queued", now]])
        row.set_json("options", req.options())
        self.store.session.add(JobRun(job_id=job_id, max_retries=retries, attempt=1,
                                      attempts="[]"))
        self.store.add(row)
        pruned = self.store.prune(user, self.settings.max_kept_jobs_per_user)
        if pruned:
            log.info("jobs of %s: %d ended jobs past max_kept_jobs_per_user deleted", user,
                     len(pruned))
        self.prune_bytes(user)
        log.info("job %s of %s submitted: %s, profile %s, time limit %d s", job_id, user,
                 req.name, profile.slug, limit)
        self._start_task(row.id, self._run(row.id))
        return row

    def prune_bytes(self, user: str) -> list[str]:
        """Keep ``user``'s ended jobs within ``c.GPUJobs.max_kept_bytes_per_user``
        (:meth:`~gpuspawner.hub.jobs.store.JobStore.prune_bytes`, oldest deleted first);
        returns the ids deleted. A failed write is logged, never raised: it is housekeeping."""
        try:
            pruned = self.store.prune_bytes(user, self.settings.max_kept_bytes_per_user)
        except Exception as e:
            log.warning("jobs of %s: pruning to max_kept_bytes_per_user failed: %s", user, e)
            return []
        if pruned:
            log.info("jobs of %s: %d ended jobs past max_kept_bytes_per_user (%d bytes) "
                     "deleted", user, len(pruned), self.settings.max_kept_bytes_per_user)
        return pruned

    def check_active_limits(self, user: str, groups: list[str]) -> None:
        """Refuse one more active job (queued, waiting, starting or running) of ``user`` when
        it would pass the user's limit on concurrent jobs:
        :meth:`~gpuspawner.hub.jobs.settings.GPUJobs.active_jobs_limit` of their groups
        (``c.GPUJobs.max_active_jobs_per_group``, else ``max_active_jobs_per_user``).

        Raises:
            JobRefused: 429, naming the setting, its value and the count.
        """
        cap, setting = self.settings.active_jobs_limit(groups)
        if cap == 0:
            return
        active = self.store.session.scalar(  # a count: the rows hold notebooks
            select(func.count()).select_from(JobRow).where(
                JobRow.user == user, JobRow.state.in_(sorted(ACTIVE_STATES)))) or 0
        if active >= cap:
            raise JobRefused(429, f"{user} has {active} active jobs, the most allowed "
                                  f"({setting} = {cap}); wait for one to end or cancel one")

    def _start_task(self, job_id: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[job_id] = task
        task.add_done_callback(lambda t: self._tasks.pop(job_id, None)
                               if self._tasks.get(job_id) is t else None)

    # -- cancel --------------------------------------------------------------------------
    async def cancel(self, row: JobRow, by: str) -> JobRow:
        """Cancel an active job: leave the queue, or stop its container (SIGTERM, then
        SIGKILL), remove it and release. Returns once it is cancelled.

        Raises:
            JobRefused: 409, it has ended already.
        """
        if not row.active:
            raise JobRefused(409, f"job {row.id} has ended ({row.state}); nothing to cancel")
        self._cancel[row.id] = by
        task = self._tasks.get(row.id)
        # a launch is not interrupted (a container made after its cancel would outlive the
        # job): the cancel waits until it runs, the engine's calls are bounded
        while row.state == "starting" and task is not None and not task.done():
            await asyncio.sleep(0.2)
        if task is not None and not task.done():
            task.cancel()
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # this request was cancelled, the job goes on ending
                    raise
            except Exception:  # logged by the task
                pass
        if row.active:  # no task (an adopted job mid-restore): end it here
            await self._end(row, "cancelled", f"cancelled by {by}")
        return row

    async def remove_owner(self, user: str, why: str) -> tuple[list[str], list[str]]:
        """A user was deleted from the hub: cancel their active jobs (queued ones leave the
        queue, running ones are stopped and released), then delete every record of their
        jobs (the ended ones too: a new account of the same name must not inherit them;
        the outputs stay in the home). Their definitions are deleted by the caller first
        (:meth:`~gpuspawner.hub.jobs.schedule.Scheduler.remove_owner`).

        Args:
            user: the deleted user's name.
            why: who or what removed them, for the jobs' message and the hub log.

        Returns:
            (ids of the jobs cancelled, ids of the job records deleted).
        """
        active = self.store.active(user)

        async def end(row: JobRow) -> None:
            try:
                await self.cancel(row, why)
            except JobRefused:  # it ended meanwhile
                pass
            except Exception:
                log.exception("job %s of deleted user %s: its cancel failed", row.id, user)

        await asyncio.gather(*(end(r) for r in active))
        deleted = self.store.prune(user, 0)
        log.warning("jobs of %s (%s): %d cancelled (%s), %d job records deleted", user, why,
                    len(active), ", ".join(r.id for r in active) or "none", len(deleted))
        return [r.id for r in active], deleted

    # -- one job -------------------------------------------------------------------------
    def _profile(self, row: JobRow) -> Profile:
        for p in self.profiles():
            if p.slug == row.profile:
                return p
        raise LookupError(f"profile {row.profile!r} is no longer configured")

    def _ref(self, row: JobRow) -> ServerRef:
        return ServerRef(row.user, job_server(row.id), job_object_name(row.user, row.id))

    async def _run(self, job_id: str, delay: float = 0.0) -> None:
        """Place, launch and watch one job (its task); a retry first waits ``delay``
        seconds (its back-off)."""
        row = self.store.get(job_id)
        assert row is not None
        try:
            if delay > 0:  # a cancel interrupts it
                await asyncio.sleep(delay)
            await self._place_and_launch(row)
            if row.state == "running":
                await self._watch(row)
        except asyncio.CancelledError:
            by = self._cancel.pop(row.id, None)
            if by is None:  # the hub stops: the job runs on and is adopted after restart
                raise
            self.cluster.queue.forget(row.user, job_server(row.id))
            await self._end(row, "cancelled", f"cancelled by {by}")
        except Exception as e:
            log.exception("job %s failed in the hub", row.id)
            if row.active:
                await self._end(row, "failed", f"the hub could not run it: {e}")

    async def _place_and_launch(self, row: JobRow) -> None:
        cluster = self.cluster
        try:
            profile = self._profile(row)
        except LookupError as e:
            await self._end(row, "failed", str(e))
            return
        if row.not_before is not None and row.not_before > time.time():
            message = f"scheduled for {iso(row.not_before)}"
            if row.message != message:
                row.message = message
                self.store.save()
            while (left := row.not_before - time.time()) > 0:  # a cancel interrupts it
                await asyncio.sleep(min(left, 60.0))
        # the owner's rights now (first run and each retry), not those of the submission
        try:
            groups, profile = self.access(row.user, row.created, row.profile,
                                          row.get_json("groups", []))
        except NoRights as e:
            await self._end(row, "cancelled", f"not run: {e}")
            return
        if groups != row.get_json("groups", []):
            row.set_json("groups", groups)  # its quota and group mounts: the groups now
            self.store.save()
        owner = Owner(row.user, job_server(row.id), tuple(groups))
        try:  # each run and retry: a budget used up refuses it, whenever it was submitted
            await self._check_usage_budget(row.user, groups)
        except BudgetExceeded as e:
            row.set_json("error", {"ename": "BudgetExceeded", "evalue": str(e)})
            await self._end(row, "failed", f"not started: {e}")
            return

        def waiting(entry: Any, position: int, length: int) -> None:
            text = f"waiting: position {position} of {length} for {profile.bundle.describe()}"
            if row.state != "waiting":
                row.set_state("waiting", text)
            else:
                row.message = text
            self.store.save()

        try:
            alloc = await cluster.queue.acquire(
                owner, profile.bundle, profile=profile.slug, nodes=profile.nodes,
                options={"job": row.id}, wait=True, on_wait=waiting,
                priority=self.settings.queue_priority)
        except PlacementError as e:
            await self._end(row, "failed", f"not placed: {e}")
            return
        row.set_json("allocation", alloc.to_dict())
        row.node = alloc.node
        row.set_json("gpu_uuids", list(alloc.gpu_uuids))
        try:  # its wait may have been long: the rights once more before it starts
            groups, _ = self.access(row.user, row.created, row.profile, groups)
        except NoRights as e:
            self.store.save()
            await self._end(row, "cancelled", f"not run: {e}")  # releases its place
            return
        try:  # and its budget: used up meanwhile (the owner's other servers), it does not start
            await self._check_usage_budget(row.user, groups)
        except BudgetExceeded as e:
            row.set_json("error", {"ename": "BudgetExceeded", "evalue": str(e)})
            self.store.save()
            await self._end(row, "failed", f"not started: {e}")  # releases its place
            return
        row.set_json("groups", groups)
        row.set_state("starting", f"placed on {alloc.summary()}")
        self.store.save()
        job_metrics.waited(profile.slug, time.time() - self._due.pop(row.id, max(
            row.created, row.not_before or 0.0)))
        state: dict[str, Any] = {}
        try:
            await cluster.sweep_if_suspect(alloc.node)
            state = await cluster.backend.prepare(self._ref(row), alloc, {})
            row.set_json("backend_state", state)
            self.store.save()
            row.started = time.time()
            attempt = self.run_of(row).attempt
            row.output_dir = "~/" + output_dir(row.name, row.started, row.id) + (
                f"-attempt{attempt}" if attempt > 1 else "")
            await self._check_user_image(row, profile, alloc)
            spec = await self._spec(row, profile, alloc)
            token = current_spawner.set(SimpleNamespace(
                user=SimpleNamespace(name=row.user), name=job_server(row.id),
                user_options={"profile": profile.slug}))
            try:
                await cluster.backend.launch(spec, state, lambda pct, text: None)
            finally:
                current_spawner.reset(token)
        except asyncio.CancelledError:
            row.set_json("backend_state", state)
            raise
        except BaseException as e:
            row.set_json("backend_state", state)
            if isinstance(e, BackendUnavailable):
                cluster.mark_suspect(e.node, str(e))
                await self._end(row, "lost", f"node {alloc.node} does not answer: {e}")
            elif isinstance(e, BackendError | ValueError | OSError):
                await self._end(row, "failed", f"could not start: {e}")
            else:
                raise
            return
        row.set_json("backend_state", state)
        row.set_state("running", f"running on {alloc.node}", when=row.started)
        self.store.save()
        log.info("job %s of %s running on %s (%s)", row.id, row.user, alloc.node,
                 row.output_dir)

    async def _spec(self, row: JobRow, profile: Profile, alloc: Allocation) -> Any:
        """The job's :class:`~gpuspawner.backends.spec.LaunchSpec`: the user's uid/gid and
        home, the site's and the profile's mounts as a server of the user gets them
        (:mod:`gpuspawner.hub.volumes`), the profile's image, ``python3 -c``
        :mod:`gpuspawner.jobs.execute` (the Slurm backend runs its ``job_python``), no port,
        the job's time limit (Slurm's ``--time`` backstop)."""
        uid, gid = await self._user_ids(row)
        sp = self.spawner
        escaped = safe_name(row.user)
        host_home = home_path(sp["home_path_template"], escaped)
        home = HomeMount(host_home, sp["home_mount_point"].format(username=escaped)) \
            if host_home else None
        image, _ = self.image_of(row.get_json("options", {}), profile)
        options = row.get_json("options", {})
        env, _ = notebook_env(row.notebook_dict)
        env.update({
            "USER": row.user,
            "JUPYTER_IMAGE_SPEC": image,
            "PYTHONUNBUFFERED": "1",
            "GPUSPAWNER_JOB_ID": row.id,
            "GPUSPAWNER_JOB_NAME": row.name,
            "GPUSPAWNER_JOB_OUTPUT_DIR": row.output_dir[2:],
            "GPUSPAWNER_JOB_PARAMETERS": row.parameters,
            "GPUSPAWNER_JOB_TIME_LIMIT": str(row.time_limit),
            "GPUSPAWNER_JOB_OUTPUT_FORMATS": ",".join(options.get("output_formats")
                                                      or OUTPUT_FORMATS),
        })
        if options.get("input_folder") is not None:
            env["GPUSPAWNER_JOB_INPUT_FOLDER"] = str(options["input_folder"])
        if home is None:
            env["HOME"] = "/tmp"
        spec = launch_spec(name=job_object_name(row.user, row.id), user=row.user,
                           server=job_server(row.id), allocation=alloc, image=image,
                           cmd=["python3", "-c", EXECUTE_SOURCE], env=env, uid=uid, gid=gid,
                           port=1, home=home, mounts=mounts_for(
                               [*site_volumes(sp.get("volumes"), sp.get("group_volumes")),
                                *profile.volumes], escaped, row.get_json("groups", [])),
                           helper_image=profile.image or str(sp.get("image") or ""))
        # nothing listens: no port
        return replace(spec, port=0, time_limit=int(row.time_limit))

    async def _check_user_image(self, row: JobRow, profile: Profile, alloc: Allocation
                                ) -> None:
        """The job's image checked again now (the site's rules may have changed since the
        submission) and, when the user typed it, on the placed node as a server's own image
        is (:meth:`~gpuspawner.backends.base.Backend.check_image`: pulled within
        ``c.GPUSpawner.image_max_bytes``, the node's architecture, runs as the user).

        Raises:
            ValueError: the image is no longer allowed (the job fails, naming the field).
            ImageRefused: the node's check failed (a BackendError: the job fails).
        """
        try:
            image, unlisted = self.image_of(row.get_json("options", {}), profile)
        except JobInputError as e:
            raise ValueError(str(e)) from None
        if not unlisted:
            return
        uid, gid = await self._user_ids(row)
        sp = self.spawner
        await self.cluster.backend.check_image(
            alloc.node, image, uid, gid, float(sp.get("image_check_timeout") or 60.0),
            lambda pct, text: None, int(sp.get("image_max_bytes") or 0))

    async def _user_ids(self, row: JobRow) -> tuple[int, int]:
        """(uid, gid) as a server of the user would get them: auth_state, then uid_map, then
        the defaults."""
        if self._auth_state is not None:
            ids = ids_from_auth_state(await self._auth_state(row.user))
            if ids is not None:
                return ids
        uid_map = self.spawner["uid_map"]
        if callable(uid_map):
            uid, gid = uid_map(SimpleNamespace(user=SimpleNamespace(name=row.user),
                                               name=job_server(row.id)))
            return int(uid), int(gid)
        entry = (uid_map or {}).get(row.user)
        if entry:
            return int(entry["uid"]), int(entry.get("gid", entry["uid"]))
        return int(self.spawner["default_uid"]), int(self.spawner["default_gid"])

    async def _watch(self, row: JobRow) -> None:
        """Poll the running job until it ends or reaches its time limit."""
        backend = self.cluster.backend
        state = row.get_json("backend_state", {})
        deadline = (row.started or time.time()) + row.time_limit
        silent_since: float | None = None  # the node has not answered since then
        while True:
            try:
                code = await backend.poll(state)
                silent_since = None
            except Exception as e:  # BackendUnavailable, or an engine's error or timeout
                # one failed call (a dropped connection) is no lost node: lost_after seconds
                silent_since = silent_since or time.time()
                if time.time() - silent_since >= self.settings.lost_after:
                    if isinstance(e, BackendUnavailable):
                        self.cluster.mark_suspect(e.node, str(e))
                    await self._end(row, "lost", f"node {row.node} has not answered for "
                                    f"{self.settings.lost_after:g} s: {e}")
                    return
                log.warning("job %s: node %s does not answer (%s); asking again", row.id,
                            row.node, e)
                code = None
            if code is not None:
                await self._collect(row, code)
                return
            sick = self._unhealthy_gpu(row)
            if sick is not None:
                await self._end(row, "lost", f"its GPU {sick[0]} on node {row.node} was "
                                f"drained as unhealthy: {sick[1]}")
                return
            left = deadline - time.time()
            if left <= 0:
                await self._end(row, "timed_out", f"time limit of {row.time_limit} s reached: "
                                "stopped (SIGTERM, then SIGKILL)")
                return
            await asyncio.sleep(min(self.settings.poll_interval, left))

    def _unhealthy_gpu(self, row: JobRow) -> tuple[str, str] | None:
        """(uuid, reason) of a GPU of the job that the health check drained, else None (an
        admin's drain lets running work run on)."""
        records = self.cluster.drain_records()
        for uuid in row.get_json("gpu_uuids", []):
            rec = records.get(uuid)
            if rec is not None and rec.by == HEALTH:
                return uuid, rec.reason
        return None

    async def _collect(self, row: JobRow, code: int) -> None:
        """The job's program ended with ``code``: read its result, then end it."""
        state = row.get_json("backend_state", {})
        out = None
        for attempt in range(3):  # a dropped connection to the engine is asked again
            try:
                out = await self.cluster.backend.read_output(state,
                                                             self.settings.max_output_bytes)
                break
            except BackendError as e:
                log.warning("job %s: reading its output failed: %s", row.id, e)
                await asyncio.sleep(1.0 + attempt)
        too_large = None
        try:
            # the result is the user's: decompressed no further than the hub reads back
            result = parse_output(out, self.settings.max_output_bytes) if out else None
        except ResultTooLarge as e:
            result, too_large = None, e
        if out:
            self._keep_log(row, out)
        if result is not None and isinstance(result.get("html"), str):
            self.run_of(row).html = pack(result["html"])
        row.exit_code = code
        if too_large is not None:
            kept = (f"{too_large}, so the executed notebook stays in the home only "
                    f"({row.output_dir})")
            if code == 0:
                await self._end(row, "completed", f"the notebook ran to its end; {kept}")
            else:
                await self._end(row, "failed", f"exit status {code}; {kept}")
            return
        if result is None:
            report = None
            try:
                report = await self.cluster.backend.exit_report(state)
            except Exception:
                pass
            if row.started is not None and time.time() >= row.started + row.time_limit:
                # the backend's own limit (Slurm's --time) ended it while the hub did not
                await self._end(row, "timed_out", f"time limit of {row.time_limit} s "
                                "reached: ended by the backend's own limit" +
                                (f" ({report})" if report else ""))
                return
            lost = await self._node_lost(row, state)
            if lost:
                await self._end(row, "lost", f"it ended without a result: {lost}")
                return
            if code == 0:
                await self._end(row, "lost", "its container was gone or handed over no result")
            elif code == KILLED_FROM_INSIDE:
                await self._end(row, "failed", f"exit status {code}: its program was ended "
                                "by a signal sent from inside the job (not retried)" +
                                (f"; {report}" if report else ""))
            elif code in KILLED_FROM_OUTSIDE and "out of memory" not in (report or ""):
                await self._end(row, "lost", f"its program was stopped from outside the hub "
                                f"(exit status {code}: {KILLED_FROM_OUTSIDE[code]}; the "
                                "engine stopped, or someone stopped its container)")
            else:
                await self._end(row, "failed", f"exit status {code}" +
                                (f": {report}" if report else ""))
            return
        if result.get("notebook") is not None:
            row.output = pack(result["notebook"])
        error = result.get("error")
        row.set_json("error", error)
        if code == 0:
            await self._end(row, "completed", "the notebook ran to its end")
        else:
            where = f"cell {error.get('cell')}: " if error and error.get("cell") else ""
            what = f"{error.get('ename')}: {error.get('evalue')}" if error else ""
            await self._end(row, "failed", f"exit status {code}" +
                            (f"; {where}{what}" if what else ""))

    async def _node_lost(self, row: JobRow, state: dict[str, Any]) -> str:
        """Why the job's program, which ended without a result, was lost with its node, in
        words; "" when it was not. The engine's own word first (``backend.node_failure``:
        Slurm's NODE_FAIL), else the node's state asked at once (a node set down a moment
        ago, as the spawner asks for a server that ended); a drained node is no failure
        (running work runs on there). A lost node is marked suspect: no new placement there
        until a health check sees it up, and it is swept first."""
        if not row.node:
            return ""
        cluster = self.cluster
        try:
            why = await cluster.backend.node_failure(state)
        except Exception as e:
            log.warning("job %s: asking whether its node failed: %s", row.id, e)
            why = None
        if why:
            cluster.mark_suspect(row.node, why)
            return why
        try:
            await cluster.refresh_health(max_age=0)
        except Exception as e:
            log.warning("job %s: reading the nodes' states failed: %s", row.id, e)
            return ""
        node_state, reason = cluster.ledger.node_state(row.node)
        return f"its node {row.node} is down ({reason})" if node_state == "down" else ""

    async def _end(self, row: JobRow, final: str, message: str) -> None:
        """Stop and remove what the job has on its node, release its allocation, record its
        final state; a ``lost`` job with retries left is queued again instead
        (:meth:`_retry`). Never raises for the engine: a node that does not answer is marked
        suspect (its containers are swept before it takes new work)."""
        now = await self._teardown(row)
        if final == "lost" and row.id not in self._cancel and self._retry(row, message, now):
            return
        run = self.store.session.get(JobRun, row.id)
        if final == "lost" and run is not None and run.max_retries:
            message += f" (no retries left: {run.max_retries} used)"
        row.finished = now
        row.set_state(final, message, when=row.finished)
        row.set_json("backend_state", None)
        self.store.save()
        self.prune_bytes(row.user)  # its log and result now count
        log.log(logging.INFO if final in ("completed", "cancelled") else logging.WARNING,
                "job %s of %s %s: %s", row.id, row.user, final, message)

    async def _teardown(self, row: JobRow) -> float:
        """What ends an attempt: keep its log (when not kept yet), stop and remove its
        container and network, release its allocation, count its GPU-seconds. Returns when
        it ended (seconds since the epoch)."""
        cluster = self.cluster
        backend = cluster.backend
        state = row.get_json("backend_state", {}) or {}
        alloc_d = row.get_json("allocation")
        alloc = Allocation.from_dict(alloc_d) if alloc_d else None
        if launched(state):
            run = self.run_of(row)
            if str(run.attempt) not in unpack(run.logs, {}):
                try:  # what it logged until now: the container goes next
                    out = await asyncio.wait_for(backend.read_output(
                        state, self.settings.max_log_bytes + 2**16), LOG_READ_TIMEOUT_S)
                    if out:
                        self._keep_log(row, out)
                except (BackendError, asyncio.TimeoutError, OSError) as e:
                    log.warning("job %s: reading its log failed: %s", row.id, e)
            try:
                await backend.stop(state)  # SIGTERM, the backend's grace, SIGKILL, remove
            except BackendUnavailable as e:
                cluster.mark_suspect(e.node, str(e))
            except Exception as e:
                log.warning("job %s: stop failed: %s", row.id, e)
        if alloc is not None or state:
            await backend.cleanup(alloc, state)
        if alloc is not None:  # what its state does not name (a launch cut short)
            try:
                await backend.remove_server(alloc.node, self._ref(row))
            except BackendError as e:
                log.warning("job %s: removing its objects by label failed: %s", row.id, e)
        if alloc is not None and cluster.ledger.get(alloc.id) is not None:
            cluster.ledger.release(alloc.id, missing_ok=True)
            cluster.queue.kick()
        now = time.time()
        if alloc is not None and row.started is not None and alloc.total_gpu_milli:
            job_metrics.gpu_seconds(row.profile, alloc.total_gpu_milli / 1000.0 *
                                    max(0.0, now - row.started))
        return now

    def _retry(self, row: JobRow, message: str, now: float) -> bool:
        """Queue a lost job again when it has retries left (Kubernetes Job ``backoffLimit``:
        ``max_retries`` runs after the first; the back-off doubles from
        ``c.GPUJobs.retry_backoff`` up to :data:`RETRY_BACKOFF_MAX_S`). The ended attempt is
        kept in its :class:`~gpuspawner.hub.jobs.store.JobRun` (its folder stays in the
        home; the next attempt writes a folder of its own). Returns False when none is left.
        """
        run = self.run_of(row)
        used = run.attempt - 1
        if used >= run.max_retries:
            return False
        summary = {"attempt": run.attempt, "state": "lost", "message": message,
                   "node": row.node or None, "gpu_uuids": row.get_json("gpu_uuids", []),
                   "started": iso(row.started), "finished": iso(now),
                   "exit_code": row.exit_code, "output_dir": row.output_dir or None}
        run.attempts = json.dumps([*json.loads(run.attempts or "[]"), summary])
        run.attempt += 1
        delay = min(self.settings.retry_backoff * 2 ** used, RETRY_BACKOFF_MAX_S)
        row.set_state("lost", message, when=now)
        row.node, row.started, row.exit_code, row.output, row.output_dir = "", None, None, \
            None, ""
        for column in ("allocation", "backend_state", "error"):
            row.set_json(column, None)
        row.set_json("gpu_uuids", [])
        row.set_state("queued", f"lost ({message}); attempt {run.attempt} of "
                                f"{run.max_retries + 1} starts in {delay:g} s", when=now)
        self._due[row.id] = now + delay
        self.store.save()
        log.warning("job %s of %s lost: %s; retry %d of %d in %g s", row.id, row.user,
                    message, used + 1, run.max_retries, delay)
        self._start_task(row.id, self._run(row.id, delay))
        return True

    # -- attempts, logs, HTML -----------------------------------------------------------------
    def run_of(self, row: JobRow) -> JobRun:
        """The job's :class:`~gpuspawner.hub.jobs.store.JobRun` (made for a job stored
        before there were any: attempt 1, no retries; written with the next save)."""
        run = self.store.session.get(JobRun, row.id)
        if run is None:
            run = JobRun(job_id=row.id, max_retries=0, attempt=1, attempts="[]")
            self.store.session.add(run)
        return run

    def _keep_log(self, row: JobRow, out: bytes) -> None:
        """Keep the current attempt's log: the job's output less its result frame, its last
        ``c.GPUJobs.max_log_bytes`` (a first line says when it was cut)."""
        text = strip_result(out.decode("utf-8", "replace"))
        cap = self.settings.max_log_bytes
        if len(text) > cap:
            text = f"[... the first {len(text) - cap} characters are cut ...]\n" + text[-cap:]
        run = self.run_of(row)
        logs = unpack(run.logs, {})
        logs[str(run.attempt)] = text
        run.logs = pack(logs)

    async def log_text(self, row: JobRow) -> str | None:
        """The job's log: each attempt's (a header line per attempt once there were
        several), the running attempt's read from its container now. None while there is
        none (it has not started)."""
        run = self.store.session.get(JobRun, row.id)
        attempt = run.attempt if run is not None else 1
        logs = unpack(run.logs, {}) if run is not None else {}
        state = row.get_json("backend_state", {}) or {}
        if row.active and launched(state) and str(attempt) not in logs:
            try:
                out = await asyncio.wait_for(self.cluster.backend.read_output(
                    state, self.settings.max_log_bytes), LOG_READ_TIMEOUT_S)
            except (BackendError, asyncio.TimeoutError, OSError) as e:
                out = f"[the log cannot be read now: {e}]\n".encode()
            if out:
                logs[str(attempt)] = strip_result(out.decode("utf-8", "replace"))
        ended = {a["attempt"]: a for a in json.loads(run.attempts or "[]")} if run else {}
        parts = []
        for n in range(1, attempt + 1):
            text = logs.get(str(n))
            if attempt > 1:
                a = ended.get(n)
                where = f" on {a['node']}, {a['state']}: {a['message']}" if a else \
                    f" ({row.state})"
                parts.append(f"===== attempt {n}{where} =====\n")
            if text is not None:
                parts.append(text if text.endswith("\n") or not text else text + "\n")
        return "".join(parts) if any(str(n) in logs for n in range(1, attempt + 1)) \
            else None

    def html_of(self, row: JobRow) -> str | None:
        """The HTML export of the job's executed notebook, or None."""
        run = self.store.session.get(JobRun, row.id)
        return unpack(run.html, None) if run is not None else None

    # -- after a hub restart -------------------------------------------------------------
    async def restore(self) -> None:
        """Adopt the jobs the database has as active (see the module's docstring); remove
        and release job allocations that no active job owns."""
        cluster = self.cluster
        await cluster.ensure_restored()
        active = {row.id: row for row in self.store.active()}
        for alloc in cluster.ledger.allocations():
            if not is_job_server(alloc.owner.server):
                continue
            job_id = alloc.owner.server.split("/", 1)[1]
            if job_id in active:
                continue
            log.warning("job allocation %s of %s has no active job: removing and releasing",
                        alloc.id, alloc.owner.user)
            try:
                await cluster.backend.remove_server(alloc.node, ServerRef(
                    alloc.owner.user, alloc.owner.server,
                    job_object_name(alloc.owner.user, job_id)))
            except BackendError as e:
                log.warning("job allocation %s: %s", alloc.id, e)
            cluster.ledger.release(alloc.id, missing_ok=True)
        for row in active.values():
            try:
                await self._restore_one(cluster, row)
            except Exception:
                log.exception("job %s: restore failed", row.id)
        self.restored = True

    async def _restore_one(self, cluster: Cluster, row: JobRow) -> None:
        found = cluster.ledger.find(row.user, job_server(row.id))
        state = row.get_json("backend_state", {}) or {}
        if row.state in ("queued", "waiting"):
            if found is not None:  # placed just before the hub stopped: start it again
                cluster.ledger.release(found.id, missing_ok=True)
            self._start_task(row.id, self._run(row.id))
            return
        if row.state == "running" and launched(state):
            try:
                code = await cluster.backend.poll(state)
            except BackendUnavailable:
                code = None  # its node is down now: watch it; lost_after decides
            if code is not None:  # it ended while the hub was down: its result is there
                log.info("job %s of %s ended with %s while the hub was down", row.id,
                         row.user, code)
                self._start_task(row.id, self._collected(row, code))
                return
            if found is None:  # runs, but its labels were not read: book it from the row
                alloc = Allocation.from_dict(row.get_json("allocation"))
                problems = [c.problem for c in cluster.ledger.restore([alloc]).conflicts]
                if problems:
                    await self._end(row, "lost", "after a hub restart its allocation could "
                                    f"not be booked again: {'; '.join(problems)}")
                    return
                found = alloc
            log.info("job %s of %s adopted after a hub restart", row.id, row.user)
            row.set_json("allocation", found.to_dict())
            self._start_task(row.id, self._adopted(row))
            return
        if found is not None and not state:
            try:
                await cluster.backend.remove_server(found.node, self._ref(row))
            except BackendError as e:
                log.warning("job %s: %s", row.id, e)
        await self._end(row, "lost", f"the hub restarted while it was {row.state} and its "
                                     "container was not found")

    async def _collected(self, row: JobRow, code: int) -> None:
        try:
            await self._collect(row, code)
        except Exception as e:
            log.exception("job %s failed in the hub", row.id)
            if row.active:
                await self._end(row, "failed", f"the hub could not collect it: {e}")

    async def _adopted(self, row: JobRow) -> None:
        try:
            await self._watch(row)
        except asyncio.CancelledError:
            by = self._cancel.pop(row.id, None)
            if by is None:
                raise
            await self._end(row, "cancelled", f"cancelled by {by}")
        except Exception as e:
            log.exception("job %s failed in the hub", row.id)
            if row.active:
                await self._end(row, "failed", f"the hub could not watch it: {e}")

    async def stop(self) -> None:
        """Stop watching (tests; at hub shutdown the jobs run on)."""
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- views ---------------------------------------------------------------------------
    def view(self, row: JobRow) -> dict[str, Any]:
        """The job as the REST API answers it (:func:`job_view` with its place in the queue
        and its attempts)."""
        return job_view(row, self.position(row), self.store.session.get(JobRun, row.id))

    def position(self, row: JobRow) -> tuple[int, int] | None:
        """(position, length) in the wait queue while the job waits, else None."""
        q = self.cluster.queue
        if q is None or row.state not in ("queued", "waiting"):
            return None
        entry = q.wq.find(row.user, job_server(row.id))
        return q.position(entry.id) if entry is not None else None


def iso(t: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in UTC (None stays None)."""
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def job_view(row: JobRow, position: tuple[int, int] | None = None,
             run: JobRun | None = None) -> dict[str, Any]:
    """A job as the REST API answers it (``run``: its attempts; None: attempt 1 of 1)."""
    return {
        "attempt": run.attempt if run is not None else 1,
        "max_retries": run.max_retries if run is not None else 0,
        "attempts": json.loads(run.attempts or "[]") if run is not None else [],
        "has_html": bool(run is not None and run.html),
        "id": row.id, "user": row.user, "name": row.name, "profile": row.profile,
        "state": row.state, "message": row.message, "time_limit": row.time_limit,
        "parameters": row.get_json("parameters", {}),
        "created": iso(row.created), "at": iso(row.not_before), "started": iso(row.started),
        "finished": iso(row.finished),
        "history": [{"state": s, "time": iso(t)} for s, t in row.get_json("history", [])],
        "node": row.node or None, "gpu_uuids": row.get_json("gpu_uuids", []),
        "exit_code": row.exit_code, "error": row.get_json("error"),
        "output_dir": row.output_dir or None, "has_output": bool(row.output),
        "queue_position": list(position) if position else None,
        "definition_id": row.definition_id,  # the job definition whose tick made it
        **options_view(row.get_json("options", {})),
    }


def options_view(options: dict[str, Any]) -> dict[str, Any]:
    """A job's or definition's stored ``options`` as the REST API answers them: ``image``
    and ``image--unlisted-choice`` (null: none), ``output_formats`` (all when the row is
    older than them), ``input_folder``."""
    return {**{k: options.get(k) or None for k in IMAGE_KEYS},
            "output_formats": list(options.get("output_formats") or OUTPUT_FORMATS),
            "input_folder": options.get("input_folder")}


def output_size(row: JobRow) -> int:
    """Bytes of the executed notebook's JSON (0 when none)."""
    return len(zlib.decompress(row.output)) if row.output else 0


__all__ = ["JOB_BACKENDS", "Account", "JobRefused", "JobRunner", "NoRights", "check_access",
           "check_backend", "check_max_retries",
           "job_view", "launched", "options_view", "output_size", "strip_result"]
