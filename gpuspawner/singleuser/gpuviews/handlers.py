"""REST handlers of the gpuviews server extension (``/api/gpuspawner/...``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import psutil
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ...gpushare.words import share_text
from ...server_state import moved_from_env
from .sampler import Sampler

AUTH_RESOURCE = "gpuspawner"


class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def sampler(self) -> Sampler:
        return self.settings["gpuspawner_sampler"]

    async def fresh(self) -> None:
        """Wake the sampler; wait (in a worker thread) for a sample if it was in standby."""
        s = self.sampler
        s.touch()
        if s.needs_wait():
            await asyncio.get_running_loop().run_in_executor(None, s.wait_fresh)


class GPUsHandler(_Base):
    """``GET /api/gpuspawner/gpus``: state, allocation, GPUs (static data), warnings and this
    server's idle-culler status (docs/gpu-views.md)."""
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.fresh()
        doc = self.sampler.gpus_view()
        doc["culler"] = await self.settings["gpuspawner_culler"].status()
        # set when the hub restarted this server here after its node failed (JupyterLab
        # tells the user once): {"from", "to", "at" (epoch s), "reason"} or null
        doc["moved"] = moved_from_env(os.environ)
        names = [g.get("name", "") for g in doc.get("gpus", []) if g.get("in_allocation")]
        doc["share"] = share_from_env(os.environ, names[0] if names else "")
        # the hub's watchdog: this share is over its GPU memory (shown among the warnings)
        doc["warnings"] = [*doc.get("warnings", []),
                           *await self.settings["gpuspawner_share_notices"].messages()]
        # the user's own GPU-hours this month and budgets (null without usage accounting)
        own = self.settings.get("gpuspawner_own_usage")
        doc["usage"] = await own.figures() if own is not None else None
        self.finish(json.dumps(doc))


def share_from_env(env: Any, gpu_name: str = "") -> dict[str, Any] | None:
    """This server's GPU share as the hub started it (``GPUSPAWNER_GPU_MEMORY_LIMIT``, bytes;
    ``GPUSPAWNER_GPU_MEMORY_FRACTION``, 0..1; ``GPUSPAWNER_GPU_SHARE_MECHANISM``:
    :func:`gpuspawner.gpushare.mechanism.share_limits`), for the panel's line on what it gives.

    Args:
        env: the server's environment (a mapping). gpu_name: NVML's name of the shared GPU
            ("" when not read).

    Returns:
        {"milli": int, "memory_limit_bytes": int, "mechanism": str, "text":
        :func:`gpuspawner.gpushare.words.share_text`}, or None for a whole GPU, no GPU, or
        values that do not parse (never an error: the panel just says nothing).
    """
    try:
        limit = int(env["GPUSPAWNER_GPU_MEMORY_LIMIT"])
        milli = round(float(env["GPUSPAWNER_GPU_MEMORY_FRACTION"]) * 1000)
        mechanism = str(env.get("GPUSPAWNER_GPU_SHARE_MECHANISM", ""))
        text = share_text(milli, [limit], gpu_name, [mechanism] if mechanism else [])
    except (KeyError, ValueError):
        return None
    return {"milli": milli, "memory_limit_bytes": limit, "mechanism": mechanism, "text": text}


class MetricsHandler(_Base):
    """``GET /api/gpuspawner/metrics``: utilisation (percent), memory (bytes), temperature (deg C),
    power (W), processes and the history of the last minutes (docs/gpu-views.md)."""
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.fresh()
        self.finish(json.dumps(self.sampler.metrics_view()))


