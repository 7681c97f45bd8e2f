"""Usage records (gpuspawner.usage) on a real ledger and a real SQLite file, no hub: a booking
opens one record with the bundle's devices and sizes, a release closes it; a restarted hub
continues the records of what still runs, closes the others with ``closed_at_restart`` and
opens one again when its server comes back; the retention deletes old ended records only; a
probe that is released at once leaves no record; a failing database never refuses a booking;
the schema alembic makes is the model's; ``c.GPUUsage.retention_days`` is checked at hub start.
Reports: clipping to the range, grouping, days of a DST change, CSV (parsed back, formulas
neutralised), bad input naming the field, and ``gpuspawner usage``."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import stat
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpuspawner.cli import main as cli_main
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.usage.recorder import UsageRecorder
from gpuspawner.usage.report import (
    ReportError,
    build_report,
    parse_query,
    parse_time,
    to_csv,
)
from gpuspawner.usage.store import UsageStore

TOPO = Path(__file__).parent / "data" / "topologies"
GiB = 2**30
T0 = 1_790_000_000.0  # 2026-09-21, a fixed clock


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def dgx_ledger(clock: Clock) -> Ledger:
    return Ledger(
        [load_topology_file(str(TOPO / "dgx-a100.yaml"))], policy="first-fit", clock=clock
    )


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'usage.sqlite'}"


def recorder_on(db: str, ledger: Ledger, clock: Clock, **kw) -> UsageRecorder:
    r = UsageRecorder(UsageStore(db), ledger, clock=clock, **kw)
    r.attach(ledger)
    return r


def test_a_booking_opens_one_record_and_its_release_closes_it(db, tmp_path):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock, profile_of=lambda a: "a100-2")
    alloc = ledger.reserve(
        Bundle(cores=4, memory_bytes=8 * GiB, gpus=2, gpu_models=("A100",), disk_bytes=10 * GiB),
        Owner("ann", "work", ("lab", "ai")),
    )
    [row] = rec.store.records()
    assert row.ended is None and row.allocation_id == alloc.id
    assert (row.user, row.kind, row.name, row.profile, row.node) == (
        "ann",
        "server",
        "work",
        "a100-2",
        alloc.node,
    )
    assert row.group_list == ["ai", "lab"]
    assert row.uuid_list == alloc.gpu_uuids and len(row.uuid_list) == 2
    assert (row.gpu_model, row.gpu_milli, row.cpu_milli) == ("A100", 2000, 4000)
    assert (row.memory_bytes, row.disk_bytes, row.started) == (8 * GiB, 10 * GiB, T0)
    clock.t = T0 + 3600
    ledger.release(alloc.id)
    row = rec.store.get(row.id)
    assert row.ended == T0 + 3600 and not row.closed_at_restart
    assert rec.open_ids == {}
    # the file is the hub's: 0600 in a 0700 folder
    path = tmp_path / "state" / "usage.sqlite"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_a_job_is_recorded_as_a_job_by_its_id(db):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann", "job/" + "a" * 32))
    [row] = rec.store.records()
    assert (row.kind, row.name, row.gpu_model, row.gpu_milli, row.uuid_list) == (
        "job",
        "a" * 32,
        "",
        0,
        [],
    )


def test_a_restarted_hub_continues_what_runs_and_closes_what_ended(db):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    bundle = Bundle(cores=2, memory_bytes=GiB, gpus=1, gpu_models=("A100",))
    running = ledger.reserve(bundle, Owner("ann", ""))
    ended = ledger.reserve(bundle, Owner("bob", ""))
    late = ledger.reserve(bundle, Owner("cy", ""))
    ids = {a.owner.user: rec.open_ids[a.id] for a in (running, ended, late)}
    # the hub stops (nothing released); a new process starts an hour later
    clock.t = T0 + 3600
    ledger2 = dgx_ledger(clock)
    rec2 = recorder_on(db, ledger2, clock)
    assert set(rec2.open_ids) == {running.id, ended.id, late.id}
    # the backend finds ann's server (bob's ended meanwhile, cy's node does not answer yet)
    report = ledger2.restore([running.to_dict()])
    assert report.restored == [running.id]
    assert sorted(rec2.reconcile(report)) == sorted([ids["bob"], ids["cy"]])
    rows = {r.user: r for r in rec2.store.records()}
    assert len(rows) == 3, "an adopted server continues its interval: no second record"
    assert rows["ann"].id == ids["ann"] and rows["ann"].ended is None
    assert rows["ann"].started == T0
    assert rows["bob"].ended == T0 + 3600 and rows["bob"].closed_at_restart
    # cy's node answers: its poll books the allocation from its state again
    clock.t = T0 + 3700
    ledger2.restore([late.to_dict()])
    cy = rec2.store.get(ids["cy"])
    assert cy.ended is None and not cy.closed_at_restart
    clock.t = T0 + 7200
    ledger2.release(late.id)
    ledger2.release(running.id)
    rows = {r.user: r for r in rec2.store.records()}
    assert rows["cy"].ended == T0 + 7200 and rows["ann"].ended == T0 + 7200
    assert len(rows) == 3


def test_a_record_lost_in_a_crash_comes_back_from_the_labels(db):
    """The allocation a running server's labels carry has its booking time: an interval
    whose write was lost starts there all the same."""
    clock = Clock()
    ledger = dgx_ledger(clock)
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("ann"))
    clock.t = T0 + 600
    ledger2 = dgx_ledger(clock)
    rec = recorder_on(db, ledger2, clock)
    ledger2.restore([alloc.to_dict()])
    [row] = rec.store.records()
    assert row.started == T0 and row.ended is None and row.uuid_list == alloc.gpu_uuids


def test_retention_deletes_old_ended_records_only(db):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock, retention_days=30)
    old = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann", "old"))
    still = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann", "still"))
    clock.t = T0 + 86400
    ledger.release(old.id)
    clock.t = T0 + 20 * 86400
    recent = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann", "recent"))
    ledger.release(recent.id)
    clock.t = T0 + 40 * 86400
    assert rec.prune() == 1
    names = sorted(r.name for r in rec.store.records())
    assert names == ["recent", "still"]  # an open record is kept however old
    assert rec.store.get(rec.open_ids[still.id]).ended is None


def test_a_probe_and_an_adopt_write_what_they_should(db):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    probe = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("ann"), notify=False)
    ledger.release(probe.id, notify=False)
    assert rec.store.records() == []
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("ann"))
    free = next(g.uuid for g in ledger.node(alloc.node).gpus if g.uuid not in alloc.gpu_uuids)
    ledger.adopt(alloc.id, gpus=[free])
    [row] = rec.store.records()
    assert row.uuid_list == [free] and row.ended is None


def test_a_failing_database_never_refuses_a_booking(db, caplog):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    import sqlalchemy

    with rec.store.engine.begin() as c:  # (root ignores file modes: the table goes instead)
        c.execute(sqlalchemy.text("DROP TABLE gpuspawner_usage"))
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann"))
    assert ledger.get(alloc.id) is not None
    assert rec.store.wait_written(30)  # (the insert failed in the store's writer thread)
    assert f"usage record of allocation {alloc.id} (book of ann/) not written" in caplog.text


def test_the_migrated_schema_is_the_model(db):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from gpuspawner.usage.store import VERSION_TABLE, Base

    store = UsageStore(db)
    assert store.revision == "0001"
    with store.engine.connect() as c:
        ctx = MigrationContext.configure(c, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff
    assert UsageStore(db, upgrade=False).revision == "0001"


def test_an_unknown_revision_is_refused(db):
    import sqlalchemy

    from gpuspawner.usage.store import UsageStoreError

    UsageStore(db).close_store()
    engine = sqlalchemy.create_engine(db)
    with engine.begin() as c:
        c.execute(
            sqlalchemy.text("UPDATE gpuspawner_usage_alembic_version SET version_num = '9999'")
        )
    with pytest.raises(UsageStoreError, match="9999"):
        UsageStore(db)


@pytest.mark.parametrize("value", [0, -3])
def test_retention_days_below_one_stops_the_hub(tmp_path, value):
    from traitlets.config import Config

    from gpuspawner.hub.cluster import reset_clusters
    from gpuspawner.hub.config_check import _check_and_build
    from gpuspawner.testing.inprocess import fake_node

    c = Config()
    c.GPUSpawner.nodes = [fake_node(tmp_path, "n1")]
    c.GPUSpawner.state_dir = str(tmp_path / "state")
    c.GPUUsage.retention_days = value
    reset_clusters()
    try:
        with pytest.raises(SystemExit, match=r"GPUUsage\.retention_days: must be"):
            _check_and_build(c, usage=True)
    finally:
        reset_clusters()


# -- reports ---------------------------------------------------------------------------------
def _record(store: UsageStore, user: str, start: float, end: float | None, **kw) -> int:
    fields = {
        "allocation_id": f"{user}-{start}",
        "user": user,
        "groups": kw.pop("groups", []),
        "kind": "server",
        "name": kw.pop("name", ""),
        "profile": kw.pop("profile", "p"),
        "node": kw.pop("node", "n1"),
        "gpu_uuids": [],
        "gpu_model": kw.pop("model", ""),
        "gpu_milli": kw.pop("gpu_milli", 0),
        "cpu_milli": kw.pop("cpu_milli", 1000),
        "memory_bytes": GiB,
        "disk_bytes": 0,
        "started": start,
    }
    rid = store.open(fields)
    if end is not None:
        store.close(rid, end, used=kw)
    return rid


def test_report_clips_groups_and_measures_efficiency(db):
    store = UsageStore(db)
    day = parse_time("2026-11-02", "from")
    # ann: 2 GPUs for 10 h at 25 %, 8 cores with 20 core-hours used; bob: CPU only, open
    _record(
        store,
        "ann",
        day,
        day + 36000,
        groups=["lab"],
        gpu_milli=2000,
        cpu_milli=8000,
        model="A100",
        gpu_util_percent=25.0,
        cpu_seconds=20 * 3600.0,
    )
    _record(store, "bob", day + 3600, None, groups=["lab", "ops"], cpu_milli=2000)
    # half of ann's interval lies before the range
    q = parse_query({"from": "2026-11-02T05:00", "to": "2026-11-03", "group_by": "user"})
    r = build_report(store.records(q.start, q.end), q, now=day + 7 * 3600)
    rows = {row["user"]: row for row in r["rows"]}
    assert rows["ann"]["gpu_hours"] == pytest.approx(2 * 5)
    assert rows["ann"]["core_hours"] == pytest.approx(8 * 5)
    assert rows["ann"]["gpu_efficiency_percent"] == pytest.approx(25.0)
    assert rows["ann"]["cpu_used_hours"] == pytest.approx(10.0)  # half of 20
    assert rows["ann"]["cpu_efficiency_percent"] == pytest.approx(25.0)
    assert rows["bob"]["core_hours"] == pytest.approx(2 * 2)  # 05:00..07:00 (now)
    assert rows["bob"]["gpu_efficiency_percent"] is None
    by_group = build_report(
        store.records(q.start, q.end),
        parse_query({**{"from": "2026-11-02T05:00", "to": "2026-11-03"}, "group_by": "group"}),
        now=day + 7 * 3600,
    )
    groups = {row["group"]: row for row in by_group["rows"]}
    assert groups["lab"]["intervals"] == 2 and groups["ops"]["intervals"] == 1
    assert by_group["totals"]["intervals"] == 2


def test_days_of_a_dst_change_have_their_true_length(db):
    store = UsageStore(db)
    # Europe/Berlin leaves summer time on 2026-10-25: that day has 25 hours
    zone = "Europe/Berlin"
    start = parse_time("2026-10-24T12:00", "from", ZoneInfo(zone))
    q = parse_query({"from": "2026-10-24", "to": "2026-10-27", "group_by": "day", "tz": zone})
    _record(store, "ann", start, start + 60 * 3600, cpu_milli=1000)
    r = build_report(store.records(q.start, q.end), q, now=start + 100 * 3600)
    hours = {row["day"]: row["core_hours"] for row in r["rows"]}
    assert hours == {
        "2026-10-24": pytest.approx(12),
        "2026-10-25": pytest.approx(25),
        "2026-10-26": pytest.approx(23),
    }
    assert r["from"] == "2026-10-24T00:00:00+02:00"


def test_csv_parses_back_and_neutralises_formulas(db):
    store = UsageStore(db)
    day = parse_time("2026-11-02", "from")
    _record(store, "ann", day, day + 3600, name='=HYPERLINK("http://x")', gpu_milli=500)
    q = parse_query({"from": "2026-11-01", "to": "2026-11-30"})
    text = to_csv(build_report(store.records(q.start, q.end), q))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 1
    assert rows[0]["user"] == "ann" and float(rows[0]["gpu_hours"]) == pytest.approx(0.5)
    assert rows[0]["name"].startswith("'=")
    grouped = to_csv(
        build_report(
            store.records(q.start, q.end),
            parse_query({"from": "2026-11-01", "group_by": "profile,day"}, now=day + 7200),
        )
    )
    [row] = list(csv.DictReader(io.StringIO(grouped)))
    assert (row["profile"], row["day"], row["intervals"]) == ("p", "2026-11-02", "1")


@pytest.mark.parametrize(
    "args, field",
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"from": "2026-11-02", "to": "2026-11-01"}, "to"),
        ({"group_by": "user,colour"}, "group_by"),
        ({"tz": "Mars/Olympus"}, "tz"),
        ({"tz": "../../../etc/passwd"}, "tz"),  # never a path
        ({"from": "2020-01-01"}, "from"),  # before the retention
    ],
)
def test_bad_queries_name_the_field(args, field):
    with pytest.raises(ReportError) as e:
        parse_query(args, now=T0, retention_days=30)
    assert e.value.field == field and str(e.value).startswith(field + ": ")


def test_the_cli_reads_the_database(db, capsys):
    store = UsageStore(db)
    day = parse_time("2026-11-02", "from")
    _record(store, "ann", day, day + 7200, gpu_milli=1000, groups=["lab"])
    _record(store, "bob", day, day + 3600, gpu_milli=2000, groups=["lab"])
    path = db.removeprefix("sqlite:///")
    base = ["usage", "--db", path, "--from", "2026-11-01", "--to", "2026-12-01"]
    assert cli_main([*base, "--group-by", "user", "--format", "csv"]) == 0
    rows = {r["user"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert float(rows["ann"]["gpu_hours"]) == pytest.approx(2.0)
    assert float(rows["bob"]["gpu_hours"]) == pytest.approx(2.0)
    assert cli_main([*base, "--user", "bob", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["user"] for r in doc["rows"]] == ["bob"]
    assert cli_main([*base, "--group-by", "group"]) == 0
    assert "lab" in capsys.readouterr().out
    assert cli_main([*base, "--group-by", "colour"]) == 2
    assert "--group-by: unknown key" in capsys.readouterr().err
    assert cli_main(["usage", "--db", str(Path(path).parent / "none.sqlite")]) == 1


# -- used figures ------------------------------------------------------------------------------
def test_gpu_readings_give_each_interval_its_mean_and_peak(db, tmp_path):
    """The sampler reads the held GPUs of this host through NVML (the double: utilisation and
    memory per GPU index) and each interval gets its GPUs' mean utilisation and peak memory."""
    from gpuspawner.testing import nvml_double as nd
    from gpuspawner.testing.inprocess import fake_node
    from gpuspawner.testing.nvml_metrics import MetricsNVML
    from gpuspawner.usage.sampler import GPUSampler

    clock = Clock()
    node = load_topology_file(fake_node(tmp_path, "n1", gpus=2)["topology"])
    ledger = Ledger([node], policy="first-fit", clock=clock)
    rec = recorder_on(db, ledger, clock)
    nvml = MetricsNVML(
        [nd.FakeGPU("GPU-n1-0"), nd.FakeGPU("GPU-n1-1", pci_bus_id="00:08.0")],
        util={0: 20, 1: 90},
        used={0: 3 * GiB, 1: 50 * GiB},
    )
    sampler = GPUSampler(rec, lambda: {"GPU-n1-0", "GPU-n1-1"}, nvml=nvml)
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("ann"))
    assert alloc.gpu_uuids == ["GPU-n1-0"]
    assert sampler.sample_once() == 1  # GPU 1 is held by no one: not read
    nvml.util[0], nvml.used[0] = 60, 7 * GiB
    assert sampler.sample_once() == 1
    nvml.used[0] = 1 * GiB
    sampler.sample_once()
    clock.t += 60
    ledger.release(alloc.id)
    [row] = rec.store.records()
    assert row.gpu_util_percent == pytest.approx((20 + 60 + 60) / 3, abs=1e-3)
    assert row.gpu_mem_peak_bytes == 7 * GiB
    assert json.loads(row.gpu_used) == {
        "GPU-n1-0": {
            "util_percent": pytest.approx(46.667, abs=1e-3),
            "mem_peak_bytes": 7 * GiB,
            "samples": 3,
        }
    }
    # a GPU this host's NVML does not own (a remote node's) is never attributed
    other = GPUSampler(rec, lambda: set(), nvml=nvml)
    ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("bob"))
    assert other.sample_once() == 0


