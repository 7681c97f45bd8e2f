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

Admins' changes through the web API never touch the shipped policies file (tracked, with its
comments): they go to an **overrides file** (:attr:`PolicySet.overrides_path`, YAML, mode
0600, written atomically) that holds only what differs from the shipped file::

    global: {idle_timeout: 7200.0}        # present only when the global entry was changed
    groups: {gpu-course: {max_age: 0.0}}  # entries set (added or replaced, whole entries)
    users: {bob: {exempt: true}}
    removed: {users: [carol]}             # shipped entries an admin deleted

The policy in force is the shipped file with the overrides merged over it, entry by entry
(:func:`merge_overrides`), at start and after each change (the shipped file is read again
then, so its own edits are kept for every entry no admin changed).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.placement.units import parse_seconds
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
#: the sections of a policy document holding named entries
_SECTIONS = ("groups", "users")
#: the overrides file's name when none is configured (in the service's working directory)
OVERRIDES_FILE_NAME = "culler_policy_overrides.yaml"


class PolicyError(ValueError):
    """A policy file or entry that cannot be used; the message names the entry and field."""


def parse_duration(value: Any, where: str = "") -> float:
    """Seconds from a number or a string like ``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``.

    The reading is :func:`gpuspawner.placement.units.parse_seconds` (one grammar for the hub's
    and the culler's durations); this adds the policy field to the message.

    Args:
        value: a number of seconds (int or float, not bool) or a duration string.
        where: the field's path (e.g. ``users.bob.idle_timeout``), the message's prefix.

    Raises:
        PolicyError: ``<where>: not a duration: ...`` or ``<where>: must be >= 0 seconds, ...``.
    """
    try:
        if not isinstance(value, int | float | str):
            raise ValueError(f"not a duration: {value!r}")
        return parse_seconds(value)
    except ValueError as e:
        raise PolicyError(f"{where}: {e}" if where else str(e)) from None


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


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PolicyError(f"{path}: not valid YAML: {e}") from e
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the {what}: {e}") from e


def normalize_document(data: Any) -> dict[str, Any]:
    """A validated policy document with its values converted (:func:`normalize_entry`), in
    the shape of :meth:`PolicySet.to_dict`: ``{"global": {...}, "groups": {...},
    "users": {...}}``.

    Raises:
        PolicyError: the document does not match the ``culler-policies`` JSON Schema.
    """
    try:  # the culler-policies JSON Schema first: every section and entry at once
        validate("culler-policies", data, where="")
    except ConfigSchemaError as e:
        raise PolicyError(str(e) if e.path else f"policy document: {e.reason}") from None
    data = data or {}
    out: dict[str, Any] = {"global": normalize_entry(data.get("global"), "global")}
    for section in _SECTIONS:
        out[section] = {str(k): normalize_entry(v, f"{section}.{k}")
                        for k, v in (data.get(section) or {}).items()}
    return out


def normalize_overrides(data: Any, where: str = "overrides") -> dict[str, Any]:
    """A validated overrides document (see the module docstring), values converted; the
    empty document is ``{}``.

    Raises:
        PolicyError: an unknown section, a wrong entry, or a ``removed`` that is not
            ``{"groups"|"users": [names]}``; the message starts with ``where``.
    """
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {"global", *_SECTIONS, "removed"})
    if unknown:
        raise PolicyError(f"{where}.{unknown[0]}: unknown field; known: global, groups, "
                          "users, removed")
    try:
        doc = normalize_document({k: v for k, v in data.items() if k != "removed"})
    except PolicyError as e:
        raise PolicyError(f"{where}: {e}") from None
    out: dict[str, Any] = {}
    if "global" in data:
        out["global"] = doc["global"]
    for section in _SECTIONS:
        if doc[section]:
            out[section] = doc[section]
    removed = data.get("removed") or {}
    if not isinstance(removed, dict) or set(removed) - set(_SECTIONS) or not all(
            isinstance(names, list) and all(isinstance(n, str) for n in names)
            for names in removed.values()):
        raise PolicyError(f"{where}.removed: expected {{groups: [names], users: [names]}}")
    removed = {s: sorted(set(n)) for s, n in removed.items() if n}
    if removed:
        out["removed"] = removed
    return out


