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

__all__ = ["ACTIVE_STATES", "CONCURRENCY_POLICIES", "DefinitionRequest", "ENV_CHUNK",
           "FINAL_STATES", "JobInputError", "JobRequest", "Limits", "OUTPUT_BEGIN", "OUTPUT_END",
           "IMAGE_KEYS", "OUTPUT_FORMATS", "ResultTooLarge", "STATES", "check_at",
           "check_concurrency_policy", "check_env_size", "check_image_options",
           "check_input_folder", "check_name", "check_notebook", "check_output_formats",
           "check_parameters", "check_schedule", "check_starting_deadline",
           "check_time_limit", "check_timezone", "encode_notebook", "notebook_env", "output_dir",
           "parse_definition", "parse_definition_update", "parse_iso_time", "parse_output",
           "parse_submission"]

#: every state, in the order a job passes them
STATES = ("queued", "waiting", "starting", "running", "completed", "failed", "timed_out",
          "cancelled", "lost")
#: states of a job that holds, or waits for, a place in the cluster
ACTIVE_STATES = frozenset({"queued", "waiting", "starting", "running"})
#: states a job never leaves
FINAL_STATES = frozenset({"completed", "failed", "timed_out", "cancelled", "lost"})

#: the keys of a submission that choose its image, as the spawn form's ``user_options``
#: (KubeSpawner's names; checked by :func:`gpuspawner.hub.images.choose_image`)
IMAGE_KEYS = ("image", "image--unlisted-choice")
#: the keys a submission may have
SUBMISSION_KEYS = ("notebook", "parameters", "profile", "time_limit", "name", "at",
                   *IMAGE_KEYS, "output_formats", "input_folder")
