"""Notebook jobs in the ``gpuspawner`` service (inside the hub process): the REST handlers of
``api/jobs`` and the start of the :class:`~gpuspawner.hub.jobs.runner.JobRunner` once the hub
runs.

=====================================  ======  ==============================================
``api/jobs``                           POST    submit: ``{"notebook": {...}, "profile": slug,
                                               "parameters": {...}, "time_limit": s,
                                               "name": "..."}`` -> 201 and the job
``api/jobs``                           GET     the caller's jobs (admins: everyone's;
                                               ``?user=NAME`` for one user's)
``api/jobs/{id}``                      GET     one job (404 for another user's);
                                               ``api/jobs?definition_id=ID``: a definition's
``api/jobs/{id}``                      DELETE  cancel -> the job, ``cancelled``; 409 if ended
``api/jobs/{id}/output``               GET     the executed notebook (``.ipynb`` JSON;
                                               ``?format=html``: its HTML export)
``api/jobs/{id}/log``                  GET     the job's log (text; every attempt's)
``api/job_definitions``                POST    a notebook on a cron schedule: the job's
                                               fields and ``schedule``, ``timezone``,
                                               ``concurrency_policy``, ``starting_deadline``,
                                               ``paused`` -> 201 and the definition
``api/job_definitions``                GET     the caller's definitions (admins: all)
``api/job_definitions/{id}``           GET     one definition
``api/job_definitions/{id}``           PATCH   pause/resume (``{"paused": bool}``), a new
                                               schedule, time zone, policy, deadline,
                                               notebook, parameters, profile, time limit,
                                               name, image, output formats, input folder
``api/job_definitions/{id}/jobs``      POST    a job of it now (``{"parameters": ...}``)
``api/job_definitions/{id}``           DELETE  delete it (its jobs stay)
=====================================  ======  ==============================================

Bad input is HTTP 400 with the field first in the message (``time_limit: ...``); nothing is
stored or started then.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timezone
from typing import Any

from tornado import web

from ...jobs.model import (
    JobInputError,
    Limits,
    check_parameters,
    parse_definition,
    parse_definition_update,
    parse_submission,
)
from ..service_base import ServiceHandler as _Base
from ..service_base import hub_app as _hub_app
from ..service_base import hub_cluster
from ..spawner import GPUSpawner
from ..state import state_file
from . import metrics as job_metrics
from .runner import Account, JobRefused, JobRunner
from .schedule import Scheduler, definition_view
from .settings import JOBS_DB_FILE, GPUJobs, spawner_values
from .store import DefinitionRow, JobRow, JobStore

log = logging.getLogger("gpuspawner")

#: a job id in a path
JOB_ID = r"([0-9a-f]{32})"
#: seconds a request waits for the runner to be ready after a hub start
READY_WAIT_S = 60.0


class Jobs:
    """The jobs part of one service: the runner, made once the hub runs (:func:`start`)."""

    def __init__(self) -> None:
        self.runner: JobRunner | None = None
        self.enabled = True
        self.ready = asyncio.Event()
        self.error = ""
        self.task: asyncio.Future[None] | None = None
        #: the scheduler of job definitions (started with the runner)
        self.scheduler: Scheduler | None = None
        #: the hub's event loop (user deletions are handed to it)
        self.loop: asyncio.AbstractEventLoop | None = None


async def _auth_state(name: str) -> dict[str, Any] | None:
    from jupyterhub import orm

    app = _hub_app()
    found = orm.User.find(app.db, name)
    if found is None:
        return None
    return await app.users[found].get_auth_state()


def _account(name: str) -> Account | None:
    """A user's account now (the hub's database: groups, when it was made), read at each
    placement of a job and each tick of a definition; None when the hub has no such user."""
    from jupyterhub import orm

    app = _hub_app()
    u = orm.User.find(app.db, name)
    if u is None:
        return None
    from jupyterhub.scopes import get_scopes_for

    created = u.created.replace(tzinfo=timezone.utc).timestamp() if u.created else None
    return Account(tuple(sorted(g.name for g in u.groups)), created,
                   frozenset(get_scopes_for(u)))


#: the jobs part the hub's user deletions go to (one hub per process)
_DELETIONS: list[Jobs] = []


def _user_deleted(mapper: Any, connection: Any, target: Any) -> None:
    """SQLAlchemy's ``after_delete`` of the hub's ``orm.User`` (``DELETE
    /hub/api/users/NAME``, the admin page): remove the user's jobs and definitions once the
    deletion is committed (:func:`remove_deleted_owner`)."""
    name = getattr(target, "name", None)
    if not name or not _DELETIONS:
        return
    jobs = _DELETIONS[-1]
    loop = jobs.loop
    if loop is not None:
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(
            remove_deleted_owner(jobs, name)))


async def remove_deleted_owner(jobs: Jobs, name: str) -> None:
    """A hub user was deleted: delete their definitions, cancel their active jobs and delete
    their job records (:meth:`JobRunner.remove_owner`), logged in the hub's log. Nothing when
    the hub still has a user of that name (the deletion was rolled back)."""
    try:
        if _account(name) is not None:
            return
        if jobs.scheduler is not None:
            jobs.scheduler.remove_owner(name)
        if jobs.runner is not None:
            await jobs.runner.remove_owner(name, f"the hub: its owner {name} was deleted")
    except Exception:
        log.exception("jobs of deleted user %s: not removed", name)


async def remove_gone_owners(jobs: Jobs) -> None:
    """At start: the owners of active jobs and of definitions that the hub no longer knows
    (deleted while this process did not watch) lose them as a deletion would."""
    assert jobs.runner is not None
    store = jobs.runner.store
    users = {r.user for r in store.active()} | {d.user for d in store.definitions()}
    for name in sorted(users):
        if _account(name) is None:
            await remove_deleted_owner(jobs, name)


async def start(jobs: Jobs, *, deadline_s: float = 300.0) -> None:
    """Once the hub's API answers: read ``c.GPUJobs``, open the database, restore the jobs
    (:meth:`JobRunner.restore`) and let requests in."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:  # the hub's configuration is complete once JupyterHub.start has run
        try:
            app = _hub_app()
            if getattr(app, "hub", None) is not None and app.users is not None:
                break
        except (web.HTTPError, AttributeError):
            pass
        if loop.time() > end:
            jobs.error = "the hub did not start"
            return
        await asyncio.sleep(0.5)
    try:
        settings = GPUJobs(config=app.config)
        jobs.enabled = settings.enabled
        if not settings.enabled:
            return
        cls = app.spawner_class
        if not (isinstance(cls, type) and issubclass(cls, GPUSpawner)):
            jobs.enabled = False
            return
        values = spawner_values(app)
        url = settings.db_url or "sqlite:///" + state_file(
            str(values["state_dir"] or ""), str(app.db_url), JOBS_DB_FILE)
        store = JobStore(url)
        runner = JobRunner(settings, store, hub_cluster, values, _auth_state,
                           account=_account)
        await runner.restore()
        job_metrics.register(store)
        jobs.runner = runner
        jobs.scheduler = Scheduler(runner, account=_account)
        jobs.loop = loop
        _DELETIONS[:] = [jobs]
        from jupyterhub import orm
        from sqlalchemy import event

        if not event.contains(orm.User, "after_delete", _user_deleted):
            event.listen(orm.User, "after_delete", _user_deleted)
        await remove_gone_owners(jobs)
        jobs.scheduler.start()
        log.info("notebook jobs: ready (%s; %d active)", url.split("?")[0],
                 len(store.active()))
    except Exception as e:
        log.exception("notebook jobs: cannot start")
        jobs.error = str(e)
    finally:
        jobs.ready.set()


