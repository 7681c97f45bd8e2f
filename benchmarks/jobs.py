"""Notebook jobs, measured side by side in one run (the goals of docs/jobs.md):

1. **due -> notebook start**: a job submitted with ``at`` 7-8 s ahead, through the
   real hub (JupyterHub + configurable-http-proxy + the gpuspawner service, the real Docker
   engine, the single-user image); its first cell prints ``time.time()``. Measured: that time
   minus ``at``. Beside it, ``docker run`` of the same image with the same uid, one core and
   the same memory limit, running ``python3 -m papermill`` on the same notebook directly:
   the first cell's time minus the moment before the container was created. Goal: ratio
   job / docker run <= 1.2.
2. **10-cell notebook end to end**: a job of 10 small cells submitted now, from the POST to
   the API saying ``completed`` (polled every 0.25 s; the hub looks at a running job every
   ``c.GPUJobs.poll_interval`` = 0.5 s here), against ``docker run`` of papermill on it from
   create to the container's exit. Overhead = the difference; the job's own phases (queued ->
   starting -> running -> completed, from its history) are printed too.
3. **scheduler CPU per tick with N definitions** (default 10,000; in-process, no hub): the
   job definitions' :class:`~gpuspawner.hub.jobs.schedule.Scheduler` over a SQLite jobs
   database of N definitions with daily schedules at random minutes (about N / 1440 due per
   minute), ``--ticks`` one-minute ticks with an injected clock; each tick's CPU time
   (``time.process_time``) around ``Scheduler.tick``, which submits the due ones as jobs
   through a :class:`~gpuspawner.hub.jobs.runner.JobRunner` on an in-memory backend. Goal:
   < 50 ms per tick. Skipped (said so) where ``gpuspawner.hub.jobs.schedule`` is missing.

Usage: ``.venv/bin/python benchmarks/jobs.py [--runs 3] [--definitions 10000] [--ticks 20]
[--time-limit 900] [--skip-hub]``. Needs the engine, the image and configurable-http-proxy
(``make engine images chp``) for 1 and 2. Bounded: ``--runs`` jobs and ``docker run``s per
measure, every wait under the one ``--time-limit`` (exit 2 when it runs out). Removes what it
starts (hub, containers, networks, the temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

IMAGE = "gpuspawner/singleuser:latest"
USER = "bench-jobs"
PROFILES = [{"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M",
             "nodes": ["local"], "default": True}]
EXTRA = """
for _r in c.JupyterHub.load_roles:
    if _r.get("name") == "gpuspawner-admin":
        _r["scopes"] = list(_r["scopes"]) + ["tokens", "access:services"]
c.GPUJobs.poll_interval = 0.5
"""
SVC = "/services/gpuspawner/"


class OutOfTime(Exception):
    """The run's --time-limit is spent."""


def notebook(*sources: str) -> dict[str, Any]:
    """An nbformat 4 notebook of code cells (a ``parameters`` cell first), kernel python3."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return json.loads(nbformat.writes(nb))


#: the first cell after the parameters prints when it ran
STAMP = "import time\nprint(repr(time.time()))"
TEN = [STAMP] + [f"y{i} = x + {i}" for i in range(1, 10)]


def first_stamp(nb: dict[str, Any]) -> float:
    """The time the stamp cell printed (the first code cell's output that is a float)."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")).strip()
            try:
                return float(text)
            except ValueError:
                continue
    raise ValueError("no stamp in the executed notebook")


class Clock:
    def __init__(self, limit: float) -> None:
        self.end = time.monotonic() + limit

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise OutOfTime()
        return left


# -- the hub side ----------------------------------------------------------------------------
class Jobs:
    """api/jobs of the service with a user's token."""

    def __init__(self, hub: Any) -> None:
        import requests

        self.requests = requests
        hub.ensure_user(USER)
        r = hub.api("POST", f"/users/{USER}/tokens", {"note": "benchmarks/jobs.py"})
        r.raise_for_status()
        self.url = f"{hub.url}{SVC}"
        self.headers = {"Authorization": f"token {r.json()['token']}"}
        self.call("GET", "api/jobs")  # answers once the job runner is ready (hub start)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.requests.request(method, self.url + path, headers=self.headers, timeout=60,
                                  data=None if body is None else json.dumps(body))
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def wait_end(self, job_id: str, clock: Clock, every: float = 0.1) -> tuple[dict, float]:
        """(the job once it ended, when the API first said so)."""
        while True:
            job = self.call("GET", f"api/jobs/{job_id}")
            if job["state"] in ("completed", "failed", "timed_out", "cancelled", "lost"):
                return job, time.time()
            time.sleep(min(every, clock.left()))


