"""What a simulation prints: the metrics table, the ``--compare`` table and JSON.

The ledger method's metrics (:mod:`gpuspawner.simulate.engine`, which defines them) print as
one row per metric and one column per run, in the order of
:data:`~gpuspawner.simulate.engine.METRIC_KEYS`; the paper method's summary
(:func:`gpuspawner.simulate.paper_method.summarize`) as one row per trace and policy. With
``--json`` both print as they are, as indented JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuspawner.simulate.engine import METRIC_KEYS


def _align(rows: Sequence[Sequence[str]], left: int) -> str:
    """Rows of cells as aligned text: the first ``left`` columns padded on the right, the
    others on the left, two spaces apart, no trailing blanks."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in rows)


def _fmt(key: str, value: Any) -> str:
    """A metric value as table text."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        if key in ("gpu_allocation_ratio", "numa_aligned_fraction"):
            return f"{value:.4f}"
        if key in ("setup_s", "wall_s"):
            return f"{value:.2f}"
        if key == "decisions_per_s":
            return f"{value:,.0f}"
        return f"{value:.1f}"
    return str(value)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Metrics as an aligned text table: one row per metric, one column per run."""
    keys = [k for k in METRIC_KEYS if any(k in r for r in results)]
    for r in results:  # keys outside METRIC_KEYS, once each, in first-seen order
        keys += [k for k in r if k not in keys]
    rows = [[k] + [_fmt(k, r.get(k)) for r in results] for k in keys]
    return _align(rows, left=1)


def format_compare(summary: Sequence[dict[str, Any]],
                   wins: Sequence[dict[str, Any]] = (),
                   pairs: Sequence[dict[str, Any]] = ()) -> str:
    """The ``--compare`` table: one row per trace and policy; then one line per entry of
    ``pairs`` (:func:`gpuspawner.simulate.paper_method.paired`: a policy against ``fgd`` on
    the same seeds, with the sign-flip test's p); then, per trace of ``wins``
    (:func:`gpuspawner.simulate.paper_method.default_wins`), whether the default policy left
    the fewest unallocated GPUs in the mean and on how many seeds."""
    head = ["trace", "policy", "seeds", "unalloc GPUs mean", "std", "min", "max", "alloc ratio",
            "p50 us", "p99 us", "paper mean", "diff %"]
    rows = [head]
    for s in summary:
        rows.append([
            s["trace"], s["policy"], str(s["seeds"]), f"{s['unallocated_mean']:.1f}",
            f"{s['unallocated_std']:.1f}", f"{s['unallocated_min']:.1f}",
            f"{s['unallocated_max']:.1f}", f"{s['allocation_ratio']:.4f}",
            f"{s['decision_us_p50']:.0f}", f"{s['decision_us_p99']:.0f}",
            "-" if s["paper_mean"] is None else f"{s['paper_mean']:.1f}",
            "-" if s["diff_percent"] is None else f"{s['diff_percent']:+.1f}",
        ])
    text = _align(rows, left=2)
    for p in pairs:
        text += (f"\n# {p['trace']}: {p['policy']} vs {p['baseline']} on the same "
                 f"{p['seeds']} seeds: {p['mean_diff']:+.1f} unallocated GPUs "
                 f"({p['diff_percent']:+.1f} %), fewer on {p['fewer']}, equal on "
                 f"{p['equal']}, more on {p['more']}; paired sign-flip test p = {p['p']:.3f}")
    for w in wins:
        lost = "; ".join(f"seed {seed}: {p} {theirs} <= {ours}" for seed, p, theirs, ours
                         in w["lost"][:5])
        more = f" (+{len(w['lost']) - 5} more)" if len(w["lost"]) > 5 else ""
        text += (f"\n# {w['trace']}: {w['policy']} leaves the fewest unallocated GPUs "
                 f"{'in the mean' if w['mean_won'] else 'NOT in the mean'} and on "
                 f"{w['seeds_won']} of {w['seeds']} seeds"
                 + (f"; tied or beaten: {lost}{more}" if lost else ""))
    return text


def format_json(payload: Any) -> str:
    """The ``--json`` output: ``payload`` as JSON indented by 2."""
    return json.dumps(payload, indent=2)


#: the rows of :func:`format_queue`: (label, metric key)
QUEUE_ROWS: tuple[tuple[str, str], ...] = (
    ("pods arrived", "pods_total"), ("pods started", "pods_placed"),
    ("pods refused", "pods_rejected"), ("pods that waited", "pods_waited"),
    ("pods still waiting at the end", "pods_still_waiting"), ("mean wait (s)", "wait_mean_s"),
    ("p95 wait (s)", "wait_p95_s"), ("max wait (s)", "wait_max_s"),
    ("GPU allocation ratio (time-weighted)", "gpu_allocation_ratio"),
    ("unallocated GPUs (time-weighted)", "unallocated_gpus"),
    ("unallocated GPUs while pods wait", "unallocated_gpus_waiting"),
    ("time with pods waiting (s)", "waiting_s"),
    ("GPU hours served", "gpu_hours"), ("span (s)", "span_s"), ("wall (s)", "wall_s"),
)


def format_queue(results: Sequence[dict[str, Any]]) -> str:
    """``--mode replay --queue``: the two runs of
    :func:`~gpuspawner.simulate.engine.compare_queue` (without, with the queue) as one row per
    metric of :data:`~gpuspawner.simulate.engine.QUEUE_KEYS`."""
    rows = [["", "no queue", "queue"]]
    for label, key in QUEUE_ROWS:
        cells = [label]
        for r in results:
            v = r.get(key)
            if v is None:
                cells.append("-")
            elif key == "gpu_allocation_ratio":
                cells.append(f"{v:.4f}")
            elif key == "wall_s":
                cells.append(f"{v:.2f}")
            elif isinstance(v, float):
                cells.append(f"{v:,.1f}")
            else:
                cells.append(f"{v:,}")
        rows.append(cells)
    return _align(rows, left=1)
