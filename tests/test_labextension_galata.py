"""The galata (Playwright) UI tests of the lab extension: ``npx playwright test`` in
labextension/ui-tests, in Debian's Chromium, against two JupyterLab servers from this venv that
playwright.config.js starts with the gpuviews server extension on NVML test doubles.

They check, in a real browser: the status bar item shows the (fake) GPUs' values; the settings
of schema/plugin.json change the GPUs shown and the units live; ``pollInterval``, set through
the setting registry and through the Settings Editor's form, changes how often the open panel
polls ``api/gpuspawner/metrics`` (requests counted with Playwright's request events); a
CPU-only session (no NVML, an allocation without GPUs) shows a neutral "GPU: no GPU".

Skips with a reason when the extension is not built (scripts/build-labextension.sh), the
ui-tests' node_modules are missing (scripts/build-labextension.sh --ui-deps; ``make test`` runs
it), node is missing, or /usr/bin/chromium is missing (make test-tools).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hubrunner import free_port

REPO = Path(__file__).resolve().parents[1]
UI = REPO / "labextension" / "ui-tests"
BUILT = REPO / "gpuspawner" / "labextension_static"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
JUPYTER = Path(sys.executable).parent / "jupyter"
#: the specs in labextension/ui-tests/tests (a test that disappears must be noticed)
EXPECTED_TESTS = 6


def _skip_reasons() -> list[str]:
    reasons = []
    if not (BUILT / "package.json").exists():
        reasons.append("the lab extension is not built (scripts/build-labextension.sh)")
    if not (UI / "node_modules" / "@jupyterlab" / "galata").exists():
        reasons.append("labextension/ui-tests/node_modules has no @jupyterlab/galata "
                       "(scripts/build-labextension.sh --ui-deps)")
    if not shutil.which("node"):
        reasons.append("node is not installed (scripts/install-chp.sh --node-only)")
    if not os.access(CHROMIUM, os.X_OK):
        reasons.append(f"{CHROMIUM} is missing (make test-tools)")
    if not JUPYTER.exists():
        reasons.append("jupyter is not installed in the venv (make venv)")
    return reasons


pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(bool(_skip_reasons()), reason="; ".join(_skip_reasons()))]


def test_galata_ui_tests(tmp_path):
    report = UI / "playwright-report" / "results.json"
    report.unlink(missing_ok=True)
    # the servers' Jupyter dirs, root and workspaces dirs (mkdtemp) land in pytest's tmp_path
    env = dict(os.environ, TMPDIR=str(tmp_path), CHROMIUM=CHROMIUM, JUPYTER=str(JUPYTER),
               GALATA_PORT_GPU=str(free_port()), GALATA_PORT_CPU=str(free_port()),
               PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1", CI="1")
    p = subprocess.run([str(UI / "node_modules" / ".bin" / "playwright"), "test"], cwd=UI,
                       env=env, capture_output=True, text=True, timeout=540)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-8000:]
    stats = json.loads(report.read_text())["stats"]
    assert stats["unexpected"] == 0 and stats["flaky"] == 0, (stats, out[-4000:])
    assert stats["skipped"] == 0, (stats, out[-4000:])
    assert stats["expected"] == EXPECTED_TESTS, (stats, out[-4000:])
