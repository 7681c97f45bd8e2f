"""The ``gpuspawner health``, ``drain-gpu`` and ``undrain-gpu`` subcommands.

* ``gpuspawner health [--listen S] [--gpu UUID ...] [--max-uncorrected-ecc N]
  [--max-retired-pages N] [--xids 48,63,...] [--exit-code]``: read this host's GPU health
  through NVML (:mod:`gpuspawner.inventory.health`) and print it as JSON,
  ``{"node": HOST, "healthy": bool, "gpus": [GPUHealth.to_dict(), ...]}``: what a site runs on
  each node (cron, a Slurm prolog/epilog, a job). ``--listen S`` waits S seconds for XID events
  first (NVML delivers only events that happen while it listens). Exit status 0; with
  ``--exit-code``, 3 when a GPU is unhealthy.
* ``gpuspawner drain-gpu UUID --reason TEXT`` / ``gpuspawner undrain-gpu UUID``: ask the hub's
  gpuspawner service (``POST``/``DELETE api/gpus/{uuid}/drain``, docs/service.md) to take a GPU
  out of placement or give it back, with a hub admin's API token (``--token`` or the
  environment's ``JUPYTERHUB_API_TOKEN``) at ``--hub-url`` (default http://127.0.0.1:8000);
  prints the GPU's drain state as JSON. Exit status 1 with the hub's message for 401, 403
  (not an admin), 404 (no node has that GPU) and an unreachable hub.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .inventory.health import DEFAULT_XIDS, HealthThresholds, read_health

__all__ = ["add_subcommands", "service_call"]

#: exit status of ``gpuspawner health --exit-code`` when a GPU is unhealthy
UNHEALTHY = 3


def _cmd_health(args: argparse.Namespace) -> int:
    try:
        xids = frozenset(int(x) for x in args.xids.split(",") if x.strip()) \
            if args.xids is not None else frozenset(DEFAULT_XIDS)
    except ValueError:
        print(f"gpuspawner health: --xids: not a comma-separated list of numbers: "
              f"{args.xids!r}", file=sys.stderr)
        return 2
    thresholds = HealthThresholds(max_uncorrected_ecc=args.max_uncorrected_ecc,
                                  max_retired_pages_dbe=args.max_retired_pages, xids=xids)
    out = read_health(thresholds=thresholds, listen_s=args.listen, uuids=args.gpu or None)
    healthy = all(h.healthy for h in out)
    doc = {"node": args.name or socket.gethostname(), "healthy": healthy,
           "gpus": [h.to_dict() for h in out]}
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return UNHEALTHY if args.exit_code and not healthy else 0


def service_call(hub_url: str, prefix: str, method: str, path: str, token: str,
                 body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """One call of the hub's gpuspawner service: ``(HTTP status, decoded JSON body)``.

    Raises:
        OSError: the hub cannot be reached (``urllib.error.URLError`` and socket errors).
    """
    url = hub_url.rstrip("/") + "/" + prefix.strip("/") + "/" + path.lstrip("/")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"token {token}", "Content-Type": "application/json",
        "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"status": e.code, "message": raw.decode(errors="replace")[:500]}


def _drain(args: argparse.Namespace, method: str) -> int:
    name = "drain-gpu" if method == "POST" else "undrain-gpu"
    token = args.token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not token:
        print(f"gpuspawner {name}: no token: give --token or set JUPYTERHUB_API_TOKEN "
              "(a hub admin's API token)", file=sys.stderr)
        return 1
    body = {"reason": args.reason} if method == "POST" else None
    path = f"api/gpus/{urllib.parse.quote(args.uuid, safe='')}/drain"
    try:
        status, answer = service_call(args.hub_url, args.service_prefix, method, path, token,
                                      body)
    except OSError as e:
        print(f"gpuspawner {name}: cannot reach the hub at {args.hub_url}: {e}",
              file=sys.stderr)
        return 1
    if status == 200:
        sys.stdout.write(json.dumps(answer, indent=1, sort_keys=True) + "\n")
        return 0
    message = answer.get("message") if isinstance(answer, dict) else None
    hint = {401: "the hub does not know this token",
            403: "this needs a hub admin's token",
            404: "no node of the hub has this GPU (see api/nodes)"}.get(status, "")
    print(f"gpuspawner {name}: HTTP {status}: {message or answer}"
          + (f" ({hint})" if hint else ""), file=sys.stderr)
    return 1


def _add_hub_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hub-url", default="http://127.0.0.1:8000",
                   help="the hub's public URL (default http://127.0.0.1:8000)")
    p.add_argument("--service-prefix", default="/services/gpuspawner/",
                   help="the service's path on the hub (default /services/gpuspawner/)")
    p.add_argument("--token", default=None,
                   help="a hub admin's API token (default: $JUPYTERHUB_API_TOKEN)")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add ``health``, ``drain-gpu`` and ``undrain-gpu`` to the ``gpuspawner`` command."""
    p = sub.add_parser("health", help="this host's GPU health (NVML) as JSON",
                       description="Read every GPU's ECC errors, retired pages, remapped rows "
                       "and XID events through NVML and print the verdict as JSON.")
    p.add_argument("--name", default=None, help="node name to print (default: host name)")
    p.add_argument("--listen", type=float, default=0.0, metavar="S",
                   help="listen S seconds for XID events before reading (default 0)")
    p.add_argument("--gpu", action="append", metavar="UUID", help="only this GPU (repeat)")
    p.add_argument("--max-uncorrected-ecc", type=int, default=0, metavar="N",
                   help="volatile uncorrected ECC errors a healthy GPU may have (default 0)")
    p.add_argument("--max-retired-pages", type=int, default=59, metavar="N",
                   help="pages retired for double-bit ECC errors a healthy GPU may have "
                   "(default 59)")
    p.add_argument("--xids", default=None, metavar="LIST",
                   help="comma-separated XIDs that make a GPU unhealthy "
                   "(default 48,63,64,74,79,92,94,95)")
    p.add_argument("--exit-code", action="store_true",
                   help=f"exit with status {UNHEALTHY} when a GPU is unhealthy")
    p.set_defaults(func=_cmd_health)

    p = sub.add_parser("drain-gpu", help="take a GPU out of placement (hub REST call)",
                       description="Ask the hub to place no new server on a GPU; servers on "
                       "it keep running. Kept across hub restarts.")
    p.add_argument("uuid", metavar="UUID", help="the GPU's UUID (GPU-...)")
    p.add_argument("--reason", required=True, help="why (shown on the admin map)")
    _add_hub_arguments(p)
    p.set_defaults(func=lambda a: _drain(a, "POST"))

    p = sub.add_parser("undrain-gpu", help="give a drained GPU back to placement",
                       description="Ask the hub to place servers on a drained GPU again.")
    p.add_argument("uuid", metavar="UUID", help="the GPU's UUID (GPU-...)")
    _add_hub_arguments(p)
    p.set_defaults(func=lambda a: _drain(a, "DELETE"))
