"""Usage records, measured side by side in one run (in-process, no hub, SQLite in a temporary
folder):

1. **what a record adds to a booking**: ``Ledger.reserve`` + ``Ledger.release`` of a one-GPU
   bundle on a DGX A100 topology, ``--pairs`` times, without a recorder and with one
   (:class:`gpuspawner.usage.recorder.UsageRecorder` on a SQLite file, write-ahead log); the
   median of each and the difference per booking (an open and a close: two commits). Goal
   (docs/usage.md): <= 1 ms per booking.
2. **a report**: ``--records`` records of ``--users`` users in 20 groups spread over a year
   (one bulk insert), then ``GET api/usage``'s work for one month grouped by group
   (:func:`report_from_store`: the database adds up per group), ``--runs`` times, median.
   The goal is 300 ms for a month by group at one million records of a year; run with
   ``--records 1000000`` for that (the insert takes a while).

Usage: ``.venv/bin/python benchmarks/usage.py [--pairs 500] [--records 100000] [--users 1000]
[--runs 3]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert

from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.usage.recorder import UsageRecorder
from gpuspawner.usage.report import parse_query, report_from_store
from gpuspawner.usage.store import UsageRecord, UsageStore

REPO = Path(__file__).resolve().parents[1]
DGX = REPO / "tests" / "data" / "topologies" / "dgx-a100.yaml"
GiB = 2**30


def booking_times(pairs: int, recorder_db: str | None) -> list[float]:
    """Seconds of each reserve + release pair."""
    ledger = Ledger([load_topology_file(str(DGX))], policy="first-fit")
    if recorder_db is not None:
        UsageRecorder(UsageStore(recorder_db), ledger).attach(ledger)
    bundle = Bundle(cores=4, memory_bytes=8 * GiB, gpus=1, gpu_models=("A100",))
    out = []
    for i in range(pairs):
        t = time.perf_counter()
        a = ledger.reserve(bundle, Owner(f"u{i % 50}", f"s{i}", ("lab",)))
        ledger.release(a.id)
        out.append(time.perf_counter() - t)
    return out


def fill(store: UsageStore, records: int, users: int, now: float) -> None:
    rng = random.Random(7)
    year = 365 * 86400.0
    rows = []
    for i in range(records):
        start = now - rng.random() * year
        u = rng.randrange(users)
        rows.append(
            {
                "allocation_id": f"a{i}",
                "user": f"user{u}",
                "groups": f'["group{u % 20}"]',
                "kind": "server",
                "name": "",
                "profile": rng.choice(["cpu", "a100-1", "a100-2"]),
                "node": f"node{rng.randrange(16)}",
                "gpu_uuids": "[]",
                "gpu_model": "A100",
                "gpu_milli": rng.choice([0, 1000, 2000]),
                "cpu_milli": 4000,
                "memory_bytes": 16 * GiB,
                "disk_bytes": 0,
                "started": start,
                "ended": start + rng.random() * 8 * 3600,
                "closed_at_restart": False,
                "gpu_util_percent": rng.random() * 100,
                "cpu_seconds": rng.random() * 3600,
            }
        )
    with store.engine.begin() as c:
        for k in range(0, len(rows), 20000):
            c.execute(insert(UsageRecord), rows[k : k + 20000])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--pairs", type=int, default=500)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuspawner-usage-bench-") as tmp:
        without = booking_times(args.pairs, None)
        with_rec = booking_times(args.pairs, f"sqlite:///{tmp}/book.sqlite")
        a, b = statistics.median(without), statistics.median(with_rec)
        print(
            f"booking (reserve + release), median of {args.pairs}: without records "
            f"{a * 1e3:.3f} ms, with records {b * 1e3:.3f} ms, added {(b - a) * 1e3:.3f} ms "
            "(goal <= 1 ms)"
        )
        store = UsageStore(f"sqlite:///{tmp}/report.sqlite")
        now = time.time()
        t = time.perf_counter()
        fill(store, args.records, args.users, now)
        print(f"inserted {args.records} records in {time.perf_counter() - t:.1f} s")
        q = parse_query(
            {"from": time.strftime("%Y-%m-01", time.gmtime(now)), "group_by": "group"}, now=now
        )
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            report = report_from_store(store, q, now)
            times.append(time.perf_counter() - t)
        print(
            f"report, this month by group ({report['totals']['intervals']} records of "
            f"{args.records}): median {statistics.median(times) * 1e3:.0f} ms of "
            f"{args.runs} (goal at 1,000,000 records: <= 300 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
