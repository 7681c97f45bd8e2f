"""The server state GPUSpawner stores in the hub database, and one typed view of it, shared by
the spawner (which writes it) and the idle culler (which reads it through the hub API).

JupyterHub keeps what :meth:`GPUSpawner.get_state` returns as the spawner's ``state`` and
gives it back to :meth:`GPUSpawner.load_state` after a hub restart; a token with the
``admin:server_state`` scope sees it in the server model (``GET /users``:
``servers[name]["state"]``). Its shape::

    {"allocation": {...},          # placement.Allocation.to_dict(): id, owner, node,
                                   #   gpus: [{"uuid": "GPU-...", "milli": 1000}], cpuset, ...
     "backend": {...},             # what the backend needs to find the server again
     "certs_dir": "/srv/...",      # internal_ssl: the server's certificate folder
     "image": {"reference": "...", "digest": "sha256:..."},  # a user's own image, checked
     "moves": [{"from": "n1", "to": "n2", "at": 1764.0, "reason": "..."}]}  # restarts elsewhere

and each key is present only when it has a value. The backend's part:

- Docker (:class:`gpuspawner.backends.docker_backend.DockerBackend`): ``node``,
  ``container_id`` (after the container was created), ``ip`` (the server's address),
  ``network`` (per-server isolation: the server network's ``to_dict()``, with ``name``).
- Slurm (:class:`gpuspawner.backends.slurm.backend.SlurmBackend`): ``node``, ``job_id``,
  ``output``, ``submitted``, ``started``, ``picked``, ``port``.

Which backend wrote a state is read from these keys (:attr:`ServerState.backend_kind`): no
``kind`` key is stored, so states written before this module read the same.

This module is a leaf (the standard library only; contract "the server state accessor is a
leaf" in ``pyproject.toml``): the culler, which must not import the hub or the backends, reads
it. Reading never raises on a malformed or foreign state (another spawner's, an older
gpuspawner's): what is missing or of the wrong type reads as empty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALLOCATION", "BACKEND", "CERTS_DIR", "DOCKER", "IMAGE", "MOVES", "SLURM",
           "ServerState"]

#: the top-level keys GPUSpawner stores
ALLOCATION, BACKEND, CERTS_DIR, IMAGE = "allocation", "backend", "certs_dir", "image"
MOVES = "moves"
#: how many restarts elsewhere a state keeps
KEPT_MOVES = 20
#: values of :attr:`ServerState.backend_kind`
DOCKER, SLURM = "docker", "slurm"


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ServerState:
    """A typed view of one GPUSpawner server's stored state.

    Attributes:
        allocation: the allocation as stored (``Allocation.to_dict()``), ``{}`` when none.
        backend: the backend's state (see the module docstring), ``{}`` when none.
        certs_dir: the server's internal_ssl certificate folder, ``""`` when none.
        image: a user's own image (``image--unlisted-choice``) as checked on the node:
            ``{"reference": ..., "digest": "sha256:...", "jupyterhub_version": ...}``; ``{}``
            for the profile's images.
        moves: the server's restarts on another node after its node failed, oldest first:
            ``{"from": node, "to": node, "at": seconds since the epoch, "reason": text}``
            (the last :data:`KEPT_MOVES`).
    """

    allocation: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    certs_dir: str = ""
    image: dict[str, Any] = field(default_factory=dict)
    moves: list[dict[str, Any]] = field(default_factory=list)

    # -- the two directions ---------------------------------------------------------------
    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> ServerState:
        """The view of a stored state (``None``, ``{}`` or a foreign state: an empty view)."""
        state = state if isinstance(state, Mapping) else {}
        return cls(_dict(state.get(ALLOCATION)), _dict(state.get(BACKEND)),
                   _str(state.get(CERTS_DIR)), _dict(state.get(IMAGE)),
                   [dict(m) for m in state.get(MOVES) or [] if isinstance(m, Mapping)]
                   if isinstance(state.get(MOVES), list) else [])

    def to_state(self) -> dict[str, Any]:
        """The dict to store (only the keys that have a value); the inverse of
        :meth:`from_state`."""
        out: dict[str, Any] = {}
        if self.allocation:
            out[ALLOCATION] = dict(self.allocation)
        if self.backend:
            out[BACKEND] = dict(self.backend)
        if self.certs_dir:
            out[CERTS_DIR] = self.certs_dir
        if self.image:
            out[IMAGE] = dict(self.image)
        if self.moves:
            out[MOVES] = [dict(m) for m in self.moves[-KEPT_MOVES:]]
        return out

    # -- what readers ask -----------------------------------------------------------------
    @property
    def backend_kind(self) -> str:
        """``"docker"`` (a ``container_id`` or a ``network``), ``"slurm"`` (a ``job_id``), or
        ``""`` (nothing launched yet, or not a GPUSpawner state)."""
        if "job_id" in self.backend:
            return SLURM
        if "container_id" in self.backend or "network" in self.backend:
            return DOCKER
        return ""

    @property
    def node(self) -> str:
        """The node the server runs on: the backend's ``node``, else the allocation's."""
        return _str(self.backend.get("node")) or _str(self.allocation.get("node"))

    @property
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the allocation's GPUs (whole or shared), in allocation order."""
        gpus = self.allocation.get("gpus")
        if not isinstance(gpus, list):
            return []
        return [g["uuid"] for g in gpus
                if isinstance(g, Mapping) and isinstance(g.get("uuid"), str) and g["uuid"]]

    @property
    def allocation_id(self) -> str:
        return _str(self.allocation.get("id"))

    @property
    def container_id(self) -> str:
        """The Docker container's id, ``""`` when not a Docker server (or not created yet)."""
        return _str(self.backend.get("container_id"))

    @property
    def network_name(self) -> str:
        """The Docker server's own network (per-server isolation), ``""`` otherwise."""
        return _str(_dict(self.backend.get("network")).get("name"))

    @property
    def ip(self) -> str:
        """The server's address as the backend recorded it (Docker), ``""`` when unknown."""
        return _str(self.backend.get("ip"))

    @property
    def slurm_job_id(self) -> str:
        """The Slurm job's id, ``""`` when not a Slurm server (or not submitted yet)."""
        job = self.backend.get("job_id")
        return str(job) if isinstance(job, (str, int)) and not isinstance(job, bool) else ""


