"""Prometheus metrics of GPU placement, served by the hub service at
``/services/gpuspawner/metrics`` (``gpuspawner.hub.service``).

Two kinds:

- **state**, computed at scrape time from the hub process's ledger (``ClusterCollector``): no
  counter is kept beside the ledger, so the numbers cannot drift from it. GPUs
  (``gpuspawner_gpus``) / allocated / free by node and model, cores and memory, allocations and
  GPUs by group, the number of users holding allocations.
- **events**, which the ledger does not remember: placement refusals by reason (the spawner
  calls :func:`placement_refused` where it turns a refusal into HTTP 400) and spawn-to-ready
  time (:func:`track_spawn`, from the spawn request's pre-spawn hook until JupyterHub's spawn
  future completes: server answering and proxy route added).

All metrics live in :data:`REGISTRY` (not prometheus_client's default registry, which the hub
serves at ``/hub/metrics`` with its own metrics). Units follow Prometheus conventions: seconds,
bytes, GPUs (a fraction for shares: milli-GPU / 1000). Names follow Prometheus' naming guide: a
``_total`` suffix only on counters (prometheus_client adds it), and no label takes values from an
unbounded set such as user names (every label value is a time series kept by Prometheus); per-user
numbers are in the service's ``api/allocations`` and ``api/users/{name}/usage`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("gpuspawner")

#: the registry the service exposes
REGISTRY = CollectorRegistry(auto_describe=True)

PLACEMENT_REFUSALS = Counter(
    "gpuspawner_placement_refusals",
    "Spawns refused by the placement ledger, by reason (quota_<resource> for quotas; else the "
    "PlacementRefused reason: gpus, gpu_share, numa, cores, memory, disk, no_gpu_model, ...)",
    ["reason"], registry=REGISTRY)

#: buckets in seconds: a container start is 2-10 s here, image pulls and GPU inits take longer
SPAWN_BUCKETS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300)

SPAWN_READY = Histogram(
    "gpuspawner_spawn_ready_seconds",
    "Seconds from the spawn request (pre-spawn hook) until the server answers and is routed, "
    "by GPUs in the allocation (0, a share like 0.25, or whole GPUs)",
    ["gpus"], buckets=SPAWN_BUCKETS, registry=REGISTRY)


#: buckets in seconds for waits in the queue: seconds to hours
QUEUE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800)

QUEUE_WAIT = Histogram(
    "gpuspawner_queue_wait_seconds",
    "Seconds a spawn waited in the queue before its bundle was booked (spawns that did not "
    "wait count 0), by profile",
    ["profile"], buckets=QUEUE_BUCKETS, registry=REGISTRY)


SERVER_MOVES = Counter(
    "gpuspawner_server_moves",
    "Servers restarted on another node after their node failed, by outcome (moved, "
    "failed: no room or the start failed; limit: the server's restarts per hour were used up)",
    ["outcome"], registry=REGISTRY)


GPU_SHARE_ACTIONS = Counter(
    "gpuspawner_gpu_share_actions",
    "What the GPU share watchdog did to shares over their GPU memory (docs/gpu-sharing.md), by "
    "action (warn: first seen over; interrupt: SIGINT to the share's largest kernel after the "
    "grace period)",
    ["action"], registry=REGISTRY)


def gpu_share_action(action: str) -> None:
    """Count one watchdog action in :data:`GPU_SHARE_ACTIONS`. Never raises."""
    try:
        GPU_SHARE_ACTIONS.labels(action=action).inc()
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot count a GPU share action: %s", e)


def server_moved(outcome: str) -> None:
    """Count one restart elsewhere in :data:`SERVER_MOVES`. Never raises."""
    try:
        SERVER_MOVES.labels(outcome=outcome).inc()
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot count a server move: %s", e)


def queue_waited(profile: str, seconds: float) -> None:
    """Observe one wait in :data:`QUEUE_WAIT`. Never raises."""
    try:
        QUEUE_WAIT.labels(profile=profile or "-").observe(seconds)
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot observe queue wait: %s", e)


def refusal_reason(error: BaseException) -> str:
    """The ``reason`` label of a placement error: ``quota_<resource>`` (e.g.
    ``quota_gpu_milli``) for a QuotaExceeded, else the error's ``reason`` attribute."""
    resource = getattr(error, "resource", None)
    reason = str(getattr(error, "reason", "placement") or "placement")
    return f"quota_{resource}" if reason == "quota" and resource else reason


