"""The notebook jobs' part of the service's OpenAPI document (merged into
:func:`gpuspawner.hub.service.openapi.openapi_document`; checked by schemathesis in
``tests/test_service_hub.py`` with the rest)."""

from __future__ import annotations

from typing import Any

from ...jobs.model import STATES

_STR = {"type": "string"}
_STR_OR_NULL = {"type": "string", "nullable": True}
_ERR = {"$ref": "#/components/schemas/Error"}
_JOB = {"$ref": "#/components/schemas/Job"}
_SCALAR = {"nullable": True, "oneOf": [{"type": "string"}, {"type": "number"},
                                        {"type": "boolean"}]}
_VALUE = {"nullable": True, "oneOf": [{"type": "string"}, {"type": "number"},
                                       {"type": "boolean"},
                                       {"type": "array", "items": {}}]}


def _resp(description: str, schema: dict[str, Any], media: str = "application/json"
          ) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


JOB_SUBMISSION: dict[str, Any] = {
    "type": "object",
    "required": ["notebook"],
    "additionalProperties": False,
    "description": "A notebook to run once. Only notebook is required (docs/jobs.md).",
    "properties": {
        "notebook": {"type": "object", "description": "the notebook's content (nbformat 4)"},
        "parameters": {"type": "object", "additionalProperties": _VALUE,
                       "description": "for the cell tagged 'parameters': Python identifiers "
                                      "-> JSON scalars or lists"},
        "profile": {"type": "string", "description": "a profile's slug; default: the "
                                                     "default profile"},
        "time_limit": {"type": "integer", "minimum": 1,
                       "description": "seconds; default and maximum per profile"},
        "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                 "description": "one folder name: ~/jobs/<name>/<UTC start>-<id>/"},
        "at": {"type": "string", "description": "start it then, not now: ISO 8601 with a time "
                                                "zone, in the future, at most 366 days ahead"},
    },
}

JOB: dict[str, Any] = {
    "type": "object",
    "required": ["id", "user", "name", "profile", "state", "message", "time_limit",
                 "parameters", "created", "history", "gpu_uuids", "has_output"],
    "properties": {
        "id": _STR, "user": _STR, "name": _STR, "profile": _STR,
        "state": {"type": "string", "enum": list(STATES)},
        "message": {"type": "string", "description": "what happened last (why it failed, "
                                                     "its place in the queue, ...)"},
        "time_limit": {"type": "integer"},
        "parameters": {"type": "object", "additionalProperties": _VALUE},
        "created": {"type": "string", "description": "ISO 8601, UTC"},
        "at": {"type": "string", "nullable": True,
               "description": "its one-off start time (ISO 8601, UTC), or null: now"},
        "started": _STR_OR_NULL, "finished": _STR_OR_NULL,
        "history": {"type": "array", "items": {
            "type": "object", "required": ["state", "time"],
            "properties": {"state": _STR, "time": _STR}}},
        "node": _STR_OR_NULL,
        "gpu_uuids": {"type": "array", "items": _STR},
        "exit_code": {"type": "integer", "nullable": True},
        "error": {"type": "object", "nullable": True,
                  "description": "a failing cell: ename, evalue, cell (its execution count)"},
        "output_dir": {"type": "string", "nullable": True,
                       "description": "where the job writes, e.g. "
                                      "~/jobs/train/20260301T221500Z-<id>"},
        "has_output": {"type": "boolean",
                       "description": "the executed notebook can be downloaded"},
        "queue_position": {"type": "array", "nullable": True, "items": {"type": "integer"},
                           "description": "[position, length] while it waits"},
    },
}

SCHEMAS = {"JobSubmission": JOB_SUBMISSION, "Job": JOB}

_OFF = {"404": _resp("notebook jobs are off on this hub", _ERR),
        "503": _resp("notebook jobs are not ready, or cannot run on this backend", _ERR)}
_DENIED = {"401": _resp("no token or cookie identifies a hub user", _ERR),
           "403": _resp("authenticated, but not allowed", _ERR)}
_ID = [{"name": "id", "in": "path", "required": True,
        "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}]
_GONE = {"404": _resp("no such job of yours (or jobs are off)", _ERR),
         "503": _OFF["503"]}


def paths() -> dict[str, Any]:
    """The ``api/jobs`` paths."""
    return {
        "/api/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "Your notebook jobs, newest first (admins: everyone's)",
                "parameters": [{"name": "user", "in": "query", "required": False,
                                "schema": _STR,
                                "description": "one user's jobs (yourself, or admins)"}],
                "responses": {"200": _resp("the jobs", {
                    "type": "object", "required": ["jobs"],
                    "properties": {"jobs": {"type": "array", "items": _JOB}}}),
                    **_DENIED, **_OFF},
            },
            "post": {
                "operationId": "submitJob",
                "summary": "Run a notebook once in its own bundle",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/JobSubmission"}}}},
                "responses": {
                    "201": _resp("the job, queued", _JOB),
                    "400": _resp("a bad field, named first in the message; nothing stored",
                                 _ERR),
                    **_DENIED,
                    "429": _resp("too many active jobs", _ERR),
                    **_OFF},
            },
        },
        "/api/jobs/{id}": {
            "parameters": _ID,
            "get": {"operationId": "getJob", "summary": "One job, with its state",
                    "responses": {"200": _resp("the job", _JOB), **_DENIED, **_GONE}},
            "delete": {"operationId": "cancelJob",
                       "summary": "Cancel a job: it leaves the queue, or is stopped; its "
                                  "bundle is released",
                       "responses": {"200": _resp("the job, cancelled", _JOB),
                                     **_DENIED, **_GONE,
                                     "409": _resp("the job has ended", _ERR)}},
        },
        "/api/jobs/{id}/output": {
            "parameters": _ID,
            "get": {"operationId": "getJobOutput",
                    "summary": "The executed notebook of a job that ended by itself",
                    "responses": {
                        "200": _resp("the notebook", {"type": "object"},
                                     "application/x-ipynb+json"),
                        **_DENIED,
                        "404": _resp("no such job, or no executed notebook (yet)", _ERR),
                        "503": _OFF["503"]}},
        },
    }
