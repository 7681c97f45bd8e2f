"""The OpenAPI 3.0 document of the service's REST API, served at ``api/openapi.json``.

Kept next to the handlers (``app.py``) and checked against them by schemathesis in
``tests/test_service_hub.py`` (every documented response, no server errors).
"""

from __future__ import annotations

from typing import Any

from ...usage import openapi as usage_openapi
from ..jobs import openapi as jobs_openapi

_INT = {"type": "integer"}
_INT_OR_NULL = {"type": "integer", "nullable": True}
_STR = {"type": "string"}

USAGE = {
    "type": "object",
    "description": "Resources held. gpu_milli: 1000 = one GPU; memory/disk in bytes.",
    "required": ["gpu_milli", "cores", "memory_bytes", "disk_bytes", "servers"],
    "properties": {k: _INT for k in ("gpu_milli", "cores", "memory_bytes", "disk_bytes",
                                     "servers")},
}
LIMITS = {
    "type": "object",
    "nullable": True,
    "description": "Upper limits by resource (units as in Usage); null = unlimited.",
    "properties": {k: _INT_OR_NULL for k in ("gpu_milli", "cores", "memory_bytes",
                                             "disk_bytes", "servers")},
}
HOLDER = {
    "type": "object",
    "required": ["user", "milli"],
    "properties": {
        "allocation": {"type": "string", "nullable": True,
                       "description": "null when held by another user (non-admin view)"},
        "user": _STR,
        "server": {"type": "string", "nullable": True},
        "milli": _INT,
        "mine": {"type": "boolean"},
    },
}
GPU = {
    "type": "object",
    "required": ["uuid", "model", "milli_used", "holders"],
    "properties": {
        "uuid": _STR, "index": _INT, "model": _STR, "memory_bytes": _INT,
        "pci_bus_id": _STR, "numa_node": _INT_OR_NULL, "shareable": {"type": "boolean"},
        "milli_used": {"type": "integer", "minimum": 0, "maximum": 1000},
        "holders": {"type": "array", "items": {"$ref": "#/components/schemas/Holder"}},
        "drained": {"type": "string", "nullable": True,
                    "description": "why the GPU takes no new servers (an admin's reason or "
                                   "the health check's, e.g. 'xid 79 (GPU fell off the "
                                   "bus)'); null when it is not drained. Shown to everyone."},
        "drained_by": {"type": "string", "nullable": True,
                       "description": "admins only: the admin who drained it, or 'health'"},
        "drained_since": {"type": "number", "nullable": True,
                          "description": "admins only: seconds since the epoch"},
    },
}
GPU_DRAIN = {
    "type": "object",
    "required": ["uuid", "node", "drained"],
    "properties": {
        "uuid": _STR,
        "node": _STR,
        "drained": {"type": "string", "nullable": True,
                    "description": "the reason; null after an undrain"},
        "drained_by": {"type": "string", "nullable": True},
        "drained_since": {"type": "number", "nullable": True},
    },
}
DRAIN_REQUEST = {
    "type": "object",
    "required": ["reason"],
    "properties": {"reason": {"type": "string", "minLength": 1, "pattern": "\\S",
                              "description": "why (shown on the map and in api/nodes)"}},
}
NUMA = {
    "type": "object",
    "required": ["id", "cpus", "cpus_free", "memory_bytes", "memory_free_bytes"],
    "properties": {
        "id": _INT,
        "cpus": {"type": "array", "items": _INT},
        "cpus_free": {"type": "array", "items": _INT},
        "cpu_owners": {"type": "object", "additionalProperties": _STR,
                       "description": "CPU id -> user holding it"},
        "memory_bytes": _INT,
        "memory_free_bytes": _INT,
    },
}
NODE = {
    "type": "object",
    "required": ["name", "numa_nodes", "gpus", "summary"],
    "properties": {
        "name": _STR,
        "state": {"type": "string", "enum": ["up", "drain", "down", "off"],
                  "description": "down or drain: the node takes no new servers; off: an "
                                 "elastic node not running, started when a request needs it"},
        "state_reason": _STR,
        "gpu_share": {"type": ["object", "null"],
                      "description": "what holds GPU shares on the node (docs/gpu-sharing.md)",
                      "properties": {"mechanism": {"type": "string",
                                                   "enum": ["dmem", "mps", "watchdog"]},
                                     "reason": _STR}},
        "labels": {"type": "object", "additionalProperties": _STR},
        "disk_bytes": _INT,
        "disk_free_bytes": _INT,
        "numa_nodes": {"type": "array", "items": {"$ref": "#/components/schemas/NumaNode"}},
        "gpus": {"type": "array", "items": {"$ref": "#/components/schemas/GPU"}},
        "summary": {
            "type": "object",
            "required": ["gpus_total", "gpus_free", "gpu_milli_used", "cores_total",
                         "cores_free", "memory_bytes", "memory_free_bytes"],
            "properties": {k: _INT for k in ("gpus_total", "gpus_free", "gpu_milli_used",
                                             "cores_total", "cores_free", "memory_bytes",
                                             "memory_free_bytes")},
        },
    },
}
ALLOCATION = {
    "type": "object",
    "required": ["id", "owner", "node", "gpus", "cpuset", "memory_bytes", "gpu_milli"],
    "properties": {
        "id": _STR,
        "owner": {"type": "object", "required": ["user", "server", "groups"], "properties": {
            "user": _STR, "server": _STR, "groups": {"type": "array", "items": _STR}}},
        "node": _STR,
        "gpus": {"type": "array", "items": {"type": "object", "required": ["uuid", "milli"],
                                            "properties": {"uuid": _STR, "milli": _INT}}},
        "cpuset": {"type": "array", "items": _INT},
        "mig": {"type": "array", "description": "MIG instances held (only when any; each "
                "counts slices / 7 * 1000 in gpu_milli)",
                "items": {"type": "object", "required": ["uuid", "gpu", "profile", "slices"],
                          "properties": {"uuid": _STR, "gpu": _STR, "profile": _STR,
                                         "slices": _INT}}},
        "mems": {"type": "array", "items": _INT},
        "memory_bytes": _INT,
        "memory_by_numa": {"type": "object", "additionalProperties": _INT},
        "disk_bytes": _INT,
        "created": {"type": "number", "description": "seconds since the epoch"},
        "numa_aligned": {"type": "boolean"},
        "note": _STR,
        "gpu_milli": _INT,
        "cpuset_text": _STR,
        "summary": _STR,
    },
}
USER_USAGE = {
    "type": "object",
    "required": ["user", "groups", "usage", "quota", "remaining", "group_quotas"],
    "properties": {
        "user": _STR,
        "groups": {"type": "array", "items": _STR},
        "usage": {"$ref": "#/components/schemas/Usage"},
        "quota": {"$ref": "#/components/schemas/Limits"},
        "remaining": {"$ref": "#/components/schemas/Limits"},
        "group_quotas": {"type": "array", "items": {
            "type": "object", "required": ["group", "usage", "quota"],
            "properties": {"group": _STR, "usage": {"$ref": "#/components/schemas/Usage"},
                           "quota": {"$ref": "#/components/schemas/Limits"}}}},
        "allocations": {"type": "array", "items": _STR},
        "gpu_share_notices": {
            "type": "array",
            "description": "The user's GPU shares over their memory at the watchdog's last "
                           "pass (docs/gpu-sharing.md); the JupyterLab GPU panel shows "
                           "each message.",
            "items": {
                "type": "object",
                "required": ["server", "uuid", "used_bytes", "limit_bytes", "interrupt_at",
                             "interrupted", "message"],
                "properties": {
                    "server": _STR, "uuid": _STR, "used_bytes": _INT, "limit_bytes": _INT,
                    "interrupt_at": {"type": "number", "description": "epoch seconds"},
                    "interrupted": {"type": "array", "items": _INT},
                    "message": _STR}}},
    },
}
SCHEMA_INFO = {
    "type": "object",
    "description": "One of the configuration's JSON Schemas (gpuspawner.schemas).",
    "required": ["name", "title", "description", "id", "url"],
    "properties": {
        "name": {"type": "string", "description": "its name in api/schemas/{name}"},
        "title": {"type": "string", "description": "what it describes, e.g. "
                                                   "GPUSpawner.profiles"},
        "description": _STR,
        "id": {"type": "string", "description": "the schema's $id"},
        "url": {"type": "string", "description": "where the schema itself is served"},
    },
}
ERROR = {
    "type": "object",
    "required": ["status", "message"],
    "properties": {"status": _INT, "message": _STR},
}