# -- handlers ----------------------------------------------------------------------------
#: a submission's body may be this many times its notebook's and parameters' limits ...
BODY_FACTOR = 4
#: ... plus this many bytes
BODY_SLACK = 64 * 2**10


async def parse_off_loop(parse: Any, *args: Any, **kw: Any) -> Any:
    """``parse(*args, **kw)`` in a worker thread (:func:`asyncio.to_thread`), so that checking
    a large notebook does not hold up the hub's other requests; a ``RecursionError`` (a
    notebook nested deeper than its check goes) is a :class:`JobInputError`.

    Raises:
        JobInputError: what ``parse`` raises, or the nesting.
    """
    try:
        return await asyncio.to_thread(parse, *args, **kw)
    except RecursionError:
        raise JobInputError("notebook: nested too deeply") from None


class _JobsBase(_Base):
    async def runner(self) -> JobRunner:
        jobs: Jobs | None = getattr(self.service, "jobs", None)
        if jobs is None:
            raise web.HTTPError(404, "notebook jobs are not set up in this service")
        try:
            await asyncio.wait_for(jobs.ready.wait(), READY_WAIT_S)
        except asyncio.TimeoutError:
            raise web.HTTPError(503, "notebook jobs are not ready yet; try again") from None
        if not jobs.enabled:
            raise web.HTTPError(404, "notebook jobs are off on this hub (c.GPUJobs.enabled)")
        if jobs.runner is None:
            raise web.HTTPError(503, f"notebook jobs could not start: {jobs.error}")
        return jobs.runner

    def groups_of(self, user: dict[str, Any]) -> list[str]:
        info = self.service.user_lookup(user["name"])
        if info is not None:
            return list(info[1])
        return list(user.get("groups") or [])

    async def own_job(self, job_id: str) -> tuple[JobRunner, JobRow]:
        """The job, when the caller may see it (its owner, or an admin); else 404."""
        user = self.require_user()
        runner = await self.runner()
        row = runner.store.get(job_id)
        if row is None or (row.user != user["name"] and not self.is_admin(user)):
            raise web.HTTPError(404, f"no job {job_id}")
        return runner, row

    def write_job(self, runner: JobRunner, row: JobRow, status: int = 200) -> None:
        self.write_json(runner.view(row), status)

    def json_body(self, limits: Limits) -> Any:
        """The request's body as JSON, read only when it is no larger than a submission may
        be: :data:`BODY_FACTOR` times the notebook's and the parameters' limits (their JSON
        as sent may be longer than as the model measures it; a notebook past its own limit
        gets the 400 naming it) plus :data:`BODY_SLACK`.

        Raises:
            web.HTTPError: 413 for a larger body (before it is parsed: parsing runs on the
                hub's event loop), 400 when it is not JSON or nests deeper than the parser
                goes (``RecursionError``, else an HTTP 500).
        """
        most = (BODY_FACTOR * (limits.max_notebook_bytes + limits.max_parameters_bytes)
                + BODY_SLACK)
        return self.read_json_body(most, "a submission may have")


