"""Replay with elastic nodes (``gpuspawner simulate --mode replay --elastic N``): what elastic
capacity costs in waits and saves in node-hours, against the fixed cluster, for a range of
``idle_shutdown`` settings (docs/howto/elastic-nodes.md, "What it costs and saves").

Rules (the queue replay's, :func:`~gpuspawner.simulate.engine.simulate_replay_queue`, plus):

* The last ``elastic`` nodes of the node list are elastic; a category is a node signature
  (GPU count and model, cores, memory). They start ``off`` in the ledger (capacity that can
  start: admissible, never placed).
* After every event (arrival, release, a node ready, a timer) the queue is scheduled and the
  default policy (:func:`gpuspawner.elastic.policy.default_policy`, no hourly cap, no
  ``min_nodes``) decides; a started node is ready ``start_s`` seconds later and takes work
  then; a stopped node is off at once. Timers wake the policy when a waiting request reaches
  ``scale_out_after`` and when an idle node reaches ``idle_shutdown``.
* Node-hours count every fixed node over the whole span and every elastic node while it is
  starting or running. The fixed cluster's row is the queue replay with every node on. The
  run ends when the trace's last pod leaves: nodes idling after that count for neither row.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from typing import Any

from ..elastic.policy import CategoryView, ElasticView, NodeView, WaitingView, default_policy
from ..placement import DEFAULT_POLICY, Bundle, Node
from ..placement.queue import WaitQueue
from .engine import (
    _arrive,
    _replay_metrics,
    _replay_order,
    _Run,
    _wait_metrics,
    simulate_replay_queue,
)
from .traces import Pod

__all__ = [
    "ELASTIC_KEYS",
    "compare_elastic",
    "format_elastic",
    "plot_elastic",
    "simulate_replay_elastic",
]

#: the columns of the elastic curve
ELASTIC_KEYS = (
    "setting",
    "pods_placed",
    "pods_rejected",
    "wait_mean_s",
    "wait_p95_s",
    "wait_max_s",
    "node_hours",
    "node_starts",
)


def _category(n: Node) -> str:
    models = sorted({g.model for g in n.gpus})
    cores = sum(len(nn.cpus) for nn in n.numa_nodes)
    mem = sum(nn.memory_bytes for nn in n.numa_nodes)
    return f"{len(n.gpus)}x{'/'.join(models) or 'GPU'} {cores}c {mem >> 30}GiB"


def simulate_replay_elastic(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: str = DEFAULT_POLICY,
    *,
    elastic: int,
    start_s: float,
    idle_shutdown_s: float,
    scale_out_after_s: float = 0.0,
    numa_policy: str = "strict",
    seed: int = 0,
    max_pods: int | None = None,
    users: int = 50,
    max_bypass: int = 3,
    time_limit_s: float | None = None,
) -> dict[str, Any]:
    """Replay the trace with the last ``elastic`` nodes elastic (see the module's rules).

    Returns:
        the queue replay's metrics plus ``node_hours``, ``node_starts`` and ``setting``.
    Raises:
        ValueError: ``elastic`` not in 1..len(nodes), a negative time, a pod without
            ``creation_time``.
    """
    if not 1 <= elastic <= len(nodes):
        raise ValueError(f"elastic must be 1..{len(nodes)} nodes, got {elastic}")
    if min(start_s, idle_shutdown_s, scale_out_after_s) < 0:
        raise ValueError("start, idle shutdown and scale-out times must be >= 0 seconds")
    order = _replay_order(pods, max_pods)
    started_at = time.perf_counter()
    run = _Run(nodes, policy, numa_policy, seed)
    clock = [0.0]
    queue = WaitQueue(run.ledger, max_bypass=max_bypass, clock=lambda: clock[0])
    el_nodes = list(nodes)[-elastic:]
    cat = {n.name: _category(n) for n in el_nodes}
    index = {n.name: k for k, n in enumerate(el_nodes)}
    members: dict[str, list[str]] = {}
    for name, c in cat.items():
        members.setdefault(c, []).append(name)
        run.ledger.set_node_state(name, "off", "elastic: off")
    cats = {c: CategoryView(c, 0, len(ns), start_s) for c, ns in members.items()}
    state = dict.fromkeys(cat, "off")
    booked = dict.fromkeys(cat, 0)
    idle_since: dict[str, float | None] = dict.fromkeys(cat)
    fits: dict[Bundle, tuple[str, ...]] = {}

    def categories_for(b: Bundle) -> tuple[str, ...]:
        if b not in fits:
            fits[b] = tuple(c for c, ns in members.items() if run.ledger.could_hold(b, ns[0]))
        return fits[b]

    # (time, kind, tie, index): 0 release, 1 node ready (index into el_nodes), 2 arrival,
    # 3 timer
    events: list[tuple[float, int, int, int]] = [
        (float(pods[i].creation_time), 2, n, i)  # type: ignore[arg-type]
        for n, i in enumerate(order)
    ]
    heapq.heapify(events)
    tie = itertools.count(len(order))
    timers: set[float] = set()
    deadline = None if time_limit_s is None else started_at + time_limit_s
    live: dict[int, Any] = {}
    waiting: dict[str, int] = {}
    waits: list[float] = []
    admission: dict[Bundle, str | None] = {}
    area = node_s = 0.0
    starts = 0
    fixed = len(nodes) - elastic
    t_first = events[0][0] if events else 0.0
    t_last = t_first
    stop = "end"
    while events:
        if deadline is not None and time.perf_counter() >= deadline:
            stop = "time_limit"
            break
        t, kind, _, i = heapq.heappop(events)
        dt = t - t_last
        area += run.allocated_milli * dt
        node_s += (fixed + sum(1 for s in state.values() if s != "off")) * dt
        t_last = clock[0] = t
        if kind == 0:
            alloc = live.pop(i)
            run.release(alloc)
            if alloc.node in booked:
                booked[alloc.node] -= 1
                if booked[alloc.node] == 0:
                    idle_since[alloc.node] = t
        elif kind == 1:
            name = el_nodes[i].name
            if state[name] == "starting":
                state[name], idle_since[name] = "running", t
                run.ledger.set_node_state(name, "up")
        elif kind == 2:
            _arrive(run, queue, admission, waiting, pods[i], i, users)
        else:
            timers.discard(t)
        for out in queue.schedule():
            j = waiting.pop(out.entry.id)
            p = pods[j]
            if out.allocation is None:
                run.rejected += 1
                continue
            run.book(p, out.entry.bundle, out.allocation)
            live[j] = out.allocation
            if out.allocation.node in booked:
                booked[out.allocation.node] += 1
                idle_since[out.allocation.node] = None
            created = float(p.creation_time)  # type: ignore[arg-type]
            waits.append(t - created)
            if p.deletion_time is None:
                continue
            end = (
                max(p.deletion_time, t) if t == created else t + max(0.0, p.deletion_time - created)
            )
            heapq.heappush(events, (end, 0, next(tie), j))
        # the policy's look
        entries = queue.order()
        view = ElasticView(
            tuple(
                NodeView(
                    n,
                    cat[n],
                    state[n],
                    booked[n],
                    t - idle_since[n]
                    if state[n] == "running"  # type: ignore[operator]
                    and idle_since[n] is not None
                    else 0.0,
                    True,
                )
                for n in cat
            ),
            tuple(
                WaitingView(e.id, e.owner.user, t - e.enqueued, categories_for(e.bundle))
                for e in entries
            ),
            cats,
            0,
            scale_out_after_s,
            idle_shutdown_s,
            10**9,
        )
        for d in default_policy(view):
            if d.action == "start":
                name = next((n for n in members[d.category] if state[n] == "off"), None)
                if name is None:
                    continue
                state[name] = "starting"
                starts += 1
                heapq.heappush(events, (t + start_s, 1, next(tie), index[name]))
            elif d.action == "stop" and booked.get(d.node, 1) == 0:
                state[d.node], idle_since[d.node] = "off", None
                run.ledger.set_node_state(d.node, "off", "elastic: off")
        # wake the policy when a request reaches scale_out_after or a node idle_shutdown
        due = [
            e.enqueued + scale_out_after_s for e in entries if e.enqueued + scale_out_after_s > t
        ]
        due += [
            s + idle_shutdown_s
            for n, s in idle_since.items()
            if state[n] == "running" and s is not None and s + idle_shutdown_s > t
        ]
        if due and (events or entries):
            nxt = min(due)
            if nxt not in timers:
                timers.add(nxt)
                heapq.heappush(events, (nxt, 3, next(tie), -1))
        if not entries and not live and all(k in (1, 3) for _, k, _, _ in events):
            break  # the trace's last pod left: what idles after it counts for neither row
    m = _replay_metrics(run, policy, seed, area, t_first, t_last, started_at, stop)
    m.update(
        queue=True,
        queue_users=users,
        max_bypass=max_bypass,
        pods_still_waiting=len(queue),
        node_hours=node_s / 3600,
        node_starts=starts,
        setting=f"elastic {elastic}, idle_shutdown {idle_shutdown_s:g} s",
        **_wait_metrics(waits),
    )
    return m


def compare_elastic(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: str = DEFAULT_POLICY,
    *,
    elastic: int,
    start_s: float,
    idle_shutdowns: Sequence[float],
    scale_out_after_s: float = 0.0,
    numa_policy: str = "strict",
    seed: int = 0,
    max_pods: int | None = None,
    users: int = 50,
    max_bypass: int = 3,
) -> list[dict[str, Any]]:
    """The fixed cluster (every node on: the queue replay, node-hours = nodes x span) and one
    elastic replay per ``idle_shutdowns`` value: the curve an admin chooses from.

    Raises:
        ValueError: as :func:`simulate_replay_elastic`.
    """
    fixed = simulate_replay_queue(
        nodes,
        pods,
        policy,
        numa_policy=numa_policy,
        seed=seed,
        max_pods=max_pods,
        users=users,
        max_bypass=max_bypass,
    )
    fixed.update(
        node_hours=len(nodes) * fixed["span_s"] / 3600,
        node_starts=0,
        setting="fixed (every node on)",
    )
    rows = [fixed]
    for idle in idle_shutdowns:
        rows.append(
            simulate_replay_elastic(
                nodes,
                pods,
                policy,
                elastic=elastic,
                start_s=start_s,
                idle_shutdown_s=idle,
                scale_out_after_s=scale_out_after_s,
                numa_policy=numa_policy,
                seed=seed,
                max_pods=max_pods,
                users=users,
                max_bypass=max_bypass,
            )
        )
    return rows


def format_elastic(rows: Sequence[dict[str, Any]]) -> str:
    """The curve as a text table (:data:`ELASTIC_KEYS`; seconds and hours rounded)."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    table = [list(ELASTIC_KEYS)] + [[cell(r.get(k)) for k in ELASTIC_KEYS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(ELASTIC_KEYS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def plot_elastic(
    rows: Sequence[dict[str, Any]],
    idle_shutdowns: Sequence[float],
    path: str,
    title: str = "",
) -> None:
    """Draw the curve of :func:`compare_elastic` to a PNG at ``path``: node-hours (x) against
    the mean and 95th-percentile wait (y, seconds), one point per idle shutdown (labelled in
    seconds), the fixed cluster as a point of its own. matplotlib is imported here only (the
    ``test`` and ``docs`` extras), with its Agg backend (no display).

    Args:
        rows: :func:`compare_elastic`'s rows, the fixed cluster first.
        idle_shutdowns: the idle-shutdown seconds of ``rows[1:]``, in that order.
        path: the PNG file to write.
        title: the plot's title.
    Raises:
        ValueError: ``rows`` and ``idle_shutdowns`` do not match.
        ImportError: matplotlib is not installed (``pip install matplotlib``).
        OSError: the file cannot be written.
    """
    if len(rows) != len(idle_shutdowns) + 1:
        raise ValueError(
            f"{len(rows)} rows for {len(idle_shutdowns)} idle shutdowns (the fixed cluster first)"
        )
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fixed, curve = rows[0], rows[1:]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        hours = [float(r["node_hours"]) for r in curve]
        for key, label, style in (
            ("wait_mean_s", "mean wait", "o-"),
            ("wait_p95_s", "95th percentile wait", "s--"),
        ):
            ax.plot(hours, [float(r.get(key) or 0.0) for r in curve], style, label=label)
        for i, (h, r, idle) in enumerate(zip(hours, curve, idle_shutdowns, strict=True)):
            ax.annotate(  # labels stacked apart, arrows to their points (near settings
                f"idle {idle:g} s",  # often land on one spot)
                (h, float(r.get("wait_mean_s") or 0.0)),
                textcoords="axes fraction",
                xytext=(0.3, 0.75 - 0.07 * i),
                arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.8},
                fontsize=8,
            )
        ax.plot(
            [float(fixed["node_hours"])],
            [float(fixed.get("wait_mean_s") or 0.0)],
            "k^",
            label="fixed cluster (every node on), mean wait",
        )
        ax.set_xlabel("node-hours")
        ax.set_ylabel("wait (s)")
        ax.set_title(title or "elastic nodes: waits against node-hours", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
