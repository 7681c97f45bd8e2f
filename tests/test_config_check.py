"""Configuration checked when the hub starts (gpuspawner.hub.config_check): each kind of wrong
setting stops ``jupyterhub`` at start with the trait, the entry and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.docker_backend import DockerBackend
from gpuspawner.hub.config_check import (
    HubConfigError,
    check_hub_config,
    check_spawner_settings,
)
from gpuspawner.hub.spawner import GPUSpawner

GOOD_PROFILE = {"slug": "cpu", "cpu": 1, "memory": "1G"}

BAD = [
    ({"placement_policy": "fastest"}, "GPUSpawner.placement_policy: unknown policy 'fastest'"),
    ({"profiles": [GOOD_PROFILE, {"slug": "gpu", "gpus": "two"}]},
     "GPUSpawner.profiles: profiles[1] (gpu).gpus: must be a number >= 0, got 'two'"),
    ({"profiles": [{"slug": "x", "cpus": 2}]},
     "GPUSpawner.profiles: profiles[0] (x): unknown key(s) cpus"),
    ({"nodes": [{"name": "n1", "topology": "/nonexistent/n1.yaml"}]},
     "GPUSpawner.nodes: nodes[0] (n1): /nonexistent/n1.yaml"),
    ({"nodes": [{"name": "n1", "gpus": 4}]}, "GPUSpawner.nodes: nodes[0]: unknown key(s) gpus"),
    ({"quotas": {"groups": {"students": {"gpus": -1}}}}, "GPUSpawner.quotas: groups.students.gpus"),
    ({"quotas": {"group": {}}}, "GPUSpawner.quotas: unknown key(s) group"),
    ({"backend": "kubernetes"}, "GPUSpawner.backend: unknown backend 'kubernetes'"),
]


@pytest.mark.parametrize("settings, message", BAD)
def test_each_wrong_setting_is_named(settings, message):
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": [GOOD_PROFILE], **settings})
    assert message in str(e.value)


def test_backend_settings_are_checked_at_start():
    """The backend is made from the hub's config at start: its traits validate there."""
    from gpuspawner.hub.cluster import reset_clusters

    reset_clusters()
    c = Config()
    c.DockerBackend.server_network_pool = "10.0.0.0/16"
    with pytest.raises(HubConfigError, match=r"^DockerBackend.server_network_pool: 10.0.0.0/16 "
                                             "overlaps a private"):
        check_spawner_settings({"profiles": [GOOD_PROFILE]}, c)
    c = Config()
    c.DockerBackend.network_isolation = "none"
    with pytest.raises(HubConfigError, match="network_isolation"):
        check_spawner_settings({"profiles": [GOOD_PROFILE]}, c)
    reset_clusters()


def test_good_settings_pass_and_read_the_inventory_once():
    from gpuspawner.hub.cluster import current_clusters, reset_clusters

    reset_clusters()
    check_spawner_settings({"profiles": [GOOD_PROFILE], "placement_policy": "first-fit"})
    (cluster,) = current_clusters()  # built at start: the first spawn reads nothing
    assert list(cluster.nodes) == ["local"]
    reset_clusters()


def test_check_hub_config_exits_with_the_reason(tmp_path: Path):
    c = Config()
    c.GPUSpawner.profiles = [{"slug": "bad slug!"}]
    with pytest.raises(SystemExit) as e:
        check_hub_config(c)
    assert str(e.value).startswith("gpuspawner configuration error: GPUSpawner.profiles: ")
    bad = tmp_path / "policies.yaml"
    bad.write_text("global: {idle_timeout: soon}\n")
    for assign in (True, False):  # services set, or only appended to (a lazy config value)
        c = Config()
        c.GPUSpawner.profiles = [GOOD_PROFILE]
        svc = {"name": "idle-culler",
               "command": ["python", "-m", "idle_culler", "--policies", str(bad)]}
        if assign:
            c.JupyterHub.services = [svc]
        else:
            c.JupyterHub.services.append(svc)
        with pytest.raises(SystemExit) as e:
            check_hub_config(c)
        assert f"idle culler --policies {bad}: global.idle_timeout" in str(e.value)