#: the output formats a job writes, jupyter-scheduler's names; the notebook is always
#: written (it is saved after every cell), the others only when asked for
OUTPUT_FORMATS = ("ipynb", "html")
#: the longest input folder accepted (characters)
MAX_INPUT_FOLDER_CHARS = 1000
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
        definition_id: the job definition whose tick made it, or None (a job of its own).
        image_options: the image chosen (``image``: a key of the profile's choices, or
            ``image--unlisted-choice``: a reference of the user's own), as the spawn form's
            ``user_options``; empty: the profile's image.
        output_formats: the formats written (:data:`OUTPUT_FORMATS`, ``ipynb`` always).
        input_folder: a folder of the home (relative to it) copied into the job's folder
            before the notebook runs, or None.
    """

    notebook: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None
    time_limit: int | None = None
    name: str = DEFAULT_NAME
    at: float | None = None
    definition_id: str | None = None
    image_options: dict[str, str] = field(default_factory=dict)
    output_formats: tuple[str, ...] = OUTPUT_FORMATS
    input_folder: str | None = None

    def options(self) -> dict[str, Any]:
        """What is stored with the job beside its columns (the store's ``options``): the
        image choice, output formats and input folder."""
        return {**self.image_options, "output_formats": list(self.output_formats),
                "input_folder": self.input_folder}


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


#: an ISO 8601 time with its zone as :func:`parse_iso_time` reads it: date, ``T`` (or a
#: space), hours and minutes, optional seconds and fraction (1 to 6 digits), then ``Z`` or
#: ``+HH:MM`` / ``+HHMM`` / ``+HH``
ISO_TIME_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,6}))?)?"
    r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)?")


def parse_iso_time(value: str) -> float:
    """An ISO 8601 time with its time zone (``2026-03-01T22:00:00+01:00``, ``...Z``,
    ``...22:00:00.5Z``, ``...+0100``) as seconds since the epoch.

    Read by a pattern of its own, not ``datetime.fromisoformat``: Python 3.10's (which
    ``pyproject.toml`` supports) refuses ``Z`` and fractions of other than 3 or 6 digits,
    3.11's reads them.

    Raises:
        ValueError: not such a time (the message says what), or no time zone.
    """
    from datetime import datetime, timedelta
    from datetime import timezone as tz

    m = ISO_TIME_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError("not an ISO 8601 time")
    year, month, day, hour, minute = (int(g) for g in m.group(1, 2, 3, 4, 5))
    second = int(m.group(6) or 0)
    micro = int((m.group(7) or "0").ljust(6, "0"))
    if m.group(8):
        zone = tz.utc
    elif m.group(9):
        hours, minutes = int(m.group(10)), int(m.group(11) or 0)
        if hours > 23 or minutes > 59:
            raise ValueError("its UTC offset is out of range")
        sign = 1 if m.group(9) == "+" else -1
        zone = tz(sign * timedelta(hours=hours, minutes=minutes))
    else:
        raise ValueError("no time zone")
    when = datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
    return when.timestamp()


def check_at(value: Any, now: float | None = None, max_ahead: float = MAX_AHEAD_S) -> float:
    """A one-off start time: ISO 8601 with a time zone (``2026-03-01T22:00:00+01:00``,
    ``...Z``; :func:`parse_iso_time`, the same on every supported Python), not in the past,
    at most ``max_ahead`` seconds ahead. Returns seconds since the epoch.

    Raises:
        JobInputError: field ``at``.
    """
    if not isinstance(value, str):
        raise JobInputError("at", f"must be an ISO 8601 time with a time zone, e.g. "
                                  f"2026-03-01T22:00:00+01:00, got {type(value).__name__}")
    try:
        t = parse_iso_time(value)
    except ValueError as e:
        if str(e) == "no time zone":
            raise JobInputError("at", f"{value[:60]!r} has no time zone: add one, e.g. "
                                      "+01:00 or Z") from None
        raise JobInputError("at", f"{value[:60]!r} is not an ISO 8601 time ({e}), e.g. "
                                  "2026-03-01T22:00:00+01:00") from None
    now = time.time() if now is None else now
    if t < now - 1:
        raise JobInputError("at", f"{value[:60]} is in the past")
    if t > now + max_ahead:
        raise JobInputError("at", f"{value[:60]} is more than {max_ahead / 86400:g} days "
                                  "ahead")
    return t


def check_image_options(body: Mapping[str, Any]) -> dict[str, str]:
    """The image keys of a submission (:data:`IMAGE_KEYS`): strings of at most 255
    characters; empty ones are left out. What they may name is the hub's to check (the
    profile's choices, the site's rules: :func:`gpuspawner.hub.images.choose_image`).

    Raises:
        JobInputError: field ``image`` or ``image--unlisted-choice``.
    """
    out: dict[str, str] = {}
    for key in IMAGE_KEYS:
        value = body.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) > 255:
            raise JobInputError(key, f"must be a string of at most 255 characters, got "
                                     f"{type(value).__name__}")
        out[key] = value
    return out


def check_output_formats(value: Any) -> tuple[str, ...]:
    """The output formats asked for: a list of :data:`OUTPUT_FORMATS`; the notebook
    (``ipynb``) is always written, as jupyter-scheduler's own backend keeps it. None: all.

    Raises:
        JobInputError: field ``output_formats``.
    """
    if value is None:
        return OUTPUT_FORMATS
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobInputError("output_formats", f"must be a list of "
                                              f"{', '.join(OUTPUT_FORMATS)}, got {value!r}"[:200])
    unknown = [v for v in value if v not in OUTPUT_FORMATS]
    if unknown:
        raise JobInputError("output_formats", f"{', '.join(unknown)[:100]}: a job writes "
                                              f"{', '.join(OUTPUT_FORMATS)} only")
    return tuple(f for f in OUTPUT_FORMATS if f == "ipynb" or f in value)


def check_input_folder(value: Any) -> str | None:
    """The folder given to the job ("Run job with input folder"): a path relative to the
    home (``""`` or ``.``: the home itself), with no ``..``, no leading ``/``, no NUL, at
    most :data:`MAX_INPUT_FOLDER_CHARS` characters; returned normalised (``a/./b/`` ->
    ``a/b``). None: none. Whether it exists, and that it stays in the home (links), is
    checked by the job as the user when it copies it (:mod:`gpuspawner.jobs.execute`).

    Raises:
        JobInputError: field ``input_folder``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobInputError("input_folder", f"must be a folder of your home (a string), got "
                                            f"{type(value).__name__}")
    if len(value) > MAX_INPUT_FOLDER_CHARS or "\0" in value:
        raise JobInputError("input_folder", f"longer than {MAX_INPUT_FOLDER_CHARS} "
                                            "characters or holds a NUL")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if value.startswith("/") or ".." in parts:
        raise JobInputError("input_folder", f"{value[:100]!r}: a path relative to your home, "
                                            "without '..'")
    return "/".join(parts)


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
    check_env_size(nb, limits)
    return JobRequest(notebook=nb, parameters=params, profile=profile, time_limit=limit,
                      name=name, at=at, image_options=check_image_options(body),
                      output_formats=check_output_formats(body.get("output_formats")),
                      input_folder=check_input_folder(body.get("input_folder")))


