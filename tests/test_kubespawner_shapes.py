"""Shapes that carry over from other spawners (issue 43 item 4): KubeSpawner's
``profile_list`` (and Zero to JupyterHub's examples of it) and DockerSpawner's ``volumes``,
``read_only_volumes`` and ``pull_policy``. Each is either accepted and mapped onto this
spawner's settings, or refused when the hub starts (:func:`check_hub_config`, as the shipped
``jupyterhub_config.py`` calls it) naming the key that has no meaning here."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.docker_backend import DockerBackend
from gpuspawner.hub import profiles as profiles_module
from gpuspawner.hub.cluster import reset_clusters
from gpuspawner.hub.config_check import check_hub_config
from gpuspawner.hub.profiles import ProfileConfigError, load_profiles
from gpuspawner.hub.settings import SpawnerSettings, spawner_values
from gpuspawner.hub.spawner import GPUSpawner
from gpuspawner.hub.volumes import mounts_for, site_volumes

DATA = Path(__file__).parent / "data" / "kubespawner"
Z2JH = DATA / "z2jh-profiles.yaml"


@pytest.fixture
def hub_config(tmp_path: Path) -> Iterator[Config]:
    """A hub's config with its own state folder; the clusters the check builds are dropped
    after the test."""
    reset_clusters()
    c = Config()
    c.GPUSpawner.state_dir = str(tmp_path / "state")
    yield c
    reset_clusters()


def refusal(c: Config) -> str:
    """The reason ``check_hub_config`` stops the hub with."""
    with pytest.raises(SystemExit) as e:
        check_hub_config(c)
    return str(e.value)


def kubespawner_help_example() -> list[dict[str, Any]]:
    return yaml.safe_load((DATA / "kubespawner-help.yaml").read_text())


# --- KubeSpawner's profile_list ------------------------------------------------------------

def test_the_zero_to_jupyterhub_example_profile_list_loads() -> None:
    """The chart values file of Z2JH's docs (singleuser.profileList) as the profiles file:
    slugs made from the display names as KubeSpawner makes them, images and the GPU count
    from kubespawner_override."""
    profiles = {p.slug: p for p in load_profiles(Z2JH)}
    assert list(profiles) == ["minimal-environment", "datascience-environment",
                              "spark-environment", "gpu-server"]
    minimal = profiles["minimal-environment"]
    assert minimal.default and minimal.display_name == "Minimal environment"
    assert minimal.description == "To avoid too much bells and whistles: Python."
    assert minimal.image == ""  # c.GPUSpawner.image, as singleuser.image in the chart
    assert profiles["datascience-environment"].image == \
        "jupyter/datascience-notebook:2343e33dec46"
    assert profiles["spark-environment"].image == "jupyter/all-spark-notebook:2343e33dec46"
    gpu = profiles["gpu-server"]
    assert (gpu.bundle.gpus, gpu.bundle.gpu_milli) == (1, 0)
    assert gpu.queue  # a GPU profile waits in line, as ours do
    assert gpu.description == "Spawns a notebook server with access to a GPU"


def test_the_zero_to_jupyterhub_example_starts_a_hub_as_profile_list(
        hub_config: Config) -> None:
    """``c.GPUSpawner.profile_list`` (KubeSpawner's name) passes the start-up check, and the
    spawner, the REST service and jobs (spawner_values) see it as ``profiles``."""
    hub_config.GPUSpawner.profile_list = str(Z2JH)
    check_hub_config(hub_config)
    spawner = GPUSpawner(config=hub_config)
    assert spawner.profiles == str(Z2JH)

    class App:
        spawner_class = GPUSpawner
        config = hub_config

    assert spawner_values(App(), ("profiles",))["profiles"] == str(Z2JH)


def test_a_kubernetes_only_key_of_the_zero_to_jupyterhub_example_stops_the_hub(
        hub_config: Config) -> None:
    """The fourth profile of the same Z2JH example sets lifecycle_hooks (a Kubernetes
    container hook): refused at start, the file, profile and key named."""
    hub_config.GPUSpawner.profile_list = str(DATA / "z2jh-lifecycle-hooks.yaml")
    reason = refusal(hub_config)
    assert "singleuser.profileList[0] (learning-data-science).kubespawner_override." \
           "lifecycle_hooks: has no meaning on this spawner" in reason


def test_kubespawners_own_help_example_loads_and_default_url_is_refused() -> None:
    """KubeSpawner's profile_list help example: the image option with choices (KubeSpawner's
    kubespawner_override form), an unlisted choice with display_name_in_choices, and
    extra_resource_guarantees for nvidia.com/gpu; its default_url override names what to
    set instead."""
    example = kubespawner_help_example()
    with pytest.raises(ProfileConfigError, match=r"profiles\[0\] \(demo-1\)\."
                       r"kubespawner_override\.default_url: has no meaning on this spawner "
                       r"per profile; set c\.Spawner\.default_url"):
        load_profiles(example)
    del example[0]["kubespawner_override"]
    demo1, demo2 = load_profiles(example)
    assert demo1.default and demo1.description.startswith("Demo description")
    option = demo1.image_option
    assert option is not None
    assert [(c.key, c.image, c.default) for c in option.choices] == [
        ("base", "jupyter/base-notebook:latest", False),
        ("minimal", "jupyter/minimal-notebook:latest", True)]
    assert option.unlisted and option.unlisted_display_name == "Other image"
    assert option.validation_regex == "^jupyter/.+:.+$"
    assert (demo2.slug, demo2.bundle.gpus) == ("demo-2", 1)


def test_kubespawner_override_resources_map_onto_the_bundle() -> None:
    (p,) = load_profiles([{
        "display_name": "A100 (large)", "description": "Two GPUs",
        "kubespawner_override": {
            "image": "registry.example/ml:1", "cpu_limit": 8, "cpu_guarantee": 4,
            "mem_limit": "64G", "mem_guarantee": "32G",
            "extra_resource_limits": {"nvidia.com/gpu": 2},
            "extra_resource_guarantees": {"nvidia.com/gpu": "2"}}}])
    assert p.slug == "a100-large" == profiles_module.kubespawner_slug("A100 (large)")
    assert p.image == "registry.example/ml:1"
    # cores are pinned: the limit is what the server gets
    assert (p.bundle.cores, p.bundle.memory_bytes, p.bundle.gpus) == (8, 64 << 30, 2)
    (g,) = load_profiles([{"slug": "g", "kubespawner_override": {
        "cpu_guarantee": 2.0, "mem_guarantee": "1G"}}])
    assert (g.bundle.cores, g.bundle.memory_bytes) == (2, 1 << 30)


@pytest.mark.parametrize("override, message", [
    ({"node_selector": {"gpu": "a100"}},
     r"\(x\)\.kubespawner_override\.node_selector: has no meaning on this spawner; use "
     r"nodes/gpu_models"),
    ({"tolerations": [{"key": "gpu", "operator": "Exists"}]},
     r"kubespawner_override\.tolerations: has no meaning on this spawner; use nodes/gpu_models"),
    ({"lifecycle_hooks": {}},
     r"kubespawner_override\.lifecycle_hooks: has no meaning on this spawner; "
     r"kubespawner_override may set: image, cpu_limit"),
    ({"environment": {"A": "1"}}, r"kubespawner_override\.environment: .*c\.Spawner\."
                                  r"environment"),
    ({"cpu_limit": 0.5}, r"kubespawner_override\.cpu_limit: must be a whole number of cores"),
    ({"extra_resource_limits": {"amd.com/gpu": 1}},
     r"kubespawner_override\.extra_resource_limits\.amd\.com/gpu: has no meaning on this "
     r"spawner; only nvidia\.com/gpu"),
    ({"extra_resource_limits": {"nvidia.com/gpu": 0.5}},
     r"nvidia\.com/gpu: must be a whole number of GPUs"),
    ({"extra_resource_limits": {"nvidia.com/gpu": 2},
      "extra_resource_guarantees": {"nvidia.com/gpu": 1}},
     r"extra_resource_guarantees\.nvidia\.com/gpu: differs from extra_resource_limits"),
])
def test_kubespawner_override_keys_without_meaning_here_are_refused(
        override: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileConfigError, match=r"^profiles\[0\] " + message
                       if message.startswith(r"\(") else message):
        load_profiles([{"slug": "x", "kubespawner_override": override}])


def test_a_key_set_both_ways_is_refused() -> None:
    with pytest.raises(ProfileConfigError, match=r"\(x\)\.image: set both here and through "
                                                 "kubespawner_override"):
        load_profiles([{"slug": "x", "image": "a:1", "kubespawner_override": {"image": "b:1"}}])


def test_profile_options_other_than_an_image_are_refused() -> None:
    """KubeSpawner's profile_options may choose anything through kubespawner_override; here
    only the image is a user's choice (resources come with the profile)."""
    with pytest.raises(ProfileConfigError, match=r"\(x\)\.profile_options\.resources: unknown "
                                                 "field: it has no meaning on this spawner; "
                                                 "only an option named image"):
        load_profiles([{"slug": "x", "profile_options": {"resources": {"choices": {
            "big": {"display_name": "Big", "kubespawner_override": {"cpu_limit": 8}}}}}}])
    example = kubespawner_help_example()[:1]
    del example[0]["kubespawner_override"]
    unlisted = example[0]["profile_options"]["image"]["unlisted_choice"]
    unlisted["kubespawner_override"] = {"image": "{value}", "start_timeout": 600}
    with pytest.raises(ProfileConfigError, match=r"unlisted_choice\.kubespawner_override\."
                                                 "start_timeout: has no meaning on this "
                                                 "spawner; an unlisted choice may set only "
                                                 "image"):
        load_profiles(example)
    unlisted["kubespawner_override"] = {"image": "jupyter/{value}"}
    with pytest.raises(ProfileConfigError, match=r"unlisted_choice\.kubespawner_override\."
                                                 r"image: must be \"\{value\}\""):
        load_profiles(example)


