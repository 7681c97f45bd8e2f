"""The hub REST API as the culler uses it: bounded concurrency, retries with backoff,
pagination (``Accept: application/jupyterhub-pagination+json``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger("idle_culler.hub")

#: HTTP statuses worth retrying (hub restarting, proxy in the way, overload)
RETRY_STATUS = {429, 500, 502, 503, 504, 599}


class HubAPIError(RuntimeError):
    """A hub API call that failed after all retries (``status`` 599 = no HTTP answer)."""

    def __init__(self, method: str, url: str, status: int, body: str = "") -> None:
        super().__init__(f"{method} {url}: HTTP {status} {body[:200]}")
        self.status = status


def internal_ssl_context(env: dict[str, str] | None = None) -> Any:
    """The TLS context a hub-managed service needs when the hub runs with ``internal_ssl``:
    JupyterHub then gives the service ``JUPYTERHUB_SSL_KEYFILE``, ``JUPYTERHUB_SSL_CERTFILE``
    and ``JUPYTERHUB_SSL_CLIENT_CA`` (JupyterHub docs, "Services: environment"); built with
    ``jupyterhub.utils.make_ssl_context``. None when those are not set."""
    env = dict(os.environ if env is None else env)
    key, cert = env.get("JUPYTERHUB_SSL_KEYFILE"), env.get("JUPYTERHUB_SSL_CERTFILE")
    ca = env.get("JUPYTERHUB_SSL_CLIENT_CA")
    if not (key and cert and ca):
        return None
    from jupyterhub.utils import make_ssl_context

    return make_ssl_context(key, cert, cafile=ca, purpose=ssl.Purpose.SERVER_AUTH)


class HubClient:
    """Calls ``{url}/...`` (``url`` = the hub API, e.g. ``http://127.0.0.1:8081/hub/api``) with
    ``token``. At most ``concurrency`` requests are in flight; a request that fails with a
    status in :data:`RETRY_STATUS` or a connection error is retried ``retries`` times, waiting
    ``backoff * 2**attempt`` seconds (with +-25 % jitter, capped at ``max_backoff``).
    ``ssl_context``: the client certificate and CA for a hub with ``internal_ssl`` (see
    :func:`internal_ssl_context`)."""

    def __init__(self, url: str, token: str, concurrency: int = 10, retries: int = 4,
                 backoff: float = 0.5, max_backoff: float = 10.0,
                 request_timeout: float = 60.0, ssl_context: Any = None) -> None:
        self.url = url.rstrip("/")
        self.ssl_context = ssl_context
        self.token = token
        self.semaphore = asyncio.Semaphore(concurrency)
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self.client = AsyncHTTPClient(force_instance=True, max_clients=max(concurrency, 10))
        self.requests = 0
        self.retried = 0

    def close(self) -> None:
        self.client.close()

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None,
                      ok: tuple[int, ...] = (), retries: int | None = None,
                      timeout: float | None = None) -> tuple[int, Any]:
        """``(status, decoded JSON or None)``; statuses in ``ok`` (besides 2xx) are returned,
        not raised (e.g. 404 for a server already gone). ``retries`` and ``timeout``
        (seconds, for the whole request) override the client's for this call.

        Raises:
            HubAPIError: another status after the retries (599: no HTTP answer, a timeout).
            ValueError: a 2xx answer whose body is not JSON.
        """
        retries = self.retries if retries is None else retries
        url = path if path.startswith("http") else f"{self.url}{path}"
        hdrs = {"Authorization": f"token {self.token}", **(headers or {})}
        data = None if body is None else json.dumps(body)
        if data is None and method in ("POST", "PATCH", "PUT"):
            data = ""
        req = HTTPRequest(url, method=method, headers=hdrs, body=data,
                          allow_nonstandard_methods=True,
                          request_timeout=self.request_timeout if timeout is None else timeout,
                          ssl_options=self.ssl_context)
        attempt = 0
        while True:
            self.requests += 1
            status, text = 599, ""
            try:
                async with self.semaphore:
                    r = await self.client.fetch(req, raise_error=False)
                status, text = r.code, (r.body or b"").decode(errors="replace")
            except (OSError, HTTPClientError, asyncio.TimeoutError) as e:
                status, text = 599, str(e)
            if 200 <= status < 300:
                return status, (json.loads(text) if text.strip() else None)
            if status in ok:  # e.g. a 404 page from a proxy: the body need not be JSON
                try:
                    return status, (json.loads(text) if text.strip() else None)
                except ValueError:
                    return status, None
            if status not in RETRY_STATUS or attempt >= retries:
                raise HubAPIError(method, url, status, text)
            delay = min(self.max_backoff, self.backoff * 2**attempt)
            delay *= random.uniform(0.75, 1.25)
            attempt += 1
            self.retried += 1
            log.warning("%s %s: HTTP %s, retry %d/%d in %.2fs", method, url, status, attempt,
                        retries, delay)
            await asyncio.sleep(delay)

    async def paginate(self, path: str, params: dict[str, Any]) -> AsyncIterator[dict]:
        """Items of a paginated list endpoint (also a plain list, from hubs < 2)."""
        url: str | None = f"{self.url}{path}?{urlencode(params)}"
        while url:
            _, page = await self.request(
                "GET", url, headers={"Accept": "application/jupyterhub-pagination+json"})
            if isinstance(page, list):
                for item in page:
                    yield item
                return
            for item in page.get("items", []):
                yield item
            nxt = (page.get("_pagination") or {}).get("next")
            url = nxt["url"] if nxt else None

    async def users(self, page_size: int = 0, state: str = "ready") -> AsyncIterator[dict]:
        params: dict[str, Any] = {"state": state}
        if page_size:
            params["limit"] = page_size
        async for u in self.paginate("/users", params):
            yield u

    def server_path(self, user: str, server: str) -> str:
        if server:
            return f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        return f"/users/{quote(user, safe='')}/server"

    async def stop_server(self, user: str, server: str, remove: bool = False) -> int:
        """DELETE the server; returns 204 (stopped), 202 (stopping) or 404/400 (already gone)."""
        body = {"remove": True} if (remove and server) else None
        status, _ = await self.request("DELETE", self.server_path(user, server), body=body,
                                       ok=(400, 404))
        return status

    async def delete_user(self, user: str) -> int:
        status, _ = await self.request("DELETE", f"/users/{quote(user, safe='')}", ok=(404,))
        return status

    async def gpu_queue(self, url: str, timeout: float = 10.0) -> dict[str, Any] | None:
        """gpuspawner's wait queue: ``GET url`` (``.../services/gpuspawner/api/queue``), one
        try, at most ``timeout`` seconds, with this client's token. The document::

            {"length": 2, "by_profile": {"a100-1": 2}, "waiting_gpus": {"A100": 2},
             "entries": [{"id": "q1-...", "user": "bob", "server": "", "profile": "a100-1",
                          "position": 1, "waited_s": 12.5, "gpu_models": ["A100"],
                          "gpus": 1, "gpu_milli": 0, ...}]}

        (``entries``: all of them for a token with ``read:servers`` or ``admin:servers``, else
        only the token owner's; ``waiting_gpus``: model, or ``"GPU"`` for any model, ->
        entries waiting for whole or shared GPUs).

        Returns:
            the document, or None when the answer is 404 (no gpuspawner service there).

        Raises:
            HubAPIError: any other failure (5xx, 403, 599 = no answer within ``timeout``).
            ValueError: the answer is not a JSON object.
        """
        status, doc = await self.request("GET", url, ok=(404,), retries=0, timeout=timeout)
        if status == 404:
            return None
        if not isinstance(doc, dict):
            raise ValueError(f"GET {url}: not a JSON object: {str(doc)[:100]}")
        return doc

    async def gpu_nodes(self, url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """gpuspawner's inventory, ``GET url`` (``.../services/gpuspawner/api/nodes``: a list
        of nodes, each with ``name``, ``gpus: [{"uuid", "model", "shareable", ...}]`` and
        ``numa_nodes``; any user may read it), one try, at most ``timeout`` seconds.

        Raises:
            HubAPIError: the request failed (404 included).
            ValueError: the answer is not a list of nodes.
        """
        _, nodes = await self.request("GET", url, retries=0, timeout=timeout)
        if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
            raise ValueError(f"GET {url}: not a list of nodes: {str(nodes)[:100]}")
        return nodes
