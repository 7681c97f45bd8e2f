"""Submitting a server's job through slurmrestd (``c.SlurmBackend.submit_via = "rest"``).

Slurm 22.05 (Debian 12's ``slurmrestd``) serves the OpenAPI plugins v0.0.36-v0.0.38; this
module speaks ``openapi/v0.0.38`` (``POST /slurm/v0.0.38/job/submit``, schema
``v0.0.38_job_submission``: ``{"script": ..., "job": v0.0.38_job_properties}``), authenticated
with Slurm's JWT (``rest_auth/jwt``; slurm.conf ``AuthAltTypes=auth/jwt``,
``AuthAltParameters=jwt_key=...``; headers ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN``,
Slurm's jwt.html and slurmrestd(8)). A token of root or SlurmUser may name another user in
``X-SLURM-USER-NAME``: the job then belongs to that user (seen on 22.05.8 with the test cluster
of ``scripts/slurm.sh``: a root token with ``X-SLURM-USER-NAME: gpsuser1`` made a job of
gpsuser1(2001)).

What v0.0.38 cannot do, seen on 22.05.8, and what the backend does about it:

* No node list: ``nodes`` is a node *count* (``"nodes": "node1"`` -> ``Invalid node count
  string``) and ``required_nodes`` is not in the schema. A per-device GRES type (exact mode:
  each GPU's type exists on its node only) pins the node; for a job without such a GRES (no
  GPU, or model mode) the site gives each node a feature of its own (slurm.conf
  ``Features=node1``) and ``c.SlurmBackend.rest_node_constraint`` names it (``constraints``);
  without either the submit is refused. The readback (``scontrol show job -d``) still checks
  the node, so a job Slurm placed elsewhere is cancelled, never silently kept.
* No ``--gid``: the job runs with the user's primary group.
* No AdminComment: the backend marks the job with the CLI (``scontrol update``) as before.

The pure part (:func:`job_properties`) turns the sbatch options of
:func:`~gpuspawner.backends.slurm.job.plan_job` into v0.0.38 job properties, so both paths
submit the same job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .commands import SlurmError

__all__ = ["API", "REST_EXTRA_KEYS", "SlurmRestClient", "job_properties", "minutes"]

#: the OpenAPI plugin this client speaks (slurmrestd ``-s openapi/v0.0.38``)
API = "v0.0.38"

#: extra sbatch options (``c.SlurmBackend.extra_sbatch_options``) the REST path can pass on:
#: string properties of ``v0.0.38_job_properties`` with the same meaning as the sbatch option
REST_EXTRA_KEYS = frozenset({"account", "qos", "reservation", "wckey", "licenses",
                             "mail_user", "mail_type", "mcs_label"})

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def minutes(limit: str) -> int:
    """sbatch ``--time`` (sbatch(1): "minutes", "minutes:seconds", "hours:minutes:seconds",
    "days-hours", "days-hours:minutes", "days-hours:minutes:seconds") in whole minutes,
    rounded up, as v0.0.38's ``time_limit`` takes it.

    Raises:
        ValueError: not one of those forms.
    """
    m = _TIME.match(limit.strip())
    if not m:
        raise ValueError(f"time limit {limit!r} is not an sbatch --time value")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # hours:minutes:seconds
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # minutes[:seconds]
        secs = int(a) * 60 + int(b or 0)
    return max(1, -(-secs // 60))


def _per_device(gres: str) -> bool:
    """Whether every entry of a ``--gres`` value names a per-device type (``gpu:gpu-...:1``,
    :func:`~gpuspawner.backends.slurm.gres.gres_type`), which exists on one node only."""
    entries = [e for e in gres.split(",") if e]
    return bool(entries) and all(
        len(p := e.split(":")) == 3 and p[1].startswith("gpu-") for e in entries)


def job_properties(options: Sequence[str], environment: Mapping[str, str], *,
                   node: str, node_constraint: str = "") -> dict[str, Any]:
    """The v0.0.38 ``job`` object of the sbatch ``options`` that
    :func:`~gpuspawner.backends.slurm.job.plan_job` made.

    Args:
        options: ``--name=value`` options and the flags ``--hold``, ``--no-requeue``.
        environment: the job's environment (v0.0.38 requires one; sbatch's ``--export=ALL``
            gives the submitting environment, which the CLI path keeps to ``PATH``,
            ``LANG`` and ``SLURM_CONF``).
        node: the allocation's node (``--nodelist``), for the messages.
        node_constraint: a node feature that only ``node`` has (``constraints``), "" for none.

    Returns:
        The properties (JSON-able).

    Raises:
        ValueError: an option v0.0.38 has no property for, or a job whose node nothing pins
            (no per-device GRES type and no ``node_constraint``).
    """
    job: dict[str, Any] = {"environment": dict(environment)}
    for opt in options:
        name, eq, value = opt.partition("=")
        key = name.lstrip("-").replace("-", "_")
        if name == "--hold":
            job["hold"] = True
        elif name == "--no-requeue":
            job["requeue"] = False
        elif name == "--export" and value == "ALL":
            pass  # the environment above
        elif name == "--nodelist":
            pass  # pinned below
        elif name == "--nodes":
            job["nodes"] = [int(value), int(value)]
        elif name == "--ntasks":
            job["tasks"] = int(value)
        elif name == "--cpus-per-task":
            job["cpus_per_task"] = int(value)
        elif name == "--mem":
            job["memory_per_node"] = int(value)
        elif name == "--job-name":
            job["name"] = value
        elif name == "--chdir":
            job["current_working_directory"] = value
        elif name == "--output":
            job["standard_output"] = value
        elif name in ("--gres", "--gres-flags", "--comment", "--partition"):
            job[key] = value
        elif name == "--time":
            job["time_limit"] = minutes(value)
        elif eq and key in REST_EXTRA_KEYS:
            job[key] = value
        else:
            raise ValueError(f"{opt!r}: slurmrestd {API} has no job property for this sbatch "
                             f"option (it passes on {', '.join(sorted(REST_EXTRA_KEYS))})")
    if node_constraint:
        job["constraints"] = node_constraint
    elif not _per_device(job.get("gres", "")):
        raise ValueError(
            f"slurmrestd {API} cannot name node {node} in a job (no node list in its job "
            "properties): only a per-device GRES type (exact mode with GPUs) pins it; give "
            "each node a feature of its own name and set c.SlurmBackend.rest_node_constraint "
            '= "{node}", or submit_via = "cli"')
    return job


class SlurmRestClient:
    """Submits batch jobs to slurmrestd's ``openapi/v0.0.38`` with a JWT.

    Args:
        url: slurmrestd's base URL, e.g. ``http://127.0.0.1:6820``.
        token: an awaitable factory of the token to send (``X-SLURM-USER-TOKEN``): root's or
            SlurmUser's, so that ``X-SLURM-USER-NAME`` may name the job's user. Called with
            ``renew=True`` once after a 401.
        timeout: seconds a request may take.
    """

    def __init__(self, url: str, token: Callable[[bool], Awaitable[str]],
                 timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    async def request(self, method: str, path: str, user: str,
                      body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One request to ``{url}/slurm/v0.0.38/{path}`` as ``user``; the JSON answer.

        Raises:
            SlurmError: returncode None when slurmrestd cannot be reached or timed out (the
                backend counts that as the controller being down); the HTTP status with
                Slurm's ``errors`` texts otherwise (an answer whose ``errors`` hold an
                ``error_code`` other than 0 or 2042, "Job is in held state", fails too).
        """
        argv = [method, f"{self.url}/slurm/{API}/{path}"]
        for attempt in (0, 1):
            req = HTTPRequest(
                argv[1], method=method,
                headers={"X-SLURM-USER-NAME": user,
                         "X-SLURM-USER-TOKEN": await self.token(attempt > 0),
                         "Content-Type": "application/json", "Accept": "application/json"},
                body=json.dumps(body) if body is not None else None,
                request_timeout=self.timeout, connect_timeout=self.timeout)
            try:
                resp = await AsyncHTTPClient().fetch(req, raise_error=False)
            except (OSError, HTTPClientError) as e:
                raise SlurmError(argv, None, f"slurmrestd unreachable: {e}") from None
            if resp.code == 599:  # tornado: no HTTP answer (timeout, connection refused)
                raise SlurmError(argv, None, f"slurmrestd unreachable: {resp.error}")
            if resp.code == 401 and attempt == 0:
                continue
            break
        text = resp.body.decode(errors="replace") if resp.body else ""
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {}
        errors = [e for e in data.get("errors") or [] if isinstance(e, dict)
                  and e.get("error_code", e.get("error_number", -1)) not in (0, 2042)]
        if resp.code >= 400 or errors:
            said = "; ".join(str(e.get("error") or e.get("description")) for e in errors)
            raise SlurmError(argv, resp.code, said or f"HTTP {resp.code}: {text[:200]}")
        return data

    async def submit(self, script: str, job: Mapping[str, Any], user: str) -> int:
        """``POST job/submit`` as ``user``; the new job's id.

        Raises:
            SlurmError: see :meth:`request`; ValueError: an answer without ``job_id``.
        """
        data = await self.request("POST", "job/submit", user, {"script": script, "job": job})
        job_id = data.get("job_id")
        if not isinstance(job_id, int):
            raise ValueError(f"slurmrestd answered no job_id: {data!r}"[:300])
        return job_id
