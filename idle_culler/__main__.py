"""``python -m idle_culler`` / ``idle-culler``: the service, or ``idle-culler explain``."""

from __future__ import annotations

import argparse
import json
import sys

from .policies import PolicyError, PolicySet


def explain(argv: list[str]) -> int:
    """Print the effective policy of a user as JSON, with the source of each value."""
    ap = argparse.ArgumentParser(prog="idle-culler explain",
                                 description="Effective cull policy of a user, with sources.")
    ap.add_argument("--policies", help="YAML policy file (the shipped one)")
    ap.add_argument("--overrides", help="the service's overrides file (admins' changes), "
                    "merged over --policies")
    ap.add_argument("--user", required=True)
    ap.add_argument("--groups", default="", help="comma-separated group names")
    ap.add_argument("--timeout", type=float, default=3600.0,
                    help="the service's --timeout (seconds)")
    ap.add_argument("--max-age", type=float, default=0.0, help="the service's --max-age (s)")
    a = ap.parse_args(argv)
    groups = [g for g in a.groups.split(",") if g]
    try:
        ps = PolicySet.load(a.policies, {"idle_timeout": a.timeout, "max_age": a.max_age},
                            overrides=a.overrides)
    except PolicyError as e:
        print(f"idle-culler explain: {e}", file=sys.stderr)
        return 2
    pol = ps.resolve(a.user, groups)
    print(json.dumps({"user": a.user, "groups": groups, "policies": a.policies,
                      "policy": pol.to_json()}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "explain":
        sys.exit(explain(argv[1:]))
    from .app import IdleCuller

    IdleCuller.launch_instance(argv)


if __name__ == "__main__":
    main()
