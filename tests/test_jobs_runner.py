"""The job runner without an engine (a backend test double on two nodes with GPUs): a lost
job is retried on a healthy node up to its ``max_retries`` and each attempt is kept; a job
killed from outside is lost, an OOM-killed one failed; a GPU drained as unhealthy loses its
job; limits on concurrent jobs per user and per group; logs without the result frame; the
in-job program's HTML export; the jobs' Prometheus metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import zlib
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("sqlalchemy")

from prometheus_client import generate_latest  # noqa: E402
from traitlets import TraitError  # noqa: E402

from gpuspawner.backends.base import Backend, BackendUnavailable, NodeRuntime  # noqa: E402
from gpuspawner.hub import metrics  # noqa: E402
from gpuspawner.hub.cluster import HEALTH, Cluster  # noqa: E402
from gpuspawner.hub.jobs import metrics as job_metrics  # noqa: E402
from gpuspawner.hub.jobs.runner import (  # noqa: E402
    Account,
    JobRefused,
    JobRunner,
    check_max_retries,
    strip_result,
)
from gpuspawner.hub.jobs.settings import GPUJobs  # noqa: E402
from gpuspawner.hub.jobs.store import MAX_MESSAGE_CHARS, JobRow, JobRun, JobStore, pack  # noqa: E402
from gpuspawner.jobs import execute  # noqa: E402
from gpuspawner.jobs.model import (  # noqa: E402
    OUTPUT_BEGIN,
    OUTPUT_END,
    JobInputError,
    JobRequest,
    ResultTooLarge,
    parse_output,
)
from gpuspawner.placement import Bundle, Ledger, Owner  # noqa: E402
from tests.factories import make_node  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402

PROFILES = [{"slug": "g1", "display_name": "one GPU", "cpu": 1, "memory": "1G", "gpus": 1,
             "default": True},
            {"slug": "lab", "cpu": 1, "memory": "1G", "gpus": 1, "groups": ["lab"]}]


def frame(result: dict[str, Any]) -> bytes:
    """A job's result as execute.emit prints it."""
    data = base64.b64encode(zlib.compress(json.dumps(result).encode())).decode()
    return f"{OUTPUT_BEGIN}\n{data}\n{OUTPUT_END}\n".encode()


class Engine(Backend):
    """Containers in memory: ``code[cid]`` None while one runs, else its exit status;
    ``down`` holds the nodes whose engine does not answer."""

    backend_name = "docker"

    def __init__(self) -> None:
        super().__init__()
        self.code: dict[str, int | None] = {}
        self.out: dict[str, bytes] = {}
        self.report: dict[str, str] = {}
        self.where: dict[str, str] = {}
        self.down: set[str] = set()
        self.stopped: list[str] = []
        self.made = 0

    def running(self) -> list[str]:
        return [c for c, code in self.code.items() if code is None]

    def _ask(self, node: str) -> None:
        if node in self.down:
            raise BackendUnavailable(node, "connection refused")

    async def prepare(self, server, alloc, state):
        self._ask(alloc.node)
        return {**state, "node": alloc.node}

    async def launch(self, spec, state, progress):
        self._ask(state["node"])
        self.made += 1
        cid = f"c{self.made}"
        state["container_id"] = cid
        self.code[cid], self.where[cid] = None, state["node"]
        self.out[cid] = b"log line of " + cid.encode() + b"\n"
        return "127.0.0.1", 0

    async def poll(self, state):
        self._ask(state["node"])
        return self.code.get(state["container_id"], 0)

    async def read_output(self, state, max_bytes):
        self._ask(state["node"])
        return self.out.get(state["container_id"])

    async def exit_report(self, state):
        return self.report.get(state["container_id"])

    async def stop(self, state, now=False):
        self._ask(state["node"])
        self.stopped.append(state["container_id"])
        self.code.pop(state["container_id"], None)

    async def node_states(self):
        return {n: ("down", "engine gone") for n in self.down}

    def finish(self, cid: str, code: int = 0, html: str | None = "<p>done</p>") -> None:
        self.out[cid] += b"[papermill] cell 1 ran\n" + frame(
            {"notebook": notebook("1"), "error": None, "html": html})
        self.code[cid] = code


