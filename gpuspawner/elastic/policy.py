"""The elastic policy: from what waits and what runs, which nodes to start and which to stop.

A policy is a callable ``policy(view: ElasticView) -> list[Decision]`` (the default:
:func:`default_policy`; a site's own: ``c.GPUElastic.policy``, as Bright's cm-scale takes a
Python module). Whatever a policy decides, the manager
(:class:`~gpuspawner.elastic.manager.ElasticManager`) never stops a node that holds a server or
a job or that its provider did not start, never starts more than ``max_nodes`` of a category
nor more than ``starts_per_hour`` in the last hour, and never starts a category that is
backing off after a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CategoryView",
    "Decision",
    "ElasticView",
    "NodeView",
    "Policy",
    "WaitingView",
    "default_policy",
]


@dataclass(frozen=True)
class NodeView:
    """One elastic node as a policy sees it.

    Attributes:
        name: the node. category: its category.
        state: ``off`` (can start), ``starting``, ``running``, ``stopping``.
        booked: allocations on it now (servers and jobs).
        idle_s: seconds since it last held an allocation (or since it joined); 0 while
            booked or not running.
        started_by_provider: the provider started it (only such nodes may be stopped).
    """

    name: str
    category: str
    state: str
    booked: int = 0
    idle_s: float = 0.0
    started_by_provider: bool = False


@dataclass(frozen=True)
class WaitingView:
    """One request waiting in the queue.

    Attributes:
        id: the queue entry. user: who asks. waited_s: seconds it has waited.
        categories: the categories whose node, empty, could take it (none: only fixed nodes
            can).
    """

    id: str
    user: str
    waited_s: float
    categories: tuple[str, ...]


@dataclass(frozen=True)
class CategoryView:
    """A category's limits (``c.GPUElastic.categories``) and back-off.

    Attributes:
        min_nodes, max_nodes: how many of its nodes run at least / at most.
        start_s: about how long one of its nodes takes to join (seconds).
        backoff_until_s: seconds until it may be started again after a failure (0: now).
    """

    name: str
    min_nodes: int
    max_nodes: int
    start_s: float
    backoff_until_s: float = 0.0


@dataclass(frozen=True)
class ElasticView:
    """What a policy decides from.

    Attributes:
        nodes: every elastic node. waiting: the queue in its fair order.
        categories: name -> limits. starts_last_hour: nodes started in the last hour.
        scale_out_after: seconds a request waits before a node is started for it.
        idle_shutdown: seconds a node idles before it is stopped.
        starts_per_hour: the cap on starts per hour.
    """

    nodes: tuple[NodeView, ...]
    waiting: tuple[WaitingView, ...]
    categories: Mapping[str, CategoryView]
    starts_last_hour: int
    scale_out_after: float
    idle_shutdown: float
    starts_per_hour: int


@dataclass(frozen=True)
class Decision:
    """``action`` "start" (a node of ``category``; ``node`` may name which) or "stop"
    (``node``), with the ``reason`` logged and shown."""

    action: str
    category: str = ""
    node: str = ""
    reason: str = ""
    #: for a start: the queue entries it is for
    for_entries: tuple[str, ...] = field(default=())


Policy = Callable[[ElasticView], list[Decision]]


def default_policy(view: ElasticView) -> list[Decision]:
    """The default policy.

    Scale out: each request that has waited ``scale_out_after`` seconds, in queue order, is
    covered by a node of a fitting category that is starting (one request per starting node,
    the ones started for it first); one no such node covers gets a start of the first fitting
    category that is below ``max_nodes`` and not backing off, while fewer than
    ``starts_per_hour`` nodes started in the last hour. A category below ``min_nodes`` gets
    starts too.
    Scale in: a running node the provider started, with nothing booked for ``idle_shutdown``
    seconds, is stopped while its category keeps ``min_nodes`` running, and not while a
    request that fits it waits.
    """
    out: list[Decision] = []
    by_cat: dict[str, list[NodeView]] = {}
    for n in view.nodes:
        by_cat.setdefault(n.category, []).append(n)
    live = {c: sum(1 for n in ns if n.state in ("starting", "running")) for c, ns in by_cat.items()}
    starting = {c: sum(1 for n in ns if n.state == "starting") for c, ns in by_cat.items()}
    budget = max(0, view.starts_per_hour - view.starts_last_hour)

    def can_start(c: str) -> bool:
        cat = view.categories.get(c)
        return (
            cat is not None
            and budget > 0
            and cat.backoff_until_s <= 0
            and live.get(c, 0) < cat.max_nodes
            and any(n.state == "off" for n in by_cat.get(c, ()))
        )

    for c, cat in view.categories.items():
        while live.get(c, 0) < cat.min_nodes and can_start(c):
            out.append(
                Decision(
                    "start",
                    c,
                    reason=f"category {c} keeps {cat.min_nodes} node(s) running (min_nodes)",
                )
            )
            live[c] = live.get(c, 0) + 1
            budget -= 1
    covered = dict(starting)
    for w in view.waiting:
        if not w.categories or w.waited_s < view.scale_out_after:
            continue
        c = next((c for c in w.categories if covered.get(c, 0) > 0), None)
        if c is not None:
            covered[c] -= 1
            continue
        c = next((c for c in w.categories if can_start(c)), None)
        if c is None:
            continue
        out.append(
            Decision(
                "start",
                c,
                reason=f"{w.user}'s request waited {w.waited_s:.0f} s",
                for_entries=(w.id,),
            )
        )
        live[c] = live.get(c, 0) + 1
        budget -= 1
    wanted = {c for w in view.waiting for c in w.categories}
    for c, ns in by_cat.items():
        cat = view.categories.get(c)
        keep = cat.min_nodes if cat else 0
        running = sum(1 for n in ns if n.state == "running")
        for n in sorted(ns, key=lambda n: -n.idle_s):
            if running <= keep or c in wanted:
                break
            if (
                n.state == "running"
                and n.started_by_provider
                and n.booked == 0
                and n.idle_s >= view.idle_shutdown
            ):
                out.append(
                    Decision(
                        "stop",
                        c,
                        n.name,
                        reason=f"idle for {n.idle_s:.0f} s (idle_shutdown "
                        f"{view.idle_shutdown:g} s)",
                    )
                )
                running -= 1
    return out
