"""Readiness that means ready: wait until *this* server answers, not any listener.

JupyterHub takes any HTTP answer below 500 on the server's address as "ready"
(``jupyterhub.utils.wait_for_http_server``); on a shared network namespace a user's process
could answer first (docs/security.md). :func:`wait_for_own_server` is engine-neutral: the
backend says whether its server still runs (``exited``), and the server must answer at its own
address as a Jupyter server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

#: exited() -> None while the server's process runs, else the failure text (exit code, logs)
ExitCheck = Callable[[], Awaitable["str | None"]]


async def wait_for_own_server(ip: str, port: int, base_url: str, *, exited: ExitCheck,
                              timeout: float, tls: bool = False, name: str = "server") -> None:
    """Wait until the server at ``ip:port`` answers, at most ``timeout`` seconds.

    Every round asks ``exited()`` first: a server that is gone fails at once with the
    backend's report. Then ``{base_url}api`` must answer as a Jupyter server (JSON with
    ``version``; jupyter_server's unauthenticated ``GET /api``). With ``tls`` (internal_ssl)
    only the TCP connection is checked: JupyterHub then verifies the server's certificate,
    issued for this IP, before it routes to it. Polls every 50 ms, backing off to 0.5 s.

    Raises:
        web.HTTPError(500): the server exited (the backend's report) or did not answer in
            ``timeout`` seconds (with the last error).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    url = f"http://{ip}:{port}{base_url}api"
    client = AsyncHTTPClient()
    delay = 0.05
    last = "no answer yet"
    while True:
        report = await exited()
        if report is not None:
            raise web.HTTPError(500, report)
        if tls:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 2)
                writer.close()
                return
            except (OSError, asyncio.TimeoutError) as e:
                last = str(e) or type(e).__name__
        else:
            try:
                r = await client.fetch(HTTPRequest(url, request_timeout=2, connect_timeout=2,
                                                   follow_redirects=False))
                if "version" in json.loads(r.body or b"{}"):
                    return
                last = f"{url} answered without a Jupyter server version"
            except HTTPClientError as e:
                last = f"{url}: HTTP {e.code}"
            except (OSError, ValueError) as e:
                last = f"{url}: {e}"
        if loop.time() >= deadline:
            raise web.HTTPError(500, f"{name} did not answer within {timeout:g} s ({last})")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)