@pytest.fixture
def world(tmp_path):
    nodes = [make_node("n1", gpus=2), make_node("n2", gpus=2)]
    engine = Engine()
    engine.bind({n.name: NodeRuntime(n.name, "127.0.0.1", "test", n) for n in nodes})
    cluster = Cluster(dict(engine.nodes), Ledger(nodes, policy="first-fit"), engine)
    settings = GPUJobs(poll_interval=0.02, lost_after=0.2, retry_backoff=0.01,
                       max_active_jobs_per_user=3,
                       max_active_jobs_per_group={"big": 5, "none": 0})
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite'}")
    spawner = {"profiles": PROFILES, "image": "img", "home_path_template": "",
               "home_mount_point": "/home/{username}", "uid_map": {}, "default_uid": 1000,
               "default_gid": 100}
    runner = JobRunner(settings, store, lambda: cluster, spawner)
    yield runner, cluster, engine
    store.close()


async def submit(runner: JobRunner, user: str = "ann", groups=(), **kw) -> JobRow:
    return await runner.submit(user, list(groups), JobRequest(notebook=notebook("1"),
                                                              name="n"), **kw)


async def until(cond, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def gpu_seconds(profile: str | None = None) -> float:
    """GPU-seconds of jobs counted so far, of ``profile`` or of all profiles."""
    return sum(s.value for f in metrics.REGISTRY.collect() for s in f.samples
               if s.name == "gpuspawner_job_gpu_seconds_total"
               and profile in (None, s.labels.get("profile")))


async def test_a_job_whose_engine_is_gone_is_retried_on_a_healthy_node(world):
    runner, cluster, engine = world
    before = gpu_seconds()
    row = await submit(runner, max_retries=2)
    first = await until(engine.running)
    assert engine.where[first[0]] == "n1" and row.node == "n1"
    engine.down.add("n1")  # the engine stops answering: lost after lost_after, then retried
    second = await until(lambda: [c for c in engine.running() if engine.where[c] == "n2"])
    assert row.state == "running" and row.node == "n2"
    view = runner.view(row)
    assert view["attempt"] == 2 and view["max_retries"] == 2
    (gone,) = view["attempts"]
    assert gone["attempt"] == 1 and gone["state"] == "lost" and gone["node"] == "n1"
    assert "has not answered" in gone["message"]
    assert gone["output_dir"].endswith(row.id) and row.output_dir.endswith(
        f"{row.id}-attempt2")  # each attempt writes a folder of its own
    assert [a.node for a in cluster.ledger.allocations()] == ["n2"]  # n1's was released
    engine.finish(second[0])
    await until(lambda: row.state == "completed")
    states = [s for s, _ in row.get_json("history")]
    assert states == ["queued", "starting", "running", "lost", "queued", "starting",
                      "running", "completed"]
    assert cluster.ledger.allocations() == []
    assert gpu_seconds() > before
    log = await runner.log_text(row)
    assert "===== attempt 1 on n1, lost" in log and "===== attempt 2" in log
    assert "log line of c2" in log and OUTPUT_BEGIN not in log
    assert runner.html_of(row) == "<p>done</p>" and runner.view(row)["has_html"]


async def test_a_waiting_job_carries_the_jobs_queue_priority(world):
    """c.GPUJobs.queue_priority = -1: a job waiting for its GPU is ordered behind a server's
    spawn (priority 0) that came later."""
    runner, cluster, engine = world
    runner.settings.queue_priority = -1
    for node in ("n1", "n2"):
        cluster.ledger.reserve(Bundle(cores=1, gpus=2, memory_bytes=2**30), Owner("x", node),
                               nodes=[node])
    row = await submit(runner)
    await until(lambda: row.state == "waiting")
    server = cluster.queue.wq.add(Owner("bob"), Bundle(cores=1, gpus=1, memory_bytes=2**30))
    assert [(e.owner.user, e.priority) for e in cluster.queue.wq.order()] == [
        ("bob", 0), ("ann", -1)]
    cluster.queue.wq.remove(server.id)
    await runner.cancel(row, "ann")
    assert row.state == "cancelled"


async def test_retries_run_out_and_the_job_stays_lost(world):
    runner, cluster, engine = world
    row = await submit(runner, max_retries=1)
    (cid,) = await until(engine.running)
    del engine.code[cid]  # the container vanished (poll answers 0, no result)
    (cid2,) = await until(lambda: [c for c in engine.running() if c != cid])
    del engine.code[cid2]
    await until(lambda: row.state == "lost")
    assert "container was gone" in row.message and "no retries left: 1 used" in row.message
    assert runner.view(row)["attempt"] == 2 and cluster.ledger.allocations() == []


async def test_killed_from_outside_is_lost_oom_killed_is_failed(world):
    runner, cluster, engine = world
    row = await submit(runner, max_retries=1)
    (cid,) = await until(engine.running)
    engine.code[cid] = 137  # docker kill: SIGKILL, no result
    (cid2,) = await until(lambda: [c for c in engine.running() if c != cid])
    assert runner.view(row)["attempts"][0]["message"].startswith(
        "its program was stopped from outside the hub (exit status 137: SIGKILL")
    engine.report[cid2] = "container c2 exited with code 137 (out of memory)"
    engine.code[cid2] = 137
    await until(lambda: row.state == "failed")
    assert runner.view(row)["attempt"] == 2 and cluster.ledger.allocations() == []


async def test_a_gpu_drained_as_unhealthy_loses_its_job_which_runs_elsewhere(world):
    runner, cluster, engine = world
    row = await submit(runner, max_retries=1)
    (cid,) = await until(engine.running)
    (uuid,) = row.get_json("gpu_uuids")
    cluster.drain_gpu(uuid, "XID 79: fallen off the bus", HEALTH)
    (cid2,) = await until(lambda: [c for c in engine.running() if c != cid])
    assert cid in engine.stopped and uuid not in row.get_json("gpu_uuids")
    assert "drained as unhealthy: XID 79" in runner.view(row)["attempts"][0]["message"]
    engine.finish(cid2)
    await until(lambda: row.state == "completed")


async def test_an_admins_drain_lets_the_job_run_on(world):
    runner, cluster, engine = world
    row = await submit(runner)
    (cid,) = await until(engine.running)
    cluster.drain_gpu(row.get_json("gpu_uuids")[0], "maintenance", "admin")
    await asyncio.sleep(0.2)
    assert engine.running() == [cid] and row.state == "running"
    engine.finish(cid)
    await until(lambda: row.state == "completed")


async def test_a_failed_notebook_is_not_retried(world):
    runner, cluster, engine = world
    row = await submit(runner, max_retries=3)
    (cid,) = await until(engine.running)
    engine.finish(cid, code=1)
    await until(lambda: row.state == "failed")
    assert runner.view(row)["attempt"] == 1 and engine.made == 1


async def test_a_cancel_during_the_back_off_cancels(world):
    runner, cluster, engine = world
    runner.settings.retry_backoff = 30.0
    row = await submit(runner, max_retries=1)
    (cid,) = await until(engine.running)
    del engine.code[cid]
    await until(lambda: row.state == "queued" and "starts in 30 s" in row.message)
    await runner.cancel(row, "ann")
    assert row.state == "cancelled" and cluster.ledger.allocations() == []
    await asyncio.sleep(0.1)
    assert engine.running() == []


async def test_a_job_whose_container_vanished_while_the_hub_was_down_is_retried(world):
    runner, cluster, engine = world
    row = await submit(runner, max_retries=1)
    (cid,) = await until(engine.running)
    await runner.stop()  # the hub stops: the job runs on
    del engine.code[cid]  # ... and its container vanishes meanwhile
    again = JobRunner(runner.settings, runner.store, lambda: cluster, runner.spawner)
    await again.restore()
    (cid2,) = await until(lambda: [c for c in engine.running() if c != cid])
    view = again.view(row)
    assert view["attempt"] == 2 and view["attempts"][0]["state"] == "lost"
    engine.finish(cid2)
    await until(lambda: row.state == "completed")
    assert [a.owner.server for a in cluster.ledger.allocations()] == []


async def test_concurrent_job_limits_per_user_and_per_group(world):
    runner, cluster, engine = world
    for _ in range(3):
        await submit(runner, "bob")
    with pytest.raises(JobRefused) as e:
        await submit(runner, "bob")
    assert e.value.status == 429 and "bob has 3 active jobs" in str(e.value) and \
        "GPUJobs.max_active_jobs_per_user = 3" in str(e.value)
    assert len(runner.store.list("bob")) == 3  # nothing stored
    for _ in range(5):  # a member of big may have 5
        await submit(runner, "cat", groups=["big", "small"])
    with pytest.raises(JobRefused, match=r'max_active_jobs_per_group\["big"\] = 5'):
        await submit(runner, "cat", groups=["big"])
    for _ in range(6):  # 0 = no limit, and it wins over big's 5
        await submit(runner, "dan", groups=["big", "none"])
    await runner.stop()


class SlurmLike(Engine):
    """The same double as a Slurm backend: ``job_id`` in the state (no container), the
    launch spec kept, and a NODE_FAIL the engine itself reports (``failed``)."""

    backend_name = "slurm"

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[Any] = []
        self.failed: dict[str, str] = {}

    @staticmethod
    def _c(state):
        return {**state, "container_id": state.get("job_id")}

    async def launch(self, spec, state, progress):
        self.specs.append(spec)
        await super().launch(spec, state, progress)
        state["job_id"] = state.pop("container_id")
        return "127.0.0.1", 0

    async def poll(self, state):
        return await super().poll(self._c(state))

    async def read_output(self, state, max_bytes):
        return await super().read_output(self._c(state), max_bytes)

    async def exit_report(self, state):
        return await super().exit_report(self._c(state))

    async def stop(self, state, now=False):
        await super().stop(self._c(state), now)

    async def node_failure(self, state):
        return self.failed.get(state.get("job_id"))


@pytest.fixture
def slurm_world(world):
    runner, cluster, _ = world
    engine = SlurmLike()
    engine.bind(cluster.backend.nodes)
    cluster.backend = engine
    return runner, cluster, engine


async def test_on_slurm_a_job_has_its_time_limit_and_a_node_fail_retries_it_elsewhere(
        slurm_world):
    runner, cluster, engine = slurm_world
    row = await submit(runner, max_retries=1)
    (jid,) = await until(engine.running)
    (spec,) = engine.specs
    assert spec.port == 0 and spec.time_limit == row.time_limit == 3600
    assert spec.cmd[:2] == ("python3", "-c")
    assert "log line of c1" in await runner.log_text(row)  # live, from the job's output
    # Slurm ended it NODE_FAIL (an admin set n1 DOWN; it may be back at once): lost, n1
    # marked suspect, and the retry runs on n2
    engine.failed[jid] = "Slurm job 1 ended NODE_FAIL on n1 (Reason=NodeDown)"
    engine.code[jid] = 143
    (jid2,) = await until(lambda: [c for c in engine.running() if c != jid])
    assert engine.where[jid2] == "n2" and row.node == "n2"
    (lost,) = runner.view(row)["attempts"]
    assert lost["state"] == "lost" and "NODE_FAIL on n1" in lost["message"]
    assert cluster.ledger.node_state("n1")[0] == "down"
    engine.finish(jid2)
    await until(lambda: row.state == "completed")
    assert cluster.ledger.allocations() == [] and jid in engine.stopped


async def test_a_job_ended_by_the_backends_own_limit_is_timed_out(slurm_world):
    runner, cluster, engine = slurm_world
    row = await submit(runner, max_retries=1)
    (jid,) = await until(engine.running)
    row.started -= row.time_limit + 5  # the hub was down past its limit: Slurm's --time
    engine.code[jid] = 143
    await until(lambda: row.state == "timed_out")
    assert "ended by the backend's own limit" in row.message
    assert runner.view(row)["attempt"] == 1 and cluster.ledger.allocations() == []


async def test_jobs_are_refused_on_a_backend_that_does_not_run_them(world):
    runner, cluster, engine = world
    engine.backend_name = "kubernetes"
    with pytest.raises(JobRefused) as e:
        await submit(runner)
    assert e.value.status == 503 and "Docker and Slurm backends only" in str(e.value)
    assert runner.store.active() == []


def test_active_jobs_limit_and_bad_settings():
    from traitlets import TraitError

    s = GPUJobs(max_active_jobs_per_user=4, max_active_jobs_per_group={"a": 2, "b": 9})
    assert s.active_jobs_limit([]) == (4, "GPUJobs.max_active_jobs_per_user")
    assert s.active_jobs_limit(["a", "x"]) == (2, 'GPUJobs.max_active_jobs_per_group["a"]')
    assert s.active_jobs_limit(["a", "b"])[0] == 9
    with pytest.raises(TraitError, match=r"max_active_jobs_per_group.a: must be a whole"):
        GPUJobs(max_active_jobs_per_group={"a": -1})
    with pytest.raises(TraitError, match="default_max_retries: must be >= 0"):
        GPUJobs(default_max_retries=-1)


def test_max_retries_of_a_submission():
    assert check_max_retries(None, 3, 10) == 3 and check_max_retries(None, 30, 10) == 10
    assert check_max_retries(0, 3, 10) == 0 and check_max_retries(10, 3, 10) == 10
    for bad, words in [(11, "must be 0 to 10"), (-1, "must be 0 to 10"),
                       (True, "must be a whole"), ("2", "must be a whole"),
                       (1.5, "must be a whole")]:
        with pytest.raises(JobInputError, match=f"max_retries: {words}"):
            check_max_retries(bad, 3, 10)


def test_the_log_is_the_output_without_the_result_frame():
    body = frame({"notebook": None})
    assert strip_result("a\n" + body.decode() + "b\n") == "a\nb\n"
    assert strip_result("a\n" + OUTPUT_BEGIN + "\nabc") == "a\n"  # cut at the end
    assert strip_result("just a log\n") == "just a log\n"


def test_the_html_export_of_an_executed_notebook(tmp_path):
    pytest.importorskip("nbconvert")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('hello <b>')", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="hello <b>\n")])]
    src = tmp_path / "n.ipynb"
    src.write_text(nbformat.writes(nb))
    html = execute.export_html(str(src), str(tmp_path / "n.html"))
    assert html is not None and html.lstrip().lower().startswith("<!doctype html")
    assert "hello &lt;b&gt;" in html and (tmp_path / "n.html").read_text() == html
    assert execute.export_html(str(tmp_path / "missing.ipynb"), str(tmp_path / "x.html")) \
        is None


def test_the_in_job_program_writes_the_html_and_hands_it_back(tmp_path, capfd):
    pytest.importorskip("papermill")
    env = {"HOME": str(tmp_path), "GPUSPAWNER_JOB_OUTPUT_DIR": "jobs/n/1-a",
           "GPUSPAWNER_JOB_NAME": "n", "GPUSPAWNER_JOB_PARAMETERS": json.dumps({"x": 5})}
    from gpuspawner.jobs.model import notebook_env

    env.update(notebook_env(notebook("print(x * 2)"))[0])
    assert execute.run(env) == 0
    out = capfd.readouterr().out
    from gpuspawner.jobs.model import parse_output

    result = parse_output(out.encode())
    folder = tmp_path / "jobs/n/1-a"
    assert "10" in result["html"] and (folder / "n.html").read_text() == result["html"]


def test_the_jobs_metrics_change(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'm.sqlite'}")
    for i, state in enumerate(["completed", "completed", "lost", "running"]):
        row = JobRow(id=f"{i:032x}", user="u", name="n", profile="p", state=state,
                     time_limit=1, notebook=pack({}), created=1.0)
        store.add(row)
    job_metrics.register(store)
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'gpuspawner_jobs{state="completed"} 2.0' in text
    assert 'gpuspawner_jobs{state="waiting"} 0.0' in text
    before = metrics.REGISTRY.get_sample_value("gpuspawner_job_wait_seconds_count",
                                               {"profile": "p"}) or 0
    job_metrics.waited("p", 0.3)
    job_metrics.gpu_seconds("p", 7.5)
    assert metrics.REGISTRY.get_sample_value("gpuspawner_job_wait_seconds_count",
                                             {"profile": "p"}) == before + 1
    assert gpu_seconds("p") >= 7.5
    store.close()
    job_metrics.register(None)  # nothing to count: the gauge is left out, the scrape answers
    assert "gpuspawner_jobs{" not in generate_latest(metrics.REGISTRY).decode()


def test_the_sqlite_jobs_database_writes_ahead_with_its_files_private(tmp_path):
    import stat

    import sqlalchemy

    path = tmp_path / "state" / "jobs.sqlite"
    store = JobStore(f"sqlite:///{path}")
    store.add(JobRow(id="b" * 32, user="u", name="n", profile="p", state="queued",
                     time_limit=1, notebook=pack({}), created=1.0))
    with store.engine.connect() as c:
        assert c.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar() == "wal"
        assert c.execute(sqlalchemy.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert c.execute(sqlalchemy.text("PRAGMA journal_size_limit")).scalar() == 4 * 2**20
    for p in path.parent.iterdir():  # jobs.sqlite, -wal, -shm: the database's mode
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    store.close()
    assert JobStore(f"sqlite:///{path}").get("b" * 32).user == "u"


# -- a job's result is the user's: it must not break the store or the hub's memory -------------
def finish_with(engine: Engine, cid: str, code: int, result: dict[str, Any]) -> None:
    engine.out[cid] += frame(result)
    engine.code[cid] = code


async def test_a_lone_surrogate_in_a_jobs_error_breaks_no_one_elses_jobs(world):
    """A job's error (``ename``, ``evalue``) comes from the job's own output, i.e. its user.
    A lone surrogate there went into the job's message, SQLite refused the write, and the
    one session every request shares raised ``PendingRollbackError`` from then on: no one's
    job could be listed, submitted or ended (their GPUs stayed booked) until a restart."""
    runner, cluster, engine = world
    row = await submit(runner, user="mallory")
    (cid,) = await until(engine.running)
    finish_with(engine, cid, 1, {"notebook": None, "html": None,
                                 "error": {"ename": "\ud800", "evalue": "x" * 5000, "cell": 1}})
    await until(lambda: row.state == "failed")
    assert row.message.startswith("exit status 1; cell 1: ?: xxx") and row.message.endswith("...")
    assert len(row.message) == MAX_MESSAGE_CHARS
    # everyone else's jobs go on: a new one is stored, runs, ends and is released
    other = await submit(runner, user="ann")
    (cid2,) = await until(engine.running)
    engine.finish(cid2)
    await until(lambda: other.state == "completed")
    assert [r.id for r in runner.store.list(user="ann")] == [other.id]
    assert not [a for a in cluster.ledger.allocations() if a.owner.user == "ann"]


def test_a_failed_write_leaves_the_store_usable(tmp_path):
    """Whatever a write fails on, the store rolls back, so the next request is served."""
    store = JobStore(f"sqlite:///{tmp_path / 'j.sqlite'}")
    row = JobRow(id="a" * 32, user="u", name="n", profile="p", state="queued", time_limit=1,
                 notebook=pack({}), created=1.0)
    store.add(row)
    row.error = "\udfff"  # not through set_state: the raw column, which SQLite refuses
    with pytest.raises(UnicodeEncodeError):
        store.save()
    assert [r.id for r in store.list()] == ["a" * 32]
    store.add(JobRow(id="b" * 32, user="v", name="n", profile="p", state="queued",
                     time_limit=1, notebook=pack({}), created=2.0))
    assert len(store.list()) == 2
    store.close()


async def test_a_result_that_expands_past_the_limit_is_not_decompressed(world):
    """A result frame of a few KiB of zlib that expands a thousandfold (a zip bomb) was
    decompressed whole in the hub. Now the hub decompresses at most max_output_bytes: the
    job completes, and its executed notebook stays in the user's home only."""
    runner, cluster, engine = world
    runner.settings.max_output_bytes = 2**20
    row = await submit(runner)
    (cid,) = await until(engine.running)
    bomb = {"notebook": {"cells": [], "pad": "0" * (8 * 2**20)}, "error": None, "html": None}
    finish_with(engine, cid, 0, bomb)
    assert len(engine.out[cid]) < 64 * 2**10  # 8 MiB of JSON in a few KiB
    await until(lambda: row.state == "completed")
    assert "larger than 1048576 bytes uncompressed" in row.message
    assert "stays in the home only" in row.message and row.output is None


def test_parse_output_decompresses_no_more_than_asked():
    small = {"notebook": {"cells": []}, "error": None}
    assert parse_output(frame(small), 100) == small
    with pytest.raises(ResultTooLarge, match="larger than 10 bytes"):
        parse_output(frame(small), 10)
    deep = frame({"x": 1})  # a frame whose JSON nests past the parser's limit is no result
    data = base64.b64encode(zlib.compress(b"[" * 100_000)).decode()
    assert parse_output(f"{OUTPUT_BEGIN}\n{data}\n{OUTPUT_END}\n".encode()) is None
    assert parse_output(deep) == {"x": 1}


async def test_a_users_ended_jobs_past_the_limit_are_deleted(world):
    """Every ended job stayed in the jobs database with its notebook (up to 2 MiB), output,
    log and HTML: a user submitting and cancelling in a loop filled the hub's disk. Now at
    each submission the user's ended jobs past max_kept_jobs_per_user are deleted (the
    newest are kept; active jobs and other users' jobs are not touched)."""
    runner, cluster, engine = world
    runner.settings.max_kept_jobs_per_user = 2
    other = await submit(runner, user="bob")
    ended = []
    for _ in range(4):
        row = await submit(runner)
        await runner.cancel(row, "ann")
        await until(lambda row=row: row.state == "cancelled")
        ended.append(row.id)
    newest = await submit(runner)
    kept = [r.id for r in runner.store.list(user="ann")]
    assert kept == [newest.id, ended[3], ended[2]]
    assert runner.store.get(ended[0]) is None
    assert runner.store.session.get(JobRun, ended[0]) is None
    assert runner.store.get(other.id) is not None
    with pytest.raises(TraitError, match="max_kept_jobs_per_user"):
        GPUJobs(max_kept_jobs_per_user=0)


# -- rights read at each placement (issue 46 item 2) ----------------------------------------
def with_accounts(runner: JobRunner, accounts: dict[str, Account]) -> JobRunner:
    """The runner of ``world`` asking ``accounts`` (the hub's users, changed by the test) for
    its owners' rights, as the hub's runner asks the hub's database."""
    return JobRunner(runner.settings, runner.store, runner._cluster, runner.spawner,
                     account=accounts.get)


async def test_a_queued_job_of_an_owner_who_lost_the_profiles_group_is_cancelled(world):
    """A job kept the groups of its submission: queued with ``at`` on a profile of group
    lab, it ran after its owner left lab (new submissions were refused). Now its placement
    reads the owner's groups now: it ends cancelled, naming why, and nothing is placed."""
    runner, cluster, engine = world
    accounts = {"ann": Account(("lab",), time.time() - 60)}
    runner = with_accounts(runner, accounts)
    row = await runner.submit("ann", ["lab"], JobRequest(
        notebook=notebook("1"), name="n", profile="lab", at=time.time() + 0.3))
    accounts["ann"] = Account((), accounts["ann"].created)  # removed from lab
    await until(lambda: not row.active)
    assert row.state == "cancelled", (row.state, row.message)
    assert "may no longer use it" in row.message and "'lab'" in row.message
    assert engine.made == 0 and cluster.ledger.allocations() == []


async def test_a_retry_reads_the_owners_rights_again(world):
    runner, cluster, engine = world
    accounts = {"ann": Account(("lab",), time.time() - 60)}
    runner = with_accounts(runner, accounts)
    row = await runner.submit("ann", ["lab"], JobRequest(notebook=notebook("1"), name="n",
                                                         profile="lab"), max_retries=2)
    (cid,) = await until(engine.running)
    accounts["ann"] = Account(("other",), accounts["ann"].created)
    del engine.code[cid]  # lost: a retry is due, for an owner no longer in lab
    await until(lambda: not row.active)
    assert row.state == "cancelled" and "may no longer use it" in row.message, row.message
    assert engine.made == 1 and cluster.ledger.allocations() == []


async def test_a_job_of_a_deleted_owner_or_of_a_new_account_of_the_name_never_runs(world):
    """The runner fell back to the stored groups for a user the hub does not know; a new
    account of the same name would have run the old one's jobs. Now both are no rights."""
    runner, cluster, engine = world
    accounts = {"ann": Account((), time.time() - 60), "bob": Account((), time.time() - 60)}
    runner = with_accounts(runner, accounts)
    soon = time.time() + 0.3
    a = await runner.submit("ann", [], JobRequest(notebook=notebook("1"), name="n", at=soon))
    b = await runner.submit("bob", [], JobRequest(notebook=notebook("1"), name="n", at=soon))
    del accounts["ann"]  # deleted
    accounts["bob"] = Account((), time.time() + 5)  # deleted, and a new bob made
    await until(lambda: not a.active and not b.active)
    assert a.state == "cancelled" and "its owner ann no longer exists" in a.message
    assert b.state == "cancelled" and "its owner bob was deleted" in b.message, b.message
    assert engine.made == 0


async def test_the_hubs_groups_are_the_jobs_groups_at_placement(world):
    runner, cluster, engine = world
    accounts = {"ann": Account(("lab", "physics"), time.time() - 60)}
    runner = with_accounts(runner, accounts)
    row = await runner.submit("ann", ["lab", "physics"], JobRequest(
        notebook=notebook("1"), name="n", profile="lab", at=time.time() + 0.3))
    accounts["ann"] = Account(("lab",), accounts["ann"].created)  # left physics only
    await until(engine.running)
    assert row.state == "running" and row.get_json("groups") == ["lab"]
    (alloc,) = cluster.ledger.allocations()
    assert alloc.owner.groups == ("lab",)


# -- jobs storage bounded in bytes (issue 46 item 7) ------------------------------------------
async def test_a_users_ended_jobs_are_kept_within_a_byte_budget_oldest_deleted_first(world):
    """Kept jobs were bounded by count only: jobs printing megabytes (4 MiB of log kept per
    attempt) grew the jobs database by tens of MB for two jobs. Now the ended jobs of a user
    hold at most c.GPUJobs.max_kept_bytes_per_user (their snapshots, executed notebooks, logs
    and HTML exports as stored): when a job ends, the oldest ended ones are deleted first;
    the newest ended job, active jobs and other users' jobs stay."""
    import os

    runner, cluster, engine = world
    budget = 1_000_000
    runner.settings.max_kept_bytes_per_user = budget
    assert GPUJobs().max_kept_bytes_per_user == 256 * 2**20
    other = await submit(runner, user="bob")  # active, another user's
    (bob_cid,) = await until(engine.running)
    ended = []
    for _ in range(6):
        row = await submit(runner)
        (cid,) = await until(lambda: [c for c in engine.running() if c != bob_cid])
        # 400 KB of incompressible log: about 300 KB stored
        engine.out[cid] += base64.b64encode(os.urandom(300_000)) + b"\n"
        engine.finish(cid)
        await until(lambda row=row: row.state == "completed")
        ended.append(row.id)
        sizes = runner.store.kept_sizes("ann")
        assert sizes[0][0] == row.id  # the newest is kept
        assert sum(n for _, n in sizes) <= budget, sizes
    kept = [i for i, _ in runner.store.kept_sizes("ann")]
    assert kept == ended[::-1][:len(kept)] and 2 <= len(kept) < 6, kept  # oldest went first
    assert runner.store.get(ended[0]) is None
    assert runner.store.session.get(JobRun, ended[0]) is None
    assert runner.store.get(other.id).state == "running"
    with pytest.raises(TraitError, match="max_kept_bytes_per_user"):
        GPUJobs(max_kept_bytes_per_user=0)
