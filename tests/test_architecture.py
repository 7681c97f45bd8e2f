"""The layer contracts of pyproject.toml ([tool.importlinter], run by ``make lint``) hold on the
tree, and would catch a forbidden import: a scratch copy of the packages with one added import
breaks the named contract (docs/architecture.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed "
                                "(make venv)")


def scratch_copy(tmp: Path) -> Path:
    for pkg in ("gpuspawner", "idle_culler"):
        shutil.copytree(REPO / pkg, tmp / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "labextension_static"))
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_contracts_hold_on_the_tree(tmp_path):
    r = lint(scratch_copy(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("gpuspawner/placement/model.py", "import yaml", "placement is pure"),
    ("gpuspawner/placement/ledger.py", "from gpuspawner.hub import cluster",
     "placement is pure"),
    ("gpuspawner/inventory/topology.py", "import gpuspawner.hub.spawner", "layers"),
    ("gpuspawner/singleuser/kernel.py", "from gpuspawner.placement import model",
     "the single-user side knows nothing"),
    ("gpuspawner/schemas/__init__.py", "import yaml", "the configuration schemas are a leaf"),
    ("gpuspawner/schemas/__init__.py", "from gpuspawner.placement import units",
     "the configuration schemas are a leaf"),
    ("gpuspawner/simulate/engine.py", "from gpuspawner.backends import base",
     "the simulator uses placement, never the hub or an engine"),
    ("gpuspawner/server_state.py", "from gpuspawner.placement import model",
     "the server state accessor is a leaf"),
    ("idle_culler/netstats.py", "from gpuspawner.backends import docker_backend",
     "the idle culler is its own service"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    root = scratch_copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}  # added by the test\n")
    r = lint(root)
    assert r.returncode != 0, r.stdout
    broken = r.stdout.split("Broken contracts", 1)[1]
    assert contract in broken, r.stdout
