"""One background NVML sampler shared by every client (server handlers, the kernel widget).

The sampler runs in a daemon THREAD, never on an event loop. It samples every ``interval``
seconds while someone looked (:meth:`Sampler.touch`) in the last ``standby_after`` seconds and
sleeps otherwise (standby). Static data (name, UUID, total memory, PCI bus id, NUMA node, MIG)
is read once and cached; a bounded history keeps the last ``history_seconds``.

States (``state`` in every snapshot):

``ok``          NVML answered and sees at least one GPU
``no_nvml``     the NVML library or the driver is missing (LibraryNotFound, DriverNotLoaded,
                FunctionNotFound, or pynvml not importable)
``no_gpu``      NVML works but sees no GPU
``permission``  NVML refused (NO_PERMISSION), e.g. the parent GPU in a MIG-only container
``error``       anything else (the message says what)

The NVML module is ``pynvml`` unless ``GPUSPAWNER_NVML_FACTORY=module:attr`` names another
(a module, or a callable returning one): the tests inject their NVML double that way.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpuspawner.singleuser.gpuviews")

NVML_FACTORY_ENV = "GPUSPAWNER_NVML_FACTORY"
ALLOCATION_ENV = "GPUSPAWNER_ALLOCATION"

# NVML error codes (nvml.h)
_NO_NVML_CODES = {9, 12, 13}  # DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND
_NO_PERMISSION = 4
_NOT_SUPPORTED = 3


def load_nvml(spec: str | None = None) -> Any:
    """The NVML module: ``spec`` / ``$GPUSPAWNER_NVML_FACTORY`` (``module:attr``) or pynvml."""
    spec = spec if spec is not None else os.environ.get(NVML_FACTORY_ENV, "")
    if not spec:
        import pynvml
        return pynvml
    mod_name, _, attr = spec.partition(":")
    obj = importlib.import_module(mod_name)
    if attr:
        obj = getattr(obj, attr)
        if callable(obj) and not hasattr(obj, "nvmlInit"):
            obj = obj()
    return obj


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _code(e: BaseException) -> int | None:
    return getattr(e, "value", None)


def classify(e: BaseException) -> tuple[str, str]:
    """(state, message) for an exception raised by nvmlInit / nvmlDeviceGetCount."""
    code = _code(e)
    if isinstance(e, ImportError) or code in _NO_NVML_CODES:
        return "no_nvml", f"NVML is not available here ({e}); no GPU data can be shown"
    if code == _NO_PERMISSION:
        return "permission", f"NVML refused access ({e})"
    return "error", f"NVML error: {e}"


def read_allocation(env: dict[str, str] | None = None) -> tuple[dict | None, list[str]]:
    """The spawner's allocation (``$GPUSPAWNER_ALLOCATION``, JSON) and parse warnings."""
    raw = (env if env is not None else os.environ).get(ALLOCATION_ENV)
    if not raw:
        return None, []
    try:
        alloc = json.loads(raw)
    except ValueError as e:
        return None, [f"{ALLOCATION_ENV} is not JSON: {e}"]
    if not isinstance(alloc, dict):
        return None, [f"{ALLOCATION_ENV} is not a JSON object"]
    return alloc, []


def allocation_uuids(alloc: dict | None) -> list[str]:
    """GPU UUIDs of an allocation dict (GPUSpawner's ``GPUSPAWNER_ALLOCATION`` shape)."""
    if not alloc:
        return []
    out = []
    for g in alloc.get("gpus") or []:
        if isinstance(g, dict) and g.get("uuid"):
            out.append(str(g["uuid"]))
        elif isinstance(g, str):
            out.append(g)
    return out


def sparkline(values: list[float | None], width: int = 30) -> str:
    """A text sparkline of percentages (None shown as a blank)."""
    bars = "▁▂▃▄▅▆▇█"
    vals = values[-width:]
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            out.append(bars[min(len(bars) - 1, max(0, int(v / 100 * len(bars))))])
    return "".join(out)


