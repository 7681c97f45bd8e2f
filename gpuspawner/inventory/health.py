"""GPU health of this host through NVML: ECC errors, retired pages, remapped rows, XID events.

What is read per GPU, with nvidia-ml-py (module ``pynvml``) functions as named in the NVML API
reference (https://docs.nvidia.com/deploy/nvml-api/):

* ``nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)``:
  uncorrected (double-bit) ECC errors since the driver last loaded (count).
* ``nvmlDeviceGetRetiredPages(h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)``: addresses
  of pages retired for a double-bit error (list; we keep its length), and
  ``nvmlDeviceGetRetiredPagesPendingStatus(h)``: ``NVML_FEATURE_ENABLED`` when a page waits for
  retirement. NVIDIA's *Dynamic Page Retirement* document
  (https://docs.nvidia.com/deploy/dynamic-page-retirement/): after a DBE "no further context
  will be created on the GPU until the DBE is mapped out", which takes a GPU reset or reboot;
  so a pending retirement makes the GPU unhealthy. Kepler to Volta; Ampere and later answer
  NOT_SUPPORTED and use row remapping instead:
* ``nvmlDeviceGetRemappedRows(h)`` -> ``(corrected rows, uncorrected rows, pending, failure)``
  (NVIDIA's *GPU Memory Error Management*, https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/:
  a pending remap needs a GPU reset; a remapping failure means the board needs service).
* XID events: one event set (``nvmlEventSetCreate``), every GPU registered for
  ``nvmlEventTypeXidCriticalError`` (``nvmlDeviceRegisterEvents``), drained at each reading
  with ``nvmlEventSetWait(set, 0)`` until it raises ``NVML_ERROR_TIMEOUT``: a reading never
  blocks. The event's ``eventData`` is the XID number. NVML delivers only events that happen
  while the set exists, so :class:`HealthReader` keeps it open between readings (the hub), and
  ``gpuspawner health --listen S`` listens S seconds for a one-off reading.
* ``NVML_ERROR_GPU_IS_LOST`` from any of these calls: the GPU fell off the bus or is otherwise
  inaccessible (NVML API reference, ``nvmlReturn_t``); unhealthy.

Which XIDs mean the GPU needs attention (:data:`DEFAULT_XIDS`): NVIDIA's XID catalog
(https://docs.nvidia.com/deploy/xid-errors/): 48 double-bit ECC error, 63 ECC page
retirement or row-remapping recording event, 64 ECC page retirement or row-remapper recording
failure, 74 NVLink error, 79 GPU has fallen off the bus, 92 high single-bit ECC error rate,
94 contained ECC error, 95 uncontained ECC error. XIDs that point at the application (13, 31,
43: graphics engine exception, MMU fault, GPU stopped processing) are not in the set.

Tolerance: a check answering ``NVML_ERROR_NOT_SUPPORTED`` (ECC off or absent, consumer GPUs,
page retirement on Ampere, row remapping before Ampere, XID events on some platforms) or
``NVML_ERROR_FUNCTION_NOT_FOUND`` (an older driver) is skipped: its counter reads
``"not supported"`` and it makes no GPU unhealthy. NVML missing at ``nvmlInit`` means no GPUs
(as in :mod:`gpuspawner.inventory.local`).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["DEFAULT_XIDS", "GPUHealth", "HealthReader", "HealthThresholds", "read_health"]

log = logging.getLogger(__name__)

#: XID -> short meaning, for the XIDs that make a GPU unhealthy by default (NVIDIA XID catalog)
DEFAULT_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}

#: what a counter reads when its check answered NOT_SUPPORTED / FUNCTION_NOT_FOUND
NOT_SUPPORTED = "not supported"

#: at most this many events are taken from the event set per reading (never loop forever)
MAX_EVENTS_PER_READ = 1024


@dataclass(frozen=True)
class HealthThresholds:
    """When a GPU is unhealthy. Counts above the ``max_*`` values make it unhealthy.

    Attributes:
        max_uncorrected_ecc: volatile uncorrected ECC errors allowed (default 0: any
            uncorrected error since the driver loaded makes the GPU unhealthy).
        max_retired_pages_dbe: pages retired for double-bit errors allowed over the board's
            life (default 59; retired pages are already excluded from use, so a few are
            harmless; 60 is the count at which boards are commonly sent for replacement,
            a site's rule rather than an NVML one).
        pending_retirement: a pending page retirement or row remap makes the GPU unhealthy
            (default True; NVIDIA: the GPU needs a reset first).
        xids: XIDs that make a GPU unhealthy (default :data:`DEFAULT_XIDS`).
    """

    max_uncorrected_ecc: int = 0
    max_retired_pages_dbe: int = 59
    pending_retirement: bool = True
    xids: frozenset[int] = frozenset(DEFAULT_XIDS)


@dataclass
class GPUHealth:
    """One GPU's health reading.

    Attributes:
        uuid: NVML UUID (``GPU-...``).
        index: NVML index.
        healthy: no check crossed its threshold.
        reasons: one sentence per crossed threshold, e.g. ``"xid 79 (GPU fell off the bus)"``,
            ``"2 uncorrected ECC errors (volatile)"``; empty when healthy.
        counters: what was read: ``ecc_uncorrected_volatile`` (int), ``retired_pages_dbe``
            (int), ``retired_pages_pending`` (bool), ``remapped_rows_uncorrected`` (int),
            ``remapped_rows_pending`` (bool), ``remapped_rows_failure`` (bool), ``xids``
            (list of XID numbers seen in this reading, oldest first) or ``xid_events``
            (``"not supported"``); a check that was not supported reads ``"not supported"``.
    """

    uuid: str
    index: int
    healthy: bool
    reasons: list[str] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"uuid", "index", "healthy", "reasons", "counters"}``."""
        return {"uuid": self.uuid, "index": self.index, "healthy": self.healthy,
                "reasons": list(self.reasons), "counters": dict(self.counters)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _code(nvml: Any, name: str, default: int) -> int:
    return int(getattr(nvml, name, default))


def _unsupported(nvml: Any, e: Exception) -> bool:
    return getattr(e, "value", None) in (_code(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                                          _code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))


def _lost(nvml: Any, e: Exception) -> bool:
    return getattr(e, "value", None) == _code(nvml, "NVML_ERROR_GPU_IS_LOST", 15)


def _same_handle(a: Any, b: Any) -> bool:
    """Whether two device handles name the same device (pynvml's are ctypes pointers, which
    compare by object, so their addresses are compared)."""
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    return a is b or a == b


class _Lost(Exception):
    """NVML_ERROR_GPU_IS_LOST from a check (message: the NVML function)."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    events: bool = False


class HealthReader:
    """Reads the health of every GPU of this host; keeps NVML and the XID event set open
    between readings (:meth:`read`), so XIDs between two readings are seen.

    Args:
        nvml: the ``pynvml`` module or an object with the same functions (tests pass
            ``tests.nvml_double.FakeNVML``); None imports ``pynvml``.
        thresholds: when a GPU is unhealthy.

    Use as a context manager or call :meth:`close`. Calls must not overlap (its buffers are
    not locked); they may come from different threads one after the other, as the hub's
    worker threads do (the NVML API reference: NVML itself is thread-safe).
    """

    def __init__(self, nvml: ModuleType | Any | None = None,
                 thresholds: HealthThresholds | None = None) -> None:
        self.thresholds = thresholds or HealthThresholds()
        self._nvml = nvml
        self._open = False
        self._devices: list[_Device] = []
        self._event_set: Any = None
        #: XIDs taken from the event set and not yet judged: uuid -> [xid, ...]
        self._heard: dict[str, list[int]] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> bool:
        """``nvmlInit``, the devices and the XID event set. Returns False (and reads no GPUs)
        when NVML is missing or unusable. Idempotent."""
        if self._open:
            return True
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-untyped]
            except ImportError as e:
                log.info("pynvml is not importable (%s): no GPU health", e)
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            log.info("NVML unavailable (%s): no GPU health", e)
            return False
        self._open = True
        self._devices = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as e:
            log.warning("nvmlDeviceGetCount failed (%s): no GPU health", e)
            count = 0
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                self._devices.append(_Device(i, h, _text(nvml.nvmlDeviceGetUUID(h))))
            except nvml.NVMLError as e:
                log.warning("GPU %d: %s; no health for it", i, e)
        self._register_events()
        return True

    def _register_events(self) -> None:
        nvml = self._nvml
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if xid_type is None or not self._devices:
            return
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.info("nvmlEventSetCreate: %s; no XID events", e)
            return
        for d in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(d.handle, xid_type, self._event_set)
                d.events = True
            except nvml.NVMLError as e:
                level = logging.DEBUG if _unsupported(nvml, e) else logging.WARNING
                log.log(level, "GPU %s: XID events not registered: %s", d.uuid, e)

    def close(self) -> None:
        """Free the event set and ``nvmlShutdown`` (errors logged, never raised)."""
        if not self._open:
            return
        nvml = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as e:
                log.debug("nvmlEventSetFree: %s", e)
            self._event_set = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)
        self._open = False
        self._devices = []

    @property
    def events(self) -> bool:
        """Whether XID events are registered for at least one GPU."""
        return self._event_set is not None and any(d.events for d in self._devices)

    def __enter__(self) -> HealthReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------
    def poll_xids(self, timeout_ms: int = 0) -> dict[str, list[int]]:
        """Take the XID events waiting in the event set into the reader's buffer (the next
        :meth:`read` judges them); returns the buffer, ``{uuid: [xid, ...]}`` oldest first.
        The first wait uses ``timeout_ms`` (0: never blocks; ``gpuspawner health --listen``
        passes more), later ones 0, until NVML answers ``NVML_ERROR_TIMEOUT``."""
        if self._event_set is None:
            return self._heard
        nvml = self._nvml
        timeout_code = _code(nvml, "NVML_ERROR_TIMEOUT", 10)
        wait = timeout_ms
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, wait)
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != timeout_code:
                    log.warning("nvmlEventSetWait: %s", e)
                break
            wait = 0
            uuid = self._uuid_of(data.device)
            self._heard.setdefault(uuid, []).append(int(data.eventData))
        return self._heard

    def _uuid_of(self, handle: Any) -> str:
        nvml = self._nvml
        try:
            return _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError:  # a lost GPU: find it by its handle
            for d in self._devices:
                if _same_handle(d.handle, handle):
                    return d.uuid
            return "unknown"

    def read(self) -> list[GPUHealth]:
        """One reading of every GPU (opens NVML on first use): counters, XIDs since the last
        reading, and the verdict. Never blocks on events. Returns [] without NVML."""
        if not self.open():
            return []
        self.poll_xids(0)
        xids, self._heard = self._heard, {}
        return [self._judge(d, xids.get(d.uuid, [])) for d in self._devices]

    def _judge(self, d: _Device, xids: list[int]) -> GPUHealth:
        nvml, t = self._nvml, self.thresholds
        counters: dict[str, Any] = {}
        reasons: list[str] = []

        def call(key: str, fn_name: str, *args: Any) -> Any:
            fn = getattr(nvml, fn_name, None)
            if fn is None:
                counters[key] = NOT_SUPPORTED
                return None
            try:
                return fn(d.handle, *args)
            except nvml.NVMLError as e:
                if _lost(nvml, e):
                    raise _Lost(fn_name) from None
                if not _unsupported(nvml, e):
                    log.warning("GPU %s: %s: %s", d.uuid, fn_name, e)
                counters[key] = NOT_SUPPORTED if _unsupported(nvml, e) else f"error: {e}"
                return None

        try:
            ecc = call("ecc_uncorrected_volatile", "nvmlDeviceGetTotalEccErrors",
                       _code(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                       _code(nvml, "NVML_VOLATILE_ECC", 0))
            if ecc is not None:
                counters["ecc_uncorrected_volatile"] = n = int(ecc)
                if n > t.max_uncorrected_ecc:
                    reasons.append(f"{n} uncorrected ECC error{'s' if n != 1 else ''} "
                                   "(volatile)")
            pages = call("retired_pages_dbe", "nvmlDeviceGetRetiredPages",
                         _code(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
            if pages is not None:
                counters["retired_pages_dbe"] = n = len(pages)
                if n > t.max_retired_pages_dbe:
                    reasons.append(f"{n} pages retired for double-bit ECC errors")
            pending = call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
            if pending is not None:
                counters["retired_pages_pending"] = on = int(pending) == _code(
                    nvml, "NVML_FEATURE_ENABLED", 1)
                if on and t.pending_retirement:
                    reasons.append("page retirement pending (reset the GPU)")
            rows = call("remapped_rows", "nvmlDeviceGetRemappedRows")
            if rows is not None:
                _corr, unc, row_pending, failure = (int(v) for v in rows)
                counters.pop("remapped_rows", None)
                counters.update(remapped_rows_uncorrected=unc,
                                remapped_rows_pending=bool(row_pending),
                                remapped_rows_failure=bool(failure))
                if failure:
                    reasons.append("row remapping failed (the board needs service)")
                elif row_pending and t.pending_retirement:
                    reasons.append("row remapping pending (reset the GPU)")
        except _Lost as e:
            counters["lost"] = True
            reasons.append(f"GPU is lost ({e}: NVML_ERROR_GPU_IS_LOST)")
        if d.events:
            counters["xids"] = list(xids)
        else:
            counters["xid_events"] = NOT_SUPPORTED
        for x in dict.fromkeys(xids):  # each XID once, in order of first appearance
            if x in t.xids:
                reasons.append(f"xid {x}" + (f" ({DEFAULT_XIDS[x]})" if x in DEFAULT_XIDS
                                             else ""))
        return GPUHealth(d.uuid, d.index, not reasons, reasons, counters)


def read_health(nvml: ModuleType | Any | None = None,
                thresholds: HealthThresholds | None = None, listen_s: float = 0.0,
                uuids: Iterable[str] | None = None) -> list[GPUHealth]:
    """One reading of this host's GPUs (what ``gpuspawner health`` prints).

    Args:
        nvml: the ``pynvml`` module or a stand-in; None imports ``pynvml``.
        thresholds: when a GPU is unhealthy (default :class:`HealthThresholds`).
        listen_s: seconds to wait for XID events before reading (0: XIDs are not seen, since
            NVML delivers only events that happen while the event set exists).
        uuids: only these GPUs (None: all).

    Returns:
        one :class:`GPUHealth` per GPU, in NVML index order; [] without NVML.
    """
    with HealthReader(nvml, thresholds) as reader:
        deadline = time.monotonic() + listen_s
        while reader.events and (left := deadline - time.monotonic()) > 0:
            reader.poll_xids(max(1, int(left * 1000)))
        out = reader.read()
    wanted = set(uuids) if uuids is not None else None
    return [h for h in out if wanted is None or h.uuid in wanted]
