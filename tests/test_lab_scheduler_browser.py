"""A notebook job made in JupyterLab's UI, in Debian's Chromium (Python Playwright), on the hub
as `make up` runs it (hub_config/jupyterhub_config.py, the real Docker engine and the
single-user image): marked ``browser``, ``hub``, ``docker``.

A user logs in, their server starts from the image, they open a notebook in JupyterLab, press
jupyter-scheduler's "Create a job" button in the notebook's toolbar, see the profiles they may
use as the environments, fill in the job's name and a parameter and press "Create". The job
runs on the hub (gpuspawner.singleuser.scheduler -> the gpuspawner service's api/jobs), in a
container of its own (``job-<user>--<id>``, its profile's core and memory), not in the
server: the Notebook Jobs panel shows it Completed, with links to the files it wrote in the
user's home (``~/jobs/<name>/<UTC start>-<id>/``), the executed notebook holds the parameter's
effect, ``gpuspawner jobs list`` in the server's terminal lists the same job, and afterwards
the ledger holds the server's allocation only. A job definition as the Lab's scheduler sends
it ("Run on a schedule") is accepted by the real service, paused and deleted.

The image is $SINGLEUSER_IMAGE (default gpuspawner/singleuser:latest, `make images`); it must
have jupyter-scheduler (images/singleuser/requirements.in), else the test skips with that.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.hubrunner import Hub

pytest.importorskip("docker")
sync_api = pytest.importorskip("playwright.sync_api")

from gpuspawner.hub.identity import safe_name  # noqa: E402
from gpuspawner.jobs.client import JobsClient  # noqa: E402
from gpuspawner.testing.browser import hub_login  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of  # noqa: E402
from tests.test_pages_browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    FETCH_JSON,
    IMAGE,
    SCREENSHOTS,
)
from tests.waiting import wait_until  # noqa: E402

scheduler_module = pytest.importorskip("gpuspawner.singleuser.scheduler")
HubScheduler = scheduler_module.HubScheduler
HubEnvironmentManager = scheduler_module.HubEnvironmentManager
models = pytest.importorskip("jupyter_scheduler.models")
CreateJobDefinition = models.CreateJobDefinition
UpdateJobDefinition = models.UpdateJobDefinition
ListJobDefinitionsQuery = models.ListJobDefinitionsQuery

USER = "lab-jobs-ann"
SVC = "/services/gpuspawner/"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU, small", "cpu": 1, "memory": "512M",
     "default": True},
    {"slug": "cpu-tiny", "display_name": "CPU, tiny", "cpu": 1, "memory": "256M"},
]
EXTRA = f"""
for _r in c.JupyterHub.load_roles:  # the test's admin token reads everyone's allocations
    if _r.get("name") == "gpuspawner-admin":
        _r["scopes"] = list(_r["scopes"]) + ["tokens", "access:services"]
