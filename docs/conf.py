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
exclude_patterns = ["_build"]
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
    """docs/reference/configuration.md: every configurable trait our classes define (their
    inherited JupyterHub / DockerSpawner / ldapauthenticator traits are documented there)."""
    import importlib

    classes = [("The spawner", "gpuspawner.hub.spawner", "GPUSpawner"),
               ("LDAP login (entry point `gpu-ldap`)", "gpuspawner.hub.auth",
                "GPULDAPAuthenticator"),
               ("The idle culler (`python -m idle_culler`)", "idle_culler.app", "IdleCuller")]
    lines = ["# Configuration reference", "",
             "Every option is a traitlets trait, set in `jupyterhub_config.py` as "
             "`c.<Class>.<trait>`; the hub checks the spawner's when it starts "
             "(`gpuspawner.hub.config_check.check_hub_config`). Generated from the classes.", ""]
    for title, module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        lines += [f"## {title}: `{name}`", "", "```{eval-rst}"]
        for trait in sorted(cls.class_own_traits(config=True)):
            lines.append(f".. autotrait:: {module}.{name}.{trait}")
            lines.append("   :noindex:")
            lines.append("")
        lines += ["```", ""]
    (DOCS / "reference" / "configuration.md").write_text("\n".join(lines))


_rest_api_page()
_configuration_page()