def _resp(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema}}}


_ERR = {"$ref": "#/components/schemas/Error"}
_DRAIN = {"$ref": "#/components/schemas/GPUDrain"}
_DENIED = {
    "401": _resp("no token or cookie identifies a hub user", _ERR),
    "403": _resp("authenticated, but not allowed", _ERR),
}


QUEUE_ENTRY: dict[str, Any] = {
    "type": "object",
    "required": ["id", "user", "server", "profile", "position", "enqueued", "waited_s",
                 "wants"],
    "properties": {
        "id": _STR, "user": _STR, "server": _STR, "profile": _STR,
        "position": {"type": "integer", "minimum": 1, "description": "1-based, fair order"},
        "enqueued": {"type": "string", "description": "ISO 8601, UTC"},
        "waited_s": {"type": "number", "description": "seconds waited so far"},
        "wants": {"type": "string", "description": "e.g. 1 x A100"},
        "gpus": {"type": "integer"}, "gpu_milli": {"type": "integer"},
        "gpu_models": {"type": "array", "items": _STR},
        "cores": {"type": "integer"}, "memory_bytes": {"type": "integer"},
        "nodes": {"type": "array", "items": _STR,
                  "description": "the nodes it may use (its profile's); empty = any"},
        "bypassed": {"type": "integer",
                     "description": "later spawns that started ahead of it while it was first"},
        "restored": {"type": "boolean",
                     "description": "kept across a hub restart, waiting for its re-spawn"},
        "note": {"type": "string",
                 "description": "e.g. a node is being started for this, about 2 min"},
        "fairshare_factor": {
            "type": "number", "minimum": 0, "maximum": 1,
            "description": "the owner's fair-share factor over decayed past GPU usage "
                           "(Slurm's 2^(-U/S)); 1 = none, or fair share over time off"},
    },
}

