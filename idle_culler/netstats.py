"""Network activity of a server's container from the Docker stats API.

Where a server runs on a bridge network, ``GET /containers/{id}/stats?stream=false`` reports
per-interface ``rx_bytes`` / ``tx_bytes`` (bytes since the container started); GPUSpawner's
default (a bridge network per server) gives every server one. With host networking there is no
``networks`` key and this signal is simply unavailable. The culler keeps the previous reading
per server and turns two readings into a rate (bytes/s); a rate at or above the policy's
``network_floor`` counts as activity.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("idle_culler.netstats")

#: reader(server_key, spawner_state) -> total rx+tx bytes, or None when unknown
Reader = Callable[[str, dict[str, Any]], "int | None"]


def docker_reader(docker_urls: dict[str, str]) -> Reader:
    """A reader through the docker SDK: the engine is chosen by the allocation's ``node``
    (``docker_urls[node]``, ``""`` = the local engine), the container by the spawner state's
    ``object_id`` (DockerSpawner / GPUSpawner)."""
    import docker

    clients: dict[str, Any] = {}

    def read(key: str, state: dict[str, Any]) -> int | None:
        cid = state.get("object_id") or state.get("object_name")
        node = (state.get("allocation") or {}).get("node", "")
        if not cid or node not in docker_urls:
            return None
        url = docker_urls[node]
        if url not in clients:
            clients[url] = docker.DockerClient(base_url=url) if url else docker.from_env()
        try:
            stats = clients[url].api.stats(cid, stream=False)
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
    that went backwards, i.e. a new container, restarts the measurement)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._last: dict[str, tuple[float, int]] = {}

    def observe(self, key: str, state: dict[str, Any], now: float | None = None) -> float | None:
        now = time.time() if now is None else now
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