c.GPUSpawner.image = {IMAGE!r}
c.GPUJobs.poll_interval = 0.5
c.DockerBackend.stop_timeout = 5
"""
#: a notebook whose parameter cell the job's parameter replaces
NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "cells": [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]},
         "source": "x = 1", "outputs": [], "execution_count": None},
        {"cell_type": "code", "id": "work", "metadata": {},
         "source": "import os\nprint('twice x is', 2 * x, 'in', os.environ.get('CPU_LIMIT'))",
         "outputs": [], "execution_count": None},
    ],
}


def _skip_reasons() -> list[str]:
    out = []
    if not os.access(CHROMIUM, os.X_OK):
        out.append(f"{CHROMIUM} is missing (make test-tools)")
    try:
        has = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", IMAGE,
             "-c", "import jupyter_scheduler, gpuspawner.singleuser.scheduler"],
            capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        has = False
    if not has:
        out.append(f"{IMAGE} has no jupyter_scheduler or gpuspawner.singleuser.scheduler "
                   "(make images)")
    return out


pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.docker]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    reasons = _skip_reasons()
    if reasons:
        pytest.skip("; ".join(reasons))
    engine = _engine()
    h = Hub(tmp_path_factory.mktemp("labjobs"), [{"name": "local", "topology": "auto"}],
            PROFILES, extra_config=EXTRA)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    try:
        yield h
    finally:
        h.api("DELETE", f"/users/{USER}/server")
        h.stop()
        for c in containers_of(engine, USER):
            engine.remove_container(c["Id"], force=True)


def allocations(hub: Hub) -> list[dict[str, Any]]:
    r = requests.get(f"{hub.url}{SVC}api/allocations",
                     headers={"Authorization": f"token {hub.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [a for a in r.json() if a["owner"]["user"] == USER]


def test_a_job_made_in_jupyterlab_runs_in_its_own_container(hub):
    engine = _engine()
    hub.ensure_user(USER)
    r = hub.api("POST", f"/users/{USER}/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER, timeout=180)
    home = hub.state_dir / "home" / safe_name(USER)
    owner = home.stat()
    nb_path = home / "double.ipynb"
    nb_path.write_text(json.dumps(NOTEBOOK))
    os.chown(nb_path, owner.st_uid, owner.st_gid)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        try:
            hub_login(page, hub.url, USER)
            page.goto(f"{hub.url}/user/{USER}/lab/tree/double.ipynb")
            # jupyter-scheduler's button in the notebook's toolbar
            button = page.locator("[data-command='scheduling:create-from-notebook']").first
            button.wait_for(timeout=120_000)
            # the environments are the profiles this user may use (the service's api/profiles)
            envs = page.evaluate(FETCH_JSON, f"/user/{USER}/scheduler/runtime_environments")
            assert envs["status"] == 200, envs
            assert [e["name"] for e in envs["body"]] == ["cpu", "cpu-tiny"]
            button.click()
            name = page.get_by_label("Job name")
            name.wait_for()
            name.fill("double")
            assert page.get_by_label("Input file").input_value() == "double.ipynb"
            # a parameter for the cell tagged "parameters"
            page.get_by_role("button", name=re.compile("Add new parameter", re.I)).click()
            page.locator("input[name='parameter-0-name']").fill("x")
            page.locator("input[name='parameter-0-value']").fill("21")
            page.locator("input[name='parameter-0-value']").press("Tab")  # validated on blur
            # the time limit: the profile's time limits are the form's compute types
            page.get_by_label("Compute type").click()
            page.get_by_role("option", name="time limit 15 min", exact=True).click()
            _shot(page, "lab-create-job.png")
            page.get_by_role("button", name="Create", exact=True).click()
            # the Notebook Jobs panel: the job, then Completed (the lab extension reloads it)
            row = page.locator("tr", has_text="double").first
            row.wait_for(timeout=60_000)

            def completed() -> bool:  # no Reload pressed: the list follows by itself
                return "Completed" in (row.text_content() or "")

            try:
                wait_until(completed, 240, 2.0, lambda: row.text_content() or "")
            finally:
                _shot(page, "lab-notebook-jobs.png")
            # links to the files the job wrote in the home
            for output in ("double.ipynb", "double.html"):
                assert row.get_by_title(f'Open output file "{output}"').count() == 1
            listed = page.evaluate(FETCH_JSON, f"/user/{USER}/scheduler/jobs")
            assert listed["status"] == 200, listed
            (job,) = [j for j in listed["body"]["jobs"] if j["name"] == "double"]
            files = {f["file_format"]: f.get("file_path") for f in job["job_files"]}
            assert job["status"] == "COMPLETED" and job["downloaded"], job
            assert errors == [], errors
        finally:
            browser.close()

    # the job was the hub's: its own container on the node, the profile's bundle
    token = hub.api("POST", f"/users/{USER}/tokens", {"note": "lab jobs test"}).json()["token"]
    jobs = requests.get(f"{hub.url}{SVC}api/jobs", timeout=30,
                        headers={"Authorization": f"token {token}"}).json()["jobs"]
    (record,) = jobs
    assert record["state"] == "completed" and record["exit_code"] == 0, record
    assert record["profile"] == "cpu" and record["node"] == "local"
    assert record["parameters"] == {"x": 21}
    assert record["time_limit"] == 900  # "time limit 15 min" on the form
    assert [h["state"] for h in record["history"]][-2:] == ["running", "completed"]
    # its outputs, written by the job as the user, are where the panel's links point
    folder = home / record["output_dir"][2:]
    assert files["ipynb"] == f"{record['output_dir'][2:]}/double.ipynb"
    executed = json.loads((folder / "double.ipynb").read_text())
    texts = ["".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])]
    assert "twice x is 42 in 1\n" in texts, texts  # the parameter, one core (CPU_LIMIT)
    assert (folder / "double.ipynb").stat().st_uid == owner.st_uid
    # nothing ran in the user's server, and the job's container and bundle are gone: only the
    # server's allocation and container are left
    (server,) = containers_of(engine, USER)
    assert server["Labels"].get("gpuspawner.server") == ""
    # a terminal of the server sees the same job with `gpuspawner jobs` (its environment:
    # GPUSPAWNER_SERVICE_URL and the server's token, from hub_config)
    ex = engine.exec_create(server["Id"], ["gpuspawner", "jobs", "list", "--json"])
    out = engine.exec_start(ex["Id"]).decode()
    assert engine.exec_inspect(ex["Id"])["ExitCode"] == 0, out
    assert [j["id"] for j in json.loads(out)] == [record["id"]]
    wait_until(lambda: len(allocations(hub)) == 1, 30, 0.3, lambda: str(allocations(hub)))
    assert allocations(hub)[0]["owner"]["server"] == ""

    # "Run on a schedule": what the Lab's scheduler sends, accepted by the real service
    client = JobsClient(f"{hub.url}{SVC}", token, timeout=30)
    scheduler = HubScheduler(root_dir=str(home), environments_manager=HubEnvironmentManager(
        client), client=client, home=str(home))
    def_id = asyncio.run(scheduler.create_job_definition(CreateJobDefinition(
        input_uri="double.ipynb", runtime_environment_name="cpu", name="nightly double",
        schedule="0 3 * * *", timezone="Europe/Rome", parameters={"x": "2"},
        output_formats=["ipynb", "html"])))
    d = asyncio.run(scheduler.get_job_definition(def_id))
    assert (d.name, d.schedule, d.timezone, d.active, d.parameters) == (
        "nightly-double", "0 3 * * *", "Europe/Rome", True, {"x": "2"})
    asyncio.run(scheduler.update_job_definition(def_id, UpdateJobDefinition(active=False)))
    assert not asyncio.run(scheduler.get_job_definition(def_id)).active
    asyncio.run(scheduler.delete_job_definition(def_id))
    assert asyncio.run(scheduler.list_job_definitions(ListJobDefinitionsQuery())
                       ).job_definitions == []


#: a request of the Lab's own scheduler API from the page (its XSRF token): what the panel's
#: buttons send
CALL_JSON = """async ([method, path, body]) => {
    const meta = document.querySelector('meta[name=xsrf-token]');
    const cookie = /(?:^|; )_xsrf=([^;]*)/.exec(document.cookie);
    const xsrf = meta ? meta.content : (cookie ? decodeURIComponent(cookie[1]) : '');
    const r = await fetch(path, {method, headers: {'X-XSRFToken': xsrf,
        'Content-Type': 'application/json'}, body: body === null ? undefined :
        JSON.stringify(body)});
    const text = await r.text();
    let parsed = null;
    try { parsed = JSON.parse(text); } catch (e) { parsed = text.slice(0, 500); }
    return {status: r.status, body: parsed};
}"""
#: a notebook whose parameter cell the definition's parameters replace
EDIT_NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "cells": [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]},
         "source": "x = 1", "outputs": [], "execution_count": None},
        {"cell_type": "code", "id": "work", "metadata": {},
         "source": "print('x is', x)", "outputs": [], "execution_count": None},
    ],
}


def test_a_definition_edited_in_jupyterlab_runs_with_its_new_parameters(hub):
    """A job definition's parameters are changed in the Lab (jupyter-scheduler's
    update_job_definition API of the user's server, what an edit sends: the hub's PATCH
    api/job_definitions/{id}), the definition's page in the Notebook Jobs panel shows them,
    its *Run Job* makes a job now with the form's parameter (create_job_from_definition:
    POST api/job_definitions/{id}/jobs), and the job list shows it Completed without
    *Reload* being pressed (the lab extension reloads a list with active jobs). Another
    user's real token can neither change nor run the definition."""
    hub.ensure_user(USER)
    if hub.api("GET", f"/users/{USER}").json().get("servers", {}).get("", {}).get(
            "ready") is not True:
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202, 400), r.text
        hub.wait_ready(USER, timeout=180)
    home = hub.state_dir / "home" / safe_name(USER)
    owner = home.stat()
    nb_path = home / "edited.ipynb"
    nb_path.write_text(json.dumps(EDIT_NOTEBOOK))
    os.chown(nb_path, owner.st_uid, owner.st_gid)
    lab = f"/user/{USER}/scheduler"
    token = hub.api("POST", f"/users/{USER}/tokens", {"note": "lab edit"}).json()["token"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        try:
            hub_login(page, hub.url, USER)
            page.goto(f"{hub.url}/user/{USER}/lab/tree/edited.ipynb")
            page.locator("[data-command='scheduling:create-from-notebook']").first.wait_for(
                timeout=120_000)
            made = page.evaluate(CALL_JSON, ["POST", f"{lab}/job_definitions", {
                "input_uri": "edited.ipynb", "runtime_environment_name": "cpu",
                "name": "edited", "schedule": "0 3 * * *", "timezone": "UTC",
                "parameters": {"x": "2"}, "output_formats": ["ipynb"]}])
            assert made["status"] == 200, made
            def_id = made["body"]["job_definition_id"]
            # the edit: new parameters (and name kept), through the Lab's API
            edit = page.evaluate(CALL_JSON, ["PATCH", f"{lab}/job_definitions/{def_id}", {
                "parameters": {"x": "5"}, "compute_type": "time limit 15 min"}])
            assert edit["status"] == 204, edit
            shown = page.evaluate(FETCH_JSON, f"{lab}/job_definitions/{def_id}")
            assert shown["body"]["parameters"] == {"x": "5"}, shown
            assert shown["body"]["compute_type"] == "time limit 15 min", shown
            # user B's real token against the hub's API: neither change nor run A's
            thief_name = "lab-jobs-bob"
            hub.ensure_user(thief_name)
            thief = hub.api("POST", f"/users/{thief_name}/tokens",
                            {"note": "attack"}).json()["token"]
            hub_def = def_id.replace("-", "")
            for method, sub, body in [("PATCH", "", {"parameters": {"x": 666}}),
                                      ("POST", "/jobs", {"parameters": {"x": 666}})]:
                r = requests.request(method, f"{hub.url}{SVC}api/job_definitions/{hub_def}{sub}",
                                     headers={"Authorization": f"token {thief}"},
                                     data=json.dumps(body), timeout=30)
                assert r.status_code == 404, (method, sub, r.text)
            # the definition's page in the panel, then its "Run Job"
            page.locator("[data-command='launcher:create']").first.click()
            page.locator(".jp-LauncherCard", has_text="Jobs").first.click()
            page.get_by_role("tab", name=re.compile("Definitions")).click()
            page.get_by_text("edited", exact=True).first.click()
            page.get_by_role("button", name="Run Job", exact=True).click()
            value = page.locator("input[name='parameter-0-value']")
            value.wait_for()
            assert value.input_value() == "5"  # the edited parameter, prefilled
            value.fill("7")
            value.press("Tab")
            _shot(page, "lab-run-job-from-definition.png")
            page.get_by_role("button", name="Create", exact=True).click()
            # the job list: no Reload pressed; the lab extension reloads it while it runs
            row = page.locator("tr", has_text="edited").first
            row.wait_for(timeout=60_000)
            wait_until(lambda: "Completed" in (row.text_content() or ""), 240, 1.0,
                       lambda: row.text_content() or "")
            assert errors == [], errors
        finally:
            browser.close()
    jobs = requests.get(f"{hub.url}{SVC}api/jobs?definition_id={hub_def}", timeout=30,
                        headers={"Authorization": f"token {token}"}).json()["jobs"]
    (job,) = jobs
    assert (job["state"], job["parameters"], job["time_limit"], job["output_formats"]) == (
        "completed", {"x": 7}, 900, ["ipynb"]), job
    folder = home / job["output_dir"][2:]
    executed = json.loads((folder / "edited.ipynb").read_text())
    texts = ["".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])]
    assert "x is 7\n" in texts, texts
    assert not (folder / "edited.html").exists()  # only the notebook was asked for
    d = requests.get(f"{hub.url}{SVC}api/job_definitions/{hub_def}", timeout=30,
                     headers={"Authorization": f"token {token}"}).json()
    assert (d["parameters"], d["runs"], d["time_limit"]) == ({"x": 5}, 1, 900), d
    requests.delete(f"{hub.url}{SVC}api/job_definitions/{hub_def}", timeout=30,
                    headers={"Authorization": f"token {token}"})


def _shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out = SCREENSHOTS / name
    page.screenshot(path=str(out))
    return out