def placement_refused(error: BaseException) -> None:
    """Count one refusal (called by GPUSpawner.start before it answers HTTP 400). Never
    raises: metrics must not change what the user sees."""
    try:
        PLACEMENT_REFUSALS.labels(reason=refusal_reason(error)).inc()
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot count refusal %r: %s", error, e)


def gpus_label(milli: int) -> str:
    """``"0"``, ``"0.25"``, ``"1"``, ``"2"``: the GPUs of an allocation as a label value."""
    return f"{milli / 1000:g}"


def track_spawn(spawner: Any, clock=time.monotonic) -> None:
    """Measure this spawn's time to ready into :data:`SPAWN_READY`.

    Call it when the spawn starts (a pre-spawn hook: JupyterHub runs it inside ``User.spawn``,
    after ``BaseHandler.spawn_single_user`` has set ``spawner._spawn_future``, the future that
    completes when the server answers and its proxy route exists). Failed or cancelled spawns
    are not observed (the hub's own ``jupyterhub_server_spawn_duration_seconds`` counts them).
    Never raises.
    """
    started = clock()

    def done(fut: asyncio.Future) -> None:
        try:
            if fut.cancelled() or fut.exception() is not None or not spawner.ready:
                return
            alloc = getattr(spawner, "allocation", None)
            milli = alloc.total_gpu_milli if alloc is not None else 0
            SPAWN_READY.labels(gpus=gpus_label(milli)).observe(clock() - started)
        except Exception as e:  # pragma: no cover - defensive
            log.warning("metrics: spawn time of %s not recorded: %s", spawner, e)

    def attach() -> None:
        fut = getattr(spawner, "_spawn_future", None)
        if fut is None:
            log.debug("metrics: %s has no spawn future; spawn time not recorded", spawner)
            return
        fut.add_done_callback(done)

    try:
        attach()
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot track spawn of %s: %s", spawner, e)