def check_env_size(nb: Mapping[str, Any], limits: Limits) -> None:
    """The notebook as it travels (:func:`notebook_env`) fits ``limits.max_env_bytes``.

    Raises:
        JobInputError: field ``notebook``.
    """
    if len(notebook_env(nb)[1]) > limits.max_env_bytes:
        raise JobInputError("notebook", f"more than {limits.max_env_bytes} bytes even "
                                        "compressed; make it smaller")


# -- job definitions: a notebook on a schedule ------------------------------------------------
#: Kubernetes CronJob's ``concurrencyPolicy`` values: what a tick does while a job of the same
#: definition is still active (Allow: start another; Forbid: skip the tick; Replace: cancel
#: the active one(s), then start)
CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")
#: the keys a definition may have (a job's, without ``at``, and the schedule's)
DEFINITION_KEYS = ("notebook", "parameters", "profile", "time_limit", "name", "schedule",
                   "timezone", "concurrency_policy", "starting_deadline", "paused",
                   *IMAGE_KEYS, "output_formats", "input_folder")
#: the keys ``PATCH api/job_definitions/{id}`` may change: every key of a definition (the
#: notebook is a new snapshot; its next runs run it)
DEFINITION_UPDATE_KEYS = ("schedule", "timezone", "concurrency_policy", "starting_deadline",
                          "paused", "notebook", "parameters", "profile", "time_limit", "name",
                          *IMAGE_KEYS, "output_formats", "input_folder")
#: the longest cron expression accepted (characters)
MAX_SCHEDULE_CHARS = 200
#: the longest starting deadline accepted (seconds; a year)
MAX_STARTING_DEADLINE_S = 366 * 24 * 3600


@dataclass(frozen=True)
class DefinitionRequest:
    """A job definition that passed :func:`parse_definition`: what each of its jobs runs
    (``job``, whose ``at`` is None) and when.

    Attributes:
        job: the notebook snapshot, parameters, profile, time limit and name of every run.
        schedule: a cron expression (5 fields; 6 with seconds last where the hub allows it).
        timezone: an IANA time zone name (``Europe/Rome``) the expression is read in.
        concurrency_policy: one of :data:`CONCURRENCY_POLICIES`.
        starting_deadline: seconds after its time a tick may still start (a tick missed
            longer ago, e.g. while the hub was down, is skipped), or None: no deadline.
        paused: made paused (no tick runs until it is resumed).
    """

    job: JobRequest
    schedule: str
    timezone: str = "UTC"
    concurrency_policy: str = "Forbid"
    starting_deadline: int | None = None
    paused: bool = False


def check_timezone(value: Any) -> str:
    """An IANA time zone name that :mod:`zoneinfo` knows (``UTC``, ``Europe/Rome``).

    Raises:
        JobInputError: field ``timezone``.
    """
    from zoneinfo import ZoneInfo

    if not isinstance(value, str) or not value.strip():
        raise JobInputError("timezone", "must be an IANA time zone name such as UTC or "
                                        f"Europe/Rome, got {value!r}"[:200])
    try:
        ZoneInfo(value.strip())
    except (KeyError, ValueError, OSError):  # not found: KeyError; a bad key: ValueError
        raise JobInputError("timezone", f"unknown time zone {value[:60]!r}: use an IANA "
                                        "name such as UTC or Europe/Rome") from None
    return value.strip()


