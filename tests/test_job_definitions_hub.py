"""Job definitions in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the
real Docker engine; marked ``docker``): a definition on a real-time schedule (every 10 s: the
hub here allows a seconds field, ``c.GPUJobs.cron_seconds``) makes ordinary jobs that run,
complete and release, each tick once; pause stops the ticks; bad definitions are HTTP 400
naming the field and store nothing; users see only their own; the per-user limit is 429; the
CLI makes, lists, pauses, resumes and deletes a definition. The hub's fixtures and helpers are
tests/test_jobs_hub.py's."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

pytest.importorskip("docker")
pytest.importorskip("croniter")

import tests.test_jobs_hub as jobs_hub  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine  # noqa: E402
from tests.test_jobs_hub import (  # noqa: E402
    EXTRA,
    PROFILES,
    User,
    admin_allocations,
    job_containers,
    jobs_cli,
    released,
    remove_jobs,
)
from tests.test_jobs_units import notebook  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SCHEDULE_EXTRA = """
c.GPUJobs.cron_seconds = True
c.GPUJobs.schedule_interval = 2
c.GPUJobs.max_definitions_per_user = 3
"""
FINAL = ("completed", "failed", "timed_out", "cancelled", "lost")


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobdefshub")
    h = Hub(tmp, [{"name": "local", "topology": "auto"}], PROFILES,
            extra_config=EXTRA + SCHEDULE_EXTRA)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    jobs_hub.HUB_ID[:] = [(tmp / "hub" / "gpuspawner-hub-id").read_text().strip()]
    yield h
    h.stop()
    remove_jobs(engine)


def define(u: User, **fields) -> dict:
    body = {"notebook": notebook("print('tick', x)"), "profile": "cpu",
            "parameters": {"x": 7}, "name": "ticker", **fields}
    r = u.call("POST", "api/job_definitions", body)
    assert r.status_code == 201, r.text
    return r.json()


def jobs_of(u: User, definition_id: str) -> list[dict]:
    r = u.call("GET", f"api/jobs?definition_id={definition_id}")
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def test_a_definition_runs_on_its_ticks_and_releases(hub, engine):
    u = User(hub, "jb-cron")
    d = define(u, schedule="* * * * * */10", timezone="Europe/Rome", starting_deadline=30)
    assert d["concurrency_policy"] == "Forbid" and d["paused"] is False
    assert d["next_tick"] is not None and d["next_tick"] > d["created"]
    # the first tick (within 10 s) makes a job that runs in its own container and completes
    first = wait_until(lambda: (lambda js: js[-1] if js else None)(jobs_of(u, d["id"])),
                       30, 0.3, lambda: f"a job of {d['id']}\n{hub.tail(40)}")
    assert first["definition_id"] == d["id"] and first["name"] == "ticker"
    assert first["at"] is not None and int(first["at"][17:19]) % 10 == 0, first["at"]
    done = u.wait_state(first["id"], FINAL, 90)
    assert done["state"] == "completed", done
    out = u.call("GET", f"api/jobs/{first['id']}/output").json()
    texts = ["".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", [])]
    assert "tick 7\n" in texts
    view = u.call("GET", f"api/job_definitions/{d['id']}").json()
    assert view["runs"] >= 1 and view["last_job_id"] is not None
    # pause: no tick runs any more; what runs ends and everything is released
    r = u.call("PATCH", f"api/job_definitions/{d['id']}", {"paused": True})
    assert r.status_code == 200 and r.json()["paused"] is True and \
        r.json()["next_tick"] is None, r.text
    for job in jobs_of(u, d["id"]):
        u.wait_state(job["id"], FINAL, 90)
    wait_until(lambda: released(hub, engine, "jb-cron"), 30, 0.3, "released")
    jobs = jobs_of(u, d["id"])
    assert jobs and all(j["state"] == "completed" for j in jobs), jobs
    ats = [j["at"] for j in jobs]
    assert len(set(ats)) == len(ats), ats  # never two jobs for one tick
    paused_at = datetime.fromisoformat(r.json()["updated"].replace("Z", "+00:00"))
    assert all(datetime.fromisoformat(a.replace("Z", "+00:00")) <= paused_at for a in ats)
    # one more period passes with the definition paused: no job is made
    wait_until(lambda: time.time() > paused_at.timestamp() + 11, 30, 0.5,
               "a period after the pause")
    assert len(jobs_of(u, d["id"])) == len(jobs)
    # delete: the definition is gone, its jobs stay
    r = u.call("DELETE", f"api/job_definitions/{d['id']}")
    assert r.status_code == 200 and r.json()["id"] == d["id"], r.text
    assert u.call("GET", f"api/job_definitions/{d['id']}").status_code == 404
    assert len(jobs_of(u, d["id"])) == len(jobs)


BAD = [
    ({"schedule": "61 * * * *"}, "schedule: '61 * * * *' is not a valid cron expression"),
    ({"schedule": "* * * *"}, "schedule: '* * * *' has 4 fields"),
    ({"schedule": None}, "schedule: must be a cron expression"),
    ({"timezone": "Mars/Olympus"}, "timezone: unknown time zone 'Mars/Olympus'"),
    ({"concurrency_policy": "Sometimes"}, "concurrency_policy: must be one of Allow, Forbid, "
                                          "Replace"),
    ({"starting_deadline": -1}, "starting_deadline: must be 0 or more seconds"),
    ({"paused": "no"}, "paused: must be true or false"),
    ({"at": "2030-01-01T00:00:00Z"}, "at: unknown field"),
    ({"profile": "staff"}, "profile: profile 'staff' is not available to your groups"),
    ({"profile": "huge"}, "profile: 'huge' can never be placed"),
    ({"time_limit": 601}, "time_limit: at most 600 seconds for profile 'cpu'"),
    ({"name": "../up"}, "name: "),
    ({"parameters": {"x": {"a": 1}}}, "parameters.x: must be a JSON scalar"),
    ({"notebook": {"cells": 3}}, "notebook: not a valid notebook"),
]


def test_bad_definitions_are_400_naming_the_field_and_store_nothing(hub, engine):
    u = User(hub, "jb-defbad")
    base = {"notebook": notebook("1"), "profile": "cpu", "schedule": "0 3 * * *"}
    for change, words in BAD:
        r = u.call("POST", "api/job_definitions", {**base, **change})
        assert r.status_code == 400, (change, r.text)
        assert r.json()["message"].startswith(words), (change, r.json())
    r = u.call("POST", "api/job_definitions", {"notebook": notebook("1")})
    assert r.status_code == 400 and r.json()["message"].startswith("schedule: missing")
    assert u.call("GET", "api/job_definitions").json()["job_definitions"] == []
    # a bad change of a good definition: 400, nothing changed
    d = define(u, schedule="0 3 * * *", paused=True)
    for change, field in [({"schedule": "0 25 * * *"}, "schedule"), ({"name": "a/b"}, "name"),
                          ({"profile": "nope"}, "profile"), ({"time_limit": 10**6}, "time_limit"),
                          ({"image": "tf"}, "image"), ({"owner": "x"}, "owner"),
                          ({"timezone": "Nowhere"}, "timezone"), ({}, "body")]:
        r = u.call("PATCH", f"api/job_definitions/{d['id']}", change)
        assert r.status_code == 400 and r.json()["message"].startswith(f"{field}: "), r.text
    assert u.call("GET", f"api/job_definitions/{d['id']}").json()["schedule"] == "0 3 * * *"
    # the per-user limit (c.GPUJobs.max_definitions_per_user = 3 here)
    define(u, schedule="0 3 * * *", paused=True)
    define(u, schedule="0 3 * * *", paused=True)
    r = u.call("POST", "api/job_definitions", {**base, "paused": True})
    assert r.status_code == 429 and "jb-defbad has 3 job definitions" in r.json()["message"]
    assert len(u.call("GET", "api/job_definitions").json()["job_definitions"]) == 3
    assert jobs_of(u, d["id"]) == [] and not admin_allocations(hub, "jb-defbad")
    assert not job_containers(engine, "jb-defbad")


def test_users_see_only_their_own_definitions(hub):
    owner, other = User(hub, "jb-defowner"), User(hub, "jb-defother")
    d = define(owner, schedule="0 3 * * *", paused=True)
    for method, body in [("GET", None), ("PATCH", {"paused": False}), ("DELETE", None)]:
        r = other.call(method, f"api/job_definitions/{d['id']}", body)
        assert r.status_code == 404, (method, r.text)
    assert other.call("GET", "api/job_definitions").json()["job_definitions"] == []
    assert other.call("GET", "api/job_definitions?user=jb-defowner").status_code == 403
    assert owner.call("GET", f"api/job_definitions/{d['id']}").json()["paused"] is True
    admin = User(hub, "admin")
    listed = admin.call("GET", "api/job_definitions?user=jb-defowner").json()
    assert [x["id"] for x in listed["job_definitions"]] == [d["id"]]
    r = admin.call("DELETE", f"api/job_definitions/{d['id']}")
    assert r.status_code == 200, r.text
    # a service's token makes no definition
    r = jobs_hub.requests.post(f"{hub.url}{jobs_hub.SVC}api/job_definitions",
                               headers={"Authorization": f"token {hub.token}"},
                               data=json.dumps({"notebook": notebook("1"),
                                                "schedule": "0 3 * * *"}), timeout=30)
    assert r.status_code == 403, r.text


def test_the_cli_makes_pauses_resumes_and_deletes_a_definition(hub, tmp_path):
    u = User(hub, "jb-defcli")
    path = tmp_path / "nightly.ipynb"
    path.write_text(json.dumps(notebook("print(1)")))
    cli = jobs_cli(hub, u.token)
    p = cli("submit", str(path), "--profile", "cpu", "--cron", "30 2 * * *", "--timezone",
            "Europe/Rome", "--concurrency-policy", "Replace", "--paused")
    assert p.returncode == 0, p.stderr
    def_id = p.stdout.strip()
    p = cli("definitions")
    assert p.returncode == 0 and def_id in p.stdout and "paused" in p.stdout, p.stdout
    p = cli("resume", def_id)
    assert p.returncode == 0 and "next run" in p.stdout, p.stdout + p.stderr
    got = json.loads(cli("definitions", "--json").stdout)
    assert got[0]["id"] == def_id and got[0]["paused"] is False
    assert got[0]["timezone"] == "Europe/Rome" and got[0]["concurrency_policy"] == "Replace"
    # 02:30 in Rome is 00:30 or 01:30 UTC
    assert got[0]["next_tick"][11:16] in ("00:30", "01:30"), got[0]
    assert cli("pause", def_id).stdout.strip() == f"{def_id}: paused"
    p = cli("submit", str(path), "--cron", "0 25 * * *")
    assert p.returncode == 1 and "HTTP 400: schedule: '0 25 * * *' is not a valid" in \
        p.stderr, p.stderr
    p = cli("submit", str(path), "--cron", "0 2 * * *", "--timezone", "Atlantis/Capital")
    assert p.returncode == 1 and "HTTP 400: timezone: unknown time zone" in p.stderr
    # run-definition: a job of it now, with a parameter over its own; the CLI's options
    p = cli("run-definition", def_id, "-p", "x=3", "--json")
    assert p.returncode == 0, p.stderr
    run = json.loads(p.stdout)
    assert (run["definition_id"], run["parameters"]) == (def_id, {"x": 3}), run
    assert u.wait_state(run["id"], FINAL)["state"] == "completed"
    p = cli("submit", str(path), "--profile", "cpu", "--output-format", "ipynb",
            "--input-folder", ".", "--json")
    assert p.returncode == 0, p.stderr
    job = json.loads(p.stdout)
    assert (job["output_formats"], job["input_folder"]) == (["ipynb"], ""), job
    assert u.wait_state(job["id"], FINAL)["state"] == "completed"
    p = cli("submit", str(path), "--image", "tf")
    assert p.returncode == 1 and "HTTP 400: image: profile 'cpu' offers no choice" in \
        p.stderr, p.stderr
    p = cli("delete-definition", def_id)
    assert p.returncode == 0 and "deleted" in p.stdout, p.stderr
    assert json.loads(cli("definitions", "--json").stdout) == []


def test_ticks_missed_while_the_hub_is_down_run_once_late(hub, engine):
    """The hub stops for more than a period: after its start the latest missed tick runs
    once, late (no starting_deadline), the older ones are skipped, no tick runs twice."""
    u = User(hub, "jb-defdown")
    d = define(u, schedule="* * * * * */10", name="down")
    first = wait_until(lambda: (lambda js: js[-1] if js else None)(jobs_of(u, d["id"])),
                       30, 0.3, lambda: f"a job of {d['id']}\n{hub.tail(40)}")
    assert u.wait_state(first["id"], FINAL, 90)["state"] == "completed"
    before = {j["id"] for j in jobs_of(u, d["id"])}
    for job_id in before:
        u.wait_state(job_id, FINAL, 90)
    hub.stop()
    stopped = time.time()
    wait_until(lambda: time.time() > stopped + 21, 40, 0.5, "two periods with the hub down")
    hub.start()

    def t(iso: str) -> float:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

    new = wait_until(lambda: [j for j in jobs_of(u, d["id"]) if j["id"] not in before],
                     30, 0.3, lambda: f"a job after the restart\n{hub.tail(40)}")
    r = u.call("PATCH", f"api/job_definitions/{d['id']}", {"paused": True})
    assert r.status_code == 200, r.text
    jobs = jobs_of(u, d["id"])
    for job in jobs:
        assert u.wait_state(job["id"], FINAL, 90)["state"] == "completed"
    wait_until(lambda: released(hub, engine, "jb-defdown"), 30, 0.3, "released")
    ats = [t(j["at"]) for j in jobs]
    assert len(set(ats)) == len(ats), ats  # never two jobs for one tick
    # the first job after the restart is the latest tick missed while the hub was down, run
    # late: after the stop, before the scheduler came back, the next tick still to come then
    # (ticks every 10 s; the scheduler came back at B >= stopped + 21, so the latest missed
    # tick L is in (B - 10, B] and L > stopped + 11; the job for it is made at B plus the
    # scheduler's first pass, a few seconds on a loaded machine)
    late = min(new, key=lambda j: (j["created"], j["at"]))
    assert stopped < t(late["at"]) <= t(late["created"]) < t(late["at"]) + 15, late
    assert t(late["at"]) > stopped + 11, (stopped, late)
    # the older missed ticks (at least L - 10, after the stop) were skipped: no job has them
    assert not [a for a in ats if stopped < a < t(late["at"])], (stopped, sorted(ats))
    view = u.call("GET", f"api/job_definitions/{d['id']}").json()
    assert view["skipped"] >= 1, view


def test_a_definition_is_edited_and_run_now_by_its_owner_only(hub, engine):
    """Every field of a definition can be changed (what the Lab's update_job_definition
    sends), checked as at creation; "Run job" (POST .../jobs) makes a job now of the edited
    definition with parameters over its own. Another user, with a real token of their own,
    can neither change nor run it (404, nothing changed, no job); an admin who does not own
    it may not run it as its owner (403)."""
    owner, other = User(hub, "jb-defedit"), User(hub, "jb-defthief")
    d = define(owner, schedule="0 3 * * *", paused=True)
    path = f"api/job_definitions/{d['id']}"
    r = owner.call("PATCH", path, {
        "notebook": notebook("print('edited', x, y)"), "parameters": {"x": 8, "y": "a"},
        "name": "edited", "time_limit": 60, "output_formats": ["ipynb"]})
    assert r.status_code == 200, r.text
    e = r.json()
    assert (e["name"], e["parameters"], e["time_limit"], e["output_formats"], e["paused"],
            e["schedule"]) == ("edited", {"x": 8, "y": "a"}, 60, ["ipynb"], True, "0 3 * * *")
    # the attack: user B with their own token, on A's definition
    for method, sub, body in [("PATCH", "", {"parameters": {"x": 666}}),
                              ("PATCH", "", {"profile": "cpu"}),
                              ("POST", "/jobs", {}), ("POST", "/jobs", {"parameters": {}}),
                              ("GET", "", None)]:
        r = other.call(method, path + sub, body)
        assert r.status_code == 404, (method, sub, r.text)
    r = User(hub, "admin").call("POST", path + "/jobs", {})
    assert r.status_code == 403, r.text
    assert owner.call("GET", path).json()["parameters"] == {"x": 8, "y": "a"}
    assert jobs_of(owner, d["id"]) == []
    # "Run job": now, the edited notebook, parameters over the definition's
    r = owner.call("POST", path + "/jobs", {"parameters": {"x": 9}})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["definition_id"], job["parameters"], job["name"], job["time_limit"],
            job["output_formats"]) == (d["id"], {"x": 9, "y": "a"}, "edited", 60, ["ipynb"])
    done = owner.wait_state(job["id"], FINAL)
    assert done["state"] == "completed", done
    assert "edited 9 a" in owner.call("GET", f"api/jobs/{job['id']}/log").text
    assert not done["has_html"]  # only the notebook was asked for
    after = owner.call("GET", path).json()
    assert (after["parameters"], after["runs"], after["last_job_id"], after["paused"]) == (
        {"x": 8, "y": "a"}, 1, job["id"], True)
    assert [j["id"] for j in jobs_of(owner, d["id"])] == [job["id"]]
    assert other.call("GET", "api/jobs").json()["jobs"] == []
    wait_until(lambda: released(hub, engine, "jb-defedit"), 30, 0.3)