class ClusterCollector(Collector):
    """Gauges computed from the ledgers of ``clusters()`` at each scrape.

    Args:
        clusters: returns the clusters to report, objects with ``ledger`` and ``queue`` (the
            hub service passes :func:`gpuspawner.hub.cluster.current_clusters`; given, not
            imported: the cluster's queue counts into this module's metrics, so this module
            stays below :mod:`gpuspawner.hub.cluster`).
    """

    def __init__(self, clusters: Callable[[], Iterable[Any]]) -> None:
        self._clusters = clusters

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: families are known only at scrape time

    def collect(self) -> Iterator[Metric]:
        total = GaugeMetricFamily("gpuspawner_gpus", "GPUs on the node",
                                  labels=["node", "model"])
        allocated = GaugeMetricFamily(
            "gpuspawner_gpus_allocated", "GPUs allocated (milli-GPU / 1000; shares count "
            "as fractions)", labels=["node", "model"])
        free = GaugeMetricFamily("gpuspawner_gpus_free", "GPUs with no allocation at all "
                                 "(drained GPUs are not free)", labels=["node", "model"])
        drained = GaugeMetricFamily("gpuspawner_gpus_drained", "GPUs taken out of placement "
                                    "(unhealthy or an admin's drain)", labels=["node", "model"])
        cores = GaugeMetricFamily("gpuspawner_cores", "Logical CPUs by state",
                                  labels=["node", "state"])
        memory = GaugeMetricFamily("gpuspawner_memory_bytes", "Memory by state, bytes",
                                   labels=["node", "state"])
        n_users = GaugeMetricFamily("gpuspawner_users_holding",
                                    "Users holding at least one allocation (no per-user label: "
                                    "user names are an unbounded set)")
        g_allocs = GaugeMetricFamily(
            "gpuspawner_group_allocations",
            "Allocations held by members of a group (group at reservation time)",
            labels=["group"])
        g_gpus = GaugeMetricFamily("gpuspawner_group_gpus", "GPUs held by members of a group",
                                   labels=["group"])
        q_len = GaugeMetricFamily("gpuspawner_queue_length",
                                  "Spawns waiting in the queue, by profile", labels=["profile"])
        q_oldest = GaugeMetricFamily(
            "gpuspawner_queue_oldest_wait_seconds",
            "Seconds the longest-waiting spawn of a profile has waited so far",
            labels=["profile"])
        users: set[str] = set()
        groups: dict[str, list[int]] = {}
        t = time.time()
        if _SKIP_LEDGER.get():
            return
        for cluster in self._clusters():
            ledger = cluster.ledger
            if cluster.queue is not None:
                oldest: dict[str, float] = {}
                for e in cluster.queue.wq.order():
                    oldest[e.profile] = max(oldest.get(e.profile, 0.0), t - e.enqueued)
                for prof, n in sorted(cluster.queue.wq.count_by_profile().items()):
                    q_len.add_metric([prof or "-"], n)
                    q_oldest.add_metric([prof or "-"], oldest[prof])
            for node in ledger.snapshot():
                by_model: dict[str, list[float]] = {}
                for g in node["gpus"]:
                    row = by_model.setdefault(g["model"] or "unknown", [0, 0.0, 0, 0])
                    out = g.get("drained") is not None
                    row[0] += 1
                    row[1] += g["milli_used"] / 1000
                    row[2] += g["milli_used"] == 0 and not out
                    row[3] += out
                for model, (n, used, untouched, held) in sorted(by_model.items()):
                    total.add_metric([node["name"], model], n)
                    allocated.add_metric([node["name"], model], used)
                    free.add_metric([node["name"], model], untouched)
                    drained.add_metric([node["name"], model], held)
                n_cpu = sum(len(nn["cpus"]) for nn in node["numa_nodes"])
                n_free = sum(len(nn["cpus_free"]) for nn in node["numa_nodes"])
                cores.add_metric([node["name"], "total"], n_cpu)
                cores.add_metric([node["name"], "allocated"], n_cpu - n_free)
                mem = sum(nn["memory_bytes"] for nn in node["numa_nodes"])
                mem_free = sum(nn["memory_free_bytes"] for nn in node["numa_nodes"])
                memory.add_metric([node["name"], "total"], mem)
                memory.add_metric([node["name"], "allocated"], mem - mem_free)
            for a in ledger.allocations():
                users.add(a.owner.user)
                for g in a.owner.groups:
                    grow = groups.setdefault(g, [0, 0])
                    grow[0] += 1
                    grow[1] += a.total_gpu_milli
        n_users.add_metric([], len(users))
        for group, (n, milli) in sorted(groups.items()):
            g_allocs.add_metric([group], n)
            g_gpus.add_metric([group], milli / 1000)
        yield from (total, allocated, free, drained, cores, memory, n_users, g_allocs, g_gpus,
                    q_len, q_oldest)


#: label sets the usage counters keep at most; later ones count under group "_other" (and
#: user "_other"): every label set is a time series Prometheus keeps
USAGE_MAX_SERIES = 1000


