"""IPython extension: ``%load_ext gpuspawner.kernel`` shows a live GPU monitor widget.

The monitor reads NVML in the kernel through the same
:class:`~gpuspawner.singleuser.gpuviews.sampler.Sampler` as the server extension (a background
thread, standby when the monitor is stopped)
and updates an ipywidgets box from another background thread once a second, so the bars move
while cells run (kernel -> front end widget updates go over IOPub, which does not wait for the
busy main thread). One row per GPU: utilisation bar (disabled with "n/a (MIG)" where NVML
gives none), memory bar, and a short history sparkline. Without NVML or a GPU the header says
so and no row is shown.

``%load_ext`` again shows the same monitor again (idempotent); ``%unload_ext`` stops it.
``monitor()`` returns the running :class:`GPUMonitor` (``.widget`` is the ipywidgets box) and
``widget_state()`` a JSON-able summary of what the widgets show (for tests).
"""

from __future__ import annotations

import html
import threading
from typing import Any

from gpuspawner.singleuser.gpuviews.sampler import Sampler, sparkline

GiB = 1024**3
_monitor: GPUMonitor | None = None


def _fmt_bytes(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


class GPUMonitor:
    """The notebook GPU monitor: an ipywidgets box (utilisation and memory bars per GPU,
    short history) refreshed every ``interval`` seconds by a daemon thread from a
    :class:`~gpuspawner.singleuser.gpuviews.sampler.Sampler` (NVML in the kernel's process)."""
    def __init__(self, sampler: Sampler | None = None, interval: float = 1.0) -> None:
        import ipywidgets as w

        self.w = w
        self.sampler = sampler or Sampler(interval=interval, standby_after=max(5.0,
                                                                               3 * interval))
        self.sampler.start()
        self.interval = interval
        self.header = w.HTML(value="<b>GPU monitor</b>: starting…")
        self.rows_box = w.VBox([])
        self.widget = w.VBox([self.header, self.rows_box])
        self.rows: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.updates = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ thread
    def start(self) -> GPUMonitor:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpuspawner-monitor",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._thread = None
        self.sampler.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sampler.wait_fresh(timeout=2 * self.interval + 1)
                self.refresh()
            except Exception as e:  # noqa: BLE001 - keep the monitor alive
                self.header.value = f"<b>GPU monitor</b>: update failed: {html.escape(str(e))}"
            self._stop.wait(self.interval)

    # ------------------------------------------------------------------ widgets
    def _row(self, uuid: str, static: dict[str, Any]) -> dict[str, Any]:
        w = self.w
        label = w.HTML(value="")
        util = w.FloatProgress(value=0.0, min=0.0, max=100.0, description="util",
                               bar_style="info")
        mem = w.FloatProgress(value=0.0, min=0.0, max=float(static.get("memory_total_bytes")
                                                              or 1), description="memory",
                              bar_style="success")
        util_text = w.Label(value="")
        mem_text = w.Label(value="")
        hist = w.HTML(value="")
        box = w.VBox([label, w.HBox([util, util_text]), w.HBox([mem, mem_text]), hist])
        return {"label": label, "util": util, "mem": mem, "util_text": util_text,
                "mem_text": mem_text, "hist": hist, "box": box}

    def refresh(self) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        gv = self.sampler.gpus_view()
        mv = self.sampler.metrics_view()
        state = mv["state"]
        if state != "ok":
            what = {"no_nvml": "no NVML (no NVIDIA driver here): no GPU to show",
                    "no_gpu": "no GPU in this session",
                    "permission": "NVML refused access (permission)",
                    "error": "NVML error"}.get(state, state)
            self.header.value = (f"<b>GPU monitor</b>: {html.escape(what)}"
                                 f"<br><small>{html.escape(mv['message'])}</small>")
            if self.rows:
                self.rows.clear()
                self.rows_box.children = ()
            self.updates += 1
            return
        static = {g["uuid"]: g for g in gv["gpus"]}
        warn = "".join(f"<br><span style='color:#b45309'>⚠ {html.escape(x)}</span>"
                       for x in gv["warnings"])
        self.header.value = (f"<b>GPU monitor</b>: {len(mv['gpus'])} GPU(s)"
                             + (" of this session" if gv["allocation"] else "") + warn)
        hist = mv["history"]
        changed = False
        for g in mv["gpus"]:
            uuid = g["uuid"]
            st = static.get(uuid, {})
            if uuid not in self.rows:
                self.rows[uuid] = self._row(uuid, st)
                changed = True
            r = self.rows[uuid]
            tag = " (MIG)" if st.get("mig") else ""
            mine = " ★ allocated" if st.get("in_allocation") else ""
            r["label"].value = (f"<b>{st.get('index', '?')}: {html.escape(st.get('name', ''))}"
                                f"{tag}</b> <small>{html.escape(uuid)}{mine}</small>")
            u = g["utilization_percent"]
            if u is None:
                r["util"].value = 0.0
                r["util"].bar_style = ""
                r["util_text"].value = "n/a (MIG: NVML gives no utilisation)" if st.get(
                    "mig") else "n/a"
            else:
                r["util"].value = float(u)
                r["util"].bar_style = "danger" if u >= 90 else "warning" if u >= 60 else "info"
                r["util_text"].value = f"{u:.0f} %"
            used, total = g["memory_used_bytes"], g["memory_total_bytes"]
            r["mem"].max = float(total or 1)
            r["mem"].value = float(used or 0)
            r["mem_text"].value = f"{_fmt_bytes(used)} / {_fmt_bytes(total)}"
            us = [h["gpus"].get(uuid, {}).get("utilization_percent") for h in hist]
            ms = [h["gpus"].get(uuid, {}).get("memory_used_bytes") for h in hist]
            mp = [None if m is None else 100.0 * m / (total or 1) for m in ms]
            r["hist"].value = (f"<code>util {html.escape(sparkline(us))}</code><br>"
                               f"<code>mem  {html.escape(sparkline(mp))}</code>"
                               f" <small>last {len(hist)} s</small>")
        if changed:
            self.rows_box.children = tuple(self.rows[g["uuid"]]["box"] for g in mv["gpus"])
        self.updates += 1

    def state(self) -> dict[str, Any]:
        return {"header": self.header.value, "updates": self.updates,
                "model_id": self.widget.model_id,
                "gpus": [{"uuid": u, "utilization": r["util"].value,
                          "utilization_text": r["util_text"].value,
                          "utilization_model_id": r["util"].model_id,
                          "memory": r["mem"].value, "memory_max": r["mem"].max,
                          "memory_text": r["mem_text"].value, "history": r["hist"].value}
                         for u, r in self.rows.items()]}


def monitor() -> GPUMonitor | None:
    """The running monitor (None before ``%load_ext gpuspawner.kernel``)."""
    return _monitor


def widget_state() -> dict[str, Any] | None:
    """Plain values shown by the running monitor (for tests and scripts), or None."""
    return _monitor.state() if _monitor is not None else None


def get_widget():
    """The monitor's ipywidgets box (starting the monitor if needed)."""
    global _monitor
    if _monitor is None:
        _monitor = GPUMonitor().start()
        _monitor.sampler.wait_fresh(timeout=3)
        _monitor.refresh()
    return _monitor.widget


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext gpuspawner.kernel``: display the monitor (IPython extension API)."""
    from IPython.display import display

    display(get_widget())


def unload_ipython_extension(ip: Any) -> None:
    """``%unload_ext gpuspawner.kernel``: stop the refresh thread and close the widget."""
    global _monitor
    if _monitor is not None:
        _monitor.stop()
        _monitor.widget.close()
        _monitor = None
