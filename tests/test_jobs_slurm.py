"""Notebook jobs on the Slurm backend: a real hub (JupyterHub + configurable-http-proxy +
GPUSpawner with ``backend = "slurm"`` + the gpuspawner service) on the private cluster of
``scripts/slurm.sh``, its jobs run by the nodes' Python of ``scripts/slurm-jobenv.sh`` (``make
slurm`` makes both). A job is a second kind of request through the same ledger: a one-off job
runs as an sbatch job of the user with the bundle's GRES, cores and memory and ``--time`` from
its time limit, its executed notebook lands in the user's home, and the ledger and Slurm's queue
are empty afterwards; a time limit and a cancel stop the Slurm job and release; a hub restart
adopts a running job, which finishes once; a node set DOWN under a running job (then drained)
makes it ``lost``, and it runs again on the other node.

The first test prints the times from the submission to the Slurm job running, to the
notebook's first cell and to the job's end; the second the same for ``sbatch`` of papermill
alone, on the same cluster."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("sqlalchemy")

from gpuspawner.backends.slurm.commands import SlurmClient, parse_jobs  # noqa: E402
from gpuspawner.backends.slurm.gres import gres_type  # noqa: E402
from gpuspawner.backends.slurm.job import ADMIN_MARKER, gpu_positions, job_time  # noqa: E402
from gpuspawner.hub.identity import job_object_name  # noqa: E402
from gpuspawner.placement import Allocation  # noqa: E402
from gpuspawner.testing.slurm_hub import USER, SlurmHub, chp, job_python  # noqa: E402
from tests.test_jobs_hub import SVC, User  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.test_slurm_backend import slurm_conf, topology_nodes  # noqa: E402, F401
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.hub]
PROFILES = [
    {"slug": "gpu1", "display_name": "1 GPU", "cpu": 1, "memory": "1G", "gpus": 1,
     "nodes": ["node1"], "default": True},
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "1G",
     "nodes": ["node1", "node2"]},
]
EXTRA = """
c.GPUSpawner.placement_policy = "first-fit"
c.GPUJobs.profile_time_limits = {"gpu1": {"default": 300, "max": 3600},
                                 "cpu": {"default": 300, "max": 3600}}
"""
FINAL = ("completed", "failed", "lost", "cancelled", "timed_out")


def slurm_jobs(conf: str, name: str | None = None) -> list:
    """Slurm's jobs that hold (or wait for) resources, ``name``'s only when given."""
    out = asyncio.run(SlurmClient(conf=conf, timeout=30).run("scontrol", "show", "job", "-d"))
    return [j for j in parse_jobs(out) if (name is None or j.name == name)
            and j.state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")]


def allocations(hub: SlurmHub, user: str) -> list[dict]:
    r = requests.get(f"{hub.url}{SVC}api/allocations",
                     headers={"Authorization": f"token {hub.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [a for a in r.json() if a["owner"]["user"] == user]


def released(hub: SlurmHub, conf: str, user: str, name: str) -> bool:
    """The ledger holds nothing of ``user``'s and Slurm no job named ``name``."""
    return not allocations(hub, user) and not slurm_jobs(conf, name)


def scontrol_node(conf: str, node: str, *args: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", *args], check=True, timeout=30,
                   env={**os.environ, "SLURM_CONF": conf})


def node_state(conf: str, node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "SLURM_CONF": conf}
                          ).stdout.strip()


@pytest.fixture(scope="module")
def hub(slurm_conf: str, tmp_path_factory) -> Iterator[SlurmHub]:  # noqa: F811
    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    if job_python() is None:
        pytest.skip("no Python for notebook jobs on the nodes: scripts/slurm-jobenv.sh "
                    "(make slurm) makes var/slurm/jobenv")
    h = SlurmHub(tmp_path_factory.mktemp("jobsslurm"), slurm_conf, profiles=PROFILES,
                 jobs=True, extra=EXTRA)
    h.start()
    try:
        yield h
    finally:
        h.stop()
        for job in slurm_jobs(slurm_conf):
            if job.name.startswith(f"job-{USER}--"):
                subprocess.run(["scancel", str(job.job_id)], timeout=30, check=False,
                               env={**os.environ, "SLURM_CONF": slurm_conf})
        shutil.rmtree(h.home, ignore_errors=True)