def check_schedule(value: Any, seconds: bool = False) -> str:
    """A cron expression as croniter reads it: 5 fields (minute hour day-of-month month
    day-of-week) or an alias such as ``@daily``; with ``seconds`` also 6 fields, the sixth
    being seconds (croniter's order, e.g. ``* * * * * */10``: every 10 s). It must match
    some time in the next 50 years (``0 0 31 2 *`` never does).

    Raises:
        JobInputError: field ``schedule``.
    """
    from croniter import croniter

    if not isinstance(value, str) or not value.strip():
        raise JobInputError("schedule", "must be a cron expression such as '0 2 * * *' "
                                        f"(every day at 02:00), got {value!r}"[:200])
    expr = " ".join(value.split())
    if len(expr) > MAX_SCHEDULE_CHARS:
        raise JobInputError("schedule", f"longer than {MAX_SCHEDULE_CHARS} characters")
    fields = len(expr.split())
    allowed = (5, 6) if seconds else (5,)
    if not expr.startswith("@") and fields not in allowed:
        six = " (or 6 with seconds last)" if seconds else ""
        raise JobInputError("schedule", f"{expr[:60]!r} has {fields} fields; a cron "
                                        f"expression has 5{six}: minute hour day-of-month "
                                        "month day-of-week")
    if "R" in re.split(r"[\s,/-]+", expr.upper()):  # croniter's random: not one time
        raise JobInputError("schedule", f"{expr[:60]!r}: 'R' (a random time) is not "
                                        "supported; name the time")
    if not croniter.is_valid(expr):
        raise JobInputError("schedule", f"{expr[:60]!r} is not a valid cron expression "
                                        "(minute hour day-of-month month day-of-week)")
    try:
        croniter(expr, 0.0).get_next(float)
    except (ValueError, KeyError, OverflowError):  # CroniterBadDateError is a ValueError
        raise JobInputError("schedule", f"{expr[:60]!r} never matches a time") from None
    return expr


def check_concurrency_policy(value: Any) -> str:
    """One of :data:`CONCURRENCY_POLICIES` (Kubernetes CronJob's ``concurrencyPolicy``).

    Raises:
        JobInputError: field ``concurrency_policy``.
    """
    if value not in CONCURRENCY_POLICIES:
        raise JobInputError("concurrency_policy", f"must be one of "
                                                  f"{', '.join(CONCURRENCY_POLICIES)}, got "
                                                  f"{value!r}"[:200])
    return str(value)


def check_starting_deadline(value: Any) -> int | None:
    """Whole seconds >= 0 (Kubernetes CronJob's ``startingDeadlineSeconds``), at most a
    year, or None (no deadline: the latest missed tick always runs once late).

    Raises:
        JobInputError: field ``starting_deadline``.
    """
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobInputError("starting_deadline", "must be a whole number of seconds or null, "
                                                 f"got {value!r}"[:200])
    if value < 0:
        raise JobInputError("starting_deadline", f"must be 0 or more seconds, got {value}")
    if value > MAX_STARTING_DEADLINE_S:
        raise JobInputError("starting_deadline", f"at most {MAX_STARTING_DEADLINE_S} "
                                                 f"seconds, got {value}")
    return value


def _check_paused(value: Any) -> bool:
    if not isinstance(value, bool):
        raise JobInputError("paused", f"must be true or false, got {value!r}"[:200])
    return value


def parse_definition(body: Any, limits: Limits, seconds: bool = False) -> DefinitionRequest:
    """A job definition (the body of ``POST api/job_definitions``) checked field by field:
    the job's fields as :func:`parse_submission` checks them (no ``at``), then ``schedule``
    (:func:`check_schedule`; ``seconds`` allows a sixth field), ``timezone`` (default UTC),
    ``concurrency_policy`` (default Forbid), ``starting_deadline`` (default null) and
    ``paused`` (default false).

    Raises:
        JobInputError: the field and the reason, first problem first.
    """
    if not isinstance(body, dict):
        raise JobInputError("body", "must be a JSON object with notebook, schedule, "
                                    "timezone, profile, parameters, time_limit, name")
    for key in body:
        if key not in DEFINITION_KEYS:
            raise JobInputError(str(key)[:60], f"unknown field; known: "
                                               f"{', '.join(DEFINITION_KEYS)}")
    if "schedule" not in body:
        raise JobInputError("schedule", "missing: a cron expression is required")
    job = parse_submission({k: v for k, v in body.items() if k in SUBMISSION_KEYS}, limits)
    return DefinitionRequest(
        job=job, schedule=check_schedule(body["schedule"], seconds),
        timezone=check_timezone(body.get("timezone", "UTC")),
        concurrency_policy=check_concurrency_policy(body.get("concurrency_policy",
                                                             "Forbid")),
        starting_deadline=check_starting_deadline(body.get("starting_deadline")),
        paused=_check_paused(body.get("paused", False)))