class Sampler:
    """A background NVML sampler thread; every public method is thread-safe and cheap.

    Args:
        nvml: the NVML module (or double); None loads it lazily in the thread via
            :func:`load_nvml`.
        interval: seconds between samples while active.
        standby_after: seconds without :meth:`touch` after which sampling stops.
        history_seconds: how long the history reaches back.
        pid_resolver: called in the sampler thread with the set of PIDs NVML reports; returns
            ``{pid: kernel_id}`` for those that belong to this server's kernels.
        allocation: the spawner's allocation; default from the environment.
    """

    def __init__(self, nvml: Any = None, *, interval: float = 1.0, standby_after: float = 30.0,
                 history_seconds: float = 300.0,
                 pid_resolver: Callable[[set[int]], dict[int, str]] | None = None,
                 allocation: dict | None | bool = False) -> None:
        self._nvml = nvml
        self.interval = float(interval)
        self.standby_after = float(standby_after)
        self.history: deque[dict[str, Any]] = deque(
            maxlen=max(1, int(history_seconds / max(self.interval, 0.01))))
        self.pid_resolver = pid_resolver
        if allocation is False:
            self.allocation, self._alloc_warnings = read_allocation()
        else:
            self.allocation, self._alloc_warnings = allocation or None, []  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._fresh = threading.Condition(self._lock)
        self._last_touch = 0.0
        self._thread: threading.Thread | None = None
        self._initialized = False
        self._static: list[dict[str, Any]] | None = None
        self._handles: list[Any] = []
        self.state = "error"
        self.message = "not sampled yet"
        self.latest: dict[str, Any] | None = None
        self.samples = 0  # how many samples were taken (for tests and the benchmark)
        self._retry_at = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Sampler:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpuspawner-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None
        if self._initialized:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._initialized = False

    def touch(self) -> None:
        """Someone looks: keep sampling (wakes the thread from standby)."""
        self._last_touch = time.monotonic()
        self._wake.set()

    @property
    def active(self) -> bool:
        return time.monotonic() - self._last_touch < self.standby_after

    def wait_fresh(self, max_age: float | None = None, timeout: float = 3.0) -> bool:
        """Block (in a worker thread, not the event loop) until a sample at most ``max_age``
        seconds old exists. Returns whether one does."""
        max_age = 2 * self.interval + 0.5 if max_age is None else max_age
        self.touch()
        deadline = time.monotonic() + timeout
        with self._fresh:
            while True:
                if self.latest is not None and time.time() - self.latest["timestamp"] <= max_age:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._fresh.wait(left)

    def needs_wait(self) -> bool:
        latest = self.latest
        return latest is None or time.time() - latest["timestamp"] > 2 * self.interval + 0.5

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.active:
                self._wake.wait()  # standby: nobody looked for standby_after seconds
                self._wake.clear()
                continue
            t0 = time.monotonic()
            try:
                self.sample_once()
            except Exception as e:  # noqa: BLE001 - the thread must survive anything
                log.exception("GPU sampler failed")
                self._set(*classify(e), None)
            self._wake.wait(max(0.0, self.interval - (time.monotonic() - t0)))
            self._wake.clear()

    # ------------------------------------------------------------------ NVML
    def _call(self, fn: str, *args: Any) -> Any:
        """An optional NVML function; None when the binding lacks it or the device says
        NotSupported / NO_PERMISSION."""
        f = getattr(self._nvml, fn, None)
        if f is None:
            return None
        try:
            return f(*args)
        except Exception as e:  # noqa: BLE001
            if _code(e) in (_NOT_SUPPORTED, _NO_PERMISSION, 13):
                return None
            raise

    def _init(self) -> bool:
        if self._initialized:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            if self._nvml is None:
                self._nvml = load_nvml()
            self._nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001
            self._retry_at = time.monotonic() + 30.0
            self._set(*classify(e), None)
            return False
        self._initialized = True
        return True

    def _discover(self) -> None:
        """Static data, once: every device (MIG instances listed in place of their parent)."""
        nv = self._nvml
        static: list[dict[str, Any]] = []
        handles: list[Any] = []
        warnings: list[str] = []
        count = nv.nvmlDeviceGetCount()
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                info = self._static_info(h, i, mig=False)
            except Exception as e:  # noqa: BLE001
                if _code(e) == _NO_PERMISSION:
                    warnings.append(f"GPU {i}: no permission to read it ({e})")
                    continue
                warnings.append(f"GPU {i}: {e}")
                continue
            migs = self._mig_devices(h, i)
            if migs:
                for mh, minfo in migs:
                    handles.append(mh)
                    static.append(minfo)
            else:
                handles.append(h)
                static.append(info)
        self._handles = handles
        self._static = static
        self._discover_warnings = warnings

    def _static_info(self, h: Any, index: int, *, mig: bool,
                     parent: dict[str, Any] | None = None) -> dict[str, Any]:
        nv = self._nvml
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        pci = self._call("nvmlDeviceGetPciInfo", h)
        numa = self._call("nvmlDeviceGetNumaNodeId", h)
        return {
            "uuid": _text(nv.nvmlDeviceGetUUID(h)),
            "index": index,
            "name": _text(nv.nvmlDeviceGetName(h)),
            "memory_total_bytes": int(mem.total),
            "pci_bus_id": _text(pci.busId) if pci is not None else
            (parent or {}).get("pci_bus_id"),
            "numa_node": numa if numa is not None else (parent or {}).get("numa_node"),
            "mig": mig,
        }

    def _mig_devices(self, h: Any, index: int) -> list[tuple[Any, dict[str, Any]]]:
        nv = self._nvml
        mode = self._call("nvmlDeviceGetMigMode", h)
        if not mode or not mode[0]:
            return []
        parent = None
        try:
            parent = self._static_info(h, index, mig=False)
        except Exception:  # noqa: BLE001
            parent = None
        out = []
        n = self._call("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        for j in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except Exception:  # noqa: BLE001 - NOT_FOUND: slot not populated
                continue
            info = self._static_info(mh, index, mig=True, parent=parent)
            info["mig_index"] = j
            out.append((mh, info))
        return out

    def _set(self, state: str, message: str, snap: dict[str, Any] | None) -> None:
        with self._fresh:
            self.state, self.message = state, message
            if snap is None:
                snap = {"state": state, "message": message, "timestamp": time.time(),
                        "gpus": []}
            self.latest = snap
            self.samples += 1
            self._fresh.notify_all()

    def sample_once(self) -> dict[str, Any]:
        """Take one sample now (the thread calls this; tests may call it directly)."""
        if not self._init():
            return self.latest or {}
        nv = self._nvml
        if self._static is None:
            try:
                self._discover()
            except Exception as e:  # noqa: BLE001
                self._set(*classify(e), None)
                return self.latest or {}
        assert self._static is not None
        if not self._static:
            if self._discover_warnings and all("permission" in w for w in
                                               self._discover_warnings):
                self._set("permission", "NVML refused access to every GPU: "
                          + "; ".join(self._discover_warnings), None)
            else:
                self._static = None  # look again next time (hot-plug, driver reload)
                self._set("no_gpu", "NVML works but sees no GPU in this session", None)
            return self.latest or {}
        gpus = []
        pids: set[int] = set()
        for h, st in zip(self._handles, self._static, strict=True):
            g: dict[str, Any] = {"uuid": st["uuid"], "memory_total_bytes":
                                 st["memory_total_bytes"]}
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                g["memory_used_bytes"] = int(mem.used)
                g["memory_total_bytes"] = int(mem.total)
            except Exception as e:  # noqa: BLE001
                g["memory_used_bytes"] = None
                g["error"] = str(e)
            util = None if st["mig"] else self._safe("nvmlDeviceGetUtilizationRates", h)
            g["utilization_percent"] = float(util.gpu) if util is not None else None
            temp = self._safe("nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
            g["temperature_c"] = float(temp) if temp is not None else None
            power = self._safe("nvmlDeviceGetPowerUsage", h)
            g["power_w"] = power / 1000.0 if power is not None else None
            procs = self._safe("nvmlDeviceGetComputeRunningProcesses", h) or []
            g["processes"] = []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                g["processes"].append({"pid": int(p.pid),
                                       "used_memory_bytes": int(used) if used is not None
                                       else None, "kernel_id": None})
                pids.add(int(p.pid))
            gpus.append(g)
        if pids and self.pid_resolver is not None:
            try:
                kmap = self.pid_resolver(pids)
            except Exception:  # noqa: BLE001
                kmap = {}
            for g in gpus:
                for p in g["processes"]:
                    p["kernel_id"] = kmap.get(p["pid"])
        ts = time.time()
        snap = {"state": "ok", "message": "", "timestamp": ts, "gpus": gpus}
        with self._lock:
            self.history.append({"timestamp": ts, "gpus": {
                g["uuid"]: {"utilization_percent": g["utilization_percent"],
                            "memory_used_bytes": g["memory_used_bytes"]} for g in gpus}})
        self._set("ok", "", snap)
        return snap

    def _safe(self, fn: str, *args: Any) -> Any:
        try:
            return self._call(fn, *args)
        except Exception:  # noqa: BLE001 - a dynamic value that fails is shown as null
            return None

    # ------------------------------------------------------------------ views
    def gpus_view(self) -> dict[str, Any]:
        """The ``/api/gpuspawner/gpus`` document (without ``culler``)."""
        latest = self.latest or {}
        state = latest.get("state", self.state)
        message = latest.get("message", self.message)
        alloc = self.allocation
        wanted = allocation_uuids(alloc)
        static = list(self._static or []) if state == "ok" else []
        warnings = list(self._alloc_warnings) + list(getattr(self, "_discover_warnings", []))
        seen = {g["uuid"] for g in static}
        gpus = [dict(g, in_allocation=(g["uuid"] in wanted)) for g in static]
        if alloc is not None and state == "ok":
            missing = [u for u in wanted if u not in seen]
            if missing:
                warnings.append("the allocation lists GPUs NVML does not see: "
                                + ", ".join(missing))
            extra = [g["uuid"] for g in static if g["uuid"] not in wanted]
            if extra:
                warnings.append("NVML sees GPUs outside this session's allocation: "
                                + ", ".join(extra))
        elif alloc is not None and wanted:
            warnings.append(f"the allocation lists {len(wanted)} GPU(s) but NVML reports "
                            f"state {state!r}")
        return {"state": state, "message": message, "allocation": alloc, "gpus": gpus,
                "warnings": warnings}

    def metrics_view(self) -> dict[str, Any]:
        """The ``/api/gpuspawner/metrics`` document."""
        latest = self.latest or {"state": self.state, "message": self.message,
                                 "timestamp": time.time(), "gpus": []}
        with self._lock:
            history = list(self.history)
        return {"state": latest["state"], "message": latest["message"],
                "timestamp": latest["timestamp"],
                "gpus": [{k: v for k, v in g.items() if k != "error"} for g in latest["gpus"]],
                "history": history}


_shared: Sampler | None = None
_shared_lock = threading.Lock()


def shared_sampler(**kwargs: Any) -> Sampler:
    """The process-wide sampler (created and started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Sampler(**kwargs).start()
        return _shared


def reset_shared_sampler() -> None:
    """Stop and forget the process-wide sampler (tests)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.stop()
        _shared = None