def test_a_job_runs_as_a_slurm_job_into_the_users_home_and_releases(
        hub: SlurmHub, slurm_conf: str) -> None:  # noqa: F811
    u = User(hub, USER)
    nb = notebook("import os, time\nprint('t0', time.time())\nprint('x is', x)\n"
                  "print(os.getuid(), os.environ['CUDA_VISIBLE_DEVICES'], "
                  "sorted(os.sched_getaffinity(0)))",
                  "time.sleep(3)\ny = x * 2\ny", "print('t1', time.time())")
    t_submit = time.time()
    job = u.submit(nb, profile="gpu1", parameters={"x": 21}, name="double", time_limit=100)
    name = job_object_name(USER, job["id"])
    running = u.wait_state(job["id"], ("running", *FINAL), 90)
    t_running = time.time()
    assert running["state"] == "running", running
    # while it runs: a Slurm job of the user, pinned to the allocation like a server's, with
    # the job's time limit (plus one minute, in whole minutes) as --time; no JupyterHub server
    (sj,) = wait_until(lambda: slurm_jobs(slurm_conf, name), 10, 0.2, f"Slurm job {name}")
    assert sj.user == USER and sj.node_list == ("node1",)
    assert sj.fields["TimeLimit"] == f"00:{int(job_time(100, 60)):02d}:00" == "00:03:00"
    alloc = Allocation.from_json(sj.fields["AdminComment"][len(ADMIN_MARKER):])
    assert alloc.owner.server == f"job/{job['id']}" and alloc.node == running["node"] == "node1"
    (gpu,) = alloc.gpu_uuids
    assert running["gpu_uuids"] == [gpu]
    pos = gpu_positions(topology_nodes()["node1"].node)
    assert sj.gres_indices("node1") == {gres_type(gpu): (pos[gpu],)}
    assert sj.node_detail("node1").cpu_ids == alloc.cpuset
    assert sj.node_detail("node1").memory_mb == 1024
    assert hub.api("GET", f"/users/{USER}").json()["servers"] == {}
    # the log while it runs, read from the job's output file
    live = wait_until(lambda: (lambda r: r.text if r.status_code == 200 and "x is 21" in
                               r.text else None)(u.call("GET", f"api/jobs/{job['id']}/log")),
                      30, 0.3, lambda: u.call("GET", f"api/jobs/{job['id']}/log").text)
    assert "executing" in live
    done = u.wait_state(job["id"], FINAL, 90)
    t_done = time.time()
    assert done["state"] == "completed", done
    assert done["exit_code"] == 0 and done["node"] == "node1"
    states = [h["state"] for h in done["history"]]
    assert states[0] == "queued" and states[-2:] == ["running", "completed"]
    # the executed notebook through the API: the parameter was injected and used
    r = u.call("GET", f"api/jobs/{job['id']}/output")
    assert r.status_code == 200, r.text
    out = r.json()
    texts = "".join("".join(o.get("text", "")) for c in out["cells"]
                    for o in c.get("outputs", []))
    uid = pwd.getpwnam(USER).pw_uid
    assert f"x is 21\n{uid} 0 {list(alloc.cpuset)}\n" in texts
    assert any("42" in "".join(o.get("data", {}).get("text/plain", ""))
               for c in out["cells"] for o in c.get("outputs", []))
    t0 = float(texts.split("t0 ", 1)[1].split()[0])
    t1 = float(texts.split("t1 ", 1)[1].split()[0])
    # ... and in the user's home, written by the job as the user
    assert done["output_dir"].startswith("~/jobs/double/")
    folder = hub.home / USER / done["output_dir"][2:]
    files = {p.name: p for p in folder.iterdir()}
    assert set(files) == {"double.ipynb", "double.input.ipynb", "double.html", "job.log"}
    for p in [folder, *files.values()]:
        assert p.stat().st_uid == uid, p
    home_nb = json.loads(files["double.ipynb"].read_text())
    assert [c["source"] for c in home_nb["cells"]] == [c["source"] for c in out["cells"]]
    assert done["has_html"] and "x is 21" in u.call(
        "GET", f"api/jobs/{job['id']}/output?format=html").text
    r = u.call("GET", f"api/jobs/{job['id']}/log")
    assert "done, exit status 0" in r.text and "gpuspawner job result" not in r.text
    # the ledger is empty again, the Slurm job gone, its output file removed
    wait_until(lambda: released(hub, slurm_conf, USER, name), 30, 0.3, "released")
    assert not list(hub.output_dir.glob(f"*/{name}-*.out"))
    print(f"\nSlurm job: submit -> running (API) {t_running - t_submit:.2f} s; "
          f"-> notebook's first cell {t0 - t_submit:.2f} s; -> its last cell "
          f"{t1 - t_submit:.2f} s (3 s of sleep); -> completed (API, poll 0.5 s) "
          f"{t_done - t_submit:.2f} s")


