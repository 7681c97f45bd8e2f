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
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .certs import server_dns_name

#: exited() -> None while the server's process runs, else the failure text (exit code, logs)
ExitCheck = Callable[[], Awaitable["str | None"]]


@dataclass(frozen=True)
class ServerTLS:
    """What proves a server's identity with internal_ssl.

    Attributes:
        context: the hub's client context (its internal key pair, its CA bundle), hostname
            checked.
        hostname: the name that the server's certificate alone carries
            (:func:`gpuspawner.hub.certs.server_dns_name`).
    """

    context: ssl.SSLContext
    hostname: str


def server_tls(settings: Mapping[str, Any], name: str) -> ServerTLS:
    """The identity check of server ``name`` (its object name) for a hub with internal_ssl:
    the hub's ``internal_ssl_key``, ``internal_ssl_cert`` and ``internal_ssl_ca`` (JupyterHub's
    tornado settings, as ``User._wait_up`` uses them) and :func:`server_dns_name`.

    Raises:
        ValueError: the settings lack the hub's key, certificate or CA (internal_ssl off).
    """
    key, cert, ca = (settings.get(k) for k in ("internal_ssl_key", "internal_ssl_cert",
                                                "internal_ssl_ca"))
    if not (key and cert and ca):
        raise ValueError("internal_ssl_key, internal_ssl_cert, internal_ssl_ca: not in the "
                         "hub's settings (is internal_ssl on?)")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.check_hostname = True
    return ServerTLS(ctx, server_dns_name(name))


async def _ask_over_tls(ip: str, port: int, path: str, tls: ServerTLS) -> str | None:
    """GET ``path`` from ``ip:port`` over TLS whose certificate must name ``tls.hostname``;
    None when it answers 200 with a JSON ``version``, else what was wrong."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            ip, port, ssl=tls.context, server_hostname=tls.hostname), 2)
    except ssl.SSLCertVerificationError as e:
        return (f"{ip}:{port} is not this server: its certificate does not name "
                f"{tls.hostname} ({e.verify_message})")
    except (OSError, asyncio.TimeoutError) as e:
        return f"{ip}:{port}: {e or type(e).__name__}"
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {ip}:{port}\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(1 << 16), 2)
        while raw and len(raw) < 1 << 16:
            more = await asyncio.wait_for(reader.read(1 << 16), 2)
            if not more:
                break
            raw += more
    except (OSError, asyncio.TimeoutError) as e:
        return f"{ip}:{port}{path}: {e or type(e).__name__}"
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        return f"{ip}:{port}{path}: HTTP {(status or [b'?'])[0].decode(errors='replace')}"
    try:
        if "version" in json.loads(body or b"{}"):
            return None
    except ValueError:
        pass
    return f"{ip}:{port}{path} answered without a Jupyter server version"


async def _refused(ip: str, port: int) -> str | None:
    """Why a TCP connection to ``ip:port`` fails now (refused, unreachable, 2 s timeout);
    None when something listens. A refused connection costs a system call, where a refused
    HTTP request costs about five times the hub's CPU."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 2)
    except (OSError, asyncio.TimeoutError) as e:
        return f"{ip}:{port}: {e or type(e).__name__}"
    writer.close()
    return None


async def wait_for_own_server(ip: str, port: int, base_url: str, *, exited: ExitCheck,
                              timeout: float, tls: bool | ServerTLS = False,
                              name: str = "server", exit_check_s: float = 1.0) -> None:
    """Wait until the server at ``ip:port`` answers, at most ``timeout`` seconds.

    ``{base_url}api`` must answer as a Jupyter server (JSON with ``version``;
    jupyter_server's unauthenticated ``GET /api``), and ``exited()`` must say the server still
    runs right after that answer: an answer at the address of a server that is gone never
    counts. While nothing answers, ``exited()`` is asked at most every ``exit_check_s``
    seconds (the first round, and once more before the timeout): a server that is gone fails
    within about that long with the backend's report. (Asking it every round cost an engine
    call per round: with 8 servers starting at once that was the largest part of the
    hub's CPU spent waiting, on a machine whose CPUs the starting servers needed.) With
    ``tls`` a :class:`ServerTLS` (internal_ssl), the answer must come over TLS from a
    certificate of the hub's CA that names ``tls.hostname``, which this server's certificate
    alone carries: a listener with any other certificate (another user's server's, on a port
    it bound first) is never ready. ``tls=True`` without a :class:`ServerTLS` checks only the
    TCP connection (kept for callers without the hub's settings). Polls every 50 ms, backing
    off to 0.5 s; without TLS a round whose TCP connection is refused sends no HTTP request.

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
    asked = float("-inf")

    async def still_running() -> None:
        nonlocal asked
        asked = loop.time()
        report = await exited()
        if report is not None:
            raise web.HTTPError(500, report)

    while True:
        if loop.time() - asked >= exit_check_s:
            await still_running()
        answered = False
        if isinstance(tls, ServerTLS):
            problem = await _ask_over_tls(ip, port, f"{base_url}api", tls)
            answered = problem is None
            last = problem or last
        elif tls:
            problem = await _refused(ip, port)
            answered = problem is None
            last = problem or last
        else:
            problem = await _refused(ip, port)
            if problem is not None:
                last = problem
            else:
                try:
                    r = await client.fetch(HTTPRequest(url, request_timeout=2,
                                                       connect_timeout=2,
                                                       follow_redirects=False))
                    answered = "version" in json.loads(r.body or b"{}")
                    if not answered:
                        last = f"{url} answered without a Jupyter server version"
                except HTTPClientError as e:
                    last = f"{url}: HTTP {e.code}"
                except (OSError, ValueError) as e:
                    last = f"{url}: {e}"
        if answered:
            await still_running()  # the answer is this server's only while it runs
            return
        if loop.time() >= deadline:
            await still_running()  # gone: the backend's report says more than the timeout
            raise web.HTTPError(500, f"{name} did not answer within {timeout:g} s ({last})")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)
