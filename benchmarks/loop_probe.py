"""The event loop's longest callbacks inside a hub process, for benchmarks/hub_scale.py (both
sides' hubs install it from their configuration file).

:func:`install` wraps ``asyncio.events.Handle._run``, which runs every callback the loop runs
(a task's step, a timer, an I/O ready callback: what blocks the loop is always one of them), so
that each callback's wall time is measured with ``time.perf_counter`` (two calls per callback,
well under a microsecond). Kept since the last report: the longest callback, how many ran
longer than 20 ms and 100 ms, and the five longest with what they were (a task's coroutine and
where it stopped, else the callback's name); and Python's garbage collections (``gc.callbacks``):
how many per generation, the longest of each and the objects tracked at the report, since a
full collection walks every object the hub holds and runs inside whatever callback set it off;
and the work a spawn costs the hub: database commits per database file (SQLAlchemy's ``commit``
event on every engine of the process) and requests answered per handler class (tornado's
``Application.log_request``).

A report is asked for with SIGUSR2 (JupyterHub handles SIGINT, SIGTERM and SIGUSR1): the
handler, on the loop, writes ``loop-probe-<n>.json`` (``n`` counts the reports from 1) into the
folder given to :func:`install` and starts the next window. :func:`read_report` on the
benchmark's side sends the signal and waits for the file. Times in milliseconds.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import gc
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

#: callbacks longer than these (ms) are counted
COUNT_OVER_MS = (20.0, 100.0)
#: the longest callbacks kept per window
KEEP = 5


class LoopProbe:
    """Callback times of one window (since the last report)."""

    def __init__(self) -> None:
        self.reset()

    #: set by the report: its own callback is not measured
    skip = False

    def reset(self) -> None:
        self.started = time.perf_counter()
        self.callbacks = 0
        self.busy_s = 0.0
        self.max_ms = 0.0
        self.over = {limit: 0 for limit in COUNT_OVER_MS}
        self.longest: list[tuple[float, str]] = []
        #: garbage collections: count and longest (ms) per generation, and their total
        self.gc_count = [0, 0, 0]
        self.gc_max_ms = [0.0, 0.0, 0.0]
        self.gc_total_ms = 0.0
        self._gc_start = 0.0
        #: database commits per database file name, requests answered per handler class
        self.commits: dict[str, int] = {}
        self.requests: dict[str, int] = {}

    def on_commit(self, conn: Any) -> None:
        """SQLAlchemy ``commit`` event of any engine: counted per database file name."""
        name = os.path.basename(str(conn.engine.url.database or conn.engine.url))
        self.commits[name] = self.commits.get(name, 0) + 1

    def on_request(self, handler: Any) -> None:
        """A request answered (tornado's ``log_request``): counted per handler class."""
        name = type(handler).__name__
        self.requests[name] = self.requests.get(name, 0) + 1

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` entry: the time of each collection (inside whichever callback
        allocated the object that set it off)."""
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        ms = (time.perf_counter() - self._gc_start) * 1000
        gen = int(info.get("generation", 0))
        self.gc_count[gen] += 1
        self.gc_total_ms += ms
        if ms > self.gc_max_ms[gen]:
            self.gc_max_ms[gen] = ms

    def record(self, ms: float, handle: asyncio.Handle, handler: Any = None) -> None:
        self.callbacks += 1
        self.busy_s += ms / 1000
        if ms > self.max_ms:
            self.max_ms = ms
        for limit in COUNT_OVER_MS:
            if ms > limit:
                self.over[limit] += 1
        if len(self.longest) < KEEP or ms > self.longest[-1][0]:
            self.longest.append((ms, describe(handle, handler)))
            self.longest.sort(key=lambda x: -x[0])
            del self.longest[KEEP:]

    def report(self) -> dict[str, Any]:
        return {
            "window_s": round(time.perf_counter() - self.started, 3),
            "callbacks": self.callbacks,
            "busy_s": round(self.busy_s, 3),
            "max_ms": round(self.max_ms, 2),
            "over_ms": {f"{k:g}": v for k, v in self.over.items()},
            "longest": [[round(ms, 2), what] for ms, what in self.longest],
            "gc": {
                "count": self.gc_count,
                "max_ms": [round(x, 2) for x in self.gc_max_ms],
                "total_ms": round(self.gc_total_ms, 1),
                # what a full collection walks (gc.get_objects() leaves the frozen out)
                "objects": len(gc.get_objects()),
                "frozen": gc.get_freeze_count(),
            },
            "commits": dict(self.commits),
            "requests": dict(self.requests),
        }


def task_of(handle: asyncio.Handle) -> asyncio.Task[Any] | None:
    """The task whose step or wake-up this callback is, else None."""
    cb = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return owner
    if type(cb).__name__.startswith("Task"):  # the C task's step wrapper refers to its task
        return next((o for o in gc.get_referents(cb) if isinstance(o, asyncio.Task)), None)
    return None


#: the code of ``tornado.web.RequestHandler._execute`` (a request's task), set by install
_EXECUTE: Any = None


def handler_of(handle: asyncio.Handle) -> Any:
    """The Tornado request handler a callback is a step of (before it runs), else None."""
    task = task_of(handle)
    if task is None:
        return None
    coro = task.get_coro()
    if getattr(coro, "cr_code", None) is not _EXECUTE or coro.cr_frame is None:
        return None
    return coro.cr_frame.f_locals.get("self")


def describe(handle: asyncio.Handle, handler: Any = None) -> str:
    """What a callback was: the request (handler class, method, path) of a request's step;
    for a task's step, the chain of coroutines it now awaits, outer to inner, each with the
    line it stopped at (where the step ended); else the callback's qualified name."""
    if handler is not None:
        request = getattr(handler, "request", None)
        return (
            f"request {type(handler).__name__} {getattr(request, 'method', '')} "
            f"{getattr(request, 'path', '')}"
        )
    cb = handle._callback  # type: ignore[attr-defined]
    owner = task_of(handle)
    if isinstance(owner, asyncio.Task):
        chain, where = [], owner.get_coro()
        while where is not None and hasattr(where, "cr_code"):
            frame = where.cr_frame
            line = f":{frame.f_lineno}" if frame is not None else ""
            chain.append(f"{where.__qualname__}{line}")
            where = where.cr_await
        return "task " + " > ".join(
            chain[:2] + (["..."] if len(chain) > 4 else []) + chain[max(2, len(chain) - 2) :]
        )
    name = getattr(cb, "__qualname__", None) or repr(cb)
    module = getattr(cb, "__module__", "") or ""
    return f"{module}.{name}" if module else name


_PROBE: LoopProbe | None = None


def install(folder: str | os.PathLike[str]) -> LoopProbe:
    """Measure every callback of this process's loops from now on, and write a report into
    ``folder`` at each SIGUSR2 (call it inside the running loop: a hub's configuration file).
    Installing twice returns the first probe."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    global _EXECUTE
    from tornado.web import RequestHandler

    _EXECUTE = RequestHandler._execute.__code__
    probe = _PROBE = LoopProbe()
    original = asyncio.events.Handle._run
    clock = time.perf_counter

    def timed_run(self: asyncio.Handle) -> None:
        handler = handler_of(self)
        t0 = clock()
        try:
            original(self)
        finally:
            if probe.skip:  # the report's own callback (it counts the objects)
                probe.skip = False
            else:
                probe.record((clock() - t0) * 1000, self, handler)

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    gc.callbacks.append(probe.on_gc)
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from tornado.web import Application

    event.listen(Engine, "commit", probe.on_commit)
    log_request = Application.log_request

    def counted_log_request(self: Application, handler: Any) -> None:
        probe.on_request(handler)
        log_request(self, handler)

    Application.log_request = counted_log_request  # type: ignore[method-assign]
    out = Path(folder)
    count = [0]

    def dump() -> None:
        count[0] += 1
        data = probe.report()
        probe.reset()
        probe.skip = True
        tmp = out / f".loop-probe-{count[0]}.json"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, out / f"loop-probe-{count[0]}.json")

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump)
    return probe


def freeze_after_start(app: Any, threshold: tuple[int, int, int] | None = None) -> None:
    """Once the hub ``app`` (a ``JupyterHub``) has started, collect once and move every object
    it holds then into the collector's permanent generation (``gc.freeze``), so that later
    full collections do not walk the start-up's modules, classes and configuration again; with
    ``threshold``, also ``gc.set_threshold(*threshold)`` (generation 0's allocations, then
    collections of generations 0 and 1 before the next older one). Wraps ``app.start`` (awaited
    by JupyterHub's ``launch_instance_async`` once); call it while the hub loads its
    configuration file (``hub_scale.py --gc-freeze``)."""
    start = app.start

    async def start_then_freeze() -> None:
        await start()
        gc.collect()
        gc.freeze()
        if threshold is not None:
            gc.set_threshold(*threshold)

    app.start = start_then_freeze


async def read_report(pid: int, folder: Path, n: int, timeout: float = 30.0) -> dict[str, Any]:
    """Ask the hub process ``pid`` for its ``n``-th report (SIGUSR2) and wait for it.

    Raises:
        TimeoutError: no report within ``timeout`` seconds.
    """
    os.kill(pid, signal.SIGUSR2)
    path = folder / f"loop-probe-{n}.json"
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"no loop report {path} within {timeout:g} s")
        await asyncio.sleep(0.05)
    return json.loads(path.read_text())