def test_papermill_alone_under_sbatch_for_comparison(slurm_conf: str) -> None:  # noqa: F811
    """The same notebook with papermill alone under ``sbatch`` (the same node, GRES, cores,
    memory and user): what the hub adds is the difference (printed, not asserted)."""
    py = job_python()
    if py is None:
        pytest.skip("no var/slurm/jobenv: scripts/slurm-jobenv.sh")
    user = pwd.getpwnam(USER)
    d = Path(tempfile.mkdtemp(prefix="gps-pm-", dir="/tmp"))
    os.chown(d, user.pw_uid, user.pw_gid)
    try:
        nb = notebook("import time\nprint('t0', time.time())", "time.sleep(3)",
                      "print('t1', time.time())")
        nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}
        (d / "in.ipynb").write_text(json.dumps(nb))
        os.chown(d / "in.ipynb", user.pw_uid, user.pw_gid)
        gpu = sorted(topology_nodes()["node1"].node.gpus, key=lambda g: g.index)[0]
        t_submit = time.time()
        p = subprocess.run(
            ["sbatch", "--parsable", f"--uid={USER}", f"--gid={USER}", "--nodelist=node1",
             "--ntasks=1", "--cpus-per-task=1", "--mem=1024", "--no-requeue",
             f"--gres=gpu:{gres_type(gpu.uuid)}:1", f"--chdir={d}", f"--output={d}/out.log",
             "--time=3", "--wrap", f"exec {py} -m papermill --log-output in.ipynb out.ipynb"],
            capture_output=True, text=True, timeout=30, cwd=d,
            env={"PATH": os.environ["PATH"], "SLURM_CONF": slurm_conf})
        assert p.returncode == 0, p.stderr
        job_id = int(p.stdout.split(";")[0])
        wait_until(lambda: not [j for j in slurm_jobs(slurm_conf) if j.job_id == job_id],
                   60, 0.1, f"Slurm job {job_id} ended")
        t_done = time.time()
        out = json.loads((d / "out.ipynb").read_text())
        texts = "".join("".join(o.get("text", "")) for c in out["cells"]
                        for o in c.get("outputs", []))
        t0 = float(texts.split("t0 ", 1)[1].split()[0])
        t1 = float(texts.split("t1 ", 1)[1].split()[0])
        print(f"\nsbatch + papermill alone: submit -> notebook's first cell "
              f"{t0 - t_submit:.2f} s; -> its last cell {t1 - t_submit:.2f} s (3 s of sleep);"
              f" -> left the queue (polled every 0.1 s) {t_done - t_submit:.2f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_time_limit_stops_the_slurm_job_and_releases(hub: SlurmHub,
                                                       slurm_conf: str) -> None:  # noqa: F811
    u = User(hub, USER)
    job = u.submit(notebook("import time\ntime.sleep(600)"), profile="gpu1", time_limit=4,
                   name="slow")
    name = job_object_name(USER, job["id"])
    u.wait_state(job["id"], ("running",), 90)
    (sj,) = slurm_jobs(slurm_conf, name)
    assert sj.fields["TimeLimit"] == "00:02:00"  # 4 s + 60 s, in whole minutes
    assert allocations(hub, USER)
    done = u.wait_state(job["id"], FINAL, 60)
    assert done["state"] == "timed_out", done
    assert "time limit of 4 s" in done["message"]
    wait_until(lambda: released(hub, slurm_conf, USER, name), 30, 0.3, "released")
    r = u.call("GET", f"api/jobs/{job['id']}/output")
    assert r.status_code == 404 and "~/jobs/slow/" in r.json()["message"]


