"""Fixtures shared by several test modules, and how ``make test`` runs the suite in parallel.

``make test`` runs pytest with pytest-xdist (``-n``, ``--dist loadgroup``). Each test module is
one group (its module-scoped hub, engine objects and images stay on one worker); every Slurm-
marked test is in the one group ``slurm`` (one shared three-node cluster with a few fake GPUs:
two modules spawning at once would wait on each other's GPUs). Groups are handed out longest
first, by the seconds measured per module in ``tests/data/module_seconds.json`` (a module not
listed there counts by its markers), so that the longest groups do not start last.

Tests marked ``exclusive`` change what every other test relies on (the host's isolation
firewall rule): ``make test`` runs them after the parallel part, alone (``-m exclusive``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ldap_server import slapd  # noqa: F401  (a private slapd for the LDAP tests)

SECONDS_FILE = Path(__file__).parent / "data" / "module_seconds.json"
HEAVY_MARKS = ("docker", "hub", "browser", "ldap", "slurm", "slow")


def _group(item: pytest.Item) -> str:
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    return item.nodeid.split("::", 1)[0]


def _default_seconds(items: list[pytest.Item]) -> float:
    heavy = sum(1 for i in items if any(i.get_closest_marker(m) for m in HEAVY_MARKS))
    return 20.0 * heavy + 0.1 * (len(items) - heavy)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test its xdist group and order the groups longest first (stable within)."""
    try:
        measured: dict[str, float] = json.loads(SECONDS_FILE.read_text())
    except (OSError, ValueError):
        measured = {}
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(_group(item), []).append(item)

    def seconds(name: str) -> float:
        if name == "slurm":
            return sum(measured.get(m, 0.0) for m in measured if "slurm" in m) or 600.0
        return measured.get(name, _default_seconds(groups[name]))

    order = sorted(groups, key=seconds, reverse=True)
    items[:] = [i for name in order for i in groups[name]]
    for name, members in groups.items():
        for item in members:
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(name=name))


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Captured output with a lone surrogate (a test that feeds one to the hub, which logs
    it) cannot travel from an xdist worker (execnet sends UTF-8 only): escape it."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(_utf8(title), _utf8(text)) for title, text in report.sections]