def test_figures_so_far_survive_a_restart(db):
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    alloc = ledger.reserve(Bundle(cores=2, memory_bytes=GiB, gpus=1), Owner("ann"))
    uuid = alloc.gpu_uuids[0]
    rec.add_gpu_sample(uuid, 30.0, 5 * GiB)
    rec.set_cpu_seconds(alloc.id, 100.0)
    assert rec.flush_used() == 1
    # a new hub process continues the interval and its figures
    ledger2 = dgx_ledger(clock)
    rec2 = recorder_on(db, ledger2, clock)
    ledger2.restore([alloc.to_dict()])
    rec2.add_gpu_sample(uuid, 50.0, 2 * GiB)
    rec2.set_cpu_seconds(alloc.id, 160.0)
    ledger2.release(alloc.id)
    [row] = rec2.store.records()
    assert row.gpu_util_percent == pytest.approx(40.0)
    assert (row.gpu_mem_peak_bytes, row.cpu_seconds) == (5 * GiB, 160.0)


@pytest.mark.docker
async def test_cpu_seconds_come_from_the_docker_engine(db, tmp_path):
    """A running container with this hub's labels: the backend reads its cgroup's CPU time
    from the engine's stats, and the interval of its allocation gets it."""
    import uuid
    from types import SimpleNamespace

    docker = pytest.importorskip("docker")
    from gpuspawner.backends.docker_backend import DockerBackend
    from gpuspawner.backends.spec import ALLOCATION_LABEL, HUB_LABEL, MANAGED_LABEL
    from gpuspawner.usage.sampler import read_cpu

    try:
        engine = docker.APIClient(version="auto")
        engine.inspect_image("gpuspawner/singleuser:latest")
    except Exception as e:
        pytest.skip(f"needs the Docker engine and the single-user image: {e}")
    clock = Clock()
    ledger = dgx_ledger(clock)
    rec = recorder_on(db, ledger, clock)
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=GiB), Owner("ann"))
    hub = f"usage-cpu-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend()
    backend.hub_id = hub
    backend.bind({"local": SimpleNamespace(docker_url="", network_pool="")})
    cid = engine.create_container(
        "gpuspawner/singleuser:latest",
        ["sh", "-c", "while :; do :; done"],
        name=f"{hub}-busy",
        labels={MANAGED_LABEL: "1", HUB_LABEL: hub, ALLOCATION_LABEL: json.dumps({"id": alloc.id})},
        host_config=engine.create_host_config(network_mode="none"),
    )["Id"]
    try:
        engine.start(cid)
        figures = await backend.cpu_seconds()
        assert set(figures) == {alloc.id}
        # (a second of a busy loop: at least 0.3 CPU seconds, read by the engine)
        deadline = asyncio.get_running_loop().time() + 30
        while (await backend.cpu_seconds()).get(alloc.id, 0.0) < 0.3:
            assert asyncio.get_running_loop().time() < deadline, "no CPU time in 30 s"
            await asyncio.sleep(0.2)
        assert await read_cpu(rec, backend) == 1
        ledger.release(alloc.id)
        [row] = rec.store.records()
        assert row.cpu_seconds >= 0.3
    finally:
        engine.remove_container(cid, force=True)


