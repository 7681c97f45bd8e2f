"""What a notebook job is, independent of the hub: its states, the rules of a submission
(each refusal names its field, so the REST service answers HTTP 400 with it), how the input
notebook travels to the job's container and how the executed notebook comes back.

A job runs one notebook once. The submission carries the notebook's content (snapshotted: its
outputs are dropped, later edits of the file do not change the job), ``parameters`` (injected
by papermill after the cell tagged ``parameters``), a ``profile`` (the same profiles as
servers), a ``time_limit`` in seconds and a ``name`` (one path component: the job's outputs go
to ``~/jobs/<name>/<UTC start time>-<id>/``) and optionally ``at``, a one-off start time
(ISO 8601 with a time zone).

The notebook goes to the container in environment variables (zlib, then base64, in chunks of
at most :data:`ENV_CHUNK` characters: one variable may hold at most 128 KiB on Linux); the
executed notebook comes back on the container's standard output between
:data:`OUTPUT_BEGIN` and :data:`OUTPUT_END` (:func:`parse_output`), written by the job as the
user: the hub never reads or writes a user's home.
"""

from __future__ import annotations

import base64
import json
import keyword
import math
import re
import time
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ACTIVE_STATES", "ENV_CHUNK", "FINAL_STATES", "JobInputError", "JobRequest",
           "Limits", "OUTPUT_BEGIN", "OUTPUT_END", "STATES", "check_at", "check_name",
           "check_notebook",
           "check_parameters", "check_time_limit", "encode_notebook", "notebook_env",
           "output_dir", "parse_output", "parse_submission"]

#: every state, in the order a job passes them
STATES = ("queued", "waiting", "starting", "running", "completed", "failed", "timed_out",
          "cancelled", "lost")
#: states of a job that holds, or waits for, a place in the cluster
ACTIVE_STATES = frozenset({"queued", "waiting", "starting", "running"})
#: states a job never leaves
FINAL_STATES = frozenset({"completed", "failed", "timed_out", "cancelled", "lost"})

#: the keys a submission may have
SUBMISSION_KEYS = ("notebook", "parameters", "profile", "time_limit", "name", "at")
#: how far ahead a job may be scheduled (seconds)
MAX_AHEAD_S = 366 * 24 * 3600
#: a job's name: one path component of letters, digits, ".", "_" and "-"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: the name of a job submitted without one
DEFAULT_NAME = "notebook"
#: characters of one environment variable of the notebook (Linux: 128 KiB per string)
ENV_CHUNK = 96 * 1024
#: the environment variables of the notebook: ``<prefix><i>`` and the count
NOTEBOOK_ENV_PREFIX = "GPUSPAWNER_JOB_NOTEBOOK_"
NOTEBOOK_ENV_COUNT = "GPUSPAWNER_JOB_NOTEBOOK_CHUNKS"
#: the frame of the job's result on its standard output
OUTPUT_BEGIN = "----- gpuspawner job result begin -----"
OUTPUT_END = "----- gpuspawner job result end -----"
#: nested lists in a parameter value, at most
MAX_LIST_DEPTH = 8


class JobInputError(ValueError):
    """A submission that is refused; ``field`` names what is wrong (``notebook``,
    ``parameters.lr``, ``time_limit``...), the message says why, starting with the field."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Sizes a submission may have (``c.GPUJobs.*``).

    Attributes:
        max_notebook_bytes: the notebook's JSON as submitted, in bytes.
        max_parameters_bytes: the parameters' JSON, in bytes.
        max_env_bytes: the notebook as it travels (compressed, base64), in bytes.
    """

    max_notebook_bytes: int = 2 * 2**20
    max_parameters_bytes: int = 16 * 2**10
    max_env_bytes: int = 1 * 2**20


@dataclass(frozen=True)
class JobRequest:
    """A submission that passed :func:`parse_submission` (the profile and the time limit are
    checked against the hub's profiles by the hub).

    Attributes:
        notebook: the snapshot (nbformat 4, outputs dropped), as a JSON-able dict.
        parameters: name -> JSON scalar or list.
        profile: the profile's slug, or None for the default profile.
        time_limit: seconds, or None for the profile's default.
        name: the job's name (one path component).
        at: when to start it (seconds since the epoch), or None for now.
    """

    notebook: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None
    time_limit: int | None = None
    name: str = DEFAULT_NAME
    at: float | None = None