def test_a_cancel_stops_the_slurm_job_and_releases(hub: SlurmHub,
                                                   slurm_conf: str) -> None:  # noqa: F811
    u = User(hub, USER)
    job = u.submit(notebook("import time\ntime.sleep(600)"), profile="gpu1", name="long")
    name = job_object_name(USER, job["id"])
    u.wait_state(job["id"], ("running",), 90)
    assert slurm_jobs(slurm_conf, name)
    r = u.call("DELETE", f"api/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and f"cancelled by {USER}" in r.json()["message"]
    assert released(hub, slurm_conf, USER, name)


def test_a_hub_restart_adopts_a_running_slurm_job_which_finishes_once(
        hub: SlurmHub, slurm_conf: str) -> None:  # noqa: F811
    u = User(hub, USER)
    job = u.submit(notebook("import time\ntime.sleep(10)", "print('after')"), profile="gpu1",
                   name="adopted")
    name = job_object_name(USER, job["id"])
    u.wait_state(job["id"], ("running",), 90)
    (sj,) = slurm_jobs(slurm_conf, name)
    hub.stop()
    assert [j.job_id for j in slurm_jobs(slurm_conf, name)] == [sj.job_id]  # it runs on
    hub.start()
    done = u.wait_state(job["id"], FINAL, 90)
    assert done["state"] == "completed" and done["attempt"] == 1, done
    states = [h["state"] for h in done["history"]]
    assert states.count("running") == 1 and states.count("completed") == 1, states
    assert "after" in json.dumps(u.call("GET", f"api/jobs/{job['id']}/output").json())
    wait_until(lambda: released(hub, slurm_conf, USER, name), 30, 0.3, "released")


@pytest.mark.slow
def test_a_job_whose_node_goes_down_is_lost_and_runs_again_on_the_other_node(
        hub: SlurmHub, slurm_conf: str) -> None:  # noqa: F811
    """node1 set DOWN under a running job (Slurm ends it NODE_FAIL), then drained so that it
    stays out of service: the job is lost, and its retry runs on node2 and completes; each
    attempt keeps its folder."""
    u = User(hub, USER)
    job = u.submit(notebook("print('begun', flush=True)\nimport time\ntime.sleep(20)",
                            "print('survived')"), profile="cpu", name="phoenix",
                   max_retries=1)
    name = job_object_name(USER, job["id"])
    first = u.wait_state(job["id"], ("running",), 90)
    assert first["node"] == "node1"
    wait_until(lambda: "begun" in u.call("GET", f"api/jobs/{job['id']}/log").text, 60, 0.3,
               "the notebook runs")
    try:
        scontrol_node(slurm_conf, "node1", "state=down", "reason=gps-jobs-test")
        scontrol_node(slurm_conf, "node1", "state=drain", "reason=gps-jobs-test")
        t0 = time.monotonic()
        again = wait_until(lambda: (lambda j: j if j["attempt"] == 2 and j["state"] ==
                                    "running" else None)(u.job(job["id"])), 60, 0.3,
                           lambda: f"{u.job(job['id'])}\n{hub.tail(30)}")
        moved = time.monotonic() - t0
        assert again["node"] == "node2", again
        (lost,) = again["attempts"]
        assert lost["state"] == "lost" and "NODE_FAIL" in lost["message"], lost
        done = u.wait_state(job["id"], FINAL, 90)
        assert done["state"] == "completed" and done["attempt"] == 2, done
        one, two = (hub.home / USER / a[2:] for a in (lost["output_dir"], done["output_dir"]))
        assert one != two and (one / "phoenix.input.ipynb").is_file()
        assert (two / "phoenix.ipynb").is_file()
        wait_until(lambda: released(hub, slurm_conf, USER, name), 30, 0.3, "released")
        print(f"\nnode1 set DOWN -> the job's retry runs on node2: {moved:.1f} s")
    finally:
        scontrol_node(slurm_conf, "node1", "state=resume")
        wait_until(lambda: node_state(slurm_conf, "node1") in ("idle", "mixed", "allocated"),
                   60, 0.5, "node1 back in service")
