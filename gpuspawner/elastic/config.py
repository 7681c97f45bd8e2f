"""``c.GPUElastic``: the elastic nodes' settings, checked at hub start
(:func:`gpuspawner.hub.config_check.check_hub_config` calls :func:`elastic_settings`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Dict, Float, Int, Unicode
from traitlets.config import Configurable

from .policy import Policy, default_policy

__all__ = [
    "CATEGORY_KEYS",
    "CategorySettings",
    "ElasticConfigError",
    "ElasticSettings",
    "GPUElastic",
    "elastic_settings",
]

#: what a ``c.GPUElastic.categories`` entry may set
CATEGORY_KEYS = ("min_nodes", "max_nodes", "start_s")


class ElasticConfigError(ValueError):
    """A wrong ``c.GPUElastic`` setting or elastic node entry (the message names it)."""


class GPUElastic(Configurable):
    """Nodes that come and go with the wait queue (docs/howto/elastic-nodes.md)."""

    scale_out_after = Float(
        30.0,
        help="""Seconds a request waits in the queue before a node
        is started for it (when no starting node of a category that fits it covers it).""",
    ).tag(config=True)
    idle_shutdown = Float(
        1800.0,
        help="""Seconds an elastic node runs with nothing booked
        (no server, no job) before it is stopped.""",
    ).tag(config=True)
    join_timeout = Float(
        600.0,
        help="""Seconds from asking the provider for a node until its
        engine answers; a node that takes longer is given up (stopped) and its category backs
        off.""",
    ).tag(config=True)
    starts_per_hour = Int(
        10,
        help="""At most this many elastic nodes started in any hour
        (all categories together).""",
    ).tag(config=True)
    backoff = Float(
        60.0,
        help="""Seconds a category waits after a failed start before the
        next one; doubled after each further failure, up to backoff_max.""",
    ).tag(config=True)
    backoff_max = Float(1800.0, help="Longest back-off (seconds).").tag(config=True)
    interval = Float(5.0, help="Seconds between two looks of the elastic policy.").tag(config=True)
    categories = Dict(
        help="""Category name -> {min_nodes (default 0), max_nodes (default:
        its node entries), start_s (about how long a start takes, seconds; shown to users;
        default 120)}. A category is the `category` of elastic node entries."""
    ).tag(config=True)
    policy = AnyTrait(
        None,
        allow_none=True,
        help="""The site's own policy: a callable
        policy(view) -> [Decision] (gpuspawner.elastic.policy), or its dotted name; None =
        the default policy.""",
    ).tag(config=True)
    state_file = Unicode(
        "",
        help="""JSON file the elastic nodes' states are kept in across
        hub restarts; "" = gpuspawner-elastic.json in c.GPUSpawner.state_dir.""",
    ).tag(config=True)


@dataclass(frozen=True)
class CategorySettings:
    """One category: its nodes' names, limits and start time (seconds)."""

    name: str
    nodes: tuple[str, ...]
    min_nodes: int
    max_nodes: int
    start_s: float


@dataclass(frozen=True)
class ElasticSettings:
    """The checked ``c.GPUElastic`` settings (seconds; see :class:`GPUElastic`'s traits)."""

    categories: Mapping[str, CategorySettings]
    scale_out_after: float
    idle_shutdown: float
    join_timeout: float
    starts_per_hour: int
    backoff: float
    backoff_max: float
    interval: float
    policy: Policy
    state_file: str


def _policy(value: Any) -> Policy:
    if value is None or value == "":
        return default_policy
    if isinstance(value, str):
        mod, _, name = value.rpartition(".")
        try:
            value = getattr(import_module(mod), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ElasticConfigError(
                f"GPUElastic.policy: {value!r} cannot be imported: {e}"
            ) from None
    if not callable(value):
        raise ElasticConfigError(f"GPUElastic.policy: {value!r} is not callable")
    return value  # type: ignore[no-any-return]


def elastic_settings(
    conf: GPUElastic, node_categories: Mapping[str, list[str]], state_file: str
) -> ElasticSettings:
    """Check ``c.GPUElastic`` against the elastic node entries (category -> node names).

    Raises:
        ElasticConfigError: e.g. ``GPUElastic.categories.gpu.max_nodes: 3 is more than its 2
            node entries``, ``GPUElastic.categories.x: no elastic node has category 'x'``, a
            negative time, a policy that cannot be imported.
    """
    for key in ("scale_out_after", "idle_shutdown", "backoff", "backoff_max"):
        if getattr(conf, key) < 0:
            raise ElasticConfigError(f"GPUElastic.{key}: must be >= 0 seconds")
    for key in ("join_timeout", "interval"):
        if getattr(conf, key) <= 0:
            raise ElasticConfigError(f"GPUElastic.{key}: must be > 0 seconds")
    if conf.starts_per_hour < 0:
        raise ElasticConfigError("GPUElastic.starts_per_hour: must be >= 0")
    cats: dict[str, CategorySettings] = {}
    for name in conf.categories:
        if name not in node_categories:
            raise ElasticConfigError(
                f"GPUElastic.categories.{name}: no elastic node has category {name!r}"
            )
    for name, nodes in node_categories.items():
        entry = conf.categories.get(name, {})
        where = f"GPUElastic.categories.{name}"
        if not isinstance(entry, Mapping):
            raise ElasticConfigError(f"{where}: must be a mapping")
        unknown = set(entry) - set(CATEGORY_KEYS)
        if unknown:
            raise ElasticConfigError(
                f"{where}.{sorted(unknown)[0]}: unknown; known: {', '.join(CATEGORY_KEYS)}"
            )
        lo, hi = entry.get("min_nodes", 0), entry.get("max_nodes", len(nodes))
        start_s = entry.get("start_s", 120.0)
        for key, v in (("min_nodes", lo), ("max_nodes", hi)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ElasticConfigError(f"{where}.{key}: must be an integer >= 0")
        if hi > len(nodes):
            raise ElasticConfigError(
                f"{where}.max_nodes: {hi} is more than its {len(nodes)} "
                f"node entries ({', '.join(nodes)})"
            )
        if lo > hi:
            raise ElasticConfigError(f"{where}.min_nodes: {lo} is more than max_nodes {hi}")
        if not isinstance(start_s, (int, float)) or isinstance(start_s, bool) or start_s < 0:
            raise ElasticConfigError(f"{where}.start_s: must be a number of seconds >= 0")
        cats[name] = CategorySettings(name, tuple(nodes), lo, hi, float(start_s))
    return ElasticSettings(
        cats,
        conf.scale_out_after,
        conf.idle_shutdown,
        conf.join_timeout,
        conf.starts_per_hour,
        conf.backoff,
        conf.backoff_max,
        conf.interval,
        _policy(conf.policy),
        conf.state_file or state_file,
    )