class JobsHandler(_JobsBase):
    """``GET api/jobs`` (own; admins all, or ``?user=``), ``POST api/jobs`` (submit)."""

    async def get(self) -> None:
        user = self.require_user()
        runner = await self.runner()
        wanted = self.get_query_argument("user", None)
        definition_id = self.get_query_argument("definition_id", None)  # one definition's
        if self.is_admin(user):
            rows = runner.store.list(wanted, definition_id=definition_id)
        else:
            if wanted is not None and wanted != user["name"]:
                raise web.HTTPError(403, f"{user['name']} may not list another user's jobs")
            rows = runner.store.list(user["name"], definition_id=definition_id)
        self.write_json({"jobs": [runner.view(r) for r in rows]})

    async def post(self) -> None:
        user = self.require_user()
        if user.get("kind", "user") != "user":
            raise web.HTTPError(403, "jobs are submitted by users (a user's token), not "
                                     "services")
        runner = await self.runner()
        body = self.json_body(runner.settings.limits)
        # max_retries is the job runner's (check_max_retries), the rest the model's
        retries = body.pop("max_retries", None) if isinstance(body, dict) else None
        try:
            # the notebook's check (nbformat) takes seconds on a large one: off the event loop
            req = await parse_off_loop(parse_submission, body, runner.settings.limits)
            row = await runner.submit(user["name"], self.groups_of(user), req,
                                      max_retries=retries)
        except JobInputError as e:
            raise web.HTTPError(400, str(e).replace("%", "%%")) from None
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e).replace("%", "%%")) from None
        self.set_header("Location", f"{self.service.prefix}api/jobs/{row.id}")
        self.write_job(runner, row, 201)


class JobHandler(_JobsBase):
    """``GET api/jobs/{id}``, ``DELETE api/jobs/{id}`` (cancel)."""

    async def get(self, job_id: str) -> None:
        runner, row = await self.own_job(job_id)
        self.write_job(runner, row)

    async def delete(self, job_id: str) -> None:
        runner, row = await self.own_job(job_id)
        try:
            await runner.cancel(row, self.current_user["name"])
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_job(runner, row)


