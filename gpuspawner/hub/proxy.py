"""A proxy route that only its own server can take: :class:`GPUProxy`.

configurable-http-proxy checks a server's certificate against the route target's host. Every
server certificate of a node names the node's address (JupyterHub's own readiness check needs
it), so with the address as target any server of that node was accepted for any route of that
node: after a server exited, until the hub's next poll, another user who bound the freed port
(or whose server got the same address and port) received the route's requests with the
victim's cookies (docs/security.md). :class:`GPUProxy` gives each GPUSpawner server with
internal_ssl the route target ``https://<label>.<address>.server.gpuspawner.internal:<port>``
(:func:`route_host`) and starts the proxy with ``proxy_verify.js`` (:data:`PRELOAD`), which
connects to ``<address>`` and accepts only a certificate naming
``<label>.server.gpuspawner.internal`` (:func:`gpuspawner.hub.certs.server_dns_name`), the
name that server's certificate alone carries. The hub's own view (``spawner.server``) keeps
the address; :meth:`GPUProxy.get_all_routes` reads targets back as the hub wrote them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyterhub.proxy import ConfigurableHTTPProxy

from .certs import SERVER_ZONE, server_dns_name

#: the proxy's preload (node ``--require``): verifies zone targets, leaves other hosts alone
PRELOAD = str(Path(__file__).with_name("proxy_verify.js"))

_LABEL = re.compile(r"[0-9a-f]{32}")
_HOST = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def route_host(name: str, address: str) -> str:
    """The route host of server ``name`` (its object name) at ``address``:
    ``<label>.<address>.server.gpuspawner.internal``, ``<label>`` the first label of
    :func:`server_dns_name`; an IPv4 address or DNS name as it is (lower case), an IPv6
    address as ``ip6-`` and its 32 hex digits. ``proxy_verify.js`` reads it back.

    Raises:
        ValueError: ``address`` is neither an IP address nor a DNS name, or the host would be
            longer than DNS's 253 characters.
    """
    label = server_dns_name(name).split(".", 1)[0]
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        ip = None
    if isinstance(ip, ipaddress.IPv6Address):
        addr = f"ip6-{ip.exploded.replace(':', '')}"
    elif ip is not None:
        addr = str(ip)
    else:
        addr = address.lower().rstrip(".")
        if not _HOST.fullmatch(addr):
            raise ValueError(f"{address!r} is neither an IP address nor a DNS name")
    host = f"{label}.{addr}.{SERVER_ZONE}"
    if len(host) > 253:
        raise ValueError(f"{address!r}: the route host {host} is longer than 253 characters")
    return host


def address_of(host: str) -> tuple[str, str] | None:
    """``(label, address)`` of a :func:`route_host` (IPv6 in its compressed form), else None."""
    suffix = f".{SERVER_ZONE}"
    if not host.lower().endswith(suffix):
        return None
    label, _, addr = host.lower()[: -len(suffix)].partition(".")
    if not _LABEL.fullmatch(label) or not addr:
        return None
    if addr.startswith("ip6-") and re.fullmatch(r"[0-9a-f]{32}", addr[4:]):
        addr = str(ipaddress.IPv6Address(int(addr[4:], 16)))
    return label, addr


def verified_target(spawner: Any) -> str | None:
    """The route target of ``spawner``'s server that only that server can take, or None where
    the address is all there is to check: not a GPUSpawner (no ``object_name``), or no TLS
    (``http``: internal_ssl off)."""
    name = getattr(spawner, "object_name", None)
    server = getattr(spawner, "server", None)
    if not name or server is None:
        return None
    parts = urlsplit(server.host)
    if parts.scheme != "https" or not parts.hostname or parts.port is None:
        return None
    return f"https://{route_host(name, parts.hostname)}:{parts.port}"


def hub_target(target: str) -> str:
    """The target as the hub wrote it (``https://<address>:<port>``) for a verified one; any
    other target as it is."""
    parts = urlsplit(target)
    found = address_of(parts.hostname or "") if parts.scheme == "https" else None
    if found is None or parts.port is None:
        return target
    addr = found[1]
    return f"https://{f'[{addr}]' if ':' in addr else addr}:{parts.port}"


def node_options(current: str | None) -> str:
    """``NODE_OPTIONS`` with ``--require`` of :data:`PRELOAD` added (once)."""
    require = f"--require {json.dumps(PRELOAD)}"
    if current and require in current:
        return current
    return f"{current} {require}" if current else require


class GPUProxy(ConfigurableHTTPProxy):
    """configurable-http-proxy whose route to a GPUSpawner server with internal_ssl accepts
    only that server's certificate (``c.JupyterHub.proxy_class = "gpuspawner"``; every
    ``c.ConfigurableHTTPProxy`` setting applies).

    A proxy the hub starts gets ``NODE_OPTIONS=--require <proxy_verify.js>``; one started
    elsewhere (``should_start = False``) must be started with it (docs/slurm-backend.md),
    else its routes to these servers fail (503): the name resolves nowhere.
    """

    async def start(self) -> None:
        """Start configurable-http-proxy as :class:`ConfigurableHTTPProxy` does, with
        :data:`PRELOAD` in its ``NODE_OPTIONS`` (the hub's own environment is restored)."""
        saved = os.environ.get("NODE_OPTIONS")
        os.environ["NODE_OPTIONS"] = node_options(saved)
        try:
            await super().start()
        finally:
            if saved is None:
                os.environ.pop("NODE_OPTIONS", None)
            else:
                os.environ["NODE_OPTIONS"] = saved

    async def add_user(self, user: Any, server_name: str = "") -> None:
        """Route the user's server at :func:`verified_target` (JupyterHub's ``add_user``
        otherwise)."""
        spawner = user.spawners[server_name]
        target = verified_target(spawner)
        if target is None:
            return await super().add_user(user, server_name)
        if spawner.pending and spawner.pending != "spawn":
            raise RuntimeError(
                f"{spawner._log_name} is pending {spawner.pending}, shouldn't "
                "be added to the proxy yet!"
            )
        self.log.info(
            "Adding user %s to proxy %s => %s (%s: only its own certificate)",
            user.name,
            spawner.proxy_spec,
            spawner.server.host,
            target,
        )
        await self.add_route(
            spawner.proxy_spec, target, {"user": user.name, "server_name": server_name}
        )

    async def get_all_routes(self) -> dict[str, dict[str, Any]]:
        """The proxy's routes with verified targets read back as the hub wrote them, so that
        JupyterHub's ``check_routes`` finds them current."""
        routes = await super().get_all_routes()
        for route in routes.values():
            route["target"] = hub_target(route["target"])
        return routes