def test_choice_descriptions_and_unlisted_labels_are_accepted() -> None:
    (p,) = load_profiles([{"slug": "x", "profile_options": {"image": {
        "choices": {"py": {"display_name": "Python", "description": "Python 3.12",
                           "kubespawner_override": {"image": "python:3.12"}}},
        "unlisted_choice": {"enabled": True, "display_name_in_choices": "Other...",
                            "description_in_choices": "Any public image"}}}}])
    assert p.image_option is not None and p.image_option.choices[0].image == "python:3.12"


def test_a_callable_profile_list_stops_the_hub_with_the_reason(hub_config: Config) -> None:
    hub_config.GPUSpawner.profile_list = lambda spawner: [{"slug": "x"}]
    assert "a callable profile list (KubeSpawner's profile_list(spawner)) is not supported" \
           in refusal(hub_config)
    with pytest.raises(TraitError, match="a callable profile list"):
        SpawnerSettings(profiles=lambda spawner: [])


def test_profile_list_and_profiles_both_set_stop_the_hub(hub_config: Config) -> None:
    hub_config.GPUSpawner.profiles = [{"slug": "a"}]
    hub_config.GPUSpawner.profile_list = [{"slug": "b"}]
    assert refusal(hub_config).endswith("GPUSpawner.profile_list: an alias of profiles, and "
                                        "both are set; set one")


