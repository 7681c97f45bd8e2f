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
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from math import fsum
from operator import itemgetter
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


class _Index:
    """One GPU's samples in time order, kept beside its ring: ``times`` (epoch s) and
    ``values`` (percent) from position ``head`` on, and per threshold the positions of the
    samples at or above it (made when first asked, in order). Made by the first
    :meth:`GPUHistory.mean` that asks for the GPU (a stable sort of the ring: equal times keep
    their order of arrival) and then kept up to date by :meth:`GPUHistory.add` while samples
    arrive in time order: a sample is appended and one that leaves the ring moves ``head``
    on, so a culler pass neither sorts nor copies a GPU's history. A sample older than the
    newest drops the index (made again when next asked), and so does every add while such a
    late sample is still in the ring (the ring's oldest is then not the index's oldest)."""

    __slots__ = ("times", "values", "head", "busy", "follows")

    def __init__(self, samples: Iterable[tuple[float, float]]) -> None:
        ring = list(samples)
        pairs = sorted(ring, key=itemgetter(0))
        #: the ring is in time order, so the sample that leaves it is the oldest here: only
        #: then can :meth:`GPUHistory.add` keep this index (else it is made again when asked)
        self.follows = pairs == ring
        self.times = [t for t, _ in pairs]
        self.values = [v for _, v in pairs]
        self.head = 0
        #: threshold -> [positions in ``times`` of the samples at or above it, first kept]
        self.busy: dict[float, list[Any]] = {}

    def append(self, t: float, v: float) -> None:
        """A sample no older than the newest (the caller checks)."""
        self.times.append(t)
        self.values.append(v)
        pos = len(self.times) - 1
        for threshold, (positions, _) in self.busy.items():
            if v >= threshold:
                positions.append(pos)

    def drop(self, k: int) -> None:
        """The ``k`` oldest samples left the ring; the lists are cut once half is dropped."""
        if k <= 0:
            return
        self.head += k
        for entry in self.busy.values():
            entry[1] = bisect_left(entry[0], self.head, entry[1])
        if self.head > 64 and self.head * 2 > len(self.times):
            h = self.head
            del self.times[:h], self.values[:h]
            for entry in self.busy.values():
                entry[0] = [p - h for p in entry[0][entry[1]:]]
                entry[1] = 0
            self.head = 0

    def busy_positions(self, threshold: float) -> list[Any]:
        """``[positions, first]``: the positions (in ``times``) of the samples whose percent is
        at least ``threshold``, in order; those before ``first`` have left the ring."""
        entry = self.busy.get(threshold)
        if entry is None:
            if len(self.busy) >= 8:  # thresholds come from the policies: a handful
                self.busy.clear()
            values = self.values
            entry = self.busy[threshold] = [
                [i for i in range(self.head, len(values)) if values[i] >= threshold], 0]
        return entry


class GPUHistory:
    """Thread-safe per-UUID ring of ``(epoch seconds, utilisation percent)``, at most
    ``max_age`` seconds (and ``max_samples`` entries) kept per GPU."""

    def __init__(self, max_age: float = 6 * 3600, max_samples: int = 20000) -> None:
        self.max_age = max_age
        self.max_samples = max_samples
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._first_seen: dict[str, float] = {}
        #: per GPU, its samples in time order (dropped by the next add for that GPU)
        self._index: dict[str, _Index] = {}

    def add(self, uuid: str, percent: float, t: float | None = None) -> None:
        t = time.time() if t is None else t
        v = float(percent)
        with self._lock:
            q = self._samples.get(uuid)
            if q is None:
                q = self._samples[uuid] = deque(maxlen=self.max_samples)
                self._first_seen[uuid] = t
            dropped = 1 if len(q) == q.maxlen else 0  # append drops the oldest of a full ring
            q.append((t, v))
            while q and q[0][0] < t - self.max_age:
                q.popleft()
                dropped += 1
                self._first_seen[uuid] = q[0][0] if q else t
            idx = self._index.get(uuid)
            if idx is not None:
                if not idx.follows or (len(idx.times) > idx.head and t < idx.times[-1]):
                    del self._index[uuid]  # out of time order: sorted again when next asked
                else:
                    idx.append(t, v)
                    idx.drop(dropped)

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

        A sample counts in the window when ``start <= t <= now`` (``start`` the later of
        ``now - window`` and ``since``); the samples need not arrive in time order. Each GPU's
        samples are sorted once after they change (:class:`_Index`), so a call costs two
        binary searches and the (correctly rounded) sum of the window's values, and
        ``busy_at`` one more search in the times at or above ``threshold``: O(log n + window)
        instead of a pass over every kept sample (up to ``max_samples``, 6 h of them by
        default) for each server of a culler pass."""
        now = time.time() if now is None else now
        parts: list[list[float]] = []
        n, covered, busy_at = 0, True, None
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
                idx = self._index.get(u)
                if idx is None:
                    idx = self._index[u] = _Index(q)
                times, h = idx.times, idx.head
                a, b = bisect_left(times, start, h), bisect_right(times, now, h)
                if b > a:
                    parts.append(idx.values[a:b])
                    n += b - a
                if threshold is None:
                    continue
                positions, first = idx.busy_positions(threshold)
                j = bisect_left(positions, b, first) - 1  # the last busy sample at or before now
                if j >= first:
                    tb = times[positions[j]]
                    if tb >= floor and (busy_at is None or tb > busy_at):
                        busy_at = tb
        # correctly rounded (math.fsum): the mean does not depend on the samples' arrival order
        mean = fsum(chain.from_iterable(parts)) / n if n else None
        return GPUWindow(mean, n, covered and n > 0 and bool(uuids), busy_at)


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