def phases(job: dict[str, Any]) -> str:
    """Seconds between the job's states, from its history."""
    hist = [(h["state"], datetime.fromisoformat(h["time"].replace("Z", "+00:00")).timestamp())
            for h in job["history"]]
    pairs = zip(hist, hist[1:], strict=False)
    return ", ".join(f"{a}->{b} {tb - ta:.0f}s" for (a, ta), (b, tb) in pairs)


def log_start(text: str) -> float | None:
    """When the in-job program logged its first line (its asctime, the container's clock:
    UTC), or None."""
    for line in text.splitlines():
        try:
            when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        return when.replace(tzinfo=timezone.utc).timestamp()
    return None


def job_due_latency(jobs: Jobs, clock: Clock, notes: list[str]) -> float:
    at = math.ceil(time.time()) + 8  # the POST may take seconds on a loaded machine
    job = jobs.call("POST", "api/jobs", {
        "notebook": notebook(STAMP), "name": "due", "profile": "cpu",
        "at": datetime.fromtimestamp(at, timezone.utc).isoformat()})
    done, _ = jobs.wait_end(job["id"], clock, every=1.0)  # (its end's time is not measured)
    if done["state"] != "completed":
        raise RuntimeError(f"job {done['id']} {done['state']}: {done['message']}")
    first = first_stamp(jobs.call("GET", f"api/jobs/{job['id']}/output"))
    log = jobs.requests.get(jobs.url + f"api/jobs/{job['id']}/log", headers=jobs.headers,
                            timeout=60).text
    began = log_start(log)
    if began is not None:
        notes.append(f"due job: due -> in-job program's first log line {began - at:.2f} s, "
                     f"-> first cell {first - began:.2f} s")
    return first - at


def job_end_to_end(jobs: Jobs, clock: Clock) -> tuple[float, str]:
    t0 = time.time()
    job = jobs.call("POST", "api/jobs", {"notebook": notebook(*TEN), "name": "ten",
                                         "profile": "cpu"})
    done, t1 = jobs.wait_end(job["id"], clock, every=0.25)
    if done["state"] != "completed":
        raise RuntimeError(f"job {done['id']} {done['state']}: {done['message']}")
    return t1 - t0, phases(done)


# -- docker run of papermill -------------------------------------------------------------------
def docker_run(engine: Any, nb: dict[str, Any], work: Path, clock: Clock,
               cpuset: str) -> tuple[float, float, dict[str, Any]]:
    """``docker run`` of the image as uid 1000 with one core and 512 MiB running papermill on
    ``nb``: (t0 before the create, t1 at the container's exit, the executed notebook)."""
    work.mkdir(mode=0o777, exist_ok=True)
    os.chmod(work, 0o777)
    (work / "in.ipynb").write_text(json.dumps(nb))
    out = work / "out.ipynb"
    if out.exists():
        out.unlink()
    t0 = time.time()
    c = engine.create_container(
        IMAGE, ["python3", "-m", "papermill", "--no-progress-bar", "-k", "python3",
                "--cwd", "/work", "/work/in.ipynb", "/work/out.ipynb"],
        user="1000:100", working_dir="/work", environment={"HOME": "/work"},
        labels={"gpuspawner.benchmark": "jobs"},
        host_config=engine.create_host_config(binds={str(work): {"bind": "/work",
                                                                 "mode": "rw"}},
                                              cpuset_cpus=cpuset, mem_limit="512m"))
    try:
        engine.start(c["Id"])
        code = engine.wait(c["Id"], timeout=clock.left())["StatusCode"]
        t1 = time.time()
        if code != 0:
            raise RuntimeError(f"docker run papermill exited {code}: "
                               f"{engine.logs(c['Id'])[-800:].decode(errors='replace')}")
    finally:
        engine.remove_container(c["Id"], force=True)
    return t0, t1, json.loads(out.read_text())


