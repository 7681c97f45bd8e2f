"""A stand-in for the hub's port-report API (``POST {api_url}/gpuspawner/port``,
:mod:`gpuspawner.hub.port_report`) for backend tests without a hub: a threaded HTTP server on
loopback that hands each report to :data:`~gpuspawner.backends.slurm.ports.PORT_REPORTS`, as
the hub's handler does (404 when no launch waits for the token). One per process."""

from __future__ import annotations

import http.server
import json
import threading

from ..backends.slurm.ports import PORT_REPORTS, REPORT_PATH

_lock = threading.Lock()
_url: str | None = None


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        auth = self.headers.get("Authorization", "")
        token = auth.split(" ", 1)[1] if auth.lower().startswith("token ") else ""
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            ok = self.path == "/hub/api" + REPORT_PATH and PORT_REPORTS.report(token,
                                                                            body["port"])
        except (ValueError, KeyError, TypeError):
            ok = False
        self.send_response(204 if ok else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def port_sink_api_url() -> str:
    """The stand-in's ``JUPYTERHUB_API_URL`` (``http://127.0.0.1:<port>/hub/api``), started
    on first use (a daemon thread)."""
    global _url
    with _lock:
        if _url is None:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            threading.Thread(target=server.serve_forever, daemon=True,
                             name="port-sink").start()
            _url = f"http://127.0.0.1:{server.server_address[1]}/hub/api"
        return _url
