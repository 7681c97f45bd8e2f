"""Per-seed check of ``gpuspawner simulate --method paper`` against the FGD paper's own runs.

The paper's simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator) draws every random
choice from Go's ``math/rand`` global source, seeded with the run's seed (``rand.Seed`` in
``pkg/simulator/core.go`` ``Simulate``). Our simulator uses Python's ``random.Random(seed)``,
so only means over seeds compare (docs/placement.md). This script replays the paper's seeds
*exactly* by drawing the same numbers as Go, and prints, for each (trace, policy, seed), how
many of the published allocation columns (0 .. ``--until`` percent arrived) ours match to
0.01 and the unallocated GPUs at 100 % arrived beside the paper's.

Neither Go's generator table nor the paper's results are part of this repository; pass them:

* ``--go-rng`` Go's ``src/math/rand/rng.go`` (its 607 seed values, ``rng_cooked`` in old
  trees, ``rngCooked`` since Go 1.8; only their low 63 bits reach ``Int63``, which Go kept
  stable; checked here with an old tree's table: ``rand.Seed(1)`` then ``rand.Intn(100)``
  gives 81, 87, 47, 59, as Go's tour prints);
* ``--expected`` the simulator's
  ``experiments/analysis/expected_results/analysis_allo_discrete.csv``.

The draws, in the order ``Simulate`` makes them (``pkg/simulator``): one ``rand.Int()``
(evaluated for a debug log line), ``rand.Shuffle`` of the name-sorted pods
(``SortClusterPods``), ``rand.Intn`` per removed or appended pod (``tuneDownPods`` /
``tuneUpPods``), then ``rand.Perm`` over the name-sorted nodes (``syncClusterResourceList``).
Between the tuning and ``rand.Perm`` the simulator's goroutines draw ``--extra-draws`` more
(default 10: the only count in 0..29 that reproduces ``gpu-packing`` seed 42's published
curve on ``default``; they are most likely the scheduler informers' jittered start, which
runs in ``runScheduler`` just before; found by search, not read in the code). ``random`` is
left out: it also draws while scheduling, over the scheduler's node-cache order.

The Go algorithms below (``rngSource.Seed``/``Int63``, ``Rand.Int31n``, ``Rand.int31n``,
``Rand.Shuffle``, ``Rand.Perm``) follow ``src/math/rand/rng.go`` and ``rand.go``.

Run: ``.venv/bin/python benchmarks/paper_exact.py --go-rng GO/src/math/rand/rng.go
--expected analysis_allo_discrete.csv [--traces default] [--policies gpu-packing]
[--seeds 42-51]``.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuspawner.placement.workload import typical_pods
from gpuspawner.simulate import paper_method as pm
from gpuspawner.simulate.paper import PAPER_NAMES
from gpuspawner.simulate.traces import load_pods, read_node_rows, trace_path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
_LEN, _TAP = 607, 273
_M = (1 << 31) - 1
_MASK63 = (1 << 63) - 1


def read_cooked(path: Path) -> list[int]:
    """The 607 seed values of Go's ``rng.go`` (``rngCooked``, or ``rng_cooked`` before Go 1.8),
    as unsigned 63-bit values (only their low 63 bits reach ``Int63``).

    Raises:
        ValueError: the file has no such table of 607 numbers.
    """
    text = path.read_text()
    m = re.search(r"rng_?[cC]ooked\s*\[[^\]]*\]\s*int64\s*=\s*\[[^\]]*\]\s*int64\s*\{(.*?)\}",
                  text, re.S)
    if not m:
        raise ValueError(f"{path}: no rngCooked table")
    values = [int(v) & _MASK63 for v in re.findall(r"-?\d+", m.group(1))]
    if len(values) != _LEN:
        raise ValueError(f"{path}: rngCooked has {len(values)} values, expected {_LEN}")
    return values


class GoRand:
    """Go's ``math/rand`` source and the ``Rand`` methods the simulator calls, with the
    ``shuffle``/``randrange`` interface of :func:`gpuspawner.simulate.paper_method.run_paper`.
    """

    def __init__(self, seed: int, cooked: Sequence[int]) -> None:
        self.tap, self.feed = 0, _LEN - _TAP
        seed %= _M
        if seed == 0:
            seed = 89482311
        x = seed
        self.vec = [0] * _LEN
        for i in range(-20, _LEN):
            x = _seedrand(x)
            if i >= 0:
                u = x << 40
                x = _seedrand(x)
                u ^= x << 20
                x = _seedrand(x)
                u ^= x
                self.vec[i] = (u ^ cooked[i]) & _MASK63

    def int63(self) -> int:
        self.tap = (self.tap - 1) % _LEN
        self.feed = (self.feed - 1) % _LEN
        x = (self.vec[self.feed] + self.vec[self.tap]) & _MASK63
        self.vec[self.feed] = x
        return x

    def _int31(self) -> int:
        return self.int63() >> 32

    def randrange(self, n: int) -> int:
        """``Rand.Intn(n)`` for ``n < 2**31`` (``Int31n``: rejection, then modulo)."""
        if n & (n - 1) == 0:
            return self._int31() & (n - 1)
        top = _M - (1 << 31) % n
        v = self._int31()
        while v > top:
            v = self._int31()
        return v % n

    def _int31n_fast(self, n: int) -> int:  # Rand.int31n (Lemire), used by Shuffle
        prod = ((self.int63() >> 31) & 0xFFFFFFFF) * n
        low = prod & 0xFFFFFFFF
        if low < n:
            thresh = ((1 << 32) - n) % n
            while low < thresh:
                prod = ((self.int63() >> 31) & 0xFFFFFFFF) * n
                low = prod & 0xFFFFFFFF
        return prod >> 32

    def shuffle(self, items: list) -> None:
        """``Rand.Shuffle``."""
        for i in range(len(items) - 1, 0, -1):
            j = self._int31n_fast(i + 1)
            items[i], items[j] = items[j], items[i]

    def perm(self, n: int) -> list[int]:
        """``Rand.Perm``."""
        m = [0] * n
        for i in range(n):
            j = self.randrange(i + 1)
            m[i] = m[j]
            m[j] = i
        return m


def _seedrand(x: int) -> int:
    hi, lo = divmod(x, 44488)
    x = 48271 * lo - 3399 * hi
    return x + _M if x < 0 else x


def go_rank(extra: int):
    """``rank_nodes`` for :func:`~gpuspawner.simulate.paper_method.run_paper`: ``extra``
    draws, then ``rand.Perm``; node ``i`` of the name-sorted list is renamed ``%04d-`` +
    name with ``perm[i]``, and ties go to the smallest new name."""
    def rank(names: Sequence[str], rng: GoRand) -> list[str]:
        for _ in range(extra):
            rng.int63()
        return pm.ranked_by_permutation(names, rng.perm(len(names)))
    return rank


def read_expected(path: Path) -> dict[tuple[str, str, int], list[float]]:
    """``(trace, paper policy name, seed) -> allocation percent per column 0..130``."""
    out = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            trace = row["workload"].removeprefix("openb_pod_list_")
            out[(trace, row["sc_policy"], int(row["seed"]))] = [
                float(row[str(k)]) for k in range(131)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--go-rng", type=Path, required=True, help="Go's src/math/rand/rng.go")
    ap.add_argument("--expected", type=Path, required=True,
                    help="the simulator's analysis_allo_discrete.csv")
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the trace CSVs")
    ap.add_argument("--traces", default="default")
    ap.add_argument("--policies", default="fgd,best-fit,dot-product,gpu-packing,gpu-clustering")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--extra-draws", type=int, default=10)
    ap.add_argument("--until", type=float, default=100.5,
                    help="compare columns up to this percent arrived (default 100.5)")
    args = ap.parse_args(argv)
    try:
        cooked = read_cooked(args.go_rng)
        expected = read_expected(args.expected)
        rows = read_node_rows(args.data / "openb_node_list_gpu_node.csv")
        seeds = pm.parse_seeds(args.seeds)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in PAPER_NAMES or p == "random"]
    if bad:
        print(f"error: no exact replay for {bad[0]!r}", file=sys.stderr)
        return 2
    print(f"{'trace':12} {'policy':15} {'seed':>4}  {'cols equal':>10}  first diff  "
          f"{'ours':>7} {'paper':>7}")
    for trace in (t.strip() for t in args.traces.split(",") if t.strip()):
        tasks = pm.tasks_of(load_pods(trace_path(trace, args.data)))
        typical = typical_pods(t for _, t, _ in tasks)
        for policy in policies:
            ours_all, paper_all = [], []
            for seed in seeds:
                ref = expected.get((trace, PAPER_NAMES[policy], seed))
                if ref is None:
                    print(f"{trace:12} {policy:15} {seed:>4}  not in {args.expected.name}")
                    continue
                rng = GoRand(seed, cooked)
                rng.int63()  # rand.Int() in Simulate's debug log line
                r = pm.run_paper(rows, tasks, policy, seed, typical=typical, until=args.until,
                                 rng=rng, rank_nodes=go_rank(args.extra_draws), curve=True)
                cols = [k for k in sorted(r["curve"]) if k <= min(130, int(args.until))]
                diff = [k for k in cols if abs(round(r["curve"][k], 2) - ref[k]) > 0.011]
                paper_un = r["gpus"] * (1 - ref[100] / 100)
                ours_all.append(r["unallocated_gpus"])
                paper_all.append(paper_un)
                print(f"{trace:12} {policy:15} {seed:>4}  {len(cols) - len(diff):>4} of "
                      f"{len(cols):<3}  {diff[0] if diff else '-':>10}  "
                      f"{r['unallocated_gpus']:7.1f} {paper_un:7.1f}", flush=True)
            if ours_all:
                print(f"{trace:12} {policy:15} mean  {'':>10}  {'':>10}  "
                      f"{statistics.fmean(ours_all):7.1f} {statistics.fmean(paper_all):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
