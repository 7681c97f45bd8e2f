"""The notebook jobs' part of the service's OpenAPI document (merged into
:func:`gpuspawner.hub.service.openapi.openapi_document`; checked by schemathesis in
``tests/test_service_hub.py`` with the rest)."""

from __future__ import annotations

from typing import Any

from ...jobs.model import CONCURRENCY_POLICIES, STATES

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


#: the image, output formats and input folder of a job or definition (docs/jobs.md)
_OPTION_FIELDS: dict[str, Any] = {
    "image": {"type": "string", "nullable": True, "maxLength": 255,
              "description": "a key of the profile's profile_options.image choices (as the "
                             "spawn form's user_options); default: the profile's image"},
    "image--unlisted-choice": {"type": "string", "nullable": True, "maxLength": 255,
                               "description": "an image of your own, where the profile's "
                                              "unlisted_choice allows it (its "
                                              "validation_regex, the site's deny patterns "
                                              "and registries)"},
    "output_formats": {"type": "array", "items": {"type": "string", "enum": ["ipynb", "html"]},
                       "description": "what the job writes beside the executed notebook "
                                      "(always written); default both"},
    "input_folder": {"type": "string", "nullable": True, "maxLength": 1000,
                     "description": "a folder of your home (relative path, no '..') copied "
                                    "into the job's folder before it runs; links are not "
                                    "followed"},
}

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
        "max_retries": {"type": "integer", "minimum": 0,
                        "description": "runs again after it is lost (its node failed), "
                                       "Kubernetes backoffLimit style; default "
                                       "c.GPUJobs.default_max_retries, at most "
                                       "c.GPUJobs.max_retries_max"},
        **_OPTION_FIELDS,
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
        "definition_id": {"type": "string", "nullable": True,
                          "description": "the job definition whose tick made it, or null"},
        "attempt": {"type": "integer", "description": "the attempt it is on (1, then 2... "
                                                      "after each retry of a lost run)"},
        "max_retries": {"type": "integer"},
        "attempts": {"type": "array", "description": "the ended attempts, oldest first",
                     "items": {"type": "object", "properties": {
                         "attempt": {"type": "integer"}, "state": _STR, "message": _STR,
                         "node": _STR_OR_NULL, "gpu_uuids": {"type": "array", "items": _STR},
                         "started": _STR_OR_NULL, "finished": _STR_OR_NULL,
                         "exit_code": {"type": "integer", "nullable": True},
                         "output_dir": _STR_OR_NULL}}},
        "has_html": {"type": "boolean",
                     "description": "the HTML export can be downloaded (output?format=html)"},
        **_OPTION_FIELDS,
    },
}

_SCHEDULE_FIELDS: dict[str, Any] = {
    "schedule": {"type": "string", "maxLength": 200,
                 "description": "a cron expression: minute hour day-of-month month "
                                "day-of-week (e.g. '0 2 * * *'), or an alias such as "
                                "@daily; a sixth field, seconds, last, where the hub allows "
                                "it (c.GPUJobs.cron_seconds)"},
    "timezone": {"type": "string", "description": "IANA time zone the schedule is read in; "
                                                  "default UTC"},
    "concurrency_policy": {"type": "string", "enum": list(CONCURRENCY_POLICIES),
                           "description": "while a job of the definition is active, a tick "
                                          "starts another (Allow), is skipped (Forbid, the "
                                          "default) or cancels it and starts (Replace)"},
    "starting_deadline": {"type": "integer", "minimum": 0, "nullable": True,
                          "description": "seconds a tick may start late (the hub was down); "
                                         "a tick later than this is skipped; null: no "
                                         "deadline (the latest missed tick runs once)"},
    "paused": {"type": "boolean", "description": "no tick runs while paused; ticks that pass "
                                                 "while paused never run"},
}

JOB_DEFINITION_SUBMISSION: dict[str, Any] = {
    "type": "object",
    "required": ["notebook", "schedule"],
    "additionalProperties": False,
    "description": "A notebook on a schedule: each tick makes an ordinary job "
                   "(docs/jobs.md, 'On a schedule').",
    "properties": {**{k: v for k, v in JOB_SUBMISSION["properties"].items() if k != "at"},
                   **_SCHEDULE_FIELDS},
}

JOB_DEFINITION_UPDATE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "description": "What PATCH may change: pause or resume, a new schedule (counted from "
                   "now), time zone, policy, deadline, and what its next runs get: notebook "
                   "(a new snapshot), parameters, profile, time limit, name, image, output "
                   "formats, input folder (checked as at creation).",
    "properties": {**{k: v for k, v in JOB_SUBMISSION["properties"].items()
                      if k not in ("at", "max_retries")}, **_SCHEDULE_FIELDS},
}

JOB_DEFINITION: dict[str, Any] = {
    "type": "object",
    "required": ["id", "user", "name", "profile", "time_limit", "parameters", "schedule",
                 "timezone", "concurrency_policy", "paused", "created", "updated",
                 "last_tick", "message", "runs", "skipped", "active_jobs"],
    "properties": {
        "id": _STR, "user": _STR, "name": _STR, "profile": _STR,
        "time_limit": {"type": "integer"},
        "parameters": {"type": "object", "additionalProperties": _VALUE},
        **_SCHEDULE_FIELDS,
        "created": _STR, "updated": _STR,
        "last_tick": {"type": "string", "description": "the latest tick handled (run, "
                                                       "skipped or refused), ISO 8601 UTC"},
        "next_tick": {"type": "string", "nullable": True,
                      "description": "the next tick (ISO 8601 UTC); null while paused"},
        "message": {"type": "string", "description": "what the latest tick did"},
        "last_job_id": _STR_OR_NULL,
        "runs": {"type": "integer", "description": "jobs it made"},
        "skipped": {"type": "integer", "description": "ticks it skipped or that were "
                                                      "refused"},
        "active_jobs": {"type": "array", "items": _STR,
                        "description": "its jobs that are queued, waiting, starting or "
                                       "running"},
        **_OPTION_FIELDS,
    },
}

