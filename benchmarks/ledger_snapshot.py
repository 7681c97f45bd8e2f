"""The ledger's snapshot after one booking: incremental (``Ledger.snapshot``) against the whole
walk it replaced (``Ledger._snapshot_full``), side by side in one run.

``Ledger.snapshot`` is what the hub's admin map, its metrics and ``GET api/nodes`` read on the
event loop (docs/benchmarks.md, "Where the hub's loop time goes"). The cluster is
``benchmarks/hub_scale.py``'s: fake nodes of 32 cores on 2 NUMA nodes and 8 shareable A100s,
one node per 24 servers, every server the profile ``small`` (1 core, 2 GiB, a quarter GPU)
booked by ``fgd``. For each size, ``--repeat`` times: one more server is booked (not timed),
then both snapshots are timed, once each, in alternating order, and checked equal; the probe
is released and the release's snapshot taken (not timed). A third column times the
incremental snapshot when nothing changed since the last one, and two rows what ``GET
api/nodes`` does on the loop before (the whole walk plus ``node_views``, the admin's view) and
now (the copy of the nodes, ``FrozenCluster(usage=False, allocations=False)``: the view and
its JSON are made in a worker thread). Figures are wall-clock
microseconds per call, p50 and p99, and this thread's CPU time p50 (run it pinned:
``taskset -c 1``).

Usage: ``taskset -c 1 .venv/bin/python benchmarks/ledger_snapshot.py [--servers 1000 5000]
[--repeat 300] [--json]``
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fake_backend import FakeBackend  # noqa: E402
from benchmarks.hub_scale import fake_node  # noqa: E402
from gpuspawner.backends.base import NodeRuntime  # noqa: E402
from gpuspawner.hub.cluster import Cluster  # noqa: E402
from gpuspawner.hub.service.frozen import FrozenCluster  # noqa: E402
from gpuspawner.hub.service.views import node_views  # noqa: E402
from gpuspawner.inventory.topology import node_from_dict  # noqa: E402
from gpuspawner.placement import Bundle, Ledger, Owner  # noqa: E402

SMALL = Bundle(cores=1, memory_bytes=2 << 30, gpu_milli=250)


def ledger_with(servers: int) -> Ledger:
    """hub_scale's cluster with ``servers`` small servers booked (and one node spare)."""
    nodes = [node_from_dict(fake_node(i)) for i in range(servers // 24 + 1)]
    ledger = Ledger(nodes, policy="fgd")
    for i in range(servers):
        ledger.reserve(SMALL, Owner(f"u{i:05d}", "", (f"g{i % 3}",)))
    return ledger


class Timer:
    """Wall-clock and this thread's CPU microseconds of each timed call."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> Timer:
        self._w, self._c = time.perf_counter_ns(), time.thread_time_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu.append((time.thread_time_ns() - self._c) / 1000)
        self.wall.append((time.perf_counter_ns() - self._w) / 1000)

    def stats(self) -> dict[str, float]:
        """p50 and p99 of wall-clock, p50 of CPU time, microseconds."""
        wall = sorted(self.wall)
        return {"p50_us": statistics.median(wall), "p99_us": wall[int(0.99 * (len(wall) - 1))],
                "cpu_p50_us": statistics.median(self.cpu)}


def measure(servers: int, repeat: int) -> dict[str, Any]:
    """Per-call microseconds of both snapshots after one booking, and of the incremental
    one after nothing changed."""
    ledger = ledger_with(servers)
    cluster = Cluster({n.name: NodeRuntime(n.name, "127.0.0.1", "x.yaml", n)
                       for n in ledger.nodes}, ledger, FakeBackend(responder_port=4242))
    ledger.snapshot()
    full, incr, idle = Timer(), Timer(), Timer()
    view, copy = Timer(), Timer()
    gc.collect()
    for i in range(repeat):
        probe = ledger.reserve(SMALL, Owner(f"probe{i}"))
        for which in ((0, 1) if i % 2 else (1, 0)):
            if which:
                with incr:
                    a = ledger.snapshot()
            else:
                with full:
                    b = ledger._snapshot_full()
        if a != b:
            raise AssertionError("incremental snapshot differs from the whole walk")
        with idle:
            ledger.snapshot()
        with view:  # api/nodes before: the view made on the loop (after the whole walk)
            node_views(cluster, None)
        with copy:  # api/nodes now: only this copy on the loop, the view in a thread
            FrozenCluster(cluster, usage=False, allocations=False)
        ledger.release(probe.id)
        ledger.snapshot()
    return {"servers": servers, "nodes": len(ledger.nodes), "repeat": repeat,
            "full": full.stats(), "incremental": incr.stats(), "unchanged": idle.stats(),
            "api_nodes_before": _sum(full, view).stats(), "api_nodes_now": copy.stats()}


def _sum(a: Timer, b: Timer) -> Timer:
    out = Timer()
    out.wall = [x + y for x, y in zip(a.wall, b.wall, strict=True)]
    out.cpu = [x + y for x, y in zip(a.cpu, b.cpu, strict=True)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [measure(n, args.repeat) for n in args.servers]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'servers':>7} {'nodes':>5}  {'snapshot after one booking':<40} "
          f"{'wall p50':>9} {'wall p99':>9} {'CPU p50':>9}  (us)")
    for r in results:
        rows = (("whole walk (before: _snapshot_full)", r["full"]),
                ("incremental (now: snapshot)", r["incremental"]),
                ("incremental, nothing changed", r["unchanged"]),
                ("api/nodes on the loop, before (*)", r["api_nodes_before"]),
                ("api/nodes on the loop, now (*)", r["api_nodes_now"]))
        for k, (label, x) in enumerate(rows):
            head = f"{r['servers']:>7} {r['nodes']:>5}" if k == 0 else " " * 13
            print(f"{head}  {label:<40} {x['p50_us']:>9.1f} {x['p99_us']:>9.1f} "
                  f"{x['cpu_p50_us']:>9.1f}")
        f, i = r["full"], r["incremental"]
        print(" " * 15 + f"whole / incremental: {f['p50_us'] / i['p50_us']:.0f}x wall p50, "
              f"{f['cpu_p50_us'] / i['cpu_p50_us']:.0f}x CPU p50")
    print(f"({args.repeat} bookings per size, each followed by both snapshots in alternating "
          "order, checked equal)")
    print("(*) before: the whole walk plus node_views (the admin's view; today's, which copies "
          "the dicts it changes) on the loop, as "
          "api/nodes did; now: FrozenCluster(usage=False, allocations=False) on the loop, "
          "node_views and the JSON in a worker thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
