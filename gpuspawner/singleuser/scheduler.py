"""jupyter-scheduler's JupyterLab UI backed by the hub's notebook jobs: nothing runs in the
user's server.

jupyter-scheduler (2.x, JupyterLab 4) gives JupyterLab "Create a notebook job" (file browser,
notebook toolbar) and the "Notebook Jobs" panel; its server extension hands every request to a
``SchedulerApp.scheduler_class`` (a :class:`~jupyter_scheduler.scheduler.BaseScheduler`) and
lists environments with ``SchedulerApp.environment_manager_class``. Here:

- :class:`HubScheduler` sends each job to the hub's ``gpuspawner`` service (``POST api/jobs``,
  with the notebook's content: a snapshot, as jupyter-scheduler's staging copy is) and reads
  jobs back from it; the job runs in a container of its own with its profile's bundle
  (docs/jobs.md). Job definitions (a notebook on a cron schedule) go to
  ``api/job_definitions`` the same way. It holds no database and starts no process or task
  runner: the hub runs the schedules.
- :class:`HubEnvironmentManager` lists the profiles the user may use (``GET api/profiles``) as
  the environments: an environment's name is a profile's slug.
- :class:`HubJobFilesManager` answers the UI's "download" by writing the executed notebook
  and its HTML export from ``GET api/jobs/{id}/output`` where the job's files are shown.

Where and who: the service's URL is ``GPUSPAWNER_SERVICE_URL``, else derived from
``JUPYTERHUB_API_URL``, and the token is ``JUPYTERHUB_API_TOKEN`` (the server's own token,
which needs the scope ``access:services!service=gpuspawner``), as for ``gpuspawner jobs``
(:mod:`gpuspawner.jobs.client`, whose :class:`~gpuspawner.jobs.client.JobsClient` does the
requests, in a worker thread).

How jupyter-scheduler's models map to ours (:func:`describe_job`, :func:`submission`):

=================================  ===================================================
jupyter-scheduler                  hub job
=================================  ===================================================
``job_id`` (must contain ``-``:    ``id`` (32 hex digits), written as a UUID
its routes' pattern)               (:func:`scheduler_id` / :func:`hub_id`)
``runtime_environment_name``       ``profile`` and the image chosen: ``slug`` (the
                                   profile's image), ``slug:key`` (a choice of its
                                   ``profile_options.image``), ``slug@reference``
                                   (this server's own image, where the profile allows
                                   one): :func:`environment_name`
``name`` (may hold spaces)         ``name`` (one folder name: other characters -> ``-``)
``parameters`` (strings)           ``parameters``: JSON scalars or lists where the
                                   string is one, else the string (as ``-p``)
``compute_type`` (the form's       ``time_limit``: the environment's compute types are
"Compute type" select)             the profile's time limits, ``time limit 2 h``
                                   (:func:`time_limit_choices`)
``runtime_environment_parameters   ``time_limit`` (seconds; over ``compute_type``)
["time_limit"]``
``output_formats``                 ``output_formats``: ``ipynb`` always (as
                                   jupyter-scheduler keeps the notebook), ``html``
                                   when ticked (and the snapshot it ran and a log)
``package_input_folder``           ``input_folder``: the notebook's folder, relative
                                   to the home (copied into the job's folder)
``status``                         :data:`STATUS_OF` (state kept in ``status_message``
                                   where the status loses it)
``job_files``                      the files in ``~/jobs/<name>/<UTC start>-<id>/``
                                   (:func:`job_files`)
job definition                     ``api/job_definitions``: ``schedule`` (cron),
                                   ``timezone``; ``active`` = not ``paused``
                                   (:func:`describe_definition`); every field of
                                   ``UpdateJobDefinition`` is a ``PATCH``
                                   (:func:`definition_changes`); "Run job" of a
                                   definition is ``POST api/job_definitions/{id}/jobs``
=================================  ===================================================

Not supported (a :class:`~jupyter_scheduler.exceptions.SchedulerError` with the reason, shown
by the UI): renaming a job once submitted; output formats other than ``ipynb`` and ``html``;
tags.

The Notebook Jobs list of jupyter-scheduler 2.12 asks for the jobs only when it opens and on
*Reload*; gpuspawner's lab extension presses *Reload* every few seconds while the list shows
a job that is queued or in progress (``src/jobs_refresh.ts``), and each job's ``update_time``
is its latest change (the last state it passed), so the list's order and times follow.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_scheduler.environments import EnvironmentManager, EnvironmentRetrievalError
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.job_files_manager import JobFilesManager
from jupyter_scheduler.models import (
    CountJobsQuery,
    CreateJob,
    CreateJobDefinition,
    CreateJobFromDefinition,
    DescribeJob,
    DescribeJobDefinition,
    JobFile,
    ListJobDefinitionsQuery,
    ListJobDefinitionsResponse,
    ListJobsQuery,
    ListJobsResponse,
    RuntimeEnvironment,
    SortDirection,
    Status,
    UpdateJob,
    UpdateJobDefinition,
)
from jupyter_scheduler.scheduler import BaseScheduler
from traitlets import Float, Unicode, default

from ..jobs.client import ClientError, JobsClient, default_name, parse_parameter, service_url

__all__ = ["HubEnvironmentManager", "HubJobFilesManager", "HubScheduler", "OUTPUT_FORMATS",
           "STATUS_OF", "definition_changes", "definition_submission", "describe_definition",
           "describe_job", "environment", "environment_name", "environments", "hub_client",
           "hub_id", "job_files", "scheduler_id", "split_environment", "status_of",
           "submission"]

#: our states -> jupyter-scheduler's statuses. The UI offers "Stop" for IN_PROGRESS only and
#: output links for COMPLETED and FAILED; a job that waits for its bundle is QUEUED.
STATUS_OF: dict[str, Status] = {
    "queued": Status.QUEUED, "waiting": Status.QUEUED, "starting": Status.IN_PROGRESS,
    "running": Status.IN_PROGRESS, "completed": Status.COMPLETED, "failed": Status.FAILED,
    "timed_out": Status.FAILED, "lost": Status.FAILED, "cancelled": Status.STOPPED,
}
#: states whose status does not say them: ``status_message`` starts with the state
_SAID_IN_MESSAGE = frozenset({"waiting", "starting", "timed_out", "lost"})
#: what a job writes, by jupyter-scheduler's output format name -> its label (a job writes
#: both, whichever the UI asked for: ``<name>.ipynb`` and ``<name>.html``)
OUTPUT_FORMATS: dict[str, str] = {"ipynb": "Notebook", "html": "HTML"}
#: the time limits (seconds) the create-job form offers, as far as a profile's maximum allows
TIME_LIMIT_CHOICES_S = (900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600)
_TIME_LIMIT = "time limit "
_DURATION = re.compile(r"^time limit (\d+) (h|min|s)(?: \(default\))?$")


def duration_words(seconds: int) -> str:
    """``3600`` -> ``"1 h"``, ``1800`` -> ``"30 min"``, ``90`` -> ``"90 s"``."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def time_limit_choices(default: int, maximum: int) -> tuple[list[str], str]:
    """The job time limits of a profile as jupyter-scheduler's *compute types* (the create-job
    form's only per-environment choice; jupyter-scheduler has no time-limit field): ``time
    limit <duration>`` for :data:`TIME_LIMIT_CHOICES_S` below ``maximum``, the profile's
    ``default`` (marked ``(default)``) and ``maximum``, shortest first; and the default's
    label. Read back by :func:`time_limit_of`."""
    limits = sorted({s for s in TIME_LIMIT_CHOICES_S if s < maximum} | {default, maximum})
    labels = [_TIME_LIMIT + duration_words(s) + (" (default)" if s == default else "")
              for s in limits]
    return labels, labels[limits.index(default)]