QUEUE: dict[str, Any] = {
    "type": "object",
    "required": ["length", "by_profile", "waiting_gpus", "entries"],
    "properties": {
        "length": {"type": "integer", "description": "entries in all"},
        "by_profile": {"type": "object", "additionalProperties": {"type": "integer"}},
        "waiting_gpus": {"type": "object", "additionalProperties": {"type": "integer"},
                         "description": "GPU model (GPU = any) -> entries that want it"},
        "entries": {"type": "array", "items": {"$ref": "#/components/schemas/QueueEntry"}},
    },
}

#: one entry of ``api/profiles`` (gpuspawner.hub.service.profiles_api.profile_view)
PROFILE: dict[str, Any] = {
    "type": "object",
    "required": ["slug", "display_name", "description", "default", "summary", "cores",
                 "memory", "gpus", "gpu_milli", "mig", "mig_count", "gpu_models",
                 "time_limit"],
    "properties": {
        "slug": _STR, "display_name": _STR, "description": _STR, "default": {"type": "boolean"},
        "summary": {"type": "string", "description": "the bundle, e.g. 1 x A100, 8 cores, "
                                                     "32.0 GiB"},
        "cores": _INT, "memory": {"type": "integer", "description": "bytes"}, "gpus": _INT,
        "gpu_milli": _INT, "mig": {"type": "string", "nullable": True}, "mig_count": _INT,
        "gpu_models": {"type": "array", "items": _STR},
        "time_limit": {"type": "object", "nullable": True,
                       "description": "notebook jobs' default and maximum seconds (null "
                                      "while jobs are not running on this hub)",
                       "properties": {"default": _INT, "max": _INT}},
    },
}


def openapi_document(prefix: str = "/services/gpuspawner/") -> dict[str, Any]:
    """The OpenAPI 3.0.3 document; ``servers`` is the service's URL prefix on the hub. The
    notebook jobs' paths and schemas come from :mod:`gpuspawner.hub.jobs.openapi`, the usage
    reports' from :mod:`gpuspawner.usage.openapi`."""
    doc = _document(prefix)
    doc["components"]["schemas"].update(jobs_openapi.SCHEMAS)
    doc["paths"].update(jobs_openapi.paths())
    doc["components"]["schemas"].update(usage_openapi.SCHEMAS)  # api/usage (docs/usage.md)
    doc["paths"].update(usage_openapi.paths())
    return doc


