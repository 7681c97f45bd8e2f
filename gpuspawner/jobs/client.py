"""``gpuspawner jobs``: submit, list, show, cancel notebook jobs and fetch their executed
notebooks, make job definitions (``submit --cron``), pause and resume them, through the hub's
``gpuspawner`` service (standard library only: it runs in a user's server and on a laptop
alike).

Where: ``GPUSPAWNER_SERVICE_URL`` (the service's URL, e.g.
``https://hub.example.org/services/gpuspawner/``), else derived from ``JUPYTERHUB_API_URL``
(``https://hub.example.org/hub/api`` -> ``https://hub.example.org/services/gpuspawner/``).
Who: ``JUPYTERHUB_API_TOKEN`` (a token from the hub's token page; it needs access to the
gpuspawner service, which every user's own token has).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ClientError", "JobsClient", "add_subcommands", "parse_parameter", "service_url"]

SERVICE_NAME = "gpuspawner"


class ClientError(Exception):
    """A request that failed; the message is what the service said."""


def service_url(env: dict[str, str] | None = None) -> str:
    """The service's URL (with a trailing ``/``) from the environment.

    Raises:
        ClientError: neither variable is set, or the API URL does not end in ``/hub/api``.
    """
    env = dict(os.environ if env is None else env)
    url = env.get("GPUSPAWNER_SERVICE_URL", "").strip()
    if url:
        return url.rstrip("/") + "/"
    api = env.get("JUPYTERHUB_API_URL", "").strip().rstrip("/")
    if not api:
        raise ClientError("set JUPYTERHUB_API_URL (the hub's API, .../hub/api) or "
                          "GPUSPAWNER_SERVICE_URL (.../services/gpuspawner/)")
    if not api.endswith("/hub/api"):
        raise ClientError(f"JUPYTERHUB_API_URL={api} does not end in /hub/api; set "
                          "GPUSPAWNER_SERVICE_URL to the gpuspawner service's URL")
    return api[:-len("hub/api")] + f"services/{SERVICE_NAME}/"


def parse_parameter(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``-p``: VALUE as JSON when it is a JSON scalar or list (``0.1``,
    ``true``, ``[1, 2]``, ``"7"``), else the string itself.

    Raises:
        ValueError: no ``=``, or an empty name.
    """
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"-p {text!r}: write NAME=VALUE")
    try:
        parsed = json.loads(value)
    except ValueError:
        return name.strip(), value
    return name.strip(), value if isinstance(parsed, dict) else parsed


def default_name(path: str) -> str:
    """A job name from a notebook's file name: its stem with other characters than letters,
    digits, ``.``, ``_``, ``-`` as ``-``."""
    stem = os.path.basename(path)
    if stem.endswith(".ipynb"):
        stem = stem[:-len(".ipynb")]
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", stem).replace("..", "-").lstrip("._-")[:100]
    return stem or "notebook"