def time_limit_of(compute_type: str) -> int:
    """Seconds of a compute type of :func:`time_limit_choices` (``"time limit 2 h"``).

    Raises:
        SchedulerError: not one of those labels.
    """
    m = _DURATION.match(compute_type.strip())
    if m is None:
        raise SchedulerError(f"compute type {compute_type!r}: choose a time limit of the list")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"h": 3600, "min": 60, "s": 1}[unit]
#: the keys of a job's image choice (the spawn form's user_options names)
_IMAGE = "image"
_OWN_IMAGE = "image--unlisted-choice"


def environment_name(profile: str, options: Mapping[str, Any] | None = None) -> str:
    """The environment of a profile and an image choice: ``slug`` (no choice: the profile's
    image), ``slug:key`` (``image``: a key of its choices) or ``slug@reference``
    (``image--unlisted-choice``: an image of the user's own). Read back by
    :func:`split_environment`."""
    options = options or {}
    if options.get(_OWN_IMAGE):
        return f"{profile}@{options[_OWN_IMAGE]}"
    if options.get(_IMAGE):
        return f"{profile}:{options[_IMAGE]}"
    return profile


def split_environment(name: str) -> tuple[str, dict[str, str]]:
    """An environment's name (:func:`environment_name`) as ``(profile, image keys)``: both
    image keys are always there (``""``: not chosen), so a change of environment clears the
    other one."""
    at, colon = name.find("@"), name.find(":")
    if at > 0 and (colon < 0 or at < colon):
        return name[:at], {_IMAGE: "", _OWN_IMAGE: name[at + 1:]}
    if colon > 0:
        return name[:colon], {_IMAGE: name[colon + 1:], _OWN_IMAGE: ""}
    return name, {_IMAGE: "", _OWN_IMAGE: ""}


def _formats(model_formats: list[str] | None) -> list[str]:
    """The output formats ticked, as the hub reads them (``ipynb`` always).

    Raises:
        SchedulerError: a format the hub's jobs do not write.
    """
    formats = [f for f in (model_formats or []) if f not in OUTPUT_FORMATS]
    if formats:
        raise SchedulerError(f"output formats {', '.join(formats)}: a job on this hub writes "
                             "the executed notebook (ipynb) and its HTML export only")
    return ["ipynb", *(["html"] if "html" in (model_formats or []) else [])]