class UsageCounters(Collector):
    """Counters of reserved and used GPU-seconds and core-seconds of the usage records, by
    group and profile (docs/usage.md, "Metrics"), fed by the usage recorder's ``on_close``
    callback (:meth:`count`; :class:`gpuspawner.usage.recorder.ClosedInterval`), in each
    group its user was in at the booking ("-" for none; the groups' sums may exceed the
    total), profile "-" when unknown. The reserved counters also hold the records still open
    up to the scrape (``open_intervals``, the recorder's), so they grow while a server runs;
    the used ones count a record when it closes (its mean utilisation is known then). Time
    before :attr:`since` (this process's start) is not counted: a server adopted after a hub
    restart counts from the restart, so the counters start near 0 as Prometheus expects of a
    counter after a restart.

    - ``gpuspawner_usage_reserved_gpu_seconds_total``: GPUs held x seconds (milli-GPU / 1000);
    - ``gpuspawner_usage_reserved_core_seconds_total``: cores held x seconds;
    - ``gpuspawner_usage_used_gpu_seconds_total``: GPUs x seconds x mean utilisation / 100,
      of the records with a utilisation figure;
    - ``gpuspawner_usage_used_core_seconds_total``: CPU seconds the processes used, of the
      records with a CPU figure;
    - ``gpuspawner_usage_intervals_total``: records closed.

    Args:
        user_label: add a ``user`` label (``c.GPUUsage.metrics_user_label``; off by default:
            user names are an unbounded set).
        max_series: label sets kept at most (:data:`USAGE_MAX_SERIES`).
    """

    FIGURES = (("reserved_gpu_seconds", "GPU-seconds reserved (GPUs held x seconds; a share "
                "counts its fraction)"),
               ("reserved_core_seconds", "Core-seconds reserved (cores held x seconds)"),
               ("used_gpu_seconds", "GPU-seconds used (reserved x mean GPU utilisation / 100), "
                "of the intervals whose GPUs were measured"),
               ("used_core_seconds", "CPU seconds used by the servers' and jobs' processes, of "
                "the intervals measured"),
               ("intervals", "Usage intervals closed"))

    def __init__(self, user_label: bool = False, max_series: int = USAGE_MAX_SERIES,
                 clock: Callable[[], float] = time.time) -> None:
        self.user_label = user_label
        self.max_series = max_series
        #: seconds since the epoch from which time counts
        self.since = clock()
        #: the open intervals (ending now) added at each scrape; None: closed ones only
        self.open_intervals: Callable[[], Iterable[Any]] | None = None
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], list[float]] = {}

    def describe(self) -> Iterable[Metric]:
        return []

    def _key(self, group: str, profile: str, user: str,
             counts: dict[tuple[str, ...], list[float]] | None = None) -> tuple[str, ...]:
        counts = self._counts if counts is None else counts
        key = (group, profile, user) if self.user_label else (group, profile)
        if key in counts or len(counts) < self.max_series:
            return key
        return ("_other", profile, "_other") if self.user_label else ("_other", profile)

    def count(self, interval: Any) -> None:
        """Add one closed interval (a :class:`~gpuspawner.usage.recorder.ClosedInterval`:
        ``user, groups, profile, gpu_milli, cpu_milli, seconds, gpu_util_percent,
        cpu_seconds``). Never raises (logged)."""
        try:
            with self._lock:
                self._add(self._counts, interval, closed=True)
        except Exception as e:  # pragma: no cover - defensive
            log.warning("metrics: a usage interval was not counted: %s", e)

    def _add(self, counts: dict[tuple[str, ...], list[float]], interval: Any,
             closed: bool) -> None:
        """Add ``interval``'s figures (from :attr:`since`) to ``counts``; an open one adds its
        reserved seconds only."""
        secs = max(0.0, float(interval.ended) - max(float(interval.started), self.since))
        gpu = interval.gpu_milli / 1000.0 * secs
        core = interval.cpu_milli / 1000.0 * secs
        util = interval.gpu_util_percent if closed else None
        used_gpu = gpu * float(util) / 100.0 if util is not None and gpu > 0 else 0.0
        used_core = float(interval.cpu_seconds or 0.0) if closed else 0.0
        for group in sorted(set(interval.groups)) or ["-"]:
            key = self._key(group or "-", interval.profile or "-", interval.user, counts)
            row = counts.setdefault(key, [0.0] * len(self.FIGURES))
            for i, v in enumerate((gpu, core, used_gpu, used_core, 1.0 if closed else 0.0)):
                row[i] += v

    def _now(self) -> dict[tuple[str, ...], list[float]]:
        """The counts with the open intervals up to now added."""
        opened = list(self.open_intervals()) if self.open_intervals is not None else []
        with self._lock:
            counts = {k: list(v) for k, v in self._counts.items()}
            for interval in opened:
                self._add(counts, interval, closed=False)
        return counts

    def value(self, figure: str, group: str, profile: str, user: str = "") -> float:
        """One counter's value now (0 when never counted); ``figure`` of :attr:`FIGURES`."""
        i = [f for f, _ in self.FIGURES].index(figure)
        counts = self._now()
        with self._lock:
            row = counts.get(self._key(group, profile, user, counts))
            return row[i] if row else 0.0

    def collect(self) -> Iterator[Metric]:
        deferred = _DEFERRED.get()
        if deferred is not None:  # the service's scrape: counted in its worker thread
            deferred.append(self)
            return
        labels = ["group", "profile", "user"] if self.user_label else ["group", "profile"]
        families = [CounterMetricFamily(f"gpuspawner_usage_{name}", doc, labels=labels)
                    for name, doc in self.FIGURES]
        try:
            items = sorted(self._now().items())
        except Exception as e:  # pragma: no cover - defensive: a scrape never fails for it
            log.warning("metrics: the open usage intervals were not read: %s", e)
            with self._lock:
                items = sorted((k, list(v)) for k, v in self._counts.items())
        for key, row in items:
            for fam, v in zip(families, row, strict=True):
                fam.add_metric(list(key), v)
        yield from families