class _ServiceClient:
    """What the three hub-service clients below share: the server's own token, user and
    server name from its environment (``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_USER``,
    ``JUPYTERHUB_SERVER_NAME``), the service's URL, and one answer cached ``ttl`` seconds
    (a failed read is cached too: the services are optional)."""

    def __init__(self, url: str | None, ttl: float, timeout: float,
                 env: dict[str, str] | None) -> None:
        env = dict(os.environ if env is None else env)
        self.token = env.get("JUPYTERHUB_API_TOKEN")
        self.user = env.get("JUPYTERHUB_USER")
        self.server_name = env.get("JUPYTERHUB_SERVER_NAME", "")
        self.url = url or self._default_url(env)
        self.ttl = ttl
        self.timeout = timeout
        self._cached: tuple[float, Any] | None = None

    @staticmethod
    def _default_url(env: dict[str, str]) -> str | None:
        return env.get("GPUSPAWNER_SERVICE_URL") or None

    async def _cached_read(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """``read()``'s answer, or the cached one while it is younger than ``ttl``."""
        now = time.monotonic()
        if self._cached and now - self._cached[0] < self.ttl:
            return self._cached[1]
        result = await read()
        self._cached = (now, result)
        return result


class CullerStatus(_ServiceClient):
    """This server's entry in the idle culler service's ``api/status``, cached.

    Asked with the server's own ``$JUPYTERHUB_API_TOKEN`` at ``culler_url`` (default
    ``$GPUSPAWNER_CULLER_URL``, else ``$JUPYTERHUB_PUBLIC_HUB_URL`` / the origin of
    ``$JUPYTERHUB_API_URL`` + ``/services/idle-culler/``). Any failure gives None.
    """

    def __init__(self, url: str | None = None, ttl: float = 30.0, timeout: float = 2.0,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(url, ttl, timeout, env)

    @staticmethod
    def _default_url(env: dict[str, str]) -> str | None:
        if env.get("GPUSPAWNER_CULLER_URL"):
            return env["GPUSPAWNER_CULLER_URL"]
        if not env.get("JUPYTERHUB_SERVICE_PREFIX") or not env.get("JUPYTERHUB_API_TOKEN"):
            return None
        base = env.get("JUPYTERHUB_PUBLIC_HUB_URL") or env.get("JUPYTERHUB_PUBLIC_URL")
        if base:
            from urllib.parse import urlsplit
            u = urlsplit(base)
            base = f"{u.scheme}://{u.netloc}"
        else:
            api = env.get("JUPYTERHUB_API_URL", "")
            if "://" not in api:
                return None
            scheme, rest = api.split("://", 1)
            base = f"{scheme}://{rest.split('/', 1)[0]}"
        return url_path_join(base, "services/idle-culler/")

    @property
    def configured(self) -> bool:
        return bool(self.url and self.token)

    async def status(self) -> dict | None:
        if not self.configured:
            return None

        async def read() -> dict | None:
            doc = await _get_json(url_path_join(self.url or "", "api/status"),
                                  self.token or "", self.timeout)
            return self._mine(doc) if doc is not None else None

        return await self._cached_read(read)

    def _mine(self, doc: Any) -> dict | None:
        if not isinstance(doc, dict):
            return None
        servers = [s for s in doc.get("servers") or [] if isinstance(s, dict)]
        mine = [s for s in servers
                if (self.user is None or s.get("user") == self.user)
                and (s.get("server", s.get("name", "")) or "") == self.server_name]
        if not mine and servers and self.user is not None:
            mine = [s for s in servers if s.get("user") == self.user]
        if not mine:
            return None
        return {"server": mine[0], "last_pass": doc.get("last_pass")}


async def _get_json(url: str, token: str, timeout: float) -> Any:
    """GET ``url`` with ``token`` (no redirects); the decoded JSON, or None on any failure
    (the services the panel asks are optional)."""
    try:
        req = HTTPRequest(url, headers={"Authorization": f"token {token}"},
                          request_timeout=timeout, connect_timeout=timeout,
                          follow_redirects=False)
        resp = await AsyncHTTPClient().fetch(req)
        return json.loads(resp.body)
    except Exception:  # noqa: BLE001
        return None


class ShareNotices(_ServiceClient):
    """This server's GPU share notices from the gpuspawner service (the hub's watchdog: the
    share is over its GPU memory and its largest kernel is interrupted at a given time),
    cached ``ttl`` seconds.

    Asked with the server's own ``$JUPYTERHUB_API_TOKEN`` at ``$GPUSPAWNER_SERVICE_URL``
    ``api/users/<user>/usage`` (``gpu_share_notices``; the hub's wiring sets the URL,
    :func:`gpuspawner.hub.wiring.wire_hub`). A user's token reads only that user's notices
    (the service answers 403 for another user's). Any failure gives no notice.
    """

    def __init__(self, url: str | None = None, ttl: float = 10.0, timeout: float = 2.0,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(url, ttl, timeout, env)

    async def messages(self) -> list[str]:
        """The messages of this server's notices (none when not configured or on failure)."""
        if not (self.url and self.token and self.user):
            return []
        url, user, token = self.url, self.user, self.token

        async def read() -> list[str]:
            doc = await _get_json(url_path_join(url, "api/users", quote(user, safe=""),
                                                "usage"), token, self.timeout)
            notices = doc.get("gpu_share_notices") if isinstance(doc, dict) else None
            return [str(n["message"]) for n in notices or []
                    if isinstance(n, dict) and n.get("message")
                    and (n.get("server") or "") == self.server_name]

        return await self._cached_read(read)


class OwnUsage(_ServiceClient):
    """The user's own GPU-hours and core-hours this month and their usage budgets, from the
    gpuspawner service (``GET api/usage?group_by=user``: the caller's own rows, this month in
    the site's time zone; ``GET api/usage/budgets``), asked with the server's own
    ``$JUPYTERHUB_API_TOKEN`` at ``$GPUSPAWNER_SERVICE_URL``, cached ``ttl`` seconds (the
    figures move by the hour). docs/usage.md.
    """

    def __init__(self, url: str | None = None, ttl: float = 60.0, timeout: float = 2.0,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(url, ttl, timeout, env)

    async def figures(self) -> dict[str, Any] | None:
        """``{"from", "gpu_hours", "core_hours", "budgets": [{"name", "unit", "used",
        "limit", "percent", "renews_at", "warning", "exceeded"}]}``, or None when not
        configured, usage accounting is off, or the service does not answer."""
        if not (self.url and self.token):
            return None
        url, token = self.url, self.token

        async def read() -> dict[str, Any] | None:
            report = await _get_json(url_path_join(url, "api/usage?group_by=user"), token,
                                     self.timeout)
            totals = report.get("totals") if isinstance(report, dict) else None
            if not isinstance(totals, dict):
                return None
            budgets = await _get_json(url_path_join(url, "api/usage/budgets"), token,
                                      self.timeout)
            entries = budgets.get("budgets") if isinstance(budgets, dict) else None
            keep = ("name", "unit", "used", "limit", "percent", "renews_at", "warning",
                    "exceeded")
            return {
                "from": report.get("from"),
                "gpu_hours": float(totals.get("gpu_hours") or 0.0),
                "core_hours": float(totals.get("core_hours") or 0.0),
                "budgets": [{k: b.get(k) for k in keep} for b in entries or []
                            if isinstance(b, dict)],
            }

        return await self._cached_read(read)


def kernel_pid_resolver(kernel_manager: Any):
    """A function mapping NVML PIDs to this server's kernel ids: a PID belongs to a kernel when
    it is the kernel's process or one of its descendants (ancestry from ``psutil``)."""

    def kernel_pids() -> dict[int, str]:
        out: dict[int, str] = {}
        try:
            ids = list(kernel_manager.list_kernel_ids())
        except Exception:  # noqa: BLE001
            return out
        for kid in ids:
            try:
                km = kernel_manager.get_kernel(kid)
                prov = getattr(km, "provisioner", None)
                pid = getattr(prov, "pid", None)
                if pid is None:
                    proc = getattr(prov, "process", None) or getattr(km, "kernel", None)
                    pid = getattr(proc, "pid", None)
                if pid is not None:
                    out[int(pid)] = kid
            except Exception:  # noqa: BLE001
                continue
        return out

    def resolve(pids: set[int]) -> dict[int, str]:
        roots = kernel_pids()
        if not roots:
            return {}
        result: dict[int, str] = {}
        for pid in pids:
            try:
                chain = [pid, *(p.pid for p in psutil.Process(pid).parents())]
            except (psutil.Error, ValueError):  # gone, not ours to see, or not a PID
                continue
            kid = next((roots[p] for p in chain if p in roots), None)
            if kid is not None:
                result[pid] = kid
        return result

    return resolve


def setup_handlers(web_app: Any, base_url: str) -> None:
    """Register the two API handlers under the server's base URL."""
    handlers = [
        (url_path_join(base_url, "api/gpuspawner/gpus"), GPUsHandler),
        (url_path_join(base_url, "api/gpuspawner/metrics"), MetricsHandler),
    ]
    web_app.add_handlers(".*$", handlers)


__all__ = ["CullerStatus", "GPUsHandler", "MetricsHandler", "kernel_pid_resolver",
           "setup_handlers"]