def _parameters(given: Mapping[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in given.items():
        if "=" in key:
            raise SchedulerError(f"parameter {key!r}: a name is a Python identifier")
        name, parsed = parse_parameter(f"{key}={value}")
        params[name] = parsed
    return params


#: the file of the service's API that each request goes to
_JOBS = "api/jobs"
_PROFILES = "api/profiles"
_DEFINITIONS = "api/job_definitions"
_HEX32 = re.compile(r"[0-9a-f]{32}")
#: sort keys of ListJobsQuery that a job view answers (ms timestamps or text)
_SORT_KEYS = frozenset({"create_time", "update_time", "start_time", "end_time", "name",
                        "status", "runtime_environment_name", "input_filename"})


def scheduler_id(job_id: str) -> str:
    """Our job id (32 hex digits) as jupyter-scheduler's: the same UUID with dashes (its
    routes only match ids with a ``-``). Other ids are returned unchanged."""
    return str(uuid.UUID(job_id)) if _HEX32.fullmatch(job_id) else job_id


def hub_id(job_id: str) -> str:
    """jupyter-scheduler's job id back to ours (:func:`scheduler_id` reversed).

    Raises:
        SchedulerError: not a UUID (no job of the hub has it).
    """
    plain = job_id.replace("-", "").lower()
    if not _HEX32.fullmatch(plain):
        raise SchedulerError(f"no job {job_id!r}: the hub's job ids are UUIDs")
    return plain


def status_of(state: str) -> Status:
    """jupyter-scheduler's status of one of our states (:data:`STATUS_OF`; an unknown one,
    from a newer hub, is IN_PROGRESS)."""
    return STATUS_OF.get(state, Status.IN_PROGRESS)


def _ms(iso: str | None) -> int | None:
    """An ISO 8601 time of the API (``2026-03-01T21:15:00Z``) as epoch milliseconds."""
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _text(value: Any) -> str:
    """A parameter's value as jupyter-scheduler shows it: a string as is, else its JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def job_files(job: Mapping[str, Any], root_dir: str, home: str) -> tuple[list[JobFile], bool]:
    """The files a job wrote, as jupyter-scheduler lists them: the executed notebook
    (``ipynb``), its HTML export (``html``), the snapshot it ran (``input``), ``job.log``
    (``log``) and the folder
    (``files``, opened in the file browser), each with its path relative to ``root_dir`` when
    it exists there, else None (the UI then shows no link). The folder is the job's
    ``output_dir`` (``~/jobs/<name>/<UTC start>-<id>``) under ``home``; when that is outside
    ``root_dir``, the same relative folder under ``root_dir`` (where
    :class:`HubJobFilesManager` downloads the notebook).

    Returns:
        (files, downloaded): downloaded is True when the executed notebook is there.
    """
    folder = _local_folder(job, root_dir, home)
    name = job.get("name") or "notebook"
    root = os.path.abspath(root_dir)

    def rel(path: str | None, isdir: bool = False) -> str | None:
        if path is None:
            return None
        found = os.path.isdir(path) if isdir else os.path.isfile(path)
        return os.path.relpath(path, root).replace(os.sep, "/") if found else None

    def inside(sub: str) -> str | None:
        return os.path.join(folder, sub) if folder else None

    files = [
        JobFile(display_name=OUTPUT_FORMATS["ipynb"], file_format="ipynb",
                file_path=rel(inside(f"{name}.ipynb"))),
        JobFile(display_name=OUTPUT_FORMATS["html"], file_format="html",
                file_path=rel(inside(f"{name}.html"))),
        JobFile(display_name="Input", file_format="input",
                file_path=rel(inside(f"{name}.input.ipynb"))),
        JobFile(display_name="Log", file_format="log", file_path=rel(inside("job.log"))),
        JobFile(display_name="Files", file_format="files", file_path=rel(folder, isdir=True)),
    ]
    return files, files[0].file_path is not None


def _local_folder(job: Mapping[str, Any], root_dir: str, home: str) -> str | None:
    """The job's output folder on this server's disk (absolute), inside ``root_dir``, or None
    before the job has one."""
    out = job.get("output_dir") or ""
    if not out:
        return None
    relative = out[2:] if out.startswith("~/") else out.lstrip("/")
    root = os.path.abspath(root_dir)
    for base in (home, root):
        path = os.path.abspath(os.path.join(base, relative))
        if path.startswith(root + os.sep):
            return path
    return None


def describe_job(job: Mapping[str, Any], root_dir: str, home: str,
                 files: bool = True) -> DescribeJob:
    """One job of the service's API (``GET api/jobs/{id}``) as jupyter-scheduler's
    :class:`~jupyter_scheduler.models.DescribeJob`: times as epoch milliseconds, the state as
    a :class:`~jupyter_scheduler.models.Status` (:data:`STATUS_OF`) with the state named in
    ``status_message`` where the status loses it (``timed_out: ...``), ``url`` the job's API
    path, and with ``files`` its :func:`job_files`."""
    state = str(job.get("state") or "")
    message = str(job.get("message") or "")
    if state in _SAID_IN_MESSAGE and not message.startswith(state):
        message = f"{state}: {message}" if message else state
    error = job.get("error")
    if isinstance(error, dict) and error.get("ename") and error["ename"] not in message:
        message = (message + "; " if message else "") + (
            f"cell {error.get('cell')}: {error['ename']}: {error.get('evalue', '')}")
    created = _ms(job.get("created")) or 0
    history = [_ms(h.get("time")) for h in job.get("history") or []]
    updated = max([t for t in history if t] + [created, _ms(job.get("started")) or 0,
                                                _ms(job.get("finished")) or 0])
    name = str(job.get("name") or "notebook")
    model = DescribeJob(
        job_id=scheduler_id(str(job["id"])), name=name,
        input_filename=f"{name}.input.ipynb",
        runtime_environment_name=environment_name(str(job.get("profile") or ""), job),
        runtime_environment_parameters={"time_limit": int(job.get("time_limit") or 0)},
        compute_type=(_TIME_LIMIT + duration_words(int(job["time_limit"]))
                      if job.get("time_limit") else None),
        output_formats=list(job.get("output_formats") or OUTPUT_FORMATS),
        package_input_folder=job.get("input_folder") is not None,
        parameters={k: _text(v) for k, v in (job.get("parameters") or {}).items()},
        url=f"{_JOBS}/{job['id']}", create_time=created, update_time=updated,
        start_time=_ms(job.get("started")), end_time=_ms(job.get("finished")),
        status=status_of(state), status_message=message or None,
        job_definition_id=(scheduler_id(str(job["definition_id"]))
                           if job.get("definition_id") else None),
    )
    if files:
        model.job_files, model.downloaded = job_files(job, root_dir, home)
    return model


def submission(model: CreateJob, notebook: dict[str, Any],
               input_folder: str | None = None) -> dict[str, Any]:
    """The body of ``POST api/jobs`` for jupyter-scheduler's :class:`CreateJob` and the
    notebook's content: ``profile`` = the environment's name, ``name`` made one folder name
    (:func:`gpuspawner.jobs.client.default_name`), each parameter read as ``-p NAME=VALUE``
    is (JSON scalar or list, else the string), ``time_limit`` from the compute type (the
    form's time limit choice, :func:`time_limit_of`) or, over it,
    ``runtime_environment_parameters["time_limit"]`` when given; the environment's image
    choice (:func:`split_environment`); ``output_formats`` (``ipynb`` always, ``html`` when
    ticked); ``input_folder`` (given by :class:`HubScheduler` for "Run job with input
    folder": the notebook's folder relative to the home).

    Raises:
        SchedulerError: an output format other than ``ipynb`` and ``html``, "Run job with
            input folder" without a folder, a time limit that is no whole number, or a
            parameter name with ``=``.
    """
    formats = _formats(model.output_formats)
    if model.package_input_folder and input_folder is None:
        raise SchedulerError("'Run job with input folder': the notebook's folder is not in "
                             "your home")
    body: dict[str, Any] = {"notebook": notebook,
                            "name": default_name(model.name or model.input_filename or ""),
                            "output_formats": formats}
    if model.package_input_folder:
        body["input_folder"] = input_folder
    if model.runtime_environment_name:
        profile, image = split_environment(model.runtime_environment_name)
        body["profile"] = profile
        body.update({k: v for k, v in image.items() if v})
    body["parameters"] = _parameters(model.parameters or {})
    if model.compute_type:
        body["time_limit"] = time_limit_of(model.compute_type)
    limit = (model.runtime_environment_parameters or {}).get("time_limit")
    if limit not in (None, ""):
        try:
            body["time_limit"] = int(limit)
        except (TypeError, ValueError):
            raise SchedulerError(f"time_limit: {limit!r} is not a whole number of "
                                 "seconds") from None
    return body


def hub_client(env: Mapping[str, str] | None = None, timeout: float = 60.0) -> JobsClient:
    """A :class:`~gpuspawner.jobs.client.JobsClient` for the server's own token
    (``JUPYTERHUB_API_TOKEN``) and the service's URL (``GPUSPAWNER_SERVICE_URL`` or derived
    from ``JUPYTERHUB_API_URL``, :func:`gpuspawner.jobs.client.service_url`).

    Raises:
        SchedulerError: no token, or no URL to derive.
    """
    env = dict(os.environ if env is None else env)
    token = env.get("JUPYTERHUB_API_TOKEN", "")
    if not token:
        raise SchedulerError("JUPYTERHUB_API_TOKEN is not set: notebook jobs run through the "
                             "hub, from a server the hub started")
    try:
        return JobsClient(service_url(env), token, timeout=timeout)
    except ClientError as e:
        raise SchedulerError(str(e)) from None


async def _call(client: JobsClient, method: str, path: str, body: Any = None) -> Any:
    """One request of the service's API in a worker thread (the client blocks); a refusal
    becomes :class:`SchedulerError` with the service's message, which the UI shows."""
    try:
        return await asyncio.to_thread(client.request, method, path, body)
    except ClientError as e:
        raise SchedulerError(str(e)) from None


def _sort_key(field: str) -> Callable[[DescribeJob], tuple[bool, Any]]:
    def key(job: DescribeJob) -> tuple[bool, Any]:
        value = getattr(job, field, None)
        value = value.value if isinstance(value, Status) else value
        return value is None, value if value is not None else 0
    return key


class HubScheduler(BaseScheduler):
    """jupyter-scheduler's scheduler that runs every job on the hub (``SchedulerApp.
    scheduler_class``); see the module's documentation for the mapping. Every method is a
    coroutine (the extension's handlers await them); a refusal of the service raises
    :class:`~jupyter_scheduler.exceptions.SchedulerError` with its message (HTTP 500 in
    jupyter-scheduler's API, shown in the UI)."""

    #: no task runner in this server: the hub starts jobs (the extension checks this)
    task_runner = None

    request_timeout = Float(60.0, config=True,
                            help="Seconds one request to the hub's service may take.")
    hidden_jobs_file = Unicode(
        config=True,
        help="JSON file of the job ids deleted in the UI: the hub keeps every job's record "
             "(an admin deletes them), deleting one in JupyterLab hides it from this list "
             "(and cancels it when it has not ended). Default: "
             "<jupyter data dir>/gpuspawner-hidden-jobs.json.")

    @default("hidden_jobs_file")
    def _default_hidden_jobs_file(self) -> str:
        return os.path.join(jupyter_data_dir(), "gpuspawner-hidden-jobs.json")

    def __init__(self, root_dir: str, environments_manager: EnvironmentManager,
                 config: Any = None, db_url: str | None = None,
                 client: JobsClient | None = None, home: str | None = None,
                 **kwargs: Any) -> None:
        # db_url: SchedulerApp passes its database; no table of it is used here
        super().__init__(root_dir=root_dir, environments_manager=environments_manager,
                         config=config, **kwargs)
        self._client = client
        self.home = os.path.abspath(home or os.path.expanduser("~"))

    @property
    def client(self) -> JobsClient:
        """The service's client, made on first use (:func:`hub_client`)."""
        if self._client is None:
            self._client = hub_client(timeout=self.request_timeout)
        return self._client

    # -- hidden jobs ----------------------------------------------------------------------
    def _hidden(self) -> set[str]:
        try:
            with open(self.hidden_jobs_file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return set()
        return {str(i) for i in data} if isinstance(data, list) else set()

    def _hide(self, job_id: str) -> None:
        ids = self._hidden() | {job_id}
        os.makedirs(os.path.dirname(self.hidden_jobs_file) or ".", exist_ok=True)
        tmp = self.hidden_jobs_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(sorted(ids), f)
        os.replace(tmp, self.hidden_jobs_file)

    # -- jobs -----------------------------------------------------------------------------
    def _read_notebook(self, input_uri: str) -> dict[str, Any]:
        if not self.file_exists(input_uri):
            raise SchedulerError(f"{input_uri}: no such file in this server's folder")
        path = os.path.join(os.path.abspath(self.root_dir), input_uri.lstrip("/"))
        try:
            with open(path, encoding="utf-8") as f:
                nb = json.load(f)
        except (OSError, ValueError) as e:
            raise SchedulerError(f"{input_uri}: cannot read a notebook: {e}") from None
        if not isinstance(nb, dict):
            raise SchedulerError(f"{input_uri}: not a notebook (a JSON object)")
        return nb

    def _input_folder(self, input_uri: str) -> str | None:
        """The folder of ``input_uri`` (relative to the server's root) relative to the home,
        as the hub's ``input_folder`` (``""``: the home itself); None when it is not in the
        home (the job copies only the home's files)."""
        root = os.path.abspath(self.root_dir)
        folder = os.path.dirname(os.path.abspath(os.path.join(root, input_uri.lstrip("/"))))
        if folder != self.home and not folder.startswith(self.home + os.sep):
            return None
        return os.path.relpath(folder, self.home).replace(os.sep, "/").lstrip(".")

    async def create_job(self, model: CreateJob) -> str:
        """Submit the notebook at ``model.input_uri`` (relative to the server's root) as a
        job; returns its id (:func:`scheduler_id`)."""
        body = submission(model, self._read_notebook(model.input_uri),
                          self._input_folder(model.input_uri))
        job = await _call(self.client, "POST", _JOBS, body)
        self.log.info("notebook job %s (%s) submitted to the hub", job["id"], job["name"])
        return scheduler_id(job["id"])

    async def update_job(self, job_id: str, model: UpdateJob) -> None:
        """Only a stop (``status`` STOPPED) is possible: the hub's jobs have no rename."""
        if model.status == Status.STOPPED:
            await self.stop_job(job_id)
            return
        if model.name is not None or model.compute_type is not None:
            raise SchedulerError("a job of the hub cannot be renamed or changed once "
                                 "submitted")

    async def _jobs(self, definition_id: str | None = None) -> list[dict[str, Any]]:
        path = f"{_JOBS}?definition_id={definition_id}" if definition_id else _JOBS
        data = await _call(self.client, "GET", path)
        hidden = self._hidden()
        return [j for j in data.get("jobs", []) if j.get("id") not in hidden]

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:
        """The user's jobs (those of ``job_definition_id`` when given), filtered by
        ``status``, ``name`` (prefix) and ``start_time`` (at or after, ms),
        sorted by ``sort_by``, ``max_items`` per page with ``next_token`` the next offset.
        ``tags`` match nothing (jobs of the hub have no tags)."""
        if query.tags:
            return ListJobsResponse(jobs=[], total_count=0)
        jobs = await self._jobs(hub_id(query.job_definition_id)
                                if query.job_definition_id else None)
        pairs = [(j, describe_job(j, self.root_dir, self.home, files=False)) for j in jobs]
        if query.status is not None:
            pairs = [(j, m) for j, m in pairs if m.status == query.status]
        if query.name:
            pairs = [(j, m) for j, m in pairs if m.name.startswith(query.name)]
        if query.start_time:
            pairs = [(j, m) for j, m in pairs if (m.start_time or 0) >= query.start_time]
        for field in reversed(query.sort_by or []):
            if field.name in _SORT_KEYS:
                key = _sort_key(field.name)
                pairs.sort(key=lambda pair, key=key: key(pair[1]),
                           reverse=field.direction == SortDirection.desc)
        page, total, token = _page(pairs, query.max_items, query.next_token)
        for job, model in page:
            model.job_files, model.downloaded = job_files(job, self.root_dir, self.home)
        return ListJobsResponse(jobs=[m for _, m in page], total_count=total,
                                next_token=token)

    async def count_jobs(self, query: CountJobsQuery) -> int:
        """How many of the user's jobs have ``query.status``."""
        return sum(1 for j in await self._jobs() if status_of(j.get("state", "")) ==
                   query.status)

    async def _job(self, job_id: str) -> dict[str, Any]:
        return dict(await _call(self.client, "GET", f"{_JOBS}/{hub_id(job_id)}"))

    async def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        """One job (:func:`describe_job`), with its files when ``job_files``."""
        return describe_job(await self._job(job_id), self.root_dir, self.home,
                            files=bool(job_files))

    async def stop_job(self, job_id: str) -> None:
        """Cancel the job on the hub (``DELETE api/jobs/{id}``): it stops and its bundle is
        freed. A job that has ended already is left as it is."""
        job = await self._job(job_id)
        if job.get("state") in ("completed", "failed", "timed_out", "cancelled", "lost"):
            return
        await _call(self.client, "DELETE", f"{_JOBS}/{hub_id(job_id)}")

    async def delete_job(self, job_id: str) -> None:
        """Cancel the job if it has not ended and hide it from this list (the hub keeps its
        record; see :attr:`hidden_jobs_file`)."""
        await self.stop_job(job_id)
        self._hide(hub_id(job_id))

    def get_staging_paths(self, model: DescribeJob | DescribeJobDefinition) -> dict[str, str]:
        """Where the executed notebook can be fetched: the service's ``api/jobs/{id}/output``
        (no staging folder here: :class:`HubJobFilesManager` downloads it)."""
        if not isinstance(model, DescribeJob):
            return {}
        return {"ipynb": f"{self.client.url}{_JOBS}/{hub_id(model.job_id)}/output"}

    async def download_output(self, job_id: str, redownload: bool = False) -> list[str]:
        """Write the executed notebook and its HTML export of the job from the service
        (``api/jobs/{id}/output``, ``?format=html``) where :func:`job_files` shows them (the
        job's folder in the home, or the same folder under the server's root); unless
        ``redownload``, only those not there yet. An HTML export the hub does not have is
        skipped.

        Returns:
            the paths written.

        Raises:
            SchedulerError: the job has no folder yet, or the service has no executed
                notebook for it.
        """
        job = await self._job(job_id)
        folder = _local_folder(job, self.root_dir, self.home)
        if folder is None:
            raise SchedulerError(f"job {job_id} has no output folder yet ({job.get('state')})")
        name = job.get("name") or "notebook"
        base = f"{_JOBS}/{hub_id(job_id)}/output"
        written = []
        for fmt in OUTPUT_FORMATS:
            path = os.path.join(folder, f"{name}.{fmt}")
            if os.path.isfile(path) and not redownload:
                continue
            if fmt == "ipynb":
                text = json.dumps(await _call(self.client, "GET", base), indent=1) + "\n"
            else:
                try:
                    text = await asyncio.to_thread(self.client.text, f"{base}?format={fmt}")
                except ClientError as e:
                    self.log.info("job %s: no %s export to download: %s", job_id, fmt, e)
                    continue
            os.makedirs(folder, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            written.append(path)
        return written

    # -- job definitions ------------------------------------------------------------------
    async def create_job_definition(self, model: CreateJobDefinition) -> str:
        """Make a definition on the hub (``POST api/job_definitions``): the notebook at
        ``model.input_uri`` (a snapshot), ``schedule`` and ``timezone`` (default UTC) and the
        job's fields as :func:`submission` maps them; returns its id (a UUID)."""
        body = definition_submission(model, self._read_notebook(model.input_uri),
                                     self._input_folder(model.input_uri))
        row = await _call(self.client, "POST", _DEFINITIONS, body)
        self.log.info("job definition %s (%s, %s) made on the hub", row["id"], row["name"],
                      row["schedule"])
        return scheduler_id(row["id"])

    async def update_job_definition(self, job_definition_id: str,
                                    model: UpdateJobDefinition) -> None:
        """``PATCH api/job_definitions/{id}`` with every field given
        (:func:`definition_changes`): schedule, time zone, pause/resume, name, environment
        (profile and image), compute type (time limit), parameters, output formats, and a
        new snapshot of the notebook at ``input_uri`` (relative to the server's root) when
        that file exists and its name differs from the definition's or the schedule or time
        zone changes: jupyter-scheduler's own backend's rule (its edit form sends the
        snapshot's name, or the file dropped on it, with every save).

        Raises:
            SchedulerError: the hub refused a change (its message), or tags.
        """
        current = await self.get_job_definition(job_definition_id)
        notebook = None
        uri = model.input_uri
        changed = (os.path.basename(uri or "") != current.input_filename
                   or (model.schedule is not None and model.schedule != current.schedule)
                   or (model.timezone is not None and model.timezone != current.timezone))
        if uri and changed and self.file_exists(uri):
            notebook = self._read_notebook(uri)
        changes = definition_changes(model, notebook)
        if changes:
            await _call(self.client, "PATCH", f"{_DEFINITIONS}/{hub_id(job_definition_id)}",
                        changes)

    async def delete_job_definition(self, job_definition_id: str) -> None:
        """``DELETE api/job_definitions/{id}``: no more ticks; its jobs stay."""
        await _call(self.client, "DELETE", f"{_DEFINITIONS}/{hub_id(job_definition_id)}")

    async def get_job_definition(self, job_definition_id: str) -> DescribeJobDefinition:
        """One definition (:func:`describe_definition`)."""
        row = await _call(self.client, "GET", f"{_DEFINITIONS}/{hub_id(job_definition_id)}")
        return describe_definition(row)

    async def list_job_definitions(self, query: ListJobDefinitionsQuery
                                   ) -> ListJobDefinitionsResponse:
        """The user's definitions, filtered by ``name`` (prefix) and ``create_time`` (at or
        after, ms), sorted by ``sort_by``, paged as :meth:`list_jobs`."""
        data = await _call(self.client, "GET", _DEFINITIONS)
        models = [describe_definition(d) for d in data.get("job_definitions", [])]
        if query.tags:
            models = []
        if query.name:
            models = [m for m in models if m.name.startswith(query.name)]
        if query.create_time:
            models = [m for m in models if m.create_time >= query.create_time]
        for field in reversed(query.sort_by or []):
            if field.name in _SORT_KEYS | {"schedule", "timezone", "active"}:
                models.sort(key=_sort_key(field.name),
                            reverse=field.direction == SortDirection.desc)
        page, total, token = _page(models, query.max_items, query.next_token)
        return ListJobDefinitionsResponse(job_definitions=page, total_count=total,
                                          next_token=token)

    async def create_job_from_definition(self, job_definition_id: str,
                                         model: CreateJobFromDefinition) -> str:
        """"Run job" of a definition: ``POST api/job_definitions/{id}/jobs``, a job now of
        its snapshot, profile, image and the rest, with the form's parameters over its own;
        returns the job's id."""
        body: dict[str, Any] = {}
        if model.parameters is not None:
            body["parameters"] = _parameters(model.parameters)
        job = await _call(self.client, "POST",
                          f"{_DEFINITIONS}/{hub_id(job_definition_id)}/jobs", body)
        self.log.info("job %s of definition %s submitted to the hub", job["id"],
                      job_definition_id)
        return scheduler_id(job["id"])


def _page(items: list[Any], max_items: int | None, next_token: str | None
          ) -> tuple[list[Any], int, str | None]:
    """One page of ``items``: ``max_items`` from the offset ``next_token``; returns (page,
    total, the next page's token or None)."""
    total = len(items)
    start = int(next_token) if (next_token or "").isdigit() else 0
    size = int(max_items if max_items is not None else total)
    page = items[start:start + size]
    end = start + len(page)
    return page, total, (str(end) if size and end < total else None)


def definition_changes(model: UpdateJobDefinition,
                       notebook: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of ``PATCH api/job_definitions/{id}`` for jupyter-scheduler's
    :class:`UpdateJobDefinition`: each field given (not None) as :func:`submission` maps it
    (``name``, ``runtime_environment_name`` -> ``profile`` and both image keys,
    ``compute_type`` and ``runtime_environment_parameters["time_limit"]`` ->
    ``time_limit``, ``parameters``, ``output_formats``), ``schedule``, ``timezone``,
    ``active`` -> ``paused``, and ``notebook`` when given (a new snapshot).

    Raises:
        SchedulerError: tags, an output format or parameter :func:`submission` refuses, a
            compute type not of the list.
    """
    given = {k: v for k, v in model.dict(exclude_unset=True).items() if v is not None}
    if given.get("tags"):
        raise SchedulerError("tags: the hub's job definitions have none")
    changes: dict[str, Any] = {}
    if "name" in given:
        changes["name"] = default_name(given["name"])
    if given.get("runtime_environment_name"):
        profile, image = split_environment(given["runtime_environment_name"])
        changes["profile"] = profile
        changes.update(image)
    if given.get("compute_type"):
        changes["time_limit"] = time_limit_of(given["compute_type"])
    limit = (given.get("runtime_environment_parameters") or {}).get("time_limit")
    if limit not in (None, "", 0):
        try:
            changes["time_limit"] = int(limit)
        except (TypeError, ValueError):
            raise SchedulerError(f"time_limit: {limit!r} is not a whole number of "
                                 "seconds") from None
    if "parameters" in given:
        changes["parameters"] = _parameters(given["parameters"])
    if "output_formats" in given:
        changes["output_formats"] = _formats(given["output_formats"])
    for key in ("schedule", "timezone"):
        if key in given:
            changes[key] = given[key]
    if "active" in given:
        changes["paused"] = not given["active"]
    if notebook is not None:
        changes["notebook"] = notebook
    return changes


def definition_submission(model: CreateJobDefinition, notebook: dict[str, Any],
                          input_folder: str | None = None) -> dict[str, Any]:
    """The body of ``POST api/job_definitions`` for jupyter-scheduler's
    :class:`CreateJobDefinition`: the job's fields as :func:`submission` maps them, plus
    ``schedule`` and ``timezone`` (UTC when none).

    Raises:
        SchedulerError: as :func:`submission`; no schedule.
    """
    if not model.schedule:
        raise SchedulerError("schedule: a job definition needs a cron schedule")
    body = submission(CreateJob(**{k: v for k, v in model.dict().items()
                                   if k in CreateJob.__fields__}), notebook, input_folder)
    body["schedule"] = model.schedule
    body["timezone"] = model.timezone or "UTC"
    return body


def describe_definition(row: Mapping[str, Any]) -> DescribeJobDefinition:
    """One definition of ``api/job_definitions`` as jupyter-scheduler's
    :class:`DescribeJobDefinition`: ``active`` is not ``paused``, times in epoch ms."""
    name = str(row.get("name") or "notebook")
    created = _ms(row.get("created")) or 0
    return DescribeJobDefinition(
        job_definition_id=scheduler_id(str(row["id"])), name=name,
        input_filename=f"{name}.ipynb",
        runtime_environment_name=environment_name(str(row.get("profile") or ""), row),
        runtime_environment_parameters={"time_limit": int(row.get("time_limit") or 0)},
        compute_type=(_TIME_LIMIT + duration_words(int(row["time_limit"]))
                      if row.get("time_limit") else None),
        output_formats=list(row.get("output_formats") or OUTPUT_FORMATS),
        package_input_folder=row.get("input_folder") is not None,
        parameters={k: _text(v) for k, v in (row.get("parameters") or {}).items()},
        schedule=row.get("schedule"), timezone=row.get("timezone"),
        create_time=created, update_time=_ms(row.get("updated")) or created,
        active=not row.get("paused"))


class HubJobFilesManager(JobFilesManager):
    """The UI's "download output" (``GET scheduler/jobs/{id}/download_files``): the executed
    notebook and its HTML export from the hub's service into the job's folder (:meth:`HubScheduler.
    download_output`), in this process (one small file), instead of jupyter-scheduler's copy
    from a staging area in a child process."""

    async def copy_from_staging(self, job_id: str, redownload: bool | None = False) -> None:
        scheduler = self.scheduler
        if not isinstance(scheduler, HubScheduler):
            await super().copy_from_staging(job_id, redownload)
            return
        await scheduler.download_output(job_id, bool(redownload))


class HubEnvironmentManager(EnvironmentManager):
    """The profiles the user may use (``GET api/profiles`` of the hub's service) as
    jupyter-scheduler's environments: ``name`` and ``label`` are the slug (the UI shows the
    name and selects by the label), ``description`` the display name, the bundle and the jobs'
    time limits; output formats ``ipynb`` and ``html`` (a job writes both).

    Args:
        client: the service's client (default :func:`hub_client`, made on first use).
    """

    def __init__(self, client: JobsClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> JobsClient:
        if self._client is None:
            try:
                self._client = hub_client()
            except SchedulerError as e:
                raise EnvironmentRetrievalError(str(e)) from None
        return self._client

    async def list_environments(self) -> list[RuntimeEnvironment]:
        """The environments (one per profile, in the hub's order, the default profile first).

        Raises:
            EnvironmentRetrievalError: the service did not answer or refused.
        """
        try:
            data = await asyncio.to_thread(self.client.request, "GET", _PROFILES)
        except ClientError as e:
            raise EnvironmentRetrievalError(f"the hub's profiles: {e}") from None
        return environments(list(data.get("profiles", [])),
                            os.environ.get("JUPYTER_IMAGE_SPEC", ""))

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return dict(OUTPUT_FORMATS)


def environments(profiles: list[Mapping[str, Any]], own_image: str = ""
                 ) -> list[RuntimeEnvironment]:
    """The environments of the profiles of ``api/profiles``, the default profile first (the
    UI preselects the first): each profile with its own image (the default choice of its
    ``profile_options.image``), then one per other image choice (``slug:key``), then, where
    the profile takes an image of the user's own and this server runs one (``own_image``,
    the server's ``JUPYTER_IMAGE_SPEC``, not one of the profile's images), that image
    (``slug@reference``): :func:`environment_name`. The hub checks the choice again at
    each submission."""
    out = []
    for p in sorted(profiles, key=lambda p: not p.get("default")):
        out.append(environment(p))
        images = [i for i in p.get("images") or [] if isinstance(i, Mapping)]
        for choice in images:
            if not choice.get("default"):
                out.append(environment(p, {_IMAGE: str(choice["key"])},
                                       str(choice.get("display_name") or choice["key"])))
        listed = {str(i.get("image")) for i in images}
        if p.get("own_image") and own_image and own_image not in listed:
            out.append(environment(p, {_OWN_IMAGE: own_image}, "this server's image"))
    return out


def environment(profile: Mapping[str, Any], image: Mapping[str, str] | None = None,
                image_words: str = "") -> RuntimeEnvironment:
    """One profile of ``api/profiles`` (with an image choice: ``image``, named
    ``image_words`` in the description) as a :class:`RuntimeEnvironment` (see
    :class:`HubEnvironmentManager`)."""
    slug = environment_name(str(profile["slug"]), image)
    parts = [str(profile.get("display_name") or slug)]
    if profile.get("summary"):
        parts.append(str(profile["summary"]))
    limits = profile.get("time_limit") or {}
    choices: tuple[list[str] | None, str | None] = (None, None)
    if limits:
        parts.append(f"time limit {limits.get('default')} s (at most {limits.get('max')} s)")
        choices = time_limit_choices(int(limits["default"]), int(limits["max"]))
    if profile.get("description"):
        parts.append(str(profile["description"]))
    if image_words:
        parts.insert(1, f"image: {image_words}")
    return RuntimeEnvironment(
        name=slug, label=slug, description="; ".join(parts), file_extensions=["ipynb"],
        output_formats=list(OUTPUT_FORMATS),
        metadata={"display_name": str(profile.get("display_name") or slug),
                  "summary": str(profile.get("summary") or "")},
        compute_types=choices[0], default_compute_type=choices[1], utc_only=None)