# -- the scheduler -----------------------------------------------------------------------------
async def scheduler_ticks(n: int, ticks: int) -> dict[str, Any] | str:
    """CPU seconds of ``Scheduler.tick`` per one-minute tick over ``n`` definitions, or why
    it was not measured."""
    try:
        from gpuspawner.hub.jobs import schedule
    except ImportError as e:
        return f"not measured: the job definitions' scheduler is not here ({e})"
    from gpuspawner.backends.base import Backend, NodeRuntime
    from gpuspawner.hub.cluster import Cluster
    from gpuspawner.hub.jobs.runner import JobRunner
    from gpuspawner.hub.jobs.settings import GPUJobs
    from gpuspawner.hub.jobs.store import DefinitionRow, JobStore, pack
    from gpuspawner.placement import Ledger
    from gpuspawner.testing.factories import make_node

    class Idle(Backend):
        """Accepts every launch (the jobs of the ticks start later than the ticks)."""

        backend_name = "docker"

        async def launch(self, spec, state, progress):
            state["container_id"] = secrets.token_hex(8)
            return "127.0.0.1", 0

        async def poll(self, state):
            return None

        async def stop(self, state, now=False):
            return None

    node = make_node("n1", gpus=8, cores=256, memory_gib=2048)
    backend = Idle()
    backend.bind({"n1": NodeRuntime("n1", "127.0.0.1", "bench", node)})
    cluster = Cluster(dict(backend.nodes), Ledger([node], policy="first-fit"), backend)
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(f"sqlite:///{tmp}/jobs.sqlite")
        runner = JobRunner(GPUJobs(max_active_jobs_per_user=10**6), store, lambda: cluster,
                           {"profiles": [{**PROFILES[0], "nodes": ["n1"]}],
                            "image": IMAGE, "home_path_template": "",
                            "home_mount_point": "/home/{username}", "uid_map": {},
                            "default_uid": 1000, "default_gid": 100})
        start = math.floor(time.time() / 86400) * 86400 + 86400  # tomorrow 00:00 UTC
        rng = random.Random(1)
        nb = pack(notebook("1"))
        rows = []
        for i in range(n):
            minute = rng.randrange(1440)
            expr = f"{minute % 60} {minute // 60} * * *"
            row = DefinitionRow(
                id=secrets.token_hex(16), user=f"u{i % 500}", name=f"d{i}", profile="cpu",
                time_limit=600, notebook=nb, schedule=expr, timezone="UTC",
                concurrency_policy="Forbid", starting_deadline=None, paused=False,
                created=start - 60, updated=start - 60, last_tick=start - 60,
                next_tick=schedule.next_tick(expr, "UTC", start - 60), message="", runs=0,
                skipped=0)
            row.set_json("groups", [])
            row.set_json("parameters", {})
            rows.append(row)
        store.session.add_all(rows)
        store.session.commit()
        sched = schedule.Scheduler(runner, clock=lambda: start)
        cpu, made = [], []
        for k in range(ticks):
            now = start + 60 * k
            c0 = time.process_time()
            outcomes = await sched.tick(now)
            cpu.append(time.process_time() - c0)
            made.append(sum(1 for o in outcomes if o.job_id))
        await runner.stop()
        store.close()
    return {"cpu": cpu, "made": made}