async def test_a_hub_restart_through_the_cluster_closes_only_what_ended(tmp_path):
    """attach_usage on a cluster (as the hub's start does): its restore from the backend
    (the servers it finds running) continues their records, and the hook after the restore
    closes the others with closed_at_restart."""
    from traitlets.config import Config

    from gpuspawner.backends.base import Backend, Managed
    from gpuspawner.hub.cluster import Cluster
    from gpuspawner.usage.hub import attach_usage

    class Running(Backend):
        found: list[Managed] = []

        async def list_managed(self) -> list[Managed]:
            return list(self.found)

    c = Config()
    c.GPUUsage.sample_interval = 0
    state = str(tmp_path / "state")
    clock = Clock()
    ledger = dgx_ledger(clock)
    cluster = Cluster({n.name: None for n in ledger.nodes}, ledger, Running())  # type: ignore
    rec = attach_usage(cluster, c, state_dir=state)
    assert rec is not None and cluster.usage is rec
    bundle = Bundle(cores=1, memory_bytes=GiB, gpus=1)
    kept = ledger.reserve(bundle, Owner("ann"))
    gone = ledger.reserve(bundle, Owner("bob"))
    ids = dict(rec.open_ids)
    # a new hub process: a new ledger and cluster on the same state folder
    ledger2 = dgx_ledger(clock)
    backend = Running()
    backend.found = [Managed(kept.node, kept.to_json(), "c1")]
    cluster2 = Cluster({n.name: None for n in ledger2.nodes}, ledger2, backend)  # type: ignore
    rec2 = attach_usage(cluster2, c, state_dir=state)
    assert set(rec2.open_ids) == {kept.id, gone.id}
    await cluster2.ensure_restored()
    assert set(rec2.open_ids) == {kept.id}
    assert rec2.store.get(ids[kept.id]).ended is None
    closed = rec2.store.get(ids[gone.id])
    assert closed.ended is not None and closed.closed_at_restart
    assert len(rec2.store.records()) == 2
    assert (Path(state) / "gpuspawner-usage.sqlite").exists()


