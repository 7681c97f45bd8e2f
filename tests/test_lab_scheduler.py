"""gpuspawner.singleuser.scheduler: jupyter-scheduler's models mapped to the hub's notebook jobs,
and :class:`HubScheduler` / :class:`HubEnvironmentManager` / :class:`HubJobFilesManager`
against :class:`FakeJobsService`, a test double of the ``gpuspawner`` service's ``api/jobs``
and ``api/profiles`` served by Tornado on 127.0.0.1 (its own thread and loop, so the scheduler's
blocking client reaches it from a worker thread as it reaches the real service).

jupyter-scheduler's REST handlers in a real jupyter_server, with these classes configured, are
in tests/test_lab_scheduler_server.py; the real hub and browser in
tests/test_lab_scheduler_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

pytest.importorskip("jupyter_scheduler")

from jupyter_scheduler.environments import EnvironmentRetrievalError  # noqa: E402
from jupyter_scheduler.exceptions import SchedulerError  # noqa: E402
from jupyter_scheduler.models import (  # noqa: E402
    CountJobsQuery,
    CreateJob,
    CreateJobDefinition,
    CreateJobFromDefinition,
    ListJobDefinitionsQuery,
    ListJobsQuery,
    SortDirection,
    SortField,
    Status,
    UpdateJob,
    UpdateJobDefinition,
)
from tornado import httpclient, httpserver, ioloop, netutil, web  # noqa: E402

from gpuspawner.hub.jobs.settings import GPUJobs  # noqa: E402
from gpuspawner.hub.profiles import load_profiles  # noqa: E402
from gpuspawner.hub.service.app import GPUService  # noqa: E402
from gpuspawner.hub.service.openapi import openapi_document  # noqa: E402
from gpuspawner.hub.service.profiles_api import profile_routes  # noqa: E402
from gpuspawner.jobs.client import JobsClient  # noqa: E402
from gpuspawner.jobs.model import DEFINITION_UPDATE_KEYS, FINAL_STATES, STATES  # noqa: E402
from gpuspawner.singleuser.scheduler import (  # noqa: E402
    STATUS_OF,
    HubEnvironmentManager,
    HubJobFilesManager,
    HubScheduler,
    describe_job,
    environment,
    environment_name,
    environments,
    hub_client,
    hub_id,
    job_files,
    scheduler_id,
    split_environment,
    submission,
    time_limit_choices,
    time_limit_of,
)

TOKEN = "t0ken-of-the-server"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "description": "", "default": False,
     "summary": "2 cores, 4.0 GiB", "cores": 2, "memory": 4 << 30, "gpus": 0, "gpu_milli": 0,
     "mig": None, "mig_count": 0, "gpu_models": [],
     "time_limit": {"default": 600, "max": 3600}},
    {"slug": "a100-1", "display_name": "One A100", "description": "for training",
     "default": True, "summary": "1 x A100, 8 cores, 32.0 GiB", "cores": 8,
     "memory": 32 << 30, "gpus": 1, "gpu_milli": 0, "mig": None, "mig_count": 0,
     "gpu_models": ["A100"], "time_limit": None},
]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def notebook(source: str = "x = 1") -> dict[str, Any]:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [{"cell_type": "code", "id": "c1", "metadata": {"tags": ["parameters"]},
                       "source": source, "outputs": [], "execution_count": None}]}


# -- the test double of the service ----------------------------------------------------------
class FakeJobsService:
    """A test double of the hub's ``gpuspawner`` service: ``api/jobs`` (POST, GET with
    ``?definition_id=``), ``api/jobs/{id}`` (GET, DELETE = cancel, 409 once ended),
    ``api/jobs/{id}/output`` (``?format=html``), ``api/job_definitions`` (POST, GET),
    ``api/job_definitions/{id}`` (GET, PATCH of schedule/timezone/paused, DELETE) and
    ``api/profiles``, answering as the real one does (``{"status", "message"}`` errors, 401
    without the token). Jobs stay ``queued`` until a test moves them with :meth:`set`.
    ``requests`` records (method, path with its query, body) of each call."""

    def __init__(self, profiles: list[dict[str, Any]] = PROFILES) -> None:
        self.profiles = profiles
        self.jobs: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.html: dict[str, str] = {}
        self.definitions: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the fake service did not start"
        self.url = f"http://127.0.0.1:{self.port}/services/gpuspawner/"

    def _serve(self, ready: threading.Event) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        sockets = netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        p = "/services/gpuspawner/"
        kw = {"fake": self}
        app = web.Application([
            (p + "api/jobs", _Jobs, kw), (p + r"api/jobs/([0-9a-f]{32})", _Job, kw),
            (p + r"api/jobs/([0-9a-f]{32})/output", _Output, kw),
            (p + "api/job_definitions", _Definitions, kw),
            (p + r"api/job_definitions/([0-9a-f]{32})", _Definition, kw),
            (p + r"api/job_definitions/([0-9a-f]{32})/jobs", _DefinitionJobs, kw),
            (p + "api/profiles", _Profiles, kw)])
        self.server = httpserver.HTTPServer(app)
        self.server.add_sockets(sockets)
        ready.set()
        ioloop.IOLoop.current().start()

    def stop(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def set(self, job_id: str, **fields: Any) -> dict[str, Any]:
        """Move a job (state, started, finished, output_dir, message, error...)."""
        with self.lock:
            self.jobs[job_id].update(fields)
            if "state" in fields:
                self.jobs[job_id]["history"].append({"state": fields["state"],
                                                     "time": iso(time.time())})
            return dict(self.jobs[job_id])


class _Base(web.RequestHandler):
    def initialize(self, fake: FakeJobsService) -> None:
        self.fake = fake

    def prepare(self) -> None:
        body = json.loads(self.request.body) if self.request.body else None
        self.fake.requests.append((self.request.method, self.request.uri.split(
            "/services/gpuspawner/")[1], body))
        if self.request.headers.get("Authorization") != f"token {TOKEN}":
            raise web.HTTPError(401, "log in to the hub or send a JupyterHub API token")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.finish({"status": status_code, "message": message})

    def job(self, job_id: str) -> dict[str, Any]:
        job = self.fake.jobs.get(job_id)
        if job is None:
            raise web.HTTPError(404, f"no job {job_id}")
        return job


class _Profiles(_Base):
    def get(self) -> None:
        self.finish({"profiles": self.fake.profiles})


class _Jobs(_Base):
    def get(self) -> None:
        jobs = sorted(self.fake.jobs.values(), key=lambda j: j["created"], reverse=True)
        wanted = self.get_query_argument("definition_id", None)
        if wanted:
            jobs = [j for j in jobs if j["definition_id"] == wanted]
        self.finish({"jobs": jobs})

    def post(self) -> None:
        body = json.loads(self.request.body)
        slugs = [p["slug"] for p in self.fake.profiles]
        profile = body.get("profile") or next(p["slug"] for p in self.fake.profiles
                                              if p["default"])
        if profile not in slugs:
            raise web.HTTPError(400, f"profile: unknown profile {profile!r}")
        job_id = uuid.uuid4().hex
        now = time.time() + len(self.fake.jobs)  # distinct creation times, in order
        job = {"id": job_id, "user": "alice", "name": body.get("name", "notebook"),
               "profile": profile, "state": "queued", "message": "",
               "time_limit": body.get("time_limit", 600),
               "parameters": body.get("parameters", {}), "created": iso(now), "at": None,
               "started": None, "finished": None,
               "history": [{"state": "queued", "time": iso(now)}], "node": None,
               "gpu_uuids": [], "exit_code": None, "error": None, "output_dir": None,
               "has_output": False, "queue_position": None, "definition_id": None,
               "notebook": body["notebook"],
               "output_formats": body.get("output_formats", ["ipynb", "html"]),
               "input_folder": body.get("input_folder"), "image": body.get("image"),
               "image--unlisted-choice": body.get("image--unlisted-choice")}
        with self.fake.lock:
            self.fake.jobs[job_id] = job
        self.set_status(201)
        self.finish(job)


class _Job(_Base):
    def get(self, job_id: str) -> None:
        self.finish(self.job(job_id))

    def delete(self, job_id: str) -> None:
        job = self.job(job_id)
        if job["state"] in FINAL_STATES:
            raise web.HTTPError(409, f"job {job_id} has ended ({job['state']})")
        self.finish(self.fake.set(job_id, state="cancelled", message="cancelled by alice"))


class _Output(_Base):
    def get(self, job_id: str) -> None:
        self.job(job_id)
        if self.get_query_argument("format", "ipynb") == "html":
            if job_id not in self.fake.html:
                raise web.HTTPError(404, f"job {job_id} has no HTML export here")
            self.set_header("Content-Type", "text/html; charset=UTF-8")
            self.finish(self.fake.html[job_id])
            return
        if job_id not in self.fake.outputs:
            raise web.HTTPError(404, f"job {job_id} has no executed notebook here")
        self.finish(self.fake.outputs[job_id])


class _Definitions(_Base):
    def get(self) -> None:
        self.finish({"job_definitions": sorted(self.fake.definitions.values(),
                                               key=lambda d: d["created"], reverse=True)})

    def post(self) -> None:
        body = json.loads(self.request.body)
        if not body.get("schedule"):
            raise web.HTTPError(400, "schedule: missing: a cron expression is required")
        def_id = uuid.uuid4().hex
        now = iso(time.time() + len(self.fake.definitions))
        row = {"id": def_id, "user": "alice", "name": body.get("name", "notebook"),
               "profile": body.get("profile", "a100-1"), "time_limit": 600,
               "parameters": body.get("parameters", {}), "schedule": body["schedule"],
               "timezone": body.get("timezone", "UTC"), "concurrency_policy": "Forbid",
               "starting_deadline": None, "paused": False, "created": now, "updated": now,
               "last_tick": None, "next_tick": None, "message": "", "last_job_id": None,
               "runs": 0, "skipped": 0, "active_jobs": [],
               "output_formats": body.get("output_formats", ["ipynb", "html"]),
               "input_folder": body.get("input_folder"), "image": body.get("image"),
               "image--unlisted-choice": body.get("image--unlisted-choice"),
               "notebook": body["notebook"]}
        self.fake.definitions[def_id] = row
        self.set_status(201)
        self.finish(row)


class _Definition(_Base):
    def row(self, def_id: str) -> dict[str, Any]:
        if def_id not in self.fake.definitions:
            raise web.HTTPError(404, f"no job definition {def_id}")
        return self.fake.definitions[def_id]

    def get(self, def_id: str) -> None:
        self.finish(self.row(def_id))

    def patch(self, def_id: str) -> None:
        body = json.loads(self.request.body)
        unknown = set(body) - set(DEFINITION_UPDATE_KEYS)
        if unknown:
            raise web.HTTPError(400, f"{sorted(unknown)[0]}: cannot be changed")
        row = self.row(def_id)
        row.update(body, updated=iso(time.time() + 100))
        self.finish(row)

    def delete(self, def_id: str) -> None:
        self.finish(self.fake.definitions.pop(self.row(def_id)["id"]))


class _DefinitionJobs(_Definition):
    def post(self, def_id: str) -> None:  # a job of the definition now ("Run job")
        row = self.row(def_id)
        body = json.loads(self.request.body or b"{}")
        job = {"id": uuid.uuid4().hex, "state": "queued", "created": iso(time.time()),
               "profile": row["profile"], "name": row["name"], "definition_id": def_id,
               "parameters": {**row["parameters"], **body.get("parameters", {})},
               "time_limit": row["time_limit"], "notebook": row["notebook"]}
        with self.fake.lock:
            self.fake.jobs[job["id"]] = job
        self.set_status(201)
        self.finish(job)


@pytest.fixture(scope="module")
def fake():
    service = FakeJobsService()
    yield service
    service.stop()


@pytest.fixture
def home(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def scheduler(fake, home, tmp_path) -> HubScheduler:
    fake.jobs.clear()
    fake.definitions.clear()
    fake.requests.clear()
    client = JobsClient(fake.url, TOKEN, timeout=10)
    s = HubScheduler(root_dir=str(home), environments_manager=HubEnvironmentManager(client),
                     client=client, home=str(home))
    s.hidden_jobs_file = str(tmp_path / "data" / "hidden.json")
    return s


def create(name: str = "train", path: str = "train.ipynb", **kw: Any) -> CreateJob:
    return CreateJob(input_uri=path, runtime_environment_name=kw.pop("env", "cpu"),
                     name=name, output_formats=kw.pop("output_formats", ["ipynb"]), **kw)


# -- the mapping -----------------------------------------------------------------------------
def test_ids_are_uuids_for_jupyter_scheduler_and_back():
    ours = uuid.uuid4().hex
    theirs = scheduler_id(ours)
    assert "-" in theirs and uuid.UUID(theirs).hex == ours  # its routes need a "-"
    assert hub_id(theirs) == ours and hub_id(ours) == ours
    with pytest.raises(SchedulerError, match="UUID"):
        hub_id("not-a-job")


def test_every_state_has_a_status_and_the_ui_can_stop_what_runs():
    assert set(STATUS_OF) == set(STATES)
    assert {s for s, v in STATUS_OF.items() if v == Status.IN_PROGRESS} == {"starting",
                                                                             "running"}
    assert {s for s, v in STATUS_OF.items() if v == Status.QUEUED} == {"queued", "waiting"}
    assert STATUS_OF["cancelled"] == Status.STOPPED
    for state in FINAL_STATES - {"cancelled"}:
        assert STATUS_OF[state] in (Status.COMPLETED, Status.FAILED)  # output links shown


def test_describe_job_keeps_times_parameters_and_the_lost_state(home):
    t0 = 1_770_000_000
    job = {"id": "ab" * 16, "name": "train", "profile": "a100-1", "state": "timed_out",
           "message": "stopped at its time limit of 60 s", "time_limit": 60,
           "parameters": {"lr": 0.01, "tag": "7", "sizes": [1, 2]}, "created": iso(t0),
           "started": iso(t0 + 5), "finished": iso(t0 + 65),
           "history": [{"state": "queued", "time": iso(t0)},
                       {"state": "timed_out", "time": iso(t0 + 66)}],
           "error": None, "output_dir": "~/jobs/train/20260202T000005Z-" + "ab" * 16}
    m = describe_job(job, str(home), str(home), files=False)
    assert m.job_id == str(uuid.UUID("ab" * 16))
    assert (m.create_time, m.start_time, m.end_time, m.update_time) == (
        t0 * 1000, (t0 + 5) * 1000, (t0 + 65) * 1000, (t0 + 66) * 1000)
    assert m.status == Status.FAILED
    assert m.status_message == "timed_out: stopped at its time limit of 60 s"
    assert m.parameters == {"lr": "0.01", "tag": "7", "sizes": "[1, 2]"}
    assert m.runtime_environment_name == "a100-1"
    assert m.runtime_environment_parameters == {"time_limit": 60}
    failed = describe_job({**job, "state": "failed", "message": "",
                           "error": {"ename": "ZeroDivisionError", "evalue": "division by zero",
                                     "cell": 3}}, str(home), str(home), files=False)
    assert failed.status_message == "cell 3: ZeroDivisionError: division by zero"


def test_job_files_link_what_the_job_wrote_in_the_home(home):
    job_id = "cd" * 16
    job = {"id": job_id, "name": "train", "output_dir": f"~/jobs/train/20260202T000005Z-{job_id}"}
    files, downloaded = job_files(job, str(home), str(home))
    assert [f.file_path for f in files] == [None] * 5 and not downloaded
    folder = home / "jobs" / "train" / f"20260202T000005Z-{job_id}"
    folder.mkdir(parents=True)
    for name in ("train.ipynb", "train.html", "train.input.ipynb", "job.log"):
        (folder / name).write_text("{}")
    files, downloaded = job_files(job, str(home), str(home))
    rel = f"jobs/train/20260202T000005Z-{job_id}"
    assert {f.file_format: f.file_path for f in files} == {
        "ipynb": f"{rel}/train.ipynb", "html": f"{rel}/train.html",
        "input": f"{rel}/train.input.ipynb",
        "log": f"{rel}/job.log", "files": rel}
    assert downloaded
    # a server whose root is a sub-folder of the home: the same layout under the root
    root = home / "work"
    root.mkdir()
    files, downloaded = job_files(job, str(root), str(home))
    assert not downloaded and files[0].file_path is None
    # a job with no folder yet (queued) and an output_dir that climbs out: no link
    assert job_files({"id": job_id, "name": "x", "output_dir": None}, str(home),
                     str(home))[0][0].file_path is None
    assert job_files({"id": job_id, "name": "x", "output_dir": "~/../../etc"}, str(home),
                     str(home))[0][4].file_path is None


def test_submission_maps_the_create_job_model():
    body = submission(create(name="my run 1", parameters={"lr": "0.01", "flag": "true",
                                                         "word": "hello", "xs": "[1, 2]"},
                             runtime_environment_parameters={"time_limit": "120"}),
                      notebook())
    assert body == {"notebook": notebook(), "name": "my-run-1", "profile": "cpu",
                    "parameters": {"lr": 0.01, "flag": True, "word": "hello", "xs": [1, 2]},
                    "time_limit": 120, "output_formats": ["ipynb"]}
    # only what was ticked; the notebook always (as jupyter-scheduler keeps it)
    assert submission(create(output_formats=["ipynb", "html"]), notebook())[
        "output_formats"] == ["ipynb", "html"]
    assert submission(create(output_formats=["html"]), notebook())[
        "output_formats"] == ["ipynb", "html"]
    assert submission(create(output_formats=[]), notebook())["output_formats"] == ["ipynb"]
    with pytest.raises(SchedulerError, match="pdf"):
        submission(create(output_formats=["ipynb", "pdf"]), notebook())
    # "Run job with input folder": the folder the scheduler gives, relative to the home
    with pytest.raises(SchedulerError, match="input folder"):
        submission(create(package_input_folder=True), notebook())
    assert submission(create(package_input_folder=True), notebook(), "proj/a")[
        "input_folder"] == "proj/a"
    assert "input_folder" not in submission(create(), notebook(), "proj/a")
    # the environment carries the image chosen: a choice of the profile, or one's own
    body = submission(create(env="cpu:tf"), notebook())
    assert (body["profile"], body["image"], "image--unlisted-choice" in body) == (
        "cpu", "tf", False)
    body = submission(create(env="cpu@reg.example.org/me/img:1"),
                      notebook())
    assert (body["profile"], body["image--unlisted-choice"], "image" in body) == (
        "cpu", "reg.example.org/me/img:1", False)
    with pytest.raises(SchedulerError, match="time_limit"):
        submission(create(runtime_environment_parameters={"time_limit": "soon"}), notebook())
    # the form's "Compute type" select carries the time limit
    assert submission(create(compute_type="time limit 2 h"), notebook())["time_limit"] == 7200
    assert submission(create(compute_type="time limit 10 min (default)"),
                      notebook())["time_limit"] == 600
    assert submission(create(compute_type="time limit 2 h",
                             runtime_environment_parameters={"time_limit": "60"}),
                      notebook())["time_limit"] == 60
    with pytest.raises(SchedulerError, match="compute type 'gpu-xl'"):
        submission(create(compute_type="gpu-xl"), notebook())


def test_the_profiles_time_limits_are_the_forms_compute_types():
    labels, default = time_limit_choices(600, 3600)
    assert labels == ["time limit 10 min (default)", "time limit 15 min", "time limit 30 min",
                      "time limit 1 h"]
    assert default == "time limit 10 min (default)"
    assert [time_limit_of(x) for x in labels] == [600, 900, 1800, 3600]
    labels, default = time_limit_choices(3600, 86400)
    assert labels[-1] == "time limit 24 h" and default == "time limit 1 h (default)"
    assert time_limit_choices(90, 90) == (["time limit 90 s (default)"],
                                          "time limit 90 s (default)")


def test_hub_client_reads_the_servers_environment():
    c = hub_client({"JUPYTERHUB_API_TOKEN": "x",
                    "JUPYTERHUB_API_URL": "http://10.0.0.1:8081/hub/api"})
    assert c.url == "http://10.0.0.1:8081/services/gpuspawner/" and c.token == "x"
    c = hub_client({"JUPYTERHUB_API_TOKEN": "x", "GPUSPAWNER_SERVICE_URL": "http://h/s/g"})
    assert c.url == "http://h/s/g/"
    with pytest.raises(SchedulerError, match="JUPYTERHUB_API_TOKEN"):
        hub_client({"JUPYTERHUB_API_URL": "http://10.0.0.1:8081/hub/api"})
    with pytest.raises(SchedulerError, match="GPUSPAWNER_SERVICE_URL"):
        hub_client({"JUPYTERHUB_API_TOKEN": "x"})


# -- the scheduler against the test double ---------------------------------------------------
async def test_create_job_sends_the_notebook_to_the_hub(scheduler, fake, home):
    (home / "train.ipynb").write_text(json.dumps(notebook("lr = 0.1")))
    job_id = await scheduler.create_job(create(parameters={"lr": "0.5"}))
    ours = hub_id(job_id)
    method, path, body = fake.requests[-1]
    assert (method, path) == ("POST", "api/jobs")
    assert body["notebook"] == notebook("lr = 0.1") and body["profile"] == "cpu"
    assert body["parameters"] == {"lr": 0.5} and body["name"] == "train"
    assert fake.jobs[ours]["state"] == "queued"
    job = await scheduler.get_job(job_id)
    assert job.status == Status.QUEUED and job.name == "train"
    assert [f.file_path for f in job.job_files] == [None] * 5
    assert job.job_definition_id is None


async def test_refusals_of_the_hub_reach_the_ui_with_their_message(scheduler, home):
    (home / "train.ipynb").write_text(json.dumps(notebook()))
    with pytest.raises(SchedulerError, match="HTTP 400: profile: unknown profile 'gpu9'"):
        await scheduler.create_job(create(env="gpu9"))
    with pytest.raises(SchedulerError, match="no such file"):
        await scheduler.create_job(create(path="missing.ipynb"))
    with pytest.raises(SchedulerError, match="no such file"):
        await scheduler.create_job(create(path="../outside.ipynb"))
    with pytest.raises(SchedulerError, match="HTTP 404"):
        await scheduler.get_job(str(uuid.uuid4()))
    bad = HubScheduler(root_dir=str(home), environments_manager=HubEnvironmentManager(),
                       client=JobsClient(scheduler.client.url, "wrong-token", timeout=10))
    with pytest.raises(SchedulerError, match="HTTP 401"):
        await bad.list_jobs(ListJobsQuery())


async def test_list_filter_sort_page_and_count(scheduler, fake, home):
    (home / "a.ipynb").write_text(json.dumps(notebook()))
    ids = [hub_id(await scheduler.create_job(create(name=n, path="a.ipynb")))
           for n in ("alpha", "beta", "gamma")]
    fake.set(ids[1], state="running", started=iso(time.time()))
    everything = await scheduler.list_jobs(ListJobsQuery())
    assert [j.name for j in everything.jobs] == ["gamma", "beta", "alpha"]  # newest first
    assert everything.total_count == 3 and everything.next_token is None
    probe = await scheduler.list_jobs(ListJobsQuery(max_items=0))  # the UI's start-up probe
    assert probe.jobs == [] and probe.total_count == 3
    running = await scheduler.list_jobs(ListJobsQuery(status=Status.IN_PROGRESS))
    assert [j.name for j in running.jobs] == ["beta"]
    assert [j.name for j in (await scheduler.list_jobs(ListJobsQuery(name="ga"))).jobs] == [
        "gamma"]
    by_name = ListJobsQuery(sort_by=[SortField(name="name", direction=SortDirection.asc)],
                            max_items=2)
    first = await scheduler.list_jobs(by_name)
    assert [j.name for j in first.jobs] == ["alpha", "beta"] and first.next_token == "2"
    second = await scheduler.list_jobs(ListJobsQuery(**{**by_name.dict(), "next_token": "2"}))
    assert [j.name for j in second.jobs] == ["gamma"] and second.next_token is None
    assert await scheduler.count_jobs(CountJobsQuery(status=Status.IN_PROGRESS)) == 1
    assert await scheduler.count_jobs(CountJobsQuery(status=Status.QUEUED)) == 2
    assert (await scheduler.list_jobs(ListJobsQuery(tags=["x"]))).jobs == []


async def test_stop_cancels_on_the_hub_and_delete_hides(scheduler, fake, home):
    (home / "a.ipynb").write_text(json.dumps(notebook()))
    run, done = [await scheduler.create_job(create(name=n, path="a.ipynb"))
                 for n in ("run", "done")]
    fake.set(hub_id(run), state="running")
    await scheduler.update_job(run, UpdateJob(status=Status.STOPPED))
    assert fake.jobs[hub_id(run)]["state"] == "cancelled"
    assert (await scheduler.get_job(run)).status == Status.STOPPED
    assert ("DELETE", f"api/jobs/{hub_id(run)}", None) in fake.requests
    fake.set(hub_id(done), state="completed")
    calls = len(fake.requests)
    await scheduler.stop_job(done)  # ended: nothing to cancel, no 409 for the UI
    assert not [r for r in fake.requests[calls:] if r[0] == "DELETE"]
    await scheduler.delete_job(done)
    assert fake.jobs[hub_id(done)]["state"] == "completed"  # the hub keeps the record
    assert [j.name for j in (await scheduler.list_jobs(ListJobsQuery())).jobs] == ["run"]
    with pytest.raises(SchedulerError, match="renamed"):
        await scheduler.update_job(run, UpdateJob(name="other"))


async def test_a_finished_job_shows_its_files_and_downloads_its_notebook(scheduler, fake,
                                                                         home):
    (home / "a.ipynb").write_text(json.dumps(notebook()))
    job_id = await scheduler.create_job(create(name="train", path="a.ipynb"))
    ours = hub_id(job_id)
    out = f"~/jobs/train/20260202T000005Z-{ours}"
    fake.set(ours, state="completed", started=iso(time.time()), finished=iso(time.time()),
             output_dir=out, has_output=True)
    executed = notebook("x = 2")
    fake.outputs[ours] = executed
    fake.html[ours] = "<html><body>x = 2</body></html>"
    job = await scheduler.get_job(job_id)
    assert job.status == Status.COMPLETED and not job.downloaded
    # the UI's download button: the executed notebook and its HTML, from the hub, where the
    # links point
    await HubJobFilesManager(scheduler).copy_from_staging(job_id)
    path = home / out[2:] / "train.ipynb"
    assert json.loads(path.read_text()) == executed
    assert (home / out[2:] / "train.html").read_text() == fake.html[ours]
    job = await scheduler.get_job(job_id)
    assert job.downloaded and job.job_files[0].file_path == f"{out[2:]}/train.ipynb"
    assert job.job_files[1].file_path == f"{out[2:]}/train.html"
    listed = (await scheduler.list_jobs(ListJobsQuery())).jobs[0]
    assert listed.downloaded and listed.job_files[0].file_path == f"{out[2:]}/train.ipynb"
    path.write_text("{}")  # already there: kept unless redownload
    await HubJobFilesManager(scheduler).copy_from_staging(job_id)
    assert path.read_text() == "{}"
    await HubJobFilesManager(scheduler).copy_from_staging(job_id, redownload=True)
    assert json.loads(path.read_text()) == executed
    # no HTML export on the hub: the notebook alone
    del fake.html[ours]
    (home / out[2:] / "train.html").unlink()
    assert await scheduler.download_output(job_id, redownload=True) == [str(path)]


async def test_definitions_go_to_the_hubs_job_definitions(scheduler, fake, home):
    (home / "nightly.ipynb").write_text(json.dumps(notebook("lr = 0.1")))
    def_id = await scheduler.create_job_definition(CreateJobDefinition(
        input_uri="nightly.ipynb", runtime_environment_name="cpu", name="nightly run",
        schedule="0 3 * * *", timezone="Europe/Rome", parameters={"lr": "0.2"},
        output_formats=["ipynb", "html"]))
    ours = hub_id(def_id)
    method, path, body = fake.requests[-1]
    assert (method, path) == ("POST", "api/job_definitions")
    assert body == {"notebook": notebook("lr = 0.1"), "name": "nightly-run", "profile": "cpu",
                    "parameters": {"lr": 0.2}, "schedule": "0 3 * * *",
                    "timezone": "Europe/Rome", "output_formats": ["ipynb", "html"]}
    d = await scheduler.get_job_definition(def_id)
    assert (d.job_definition_id, d.name, d.schedule, d.timezone, d.active) == (
        def_id, "nightly-run", "0 3 * * *", "Europe/Rome", True)
    assert d.parameters == {"lr": "0.2"} and d.runtime_environment_name == "cpu"
    listed = await scheduler.list_job_definitions(ListJobDefinitionsQuery())
    assert [x.job_definition_id for x in listed.job_definitions] == [def_id]
    assert listed.total_count == 1
    assert (await scheduler.list_job_definitions(ListJobDefinitionsQuery(name="x"))
            ).job_definitions == []
    # pause (the UI's pause button), then a new schedule with the input the UI's edit sends
    await scheduler.update_job_definition(def_id, UpdateJobDefinition(active=False))
    assert fake.requests[-1] == ("PATCH", f"api/job_definitions/{ours}", {"paused": True})
    assert not (await scheduler.get_job_definition(def_id)).active
    # (the snapshot's name unchanged: no new notebook, as jupyter-scheduler's own backend)
    await scheduler.update_job_definition(def_id, UpdateJobDefinition(
        schedule="30 4 * * 1", timezone="UTC", input_uri="nightly-run.ipynb"))
    assert fake.requests[-1] == ("PATCH", f"api/job_definitions/{ours}",
                                 {"schedule": "30 4 * * 1", "timezone": "UTC"})
    # every other field of the definition: name, environment (profile and image), compute
    # type, parameters, output formats, and a new notebook (a file dropped on the edit form)
    (home / "v2.ipynb").write_text(json.dumps(notebook("lr = 0.5")))
    await scheduler.update_job_definition(def_id, UpdateJobDefinition(
        name="other run", runtime_environment_name="a100-1:tf", compute_type="time limit 2 h",
        parameters={"lr": "0.3", "tag": "best"}, output_formats=["ipynb"],
        input_uri="v2.ipynb"))
    assert fake.requests[-1] == ("PATCH", f"api/job_definitions/{ours}", {
        "name": "other-run", "profile": "a100-1", "image": "tf",
        "image--unlisted-choice": "", "time_limit": 7200,
        "parameters": {"lr": 0.3, "tag": "best"}, "output_formats": ["ipynb"],
        "notebook": notebook("lr = 0.5")})
    d = await scheduler.get_job_definition(def_id)
    assert (d.name, d.runtime_environment_name, d.parameters, d.output_formats) == (
        "other-run", "a100-1:tf", {"lr": "0.3", "tag": "best"}, ["ipynb"])
    # the definition's own file, saved with a new schedule: snapshotted anew (jupyter-
    # scheduler's rule); saved again with the same schedule: the snapshot stays
    (home / "other-run.ipynb").write_text(json.dumps(notebook("lr = 0.7")))
    again = UpdateJobDefinition(schedule="0 5 * * *", timezone="UTC",
                                input_uri="other-run.ipynb")
    await scheduler.update_job_definition(def_id, again)
    assert fake.requests[-1][2] == {"schedule": "0 5 * * *", "timezone": "UTC",
                                    "notebook": notebook("lr = 0.7")}
    await scheduler.update_job_definition(def_id, again)
    assert fake.requests[-1][2] == {"schedule": "0 5 * * *", "timezone": "UTC"}
    with pytest.raises(SchedulerError, match="tags"):
        await scheduler.update_job_definition(def_id, UpdateJobDefinition(tags=["x"]))
    # "Run job" of a definition: a job now, the form's parameters over the definition's
    run_id = await scheduler.create_job_from_definition(def_id, CreateJobFromDefinition(
        parameters={"lr": "0.9"}))
    assert fake.requests[-1] == ("POST", f"api/job_definitions/{ours}/jobs",
                                 {"parameters": {"lr": 0.9}})
    assert fake.jobs[hub_id(run_id)]["parameters"] == {"lr": 0.9, "tag": "best"}
    del fake.jobs[hub_id(run_id)]
    # the jobs its ticks made (the definition's detail view)
    (home / "a.ipynb").write_text(json.dumps(notebook()))
    tick = await scheduler.create_job(create(name="tick", path="a.ipynb"))
    await scheduler.create_job(create(name="other", path="a.ipynb"))
    fake.set(hub_id(tick), definition_id=ours)
    jobs = await scheduler.list_jobs(ListJobsQuery(job_definition_id=def_id))
    assert [(j.name, j.job_definition_id) for j in jobs.jobs] == [("tick", def_id)]
    assert fake.requests[-1][1] == f"api/jobs?definition_id={ours}"
    await scheduler.delete_job_definition(def_id)
    assert fake.definitions == {}
    with pytest.raises(SchedulerError, match="HTTP 404"):
        await scheduler.get_job_definition(def_id)
    with pytest.raises(SchedulerError, match="schedule"):
        await scheduler.create_job_definition(CreateJobDefinition(
            input_uri="nightly.ipynb", runtime_environment_name="cpu", name="x"))


async def test_environments_are_the_users_profiles(fake):
    manager = HubEnvironmentManager(JobsClient(fake.url, TOKEN, timeout=10))
    envs = await manager.list_environments()
    assert [e.name for e in envs] == ["a100-1", "cpu"]  # the default profile first
    assert all(e.label == e.name for e in envs)  # the UI shows the name, selects the label
    assert envs[0].description == "One A100; 1 x A100, 8 cores, 32.0 GiB; for training"
    assert "time limit 600 s (at most 3600 s)" in envs[1].description
    assert envs[1].default_compute_type == "time limit 10 min (default)"
    assert envs[1].compute_types[-1] == "time limit 1 h"
    assert envs[1].output_formats == ["ipynb", "html"]
    assert manager.output_formats_mapping() == {"ipynb": "Notebook", "html": "HTML"}
    refused = HubEnvironmentManager(JobsClient(fake.url, "wrong", timeout=10))
    with pytest.raises(EnvironmentRetrievalError, match="HTTP 401"):
        await refused.list_environments()


def test_the_module_needs_no_hub_code():
    code = ("import sys, gpuspawner.singleuser.scheduler; "
            "print(sorted(m for m in sys.modules if m.startswith(('gpuspawner.hub', "
            "'jupyterhub'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]"


# -- the service's api/profiles (the environments' source) ----------------------------------
class _HubAuthDouble:
    """Stands in for the service's HubOAuth: every request is ``model``'s (a hub user model
    with its scopes), checked against the handler's required scopes as HubOAuth does."""

    def __init__(self, model: dict[str, Any]) -> None:
        self.model = model

    async def get_user(self, handler: Any, sync: bool = True) -> dict[str, Any]:
        return dict(self.model)

    def check_scopes(self, required: set[str], model: dict[str, Any]) -> set[str]:
        return set(required) & set(model.get("scopes") or [])


