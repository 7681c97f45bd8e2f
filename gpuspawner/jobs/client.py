"""``gpuspawner jobs``: submit, list, show, cancel notebook jobs and fetch their executed
notebooks through the hub's ``gpuspawner`` service (standard library only: it runs in a
user's server and on a laptop alike).

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
               at: str | None = None) -> Any:
        body: dict[str, Any] = {"notebook": notebook, "parameters": parameters, "name": name}
        if at:
            body["at"] = at
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
    job = _client().submit(notebook, args.profile, params, args.time_limit,
                           args.name or default_name(args.notebook), args.at)
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


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (ClientError, ValueError) as e:
            print(f"gpuspawner jobs: {e}", file=sys.stderr)
            return 1
    return wrapped


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """``gpuspawner jobs submit|list|show|cancel|output``."""
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
    s.add_argument("--at", default=None, metavar="ISO8601",
                   help="start it then instead of now: a time with its zone, e.g. "
                   "2026-03-01T22:00:00+01:00")
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


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuspawner.jobs.client ...`` (the same as ``gpuspawner jobs ...``)."""
    parser = argparse.ArgumentParser(prog="gpuspawner")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
