"""Ports reported by the servers themselves (docs/slurm-backend.md, "How the hub learns the
port").

A Slurm job shares its node's network, so the port its server binds could be taken by another
user's process first. The port is therefore never published where other users read (a job's
``Comment`` was), and never taken from anyone but the server: the job's reporter
(:data:`REPORT_PORT`, run beside the server by the job script) waits until the server's own
process holds a listening socket on the port, then sends it to the hub with the server's own
API token (``POST {JUPYTERHUB_API_URL}/gpuspawner/port``,
:class:`gpuspawner.hub.port_report.PortReportHandler`). The launch waits for the report that
carries exactly the token it gave the job; a report with any other token (another user's,
another server's of the same user) is refused.

:data:`PORT_REPORTS` is one per process (the hub): the handler and the launches meet there.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading

__all__ = ["PORT_REPORTS", "REPORT_PATH", "REPORT_PORT", "PortReports"]

#: the path under ``JUPYTERHUB_API_URL`` that takes the report
REPORT_PATH = "/gpuspawner/port"

#: The reporter (``python -c REPORT_PORT PID PORT TIMEOUT``, standard library only): waits,
#: at most TIMEOUT seconds, until process PID (the server: the job script ``exec``\ s it, so it
#: keeps the script's PID) holds a socket listening on PORT (its ``/proc/PID/fd`` links
#: against the LISTEN entries of ``/proc/net/tcp`` and ``tcp6``), then POSTs ``{"port": PORT}``
#: to ``$JUPYTERHUB_API_URL/gpuspawner/port`` with ``Authorization: token
#: $JUPYTERHUB_API_TOKEN`` (with internal_ssl: the server's own certificate, the hub checked
#: with ``$JUPYTERHUB_SSL_CLIENT_CA``). A port another process listens on is never reported.
REPORT_PORT = r"""
import json, os, ssl, sys, time, urllib.error, urllib.request
pid, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
def mine():
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out
def listening():
    inodes = mine()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            p = row.split()
            if (len(p) > 9 and p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port
                    and p[9] in inodes):
                return True
    return False
def fail(why):
    print(f"gpuspawner: the port {port} was not reported to the hub: {why}", file=sys.stderr,
          flush=True)
    sys.exit(1)
try:
    while not listening():
        if time.monotonic() > deadline:
            fail(f"the server did not listen on it within {limit:g} s")
        time.sleep(0.05)
except FileNotFoundError:
    fail("the server process ended")
url = os.environ["JUPYTERHUB_API_URL"].rstrip("/") + "/gpuspawner/port"
handlers = [urllib.request.ProxyHandler({})]
if url.startswith("https:"):
    ctx = ssl.create_default_context(cafile=os.environ.get("JUPYTERHUB_SSL_CLIENT_CA"))
    ctx.load_cert_chain(os.environ["JUPYTERHUB_SSL_CERTFILE"],
                        os.environ["JUPYTERHUB_SSL_KEYFILE"])
    handlers.append(urllib.request.HTTPSHandler(context=ctx))
opener = urllib.request.build_opener(*handlers)
request = urllib.request.Request(
    url, data=json.dumps({"port": port}).encode(), method="POST",
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"],
             "Content-Type": "application/json"})
while True:
    try:
        opener.open(request, timeout=10).close()
        break
    except urllib.error.HTTPError as e:
        fail(f"the hub answered {e.code} {e.reason}")
    except OSError as e:
        if time.monotonic() > deadline:
            fail(f"the hub at {url} did not answer: {e}")
        time.sleep(0.2)
"""


def _key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class PortReports:
    """Launches waiting for their server's report, keyed by the SHA-256 of the API token the
    server was given. Thread-safe: :meth:`report` may come from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = {}

    def expect(self, token: str) -> asyncio.Future[int]:
        """Start waiting for the report of the server holding ``token`` (call in the event loop
        that awaits it; :meth:`forget` when done).

        A launch that waited with the same token before (a relaunch of the same spawn) no
        longer gets a report: its future is cancelled.

        Raises:
            ValueError: an empty token.
        """
        if not token:
            raise ValueError("the server has no JUPYTERHUB_API_TOKEN to report its port with")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with self._lock:
            old = self._waiting.pop(_key(token), None)
            self._waiting[_key(token)] = (loop, fut)
        if old is not None:
            old_loop, old_fut = old
            try:
                old_loop.call_soon_threadsafe(old_fut.cancel)
            except RuntimeError:
                pass
        return fut

    def forget(self, token: str, fut: asyncio.Future[int] | None = None) -> None:
        """Stop waiting for ``token``'s report (only if ``fut`` is still the one waiting,
        when given). Never raises."""
        with self._lock:
            waiting = self._waiting.get(_key(token or ""))
            if waiting is not None and (fut is None or waiting[1] is fut):
                del self._waiting[_key(token or "")]

    def report(self, token: str, port: int) -> bool:
        """The server holding ``token`` listens on ``port``. True when a launch waited for it
        (the first report counts), False when none waits for this token.

        Raises:
            ValueError: ``port`` is no TCP port (an int in 1..65535).
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port: {port!r} is no TCP port (1..65535)")
        with self._lock:
            waiting = self._waiting.pop(_key(token or ""), None)
        if waiting is None:
            return False
        loop, fut = waiting

        def settle() -> None:
            if not fut.done():
                fut.set_result(port)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # that loop is closed: its launch is gone
            return False
        return True


#: the process's reports (the hub's handler and every SlurmBackend's launches)
PORT_REPORTS = PortReports()
