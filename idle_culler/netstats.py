"""Network activity of a server's container from the Docker stats API.

Where a server runs on a bridge network, ``GET /containers/{id}/stats?stream=false`` reports
per-interface ``rx_bytes`` / ``tx_bytes`` (bytes since the container started); GPUSpawner's
default (a bridge network per server) gives every server one. With host networking there is no
``networks`` key and this signal is simply unavailable. The culler keeps the previous reading
per server and turns two readings into a rate (bytes/s); a rate at or above the policy's
``network_floor`` counts as activity.

The container and its node come from the state GPUSpawner stores, read through
:class:`gpuspawner.server_state.ServerState` (``backend.container_id``, ``backend.node``).
A Slurm job has no such signal: it shares its node's network namespace, so its bytes cannot be
told from the node's or other jobs'; its state reads as None here (no engine is asked).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuspawner.server_state import SLURM, ServerState

log = logging.getLogger("idle_culler.netstats")

#: reader(server_key, spawner_state) -> total rx+tx bytes, or None when unknown
Reader = Callable[[str, dict[str, Any]], "int | None"]


def engine_client(url: str, tls_cert_path: str = "", timeout: float = 10.0) -> Any:
    """A docker SDK client of the engine at ``url`` (``""``: the local engine, from the
    environment). A ``tcp://`` or ``https://`` engine is reached over mutual TLS when
    ``tls_cert_path`` holds ``ca.pem``, ``cert.pem`` and ``key.pem`` (the Docker CLI's
    ``DOCKER_CERT_PATH`` layout, as ``c.DockerBackend.tls_cert_path``), the engine's
    certificate verified against ``ca.pem``."""
    import docker

    if not url:
        return docker.from_env(timeout=int(timeout))
    tls: Any = False
    if tls_cert_path and url.startswith(("tcp://", "https://")):
        def pem(name: str) -> str:
            return os.path.join(tls_cert_path, name)

        tls = docker.tls.TLSConfig(client_cert=(pem("cert.pem"), pem("key.pem")),
                                   ca_cert=pem("ca.pem"), verify=True)
    return docker.DockerClient(base_url=url, tls=tls, timeout=int(timeout))


def docker_reader(docker_urls: dict[str, str], tls_cert_path: str = "",
                  timeout: float = 10.0) -> Reader:
    """A reader through the docker SDK: the engine is chosen by the server's node
    (``docker_urls[node]``, ``""`` = the local engine; a node not listed has no signal), the
    container by the GPUSpawner state's ``backend.container_id``
    (:class:`~gpuspawner.server_state.ServerState`; DockerSpawner's ``object_id`` /
    ``object_name`` on node ``""`` too). A Slurm server, a server not launched yet, an engine
    that does not answer and a container without a bridge network read as None.

    Reads are one-shot stats (``one_shot=True`` where the engine speaks API 1.41 or later):
    one sample instead of two, so at most about 1 s (the engine's next sampling tick) instead
    of 2 s; :meth:`NetworkMeter.prefetch` reads many servers at once. Engines over TCP:
    :func:`engine_client` (``tls_cert_path``); a call waits ``timeout`` seconds at most."""
    import docker

    clients: dict[str, Any] = {}

    def read(key: str, state: dict[str, Any]) -> int | None:
        view = ServerState.from_state(state)
        if view.backend_kind == SLURM:
            return None  # the job shares its node's network namespace: no signal
        cid, node = view.container_id, view.node
        if not cid and not view.backend_kind:  # DockerSpawner's state
            cid = str(state.get("object_id") or state.get("object_name") or "")
        if not cid or node not in docker_urls:
            return None
        url = docker_urls[node]
        try:
            if url not in clients:
                clients[url] = engine_client(url, tls_cert_path, timeout)
            api = clients[url].api
            one_shot = True if docker.utils.version_gte(api.api_version, "1.41") else None
            stats = api.stats(cid, stream=False, one_shot=one_shot)
        except Exception as e:
            log.debug("docker stats %s: %s", key, e)
            return None
        nets = stats.get("networks")
        if not nets:
            return None
        return sum(int(n.get("rx_bytes", 0)) + int(n.get("tx_bytes", 0)) for n in nets.values())

    return read


class NetworkMeter:
    """Rates from successive byte counters: :meth:`observe` returns bytes/s since the previous
    reading of the same server (None for the first reading or an unknown counter; a counter
    that went backwards, i.e. a new container, restarts the measurement). The culler reads a
    batch of servers at once with :meth:`prefetch` before it observes them."""

    def __init__(self, reader: Reader, concurrency: int = 16) -> None:
        self.reader = reader
        self.concurrency = concurrency
        self._last: dict[str, tuple[float, int]] = {}
        self._fetched: dict[str, int | None] = {}
        self._pool: ThreadPoolExecutor | None = None

    async def prefetch(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        """Read the counters of these servers (``(key, spawner state)``) at once, in up to
        ``concurrency`` threads: the reader blocks (an engine answers a stats call at its next
        sampling tick, up to a second later), so one server after the other would take a
        second per server. The next :meth:`observe` of each key uses its reading."""
        self._fetched = {}
        if not items:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="netstats")
        def read(key: str, state: dict[str, Any]) -> int | None:
            try:
                return self.reader(key, state)
            except Exception as e:  # one server's reading must not stop the pass
                log.warning("network counter of %s: %s", key, e)
                return None

        loop = asyncio.get_running_loop()
        totals = await asyncio.gather(*(loop.run_in_executor(self._pool, read, k, s)
                                        for k, s in items))
        self._fetched = {k: t for (k, _), t in zip(items, totals, strict=True)}

    def observe(self, key: str, state: dict[str, Any], now: float | None = None) -> float | None:
        now = time.time() if now is None else now
        if key in self._fetched:
            total = self._fetched.pop(key)
        else:
            total = self.reader(key, state)
        if total is None:
            self._last.pop(key, None)
            return None
        prev = self._last.get(key)
        self._last[key] = (now, total)
        if prev is None or total < prev[1] or now <= prev[0]:
            return None
        return (total - prev[1]) / (now - prev[0])

    def forget(self, keep: set[str]) -> None:
        for k in list(self._last):
            if k not in keep:
                del self._last[k]
