"""Notebook jobs in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the real
Docker engine; marked ``docker``): a job is a second kind of request through the hub's one
cluster. A one-off job completes, its executed notebook is in the user's home, owned by the
user, and comes back through the API; a time limit and a cancel stop it; each leaves the
ledger empty and no container behind; jobs are no JupyterHub servers (the idle culler, which
lists the hub's servers, never sees one); bad input is HTTP 400 and stores nothing; a hub
restart adopts a running job, which then finishes once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")
nbformat = pytest.importorskip("nbformat")

from gpuspawner.hub.identity import safe_name  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, topology  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SVC = "/services/gpuspawner/"
#: what the hubrunner's admin service token needs besides admin:users: users' tokens
EXTRA = """
for _r in c.JupyterHub.load_roles:
    if _r.get("name") == "gpuspawner-admin":
        _r["scopes"] = list(_r["scopes"]) + ["tokens", "access:services"]
c.GPUJobs.poll_interval = 0.5
c.GPUJobs.profile_time_limits = {"cpu": {"default": 120, "max": 600}}
c.DockerBackend.stop_timeout = 5
c.GPUSpawner.quotas = {"users": {"jb-quota": {"servers": 1}}}
import logging as _logging  # the runner's lines in hub.log, to read a failure by
_logging.getLogger("gpuspawner").addHandler(_logging.StreamHandler())
_logging.getLogger("gpuspawner").setLevel(_logging.INFO)
"""
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M", "nodes": ["local"],
     "default": True},
    {"slug": "huge", "cpu": 1, "memory": "64T", "nodes": ["local"]},
    {"slug": "staff", "cpu": 1, "memory": "256M", "nodes": ["local"], "groups": ["staff"]},
    {"slug": "tiny", "cpu": 0, "memory": "256M", "nodes": ["tiny"]},
]
MiB = 2**20



#: the id of this module's hub (its objects' gpuspawner.hub label): another run of these
#: tests on the same engine has its own, and neither touches the other's containers
HUB_ID: list[str] = []


def job_containers(engine, user: str) -> list[dict]:
    return [c for c in engine.containers(all=True, filters={"label": [
        f"gpuspawner.user={user}", f"gpuspawner.hub={HUB_ID[0]}"]})
        if c["Labels"].get("gpuspawner.server", "").startswith("job/")]


def remove_jobs(engine) -> None:
    for c in engine.containers(all=True, filters={"label": f"gpuspawner.hub={HUB_ID[0]}"}):
        if c["Labels"].get("gpuspawner.user", "").startswith("jb-"):
            engine.remove_container(c["Id"], force=True)
    for n in engine.networks(filters={"label": f"gpuspawner.hub={HUB_ID[0]}"}):
        try:
            engine.remove_network(n["Id"])
        except docker.errors.APIError:
            pass


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobshub")
    nodes = [{"name": "local", "topology": "auto"},
             {"name": "tiny", "topology": topology(tmp, "tiny", 300 * MiB)}]  # one job
    h = Hub(tmp, nodes, PROFILES, extra_config=EXTRA)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    HUB_ID[:] = [(tmp / "hub" / "gpuspawner-hub-id").read_text().strip()]
    yield h
    h.stop()
    remove_jobs(engine)


class User:
    """A hub user with an API token of their own, talking to the service's api/jobs."""

    def __init__(self, hub: Hub, name: str) -> None:
        hub.ensure_user(name)
        r = hub.api("POST", f"/users/{name}/tokens", {"note": "jobs test"})
        assert r.status_code == 201, r.text
        self.hub, self.name, self.token = hub, name, r.json()["token"]

    def call(self, method: str, path: str, body=None) -> requests.Response:
        return requests.request(method, f"{self.hub.url}{SVC}{path}",
                                headers={"Authorization": f"token {self.token}"},
                                data=None if body is None else json.dumps(body), timeout=60)

    def submit(self, nb: dict, **fields) -> dict:
        r = self.call("POST", "api/jobs", {"notebook": nb, **fields})
        assert r.status_code == 201, r.text
        return r.json()

    def job(self, job_id: str) -> dict:
        r = self.call("GET", f"api/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
        return wait_until(lambda: (lambda j: j if j["state"] in states else None)(
            self.job(job_id)), timeout, 0.3,
            lambda: f"job {job_id} in {states}: {self.job(job_id)}\n{self.hub.tail(30)}")


def admin_allocations(hub: Hub, user: str) -> list[dict]:
    r = requests.get(f"{hub.url}{SVC}api/allocations",
                     headers={"Authorization": f"token {hub.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [a for a in r.json() if a["owner"]["user"] == user]


def released(hub: Hub, engine, user: str) -> bool:
    return not admin_allocations(hub, user) and not job_containers(engine, user)


def home_of(hub: Hub, user: str) -> Path:
    return hub.state_dir / "home" / safe_name(user)


def held_notebook(after: str = "") -> dict:
    """A job's notebook that runs until the test creates ``$HOME/let-go`` (at most 300 s), then
    runs ``after``: a job held running exactly as long as the test needs, not a fixed sleep."""
    return notebook("import os, time\n"
                    "flag = os.path.join(os.environ['HOME'], 'let-go')\n"
                    "deadline = time.monotonic() + 300\n"
                    "while not os.path.exists(flag) and time.monotonic() < deadline:\n"
                    "    time.sleep(0.2)\n" + after)


def let_go(hub: Hub, user: str) -> None:
    """Ends the user's :func:`held_notebook` jobs (the flag in their home on this host)."""
    flag = home_of(hub, user) / "let-go"
    flag.touch()
    os.chown(flag, 1000, 1000)


def test_a_job_completes_into_the_users_home_and_releases(hub, engine):
    u = User(hub, "jb-alice")
    nb = notebook("import os\nprint('x is', x)\nprint(os.getuid())\n"
                  "print(os.environ['CPU_LIMIT'])", "y = x * 2\ny")
    job = u.submit(nb, profile="cpu", parameters={"x": 21}, name="double")
    assert job["state"] in ("queued", "waiting", "starting", "running")
    assert job["time_limit"] == 120  # the profile's default
    # while it runs it is no JupyterHub server: the idle culler lists the hub's servers only
    running = u.wait_state(job["id"], ("running", "completed"))
    if running["state"] == "running":
        model = hub.api("GET", "/users/jb-alice").json()
        assert model["servers"] == {}
        assert [c["Labels"]["gpuspawner.server"] for c in job_containers(engine, "jb-alice")] \
            == [f"job/{job['id']}"]
    done = u.wait_state(job["id"], ("completed", "failed", "lost"))
    assert done["state"] == "completed", done
    assert done["exit_code"] == 0 and done["node"] == "local"
    states = [h["state"] for h in done["history"]]
    assert states[0] == "queued" and states[-2:] == ["running", "completed"]
    # the executed notebook through the API: the parameter was injected and used
    r = u.call("GET", f"api/jobs/{job['id']}/output")
    assert r.status_code == 200, r.text
    out = r.json()
    texts = ["".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", [])]
    assert "x is 21\n1000\n1\n" in texts
    assert any("42" in "".join(o.get("data", {}).get("text/plain", ""))
               for c in out["cells"] for o in c.get("outputs", []))
    # ... and in the user's home, written by the job as the user
    assert done["output_dir"].startswith("~/jobs/double/") and \
        done["output_dir"].endswith(f"-{job['id']}")
    folder = home_of(hub, "jb-alice") / done["output_dir"][2:]
    files = {p.name: p for p in folder.iterdir()}
    assert set(files) == {"double.ipynb", "double.input.ipynb", "double.html", "job.log"}
    for p in [folder, *files.values()]:
        assert p.stat().st_uid == 1000, p
    home_nb = json.loads(files["double.ipynb"].read_text())
    assert [c["source"] for c in home_nb["cells"]] == [c["source"] for c in out["cells"]]
    assert "x is 21" in files["job.log"].read_text()
    # the ledger is empty again, no container or network is left
    wait_until(lambda: released(hub, engine, "jb-alice"), 30, 0.3, "released")
    assert not engine.networks(filters={"label": ["gpuspawner.user=jb-alice",
                                                  f"gpuspawner.hub={HUB_ID[0]}"]})
    # the user sees it in the list; the CLI-style listing is newest first
    r = u.call("GET", "api/jobs")
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]


def test_the_gpu_monitor_widget_runs_inside_a_jobs_notebook(hub, engine):
    """%load_ext gpuspawner.kernel in a job: the monitor widget is displayed (an ipywidgets
    view in the executed notebook) and reads the job's own session (a CPU profile: no GPU row,
    the header says why), and the job's allocation is in its environment."""
    u = User(hub, "jb-widget")
    nb = notebook("%load_ext gpuspawner.kernel",
                  "import json, os\nfrom gpuspawner.singleuser.kernel import widget_state\n"
                  "print(json.dumps({'w': widget_state(), "
                  "'a': json.loads(os.environ['GPUSPAWNER_ALLOCATION'])}))")
    job = u.submit(nb, profile="cpu", name="widget")
    done = u.wait_state(job["id"], ("completed", "failed", "lost"))
    assert done["state"] == "completed", done
    out = u.call("GET", f"api/jobs/{job['id']}/output").json()
    outputs = [o for c in out["cells"] for o in c.get("outputs", [])]
    views = [o["data"]["application/vnd.jupyter.widget-view+json"] for o in outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    (printed,) = [json.loads("".join(o["text"])) for o in outputs if o.get("name") == "stdout"]
    assert views and views[0]["model_id"] == printed["w"]["model_id"], (views, printed)
    assert printed["w"]["gpus"] == [] and printed["w"]["header"], printed
    assert printed["a"]["owner"]["user"] == "jb-widget" and \
        printed["a"]["owner"]["server"] == f"job/{job['id']}", printed
    wait_until(lambda: released(hub, engine, "jb-widget"), 30, 0.3, "released")


def test_a_failing_cell_fails_the_job_naming_the_cell(hub, engine):
    u = User(hub, "jb-fail")
    job = u.submit(notebook("1 / 0"), name="boom")
    done = u.wait_state(job["id"], ("completed", "failed", "lost"))
    assert done["state"] == "failed" and done["exit_code"] == 1, done
    assert "ZeroDivisionError" in done["message"] and done["error"]["ename"] == \
        "ZeroDivisionError"
    assert u.call("GET", f"api/jobs/{job['id']}/output").status_code == 200
    wait_until(lambda: released(hub, engine, "jb-fail"), 30, 0.3, "released")


def test_a_time_limit_stops_and_releases(hub, engine):
    u = User(hub, "jb-slow")
    job = u.submit(notebook("import time\ntime.sleep(600)"), time_limit=3, name="slow")
    u.wait_state(job["id"], ("running",), 90)
    assert admin_allocations(hub, "jb-slow")
    done = u.wait_state(job["id"], ("timed_out", "completed", "failed", "lost"), 60)
    assert done["state"] == "timed_out", done
    assert "time limit of 3 s" in done["message"]
    wait_until(lambda: released(hub, engine, "jb-slow"), 30, 0.3, "released")
    r = u.call("GET", f"api/jobs/{job['id']}/output")
    assert r.status_code == 404 and "~/jobs/slow/" in r.json()["message"]


def test_a_cancel_stops_and_releases(hub, engine):
    u = User(hub, "jb-cancel")
    job = u.submit(notebook("import time\ntime.sleep(600)"), name="long")
    u.wait_state(job["id"], ("running",), 90)
    r = u.call("DELETE", f"api/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and "cancelled by jb-cancel" in r.json()["message"]
    assert released(hub, engine, "jb-cancel")
    r = u.call("DELETE", f"api/jobs/{job['id']}")
    assert r.status_code == 409 and "has ended" in r.json()["message"]


def test_users_see_only_their_own_jobs(hub):
    owner, other = User(hub, "jb-owner"), User(hub, "jb-other")
    job = owner.submit(notebook("1"), name="mine")
    for method, path in [("GET", ""), ("DELETE", ""), ("GET", "/output")]:
        r = other.call(method, f"api/jobs/{job['id']}{path}")
        assert r.status_code == 404, (method, path, r.text)
    assert other.call("GET", "api/jobs").json()["jobs"] == []
    assert other.call("GET", "api/jobs?user=jb-owner").status_code == 403
    # an admin (the hub's admin user) sees everyone's
    admin = User(hub, "admin")
    assert job["id"] in [j["id"] for j in admin.call("GET", "api/jobs").json()["jobs"]]
    owner.wait_state(job["id"], ("completed", "failed", "lost"))


BAD = [
    ({"profile": "cpu"}, "notebook: missing"),
    ({"notebook": "x"}, "notebook: must be the notebook's content"),
    ({"notebook": {"cells": 3, "nbformat": 4, "nbformat_minor": 5, "metadata": {}}},
     "notebook: not a valid notebook"),
    ({"notebook": notebook("s = '" + "x" * (3 * 2**20) + "'")},
     "notebook: "),
    ({"parameters": {"x": {"a": 1}}}, "parameters.x: must be a JSON scalar"),
    ({"parameters": {"not valid": 1}}, "parameters.not valid: not a Python identifier"),
    ({"parameters": {"x": "y" * 20000}}, "parameters: "),
    ({"profile": "nope"}, "profile: "),
    ({"profile": "staff"}, "profile: profile 'staff' is not available to your groups"),
    ({"profile": "huge"}, "profile: 'huge' can never be placed"),
    ({"time_limit": 601}, "time_limit: at most 600 seconds for profile 'cpu'"),
    ({"time_limit": 0}, "time_limit: must be at least 1 second"),
    ({"time_limit": "1h"}, "time_limit: must be a whole number"),
    ({"name": "a/b"}, "name: "),
    ({"name": ".."}, "name: "),
    ({"colour": "red"}, "colour: unknown field"),
    ({"at": "2001-01-01T00:00:00Z"}, "at: 2001-01-01T00:00:00Z is in the past"),
    ({"at": "2999-01-01T00:00:00"}, "at: '2999-01-01T00:00:00' has no time zone"),
]


def test_bad_input_is_400_naming_the_field_and_stores_nothing(hub, engine):
    u = User(hub, "jb-bad")
    base = {"notebook": notebook("1"), "profile": "cpu"}
    for change, words in BAD:
        body = {**base, **change}
        if "notebook" not in change and change.get("profile") == "cpu" and len(change) == 1:
            body.pop("notebook")
        r = u.call("POST", "api/jobs", body)
        assert r.status_code == 400, (change, r.text)
        assert r.json()["message"].startswith(words), (change, r.json())
    r = requests.post(f"{hub.url}{SVC}api/jobs", data="{not json",
                      headers={"Authorization": f"token {u.token}"}, timeout=30)
    assert r.status_code == 400 and r.json()["message"].startswith("body: ")
    # JSON nested past the parser's depth was an uncaught RecursionError (HTTP 500); a body
    # far past what a submission may hold was parsed on the hub's event loop (seconds for
    # tens of MB) before any limit: now 400, and 413 before parsing
    for path in ("api/jobs", "api/job_definitions"):
        r = requests.post(f"{hub.url}{SVC}{path}", data="[" * 100_000,
                          headers={"Authorization": f"token {u.token}"}, timeout=30)
        assert (r.status_code, r.json()["message"]) == (400, "body: nested too deeply"), r.text
        r = requests.post(f"{hub.url}{SVC}{path}", data=b"[" + b"{}," * (4 * MiB) + b"{}]",
                          headers={"Authorization": f"token {u.token}"}, timeout=30)
        assert r.status_code == 413 and r.json()["message"].startswith("body: "), r.text
    assert u.call("GET", "api/jobs").json()["jobs"] == []
    assert not job_containers(engine, "jb-bad") and not admin_allocations(hub, "jb-bad")
    # no token: 401
    assert requests.get(f"{hub.url}{SVC}api/jobs", timeout=30).status_code == 401


def jobs_cli(hub: Hub, token: str) -> Callable[..., subprocess.CompletedProcess]:
    """``gpuspawner jobs ARGS...`` as the token's user against ``hub`` (the service URL found
    through the hub's API, as a user's terminal would), run to its end (120 s at most)."""
    env = {**os.environ, "JUPYTERHUB_API_URL": f"{hub.url}/hub/api",
           "JUPYTERHUB_API_TOKEN": token}
    env.pop("GPUSPAWNER_SERVICE_URL", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuspawner.cli", "jobs", *args],
                              env=env, capture_output=True, text=True, timeout=120)

    return cli


def test_the_cli_submits_shows_and_downloads(hub, tmp_path):
    u = User(hub, "jb-cli")
    path = tmp_path / "my notebook.ipynb"
    path.write_text(json.dumps(notebook("print(x + 1)")))
    cli = jobs_cli(hub, u.token)
    p = cli("submit", str(path), "--profile", "cpu", "-p", "x=41", "--time-limit", "60")
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    u.wait_state(job_id, ("completed", "failed", "lost"))
    p = cli("show", job_id)
    assert p.returncode == 0 and "state: completed" in p.stdout and \
        "name: my-notebook" in p.stdout, p.stdout
    assert job_id in cli("list").stdout
    p = cli("output", job_id, "-o", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    nb = json.loads((tmp_path / "out" / "my-notebook.ipynb").read_text())
    assert "42\n" in ["".join(o.get("text", "")) for c in nb["cells"] for o in c["outputs"]]
    p = cli("submit", str(path), "--time-limit", "100000")
    assert p.returncode == 1 and "HTTP 400: time_limit: at most 600" in p.stderr
    p = cli("submit", str(path), "--max-retries", "11")
    assert p.returncode == 1 and "HTTP 400: max_retries: must be 0 to 10" in p.stderr, p.stderr
    p = cli("submit", str(path), "--at", "2001-01-01T00:00:00Z")
    assert p.returncode == 1 and "HTTP 400: at: 2001-01-01T00:00:00Z is in the past" in \
        p.stderr, p.stderr
    p = cli("cancel", job_id)
    assert p.returncode == 1 and "HTTP 409" in p.stderr


def test_a_job_at_a_later_time_starts_then(hub, engine):
    import time
    from datetime import datetime, timezone

    u = User(hub, "jb-later")
    due = datetime.fromtimestamp(int(time.time()) + 5, timezone.utc)
    job = u.submit(notebook("print('on time')"), name="later",
                   at=due.isoformat().replace("+00:00", "Z"))
    assert job["at"] == due.strftime("%Y-%m-%dT%H:%M:%SZ")
    early = u.job(job["id"])
    assert early["state"] == "queued" and early["message"].startswith("scheduled for "), early
    assert early["started"] is None and not admin_allocations(hub, "jb-later")
    done = u.wait_state(job["id"], ("completed", "failed", "lost"), 90)
    assert done["state"] == "completed", done
    assert done["started"] >= job["at"]  # ISO 8601 in UTC compares as text
    wait_until(lambda: released(hub, engine, "jb-later"), 30, 0.3, "released")


def test_jobs_wait_in_the_one_queue_for_their_bundle(hub, engine):
    u = User(hub, "jb-queue")
    first = u.submit(held_notebook(), profile="tiny", name="first")
    u.wait_state(first["id"], ("running",), 90)
    second = u.submit(notebook("print('second')"), profile="tiny", name="second")
    waiting = u.wait_state(second["id"], ("waiting",), 30)
    assert waiting["queue_position"] == [1, 1] and "waiting: position 1 of 1" in \
        waiting["message"]
    third = u.submit(notebook("print('third')"), profile="tiny", name="third")
    assert u.wait_state(third["id"], ("waiting",), 30)["queue_position"] == [2, 2]

    def queue_length() -> int:
        r = requests.get(f"{hub.url}{SVC}api/queue", timeout=30,
                         headers={"Authorization": f"token {u.token}"})
        assert r.status_code == 200, r.text
        return r.json()["length"]

    assert queue_length() == 2
    # a cancel while it waits: it leaves the queue, nothing was placed
    r = u.call("DELETE", f"api/jobs/{third['id']}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert r.json()["node"] is None
    assert queue_length() == 1
    let_go(hub, "jb-queue")
    done = u.wait_state(second["id"], ("completed", "failed", "lost"), 90)
    assert done["state"] == "completed", done
    assert u.job(first["id"])["state"] == "completed"
    states = [h["state"] for h in done["history"]]
    assert states[:3] == ["queued", "waiting", "starting"]
    wait_until(lambda: released(hub, engine, "jb-queue"), 30, 0.3, "released")


def test_jobs_and_servers_share_the_quota(hub, engine):
    u = User(hub, "jb-quota")  # c.GPUSpawner.quotas: at most 1 server
    r = hub.api("POST", "/users/jb-quota/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("jb-quota")
    try:
        r = u.call("POST", "api/jobs", {"notebook": notebook("1"), "profile": "cpu"})
        assert r.status_code == 400 and r.json()["message"].startswith("profile: 'cpu': "), \
            r.text
        assert "quota" in r.json()["message"]
        assert u.call("GET", "api/jobs").json()["jobs"] == []
    finally:
        hub.api("DELETE", "/users/jb-quota/server")
        hub.wait_stopped("jb-quota")
    job = u.submit(notebook("1"), profile="cpu", name="after")
    assert u.wait_state(job["id"], ("completed", "failed", "lost"))["state"] == "completed"
    wait_until(lambda: released(hub, engine, "jb-quota"), 30, 0.3, "released")


def test_a_hub_restart_adopts_a_running_job(hub, engine):
    u = User(hub, "jb-restart")
    job = u.submit(held_notebook("print('slept')"), name="nap")
    u.wait_state(job["id"], ("running",), 90)
    (before,) = job_containers(engine, "jb-restart")
    hub.stop()
    hub.start()
    # the restore kept its container (no orphan removal) and the job finishes once
    assert [c["Id"] for c in job_containers(engine, "jb-restart")] == [before["Id"]]
    let_go(hub, "jb-restart")
    done = u.wait_state(job["id"], ("completed", "failed", "lost", "cancelled"), 90)
    assert done["state"] == "completed", done
    states = [h["state"] for h in done["history"]]
    assert states.count("completed") == 1 and states.count("running") == 1
    wait_until(lambda: released(hub, engine, "jb-restart"), 30, 0.3, "released")


def test_a_job_that_ends_while_the_hub_is_down_completes(hub, engine):
    u = User(hub, "jb-down")
    job = u.submit(notebook("import time\ntime.sleep(3)\nprint('done')"), name="short")
    u.wait_state(job["id"], ("running",), 90)
    (c,) = job_containers(engine, "jb-down")
    hub.stop()
    engine.wait(c["Id"], timeout=60)  # it ends while no hub watches it
    hub.start()
    done = u.wait_state(job["id"], ("completed", "failed", "lost", "cancelled"), 90)
    assert done["state"] == "completed" and done["exit_code"] == 0, done
    assert u.call("GET", f"api/jobs/{job['id']}/output").status_code == 200
    wait_until(lambda: released(hub, engine, "jb-down"), 30, 0.3, "released")


def test_a_waiting_job_keeps_its_place_across_a_hub_restart(hub, engine):
    u = User(hub, "jb-wait")
    first = u.submit(held_notebook(), profile="tiny", name="holder")
    u.wait_state(first["id"], ("running",), 90)
    second = u.submit(notebook("print('next')"), profile="tiny", name="next")
    assert u.wait_state(second["id"], ("waiting",), 30)["queue_position"] == [1, 1]
    hub.stop()
    hub.start()
    # the restored queue entry is the job's again (not spawned as a server), still first
    again = u.job(second["id"])
    assert again["state"] == "waiting" and again["queue_position"] == [1, 1], again
    assert "spawning " + f"jb-wait/job/{second['id']}" not in hub.tail(400)
    let_go(hub, "jb-wait")
    for job in (first, second):
        done = u.wait_state(job["id"], ("completed", "failed", "lost", "cancelled"), 90)
        assert done["state"] == "completed", done
    wait_until(lambda: released(hub, engine, "jb-wait"), 30, 0.3, "released")


def later(seconds: float) -> str:
    """An ``at`` this many seconds from now (ISO 8601, UTC)."""
    import time
    from datetime import datetime, timezone

    return datetime.fromtimestamp(int(time.time() + seconds), timezone.utc).isoformat(
        ).replace("+00:00", "Z")


def test_a_queued_job_whose_owner_left_the_profiles_group_is_cancelled(hub, engine):
    """Issue 46 item 2, replayed: a user of group staff submits a job on the staff profile
    with ``at`` a few seconds ahead, then is removed from staff. A new submission is refused
    (400); before, the queued job still ran on the staff profile with the groups of its
    submission. Now its placement reads the owner's groups on the hub: it ends ``cancelled``
    naming why, and no container is ever made."""
    hub.ensure_user("jb-leaver", groups=("staff",))
    u = User(hub, "jb-leaver")
    job = u.submit(notebook("print('ran anyway')"), name="staffjob", profile="staff",
                   at=later(6))
    assert job["state"] == "queued"
    r = hub.api("DELETE", "/groups/staff/users", {"users": ["jb-leaver"]})
    assert r.status_code == 200, r.text
    r = u.call("POST", "api/jobs", {"notebook": notebook("1"), "profile": "staff"})
    assert r.status_code == 400 and "not available to your groups" in r.text, r.text
    done = u.wait_state(job["id"], ("completed", "failed", "cancelled", "lost"), 60)
    assert done["state"] == "cancelled", done
    assert "jb-leaver may no longer use it" in done["message"], done["message"]
    assert done["started"] is None and not job_containers(engine, "jb-leaver")
    assert released(hub, engine, "jb-leaver")


def test_deleting_a_user_cancels_their_jobs_and_deletes_their_definitions(hub, engine):
    """Issue 46 item 3, replayed: after ``DELETE /hub/api/users/NAME`` the user's running job
    ran on, their queued job ran at its time and their definition went on ticking; a new
    account of the same name saw (and could cancel, read) them all. Now the deletion cancels
    the running and the queued job (the container is removed, the allocation released),
    deletes the definition and the job records, and says so in the hub's log; the new
    account finds none."""
    u = User(hub, "jb-deleted")
    running = u.submit(notebook("import time\ntime.sleep(600)"), name="long")
    queued = u.submit(notebook("print('ran anyway')"), name="queued", at=later(30))
    r = u.call("POST", "api/job_definitions", {
        "notebook": notebook("print('tick')"), "profile": "cpu", "name": "ticker",
        "schedule": "* * * * *"})
    assert r.status_code == 201, r.text
    u.wait_state(running["id"], ("running",), 90)
    assert job_containers(engine, "jb-deleted")
    r = hub.api("DELETE", "/users/jb-deleted")
    assert r.status_code == 204, r.text
    wait_until(lambda: released(hub, engine, "jb-deleted"), 60, 0.3,
               lambda: f"jb-deleted's job released\n{hub.tail(40)}")
    wait_until(lambda: "jobs of jb-deleted (the hub: its owner jb-deleted was deleted): "
               "2 cancelled" in hub.tail(400), 30, 0.3, lambda: hub.tail(40))
    assert "job definitions of deleted user jb-deleted deleted" in hub.tail(400)
    admin = {"Authorization": f"token {hub.token}"}
    r = requests.get(f"{hub.url}{SVC}api/jobs?user=jb-deleted", headers=admin, timeout=30)
    assert r.status_code == 200 and r.json()["jobs"] == [], r.text
    again = User(hub, "jb-deleted")  # a new account of the same name
    assert again.call("GET", "api/jobs").json()["jobs"] == []
    assert again.call("GET", "api/job_definitions").json()["job_definitions"] == []
    for job in (running, queued):
        assert again.call("GET", f"api/jobs/{job['id']}").status_code == 404
    assert not job_containers(engine, "jb-deleted")
