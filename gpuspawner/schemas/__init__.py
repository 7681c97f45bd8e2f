"""JSON Schemas (draft 2020-12) of gpuspawner's structured configuration, shipped in the package.

One schema per kind of setting, used by every reader of it: the hub's start-up check and the
spawner's trait validators (:mod:`gpuspawner.hub.config_check`), the idle culler
(:mod:`idle_culler.policies`), the hub service (``GET api/schemas/{name}``) and the docs
(``docs/configuration-schemas.md``):

- ``profiles``: ``c.GPUSpawner.profiles`` (a list of profiles),
- ``nodes``: ``c.GPUSpawner.nodes`` (a list of node entries),
- ``quotas``: ``c.GPUSpawner.quotas`` (``users`` / ``groups`` / ``default_user``),
- ``culler-policies``: the idle culler's policy document (``--policies`` YAML file),
- ``user-options``: what a user sends to start a server (``Spawner.user_options``: the
  spawn form or the REST API), checked once by :mod:`gpuspawner.hub.request`.

A schema checks structure, types, ranges and the form of strings (sizes, durations, slugs);
the rules it cannot express (unique slugs and node names, at most one default profile, what a
size or duration is worth, private network ranges) stay in the code that reads the value, run
after the schema.

This module is a leaf: the standard library and ``jsonschema`` only (an import-linter contract
in ``pyproject.toml``), so that the culler may use it without the hub.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

#: the shipped schemas, by name (``<name>.json`` in this package)
SCHEMA_NAMES: tuple[str, ...] = ("profiles", "nodes", "quotas", "culler-policies",
                                 "user-options")

#: JSON Schema dialect of every shipped schema
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class ConfigSchemaError(ValueError):
    """A value the schema refuses. The message is ``<field>: <reason>``, the field being
    ``where`` followed by the JSON path of the offending value, e.g.
    ``GPUSpawner.profiles[2].gpus: -1 is less than the minimum of 0``.

    Attributes:
        where: what the caller named the whole value (a trait, a file, a section).
        path: the JSON path inside the value: keys (str) and list indices (int).
        field: ``where`` and ``path`` as one name (:func:`format_field`).
        reason: why the value is refused.
    """

    def __init__(self, where: str, path: Sequence[str | int], reason: str) -> None:
        self.where = where
        self.path = tuple(path)
        self.field = format_field(where, self.path)
        self.reason = reason
        super().__init__(f"{self.field}: {reason}")


def format_field(where: str, path: Sequence[str | int]) -> str:
    """Name a field: ``where`` followed by ``path`` in the style of a Python config file.

    ``("GPUSpawner.profiles", [2, "gpus"])`` -> ``GPUSpawner.profiles[2].gpus``;
    ``("", ["global", "idle_timeout"])`` -> ``global.idle_timeout``; a ``where`` ending in
    ``:`` (a file name) is followed by a space: ``("p.yaml:", ["global"])`` -> ``p.yaml: global``.
    An empty result names the whole value: ``(value)``.
    """
    out = where
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out or out.endswith(":"):
            out += f" {part}" if out else str(part)
        else:
            out += f".{part}"
    return out or "(value)"


def load_schema(name: str) -> dict[str, Any]:
    """The schema ``name`` (one of :data:`SCHEMA_NAMES`) as a new dict (the caller may change
    it).

    Raises:
        KeyError: no schema of that name.
    """
    return json.loads(_schema_text(name))


@cache
def _schema_text(name: str) -> str:
    if name not in SCHEMA_NAMES:
        raise KeyError(f"no configuration schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    return resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")


@cache
def _root(name: str) -> dict[str, Any]:
    """The schema ``name``, parsed once (read only: :func:`load_schema` gives copies)."""
    return load_schema(name)


def _is_array(checker: Any, instance: Any) -> bool:
    return isinstance(instance, (list, tuple))


def _is_object(checker: Any, instance: Any) -> bool:
    return isinstance(instance, Mapping)


#: draft 2020-12 where tuples are arrays and any Mapping an object (Python config files)
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"array": _is_array, "object": _is_object}),
)


@cache
def _validator(name: str, definition: str | None) -> Any:
    schema = load_schema(name)
    if definition is None:
        return _Validator(schema)
    if definition not in schema.get("$defs", {}):
        raise KeyError(f"schema {name!r} has no definition {definition!r}")
    registry: Registry = Registry().with_resource(schema["$id"], Resource.from_contents(schema))
    return _Validator({"$ref": f"{schema['$id']}#/$defs/{definition}"}, registry=registry)


def _kind(branch: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    """What one ``anyOf`` branch accepts, for people: its title, the title of the local
    definition it refers to, or its JSON type(s)."""
    if branch.get("title"):
        return str(branch["title"])
    ref = branch.get("$ref", "")
    if isinstance(ref, str) and "#/$defs/" in ref:
        target = root.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
        if target.get("title"):
            return f"a {target['title']} (an object)" if "properties" in target else str(
                target["title"])
    types = branch.get("type", "any value")
    return " or ".join(types) if isinstance(types, list) else str(types)


def _reason(error: ValidationError, root: Mapping[str, Any]) -> tuple[list[str | int], str]:
    """The path (with the offending key added where one is named) and a reason for people;
    ``root`` is the whole schema (for the titles of the definitions it refers to)."""
    path = list(error.absolute_path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = list(schema.get("properties") or {})
        extra = sorted((k for k in error.instance if k not in known), key=str)
        if extra and known:
            return path + [extra[0]], f"unknown field; known: {', '.join(known)}"
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            return path + [missing[0]], "required field missing"
    if error.validator == "pattern" and schema.get("title"):
        return path, f"{error.instance!r} is not {schema['title']}"
    if error.validator in ("anyOf", "oneOf"):  # no branch of the value's own type
        if schema.get("title"):
            return path, f"{error.instance!r} is not {schema['title']}"
        kinds = [_kind(b, root) for b in error.validator_value if isinstance(b, Mapping)]
        return path, f"{error.instance!r} is not valid here; expected {' or '.join(kinds)}"
    return path, error.message


def validate(name: str, value: Any, *, where: str, definition: str | None = None) -> None:
    """Check ``value`` against the schema ``name`` (or its ``$defs`` entry ``definition``).

    Validators are built once per schema and definition (cached). Of several errors the most
    relevant one is reported (:func:`jsonschema.exceptions.best_match`: the shallowest, and
    inside ``anyOf`` the branch of the value's own type).

    Args:
        name: one of :data:`SCHEMA_NAMES`.
        value: the configuration value (dicts, lists or tuples, strings, numbers, bools).
        where: what to call the value in the message: a trait (``GPUSpawner.profiles``), a
            file (``policies.yaml:``) or "" (see :func:`format_field`).
        definition: validate against ``$defs/<definition>`` instead of the whole schema.

    Raises:
        ConfigSchemaError: the value does not match; the message names ``where``, the JSON
            path of the field and the reason, e.g.
            ``GPUSpawner.profiles[2].gpus: -1 is less than the minimum of 0``.
        KeyError: no such schema or definition.
    """
    error = best_match(_validator(name, definition).iter_errors(value))
    if error is not None:
        path, reason = _reason(error, _root(name))
        raise ConfigSchemaError(where, path, reason)


def check_schemas() -> None:
    """Check every shipped schema against its meta-schema (the tests and the docs build).

    Raises:
        jsonschema.exceptions.SchemaError: a schema is not valid draft 2020-12.
    """
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)


__all__ = ["DIALECT", "SCHEMA_NAMES", "ConfigSchemaError", "check_schemas", "format_field",
           "load_schema", "validate"]