def merge_overrides(shipped: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The policy in force: the (normalized) shipped document with the overrides merged over
    it, entry by entry: the overrides' ``global`` replaces the shipped one, their group and
    user entries replace or add whole entries, ``removed`` deletes shipped entries."""
    out = {"global": dict(overrides.get("global", shipped.get("global") or {}))}
    for section in _SECTIONS:
        entries = {k: dict(v) for k, v in (shipped.get(section) or {}).items()}
        for name in overrides.get("removed", {}).get(section, []):
            entries.pop(name, None)
        entries.update({k: dict(v) for k, v in (overrides.get(section) or {}).items()})
        out[section] = entries
    return out


def diff_overrides(shipped: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The overrides that turn the (normalized) ``shipped`` document into ``doc``: only what
    differs; ``merge_overrides(shipped, diff_overrides(shipped, doc)) == doc``."""
    out: dict[str, Any] = {}
    if (doc.get("global") or {}) != (shipped.get("global") or {}):
        out["global"] = dict(doc.get("global") or {})
    removed: dict[str, list[str]] = {}
    for section in _SECTIONS:
        old, new = shipped.get(section) or {}, doc.get(section) or {}
        changed = {k: dict(v) for k, v in new.items() if old.get(k) != v or k not in old}
        if changed:
            out[section] = changed
        gone = sorted(set(old) - set(new))
        if gone:
            removed[section] = gone
    if removed:
        out["removed"] = removed
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
    """The policies in force: the shipped policy file (:attr:`path`, only ever read) with the
    admins' overrides (:attr:`overrides_path`) merged over it; thread-safe.

    Changes (:meth:`put_document`, :meth:`put_entry`, :meth:`delete_entry`) re-read the
    shipped file, apply the change to the merged document, validate it, write what differs
    from the shipped file to the overrides file (:meth:`save`) and install the result.
    """

    def __init__(self, data: dict[str, Any] | None = None, path: str | Path | None = None,
                 base: dict[str, Any] | None = None,
                 overrides_path: str | Path | None = None) -> None:
        #: the shipped policy file (never written)
        self.path = Path(path) if path else None
        #: where admins' changes go (YAML, mode 0600); None: changes stay in memory
        self.overrides_path = Path(overrides_path) if overrides_path else None
        #: the command line's values (``--timeout``, ``--max-age``): below the file's global
        #: entry, above the built-in defaults; source ``cli``
        self.base = normalize_entry(base or {}, "command line")
        #: users exempt whatever the file says (``--exempt-users``; the demo hub's admin),
        #: source ``cli``
        self.exempt_users: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._change_lock = threading.Lock()
        self.global_: dict[str, Any] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.replace(data or {})
        #: the shipped document (normalized) the overrides are relative to
        self.shipped: dict[str, Any] = self.to_dict()

    @classmethod
    def load(cls, path: str | Path | None, base: dict[str, Any] | None = None,
             overrides: str | Path | None = None) -> PolicySet:
        """Read the shipped YAML policy file and merge the overrides file over it; ``None`` or
        a missing file gives only the defaults (no overrides)."""
        shipped = cls._read_shipped(Path(path) if path else None)
        ps = cls(shipped, path, base, overrides)
        if ps.overrides_path is not None and ps.overrides_path.exists():
            ov = normalize_overrides(_read_yaml(ps.overrides_path, "policy overrides"),
                                     str(ps.overrides_path))
            try:
                ps.replace(merge_overrides(ps.shipped, ov))
            except PolicyError as e:
                raise PolicyError(f"{ps.overrides_path}: {e}") from None
        return ps

    @staticmethod
    def _read_shipped(path: Path | None) -> dict[str, Any]:
        if path is None or not path.exists():
            return {}
        data = _read_yaml(path, "policies file") or {}
        try:
            return normalize_document(data)
        except PolicyError as e:
            raise PolicyError(f"{path}: {e}") from None

    def replace(self, data: dict[str, Any]) -> None:
        """Validate and install a whole new policy document in memory (all or nothing; no
        file is written: :meth:`put_document` also keeps it).

        Raises:
            PolicyError: the document does not match the ``culler-policies`` JSON Schema
                (:mod:`gpuspawner.schemas`), named by field: ``users.bob.idle_timeut:
                unknown field; known: ...``, ``policy: unknown field; known: global, ...``.
        """
        doc = normalize_document(data)
        with self._lock:
            self.global_, self.groups, self.users = doc["global"], doc["groups"], doc["users"]

    def to_dict(self) -> dict[str, Any]:
        """The policy document in force (values converted, see :func:`normalize_entry`)."""
        with self._lock:
            return {"global": dict(self.global_),
                    "groups": {k: dict(v) for k, v in self.groups.items()},
                    "users": {k: dict(v) for k, v in self.users.items()}}

    def overrides(self) -> dict[str, Any]:
        """What the document in force changes of the shipped one (the overrides file's
        content, :func:`diff_overrides`)."""
        return diff_overrides(self.shipped, self.to_dict())

    def save(self) -> None:
        """Write :meth:`overrides` to :attr:`overrides_path` (mode 0600; temp file + rename:
        never half-written). The shipped file is never written; without an overrides path
        nothing is."""
        if self.overrides_path is None:
            return
        target = self.overrides_path
        header = ("# idle-culler: admins' policy changes through its web API, merged over "
                  f"{self.path or 'the built-in defaults'}\n# (written by the service; "
                  "idle_culler/README.md)\n")
        text = header + yaml.safe_dump(self.overrides(), sort_keys=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".policy-overrides-")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _change(self, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Re-read the shipped file, apply ``edit`` to the document in force (the shipped
        file with the current overrides merged over it), validate, save the overrides and
        install; returns the new document. Nothing changes when ``edit`` or the validation
        raises."""
        with self._change_lock:
            current_overrides = self.overrides()
            # the shipped file as it is now (its own edits kept); in memory without one
            shipped = self._read_shipped(self.path) if self.path else self.shipped
            doc = edit(merge_overrides(shipped, current_overrides))
            new = normalize_document(doc)
            old_shipped, old_doc = self.shipped, self.to_dict()
            self.shipped = shipped
            self.replace(new)
            try:
                self.save()
            except BaseException:
                self.shipped = old_shipped
                self.replace(old_doc)
                raise
            return self.to_dict()

    def put_document(self, data: Any) -> dict[str, Any]:
        """Replace the whole policy document (an admin's ``PUT api/policies``); kept in the
        overrides file. Returns the document in force.

        Raises:
            PolicyError: the document is not valid (nothing changes).
        """
        normalize_document(data)  # the error names the document's own paths
        return self._change(lambda _doc: data)

    def put_entry(self, section: str, name: str | None, entry: Any) -> dict[str, Any]:
        """Set the ``global`` entry (``name`` None) or a ``groups``/``users`` entry (whole
        entry; ``None`` = empty); kept in the overrides file. Returns the document in force.

        Raises:
            PolicyError: a wrong entry, named ``<section>.<name>.<field>`` (nothing changes).
        """
        where = f"{section}.{name}" if name is not None else section
        if section not in ("global", *_SECTIONS) or (section == "global") != (name is None):
            raise PolicyError(f"{where}: no such policy entry")
        normalize_entry(entry, where)

        def edit(doc: dict[str, Any]) -> dict[str, Any]:
            if name is None:
                doc["global"] = entry or {}
            else:
                doc[section][name] = entry
            return doc

        return self._change(edit)

    def delete_entry(self, section: str, name: str) -> dict[str, Any]:
        """Remove a ``groups``/``users`` entry (also one of the shipped file: the overrides
        file lists it under ``removed``). Returns the document in force.

        Raises:
            KeyError: no such entry in force (nothing changes).
        """
        if section not in _SECTIONS:
            raise KeyError(f"{section}.{name}")

        def edit(doc: dict[str, Any]) -> dict[str, Any]:
            if name not in doc[section]:
                raise KeyError(f"{section}.{name}")
            del doc[section][name]
            return doc

        return self._change(edit)

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
            if user in self.exempt_users:
                values["exempt"], sources["exempt"] = True, "cli"
        return EffectivePolicy(values, sources)
