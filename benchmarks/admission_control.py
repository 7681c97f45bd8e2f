"""Would refusing GPU shares that fit let FGD leave fewer GPUs idle on ``gpushare100``?

The placement issue asks for 5 % fewer unallocated GPUs than the FGD paper's FGD on
``gpushare100`` too. ``benchmarks/packing_bound.py`` shows the offline optimum is far lower
(672 idle GPUs against ``fgd``'s 833), and gets there by leaving many 810-milli shares out and
pairing smaller shares on those GPUs instead (docs/placement.md "How much there is to win").
No node choice we measured gets any of that online, because a share that fits when it arrives
is placed. This script measures the freedom node choice does not have: **admission control**,
``fgd`` (the paper model, ``run_paper``'s rules, ties by the paper's per-seed node ranking)
that refuses some shares even though a node could hold them. A hub would not do this (a user
waits while a GPU sits free); if it does not win either, the 5 % is out of reach of online
placement of this kind, and the bound's gap is the offline freedom to reorder.

Rules (each one a :class:`AdmittingCluster`; ``--rules`` picks, default all below):

* ``none``: plain ``fgd`` (the baseline; every rule is paired with it seed by seed).
* ``prob:Q[:M]``: refuse each share of at least ``M`` milli-GPU (default 810, the trace's
  largest) with probability ``Q``, drawn from ``random.Random(seed * 7919 + 1)``, so the
  same seed refuses at the same draws.
* ``late:X[:M]``: refuse every share of at least ``M`` milli once ``X`` % of the cluster's
  GPUs are allocated (the big shares stop when the cluster is nearly full, leaving the
  remaining room to the shares that pair well).

Prints per rule the mean unallocated GPUs at 100 % arrived over the seeds, the min and max,
the paired difference to ``fgd`` in percent, on how many seeds it is lower, and the paired
sign-flip p (:func:`gpuspawner.simulate.paper_method.sign_flip_p`).

Run: ``.venv/bin/python benchmarks/admission_control.py [--trace gpushare100] [--seeds 42-51]
[--jobs 2]`` (about 10 s per run and seed on one core).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuspawner.simulate import paper_method  # noqa: E402
from gpuspawner.simulate.paper import PaperCluster, PaperNode, PodType  # noqa: E402
from gpuspawner.simulate.traces import load_pods, read_node_rows  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
DEFAULT_RULES = ("none", "prob:0.05", "prob:0.1", "prob:0.2", "prob:0.3", "late:80", "late:85",
                 "late:90")


def parse_rule(text: str) -> tuple[str, float, int]:
    """``"none"``, ``"prob:Q[:M]"`` or ``"late:X[:M]"`` to ``(kind, parameter, smallest
    milli-GPU refused)``.

    Raises:
        ValueError: an unknown kind, a probability outside [0, 1], a percent outside
            [0, 100] or a milli-GPU outside 1..999.
    """
    kind, *rest = text.split(":")
    if kind == "none" and not rest:
        return "none", 0.0, 1000
    if kind not in ("prob", "late") or not 1 <= len(rest) <= 2:
        raise ValueError(f"rule {text!r}: expected none, prob:Q[:M] or late:X[:M]")
    par = float(rest[0])
    milli = int(rest[1]) if len(rest) == 2 else 810
    if kind == "prob" and not 0 <= par <= 1:
        raise ValueError(f"rule {text!r}: a probability is between 0 and 1")
    if kind == "late" and not 0 <= par <= 100:
        raise ValueError(f"rule {text!r}: a percent is between 0 and 100")
    if not 0 < milli < 1000:
        raise ValueError(f"rule {text!r}: a share is 1 to 999 milli-GPU")
    return kind, par, milli


class AdmittingCluster(PaperCluster):
    """:class:`~gpuspawner.simulate.paper.PaperCluster` that refuses some GPU shares before
    the policy chooses a node (admission control; module docstring). ``rule`` is
    :func:`parse_rule`'s triple; ``refused`` counts the shares it refused on purpose."""

    rule: tuple[str, float, int] = ("none", 0.0, 1000)
    seed: int = 0

    def __init__(self, nodes: Sequence[PaperNode], policy: str, *args, **kw) -> None:
        super().__init__(nodes, policy, *args, **kw)
        self._admit_rng = random.Random(type(self).seed * 7919 + 1)
        self.refused = 0

    def place(self, t: PodType, memory_mib: int = 0) -> PaperNode | None:
        """Refuse ``t`` under the rule (None), else :meth:`PaperCluster.place`."""
        kind, par, milli = self.rule
        if kind != "none" and t.gpu_number and t.is_share and t.milli_gpu >= milli:
            if ((kind == "prob" and self._admit_rng.random() < par)
                    or (kind == "late" and self.gpu_used >= par / 100 * self.gpu_capacity)):
                self.refused += 1
                return None
        return super().place(t, memory_mib)


def run(rows, tasks, rule: tuple[str, float, int], seed: int) -> float:
    """Unallocated GPUs at 100 % arrived of ``fgd`` under ``rule`` (``run_paper`` with
    :class:`AdmittingCluster` in place of ``PaperCluster``)."""
    cls = type("Admitting", (AdmittingCluster,), {"rule": rule, "seed": seed})
    saved = paper_method.PaperCluster
    paper_method.PaperCluster = cls
    try:
        return paper_method.run_paper(rows, tasks, "fgd", seed)["unallocated_gpus"]
    finally:
        paper_method.PaperCluster = saved


def _job(args: tuple) -> tuple[str, int, float]:
    nodes, trace, text, seed = args
    rows = read_node_rows(nodes)
    tasks = paper_method.tasks_of(load_pods(TRACES / f"openb_pod_list_{trace}.csv"))
    return text, seed, run(rows, tasks, parse_rule(text), seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="gpushare100")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--rules", default=",".join(DEFAULT_RULES))
    ap.add_argument("--nodes", default=str(TRACES / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    seeds = paper_method.parse_seeds(args.seeds)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    for r in rules:
        parse_rule(r)
    if "none" not in rules:
        rules.insert(0, "none")
    jobs = [(args.nodes, args.trace, r, s) for r in rules for s in seeds]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            res = list(ex.map(_job, jobs))
    else:
        res = [_job(j) for j in jobs]
    got: dict[str, dict[int, float]] = {}
    for text, seed, u in res:
        got.setdefault(text, {})[seed] = u
    base = got["none"]
    print(f"# {args.trace}, fgd (paper method), seeds {args.seeds}; unallocated GPUs at 100 % "
          "arrived")
    print(f"{'rule':14} {'mean':>7} {'min':>7} {'max':>7} {'vs fgd':>8} {'lower on':>8} "
          f"{'p':>6}")
    for text in rules:
        v = [got[text][s] for s in seeds]
        diffs = [got[text][s] - base[s] for s in seeds]
        pct = 100 * statistics.fmean(diffs) / statistics.fmean(base.values())
        lower = sum(d < 0 for d in diffs)
        print(f"{text:14} {statistics.fmean(v):7.1f} {min(v):7.1f} {max(v):7.1f} "
              f"{pct:+7.1f}% {lower:4d}/{len(seeds):<3d} "
              f"{paper_method.sign_flip_p(diffs):6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
