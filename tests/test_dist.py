"""What a site installs (issue 43): ``make dist`` (scripts/dist.sh) leaves in dist/ a wheel and
an sdist at pyproject.toml's version with the JupyterLab extension inside, and a wheelhouse
from which a fresh virtual environment with no index installs ``gpuspawner[hub]`` and runs
``jupyterhub --generate-config``, ``gpuspawner --help`` and ``idle-culler --help``
(docs/install.md). ``make test`` runs ``make dist`` first (it needs PyPI, through pip's cache);
the test itself reads only dist/ and installs with ``--no-index``."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "dist"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WHEEL = DIST / f"gpuspawner-{VERSION}-py3-none-any.whl"
SDIST = DIST / f"gpuspawner-{VERSION}.tar.gz"
LAB = "share/jupyter/labextensions/gpuspawner-labextension"


@pytest.fixture(scope="module")
def dist() -> Path:
    if not (WHEEL.is_file() and SDIST.is_file() and (DIST / "wheelhouse").is_dir()):
        pytest.fail(f"{WHEEL.name}, {SDIST.name} or dist/wheelhouse missing: run `make dist` "
                    "(make test runs it)")
    return DIST


def test_the_wheel_and_the_sdist_carry_the_version_and_the_lab_extension(dist: Path) -> None:
    names = zipfile.ZipFile(WHEEL).namelist()
    data = f"gpuspawner-{VERSION}.data/data/"
    for want in (f"{LAB}/package.json", f"{LAB}/install.json", f"{LAB}/static/style.js",
                 f"{LAB}/schemas/gpuspawner-labextension/plugin.json",
                 "etc/jupyter/jupyter_server_config.d/gpuspawner.json"):
        assert data + want in names, want
    assert "gpuspawner/hub/spawner.py" in names and "idle_culler/__main__.py" in names
    meta = zipfile.ZipFile(WHEEL).read(f"gpuspawner-{VERSION}.dist-info/METADATA").decode()
    assert f"Version: {VERSION}\n" in meta and "Provides-Extra: hub" in meta
    with tarfile.open(SDIST) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    # the sources and the prebuilt extension: a wheel built from the sdist needs no Node.js
    for want in ("pyproject.toml", "labextension/package.json", "labextension/src/index.ts",
                 "gpuspawner/labextension_static/package.json", "CHANGELOG.md"):
        assert want in members, want
    assert not any(m.startswith(("labextension/node_modules/", "var/")) for m in members)


def test_the_changelog_names_the_version(dist: Path) -> None:
    """The versioning rule (docs/changelog.md): the version in pyproject.toml is a released
    section of CHANGELOG.md, or the one the Unreleased section says comes next."""
    text = (REPO / "CHANGELOG.md").read_text()
    assert f"## [{VERSION}]" in text or f"The next release is {VERSION}" in text


def test_a_fresh_environment_installs_the_wheel_offline_and_runs_it(dist: Path,
                                                                     tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, bin_ = venv / "bin" / "python", venv / "bin"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-index", "--find-links", str(dist / "wheelhouse"),
                        f"gpuspawner[hub]=={VERSION}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

    def run(*cmd: str) -> str:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120,
                           cwd=tmp_path)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        return r.stdout + r.stderr

    assert "usage: gpuspawner" in run(str(bin_ / "gpuspawner"), "--help")
    assert "idle" in run(str(bin_ / "idle-culler"), "--help").lower()
    run(str(bin_ / "jupyterhub"), "--generate-config", "-f", str(tmp_path / "hub_config.py"))
    assert "c.JupyterHub.spawner_class" in (tmp_path / "hub_config.py").read_text()
    config = run(str(bin_ / "gpuspawner"), "generate-config")
    assert "c.GPUSpawner.profiles" in config and "c.DockerBackend." in config
    # JupyterHub finds the spawner and the authenticator by their entry-point names
    out = run(str(py), "-c", "from importlib.metadata import entry_points as e;"
              "print(e(group='jupyterhub.spawners')['gpu'].load().__name__,"
              " e(group='jupyterhub.authenticators')['gpu-ldap'].load().__name__)")
    assert out.split() == ["GPUSpawner", "GPULDAPAuthenticator"]
    assert (venv / LAB / "install.json").is_file()
    assert (venv / "etc/jupyter/jupyter_server_config.d/gpuspawner.json").is_file()