# -- the run -------------------------------------------------------------------------------------
def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--definitions", type=int, default=10000)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=900.0)
    ap.add_argument("--skip-hub", action="store_true", help="only the scheduler's ticks")
    args = ap.parse_args()
    clock = Clock(args.time_limit)
    rows: list[tuple[str, str, str, str]] = []
    notes: list[str] = []
    try:
        if not args.skip_hub:
            rows += hub_part(args.runs, clock, notes)
        result = asyncio.run(scheduler_ticks(args.definitions, args.ticks))
    except OutOfTime:
        print(f"benchmarks/jobs.py: out of time ({args.time_limit:g} s)", file=sys.stderr)
        return 2
    print(f"\nnotebook jobs ({args.runs} runs each, medians; {time.strftime('%Y-%m-%d %H:%M')}"
          f" UTC, {os.cpu_count()} CPUs)\n")
    print(f"{'measure':44} {'job':>12} {'docker run':>12} {'ratio/diff':>14}")
    for r in rows:
        print(f"{r[0]:44} {r[1]:>12} {r[2]:>12} {r[3]:>14}")
    if isinstance(result, str):
        print(f"{'scheduler CPU per tick':44} {result}")
    else:
        cpu = result["cpu"]
        print(f"{f'scheduler CPU per tick, {args.definitions} defs':44} "
              f"{ms(cpu):>12} {'-':>12} {'goal < 50 ms':>14}")
        made = result["made"]
        print(f"  ticks: {len(cpu)} one-minute ticks, max {max(cpu) * 1000:.0f} ms, "
              f"jobs made per tick {min(made)}..{max(made)} (total {sum(made)})")
        if len(set(made)) > 1:  # least squares: cpu = fixed + per_job * made
            fit = statistics.linear_regression(made, cpu)
            print(f"  fit: {fit.intercept * 1000:.1f} ms per tick + {fit.slope * 1000:.1f} ms "
                  "per job the tick submits")
    for n in notes:
        print("  " + n)
    return 0


def hub_part(runs: int, clock: Clock, notes: list[str]) -> list[tuple[str, str, str, str]]:
    import docker

    from gpuspawner.testing.hubrunner import Hub

    engine = docker.APIClient(version="auto")
    engine.inspect_image(IMAGE)
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp) / "hub", [{"name": "local", "topology": "auto"}], PROFILES,
                  extra_config=EXTRA)
        hub.env["GPUSPAWNER_CULLER"] = "off"
        hub.start()
        try:
            jobs = Jobs(hub)
            due, due_ref, e2e, e2e_ref = [], [], [], []
            for i in range(runs):
                due.append(job_due_latency(jobs, clock, notes))
                t0, _, nb = docker_run(engine, notebook(STAMP), Path(tmp) / f"d{i}", clock, "0")
                due_ref.append(first_stamp(nb) - t0)
            for i in range(runs):
                took, ph = job_end_to_end(jobs, clock)
                e2e.append(took)
                notes.append(f"10-cell job {i + 1}: {took:.2f} s ({ph})")
                t0, t1, _ = docker_run(engine, notebook(*TEN), Path(tmp) / f"t{i}", clock, "0")
                e2e_ref.append(t1 - t0)
        finally:
            hub.stop()
            hub_id = (Path(tmp) / "hub" / "hub" / "gpuspawner-hub-id")
            label = f"gpuspawner.hub={hub_id.read_text().strip()}" if hub_id.exists() else None
            if label:
                for c in engine.containers(all=True, filters={"label": label}):
                    engine.remove_container(c["Id"], force=True)
                for n in engine.networks(filters={"label": label}):
                    try:
                        engine.remove_network(n["Id"])
                    except Exception:
                        pass
    ratio = statistics.median(due) / statistics.median(due_ref)
    notes.append("hub: c.GPUJobs.poll_interval = 0.5 s (default 5 s); job and docker run: "
                 "uid 1000, 1 core, 512 MiB, the same image; runs alternate job, docker run")
    notes.append("due->start runs (job / docker run, s): " + ", ".join(
        f"{a:.2f}/{b:.2f}" for a, b in zip(due, due_ref, strict=True)))
    return [
        ("due time -> first cell runs", ms(due), ms(due_ref),
         f"{ratio:.2f} (<= 1.2)"),
        ("10-cell notebook, submit -> completed", ms(e2e), ms(e2e_ref),
         f"+{(statistics.median(e2e) - statistics.median(e2e_ref)) * 1000:.0f} ms"),
    ]


if __name__ == "__main__":
    sys.exit(main())
