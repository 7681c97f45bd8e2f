"""The usage store's writer thread (gpuspawner.usage.store.UsageStore.write_behind), on a real
SQLite file and a real ledger, no hub: a booking and a release on the event loop commit in the
store's writer thread (the threads SQLAlchemy's commit runs in), the booking returns before
its commit; writes run in the order given; a read waits for the writes given before it;
``close_store`` and the end of the process finish the queued writes; a failed write is logged
with its record and the writes after it still run. The metrics: the usage counters (every open
record) are counted in the scrape's worker thread, not on the event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import event

from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.usage.recorder import UsageRecorder
from gpuspawner.usage.store import UsageStore

REPO = Path(__file__).resolve().parents[1]
TOPO = REPO / "tests" / "data" / "topologies"
GiB = 2**30
T0 = 1_790_000_000.0
BUNDLE = Bundle(cores=1, memory_bytes=GiB, gpus=1)


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'usage.sqlite'}"


def ledger_and_recorder(db: str) -> tuple[Ledger, UsageRecorder]:
    ledger = Ledger([load_topology_file(str(TOPO / "dgx-a100.yaml"))], policy="first-fit",
                    clock=lambda: T0)
    rec = UsageRecorder(UsageStore(db), ledger, clock=lambda: T0)
    rec.attach(ledger)
    return ledger, rec


def commit_threads(store: UsageStore, gate: threading.Event | None = None) -> list[int]:
    """The threads SQLAlchemy commits in, in order (each commit waits for ``gate`` first,
    at most 5 s, when given)."""
    threads: list[int] = []

    def on_commit(conn: object) -> None:
        if gate is not None:
            gate.wait(5)
        threads.append(threading.get_ident())

    event.listen(store.engine, "commit", on_commit)
    return threads


async def test_a_booking_on_the_loop_commits_in_the_writer_thread(db):
    ledger, rec = ledger_and_recorder(db)
    gate = threading.Event()
    threads = commit_threads(rec.store, gate)
    loop_thread = threading.get_ident()
    alloc = ledger.reserve(BUNDLE, Owner("ann", "work"))
    assert threads == [], "the booking waited for its commit"
    gate.set()
    ledger.release(alloc.id)
    [row] = rec.store.records()  # a read: waits for the insert and the update
    assert row.allocation_id == alloc.id and row.ended == T0
    # (the insert, the hourly deletion of old records the first booking queues, the update)
    assert len(threads) == 3 and loop_thread not in threads
    assert len(set(threads)) == 1  # one writer thread, the store's
    rec.store.close_store()


def test_writes_run_in_the_order_given_in_one_thread(db):
    store = UsageStore(db)
    ran: list[tuple[int, int]] = []
    first = threading.Event()
    store.write_behind(first.wait, 5)  # the others queue up behind it
    futures = [store.write_behind(lambda i=i: ran.append((i, threading.get_ident())))
               for i in range(200)]
    first.set()
    assert store.wait_written(30)
    assert [i for i, _ in ran] == list(range(200))
    assert len({t for _, t in ran}) == 1 and threading.get_ident() not in {t for _, t in ran}
    assert all(f.done() for f in futures)
    store.close_store()


def test_a_booking_and_its_release_are_written_in_order(db):
    """Ten servers booked and released in turn, their writes queued: every record is closed
    at its release (an update queued before its insert would have found nothing)."""
    ledger, rec = ledger_and_recorder(db)
    gate = threading.Event()
    rec.store.write_behind(gate.wait, 5)
    for i in range(10):
        ledger.release(ledger.reserve(BUNDLE, Owner(f"u{i}")).id)
    assert rec.open_count() == 0
    gate.set()
    rows = rec.store.records()
    assert [r.user for r in rows] == [f"u{i}" for i in range(10)]
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert all(r.ended == T0 for r in rows)
    rec.store.close_store()


def test_a_read_sees_the_writes_given_before_it(db):
    ledger, rec = ledger_and_recorder(db)
    gate = threading.Event()
    rec.store.write_behind(gate.wait, 5)  # the writer is busy: the booking's insert waits
    alloc = ledger.reserve(BUNDLE, Owner("ann"))
    assert rec.is_open(alloc.id) and rec.open_count() == 1
    opener = threading.Timer(0.2, gate.set)
    opener.start()
    [row] = rec.store.records()
    assert row.allocation_id == alloc.id
    assert rec.open_ids == {alloc.id: row.id}
    assert rec.store.get(row.id).ended is None
    opener.join()
    rec.store.close_store()


def test_close_store_finishes_the_queued_writes(db):
    ledger, rec = ledger_and_recorder(db)
    gate = threading.Event()
    rec.store.write_behind(gate.wait, 5)
    allocs = [ledger.reserve(BUNDLE, Owner(f"u{i}")) for i in range(5)]
    ledger.release(allocs[0].id)
    opener = threading.Timer(0.2, gate.set)
    opener.start()
    rec.store.close_store()
    opener.join()
    rows = {r.user: r for r in UsageStore(db).records()}
    assert sorted(rows) == [f"u{i}" for i in range(5)]
    assert rows["u0"].ended == T0 and all(rows[f"u{i}"].ended is None for i in range(1, 5))
    # a write given after the close runs at once, in the caller's thread
    threads = commit_threads(rec.store)
    ledger.release(allocs[1].id)
    assert threads == [threading.get_ident()]


def test_the_end_of_the_process_finishes_the_queued_writes(db):
    """A process (as the hub, after its cleanup) ends with writes still queued behind a slow
    one, without close_store: the interpreter's exit lets the writer finish them."""
    script = f"""
import threading
from gpuspawner.usage.store import UsageStore
store = UsageStore({db!r})
store.write_behind(threading.Event().wait, 0.3)
for i in range(20):
    store.write_behind(store.open, {{"allocation_id": f"a{{i}}", "user": f"u{{i}}",
                                     "kind": "server", "name": "", "node": "n",
                                     "started": 1.0}})
print("queued", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "queued"
    assert len(UsageStore(db).records()) == 20


def test_a_failed_write_is_logged_with_its_record_and_the_next_ones_run(db, caplog):
    ledger, rec = ledger_and_recorder(db)
    alloc = ledger.reserve(BUNDLE, Owner("ann", "work"))

    def broken(record_id: int, note: str) -> None:
        raise RuntimeError("disk full")

    failed = rec.store.write_behind(broken, 42, "the note", what="usage record 42 of ann")
    ledger.release(alloc.id)
    assert rec.store.wait_written(30)
    assert isinstance(failed.exception(), RuntimeError)
    assert "usage record 42 of ann not written (broken(42, 'the note'))" in caplog.text
    assert "disk full" in caplog.text
    [row] = rec.store.records()
    assert row.ended == T0  # the release, queued after the failure, was written
    rec.store.close_store()


def test_a_booking_whose_insert_failed_is_logged_and_its_release_too(db, caplog):
    ledger, rec = ledger_and_recorder(db)
    with rec.store.engine.begin() as c:
        c.exec_driver_sql("DROP TABLE gpuspawner_usage")
    alloc = ledger.reserve(BUNDLE, Owner("ann", "work"))
    ledger.release(alloc.id)
    assert ledger.get(alloc.id) is None and rec.open_count() == 0
    assert rec.store.wait_written(30)
    assert f"usage record of allocation {alloc.id} (book of ann/work) not written" in caplog.text
    assert f"usage record of allocation {alloc.id} (release of ann/work) not written" \
        in caplog.text
    assert "'user': 'ann'" in caplog.text  # the record's fields, to enter it by hand
    rec.store.close_store()


async def test_the_usage_counters_count_in_the_scrapes_worker_thread(db, monkeypatch):
    """As the service's metrics handler does: other_families() on the loop, latest_from() in
    a worker thread; the open records are read in the worker thread only."""
    from prometheus_client import CollectorRegistry

    from gpuspawner.hub import metrics

    ledger, rec = ledger_and_recorder(db)
    rec.clock = lambda: T0 + 100  # the scrape: 100 s after the bookings
    for i in range(3):
        ledger.reserve(BUNDLE, Owner(f"u{i}", "", ("lab",)))
    counters = metrics.UsageCounters(clock=lambda: T0 - 100)
    threads: list[int] = []

    def open_intervals() -> list:
        threads.append(threading.get_ident())
        return rec.open_intervals()

    counters.open_intervals = open_intervals
    registry = CollectorRegistry()
    registry.register(counters)
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    others = metrics.other_families()
    assert threads == []
    body = await asyncio.to_thread(metrics.latest_from, [], others)
    assert threads and threading.get_ident() not in threads
    text = body.decode()
    line = 'gpuspawner_usage_reserved_gpu_seconds_total{group="lab",profile="-"} 300.0'
    assert line in text, text
    rec.store.close_store()
