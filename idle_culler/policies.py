"""Cull policies: a YAML file with a global default, per-group and per-user entries.

File format (every key optional; durations in seconds, or strings such as ``"10m"``, ``"2h"``)::

    global:
      idle_timeout: 3600        # s without activity (hub last_activity, network, GPU) -> "idle"
      pressure_idle_timeout: 900  # s: the shorter idle timeout of a GPU server while spawns
                                # wait in gpuspawner's queue for its GPU model -> "pressure_idle"
      gpu_idle_threshold: 5     # percent; mean GPU use below it over gpu_window -> "gpu_idle"
      gpu_window: 600           # s over which GPU utilisation is averaged
      network_floor: 1024       # bytes/s (rx + tx); container traffic above it counts as activity
      max_age: 43200            # s since start -> "max_age", even when active
      grace_period: 300         # s after start during which idle / gpu_idle never cull
      warning: 300              # s of "will be culled at T, because ..." before a cull
      exempt: false             # true: never culled
    groups:
      long-jobs: {idle_timeout: 28800, max_age: 0}
    users:
      alice: {exempt: true}

``0`` switches a limit off (``idle_timeout``, ``pressure_idle_timeout``, ``gpu_idle_threshold``,
``max_age``).

Precedence, per field: the user's entry if it sets the field; else the **most lenient** value
among the entries of the user's groups that set it (longer timeouts, ``0`` = off beats any
limit, also for ``pressure_idle_timeout``; lower thresholds and floors, longer grace and
warning, ``exempt: true``); else the global entry; else the command line (``--timeout``,
``--max-age``); else the built-in default (:data:`DEFAULTS`). :meth:`PolicySet.resolve` records
where each value came from (``user:alice``, ``group:long-jobs``, ``global``, ``cli``,
``default``).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.schemas import ConfigSchemaError, validate

#: built-in defaults, used where neither the file's global entry nor any other sets a field
DEFAULTS: dict[str, Any] = {
    "idle_timeout": 3600.0,
    "pressure_idle_timeout": 0.0,
    "gpu_idle_threshold": 0.0,
    "gpu_window": 600.0,
    "network_floor": 0.0,
    "max_age": 0.0,
    "grace_period": 0.0,
    "warning": 0.0,
    "exempt": False,
}

#: fields whose 0 means "no limit" (the most lenient value)
_ZERO_IS_OFF = {"idle_timeout", "pressure_idle_timeout", "max_age", "gpu_idle_threshold"}
#: fields where a larger value is more lenient (others: smaller is more lenient)
_LARGER_IS_LENIENT = {"idle_timeout", "pressure_idle_timeout", "max_age", "gpu_window",
                      "grace_period", "warning"}
_DURATIONS = {"idle_timeout", "pressure_idle_timeout", "max_age", "gpu_window", "grace_period",
              "warning"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PolicyError(ValueError):
    """A policy file or entry that cannot be used; the message names the entry and field."""


def parse_duration(value: Any, where: str = "") -> float:
    """Seconds from a number or a string like ``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``."""
    if isinstance(value, bool):
        raise PolicyError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", value)
        if not m:
            raise PolicyError(f"{where}: cannot read duration {value!r} (e.g. 600, '10m', '2h')")
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise PolicyError(f"{where}: expected a duration, got {value!r}")
    if seconds < 0:
        raise PolicyError(f"{where}: must be >= 0, got {value!r}")
    return seconds


def normalize_entry(entry: Any, where: str) -> dict[str, Any]:
    """Validate one entry (global, a group's or a user's) and convert its values: durations to
    seconds (float), ``gpu_idle_threshold`` to percent in [0, 100], ``network_floor`` to
    bytes/s, ``exempt`` to bool.

    The entry is checked against the ``culler-policies`` JSON Schema's ``entry`` definition
    first (:mod:`gpuspawner.schemas`: unknown keys, types, ranges, the form of durations).

    Raises:
        PolicyError: ``<where>.<field>: <reason>``, e.g. ``users.bob.idle_timeout: 'soon' is
            not a duration such as 600, "90s", "10m", "2h" or "1d"``.
    """
    try:
        validate("culler-policies", entry, where=where, definition="entry")
    except ConfigSchemaError as e:
        raise PolicyError(str(e)) from None
    out: dict[str, Any] = {}
    for key, value in (entry or {}).items():
        w = f"{where}.{key}"
        if key in _DURATIONS:
            out[key] = parse_duration(value, w)
        elif key == "exempt":
            out[key] = value
        else:
            out[key] = float(value)
    return out


def _leniency(field: str, value: Any) -> float:
    """A sort key: larger = more lenient."""
    if field == "exempt":
        return 1.0 if value else 0.0
    if field in _ZERO_IS_OFF and value == 0:
        return float("inf")
    return float(value) if field in _LARGER_IS_LENIENT else -float(value)


@dataclass
class EffectivePolicy:
    """The policy that applies to one user: ``values`` (field -> value, units as in the module
    docstring) and ``sources`` (field -> ``user:NAME`` | ``group:NAME`` | ``global`` |
    ``default``)."""

    values: dict[str, Any]
    sources: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_json(self) -> dict[str, Any]:
        return {k: {"value": self.values[k], "source": self.sources[k]} for k in self.values}


class PolicySet:
    """The parsed policy file; thread-safe; :meth:`save` writes it back atomically."""

    def __init__(self, data: dict[str, Any] | None = None, path: str | Path | None = None,
                 base: dict[str, Any] | None = None) -> None:
        self.path = Path(path) if path else None
        #: the command line's values (``--timeout``, ``--max-age``): below the file's global
        #: entry, above the built-in defaults; source ``cli``
        self.base = normalize_entry(base or {}, "command line")
        self._lock = threading.Lock()
        self.global_: dict[str, Any] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.replace(data or {})

    @classmethod
    def load(cls, path: str | Path | None, base: dict[str, Any] | None = None) -> PolicySet:
        """Read a YAML policy file; ``None`` or a missing file gives only the defaults."""
        if not path or not Path(path).exists():
            return cls({}, path, base)
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as e:
            raise PolicyError(f"{path}: not valid YAML: {e}") from e
        return cls(data, path, base)

    def replace(self, data: dict[str, Any]) -> None:
        """Validate and install a whole new policy document (all or nothing).

        Raises:
            PolicyError: the document does not match the ``culler-policies`` JSON Schema
                (:mod:`gpuspawner.schemas`), named by field: ``users.bob.idle_timeut:
                unknown field; known: ...``, ``policy: unknown field; known: global, ...``.
        """
        try:  # the culler-policies JSON Schema first: every section and entry at once
            validate("culler-policies", data, where="")
        except ConfigSchemaError as e:
            raise PolicyError(str(e) if e.path else f"policy document: {e.reason}") from None
        g = normalize_entry(data.get("global"), "global")
        groups = {str(k): normalize_entry(v, f"groups.{k}")
                  for k, v in (data.get("groups") or {}).items()}
        users = {str(k): normalize_entry(v, f"users.{k}")
                 for k, v in (data.get("users") or {}).items()}
        with self._lock:
            self.global_, self.groups, self.users = g, groups, users

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"global": dict(self.global_),
                    "groups": {k: dict(v) for k, v in self.groups.items()},
                    "users": {k: dict(v) for k, v in self.users.items()}}

    def save(self) -> None:
        """Write the policies to :attr:`path` (temp file + rename: never half-written)."""
        if self.path is None:
            return
        text = yaml.safe_dump(self.to_dict(), sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".policies-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)

    def sets(self, field: str) -> bool:
        """True when any entry (global, a group's, a user's, the command line) sets ``field``
        to a value other than 0 / false; e.g. ``sets("pressure_idle_timeout")``: whether the
        culler needs to read gpuspawner's wait queue at all."""
        with self._lock:
            entries = [self.base, self.global_, *self.groups.values(), *self.users.values()]
        return bool(DEFAULTS.get(field)) or any(e.get(field) for e in entries)

    def resolve(self, user: str, groups: Iterable[str] = ()) -> EffectivePolicy:
        """The effective policy of ``user`` in ``groups`` (see the module docstring)."""
        with self._lock:
            uentry = self.users.get(user, {})
            gentries = [(g, self.groups[g]) for g in sorted(set(groups)) if g in self.groups]
            values: dict[str, Any] = {}
            sources: dict[str, str] = {}
            for field, default in DEFAULTS.items():
                if field in uentry:
                    values[field], sources[field] = uentry[field], f"user:{user}"
                    continue
                cands = [(name, e[field]) for name, e in gentries if field in e]
                if cands:
                    name, v = max(cands, key=lambda c: _leniency(field, c[1]))
                    values[field], sources[field] = v, f"group:{name}"
                elif field in self.global_:
                    values[field], sources[field] = self.global_[field], "global"
                elif field in self.base:
                    values[field], sources[field] = self.base[field], "cli"
                else:
                    values[field], sources[field] = default, "default"
        return EffectivePolicy(values, sources)
