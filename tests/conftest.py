"""Fixtures shared by several test modules, and the order in which ``make test`` runs modules.

``make test`` runs the Slurm-marked tests in one process (one shared three-node cluster: two
hubs on it at once sweep each other's jobs) beside a pytest-xdist run of the others
(``-n``, ``--dist loadfile``: each module whole on one worker, so its module-scoped hub, engine
objects and user names are never split). Modules are handed out longest first, by the seconds
measured per module in ``tests/data/module_seconds.json`` (a module not listed counts by its
markers), so that the longest do not start last (``--no-loadscope-reorder`` keeps this order).

Tests marked ``exclusive`` change what every other test relies on (the host's isolation
firewall rule): ``make test`` runs them after the rest, alone (``-m exclusive``).

(pytest-xdist's ``--dist loadgroup`` would suit better, but with pytest 9 its group suffix is
lost: it sets ``item._nodeid``, which pytest 9 no longer reads.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.inprocess_hub import inprocess_hub, responder  # noqa: F401  (the in-process hub)
from tests.ldap_server import slapd  # noqa: F401  (a private slapd for the LDAP tests)

SECONDS_FILE = Path(__file__).parent / "data" / "module_seconds.json"
HEAVY_MARKS = ("docker", "hub", "browser", "ldap", "slurm", "slow")


def _default_seconds(items: list[pytest.Item]) -> float:
    heavy = sum(1 for i in items if any(i.get_closest_marker(m) for m in HEAVY_MARKS))
    return 20.0 * heavy + 0.1 * (len(items) - heavy)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the modules longest first (tests keep their order within a module)."""
    try:
        measured: dict[str, float] = json.loads(SECONDS_FILE.read_text())
    except (OSError, ValueError):
        measured = {}
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules, key=lambda m: measured.get(m, _default_seconds(modules[m])),
                   reverse=True)
    items[:] = [i for name in order for i in modules[name]]


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Captured output with a lone surrogate (a test that feeds one to the hub, which logs
    it) cannot travel from an xdist worker (execnet sends UTF-8 only): escape it."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(_utf8(title), _utf8(text)) for title, text in report.sections]