class JobOutputHandler(_JobsBase):
    """``GET api/jobs/{id}/output``: the executed notebook; ``?format=html``: its HTML
    export."""

    async def get(self, job_id: str) -> None:
        runner, row = await self.own_job(job_id)
        fmt = self.get_query_argument("format", "ipynb")
        if fmt == "html":
            self.write_html(runner, row)
            return
        if fmt != "ipynb":
            raise web.HTTPError(400, f"format: {fmt[:40]!r} is not one of ipynb, html")
        nb = row.output_notebook
        if nb is None:
            where = f"; what it wrote is in {row.output_dir}" if row.output_dir else ""
            raise web.HTTPError(404, f"job {job_id} ({row.state}) has no executed notebook "
                                     f"here{where}")
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("Content-Disposition", f'attachment; filename="{row.name}.ipynb"')
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(nb))


    def write_html(self, runner: JobRunner, row: JobRow) -> None:
        """The HTML export as a download. It holds what the notebook printed, scripts
        included, and the service shares the hub's origin: it is sent as an attachment with
        a sandboxing Content-Security-Policy, so a browser never runs it as the hub's page.
        """
        html = runner.html_of(row)
        if html is None:
            where = f"; what it wrote is in {row.output_dir}" if row.output_dir else ""
            raise web.HTTPError(404, f"job {row.id} ({row.state}) has no HTML export "
                                     f"here{where}")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{row.name}.html"')
        self.set_header("Content-Security-Policy", "sandbox")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")
        self.finish(html.encode("utf-8"))


class JobLogHandler(_JobsBase):
    """``GET api/jobs/{id}/log``: the job's log as text (papermill's lines and the cells'
    output; each attempt's, read from the running container or Slurm job while it runs)."""

    async def get(self, job_id: str) -> None:
        runner, row = await self.own_job(job_id)
        text = await runner.log_text(row)
        if text is None:
            raise web.HTTPError(404, f"job {job_id} ({row.state}) has no log yet")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")
        self.finish(text.encode("utf-8"))


# -- job definitions ---------------------------------------------------------------------
class _DefinitionsBase(_JobsBase):
    async def scheduler(self) -> Scheduler:
        await self.runner()
        scheduler: Scheduler | None = self.service.jobs.scheduler
        if scheduler is None:
            raise web.HTTPError(503, "the scheduler of job definitions is not running")
        return scheduler

    async def own_definition(self, definition_id: str) -> tuple[Scheduler, DefinitionRow]:
        """The definition, when the caller may see it (its owner, or an admin); else 404."""
        user = self.require_user()
        scheduler = await self.scheduler()
        row = scheduler.store.get_definition(definition_id)
        if row is None or (row.user != user["name"] and not self.is_admin(user)):
            raise web.HTTPError(404, f"no job definition {definition_id}")
        return scheduler, row

    def write_definition(self, scheduler: Scheduler, row: DefinitionRow,
                         status: int = 200) -> None:
        self.write_json(definition_view(row, scheduler.store.active_of(row.id)), status)


class DefinitionsHandler(_DefinitionsBase):
    """``GET api/job_definitions`` (own; admins all, or ``?user=``), ``POST`` (create)."""

    async def get(self) -> None:
        user = self.require_user()
        scheduler = await self.scheduler()
        wanted = self.get_query_argument("user", None)
        if self.is_admin(user):
            rows = scheduler.store.definitions(wanted)
        else:
            if wanted is not None and wanted != user["name"]:
                raise web.HTTPError(403, f"{user['name']} may not list another user's job "
                                         "definitions")
            rows = scheduler.store.definitions(user["name"])
        self.write_json({"job_definitions": [
            definition_view(r, scheduler.store.active_of(r.id)) for r in rows]})

    async def post(self) -> None:
        user = self.require_user()
        if user.get("kind", "user") != "user":
            raise web.HTTPError(403, "job definitions are made by users (a user's token), "
                                     "not services")
        scheduler = await self.scheduler()
        settings = scheduler.runner.settings
        body = self.json_body(settings.limits)
        try:
            req = await parse_off_loop(parse_definition, body, settings.limits,
                                       seconds=settings.cron_seconds)
            row = scheduler.create(user["name"], self.groups_of(user), req)
        except JobInputError as e:
            raise web.HTTPError(400, str(e).replace("%", "%%")) from None
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e).replace("%", "%%")) from None
        self.set_header("Location", f"{self.service.prefix}api/job_definitions/{row.id}")
        self.write_definition(scheduler, row, 201)