def parse_definition_update(body: Any, seconds: bool = False,
                            limits: Limits | None = None) -> dict[str, Any]:
    """The changes of ``PATCH api/job_definitions/{id}``: any of
    :data:`DEFINITION_UPDATE_KEYS`, each checked as :func:`parse_definition` does
    (``limits``: the notebook's and parameters' sizes, default :class:`Limits`). Returns
    field -> checked value; an image key given as ``""`` or null is kept as ``""`` (back to
    the profile's image). The profile, time limit and image are the hub's to check against
    its profiles (:meth:`gpuspawner.hub.jobs.schedule.Scheduler.update`).

    Raises:
        JobInputError: the field and the reason.
    """
    limits = limits or Limits()
    if not isinstance(body, dict) or not body:
        raise JobInputError("body", "must be a JSON object with one or more of "
                                    f"{', '.join(DEFINITION_UPDATE_KEYS)}")
    for key in body:
        if key not in DEFINITION_UPDATE_KEYS:
            raise JobInputError(str(key)[:60], "cannot be changed; make a new definition "
                                               "instead. Changeable: "
                                               f"{', '.join(DEFINITION_UPDATE_KEYS)}")
    def notebook(v: Any) -> dict[str, Any]:
        nb = check_notebook(v, limits.max_notebook_bytes)
        check_env_size(nb, limits)
        return nb

    def profile(v: Any) -> str:
        if not isinstance(v, str) or not v:
            raise JobInputError("profile", f"must be a profile's slug (a string), got {v!r}"
                                [:200])
        return v

    def time_limit(v: Any) -> int | None:
        if v is not None:
            check_time_limit(v, 1, 2**62)
            return int(v)
        return None

    def image_key(key: str) -> Any:
        return lambda v: check_image_options({key: v}).get(key, "")

    checks: dict[str, Any] = {
        "schedule": lambda v: check_schedule(v, seconds), "timezone": check_timezone,
        "concurrency_policy": check_concurrency_policy,
        "starting_deadline": check_starting_deadline, "paused": _check_paused,
        "notebook": notebook,
        "parameters": lambda v: check_parameters(v, limits.max_parameters_bytes),
        "profile": profile, "time_limit": time_limit, "name": check_name,
        "output_formats": check_output_formats, "input_folder": check_input_folder,
        **{k: image_key(k) for k in IMAGE_KEYS}}
    return {key: checks[key](value) for key, value in body.items()}


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


class ResultTooLarge(Exception):
    """A job's result frame decompresses to more than the hub reads back (``limit``, bytes
    of JSON): the executed notebook stays in the user's home only."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"its result is larger than {limit} bytes uncompressed")
        self.limit = limit


def parse_output(stdout: bytes, max_bytes: int | None = None) -> dict[str, Any] | None:
    """The result the job printed between :data:`OUTPUT_BEGIN` and :data:`OUTPUT_END` (base64
    lines of zlib-compressed JSON: ``{"notebook": {...}, "error": {...} | null}``), or None
    when there is none or it does not decode (the last complete frame counts).

    ``max_bytes``: the most bytes of JSON the frame may decompress to (None: no limit). The
    frame is the job's, i.e. the user's: a few KiB of zlib can expand a thousandfold, so the
    hub decompresses at most this much.

    Raises:
        ResultTooLarge: the frame decompresses to more than ``max_bytes``.
    """
    text = stdout.decode("utf-8", "replace")
    end = text.rfind(OUTPUT_END)
    begin = text.rfind(OUTPUT_BEGIN, 0, end if end >= 0 else None)
    if begin < 0 or end < 0:
        return None
    body = "".join(text[begin + len(OUTPUT_BEGIN):end].split())
    d = zlib.decompressobj()
    try:  # max_length 0: no limit (zlib.Decompress.decompress)
        plain = d.decompress(base64.b64decode(body, validate=True),
                             0 if max_bytes is None else max_bytes + 1)
    except (ValueError, zlib.error):
        return None
    if max_bytes is not None and (len(plain) > max_bytes or d.unconsumed_tail):
        raise ResultTooLarge(max_bytes)
    try:
        data = json.loads(plain)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
