"""``gpuspawner usage``: a usage report read straight from the usage database, for the hub's
admin on the hub's machine (the file is the hub's, mode 0600: whoever can read it reads every
user's records). The options are ``GET api/usage``'s (:mod:`gpuspawner.usage.report`); the
database is opened read-only as to its schema (one not at this gpuspawner's revision is
refused, never migrated).

Exit status: 0, 1 when the database cannot be read, 2 for a bad option (the message names
it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

from .report import GROUP_KEYS, ReportError, parse_query, report_from_store, to_csv
from .settings import USAGE_DB_FILE
from .store import UsageStore, UsageStoreError

__all__ = ["add_subcommands", "run"]

#: the environment variable naming the database when ``--db`` is not given
DB_ENV = "GPUSPAWNER_USAGE_DB"


def db_url(value: str) -> str:
    """A SQLAlchemy URL from ``--db``: a URL as it is, a path as ``sqlite:///ABSPATH``."""
    return value if "://" in value else "sqlite:///" + os.path.abspath(value)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add ``usage`` to the ``gpuspawner`` command."""
    p = sub.add_parser(
        "usage",
        help="usage report from the usage database (admins, on the hub's machine)",
        description="Usage records of servers and notebook jobs: what was reserved and used, "
        "per record or grouped (docs/usage.md).",
    )
    p.add_argument(
        "--db",
        default=os.environ.get(DB_ENV, USAGE_DB_FILE),
        help=f"the usage database: a path (default ${DB_ENV}, else ./{USAGE_DB_FILE};"
        " the hub's is in GPUSpawner.state_dir) or a SQLAlchemy URL",
    )
    p.add_argument(
        "--from",
        dest="from_",
        default="",
        metavar="WHEN",
        help="start: YYYY-MM-DD or an ISO 8601 time (default: this month's start)",
    )
    p.add_argument("--to", default="", metavar="WHEN", help="end (default: now)")
    p.add_argument(
        "--group-by",
        default="",
        metavar="KEYS",
        help=f"comma-separated: {', '.join(GROUP_KEYS)} (default: the records)",
    )
    p.add_argument("--user", default="", help="only this user's records")
    p.add_argument("--tz", default="UTC", help="time zone of days and times (IANA name)")
    p.add_argument("--format", default="table", choices=("table", "json", "csv"))
    p.add_argument(
        "--retention-days",
        type=int,
        default=None,
        help="refuse a --from older than this many days (c.GPUUsage.retention_days)",
    )
    p.set_defaults(func=run)


def _table(report: dict[str, Any]) -> str:
    rows = list(csv.reader(to_csv(report).splitlines()))
    if len(rows) <= 1:
        return "no usage records in this range\n"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


def run(args: argparse.Namespace) -> int:
    """Print the report. Returns the exit status."""
    query = {
        "from": args.from_,
        "to": args.to,
        "group_by": args.group_by,
        "user": args.user,
        "tz": args.tz,
    }
    try:
        q = parse_query(query, retention_days=args.retention_days)
    except ReportError as e:
        print(
            f"gpuspawner usage: --{e.field.replace('_', '-')}: {str(e).split(': ', 1)[1]}",
            file=sys.stderr,
        )
        return 2
    try:
        store = UsageStore(db_url(args.db), upgrade=False)
    except UsageStoreError as e:
        print(f"gpuspawner usage: {e}", file=sys.stderr)
        return 1
    try:
        report = report_from_store(store, q)
    finally:
        store.close_store()
    if args.format == "json":
        sys.stdout.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    elif args.format == "csv":
        sys.stdout.write(to_csv(report))
    else:
        sys.stdout.write(_table(report))
    return 0