class DefinitionHandler(_DefinitionsBase):
    """``GET``, ``PATCH`` (pause/resume, schedule), ``DELETE api/job_definitions/{id}``."""

    async def get(self, definition_id: str) -> None:
        scheduler, row = await self.own_definition(definition_id)
        self.write_definition(scheduler, row)

    async def patch(self, definition_id: str) -> None:
        scheduler, row = await self.own_definition(definition_id)
        user = self.current_user
        settings = scheduler.runner.settings
        # the owner's groups now; an admin's change of another's definition: the stored ones
        groups = self.groups_of(user) if row.user == user["name"] else None
        try:
            changes = await parse_off_loop(
                parse_definition_update, self.json_body(settings.limits),
                seconds=settings.cron_seconds, limits=settings.limits)
            scheduler.update(row, changes, groups)
        except JobInputError as e:
            raise web.HTTPError(400, str(e).replace("%", "%%")) from None
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e).replace("%", "%%")) from None
        self.write_definition(scheduler, row)

    async def delete(self, definition_id: str) -> None:
        scheduler, row = await self.own_definition(definition_id)
        view = definition_view(row, scheduler.store.active_of(row.id))
        scheduler.delete(row)
        self.write_json(view)


class DefinitionJobsHandler(_DefinitionsBase):
    """``POST api/job_definitions/{id}/jobs``: a job of the definition now ("Run job";
    body ``{}`` or ``{"parameters": {...}}`` over the definition's), 201 and the job. Only
    its owner may (another user: 404; an admin who does not own it: 403: the job would run
    as its owner)."""

    async def post(self, definition_id: str) -> None:
        scheduler, row = await self.own_definition(definition_id)
        user = self.current_user
        if user.get("kind", "user") != "user" or row.user != user["name"]:
            raise web.HTTPError(403, "only the definition's owner may run it now")
        settings = scheduler.runner.settings
        body = self.read_json_body(settings.limits.max_parameters_bytes * BODY_FACTOR
                                   + BODY_SLACK, "a run of a definition may have") \
            if self.request.body else {}
        try:
            if not isinstance(body, dict) or set(body) - {"parameters"}:
                raise JobInputError("body", "must be a JSON object with parameters only")
            params = body.get("parameters")
            params = None if params is None else check_parameters(
                params, settings.max_parameters_bytes)
            job = await scheduler.run_now(row, self.groups_of(user), params)
        except JobInputError as e:
            raise web.HTTPError(400, str(e).replace("%", "%%")) from None
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e).replace("%", "%%")) from None
        self.set_header("Location", f"{self.service.prefix}api/jobs/{job.id}")
        self.write_job(scheduler.runner, job, 201)


def job_routes(prefix: str, kw: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The service's routes of jobs (under ``prefix``)."""
    return [(prefix + "api/jobs", JobsHandler, kw),
            (prefix + f"api/jobs/{JOB_ID}", JobHandler, kw),
            (prefix + f"api/jobs/{JOB_ID}/output", JobOutputHandler, kw),
            (prefix + "api/job_definitions", DefinitionsHandler, kw),
            (prefix + f"api/job_definitions/{JOB_ID}", DefinitionHandler, kw),
            (prefix + f"api/job_definitions/{JOB_ID}/jobs", DefinitionJobsHandler, kw),
            (prefix + f"api/jobs/{JOB_ID}/log", JobLogHandler, kw)]


def configure_jobs(service: Any) -> Jobs:
    """Give ``service`` (a :class:`gpuspawner.hub.service.app.GPUService`, not imported here:
    the service package builds on this module) its jobs part and start it on the running loop
    (from :func:`gpuspawner.hub.service.configure.configure_service`)."""
    jobs = Jobs()
    service.jobs = jobs
    jobs.task = asyncio.ensure_future(start(jobs))
    return jobs
