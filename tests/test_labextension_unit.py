"""Unit tests of the lab extension's data logic and settings handling (labextension/src/model.ts;
test/model.test.ts, test/settings.test.ts): ``npm test`` in labextension/ compiles them with tsc
and runs them with node's built-in test runner. Skips when labextension/node_modules is absent
(scripts/build-labextension.sh --deps installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[1] / "labextension"


def test_model_unit_tests():
    if not (EXT / "node_modules" / "typescript").exists():
        pytest.skip("labextension/node_modules is absent (scripts/build-labextension.sh --deps)")
    if not shutil.which("npm"):
        pytest.skip("npm is not installed (scripts/install-chp.sh --node-only)")
    p = subprocess.run(["npm", "test", "--silent"], cwd=EXT, capture_output=True, text=True,
                       timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    passed = re.search(r"^# pass (\d+)", out, re.M)
    failed = re.search(r"^# fail (\d+)", out, re.M)
    assert passed and failed, out[-3000:]
    assert int(failed.group(1)) == 0
    assert int(passed.group(1)) >= 30, out[-3000:]
