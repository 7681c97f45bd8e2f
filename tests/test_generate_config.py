"""``gpuspawner generate-config``: every option of the hub's configurable classes, commented,
as ``jupyterhub --generate-config`` writes JupyterHub's (the README names this command)."""

from __future__ import annotations

import re

import pytest

from gpuspawner.backends.docker_backend import DockerBackend
from gpuspawner.backends.slurm.backend import SlurmBackend
from gpuspawner.cli import generate_config, main
from gpuspawner.hub.auth import GPULDAPAuthenticator
from gpuspawner.hub.config_check import IGNORED_SPAWNER_OPTIONS
from gpuspawner.hub.jobs.settings import GPUJobs
from gpuspawner.hub.spawner import GPUSpawner
from gpuspawner.usage.settings import GPUUsage


@pytest.fixture(scope="module")
def text() -> str:
    return generate_config()


def _settings(text: str) -> set[str]:
    return set(re.findall(r"^# c\.(\w+\.\w+) = ", text, re.M))


@pytest.mark.parametrize("cls", [GPUSpawner, DockerBackend, SlurmBackend, GPULDAPAuthenticator,
                                 GPUJobs, GPUUsage])
def test_every_option_of_each_class_is_listed_under_its_name(text, cls):
    assert f"# {cls.__name__}(" in text  # its section header
    listed = {s.split(".", 1)[1] for s in _settings(text) if s.startswith(cls.__name__ + ".")}
    assert listed == set(cls.class_traits(config=True))


def test_sections_name_only_the_classes_an_admin_sets(text):
    """Mixins (SpawnerSettings, OptionsFormMixin) and bases (Spawner, LDAPAuthenticator) get
    no section of their own: their options are listed under the class that uses them."""
    classes = {s.split(".", 1)[0] for s in _settings(text)}
    assert classes == {"GPUSpawner", "DockerBackend", "SlurmBackend", "GPULDAPAuthenticator",
                       "GPUJobs", "GPUUsage"}
    assert "See also:" not in text


def test_ignored_spawner_options_name_the_profile_field(text):
    for name, field in IGNORED_SPAWNER_OPTIONS.items():
        block = text[:text.index(f"# c.GPUSpawner.{name} = ")].rsplit("\n\n", 1)[1]
        assert block.startswith(f"## Ignored by GPUSpawner: set the profile field '{field}'")


def test_units_are_in_the_help(text):
    assert "## Seconds a spawn may wait in the queue" in text
    assert "## Seconds one Docker API call may take" in text


def test_the_file_is_python_and_loads_as_a_config(tmp_path, text):
    from traitlets.config.loader import PyFileConfigLoader

    path = tmp_path / "jupyterhub_config.py"
    path.write_text(text)
    compile(text, str(path), "exec")
    assert PyFileConfigLoader(path.name, str(tmp_path)).load_config() == {}


def test_the_command_prints_it_and_the_cullers(tmp_path, capsys):
    assert main(["generate-config"]) == 0
    assert "# c.SlurmBackend.partition = ''" in capsys.readouterr().out
    out = tmp_path / "idle_culler_config.py"
    assert main(["generate-config", "--culler", "-o", str(out)]) == 0
    culler = out.read_text()
    assert "# c.IdleCuller.timeout = 3600" in culler
    assert "c.GPUSpawner" not in culler


@pytest.fixture(scope="module")
def jupyterhub_generated(tmp_path_factory) -> str:
    """What ``jupyterhub --generate-config -f FILE`` writes, run as an admin runs it: the
    spawner and authenticator come from the installed package's entry points."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path_factory.mktemp("generate-config") / "jupyterhub_config.py"
    jupyterhub = Path(sys.executable).with_name("jupyterhub")
    r = subprocess.run([str(jupyterhub), "--generate-config", "-f", str(out)],
                       cwd=out.parent, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out.read_text()


def test_jupyterhub_generate_config_has_no_mixin_sections(jupyterhub_generated):
    """The mixins GPUSpawner is made of (SpawnerSettings, OptionsFormMixin) have no section
    of their own: their options were printed twice, once as ``c.SpawnerSettings.*`` /
    ``c.OptionsFormMixin.*`` and once as ``c.GPUSpawner.*``."""
    classes = {s.split(".", 1)[0] for s in _settings(jupyterhub_generated)}
    assert "GPUSpawner" in classes and "GPULDAPAuthenticator" in classes
    # as the README says: not registered with JupyterHub, so only in gpuspawner generate-config
    assert not classes & {"DockerBackend", "SlurmBackend", "GPUJobs", "GPUUsage"}, classes
    assert not classes & {"SpawnerSettings", "OptionsFormMixin", "ProgressEvents"}, classes
    assert not re.search(r"^# (SpawnerSettings|OptionsFormMixin)\(", jupyterhub_generated, re.M)


def test_jupyterhub_generate_config_lists_every_gpuspawner_option_once(jupyterhub_generated):
    listed = re.findall(r"^# c\.GPUSpawner\.(\w+) = ", jupyterhub_generated, re.M)
    assert sorted(listed) == sorted(GPUSpawner.class_traits(config=True))
    assert len(listed) == len(set(listed))
    # the mixins' options are still set through GPUSpawner
    for name in ("profiles", "placement_policy", "profile_form_template",
                 "show_unavailable_profiles"):
        assert name in listed