def _nullable_as_null(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable`` as JSON Schema's null type (as tests/test_service_unit.py)."""
    if isinstance(node, dict):
        out = {k: _nullable_as_null(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(node, list):
        return [_nullable_as_null(v) for v in node]
    return node


async def test_the_services_profiles_route_lists_what_the_users_groups_may_use():
    service = GPUService("gpuspawner", "t" * 64, hub_api_url="http://127.0.0.1:1/hub/api",
                         user_lookup=lambda name: (False, ["physics"]),
                         extra_routes=[profile_routes])
    profiles = load_profiles([
        {"slug": "cpu", "display_name": "CPU", "cpu": 2, "memory": "4G"},
        {"slug": "a100-1", "display_name": "One A100", "gpus": 1, "cpu": 8, "memory": "32G",
         "gpu_models": ["A100"], "groups": ["physics"], "default": True},
        {"slug": "mig", "display_name": "A MIG slice", "mig": "1g.10gb", "groups": ["bio"]}])
    settings = GPUJobs(profile_time_limits={"cpu": {"default": 600, "max": 3600}})
    service.jobs = SimpleNamespace(runner=SimpleNamespace(profiles=lambda: profiles,
                                                          settings=settings))
    service._hub_auth = _HubAuthDouble({"name": "alice", "kind": "user", "groups": None,
                                        "scopes": ["access:services!service=gpuspawner"]})
    sockets = netutil.bind_sockets(0, "127.0.0.1")
    server = httpserver.HTTPServer(service.make_app())
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{service.prefix}api/profiles"
    try:
        r = await httpclient.AsyncHTTPClient().fetch(url, raise_error=False)
        assert r.code == 200, r.body
        body = json.loads(r.body)
        # physics may use cpu (everyone) and a100-1; the MIG profile is bio's
        assert [p["slug"] for p in body["profiles"]] == ["cpu", "a100-1"]
        cpu, a100 = body["profiles"]
        assert cpu["time_limit"] == {"default": 600, "max": 3600}
        assert a100["time_limit"] == {"default": settings.time_limit_default,
                                      "max": settings.time_limit_max}
        assert (a100["gpus"], a100["cores"], a100["memory"], a100["default"]) == (
            1, 8, 32 << 30, True)
        assert a100["summary"] == "1 x A100, 8 cores, 32.0 GiB"
        doc = _nullable_as_null(openapi_document())  # the OpenAPI document agrees
        jsonschema.validate(body, {**doc["paths"]["/api/profiles"]["get"]["responses"]["200"][
            "content"]["application/json"]["schema"], "components": doc["components"]})
        # the environments the Lab shows are these
        envs = [environment(p) for p in body["profiles"]]
        assert [e.name for e in envs] == ["cpu", "a100-1"]
        # no scope for the service: 403
        service._hub_auth = _HubAuthDouble({"name": "alice", "kind": "user", "scopes": []})
        r = await httpclient.AsyncHTTPClient().fetch(url, raise_error=False)
        assert r.code == 403
    finally:
        server.stop()
        await server.close_all_connections()


def test_environments_offer_the_profiles_images_and_the_servers_own():
    """Each image choice of a profile is an environment (``slug:key``), and the server's own
    image (``JUPYTER_IMAGE_SPEC``) where the profile takes one (``slug@reference``): what
    the job then runs in (the hub checks the choice again)."""
    profiles = [
        {"slug": "gpu", "display_name": "GPU", "images": [], "own_image": False},
        {"slug": "cpu", "display_name": "CPU", "default": True, "own_image": True,
         "images": [{"key": "std", "display_name": "Standard", "image": "reg.example/std:1",
                     "default": True},
                    {"key": "tf", "display_name": "TensorFlow", "image": "reg.example/tf:2",
                     "default": False}]}]
    envs = environments(profiles, "reg.example/me:3")
    assert [e.name for e in envs] == ["cpu", "cpu:tf", "cpu@reg.example/me:3", "gpu"]
    assert all(e.label == e.name for e in envs)
    assert "image: TensorFlow" in envs[1].description
    assert "this server's image" in envs[2].description
    # a server that runs one of the listed images gets no environment of its own image
    assert [e.name for e in environments(profiles, "reg.example/tf:2")] == [
        "cpu", "cpu:tf", "gpu"]
    for name in ("cpu", "cpu:tf", "cpu@reg.example/me:3"):
        profile, image = split_environment(name)
        assert environment_name(profile, image) == name
    assert split_environment("cpu@reg.example:5000/me:3") == (
        "cpu", {"image": "", "image--unlisted-choice": "reg.example:5000/me:3"})