#: the environment variable that tells a server started by a move where it came from (JSON
#: ``{"from": node, "to": node, "at": epoch seconds, "reason": text}``); set by
#: GPUSpawner.restart_elsewhere, read by the server's ``/api/gpuspawner/gpus`` (``moved``) so
#: JupyterLab can tell the user
MOVED_ENV = "GPUSPAWNER_MOVED"


def moved_env(moving: Mapping[str, Any] | None, node: str) -> dict[str, str]:
    """``{MOVED_ENV: json}`` for a server started on ``node`` by a move (``moving``: ``from``,
    ``at`` in epoch seconds, ``reason``), ``{}`` for an ordinary start (``moving`` None)."""
    if not moving:
        return {}
    record = {"from": _str(moving.get("from")), "to": node,
              "at": float(moving.get("at") or 0.0), "reason": _str(moving.get("reason"))}
    return {MOVED_ENV: json.dumps(record, sort_keys=True)}


def moved_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The move record of :func:`moved_env` read back from ``env``; None when absent or
    malformed (never raises: the variable is only advice to the user)."""
    raw = env.get(MOVED_ENV)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        record = {"from": _str(doc["from"]), "to": _str(doc["to"]), "at": float(doc["at"]),
                  "reason": _str(doc.get("reason"))}
    except (ValueError, TypeError, KeyError):
        return None
    return record if record["from"] and record["to"] else None
