"""What the wheel ships beside the Python code: the lab extension as the JupyterLab extension
template ships it (the prebuilt extension under
``share/jupyter/labextensions/gpuspawner-labextension/`` with its ``install.json``, which
``jupyter labextension list`` and JupyterLab's extension manager read to say "installed by pip,
package gpuspawner" and how to uninstall it), and the idle culler.

The wheel is built for real (``pip wheel --no-deps``, hatchling from the configured package
index) from the prebuilt output in ``gpuspawner/labextension_static`` (``make labext``); the
npm build hook is skipped (``SKIP_JUPYTER_BUILDER=1``) so the test takes seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "labextension"
SHARE = "share/jupyter/labextensions/gpuspawner-labextension"


def test_install_json_is_the_templates():
    """``labextension/install.json`` names the Python package that installs the extension."""
    data = json.loads((EXT / "install.json").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert data == {
        "packageManager": "python",
        "packageName": project,
        "uninstallInstructions": "Use your Python package manager (pip, conda, etc.) to "
                                 f"uninstall the package {project}",
    }
    assert json.loads((EXT / "package.json").read_text())["name"] == SHARE.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    assert (ROOT / "gpuspawner/labextension_static/package.json").exists(), (
        "gpuspawner/labextension_static is not built: run make labext")
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "SKIP_JUPYTER_BUILDER": "1", "PIP_NO_INPUT": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                        str(ROOT)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("gpuspawner-*.whl")
    return zipfile.ZipFile(whl)


def test_the_wheel_ships_install_json_beside_the_prebuilt_extension(wheel):
    names = wheel.namelist()
    ext = {n.split(f"/data/{SHARE}/", 1)[1] for n in names if f"/data/{SHARE}/" in n}
    assert "package.json" in ext and "install.json" in ext, sorted(ext)
    (path,) = [n for n in names if n.endswith(f"/data/{SHARE}/install.json")]
    assert json.loads(wheel.read(path)) == json.loads((EXT / "install.json").read_text())


def test_the_wheel_ships_the_idle_culler(wheel):
    """idle_culler/README.md says a non-editable install runs the culler: its package, its
    page template and the ``idle-culler`` command are in the same wheel."""
    names = set(wheel.namelist())
    assert {"idle_culler/__main__.py", "idle_culler/templates/index.html.j2"} <= names
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "idle-culler = idle_culler.__main__:main" in wheel.read(ep).decode()
