"""Prometheus metrics of notebook jobs, in the service's registry
(:data:`gpuspawner.hub.metrics.REGISTRY`, served at ``/services/gpuspawner/metrics``):

- ``gpuspawner_jobs{state}`` (gauge): jobs in the jobs database by state, counted at scrape
  time from the database (:class:`JobsCollector`), so it cannot drift from it; every state of
  :data:`~gpuspawner.jobs.model.STATES` is reported, 0 included.
- ``gpuspawner_job_wait_seconds{profile}`` (histogram): seconds from a job's due time (its
  submission, its ``at``, or the end of a retry's back-off) until it was placed.
- ``gpuspawner_job_gpu_seconds_total{profile}`` (counter): GPU-seconds held by jobs
  (GPUs of the allocation, a share as its fraction, times the seconds from the notebook's
  start until the attempt ended), counted when an attempt ends. By profile, not by user: user
  names are an unbounded set and each label value is a time series Prometheus keeps (a user's
  jobs are in the jobs API).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from ...jobs.model import STATES
from ..metrics import QUEUE_BUCKETS, REGISTRY
from .store import JobRow

log = logging.getLogger("gpuspawner")

__all__ = ["JOB_GPU_SECONDS", "JOB_WAIT", "JobsCollector", "gpu_seconds", "register",
           "waited"]

#: buckets in seconds: a due job is placed in well under a second when its bundle is free
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, *QUEUE_BUCKETS[1:])

JOB_WAIT = Histogram(
    "gpuspawner_job_wait_seconds",
    "Seconds from a notebook job's due time (submission, its 'at', or the end of a retry's "
    "back-off) until its bundle was placed, by profile",
    ["profile"], buckets=WAIT_BUCKETS, registry=REGISTRY)

JOB_GPU_SECONDS = Counter(
    "gpuspawner_job_gpu_seconds",
    "GPU-seconds held by notebook jobs (GPUs of the allocation, shares as fractions, times "
    "seconds running), by profile; counted when an attempt ends",
    ["profile"], registry=REGISTRY)


def waited(profile: str, seconds: float) -> None:
    """Observe one wait in :data:`JOB_WAIT` (negative waits count 0). Never raises."""
    try:
        JOB_WAIT.labels(profile=profile or "-").observe(max(0.0, seconds))
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot observe a job's wait: %s", e)


def gpu_seconds(profile: str, seconds: float) -> None:
    """Add ``seconds`` GPU-seconds of a job of ``profile`` (its slug; ``"-"`` if empty) to
    :data:`JOB_GPU_SECONDS`. Never raises."""
    try:
        if seconds > 0:
            JOB_GPU_SECONDS.labels(profile=profile or "-").inc(seconds)
    except Exception as e:  # pragma: no cover - defensive
        log.warning("metrics: cannot count a job's GPU-seconds: %s", e)


class JobsCollector(Collector):
    """``gpuspawner_jobs{state}`` from the jobs database at each scrape.

    Args:
        stores: returns the job stores to count (objects with a SQLAlchemy ``session``):
            the service's runner's, none before it is ready.
    """

    def __init__(self, stores: Callable[[], Iterable[Any]]) -> None:
        self._stores = stores

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counts = dict.fromkeys(STATES, 0)
        try:
            for store in self._stores():
                q = select(JobRow.state, func.count()).group_by(JobRow.state)
                for state, n in store.session.execute(q):
                    counts[state] = counts.get(state, 0) + int(n)
        except Exception as e:  # a scrape must answer
            log.warning("metrics: cannot count jobs: %s", e)
            return
        family = GaugeMetricFamily("gpuspawner_jobs", "Notebook jobs in the jobs database "
                                   "by state", labels=["state"])
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family


_STORES: list[Any] = []
_COLLECTOR: JobsCollector | None = None


def register(store: Any) -> JobsCollector:
    """Count ``store``'s jobs in :data:`REGISTRY` from now on (the collector is registered
    once per process; a later store replaces the earlier one: one runner per process)."""
    global _COLLECTOR
    _STORES[:] = [store]
    if _COLLECTOR is None:
        _COLLECTOR = JobsCollector(lambda: list(_STORES))
        REGISTRY.register(_COLLECTOR)
    return _COLLECTOR