def test_a_bad_profile_list_is_named_as_profile_list() -> None:
    with pytest.raises(TraitError, match=r"^GPUSpawner\.profile_list\[0\] \(x\)\."
                                         r"kubespawner_override\.node_selector"):
        SpawnerSettings(profile_list=[{"slug": "x", "kubespawner_override": {
            "node_selector": {"a": "b"}}}])


# --- DockerSpawner's volumes, read_only_volumes, pull_policy ---------------------------------

def test_a_named_volume_stops_the_hub_with_the_reason(hub_config: Config) -> None:
    """DockerSpawner's most common volumes line: a named volume per user."""
    hub_config.GPUSpawner.volumes = {"jupyterhub-user-{username}": "/home/jovyan/work"}
    reason = refusal(hub_config)
    assert "GPUSpawner.volumes['jupyterhub-user-{username}']: host path " \
           "'jupyterhub-user-{username}' must be an absolute path; " \
           "'jupyterhub-user-{username}' is a Docker named volume" in reason
    assert "named volumes are not supported" in reason and "home_path_template" in reason


def test_read_only_volumes_are_mounted_read_only(hub_config: Config, tmp_path: Path) -> None:
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    # DockerSpawner's two settings, as its docs show them
    hub_config.GPUSpawner.volumes = {str(scratch): "/scratch"}
    hub_config.GPUSpawner.read_only_volumes = {str(data): "/data"}
    check_hub_config(hub_config)
    spawner = GPUSpawner(config=hub_config)
    mounts = mounts_for(site_volumes(spawner.volumes, spawner.group_volumes), "ann", [])
    assert {(m.source, m.target, m.read_only) for m in mounts} == {
        (str(scratch), "/scratch", False), (str(data), "/data", True)}

    class App:
        spawner_class = GPUSpawner
        config = hub_config

    assert spawner_values(App(), ("volumes",))["volumes"] == spawner.volumes


