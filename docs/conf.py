"""Sphinx configuration of the gpuspawner documentation (``make docs``; MyST Markdown,
``autodoc-traits`` for every configurable trait, the REST API from the service's OpenAPI
document)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))

project = "gpuspawner"
author = "gpuspawner maintainers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "autodoc_traits"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
# reference/schemas/: field tables generated below, included by configuration-schemas.md
exclude_patterns = ["_build", "reference/schemas"]
myst_heading_anchors = 3
html_theme = "alabaster"
autodoc_member_order = "bysource"


def _rest_api_page() -> None:
    """docs/reference/rest-api.md from the service's OpenAPI document (one source)."""
    from gpuspawner.hub.service.openapi import openapi_document

    doc = openapi_document()
    lines = ["# REST API of the `gpuspawner` service", "",
             f"{doc['info'].get('description', '')}", "",
             "Generated from `gpuspawner.hub.service.openapi.openapi_document()` (served at "
             "`/services/gpuspawner/api/openapi.json`).", ""]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            if method not in ("get", "put", "post", "delete", "patch"):  # path "parameters"
                continue
            lines += [f"## `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            if op.get("description"):
                lines += [op["description"], ""]
            codes = ", ".join(f"{code} ({r.get('description', '')})"
                              for code, r in op.get("responses", {}).items())
            if codes:
                lines += [f"Responses: {codes}.", ""]
    lines += ["## The whole document", "", "```json", json.dumps(doc, indent=2), "```", ""]
    (DOCS / "reference" / "rest-api.md").write_text("\n".join(lines))


def _configuration_page() -> None:
    """docs/reference/configuration.md: every configurable trait our classes define, in the
    class or in our mixins (their inherited JupyterHub / ldapauthenticator traits are
    documented there)."""
    import importlib

    from gpuspawner.cli import CONFIG_CLASSES
    from gpuspawner.hub.config_check import IGNORED_SPAWNER_OPTIONS

    titles = {"GPUSpawner": "The spawner",
              "DockerBackend": "The Docker backend (`c.GPUSpawner.backend = \"docker\"`)",
              "SlurmBackend": "The Slurm backend (`c.GPUSpawner.backend = \"slurm\"`)",
              "GPULDAPAuthenticator": "LDAP login (entry point `gpu-ldap`)",
              "GPUJobs": "Notebook jobs (docs/jobs.md)",
              "GPUUsage": "Usage accounting (docs/usage.md)"}
    classes = [(titles[name], module, name) for module, name in CONFIG_CLASSES]
    classes.append(("The idle culler (`python -m idle_culler`; its own "
                    "`idle_culler_config.py` or command line)", "idle_culler.app", "IdleCuller"))
    ignored = ", ".join(f"`{name}` (profile field `{field}`)"
                        for name, field in IGNORED_SPAWNER_OPTIONS.items())
    lines = ["# Configuration reference", "",
             "Every option is a traitlets trait, set in `jupyterhub_config.py` as "
             "`c.<Class>.<trait>` (the culler's in its own configuration file or on its "
             "command line); the hub checks the spawner's and the backend's when it starts "
             "(`gpuspawner.hub.config_check.check_hub_config`). Generated from the classes: "
             "each lists the options it defines; the options GPUSpawner inherits from "
             "JupyterHub's `Spawner` (`start_timeout`, `http_timeout`, `environment`, ...) and "
             "the LDAP authenticator's from ldapauthenticator are documented by those projects.",
             "",
             "`gpuspawner generate-config` prints all of them, inherited ones included, as a "
             "commented configuration file (`gpuspawner generate-config --culler`: the "
             "culler's). `jupyterhub --generate-config` lists JupyterHub's own classes and "
             "the installed spawners and authenticators (GPUSpawner, GPULDAPAuthenticator), "
             "not the backends or GPUJobs.",
             "",
             f"GPUSpawner ignores JupyterHub's {ignored}: every server gets its profile's "
             "bundle. Setting one of them on `c.Spawner` or `c.GPUSpawner` stops the hub at "
             "start with the profile field that replaces it.", ""]
    for title, module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        lines += [f"## {title}: `{name}`", "", "```{eval-rst}"]
        ours = {n for n, t in cls.class_traits(config=True).items()
                if t.this_class.__module__.startswith(("gpuspawner", "idle_culler"))}
        for trait in sorted(ours):
            lines.append(f".. autotrait:: {module}.{name}.{trait}")
            lines.append("   :noindex:")
            lines.append("")
        lines += ["```", ""]
    (DOCS / "reference" / "configuration.md").write_text("\n".join(lines))


def _schema_kind(schema: dict, sub: dict) -> str:
    """A table cell: the type and limits of one property of a configuration schema."""
    if "$ref" in sub:
        target = schema["$defs"][sub["$ref"].rsplit("/", 1)[-1]]
        if "properties" in target:
            return target.get("title", "object")
        return target.get("title") or target.get("description", "")
    if "enum" in sub:
        return "one of " + ", ".join(f"`{v}`" for v in sub["enum"])
    if "anyOf" in sub:
        return " or ".join(_schema_kind(schema, s) for s in sub["anyOf"])
    types = sub.get("type", "any")
    text = " or ".join(types) if isinstance(types, list) else types
    limits = []
    if "minimum" in sub:
        limits.append(f">= {sub['minimum']}")
    if "maximum" in sub:
        limits.append(f"<= {sub['maximum']}")
    if "pattern" in sub:
        limits.append(sub.get("title") or f"matching `{sub['pattern']}`")
    return text + (f" ({', '.join(limits)})" if limits else "")


def _schema_def(schema: dict, sub: dict) -> dict | None:
    """The ``$defs`` entry with properties that ``sub`` refers to (directly or in an
    ``anyOf``), or None."""
    for s in [sub, *sub.get("anyOf", [])]:
        if "$ref" in s:
            target = schema["$defs"][s["$ref"].rsplit("/", 1)[-1]]
            if "properties" in target:
                return target
    return None


def _schema_rows(schema: dict, node: dict, path: str) -> list[str]:
    """Table rows (field, type, description) of one object schema's properties; a map (an
    object of named entries) adds a ``<name>`` row; an entry defined in ``$defs`` is shown by
    its title and has a table of its own (:func:`_schema_tables`)."""
    def row(field: str, sub: dict) -> str:
        target = _schema_def(schema, sub) or {}
        text = sub.get("description") or target.get("description", "")
        return f"| `{field}` | {_schema_kind(schema, sub)} | {text} |"

    if "items" in node:
        return [row(f"{path}[i]", node["items"])]
    rows = []
    for name, sub in node.get("properties", {}).items():
        field = f"{path}.{name}" if path else name
        rows.append(row(field, sub))
        if isinstance(sub.get("additionalProperties"), dict):
            rows.append(row(f"{field}.<name>", sub["additionalProperties"]))
        elif "properties" in sub:
            rows += _schema_rows(schema, sub, field)
    return rows


def _schema_tables() -> None:
    """docs/reference/schemas/<name>.md: tables of fields per shipped configuration schema
    (gpuspawner/schemas/), from the schemas' own descriptions: the value, then each entry
    defined in ``$defs`` (a profile, a node, a quota, a policy entry)."""
    from gpuspawner.schemas import SCHEMA_NAMES, check_schemas, load_schema

    check_schemas()
    out = DOCS / "reference" / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    head = ["| Field | Type | Description |", "| --- | --- | --- |"]
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        root = "" if name in ("culler-policies", "user-options") else name
        lines = [schema["description"], "", *head, *_schema_rows(schema, schema, root), ""]
        for definition in schema.get("$defs", {}).values():
            if "properties" in definition:
                lines += [f"Fields of a **{definition['title']}** "
                          f"({definition['description'].rstrip('.')}):", "", *head,
                          *_schema_rows(schema, definition, ""), ""]
        (out / f"{name}.md").write_text("\n".join(lines))


# the generated pages' folder is not in git (docs/.gitignore): a fresh checkout lacks it
(DOCS / "reference").mkdir(exist_ok=True)
_rest_api_page()
_configuration_page()
_schema_tables()
