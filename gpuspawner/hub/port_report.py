"""``POST /hub/api/gpuspawner/port``: a server tells the hub the port it listens on
(batchspawner's ``/hub/api/batchspawner`` idea, for the Slurm backend's jobs).

The caller must authenticate with a token (JupyterHub's usual ``Authorization: token ...``),
and the port is taken only for the spawn that gave the server *exactly that token*
(:data:`gpuspawner.backends.slurm.ports.PORT_REPORTS`, keyed by the token's SHA-256): another
user's token, or another server's token of the same user, reports nothing (404). The host is
never taken from the report: it is the node's ``host`` of ``c.GPUSpawner.nodes``.

Importing this module adds the handler to JupyterHub's API handlers (as batchspawner does);
:mod:`gpuspawner.hub.spawner` imports it.
"""

from __future__ import annotations

import jupyterhub.apihandlers
from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from ..backends.slurm.ports import PORT_REPORTS, REPORT_PATH

__all__ = ["PortReportHandler"]

#: the route, under the hub's prefix (``/hub/``)
ROUTE = r"/api" + REPORT_PATH


class PortReportHandler(APIHandler):
    """Take a server's own report of its port."""

    async def post(self) -> None:
        """Body ``{"port": N}`` (N an int in 1..65535), with the server's API token.

        Raises:
            web.HTTPError: 403 without a valid token; 400 for a body that is no
                ``{"port": N}``; 404 when no spawn of the hub waits for this token's report.
        """
        if self.current_user is None:
            raise web.HTTPError(403, "a port report needs the server's API token")
        token = self.get_auth_token() or ""
        body = self.get_json_body()
        if not isinstance(body, dict) or set(body) != {"port"}:
            raise web.HTTPError(400, 'the body must be {"port": <int>}')
        try:
            taken = PORT_REPORTS.report(token, body["port"])
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        if not taken:
            self.log.warning("port report refused: no spawn waits for a report with the "
                             "token of %s", getattr(self.current_user, "name", "?"))
            raise web.HTTPError(404, "no server waits for a port report with this token")
        self.set_status(204)
        self.finish()


if not any(route == ROUTE for route, *_ in jupyterhub.apihandlers.default_handlers):
    jupyterhub.apihandlers.default_handlers.append((ROUTE, PortReportHandler))