def test_read_only_volumes_checked_at_start(hub_config: Config, tmp_path: Path) -> None:
    hub_config.GPUSpawner.volumes = {str(tmp_path): "/a"}
    hub_config.GPUSpawner.read_only_volumes = {str(tmp_path): "/b"}
    assert refusal(hub_config).endswith(f"GPUSpawner.read_only_volumes['{tmp_path}']: is in "
                                        "GPUSpawner.volumes too; set it in one of them")
    hub_config.GPUSpawner.volumes = {}
    hub_config.GPUSpawner.read_only_volumes = {"/var/run/docker.sock": "/sock"}
    assert "refusing to mount the Docker socket" in refusal(hub_config)


@pytest.mark.parametrize("spelling, value", [
    ("ifnotpresent", "ifnotpresent"), ("IfNotPresent", "ifnotpresent"),
    ("Always", "always"), ("NEVER", "never"), ("skip", "skip"), ("Skip", "skip")])
def test_pull_policy_takes_dockerspawners_spellings(spelling: str, value: str,
                                                    hub_config: Config) -> None:
    hub_config.DockerBackend.pull_policy = spelling
    check_hub_config(hub_config)
    assert DockerBackend(config=copy.deepcopy(hub_config)).pull_policy == value


def test_an_unknown_pull_policy_stops_the_hub(hub_config: Config) -> None:
    hub_config.DockerBackend.pull_policy = "sometimes"
    reason = refusal(hub_config)
    assert "pull_policy" in reason and "'sometimes'" in reason and "skip" in reason


# --- a real hub ----------------------------------------------------------------------------

@pytest.mark.docker
@pytest.mark.hub
def test_a_real_hub_serves_the_zero_to_jupyterhub_profile_list(tmp_path: Path) -> None:
    """A site's config that sets c.GPUSpawner.profile_list to Z2JH's values file: the hub
    starts (the shipped config's start-up check passes) and a user's spawn form offers the
    profiles by their slugs, names and descriptions; a Kubernetes-only key stops the hub."""
    import subprocess
    import sys

    from tests.hubrunner import Hub

    def hub(path: Path, state: Path) -> Hub:
        h = Hub(state, [{"name": "local", "topology": "auto"}], [],
                extra_config=f"del c.GPUSpawner['profiles']\n"
                             f"c.GPUSpawner.profile_list = {str(path)!r}\n"
                             # the GPU profile shows on a host without GPUs too
                             "c.GPUSpawner.show_unavailable_profiles = True\n")
        h.env["GPUSPAWNER_CULLER"] = "off"
        return h

    bad = hub(DATA / "z2jh-lifecycle-hooks.yaml", tmp_path / "bad")
    with open(bad.log_path, "ab") as log:
        proc = subprocess.run([sys.executable, "-m", "jupyterhub", "-f", str(bad.config)],
                              cwd=bad.state_dir, env=bad.env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=60)
    text = bad.log_path.read_text(errors="replace")
    assert proc.returncode != 0, text[-2000:]
    assert "kubespawner_override.lifecycle_hooks: has no meaning on this spawner" in text
    assert "JupyterHub is now running" not in text

    h = hub(Z2JH, tmp_path / "good")
    h.start()
    try:
        h.ensure_user("ann")
        r = h.login("ann").get(f"{h.url}/hub/spawn", timeout=30)
        assert r.status_code == 200, r.text[:500]
        for text in ("Minimal environment", "Datascience environment", "Spark environment",
                     "GPU Server", "Spawns a notebook server with access to a GPU"):
            assert text in r.text, text
        for slug in ("minimal-environment", "datascience-environment", "spark-environment",
                     "gpu-server"):
            assert f'value="{slug}"' in r.text, slug
    finally:
        h.stop()
