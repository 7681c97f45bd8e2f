"""What the booked GPUs of this host use: :class:`GPUSampler` reads, every
``c.GPUUsage.sample_interval`` seconds, NVML's utilisation (``nvmlDeviceGetUtilizationRates``
``.gpu``: the percent of the last sample period, 1/6 s to 1 s, in which a kernel ran; NVML API
reference, ``nvmlUtilization_t``) and memory used (``nvmlDeviceGetMemoryInfo().used``, bytes) of
the GPUs that open usage intervals hold, and hands them to the recorder
(:meth:`~gpuspawner.usage.recorder.UsageRecorder.add_gpu_sample`): each interval gets the mean
of its GPUs' samples and their peak memory.

Only GPUs of nodes read from the hub's own host (``topology: auto``) can be read here: a
remote node's GPUs have no figure (the idle culler's own sampler on that node, or DCGM, would
have to send them; not done yet). A MIG instance has no utilisation of its own in NVML (the
reading is the parent GPU's); its intervals get none. NVML calls run in a worker thread, never
on the hub's event loop. CPU seconds come from the backend (:func:`read_cpu`: the Docker
engine's container stats; none from Slurm yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .recorder import UsageRecorder

log = logging.getLogger("gpuspawner")

__all__ = ["GPUSampler", "read_cpu", "run_readings"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GPUSampler:
    """Reads the GPUs of this host that open intervals hold.

    Args:
        recorder: where the readings go.
        local_uuids: the UUIDs of the GPUs NVML on this host can read (the ``topology: auto``
            nodes' GPUs); a reading of any other GPU is never attributed.
        nvml: the ``pynvml`` module or an object with its functions (tests:
            :class:`gpuspawner.testing.nvml_metrics.MetricsNVML`); None imports ``pynvml``.

    Not thread-safe: one reading at a time (:func:`run_sampler` runs them one after the
    other).
    """

    def __init__(
        self, recorder: UsageRecorder, local_uuids: Callable[[], set[str]], nvml: Any = None
    ) -> None:
        self.recorder = recorder
        self.local_uuids = local_uuids
        self._nvml = nvml
        self._handles: dict[str, Any] | None = None

    def open(self) -> bool:
        """``nvmlInit`` and the handles by UUID; False (and no readings) without NVML."""
        if self._handles is not None:
            return True
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-untyped]
            except ImportError as e:
                log.info("usage: pynvml is not importable (%s): no GPU utilisation", e)
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            handles = {}
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                handles[_text(nvml.nvmlDeviceGetUUID(h))] = h
        except Exception as e:  # NVML missing or failing: no figures, never a failure
            log.info("usage: NVML unusable (%s): no GPU utilisation", e)
            return False
        self._handles = handles
        return True

    def sample_once(self) -> int:
        """Read every held GPU of this host once. Returns how many GPUs were read."""
        if not self.open():
            return 0
        assert self._handles is not None
        nvml = self._nvml
        wanted = self.recorder.held_uuids() & self.local_uuids()
        n = 0
        for uuid in sorted(wanted):
            h = self._handles.get(uuid)
            if h is None:
                continue
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # noqa: BLE001 - NotSupported, a lost GPU: no utilisation
                util = None
            try:
                used = int(nvml.nvmlDeviceGetMemoryInfo(h).used)
            except Exception:  # noqa: BLE001
                used = None
            if util is None and used is None:
                continue
            self.recorder.add_gpu_sample(uuid, util, used)
            n += 1
        return n

    def close(self) -> None:
        if self._handles is not None and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        self._handles = None


async def read_cpu(recorder: UsageRecorder, backend: Any) -> int:
    """Ask the backend for the CPU seconds its running servers and jobs used so far
    (:meth:`~gpuspawner.backends.base.Backend.cpu_seconds`) and give each open interval its
    figure. Returns how many intervals got one."""
    figures = await backend.cpu_seconds()
    n = 0
    for alloc_id, seconds in figures.items():
        if recorder.is_open(alloc_id):
            recorder.set_cpu_seconds(alloc_id, seconds)
            n += 1
    return n


async def run_readings(
    recorder: UsageRecorder,
    interval_s: float,
    *,
    gpu: GPUSampler | None = None,
    backend: Any = None,
    flush_every_s: float = 300.0,
) -> None:
    """Every ``interval_s`` seconds read the held GPUs of this host (``gpu``, in a worker
    thread) and the CPU seconds of the running servers (``backend``), and write the figures
    so far every ``flush_every_s`` seconds (:meth:`UsageRecorder.flush_used`: they survive a
    restart). A record's CPU seconds are those of the last reading before its release (up to
    ``interval_s`` short). Runs until cancelled; errors are logged and the loop goes on."""
    loop = asyncio.get_running_loop()
    flushed = loop.time()
    while True:
        try:
            if recorder.open_count():
                if gpu is not None:
                    await asyncio.to_thread(gpu.sample_once)
                if backend is not None:
                    await read_cpu(recorder, backend)
            if loop.time() - flushed >= flush_every_s:
                flushed = loop.time()
                await asyncio.to_thread(recorder.flush_used)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the readings must outlive any one error
            log.warning("usage readings: %s", e)
        await asyncio.sleep(interval_s)