def check_name(value: Any) -> str:
    """A job's name: letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit,
    at most 100 characters; no ``/``, no ``..``.

    Raises:
        JobInputError: field ``name``.
    """
    if not isinstance(value, str):
        raise JobInputError("name", f"must be a string, got {type(value).__name__}")
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise JobInputError("name", f"{value[:120]!r} is not one folder name: use letters, "
                                    "digits, '.', '_' and '-' only (no '/', no '..'), starting "
                                    "with a letter or digit, at most 100 characters")
    return value


def _check_value(value: Any, where: str, depth: int = 0) -> None:
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JobInputError(where, f"must be a finite number, got {value}")
        return
    if isinstance(value, list):
        if depth >= MAX_LIST_DEPTH:
            raise JobInputError(where, f"lists nested deeper than {MAX_LIST_DEPTH}")
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]", depth + 1)
        return
    kind = "an object" if isinstance(value, dict) else type(value).__name__
    raise JobInputError(where, f"must be a JSON scalar (string, number, boolean, null) or a "
                               f"list of them, got {kind}")


def check_parameters(value: Any, max_bytes: int) -> dict[str, Any]:
    """The parameters: a JSON object whose names are Python identifiers (papermill assigns
    them in the notebook) and whose values are JSON scalars or lists; at most ``max_bytes``
    bytes as JSON. None = none.

    Raises:
        JobInputError: field ``parameters`` or ``parameters.<name>``.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JobInputError("parameters", "must be a JSON object of name: value, got "
                                          f"{type(value).__name__}")
    size = len(json.dumps(value).encode("utf-8"))
    if size > max_bytes:
        raise JobInputError("parameters", f"{size} bytes as JSON, more than the limit of "
                                          f"{max_bytes}")
    for name, v in value.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            raise JobInputError(f"parameters.{name[:60]}", "not a Python identifier (papermill "
                                                           "assigns it as a variable)")
        _check_value(v, f"parameters.{name}")
    return dict(value)


def check_time_limit(value: Any, default: int, maximum: int, where: str = "") -> int:
    """The time limit in whole seconds: ``default`` for None, else 1..``maximum``.
    ``where`` names whose maximum it is (e.g. "profile 'cpu'") in the message.

    Raises:
        JobInputError: field ``time_limit``.
    """
    if value is None:
        return min(default, maximum)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobInputError("time_limit", f"must be a whole number of seconds, got {value!r}")
    if value < 1:
        raise JobInputError("time_limit", f"must be at least 1 second, got {value}")
    if value > maximum:
        raise JobInputError("time_limit", f"at most {maximum} seconds"
                                          f"{' for ' + where if where else ''}, got {value}")
    return value


def check_at(value: Any, now: float | None = None, max_ahead: float = MAX_AHEAD_S) -> float:
    """A one-off start time: ISO 8601 with a time zone (``2026-03-01T22:00:00+01:00``,
    ``...Z``), not in the past, at most ``max_ahead`` seconds ahead. Returns seconds since
    the epoch.

    Raises:
        JobInputError: field ``at``.
    """
    from datetime import datetime

    if not isinstance(value, str):
        raise JobInputError("at", f"must be an ISO 8601 time with a time zone, e.g. "
                                  f"2026-03-01T22:00:00+01:00, got {type(value).__name__}")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise JobInputError("at", f"{value[:60]!r} is not an ISO 8601 time, e.g. "
                                  "2026-03-01T22:00:00+01:00") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise JobInputError("at", f"{value[:60]!r} has no time zone: add one, e.g. +01:00 "
                                  "or Z")
    t = when.timestamp()
    now = time.time() if now is None else now
    if t < now - 1:
        raise JobInputError("at", f"{value[:60]} is in the past")
    if t > now + max_ahead:
        raise JobInputError("at", f"{value[:60]} is more than {max_ahead / 86400:g} days "
                                  "ahead")
    return t


def check_notebook(value: Any, max_bytes: int) -> dict[str, Any]:
    """The snapshot of a submitted notebook: a JSON object that nbformat reads and validates
    as version 4 (an older version is converted), with the code cells' outputs and execution
    counts dropped (the job executes it anew), cells without an id given one.

    Raises:
        JobInputError: field ``notebook``.
    """
    if not isinstance(value, dict):
        raise JobInputError("notebook", "must be the notebook's content (a JSON object), got "
                                        f"{type(value).__name__}")
    raw = json.dumps(value)
    size = len(raw.encode("utf-8"))
    if size > max_bytes:
        raise JobInputError("notebook", f"{size} bytes, more than the limit of {max_bytes}")
    import nbformat
    from nbformat.validator import normalize

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(raw, as_version=4)
            _, normalized = normalize(nb)
            nb = nbformat.from_dict(normalized)
            nbformat.validate(nb)
    except Exception as e:  # nbformat raises ValidationError, but also TypeError & co.
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise JobInputError("notebook", f"not a valid notebook (nbformat 4): {text}") from None
    out = json.loads(nbformat.writes(nb))
    for cell in out.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return out


def parse_submission(body: Any, limits: Limits) -> JobRequest:
    """A submission (the body of ``POST api/jobs``) checked field by field, first problem
    first.

    Raises:
        JobInputError: the field and the reason.
    """
    if not isinstance(body, dict):
        raise JobInputError("body", "must be a JSON object with notebook, profile, "
                                    "parameters, time_limit, name")
    for key in body:
        if key not in SUBMISSION_KEYS:
            raise JobInputError(str(key)[:60], f"unknown field; known: "
                                               f"{', '.join(SUBMISSION_KEYS)}")
    if "notebook" not in body:
        raise JobInputError("notebook", "missing: the notebook's content is required")
    nb = check_notebook(body["notebook"], limits.max_notebook_bytes)
    params = check_parameters(body.get("parameters"), limits.max_parameters_bytes)
    profile = body.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        raise JobInputError("profile", f"must be a profile's slug (a string), got {profile!r}")
    limit = body.get("time_limit")
    if limit is not None:  # the range is the hub's (per profile); the type is checked here
        check_time_limit(limit, 1, 2**62)
        limit = int(limit)
    name = check_name(body["name"]) if body.get("name") is not None else DEFAULT_NAME
    at = check_at(body["at"]) if body.get("at") is not None else None
    if len(notebook_env(nb)[1]) > limits.max_env_bytes:
        raise JobInputError("notebook", f"more than {limits.max_env_bytes} bytes even "
                                        "compressed; make it smaller")
    return JobRequest(notebook=nb, parameters=params, profile=profile, time_limit=limit,
                      name=name, at=at)


# -- how the notebook travels -----------------------------------------------------------------
def encode_notebook(nb: Mapping[str, Any]) -> str:
    """The notebook as it travels: its JSON, zlib-compressed, base64."""
    data = json.dumps(nb, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def notebook_env(nb: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """The environment variables that carry ``nb`` (:data:`NOTEBOOK_ENV_PREFIX` + index, and
    :data:`NOTEBOOK_ENV_COUNT`), and the encoded text they hold together."""
    text = encode_notebook(nb)
    chunks = [text[i:i + ENV_CHUNK] for i in range(0, len(text), ENV_CHUNK)] or [""]
    env = {f"{NOTEBOOK_ENV_PREFIX}{i}": c for i, c in enumerate(chunks)}
    env[NOTEBOOK_ENV_COUNT] = str(len(chunks))
    return env, text


def output_dir(name: str, started: float, job_id: str) -> str:
    """The job's output folder relative to the home: ``jobs/<name>/<UTC start>-<id>``
    (start as ``20260101T120000Z``)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return f"jobs/{check_name(name)}/{stamp}-{job_id}"


def parse_output(stdout: bytes) -> dict[str, Any] | None:
    """The result the job printed between :data:`OUTPUT_BEGIN` and :data:`OUTPUT_END` (base64
    lines of zlib-compressed JSON: ``{"notebook": {...}, "error": {...} | null}``), or None
    when there is none or it does not decode (the last complete frame counts)."""
    text = stdout.decode("utf-8", "replace")
    end = text.rfind(OUTPUT_END)
    begin = text.rfind(OUTPUT_BEGIN, 0, end if end >= 0 else None)
    if begin < 0 or end < 0:
        return None
    body = "".join(text[begin + len(OUTPUT_BEGIN):end].split())
    try:
        data = json.loads(zlib.decompress(base64.b64decode(body, validate=True)))
    except (ValueError, zlib.error):
        return None
    return data if isinstance(data, dict) else None
