"""GPU utilisation sources and their sample history.

A *source* fills a :class:`GPUHistory` with ``(time, percent)`` samples keyed by GPU UUID
(``GPU-xxxxxxxx-...``, the form GPUSpawner stores in the allocation's ``gpus[].uuid``):

- :class:`NVMLSampler`: a background thread on the node that calls
  ``nvmlDeviceGetHandleByUUID`` + ``nvmlDeviceGetUtilizationRates(h).gpu`` every
  ``interval`` seconds. NVML's value is the percent of time a kernel ran during the last sample
  period (1/6 s to 1 s depending on the product; NVML API reference, ``nvmlUtilization_t``), so
  one reading says little: we keep every sample and average over the policy's window.
- :class:`PrometheusSource`: scrapes an endpoint in NVIDIA dcgm-exporter's text format
  (default port 9400) and reads ``DCGM_FI_DEV_GPU_UTIL`` (percent) by its ``UUID`` label.

:meth:`GPUHistory.mean` is the mean over a window of all samples of a server's GPUs, and says
whether the samples cover the window (a source that started observing a GPU 10 s ago cannot
tell that it was idle for 10 minutes).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("idle_culler.gpu")

_NEG_INF = float("-inf")


@dataclass
class GPUWindow:
    """Result of :meth:`GPUHistory.mean`: ``mean`` in percent (None without samples),
    ``samples`` used, ``covered``: True when the oldest sample of every GPU is at least
    ``window`` seconds old (the GPUs were observed for the whole window), ``busy_at``: the time
    (epoch s) of the latest sample at or above the threshold, or None."""

    mean: float | None
    samples: int
    covered: bool
    busy_at: float | None


class GPUHistory:
    """Thread-safe per-UUID ring of ``(epoch seconds, utilisation percent)``, at most
    ``max_age`` seconds (and ``max_samples`` entries) kept per GPU."""

    def __init__(self, max_age: float = 6 * 3600, max_samples: int = 20000) -> None:
        self.max_age = max_age
        self.max_samples = max_samples
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._first_seen: dict[str, float] = {}

    def add(self, uuid: str, percent: float, t: float | None = None) -> None:
        t = time.time() if t is None else t
        with self._lock:
            q = self._samples.get(uuid)
            if q is None:
                q = self._samples[uuid] = deque(maxlen=self.max_samples)
                self._first_seen[uuid] = t
            q.append((t, float(percent)))
            while q and q[0][0] < t - self.max_age:
                q.popleft()
                self._first_seen[uuid] = q[0][0] if q else t

    def uuids(self) -> list[str]:
        with self._lock:
            return list(self._samples)

    def mean(self, uuids: Iterable[str], window: float, now: float | None = None,
             threshold: float | None = None, since: float | None = None) -> GPUWindow:
        """Mean utilisation (percent) of ``uuids`` over ``[now - window, now]``, counting no
        sample before ``since`` (the server's start: a GPU's samples from before the server
        had it, idle or another tenant's, are not the server's); the window is covered only
        when the samples, and the server, go back all of it. ``busy_at``: the latest sample
        time in ``[since, now]`` whose percent is at least ``threshold`` (None without
        ``threshold``).

        One pass over each GPU's samples with the bounds worked out before it: a sample
        counts in the window when ``start <= t <= now`` (``start`` the later of ``now -
        window`` and ``since``); the samples need not be in time order."""
        now = time.time() if now is None else now
        total, n, covered, busy_at = 0.0, 0, True, None
        uuids = list(uuids)
        lo = now - window
        if since is not None and since > lo:
            covered = False
            start = since
        else:
            start = lo
        # (``since`` NaN or None: no sample is left out for it, as ``t < since`` never holds)
        floor = since if since is not None and since > _NEG_INF else _NEG_INF
        with self._lock:
            for u in uuids:
                q = self._samples.get(u)
                if not q:
                    covered = False
                    continue
                if self._first_seen.get(u, now) > lo:
                    covered = False
                if threshold is None:
                    for t, v in q:
                        if start <= t <= now:
                            total += v
                            n += 1
                    continue
                for t, v in q:
                    if t <= now:
                        if t >= start:
                            total += v
                            n += 1
                        if v >= threshold and t >= floor and (busy_at is None or t > busy_at):
                            busy_at = t
        return GPUWindow(total / n if n else None, n, covered and n > 0 and bool(uuids), busy_at)


class NVMLSampler:
    """Samples ``nvmlDeviceGetUtilizationRates(handle).gpu`` (percent) of every GPU on this
    node every ``interval`` seconds in a daemon thread, into ``history``.

    ``nvml`` is the ``pynvml`` module of nvidia-ml-py (or a test double with the same API).
    Handles are looked up by UUID (``nvmlDeviceGetHandleByUUID``) for the UUIDs in ``uuids()``
    (the allocations seen in the last pass), else for every device by index. Errors of one GPU
    (``NVMLError_NotSupported`` on MIG devices, a lost GPU) skip that GPU; failure of
    ``nvmlInit`` stops the sampler with a logged error (``available`` is then False).
    """

    def __init__(self, history: GPUHistory, interval: float = 5.0, nvml: Any = None,
                 uuids: Callable[[], Iterable[str]] | None = None) -> None:
        self.history = history
        self.interval = interval
        self.nvml = nvml
        self.uuids = uuids
        self.available = False
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        if self.nvml is None:
            import pynvml

            self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound etc.
            self.error = f"nvmlInit failed: {e}"
            log.error("NVML source disabled: %s", self.error)
            return False
        self.available = True
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False

    def _handles(self) -> list[tuple[str, Any]]:
        nv = self.nvml
        out: list[tuple[str, Any]] = []
        wanted = list(self.uuids()) if self.uuids else []
        if wanted:
            for u in wanted:
                try:
                    out.append((u, nv.nvmlDeviceGetHandleByUUID(u)))
                except Exception:  # not on this node
                    continue
            return out
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            u = nv.nvmlDeviceGetUUID(h)
            out.append((u.decode() if isinstance(u, bytes) else u, h))
        return out

    def sample_once(self) -> int:
        """Read every GPU once; returns the number of samples stored."""
        n = 0
        try:
            handles = self._handles()
        except Exception as e:
            log.warning("NVML: cannot list GPUs: %s", e)
            return 0
        for uuid, h in handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
            except Exception as e:
                log.debug("NVML: %s: %s", uuid, e)
                continue
            self.history.add(uuid, float(util.gpu))
            n += 1
        return n

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)


def parse_dcgm(text: str, metric: str = "DCGM_FI_DEV_GPU_UTIL") -> dict[str, float]:
    """``{UUID: value}`` for ``metric`` in Prometheus text exposition format (dcgm-exporter
    writes ``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",...} 37``), parsed with
    ``prometheus_client.parser``. Series without a UUID label and NaN values are skipped; a
    document that does not parse gives what was read before the bad line. For MIG instances
    dcgm-exporter repeats the parent's UUID; several series per UUID are averaged."""
    from prometheus_client.parser import text_string_to_metric_families

    acc: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != metric:
                    continue
                uuid = sample.labels.get("UUID") or sample.labels.get("uuid")
                v = float(sample.value)
                if uuid and v == v:  # NaN != NaN
                    acc.setdefault(uuid, []).append(v)
    except ValueError as e:
        log.warning("dcgm-exporter text: stopped at a line that does not parse: %s", e)
    return {u: sum(vs) / len(vs) for u, vs in acc.items()}


class PrometheusSource:
    """Scrapes dcgm-exporter endpoints (``urls``, e.g. ``http://node-1:9400/metrics``) every
    ``interval`` seconds on the culler's event loop; each scrape adds one sample per GPU UUID to
    ``history``. A failing endpoint is logged and retried at the next interval."""

    def __init__(self, history: GPUHistory, urls: list[str], interval: float = 15.0,
                 metric: str = "DCGM_FI_DEV_GPU_UTIL", timeout: float = 5.0) -> None:
        self.history = history
        self.urls = urls
        self.interval = interval
        self.metric = metric
        self.timeout = timeout
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    async def scrape_once(self) -> int:
        from tornado.httpclient import AsyncHTTPClient

        client = AsyncHTTPClient()
        n = 0
        for url in self.urls:
            try:
                r = await client.fetch(url, request_timeout=self.timeout)
            except Exception as e:
                self.errors += 1
                log.warning("DCGM exporter %s: %s", url, e)
                continue
            now = time.time()
            for uuid, v in parse_dcgm(r.body.decode(errors="replace"), self.metric).items():
                self.history.add(uuid, v, now)
                n += 1
        return n

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.interval)
