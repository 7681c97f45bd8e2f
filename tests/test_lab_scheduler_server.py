"""jupyter-scheduler's own REST handlers (``/scheduler/...``, what its JupyterLab UI calls) in a
real jupyter_server (pytest-jupyter's ``jp_fetch``), configured as the single-user image
configures them (images/singleuser/jupyter_server_config.py): ``HubScheduler``,
``HubEnvironmentManager`` and ``HubJobFilesManager`` of gpuspawner.singleuser.scheduler, talking
to :class:`tests.test_lab_scheduler.FakeJobsService` (a test double of the hub's service on
127.0.0.1) with the server's token from the environment.

This is the wiring the unit tests cannot see: the extension builds the classes from
configuration, its routes accept our ids (its pattern needs a ``-``: they travel as UUIDs), its
handlers await our coroutines, a refusal of the hub reaches the UI as jupyter-scheduler's HTTP
500 with the hub's message, and nothing runs in the server.

pytest-jupyter's fixtures are imported into this module only (as tests/test_gpuviews_server.py
does), and the tests drive the server's loop with ``run_until_complete``.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid

import pytest

pytest.importorskip("jupyter_scheduler")

import tornado.httpclient  # noqa: E402
from pytest_jupyter.jupyter_core import *  # noqa: E402, F403 - fixtures
from pytest_jupyter.jupyter_server import *  # noqa: E402, F403 - fixtures
from pytest_jupyter.pytest_tornasync import http_server, http_server_client  # noqa: E402, F401

from gpuspawner.singleuser.scheduler import hub_id  # noqa: E402
from tests.test_lab_scheduler import TOKEN, FakeJobsService, iso, notebook  # noqa: E402

#: what images/singleuser/jupyter_server_config.py sets
IMAGE_CONFIG = {
    "scheduler_class": "gpuspawner.singleuser.scheduler.HubScheduler",
    "environment_manager_class": "gpuspawner.singleuser.scheduler.HubEnvironmentManager",
    "job_files_manager_class": "gpuspawner.singleuser.scheduler.HubJobFilesManager",
    "db_url": "sqlite://",
}


@pytest.fixture(scope="module")
def fake():
    service = FakeJobsService()
    yield service
    service.stop()


@pytest.fixture
def jp_server_config(fake, monkeypatch):  # noqa: F811 - overrides pytest-jupyter's
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    monkeypatch.setenv("GPUSPAWNER_SERVICE_URL", fake.url)
    fake.jobs.clear()
    fake.definitions.clear()
    return {"ServerApp": {"jpserver_extensions": {"jupyter_scheduler": True},
                          "allow_unauthenticated_access": False},
            "SchedulerApp": dict(IMAGE_CONFIG)}


@pytest.fixture
def call(jp_fetch, jp_asyncio_loop, jp_serverapp):  # noqa: F811
    """``call(method, path, body=None)`` -> (status, JSON or None) of ``/scheduler/<path>``."""
    def fetch(method: str, path: str, body=None):
        path, _, query = path.partition("?")
        kw = {"method": method,
              "params": dict(p.split("=", 1) for p in query.split("&")) if query else None}
        if body is not None:
            kw["body"] = json.dumps(body)
        elif method in ("POST", "PATCH"):
            kw["body"] = "{}"
        async def go():  # jp_fetch makes its Future at once: inside the running loop
            return await jp_fetch("scheduler", *path.split("/"), **kw)

        try:  # (a loop made here: an earlier asyncio test may have left none set)
            resp = jp_asyncio_loop.run_until_complete(go())
        except tornado.httpclient.HTTPClientError as e:
            return e.code, json.loads(e.response.body) if e.response.body else None
        return resp.code, json.loads(resp.body) if resp.body else None
    return fetch


def test_the_ui_api_runs_jobs_on_the_hub(call, fake, jp_root_dir, jp_serverapp):  # noqa: F811
    scheduler = jp_serverapp.web_app.settings["scheduler"]
    assert type(scheduler).__name__ == "HubScheduler" and scheduler.task_runner is None
    code, envs = call("GET", "runtime_environments")
    assert code == 200 and [e["name"] for e in envs] == ["a100-1", "cpu"]
    assert envs[1]["output_formats"] == [{"name": "ipynb", "label": "Notebook"},
                                         {"name": "html", "label": "HTML"}]
    # the UI's start-up probe
    assert call("GET", "jobs?max_items=0") == (200, {"jobs": [], "total_count": 0})

    (jp_root_dir / "train.ipynb").write_text(json.dumps(notebook("lr = 0.1")))
    children = multiprocessing.active_children()
    code, body = call("POST", "jobs", {
        "input_uri": "train.ipynb", "runtime_environment_name": "cpu", "name": "train",
        "output_formats": ["ipynb", "html"], "parameters": {"lr": "0.5"}})
    assert code == 200, body
    job_id = body["job_id"]
    ours = hub_id(job_id)
    assert str(uuid.UUID(ours)) == job_id
    assert fake.jobs[ours]["parameters"] == {"lr": 0.5}
    assert fake.jobs[ours]["notebook"] == notebook("lr = 0.1")
    assert multiprocessing.active_children() == children  # nothing runs in the server

    code, job = call("GET", f"jobs/{job_id}")
    assert code == 200 and job["status"] == "QUEUED" and job["runtime_environment_name"] == "cpu"
    fake.set(ours, state="running", started=iso(time.time()))
    assert call("GET", "jobs/count?status=IN_PROGRESS") == (200, {"count": 1})
    # the UI's Stop button
    assert call("PATCH", f"jobs/{job_id}", {"status": "STOPPED"})[0] == 204
    assert fake.jobs[ours]["state"] == "cancelled"
    assert call("GET", f"jobs/{job_id}")[1]["status"] == "STOPPED"

    # a refusal of the hub reaches the UI with its message
    code, err = call("POST", "jobs", {"input_uri": "train.ipynb",
                                      "runtime_environment_name": "gpu9", "name": "x"})
    assert code == 500 and "profile: unknown profile 'gpu9'" in err["message"]

    # the UI's delete: the hub keeps the record, the list no longer shows it
    assert call("DELETE", f"jobs/{job_id}")[0] == 204
    assert call("GET", "jobs")[1]["jobs"] == []
    assert ours in fake.jobs


def test_download_and_definitions_through_the_ui_api(call, fake, jp_root_dir):  # noqa: F811
    (jp_root_dir / "train.ipynb").write_text(json.dumps(notebook()))
    job_id = call("POST", "jobs", {"input_uri": "train.ipynb",
                                   "runtime_environment_name": "cpu", "name": "train"}
                  )[1]["job_id"]
    ours = hub_id(job_id)
    out = f"~/jobs/train/20260202T000005Z-{ours}"
    fake.set(ours, state="completed", output_dir=out, has_output=True)
    fake.outputs[ours] = notebook("x = 3")
    code, job = call("GET", f"jobs/{job_id}")
    assert job["status"] == "COMPLETED" and not job["downloaded"]
    # the home is not under this server's root here: the download goes to the same folder
    # under the root, where the links point
    assert call("GET", f"jobs/{job_id}/download_files")[0] == 204
    written = jp_root_dir / out[2:] / "train.ipynb"
    assert json.loads(written.read_text()) == notebook("x = 3")
    code, job = call("GET", f"jobs/{job_id}")
    assert job["downloaded"]
    assert {f["file_format"]: f["file_path"] for f in job["job_files"]}["ipynb"] == \
        f"{out[2:]}/train.ipynb"

    code, body = call("POST", "job_definitions", {
        "input_uri": "train.ipynb", "runtime_environment_name": "cpu", "name": "nightly",
        "schedule": "0 3 * * *", "timezone": "Europe/Rome"})
    assert code == 200, body
    def_id = body["job_definition_id"]
    code, listed = call("GET", "job_definitions")
    assert [d["job_definition_id"] for d in listed["job_definitions"]] == [def_id]
    assert call("PATCH", f"job_definitions/{def_id}", {"active": False})[0] == 204
    assert fake.definitions[hub_id(def_id)]["paused"] is True
    code, d = call("GET", f"job_definitions/{def_id}")
    assert d["active"] is False and d["schedule"] == "0 3 * * *"
    assert call("DELETE", f"job_definitions/{def_id}")[0] == 204
    assert fake.definitions == {}