def test_traits_refuse_wrong_values_too():
    with pytest.raises(TraitError, match="placement_policy"):
        GPUSpawner(placement_policy="fastest")
    with pytest.raises(TraitError, match="GPUSpawner.quotas: default_user.gpus"):
        GPUSpawner(quotas={"default_user": {"gpus": "many"}})
    with pytest.raises(TraitError, match=r"GPUSpawner.nodes: nodes\[1\].name: must be a unique"):
        GPUSpawner(nodes=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(TraitError, match=r"nodes\[0\].docker_url: must be a string"):
        GPUSpawner(nodes=[{"name": "a", "docker_url": 2375}])
    with pytest.raises(TraitError, match=r"^DockerBackend.server_network_pool: 10.0.0.0/16 o"):
        DockerBackend(server_network_pool="10.0.0.0/16")
    with pytest.raises(TraitError, match=r"GPUSpawner.profiles: profiles\[0\] \(x\)"):
        GPUSpawner(profiles=[{"slug": "x", "cpus": 1}])


@pytest.mark.docker
@pytest.mark.hub
@pytest.mark.parametrize("extra, message", [
    ("c.GPUSpawner.placement_policy = 'fastest'\n", "GPUSpawner.placement_policy: unknown"),
    ("c.GPUSpawner.quotas = {'users': {'ann': {'memory': 'lots'}}}\n",
     "GPUSpawner.quotas: users.ann.memory"),
])
def test_hub_with_wrong_config_stops_at_start(tmp_path, extra, message):
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import _engine

    _engine()
    h = Hub(tmp_path, [{"name": "local", "topology": "auto"}], [GOOD_PROFILE],
            extra_config=extra)
    h.env["GPUSPAWNER_CULLER"] = "off"
    with pytest.raises(RuntimeError) as e:
        h.start(timeout=60)
    assert "hub exited with 1" in str(e.value)
    assert f"gpuspawner configuration error: {message}" in str(e.value)


@pytest.mark.docker
@pytest.mark.hub
def test_hub_with_broken_profile_or_node_file_stops_at_start(tmp_path):
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import _engine

    _engine()
    h = Hub(tmp_path, [{"name": "local", "topology": str(tmp_path / "missing.yaml")}],
            [GOOD_PROFILE])
    h.env["GPUSPAWNER_CULLER"] = "off"
    with pytest.raises(RuntimeError) as e:
        h.start(timeout=60)
    assert "GPUSpawner.nodes: nodes[0] (local):" in str(e.value)
    assert "missing.yaml" in str(e.value)


def test_entry_points_name_the_spawner_and_the_authenticator():
    """``spawner_class = "gpu"`` and ``authenticator_class = "gpu-ldap"`` resolve (the
    installed package's metadata, as JupyterHub looks them up)."""
    from importlib.metadata import entry_points

    from gpuspawner.hub.auth import GPULDAPAuthenticator

    spawners = {e.name: e for e in entry_points(group="jupyterhub.spawners")}
    auths = {e.name: e for e in entry_points(group="jupyterhub.authenticators")}
    assert spawners["gpu"].load() is GPUSpawner
    assert auths["gpu-ldap"].load() is GPULDAPAuthenticator


def test_one_cluster_per_hub_process():
    """A second configuration replaces the cluster only while it is unused; after a booking
    it gets the same ledger (two ledgers would book the same devices twice)."""
    from gpuspawner.hub.cluster import current_clusters, get_cluster, reset_clusters
    from gpuspawner.placement import Bundle, Owner

    reset_clusters()
    nodes = [{"name": "local", "topology": "auto"}]
    first = get_cluster(nodes, "first-fit", {})
    second = get_cluster(nodes, "first-fit", {"default_user": {"servers": 1}})
    assert second is not first and current_clusters() == [second]  # first was unused
    second.ledger.reserve(Bundle(cores=0, memory_bytes=2**20), Owner("ann"))
    third = get_cluster(nodes, "first-fit", {"default_user": {"servers": 9}})
    assert third is second and current_clusters() == [second]
    reset_clusters()


def test_the_hub_ledger_gets_a_live_prior_from_the_profiles():
    from gpuspawner.hub.cluster import get_cluster, reset_clusters

    reset_clusters()
    profiles = [GOOD_PROFILE, {"slug": "g1", "cpu": 4, "memory": "8G", "gpus": 1}]
    cluster = get_cluster([{"name": "local", "topology": "auto"}], "fgd", {}, profiles)
    assert cluster.ledger.prior is not None
    reset_clusters()