def _document(prefix: str) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "gpuspawner hub service",
            "version": "1",
            "description": "GPU placement state of this JupyterHub, read from the hub "
                           "process's ledger. Authenticate with a JupyterHub API token "
                           "(`Authorization: token ...`) or the hub's OAuth cookie. Admins "
                           "(or holders of the custom:gpuspawner:admin scope) see everyone; "
                           "users see their own allocations and usage.",
        },
        "servers": [{"url": prefix.rstrip("/")}],
        "components": {
            "securitySchemes": {"token": {"type": "apiKey", "in": "header",
                                          "name": "Authorization",
                                          "description": "token <JupyterHub API token>"}},
            "schemas": {"Usage": USAGE, "Limits": LIMITS, "Holder": HOLDER, "GPU": GPU,
                        "NumaNode": NUMA, "Node": NODE, "Allocation": ALLOCATION,
                        "UserUsage": USER_USAGE, "SchemaInfo": SCHEMA_INFO,
                        "GPUDrain": GPU_DRAIN, "DrainRequest": DRAIN_REQUEST,
                        "Queue": QUEUE, "QueueEntry": QUEUE_ENTRY,
                        "Profile": PROFILE,
                        "Error": ERROR},
        },
        "security": [{"token": []}],
        "paths": {
            "/api/nodes": {"get": {
                "operationId": "listNodes",
                "summary": "Nodes with free/used GPUs, NUMA nodes and cores",
                "responses": {"200": _resp("the nodes", {
                    "type": "array", "items": {"$ref": "#/components/schemas/Node"}}),
                    **_DENIED},
            }},
            "/api/allocations": {"get": {
                "operationId": "listAllocations",
                "summary": "Allocations: all for admins, the caller's own for users",
                "parameters": [{"name": "user", "in": "query", "required": False,
                                "schema": _STR,
                                "description": "only this user's (others: admins only)"}],
                "responses": {"200": _resp("allocations, oldest first", {
                    "type": "array", "items": {"$ref": "#/components/schemas/Allocation"}}),
                    **_DENIED},
            }},
            "/api/gpus/{uuid}/drain": {
                "parameters": [{"name": "uuid", "in": "path", "required": True,
                                "schema": _STR, "description": "the GPU's UUID (api/nodes)"}],
                "post": {
                    "operationId": "drainGPU",
                    "summary": "Take a GPU out of placement (admins)",
                    "description": "No new server gets any of the GPU; servers already on it "
                                   "keep running. Kept across hub restarts. Draining a "
                                   "drained GPU replaces the reason.",
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/DrainRequest"}}}},
                    "responses": {
                        "200": _resp("the GPU, drained", _DRAIN),
                        "400": _resp("the body is not {\"reason\": \"...\"} (not JSON, "
                                     "nested too deeply, no string reason)", _ERR),
                        **_DENIED,
                        "404": _resp("no node has that GPU", _ERR),
                        "413": _resp("a body over 64 KiB", _ERR)},
                },
                "delete": {
                    "operationId": "undrainGPU",
                    "summary": "Give a drained GPU back to placement (admins)",
                    "responses": {
                        "200": _resp("the GPU, not drained", _DRAIN),
                        **_DENIED,
                        "404": _resp("no node has that GPU", _ERR)},
                },
            },
            "/api/queue": {"get": {
                "operationId": "getQueue",
                "summary": "The wait queue in its fair order: counts for everyone, entries "
                           "for admins (and read:servers tokens), else the caller's own",
                "responses": {"200": _resp("the queue", {
                    "$ref": "#/components/schemas/Queue"}), **_DENIED},
            }},
            "/api/profiles": {"get": {
                "operationId": "listProfiles",
                "summary": "The profiles the caller's groups may use (for servers and "
                           "notebook jobs)",
                "responses": {"200": _resp("the profiles, in configuration order", {
                    "type": "object", "required": ["profiles"],
                    "properties": {"profiles": {"type": "array", "items": {
                        "$ref": "#/components/schemas/Profile"}}}}), **_DENIED},
            }},
            "/api/users/{name}/usage": {"get": {
                "operationId": "getUserUsage",
                "summary": "What a user holds, their quota and their groups' quotas",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": _STR}],
                "responses": {"200": _resp("usage and quota", {
                    "$ref": "#/components/schemas/UserUsage"}), **_DENIED},
            }},
            "/api/schemas": {"get": {
                "operationId": "listConfigSchemas",
                "summary": "The configuration's JSON Schemas: profiles, nodes, quotas, culler "
                           "policies",
                "description": "The schemas the hub checks its configuration with at start "
                               "(draft 2020-12), shipped in gpuspawner.schemas. Public.",
                "security": [],
                "responses": {"200": _resp("the schemas, by name", {
                    "type": "array", "items": {"$ref": "#/components/schemas/SchemaInfo"}})},
            }},
            "/api/schemas/{name}": {"get": {
                "operationId": "getConfigSchema",
                "summary": "One configuration JSON Schema (draft 2020-12)",
                "security": [],
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string"},
                                "description": "profiles, nodes, quotas, culler-policies "
                                               "or user-options"}],
                "responses": {
                    "200": _resp("the JSON Schema", {
                        "type": "object", "required": ["$schema", "$id", "title"],
                        "description": "a JSON Schema, draft 2020-12"}),
                    "404": _resp("no schema of that name", _ERR),
                },
            }},
            "/api/openapi.json": {"get": {
                "operationId": "getOpenAPI",
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "OpenAPI 3.0 document",
                                      "content": {"application/json": {
                                          "schema": {"type": "object"}}}}},
            }},
        },
    }