_USAGE: UsageCounters | None = None


def usage_counters(user_label: bool = False) -> UsageCounters:
    """The usage counters of this process in :data:`REGISTRY` (made and registered on the
    first call; a later call with another ``user_label`` keeps the first one's labels and
    logs it)."""
    global _USAGE
    if _USAGE is None:
        _USAGE = UsageCounters(user_label)
        REGISTRY.register(_USAGE)
    elif _USAGE.user_label != user_label:
        log.warning("metrics: the usage counters keep user_label=%s", _USAGE.user_label)
    return _USAGE


_COLLECTOR: ClusterCollector | None = None

#: set while :func:`other_families` collects: the ledger gauges are left out
_SKIP_LEDGER: ContextVar[bool] = ContextVar("gpuspawner_skip_ledger_gauges", default=False)
#: set while :func:`other_families` collects: the collectors that count in the scrape's worker
#: thread instead (the usage counters: O(open records), thread-safe) put themselves here
_DEFERRED: ContextVar[list[Any] | None] = ContextVar("gpuspawner_deferred_collectors",
                                                     default=None)


class _InThread:
    """A collector whose families :func:`latest_from` collects (in the worker thread)."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector


def reported_clusters() -> list[Any]:
    """The clusters the ledger gauges report (:func:`register_cluster_collector`'s), [] when
    none is registered. Read them on the event loop."""
    return list(_COLLECTOR._clusters()) if _COLLECTOR is not None else []


def other_families() -> list[Any]:
    """Every metric family of :data:`REGISTRY` but the ledger gauges, collected now: call it
    on the event loop (other collectors read what the loop owns, e.g. the jobs database's
    session). The usage counters (:class:`UsageCounters`, which add every open record) are
    not collected here: the list holds them for :func:`latest_from`, which collects them in
    its worker thread."""
    deferred: list[Any] = []
    token = _SKIP_LEDGER.set(True)
    later = _DEFERRED.set(deferred)
    try:
        families: list[Any] = list(REGISTRY.collect())
    finally:
        _DEFERRED.reset(later)
        _SKIP_LEDGER.reset(token)
    return families + [_InThread(c) for c in deferred]


class _Families:
    """Families already collected, in the shape ``generate_latest`` reads (``collect()``)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def latest_from(frozen: list[Any], others: list[Metric] | None = None) -> bytes:
    """The service's ``metrics`` text (Prometheus' format): ``others`` (from
    :func:`other_families`, taken on the loop; the usage counters it held back collected
    here) and the ledger gauges computed from ``frozen`` (copies of
    :func:`reported_clusters` taken on the loop:
    :class:`~gpuspawner.hub.service.frozen.FrozenCluster`). Reads nothing the loop owns: run
    it in a worker thread (the gauges walk every allocation, the usage counters every open
    record)."""
    families: list[Metric] = []
    for f in others or []:
        if isinstance(f, _InThread):
            families.extend(f.collector.collect())
        else:
            families.append(f)
    gauges = list(ClusterCollector(lambda: frozen).collect())
    return generate_latest(_Families([*families, *gauges]))  # type: ignore[arg-type]


def register_cluster_collector(clusters: Callable[[], Iterable[Any]]) -> ClusterCollector:
    """Add the ledger gauges of ``clusters()`` (:class:`ClusterCollector`) to :data:`REGISTRY`
    (once per process: a second call returns the first collector)."""
    global _COLLECTOR
    if _COLLECTOR is None:
        _COLLECTOR = ClusterCollector(clusters)
        REGISTRY.register(_COLLECTOR)
    return _COLLECTOR