@pytest.mark.parametrize(
    "group_by", ["user", "group", "profile,node", "gpu_model,group", "user,profile,group"]
)
def test_the_database_adds_up_as_the_records_do(db, group_by):
    """report_from_store grouped by columns adds up in SQL; it equals build_report over
    the same records (clipping, open records, figures, groups expanded, totals once)."""
    import random

    from gpuspawner.usage.report import report_from_store

    store = UsageStore(db)
    rng = random.Random(group_by)
    now = parse_time("2026-11-20", "to")
    for _ in range(300):
        start = now - rng.random() * 60 * 86400
        end = None if rng.random() < 0.1 else min(now, start + rng.random() * 3 * 86400)
        used = {}
        if rng.random() < 0.6:
            used["gpu_util_percent"] = rng.random() * 100
            used["gpu_mem_peak_bytes"] = rng.randrange(1, 80) * GiB
        if rng.random() < 0.6:
            used["cpu_seconds"] = rng.random() * 36000
        _record(
            store,
            f"u{rng.randrange(5)}",
            start,
            end,
            groups=rng.choice([[], ["lab"], ["lab", "ops"], ["ai"]]),
            profile=rng.choice(["cpu", "a100-1"]),
            node=rng.choice(["n1", "n2"]),
            model=rng.choice(["", "A100"]),
            gpu_milli=rng.choice([0, 500, 1000, 2000]),
            cpu_milli=rng.choice([0, 1000, 4000]),
            **used,
        )
    q = parse_query({"from": "2026-10-15", "to": "2026-11-25", "group_by": group_by}, now=now)
    by_sql = report_from_store(store, q, now)
    by_rows = build_report(store.rows(q.start, q.end), q, now)
    assert [tuple(r[k] for k in q.group_by) for r in by_sql["rows"]] == [
        tuple(r[k] for k in q.group_by) for r in by_rows["rows"]
    ]
    for a, b in zip(
        [*by_sql["rows"], by_sql["totals"]], [*by_rows["rows"], by_rows["totals"]], strict=True
    ):
        for k in a:
            if isinstance(b[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-5), (k, a, b)
            else:
                assert a[k] == b[k], (k, a, b)
    assert by_sql["totals"]["intervals"] > 50


async def test_a_job_and_its_retry_leave_one_record_per_attempt(tmp_path):
    """The job runner on a backend double (tests/test_jobs_runner.py's world): a job lost on
    n1 and retried on n2 leaves two records of kind job, named by the job's id, with its
    profile, each closed when its attempt released its bundle."""
    from traitlets.config import Config

    from gpuspawner.usage.hub import attach_usage
    from tests import test_jobs_runner as jr

    gen = jr.world.__wrapped__(tmp_path)  # the fixture's generator, called here
    runner, cluster, engine = next(gen)
    try:
        c = Config()
        c.GPUUsage.sample_interval = 0
        rec = attach_usage(cluster, c, state_dir=str(tmp_path / "state"))
        row = await jr.submit(runner, max_retries=1)
        await jr.until(engine.running)
        [open_one] = rec.store.records()
        assert (open_one.kind, open_one.name, open_one.profile, open_one.node) == (
            "job",
            row.id,
            "g1",
            "n1",
        )
        assert open_one.gpu_milli == 1000 and open_one.ended is None
        engine.down.add("n1")
        second = await jr.until(lambda: [x for x in engine.running() if engine.where[x] == "n2"])
        engine.finish(second[0])
        await jr.until(lambda: row.state == "completed")
        rows = rec.store.records()
        assert [(r.kind, r.name, r.profile, r.node) for r in rows] == [
            ("job", row.id, "g1", "n1"),
            ("job", row.id, "g1", "n2"),
        ]
        assert all(r.ended is not None and not r.closed_at_restart for r in rows)
    finally:
        gen.close()


def test_a_database_that_does_not_open_stops_the_hub_without_its_password(tmp_path):
    from traitlets.config import Config

    from gpuspawner.hub.cluster import reset_clusters
    from gpuspawner.hub.config_check import _check_and_build
    from gpuspawner.testing.inprocess import fake_node

    c = Config()
    c.GPUSpawner.nodes = [fake_node(tmp_path, "n1")]
    c.GPUSpawner.state_dir = str(tmp_path / "state")
    # (loopback port 1: nothing listens; or no driver installed: either way it does not open)
    c.GPUUsage.db_url = "postgresql://acct:s3cr3t-pw@127.0.0.1:1/usage"
    reset_clusters()
    try:
        with pytest.raises(SystemExit) as e:
            _check_and_build(c, usage=True)
    finally:
        reset_clusters()
    text = str(e.value)
    assert "GPUUsage.db_url: postgresql://acct:***@127.0.0.1:1/usage" in text
    assert "s3cr3t-pw" not in text