SCHEMAS = {"JobSubmission": JOB_SUBMISSION, "Job": JOB,
           "JobDefinitionSubmission": JOB_DEFINITION_SUBMISSION,
           "JobDefinitionUpdate": JOB_DEFINITION_UPDATE, "JobDefinition": JOB_DEFINITION}
_DEF = {"$ref": "#/components/schemas/JobDefinition"}

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
                                "description": "one user's jobs (yourself, or admins)"},
                               {"name": "definition_id", "in": "query", "required": False,
                                "schema": _STR,
                                "description": "the jobs one job definition made"}],
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
                    **_DENIED, **_TOO_LARGE,
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
                    "parameters": [{"name": "format", "in": "query", "required": False,
                                    "schema": {"type": "string", "enum": ["ipynb", "html"]},
                                    "description": "html: its HTML export (an attachment, "
                                                   "CSP sandbox)"}],
                    "responses": {
                        "200": {"description": "the notebook, or its HTML export", "content": {
                            "application/x-ipynb+json": {"schema": {"type": "object"}},
                            "text/html": {"schema": _STR}}},
                        **_DENIED,
                        "400": _resp("format: not ipynb or html", _ERR),
                        "404": _resp("no such job, or no executed notebook (yet)", _ERR),
                        "503": _OFF["503"]}},
        },
        "/api/jobs/{id}/log": {
            "parameters": _ID,
            "get": {"operationId": "getJobLog",
                    "summary": "The job's log: papermill's lines and the cells' output, every "
                               "attempt's (the running one read from its container)",
                    "responses": {
                        "200": _resp("the log", _STR, "text/plain"),
                        **_DENIED,
                        "404": _resp("no such job, or it has not started", _ERR),
                        "503": _OFF["503"]}},
        },
        **definition_paths(),
    }


_DEF_GONE = {"404": _resp("no such job definition of yours (or jobs are off)", _ERR),
             "503": _OFF["503"]}
_BAD = {"400": _resp("a bad field, named first in the message; nothing stored", _ERR),
        "413": _resp("the body is larger than a submission may be (four times the "
                     "notebook's and the parameters' limits, plus 64 KiB); not read", _ERR)}
_TOO_LARGE = {"413": _BAD["413"]}


def definition_paths() -> dict[str, Any]:
    """The ``api/job_definitions`` paths."""
    return {
        "/api/job_definitions": {
            "get": {
                "operationId": "listJobDefinitions",
                "summary": "Your job definitions, newest first (admins: everyone's)",
                "parameters": [{"name": "user", "in": "query", "required": False,
                                "schema": _STR,
                                "description": "one user's (yourself, or admins)"}],
                "responses": {"200": _resp("the definitions", {
                    "type": "object", "required": ["job_definitions"],
                    "properties": {"job_definitions": {"type": "array", "items": _DEF}}}),
                    **_DENIED, **_OFF},
            },
            "post": {
                "operationId": "createJobDefinition",
                "summary": "Run a notebook on a cron schedule, each tick in its own bundle",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/JobDefinitionSubmission"}}}},
                "responses": {
                    "201": _resp("the definition", _DEF), **_BAD, **_DENIED,
                    "429": _resp("as many definitions as allowed", _ERR), **_OFF},
            },
        },
        "/api/job_definitions/{id}": {
            "parameters": _ID,
            "get": {"operationId": "getJobDefinition", "summary": "One job definition",
                    "responses": {"200": _resp("the definition", _DEF), **_DENIED,
                                  **_DEF_GONE}},
            "patch": {"operationId": "updateJobDefinition",
                      "summary": "Pause or resume it, or change its schedule",
                      "requestBody": {"required": True, "content": {"application/json": {
                          "schema": {"$ref": "#/components/schemas/JobDefinitionUpdate"}}}},
                      "responses": {"200": _resp("the definition", _DEF), **_BAD,
                                    **_DENIED, **_DEF_GONE}},
            "delete": {"operationId": "deleteJobDefinition",
                       "summary": "Delete it; its jobs stay and run to their end",
                       "responses": {"200": _resp("the definition, as it was", _DEF),
                                     **_DENIED, **_DEF_GONE}},
        },
        "/api/job_definitions/{id}/jobs": {
            "parameters": _ID,
            "post": {"operationId": "runJobDefinition",
                     "summary": "A job of the definition now (its owner only), with "
                                "parameters over its own",
                     "requestBody": {"required": False, "content": {"application/json": {
                         "schema": {"type": "object", "additionalProperties": False,
                                    "properties": {"parameters": {
                                        "type": "object", "additionalProperties": _VALUE}}}}}},
                     "responses": {"201": _resp("the job, queued", _JOB), **_BAD, **_DENIED,
                                   "429": _resp("too many active jobs", _ERR),
                                   **_DEF_GONE}},
        },
    }