class JobsClient:
    """The service's ``api/jobs`` with a token."""

    def __init__(self, url: str, token: str, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or raw.decode("utf-8", "replace")
            except (ValueError, AttributeError):
                message = raw.decode("utf-8", "replace")[:500]
            raise ClientError(f"HTTP {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ClientError(f"{self.url}: {getattr(e, 'reason', e)}") from None
        return json.loads(text) if text else None

    def submit(self, notebook: dict[str, Any], profile: str | None,
               parameters: dict[str, Any], time_limit: int | None, name: str,
               at: str | None = None, max_retries: int | None = None,
               options: dict[str, Any] | None = None) -> Any:
        """``POST api/jobs``: the job (with its ``id``). ``time_limit`` in seconds and
        ``max_retries`` (runs again after the job is lost with its node) default to the
        profile's and the hub's when None; ``options``: ``image``,
        ``image--unlisted-choice``, ``output_formats``, ``input_folder`` (docs/jobs.md)."""
        body: dict[str, Any] = {"notebook": notebook, "parameters": parameters, "name": name,
                                **(options or {})}
        if at:
            body["at"] = at
        if max_retries is not None:
            body["max_retries"] = max_retries
        if profile:
            body["profile"] = profile
        if time_limit is not None:
            body["time_limit"] = time_limit
        return self.request("POST", "api/jobs", body)

    def list(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "api/jobs")["jobs"])

    def show(self, job_id: str) -> Any:
        return self.request("GET", f"api/jobs/{job_id}")

    def cancel(self, job_id: str) -> Any:
        return self.request("DELETE", f"api/jobs/{job_id}")

    def output(self, job_id: str) -> Any:
        return self.request("GET", f"api/jobs/{job_id}/output")

    def text(self, path: str) -> str:
        """``GET path`` answered as text (a job's log, its HTML export).

        Raises:
            ClientError: an HTTP error (with the service's message) or no answer.
        """
        req = urllib.request.Request(self.url + path, method="GET", headers={
            "Authorization": f"token {self.token}", "Accept": "text/plain, text/html"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return str(r.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or raw.decode("utf-8", "replace")
            except (ValueError, AttributeError):
                message = raw.decode("utf-8", "replace")[:500]
            raise ClientError(f"HTTP {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ClientError(f"{self.url}: {getattr(e, 'reason', e)}") from None

    def logs(self, job_id: str) -> str:
        """The job's log (every attempt's)."""
        return self.text(f"api/jobs/{job_id}/log")


    # -- job definitions (a notebook on a schedule) --------------------------------------
    def create_definition(self, notebook: dict[str, Any], profile: str | None,
                          parameters: dict[str, Any], time_limit: int | None, name: str,
                          schedule: str, timezone: str | None = None,
                          concurrency_policy: str | None = None,
                          starting_deadline: int | None = None, paused: bool = False,
                          options: dict[str, Any] | None = None) -> Any:
        """``POST api/job_definitions``: the definition (with its ``id``); ``options`` as
        :meth:`submit`'s."""
        body: dict[str, Any] = {"notebook": notebook, "parameters": parameters, "name": name,
                                "schedule": schedule, **(options or {})}
        for key, value in (("profile", profile), ("time_limit", time_limit),
                           ("timezone", timezone), ("concurrency_policy", concurrency_policy),
                           ("starting_deadline", starting_deadline)):
            if value is not None:
                body[key] = value
        if paused:
            body["paused"] = True
        return self.request("POST", "api/job_definitions", body)

    def run_definition(self, definition_id: str,
                       parameters: dict[str, Any] | None = None) -> Any:
        """``POST api/job_definitions/{id}/jobs``: a job of the definition now, with
        ``parameters`` over its own; the job."""
        body = {} if parameters is None else {"parameters": parameters}
        return self.request("POST", f"api/job_definitions/{definition_id}/jobs", body)

    def definitions(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "api/job_definitions")["job_definitions"])

    def definition(self, definition_id: str) -> Any:
        return self.request("GET", f"api/job_definitions/{definition_id}")

    def update_definition(self, definition_id: str, **changes: Any) -> Any:
        """``PATCH api/job_definitions/{id}`` with ``changes`` (paused, schedule, timezone,
        concurrency_policy, starting_deadline)."""
        return self.request("PATCH", f"api/job_definitions/{definition_id}", changes)

    def delete_definition(self, definition_id: str) -> Any:
        return self.request("DELETE", f"api/job_definitions/{definition_id}")

    def jobs_of(self, definition_id: str) -> list[dict[str, Any]]:
        """The jobs a definition made, newest first."""
        return list(self.request("GET", f"api/jobs?definition_id={definition_id}")["jobs"])


# -- the subcommands -------------------------------------------------------------------------
def _client() -> JobsClient:
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not token:
        raise ClientError("set JUPYTERHUB_API_TOKEN (a token from the hub's token page)")
    return JobsClient(service_url(), token)


def _print_job(job: dict[str, Any]) -> None:
    for key in ("id", "name", "state", "message", "profile", "user", "time_limit",
                "parameters", "created", "at", "started", "finished", "node", "gpu_uuids",
                "exit_code", "output_dir", "queue_position"):
        value = job.get(key)
        if value not in (None, "", [], {}):
            print(f"{key}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")


def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        with open(args.notebook, encoding="utf-8") as f:
            notebook = json.load(f)
    except (OSError, ValueError) as e:
        raise ClientError(f"{args.notebook}: cannot read a notebook: {e}") from None
    params = dict(parse_parameter(p) for p in args.parameter or [])
    if args.cron is not None or args.at is None and _schedule_options(args):
        return _submit_definition(args, notebook, params)
    job = _client().submit(notebook, args.profile, params, args.time_limit,
                           args.name or default_name(args.notebook), args.at,
                           args.max_retries, _options(args))
    print(json.dumps(job, indent=1, sort_keys=True) if args.json else job["id"])
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    jobs = _client().list()
    if args.json:
        print(json.dumps(jobs, indent=1, sort_keys=True))
        return 0
    print(f"{'ID':32}  {'STATE':10}  {'PROFILE':12}  {'CREATED':20}  NAME")
    for j in jobs:
        print(f"{j['id']:32}  {j['state']:10}  {j['profile']:12}  {j['created']:20}  "
              f"{j['name']}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    job = _client().show(args.id)
    if args.json:
        print(json.dumps(job, indent=1, sort_keys=True))
    else:
        _print_job(job)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = _client().cancel(args.id)
    if args.json:
        print(json.dumps(job, indent=1, sort_keys=True))
    else:
        print(f"{job['id']}: {job['state']}")
    return 0


def _cmd_output(args: argparse.Namespace) -> int:
    client = _client()
    job = client.show(args.id)
    nb = client.output(args.id)
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, f"{job['name']}.ipynb")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(nb, f, indent=1)
        f.write("\n")
    print(path)
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    text = _client().logs(args.id)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """``--image``, ``--own-image``, ``--output-format``, ``--input-folder`` as the
    submission's keys (those given)."""
    out: dict[str, Any] = {}
    if args.image is not None:
        out["image"] = args.image
    if args.own_image is not None:
        out["image--unlisted-choice"] = args.own_image
    if args.output_format is not None:
        out["output_formats"] = list(args.output_format)
    if args.input_folder is not None:
        out["input_folder"] = args.input_folder
    return out


def _schedule_options(args: argparse.Namespace) -> list[str]:
    """The options of a schedule given to ``submit`` (they need ``--cron``)."""
    return [o for o, v in (("--timezone", args.timezone),
                           ("--concurrency-policy", args.concurrency_policy),
                           ("--starting-deadline", args.starting_deadline),
                           ("--paused", args.paused or None)) if v is not None]


def _submit_definition(args: argparse.Namespace, notebook: dict[str, Any],
                       params: dict[str, Any]) -> int:
    if args.at is not None:
        raise ClientError("submit: --at or --cron, not both")
    if args.max_retries is not None:
        raise ClientError("submit: --max-retries applies to one job (now or --at); the jobs "
                          "of a --cron definition use the hub's default")
    if args.cron is None:
        raise ClientError(f"submit: {', '.join(_schedule_options(args))} need --cron")
    d = _client().create_definition(
        notebook, args.profile, params, args.time_limit,
        args.name or default_name(args.notebook), args.cron, args.timezone,
        args.concurrency_policy, args.starting_deadline, args.paused, _options(args))
    print(json.dumps(d, indent=1, sort_keys=True) if args.json else d["id"])
    return 0


def _cmd_definitions(args: argparse.Namespace) -> int:
    defs = _client().definitions()
    if args.json:
        print(json.dumps(defs, indent=1, sort_keys=True))
        return 0
    print(f"{'ID':32}  {'SCHEDULE':16}  {'TIME ZONE':16}  {'NEXT RUN':20}  NAME")
    for d in defs:
        nxt = "paused" if d.get("paused") else d.get("next_tick") or "-"
        print(f"{d['id']:32}  {d['schedule']:16}  {d['timezone']:16}  {nxt:20}  {d['name']}")
    return 0


def _set_paused(paused: bool) -> Any:
    def command(args: argparse.Namespace) -> int:
        d = _client().update_definition(args.id, paused=paused)
        if args.json:
            print(json.dumps(d, indent=1, sort_keys=True))
        else:
            print(f"{d['id']}: {'paused' if d['paused'] else 'next run ' + str(d['next_tick'])}")
        return 0
    return command


def _cmd_delete_definition(args: argparse.Namespace) -> int:
    d = _client().delete_definition(args.id)
    print(f"{d['id']}: deleted (its jobs stay)")
    return 0


def _cmd_run_definition(args: argparse.Namespace) -> int:
    params = dict(parse_parameter(p) for p in args.parameter or []) if args.parameter \
        else None
    job = _client().run_definition(args.id, params)
    print(json.dumps(job, indent=1, sort_keys=True) if args.json else job["id"])
    return 0


def _cmd_definition_jobs(args: argparse.Namespace) -> int:
    jobs = _client().jobs_of(args.id)
    if args.json:
        print(json.dumps(jobs, indent=1, sort_keys=True))
        return 0
    print(f"{'ID':32}  {'STATE':10}  {'AT':20}  NAME")
    for j in jobs:
        print(f"{j['id']:32}  {j['state']:10}  {j.get('at') or '-':20}  {j['name']}")
    return 0


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (ClientError, ValueError) as e:
            print(f"gpuspawner jobs: {e}", file=sys.stderr)
            return 1
    return wrapped


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """``gpuspawner jobs submit|list|show|cancel|output``, and for job definitions
    (``submit --cron``) ``definitions|pause|resume|delete-definition|definition-jobs``."""
    p = sub.add_parser("jobs", help="notebook jobs: run a notebook once in its own bundle",
                       description="Notebook jobs through the hub's gpuspawner service "
                       "(JUPYTERHUB_API_URL or GPUSPAWNER_SERVICE_URL, JUPYTERHUB_API_TOKEN).")
    jsub = p.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)

    s = jsub.add_parser("submit", help="run a notebook as a job; prints its id")
    s.add_argument("notebook", metavar="NOTEBOOK", help="the .ipynb file (its content is sent)")
    s.add_argument("--profile", default=None, help="profile slug (default: the default one)")
    s.add_argument("-p", "--parameter", action="append", metavar="NAME=VALUE",
                   help="a parameter for the cell tagged 'parameters' (VALUE as JSON when it "
                   "is a JSON scalar or list, else a string); repeatable")
    s.add_argument("--time-limit", type=int, default=None, metavar="SECONDS",
                   help="stop it after this many seconds (default: the profile's)")
    s.add_argument("--name", default=None,
                   help="the job's name (default: the notebook's file name)")
    s.add_argument("--max-retries", type=int, default=None, metavar="N",
                   help="run it again up to N times when it is lost with its node (Kubernetes "
                   "Job's backoffLimit; default and maximum: the hub's)")
    s.add_argument("--at", default=None, metavar="ISO8601",
                   help="start it then instead of now: a time with its zone, e.g. "
                   "2026-03-01T22:00:00+01:00")
    s.add_argument("--cron", default=None, metavar="EXPR",
                   help="run it on this schedule instead (a job definition; prints its id): "
                   "a cron expression, e.g. '0 2 * * *' for every day at 02:00")
    s.add_argument("--timezone", default=None, metavar="TZ",
                   help="the time zone of --cron (IANA name, e.g. Europe/Rome; default UTC)")
    s.add_argument("--concurrency-policy", default=None, choices=["Allow", "Forbid",
                                                                   "Replace"],
                   help="with --cron: while a run is still active, a tick starts another "
                   "(Allow), is skipped (Forbid, the default) or replaces it (Replace)")
    s.add_argument("--starting-deadline", type=int, default=None, metavar="SECONDS",
                   help="with --cron: a tick missed by more than this (the hub was down) is "
                   "skipped (default: the latest missed tick runs once, late)")
    s.add_argument("--paused", action="store_true", default=None,
                   help="with --cron: make it paused (gpuspawner jobs resume ID starts it)")
    s.add_argument("--image", default=None, metavar="KEY",
                   help="run in this image choice of the profile (its profile_options.image "
                   "keys; default: the profile's image)")
    s.add_argument("--own-image", default=None, metavar="REFERENCE",
                   help="run in an image of your own, where the profile allows one "
                   "(image--unlisted-choice)")
    s.add_argument("--output-format", action="append", default=None, choices=["ipynb", "html"],
                   help="what to write beside the executed notebook (always written); "
                   "repeatable; default: ipynb and html")
    s.add_argument("--input-folder", default=None, metavar="PATH",
                   help="a folder of your home (relative to it) copied into the job's folder "
                   "before the notebook runs")
    s.add_argument("--json", action="store_true", help="print the whole job")
    s.set_defaults(func=_run(_cmd_submit))

    s = jsub.add_parser("list", help="your jobs (admins: everyone's)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_cmd_list))

    s = jsub.add_parser("show", help="one job, with its state")
    s.add_argument("id", metavar="ID")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_cmd_show))

    s = jsub.add_parser("cancel", help="cancel a job (stops it, releases its bundle)")
    s.add_argument("id", metavar="ID")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_cmd_cancel))

    s = jsub.add_parser("output", help="download the executed notebook")
    s.add_argument("id", metavar="ID")
    s.add_argument("-o", "--output-dir", default=".", metavar="DIR",
                   help="folder to write <name>.ipynb into (default: here)")
    s.set_defaults(func=_run(_cmd_output))

    s = jsub.add_parser("logs", help="print the job's log (papermill's lines and the cells' "
                        "output; each attempt's after a retry)")
    s.add_argument("id", metavar="ID")
    s.set_defaults(func=_run(_cmd_logs))


    s = jsub.add_parser("definitions", help="your job definitions (notebooks on a schedule)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_cmd_definitions))

    for verb, paused in (("pause", True), ("resume", False)):
        s = jsub.add_parser(verb, help=f"{verb} a job definition's schedule")
        s.add_argument("id", metavar="DEFINITION")
        s.add_argument("--json", action="store_true")
        s.set_defaults(func=_run(_set_paused(paused)))

    s = jsub.add_parser("delete-definition",
                        help="delete a job definition (its jobs stay and run to their end)")
    s.add_argument("id", metavar="DEFINITION")
    s.set_defaults(func=_run(_cmd_delete_definition))

    s = jsub.add_parser("run-definition", help="a job of a job definition now; prints its id")
    s.add_argument("id", metavar="DEFINITION")
    s.add_argument("-p", "--parameter", action="append", metavar="NAME=VALUE",
                   help="a parameter over the definition's; repeatable")
    s.add_argument("--json", action="store_true", help="print the whole job")
    s.set_defaults(func=_run(_cmd_run_definition))

    s = jsub.add_parser("definition-jobs", help="the jobs a job definition made")
    s.add_argument("id", metavar="DEFINITION")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_cmd_definition_jobs))


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuspawner.jobs.client ...`` (the same as ``gpuspawner jobs ...``)."""
    parser = argparse.ArgumentParser(prog="gpuspawner")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
