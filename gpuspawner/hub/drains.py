"""Drained GPUs kept across hub restarts: a small JSON file (``GPUSpawner.gpu_drains_file``).

The file holds every drain, an admin's (``gpuspawner drain-gpu``, ``POST api/gpus/{uuid}/drain``)
and the health check's (:mod:`gpuspawner.inventory.health`), and the health reasons an admin
acknowledged by undraining a GPU the check had drained::

    {"version": 1,
     "drains": {"GPU-...": {"node": "local", "reason": "xid 79 (GPU fell off the bus)",
                            "by": "health", "since": 1763900000.0}},
     "acknowledged": {"GPU-...": ["page retirement pending (reset the GPU)"]}}

``by`` is ``"health"`` or the admin's hub name; ``since`` is seconds since the epoch. The file
is written atomically (a temporary file in the same folder, then ``os.replace``), so a crash
leaves the old or the new content, never a torn one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DRAINS_FILE_NAME", "DrainFileError", "DrainRecord", "DrainStore",
           "default_drains_file"]

#: the file's name when ``GPUSpawner.gpu_drains_file`` is empty
DRAINS_FILE_NAME = "gpuspawner-drains.json"
VERSION = 1


class DrainFileError(ValueError):
    """The drains file cannot be used; the message names the file and the field."""


@dataclass
class DrainRecord:
    """One drained GPU: its node, why, who (``"health"`` or an admin's name), since when
    (seconds since the epoch)."""

    node: str
    reason: str
    by: str
    since: float

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "by": self.by, "since": self.since}


@dataclass
class DrainState:
    """What the file holds: drains by GPU UUID, acknowledged health reasons by GPU UUID."""

    drains: dict[str, DrainRecord] = field(default_factory=dict)
    acknowledged: dict[str, list[str]] = field(default_factory=dict)


def file_beside_db(db_url: str | None, name: str) -> str:
    """Where a state file ``name`` of the hub goes when its setting is empty: beside the hub's
    SQLite database (``JupyterHub.db_url`` ``sqlite:///PATH``), else in the hub's working
    directory (where JupyterHub keeps ``jupyterhub.sqlite`` by default). An absolute path."""
    prefix = "sqlite:///"
    if db_url and db_url.startswith(prefix) and ":memory:" not in db_url:
        path = db_url[len(prefix):].split("?", 1)[0]
        return os.path.abspath(os.path.join(os.path.dirname(path) or ".", name))
    return os.path.abspath(name)


def default_drains_file(db_url: str | None) -> str:
    """Where the drains go when ``GPUSpawner.gpu_drains_file`` is empty
    (:func:`file_beside_db`)."""
    return file_beside_db(db_url, DRAINS_FILE_NAME)


class DrainStore:
    """Reads and writes the drains file at ``path``.

    Raises (from :meth:`check`, :meth:`load`, :meth:`save`):
        DrainFileError: the folder is missing or not writable, or the file is not valid
            (``<path>: drains.GPU-1.reason: must be a non-empty string``).
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)

    def check(self) -> None:
        """At hub start: the folder exists and is writable, and the file (if any) loads."""
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise DrainFileError(f"{self.path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise DrainFileError(f"{self.path}: folder {folder} is not writable")
        if os.path.exists(self.path) and not os.access(self.path, os.R_OK | os.W_OK):
            raise DrainFileError(f"{self.path}: not readable and writable")
        self.load()

    def load(self) -> DrainState:
        """The file's content (empty when the file does not exist)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return DrainState()
        except (OSError, ValueError) as e:
            raise DrainFileError(f"{self.path}: {e}") from None
        return self._parse(data)

    def _parse(self, data: Any) -> DrainState:
        def bad(where: str, what: str) -> DrainFileError:
            return DrainFileError(f"{self.path}: {where}: {what}")

        if not isinstance(data, dict):
            raise bad("(top)", "must be an object")
        if data.get("version") != VERSION:
            raise bad("version", f"must be {VERSION}, got {data.get('version')!r}")
        unknown = set(data) - {"version", "drains", "acknowledged"}
        if unknown:
            raise bad(sorted(unknown)[0], "unknown field")
        state = DrainState()
        drains = data.get("drains", {})
        if not isinstance(drains, dict):
            raise bad("drains", "must be an object")
        for uuid, d in drains.items():
            where = f"drains.{uuid}"
            if not isinstance(d, dict):
                raise bad(where, "must be an object")
            for key in ("node", "reason", "by"):
                if not isinstance(d.get(key), str) or not d[key]:
                    raise bad(f"{where}.{key}", "must be a non-empty string")
            since = d.get("since")
            if isinstance(since, bool) or not isinstance(since, (int, float)):
                raise bad(f"{where}.since", "must be a number (seconds since the epoch)")
            state.drains[uuid] = DrainRecord(d["node"], d["reason"], d["by"], float(since))
        acked = data.get("acknowledged", {})
        if not isinstance(acked, dict):
            raise bad("acknowledged", "must be an object")
        for uuid, reasons in acked.items():
            if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
                raise bad(f"acknowledged.{uuid}", "must be a list of strings")
            state.acknowledged[uuid] = list(reasons)
        return state

    def save(self, state: DrainState) -> None:
        """Write ``state`` atomically."""
        data = {"version": VERSION,
                "drains": {u: r.to_dict() for u, r in sorted(state.drains.items())},
                "acknowledged": {u: list(r) for u, r in sorted(state.acknowledged.items())}}
        folder = os.path.dirname(self.path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".gpuspawner-drains.", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                    f.write("\n")
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            raise DrainFileError(f"{self.path}: cannot write: {e}") from None
