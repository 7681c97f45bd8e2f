"""The job runner in a real hub on the real Docker engine (marked ``docker``): a job's log
(live while it runs, kept when it ends) and the HTML export of its executed notebook through
the API and the CLI; limits on concurrent jobs per user and per group (429, nothing stored);
a job whose container is killed from outside (``docker kill``) is lost, then runs again and
completes, keeping both attempts' folders and releasing the ledger; the jobs' Prometheus
metrics change as a GPU job runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
import requests

docker = pytest.importorskip("docker")
nbformat = pytest.importorskip("nbformat")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuspawner.jobs.model import OUTPUT_BEGIN  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, one_gpu_topology  # noqa: E402
from tests.test_jobs_hub import EXTRA, SVC, User, home_of  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
GPU_UUID = "GPU-7e57e57e-1111-2222-3333-444455556666"
RUNNER_EXTRA = EXTRA + """
c.GPUJobs.retry_backoff = 0.5
c.GPUJobs.max_active_jobs_per_user = 2
c.GPUJobs.max_active_jobs_per_group = {"jr-big": 3}
"""
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M", "nodes": ["local"],
     "default": True},
    {"slug": "a100", "display_name": "A100", "cpu": 1, "memory": "512M", "gpus": 1,
     "gpu_models": ["A100"], "nodes": ["gpu"]},
]
#: the id of this module's hub (its objects' gpuspawner.hub label)
HUB_ID: list[str] = []


def job_containers(engine, user: str) -> list[dict]:
    return [c for c in engine.containers(all=True, filters={"label": [
        f"gpuspawner.user={user}", f"gpuspawner.hub={HUB_ID[0]}"]})
        if c["Labels"].get("gpuspawner.server", "").startswith("job/")]


def allocations(hub: Hub, user: str) -> list[dict]:
    r = requests.get(f"{hub.url}{SVC}api/allocations",
                     headers={"Authorization": f"token {hub.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [a for a in r.json() if a["owner"]["user"] == user]


def released(hub: Hub, engine, user: str) -> bool:
    return not allocations(hub, user) and not job_containers(engine, user)


def ended(u: User, job_id: str, timeout: float = 120) -> dict:
    return u.wait_state(job_id, ("completed", "failed", "lost", "cancelled", "timed_out"),
                        timeout)


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobsrunner")
    nodes = [{"name": "local", "topology": "auto"},
             {"name": "gpu", "topology": one_gpu_topology(tmp, "gpu", GPU_UUID)}]
    h = Hub(tmp, nodes, PROFILES, extra_config=RUNNER_EXTRA)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    HUB_ID[:] = [(tmp / "hub" / "gpuspawner-hub-id").read_text().strip()]
    yield h
    h.stop()
    for c in engine.containers(all=True, filters={"label": f"gpuspawner.hub={HUB_ID[0]}"}):
        if c["Labels"].get("gpuspawner.user", "").startswith("jr-"):
            engine.remove_container(c["Id"], force=True)
    for n in engine.networks(filters={"label": f"gpuspawner.hub={HUB_ID[0]}"}):
        try:
            engine.remove_network(n["Id"])
        except docker.errors.APIError:
            pass


def test_the_log_and_the_html_export_through_the_api_and_the_cli(hub, engine, tmp_path):
    u = User(hub, "jr-logs")
    job = u.submit(notebook("print('begun', flush=True)\nimport time\ntime.sleep(5)",
                            "print('x is', x)"), parameters={"x": 3}, name="logged")
    u.wait_state(job["id"], ("running",), 90)
    # while it runs, the log is read from its container
    live = wait_until(lambda: (lambda r: r.text if r.status_code == 200 and "begun" in
                               r.text else None)(u.call("GET", f"api/jobs/{job['id']}/log")),
                      60, 0.5, lambda: u.call("GET", f"api/jobs/{job['id']}/log").text)
    assert "executing" in live
    done = ended(u, job["id"])
    assert done["state"] == "completed" and done["has_html"], done
    r = u.call("GET", f"api/jobs/{job['id']}/log")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert "x is 3" in r.text and "begun" in r.text and OUTPUT_BEGIN not in r.text
    assert "done, exit status 0" in r.text
    r = u.call("GET", f"api/jobs/{job['id']}/output?format=html")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/html")
    assert r.headers["Content-Security-Policy"].split(";")[0] == "sandbox"
    assert r.headers["Content-Disposition"] == 'attachment; filename="logged.html"'
    assert r.text.lstrip().lower().startswith("<!doctype html") and "x is 3" in r.text
    folder = home_of(hub, "jr-logs") / done["output_dir"][2:]
    assert (folder / "logged.html").read_text() == r.text
    assert (folder / "logged.html").stat().st_uid == 1000
    r = u.call("GET", f"api/jobs/{job['id']}/output?format=pdf")
    assert r.status_code == 400 and r.json()["message"].startswith("format: ")
    # the CLI
    env = {**os.environ, "JUPYTERHUB_API_URL": f"{hub.url}/hub/api",
           "JUPYTERHUB_API_TOKEN": u.token}
    env.pop("GPUSPAWNER_SERVICE_URL", None)
    p = subprocess.run([sys.executable, "-m", "gpuspawner.cli", "jobs", "logs", job["id"]],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "x is 3" in p.stdout, p.stderr
    # another user sees neither; a job that has not started has no log yet
    other = User(hub, "jr-other")
    for path in ("log", "output?format=html"):
        assert other.call("GET", f"api/jobs/{job['id']}/{path}").status_code == 404
    later = datetime.fromtimestamp(int(time.time()) + 3600, timezone.utc).isoformat()
    waiting = u.submit(notebook("1"), name="later", at=later)
    r = u.call("GET", f"api/jobs/{waiting['id']}/log")
    assert r.status_code == 404 and "has no log yet" in r.json()["message"]
    p = subprocess.run([sys.executable, "-m", "gpuspawner.cli", "jobs", "logs",
                        waiting["id"]], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "HTTP 404" in p.stderr
    assert u.call("DELETE", f"api/jobs/{waiting['id']}").status_code == 200
    wait_until(lambda: released(hub, engine, "jr-logs"), 30, 0.3, "released")


def test_limits_on_concurrent_jobs_per_user_and_per_group(hub, engine):
    u = User(hub, "jr-many")
    slow = notebook("import time\ntime.sleep(120)")
    ids = [u.submit(slow, name=f"s{i}")["id"] for i in range(2)]
    r = u.call("POST", "api/jobs", {"notebook": slow, "name": "third"})
    assert r.status_code == 429, r.text
    assert "jr-many has 2 active jobs" in r.json()["message"] and \
        "GPUJobs.max_active_jobs_per_user = 2" in r.json()["message"]
    assert len(u.call("GET", "api/jobs").json()["jobs"]) == 2  # nothing stored
    # a member of jr-big may have 3
    hub.ensure_user("jr-many", groups=("jr-big",))
    ids.append(u.submit(slow, name="third")["id"])
    r = u.call("POST", "api/jobs", {"notebook": slow, "name": "fourth"})
    assert r.status_code == 429 and \
        'GPUJobs.max_active_jobs_per_group["jr-big"] = 3' in r.json()["message"], r.text
    r = u.call("POST", "api/jobs", {"notebook": slow, "name": "x", "max_retries": 99})
    assert r.status_code == 400 and r.json()["message"].startswith(
        "max_retries: must be 0 to 10"), r.text
    assert len(u.call("GET", "api/jobs").json()["jobs"]) == 3
    for job_id in ids:
        assert u.call("DELETE", f"api/jobs/{job_id}").status_code == 200
    # ended jobs do not count
    assert u.call("POST", "api/jobs", {"notebook": notebook("1"), "name": "after"}
                  ).status_code == 201
    wait_until(lambda: all(j["state"] not in ("queued", "waiting", "starting", "running")
                           for j in u.call("GET", "api/jobs").json()["jobs"]), 90, 0.5,
               "jobs ended")
    wait_until(lambda: released(hub, engine, "jr-many"), 30, 0.3, "released")


def test_a_job_killed_from_outside_is_lost_then_runs_again_and_completes(hub, engine):
    u = User(hub, "jr-kill")
    job = u.submit(notebook("import time\ntime.sleep(8)\nprint('survived')"),
                   name="phoenix", max_retries=1)
    assert job["max_retries"] == 1 and job["attempt"] == 1
    u.wait_state(job["id"], ("running",), 90)
    # killed once its program runs (it has written its snapshot and logged that it executes)
    wait_until(lambda: "executing" in u.call("GET", f"api/jobs/{job['id']}/log").text, 60,
               0.3, "the job's program started")
    (first,) = job_containers(engine, "jr-kill")
    engine.kill(first["Id"])  # SIGKILL from outside the hub, as a failing node would
    again = wait_until(lambda: (lambda j: j if j["attempt"] == 2 else None)(
        u.job(job["id"])), 60, 0.3, lambda: f"{u.job(job['id'])}\n{hub.tail(30)}")
    (lost,) = again["attempts"]
    assert lost["state"] == "lost" and "exit status 137: SIGKILL" in lost["message"], lost
    done = ended(u, job["id"])
    assert done["state"] == "completed" and done["attempt"] == 2, done
    states = [h["state"] for h in done["history"]]
    assert states.count("running") == 2 and states.index("lost") < states.index(
        "completed") and states[states.index("lost") + 1] == "queued"
    # every attempt keeps its folder: the first has its snapshot, the second the result
    home = home_of(hub, "jr-kill")
    one, two = home / lost["output_dir"][2:], home / done["output_dir"][2:]
    assert one != two and (one / "phoenix.input.ipynb").is_file()
    nb = json.loads((two / "phoenix.ipynb").read_text())
    assert "survived\n" in ["".join(o.get("text", "")) for c in nb["cells"]
                            for o in c.get("outputs", [])]
    log = u.call("GET", f"api/jobs/{job['id']}/log").text
    assert log.startswith("===== attempt 1 on local, lost") and "survived" in log
    wait_until(lambda: released(hub, engine, "jr-kill"), 30, 0.3, "released")
    # without retries, a killed job stays lost, and is released
    job = u.submit(notebook("import time\ntime.sleep(60)"), name="once", max_retries=0)
    u.wait_state(job["id"], ("running",), 90)
    (c,) = job_containers(engine, "jr-kill")
    engine.kill(c["Id"])
    done = ended(u, job["id"], 60)
    assert done["state"] == "lost" and done["attempt"] == 1, done
    wait_until(lambda: released(hub, engine, "jr-kill"), 30, 0.3, "released")


def test_a_job_that_signals_its_own_pid_1_fails_and_is_not_retried(hub, engine):
    """Issue 46 item 7, replayed: a job that sent SIGTERM to its own PID 1 (``kill -TERM 1``
    from a cell) ended with 143 and no result, was classed ``lost`` and retried: it earned
    its own retries. Now the container's PID 1 tells a SIGTERM from inside the job from one
    through the engine: the job is ``failed`` at its first attempt, while a ``docker stop``
    from outside still loses it."""
    u = User(hub, "jr-selfkill")
    job = u.submit(notebook("import os, signal, time\nos.kill(1, signal.SIGTERM)\n"
                            "time.sleep(30)"), name="selfkill", max_retries=2)
    done = ended(u, job["id"], 120)
    assert done["state"] == "failed" and done["attempt"] == 1, done
    assert "signal sent from inside the job" in done["message"], done["message"]
    assert "lost" not in [h["state"] for h in done["history"]]
    wait_until(lambda: released(hub, engine, "jr-selfkill"), 30, 0.3, "released")
    # stopped through the engine (SIGTERM from outside, as an engine's shutdown): lost
    job = u.submit(notebook("import time\ntime.sleep(120)"), name="stopped", max_retries=0)
    u.wait_state(job["id"], ("running",), 90)
    wait_until(lambda: "executing" in u.call("GET", f"api/jobs/{job['id']}/log").text, 60,
               0.3, "the job's program started")
    (c,) = job_containers(engine, "jr-selfkill")
    engine.stop(c["Id"], timeout=20)
    done = ended(u, job["id"], 60)
    assert done["state"] == "lost" and "exit status 143: SIGTERM" in done["message"], done
    wait_until(lambda: released(hub, engine, "jr-selfkill"), 30, 0.3, "released")


def scrape(hub: Hub) -> dict[tuple[str, tuple], float]:
    r = requests.get(f"{hub.url}{SVC}metrics", timeout=30,
                     headers={"Authorization": f"token {hub.token}"})
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_the_jobs_metrics_change_as_a_gpu_job_runs(hub, engine):
    u = User(hub, "jr-gpu")
    before = scrape(hub)
    done_key = ("gpuspawner_jobs", (("state", "completed"),))
    wait_key = ("gpuspawner_job_wait_seconds_count", (("profile", "a100"),))
    gpu_key = ("gpuspawner_job_gpu_seconds_total", (("profile", "a100"),))
    job = u.submit(notebook("import time\ntime.sleep(5)"), profile="a100", name="gpu")
    running = u.wait_state(job["id"], ("running",), 90)
    assert running["gpu_uuids"] == [GPU_UUID]
    mid = scrape(hub)
    assert mid[("gpuspawner_jobs", (("state", "running"),))] >= 1
    assert mid[wait_key] == before.get(wait_key, 0) + 1
    done = ended(u, job["id"])
    assert done["state"] == "completed", done
    after = scrape(hub)
    assert after[done_key] == before.get(done_key, 0) + 1
    assert after[gpu_key] >= 5.0  # one GPU for at least the 5 s it slept
    wait_until(lambda: released(hub, engine, "jr-gpu"), 30, 0.3, "released")
