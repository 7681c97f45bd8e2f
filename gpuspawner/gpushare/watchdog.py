"""The watchdog: a GPU share over its memory for longer than a grace period has its kernel
interrupted.

Every pass (:meth:`Watchdog.check`, in a worker thread of the hub for the nodes on its host):

1. NVML's per-process GPU memory: ``nvmlDeviceGetComputeRunningProcesses(handle)`` (nvidia-ml-py
   maps it to the C ``nvmlDeviceGetComputeRunningProcesses_v3``), each entry's ``pid`` (a host
   pid: NVML reports the host's pid namespace) and ``usedGpuMemory`` (bytes; None where the
   driver cannot say, e.g. under MPS before r470 or on Windows' WDDM, counted as 0).
2. Each pid is attributed to its container through ``/proc/<pid>/cgroup``: the last 64-hex-digit
   component of its cgroup path is the container id, as Docker names cgroups under both
   drivers (cgroupfs ``/docker/<id>`` or ``/<cgroup parent>/<id>``, systemd
   ``/system.slice/docker-<id>.scope``; cgroup v1 and v2 alike). A pid without one is not a
   server's and is left alone.
3. A share (a container whose allocation holds fewer than 1000 milli-GPU of a GPU) is over when
   its processes on that GPU use more than the share's memory (:func:`~gpuspawner.gpushare.
   mechanism.share_limits`). The first pass that sees it over warns (log, the
   ``gpuspawner_gpu_share_actions{action="warn"}`` counter, the ``notify`` callback); once it
   has been over for ``grace_s`` seconds its largest processes on that GPU, as many as needed to
   bring it under its share, get SIGINT (Jupyter's interrupt: ipykernel raises
   KeyboardInterrupt in the running cell; the kernel and the server stay up), counted as
   ``action="interrupt"``; the grace starts again. The server's own process (pid 1 in the
   container's pid namespace, ``NSpid`` of ``/proc/<pid>/status``) is never signalled. A share
   back under its memory is forgotten.

Whole GPUs are never watched: the whole memory is theirs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..placement.model import GPU, Allocation
from .mechanism import Mechanism, share_limits

__all__ = [
    "Action",
    "GPUProcess",
    "Notice",
    "Share",
    "Watchdog",
    "container_of",
    "namespace_pid",
    "read_gpu_processes",
    "shares_from_allocations",
]

log = logging.getLogger("gpuspawner.gpushare")

_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class GPUProcess:
    """One process NVML sees on a GPU: host ``pid``, the GPU's ``uuid``, ``used_bytes``
    (None: NVML cannot say)."""

    pid: int
    uuid: str
    used_bytes: int | None


@dataclass(frozen=True)
class Share:
    """One server's share, as the watchdog holds it.

    Attributes:
        container_id: the engine's 64-hex-digit id. user, server: the owner.
        limits: GPU UUID -> the share's memory in bytes.
    """

    container_id: str
    user: str
    server: str
    limits: Mapping[str, int]


@dataclass(frozen=True)
class Action:
    """What one pass did: ``kind`` ``"warn"`` or ``"interrupt"``, the share, the GPU, the
    share's ``used_bytes`` and ``limit_bytes``, the ``pids`` signalled (interrupt) and
    ``message`` (the log line, the user's notice)."""

    kind: str
    share: Share
    uuid: str
    used_bytes: int
    limit_bytes: int
    pids: tuple[int, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class Notice:
    """A share over its GPU memory at the last pass, as its user reads it: the JupyterLab GPU
    panel shows :meth:`message` among its warnings (the single-user server asks the gpuspawner
    service's ``GET api/users/{name}/usage``, ``gpu_share_notices``).

    Attributes:
        user, server: the owner. uuid: the GPU. used_bytes, limit_bytes: the share's use and
        memory (bytes). interrupt_at: epoch seconds at which the watchdog interrupts the
        largest kernel unless memory is freed first. interrupted: pids it interrupted at this
        pass (empty before the grace ran out).
    """

    user: str
    server: str
    uuid: str
    used_bytes: int
    limit_bytes: int
    interrupt_at: float
    interrupted: tuple[int, ...] = ()

    def message(self) -> str:
        """One sentence for the user (UTC times)."""
        at = time.strftime("%H:%M:%S", time.gmtime(self.interrupt_at))
        head = (f"Your kernels use {_gib(self.used_bytes)} of GPU memory, over your share of "
                f"{_gib(self.limit_bytes)}")
        if self.interrupted:
            return (f"{head}: the kernel using the most was interrupted (the running cell "
                    f"stopped); free memory (del, or restart the kernel) or it is interrupted "
                    f"again at {at} UTC.")
        return (f"{head}: the kernel using the most is interrupted at {at} UTC unless memory "
                f"is freed first.")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the attributes (``interrupted`` a list) and ``message``."""
        return {"server": self.server, "uuid": self.uuid, "used_bytes": self.used_bytes,
                "limit_bytes": self.limit_bytes, "interrupt_at": self.interrupt_at,
                "interrupted": list(self.interrupted), "message": self.message()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu_processes(nvml: Any) -> list[GPUProcess]:
    """Every compute process on every GPU NVML sees (NVML initialised by the caller).

    Raises:
        nvml.NVMLError: listing the GPUs fails (one GPU's failure skips that GPU).
    """
    out: list[GPUProcess] = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except nvml.NVMLError as e:
            log.debug("GPU %d: %s; its processes not read", i, e)
            continue
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(GPUProcess(int(p.pid), uuid, int(used) if used is not None else None))
    return out


def container_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The id of the container ``pid`` runs in, from ``/proc/<pid>/cgroup`` (module
    docstring, step 2), or None (not in a container, or gone)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(":", 2)[-1].rstrip("/")
        m = _CONTAINER_ID.search(path)
        if m:
            return m.group(1)
    return None


def namespace_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """``pid`` as its own (innermost) pid namespace numbers it: the last ``NSpid`` field of
    ``/proc/<pid>/status`` (Linux >= 4.1); None when unreadable."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def shares_from_allocations(
    found: Iterable[tuple[str, str]], gpus: Mapping[str, GPU], mechanism: Mechanism
) -> dict[str, Share]:
    """The shares among a node's running servers: ``(container id, allocation JSON)`` pairs
    (:meth:`~gpuspawner.backends.base.Backend.list_managed`'s ``handle`` and ``allocation``),
    by container id, the owner from the allocation; servers without a share, or whose
    allocation does not parse or names a GPU not in ``gpus``, are left out."""
    out: dict[str, Share] = {}
    for cid, text in found:
        try:
            alloc = Allocation.from_json(text)
            limits = share_limits(alloc, gpus, mechanism, "")
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            continue
        if limits.memory_bytes:
            out[cid] = Share(cid, alloc.owner.user, alloc.owner.server, dict(limits.memory_bytes))
    return out


@dataclass
class Watchdog:
    """Watches the shares of one host (module docstring).

    Args:
        nvml: the ``pynvml`` module or a stand-in, initialised by the caller.
        grace_s: seconds a share may stay over its memory before its kernel is interrupted.
        proc_root: where procfs is mounted.
        kill: ``os.kill``'s stand-in (tests may record).
        notify: called with each :class:`Action` (the hub's user notice); errors are logged.
        count: called with each action's kind (the hub passes the metrics counter,
            :func:`gpuspawner.hub.metrics.gpu_share_action`); None: not counted.
    """

    nvml: Any
    grace_s: float = 60.0
    proc_root: str = "/proc"
    kill: Callable[[int, int], None] = os.kill
    notify: Callable[[Action], None] | None = None
    count: Callable[[str], None] | None = None
    #: (container id, GPU UUID) -> monotonic time the share was first seen over
    over_since: dict[tuple[str, str], float] = field(default_factory=dict)
    warned: set[tuple[str, str]] = field(default_factory=set)
    #: the shares over their memory at the last pass, by user (replaced whole at each pass:
    #: readers on another thread see one pass or the next, never half of one)
    notices: dict[str, tuple[Notice, ...]] = field(default_factory=dict)

    def check(self, shares: Mapping[str, Share], now: float | None = None) -> list[Action]:
        """One pass over ``shares`` (by container id); returns what it did and sets
        :attr:`notices`."""
        now = time.monotonic() if now is None else now
        wall = time.time()
        notices: dict[str, list[Notice]] = {}
        use: dict[tuple[str, str], list[GPUProcess]] = {}
        for p in read_gpu_processes(self.nvml):
            cid = container_of(p.pid, self.proc_root)
            if cid in shares:
                use.setdefault((cid, p.uuid), []).append(p)
        actions: list[Action] = []
        watched = {(cid, u) for cid, s in shares.items() for u in s.limits}
        for key in list(self.over_since):
            if key not in watched:
                self.over_since.pop(key, None)
                self.warned.discard(key)
        for cid, uuid in sorted(watched):
            share = shares[cid]
            limit = share.limits[uuid]
            procs = use.get((cid, uuid), [])
            used = sum(p.used_bytes or 0 for p in procs)
            key = (cid, uuid)
            if used <= limit:
                self.over_since.pop(key, None)
                self.warned.discard(key)
                continue
            since = self.over_since.setdefault(key, now)
            who = f"{share.user}/{share.server or '(default)'}"
            if key not in self.warned:
                self.warned.add(key)
                actions.append(
                    self._act(
                        Action(
                            "warn",
                            share,
                            uuid,
                            used,
                            limit,
                            message=(
                                f"{who} uses {_gib(used)} of GPU "
                                f"{uuid}, over its share of {_gib(limit)}: the largest kernel is "
                                f"interrupted in {self.grace_s:.0f} s unless it frees memory"
                            ),
                        )
                    )
                )
            interrupted: tuple[int, ...] = ()
            if now - since >= self.grace_s:
                pids = interrupted = self._interrupt(procs, used, limit)
                self.over_since[key] = now
                actions.append(
                    self._act(
                        Action(
                            "interrupt",
                            share,
                            uuid,
                            used,
                            limit,
                            pids=pids,
                            message=(
                                f"{who} over its share of GPU "
                                f"{uuid} ({_gib(used)} > {_gib(limit)}) for {now - since:.0f} s: "
                                f"SIGINT to kernel pid(s) {', '.join(map(str, pids)) or 'none'}"
                            ),
                        )
                    )
                )
            notices.setdefault(share.user, []).append(Notice(
                share.user, share.server, uuid, used, limit,
                wall + (self.over_since[key] + self.grace_s - now), interrupted))
        self.notices = {u: tuple(ns) for u, ns in notices.items()}
        return actions

    def _interrupt(self, procs: list[GPUProcess], used: int, limit: int) -> tuple[int, ...]:
        """SIGINT to the largest processes until the rest fits ``limit``; never to the
        server's own process (pid 1 in the container)."""
        sent: list[int] = []
        for p in sorted(procs, key=lambda p: p.used_bytes or 0, reverse=True):
            if used <= limit:
                break
            if namespace_pid(p.pid, self.proc_root) == 1:
                log.warning("GPU share: pid %d is the server itself; not interrupted", p.pid)
                continue
            try:
                self.kill(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            except OSError as e:
                log.warning("GPU share: cannot interrupt pid %d: %s", p.pid, e)
                continue
            sent.append(p.pid)
            used -= p.used_bytes or 0
        return tuple(sent)

    def _act(self, action: Action) -> Action:
        log.warning("GPU share %s: %s", action.kind, action.message)
        if self.count is not None:
            try:
                self.count(action.kind)
            except Exception as e:  # noqa: BLE001 - counting must not stop the watchdog
                log.warning("GPU share: cannot count %s: %s", action.kind, e)
        if self.notify is not None:
            try:
                self.notify(action)
            except Exception as e:  # noqa: BLE001
                log.warning("GPU share: notify failed: %s", e)
        return action


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"
