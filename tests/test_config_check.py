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

# one entry per kind of wrong setting; each message names the trait and the field (its JSON
# path in the trait), then the reason: the schema's (gpuspawner/schemas/) or a later rule's
BAD = [
    ({"placement_policy": "fastest"}, "GPUSpawner.placement_policy: unknown policy 'fastest'"),
    # profiles: the schema (type, unknown key, range, enum, form), then the rules after it
    ({"profiles": [GOOD_PROFILE, {"slug": "gpu", "gpus": "two"}]},
     "GPUSpawner.profiles[1] (gpu).gpus: 'two' is not of type 'number'"),
    ({"profiles": [{"slug": "x", "cpus": 2}]},
     "GPUSpawner.profiles[0] (x).cpus: unknown field; known: slug, display_name"),
    ({"profiles": [GOOD_PROFILE, GOOD_PROFILE, {"slug": "g", "gpus": -1}]},
     "GPUSpawner.profiles[2] (g).gpus: -1 is less than the minimum of 0"),
    ({"profiles": [{"slug": "x", "numa_policy": "tight"}]},
     "GPUSpawner.profiles[0] (x).numa_policy: 'tight' is not one of ['strict', 'prefer'"),
    ({"profiles": [{"slug": "x", "memory": "4 gigs"}]},
     "GPUSpawner.profiles[0] (x).memory: '4 gigs' is not a size such as \"4G\""),
    # no slug and no display_name to make one from as KubeSpawner does
    ({"profiles": [{"description": "no slug"}]},
     "GPUSpawner.profiles[0].slug: required field missing"),
    ({"profiles": [GOOD_PROFILE, GOOD_PROFILE]}, "GPUSpawner.profiles[1] (cpu).slug: duplicate"),
    ({"profiles": [{"slug": "x", "gpus": 1.5}]},
     "GPUSpawner.profiles[0] (x).gpus: a fraction must be below 1"),
    ({"profiles": "/nonexistent/profiles.yaml"},
     "GPUSpawner.profiles: /nonexistent/profiles.yaml: cannot read"),
    # nodes: the schema, the unique names, then the topology read at start
    ({"nodes": [{"name": "n1", "topology": "/nonexistent/n1.yaml"}]},
     "GPUSpawner.nodes[0] (n1): /nonexistent/n1.yaml"),
    ({"nodes": [{"name": "n1", "gpus": 4}]},
     "GPUSpawner.nodes[0].gpus: unknown field; known: name, docker_url, topology"),
    ({"nodes": [{"name": "n1", "host": 10}]},
     "GPUSpawner.nodes[0].host: 10 is not of type 'string', 'null'"),
    ({"nodes": [{"name": "a"}, {"name": "a"}]},
     "GPUSpawner.nodes[1].name: must be unique, 'a' is nodes[0]'s"),
    ({"nodes": []}, "GPUSpawner.nodes: must be a non-empty list"),
    # quotas
    ({"quotas": {"groups": {"students": {"gpus": -1}}}},
     "GPUSpawner.quotas.groups.students.gpus: -1 is less than the minimum of 0"),
    ({"quotas": {"group": {}}}, "GPUSpawner.quotas.group: unknown field; known: users, groups"),
    ({"quotas": {"users": {"ann": {"memory": "lots"}}}},
     "GPUSpawner.quotas.users.ann.memory: 'lots' is not a size"),
    ({"quotas": {"default_user": {"cores": 2.5}}},
     "GPUSpawner.quotas.default_user.cores: 2.5 is not of type 'integer', 'null'"),
    ({"quotas": [{"users": {}}]}, "GPUSpawner.quotas: [{'users': {}}] is not of type 'object'"),
    ({"backend": "kubernetes"}, "GPUSpawner.backend: unknown backend 'kubernetes'"),
]


@pytest.mark.parametrize("settings, message", BAD)
def test_each_wrong_setting_is_named(settings, message):
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": [GOOD_PROFILE], **settings})
    assert str(e.value).startswith(message), str(e.value)


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
    assert str(e.value).startswith(
        "gpuspawner configuration error: GPUSpawner.profiles[0] (bad slug!).slug: 'bad slug!' "
        "is not a slug")
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


@pytest.mark.parametrize("section", ["Spawner", "GPUSpawner"])
@pytest.mark.parametrize("name, value, field", [
    ("mem_limit", "4G", "memory"), ("mem_guarantee", "1G", "memory"),
    ("cpu_limit", 2.0, "cpu"), ("cpu_guarantee", 1, "cpu")])
def test_ignored_spawner_options_stop_the_hub(section, name, value, field):
    """JupyterHub's own resource options are ignored by GPUSpawner (a server gets its
    profile's bundle): setting one stops the hub with the profile field that replaces it."""
    c = Config()
    c.GPUSpawner.profiles = [GOOD_PROFILE]
    c[section][name] = value
    with pytest.raises(SystemExit) as e:
        check_hub_config(c)
    assert str(e.value).startswith(
        f"gpuspawner configuration error: {section}.{name}: GPUSpawner ignores it; set the "
        f"profile field '{field}' of each profile in c.GPUSpawner.profiles instead"), e.value


def test_ignored_spawner_options_left_at_none_pass():
    from gpuspawner.hub.config_check import check_ignored_spawner_options

    c = Config()
    c.Spawner.mem_limit = None
    c.Spawner.start_timeout = 120  # a Spawner option GPUSpawner honours
    check_ignored_spawner_options(c)


def test_traits_refuse_wrong_values_too():
    with pytest.raises(TraitError, match="placement_policy"):
        GPUSpawner(placement_policy="fastest")
    with pytest.raises(TraitError, match="^GPUSpawner.quotas.default_user.gpus: 'many' is not"):
        GPUSpawner(quotas={"default_user": {"gpus": "many"}})
    with pytest.raises(TraitError, match=r"^GPUSpawner.nodes\[1\].name: must be unique"):
        GPUSpawner(nodes=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(TraitError, match=r"^GPUSpawner.nodes\[0\].docker_url: 2375 is not of "):
        GPUSpawner(nodes=[{"name": "a", "docker_url": 2375}])
    with pytest.raises(TraitError, match=r"^DockerBackend.server_network_pool: 10.0.0.0/16 o"):
        DockerBackend(server_network_pool="10.0.0.0/16")
    with pytest.raises(TraitError, match=r"^GPUSpawner.profiles\[0\] \(x\).cpus: unknown field"):
        GPUSpawner(profiles=[{"slug": "x", "cpus": 1}])
    # what the schemas accept, the traits take
    sp = GPUSpawner(profiles=[{"slug": "g", "gpus": 0.5, "memory": "2G", "gpu_models": "T4"}],
                    nodes=[{"name": "a", "docker_url": None}],
                    quotas={"users": {"ann": {"memory": 2**30, "gpus": None}}})
    assert sp.load_profile_list()[0].bundle.gpu_milli == 500


def test_profiles_file_is_named_with_its_entry(tmp_path: Path):
    listed = tmp_path / "listed.yaml"
    listed.write_text("- {slug: a}\n- {slug: b, cpu: -2}\n")
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("profiles:\n  - {slug: a, numa_policy: loose}\n")
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": str(listed)})
    assert str(e.value) == (f"GPUSpawner.profiles: {listed}[1] (b).cpu: -2 is less than the "
                            "minimum of 0")
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": str(keyed)})
    assert str(e.value).startswith(f"GPUSpawner.profiles: {keyed}: profiles[0] (a).numa_policy: "
                                   "'loose' is not one of")


BAD_POLICIES = [
    ("global: {idle_timeout: soon}\n",
     "global.idle_timeout: 'soon' is not a duration such as 600"),
    ("users: {bob: {idle_timeut: 5}}\n", "users.bob.idle_timeut: unknown field; known: "),
    ("groups: {students: {gpu_idle_threshold: 150}}\n",
     "groups.students.gpu_idle_threshold: 150 is greater than the maximum of 100"),
    ("groups: {vip: {exempt: 'yes'}}\n", "groups.vip.exempt: 'yes' is not of type 'boolean'"),
    ("user: {bob: {}}\n", "user: unknown field; known: global, groups, users"),
    ("- global\n", "policy document: ['global'] is not of type 'object'"),
]


@pytest.mark.parametrize("text, message", BAD_POLICIES)
def test_bad_culler_policy_file_stops_the_hub(tmp_path: Path, text: str, message: str):
    bad = tmp_path / "policies.yaml"
    bad.write_text(text)
    c = Config()
    c.GPUSpawner.profiles = [GOOD_PROFILE]
    c.JupyterHub.services = [{"name": "idle-culler",
                              "command": ["python", "-m", "idle_culler", "--policies", str(bad)]}]
    with pytest.raises(SystemExit) as e:
        check_hub_config(c)
    assert str(e.value).startswith(
        f"gpuspawner configuration error: idle culler --policies {bad}: {message}"), e.value


@pytest.mark.parametrize("service, found", [
    ({"name": "idle-culler", "command": ["python", "-m", "idle_culler", "--policies", "p.yaml"]},
     "p.yaml"),
    ({"name": "culler", "command": ["/venv/bin/idle-culler", "--policies=p.yaml"],
      "cwd": "/srv"}, "/srv/p.yaml"),
    ({"name": "x", "command": ["python", "-m", "idle_culler", "--IdleCuller.policies_file",
                               "/etc/p.yaml"]}, "/etc/p.yaml"),
    ({"name": "idle-culler", "command": ["python", "-m", "idle_culler"]}, None),
    ({"name": "other", "command": ["python", "-m", "other", "--policies", "p.yaml"]}, None),
])
def test_the_culler_policy_file_is_found_in_its_service(service, found):
    from gpuspawner.hub.config_check import culler_policies_path

    assert culler_policies_path(service) == found


def test_the_shipped_hub_config_settings_pass_the_schemas():
    """The literal profiles, nodes and quotas that hub_config/jupyterhub_config.py assigns,
    and its culler policy file, pass the checks (schemas first)."""
    import ast

    from gpuspawner.hub.config_check import check_culler_policies, check_trait

    hub_config = Path(__file__).resolve().parents[1] / "hub_config"
    checked = set()
    for node in ast.walk(ast.parse((hub_config / "jupyterhub_config.py").read_text())):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and ast.unparse(node.targets[0].value) == "c.GPUSpawner"
                and node.targets[0].attr in ("profiles", "nodes", "quotas")
                and isinstance(node.value, (ast.List, ast.Dict))):
            check_trait(node.targets[0].attr, ast.literal_eval(node.value))
            checked.add(node.targets[0].attr)
    assert checked == {"profiles", "nodes", "quotas"}
    check_culler_policies(str(hub_config / "culler_policies.yaml"))


LOCAL = {"name": "local", "topology": "auto"}

# one hub start per kind of wrong configuration: (nodes file, profiles file, extra config
# lines, culler policy file or None = culler off, the message after "configuration error: ")
HUB_BAD = {
    "policy": ([LOCAL], [GOOD_PROFILE], "c.GPUSpawner.placement_policy = 'fastest'\n", None,
               "GPUSpawner.placement_policy: unknown"),
    "quota": ([LOCAL], [GOOD_PROFILE],
              "c.GPUSpawner.quotas = {'users': {'ann': {'memory': 'lots'}}}\n", None,
              "GPUSpawner.quotas.users.ann.memory: 'lots' is not a size"),
    "profile": ([LOCAL], [GOOD_PROFILE], "c.GPUSpawner.profiles = [{'slug': 'g', 'gpus': -1}]\n",
                None, "GPUSpawner.profiles[0] (g).gpus: -1 is less than the minimum of 0"),
    "profiles file": ([LOCAL], [GOOD_PROFILE, {"slug": "g", "numa_policy": "tight"}], "", None,
                      "GPUSpawner.profiles: {tmp}/profiles.yaml[1] (g).numa_policy: 'tight' is "
                      "not one of"),
    "node entry": ([{**LOCAL, "gpus": 4}], [GOOD_PROFILE], "", None,
                   "GPUSpawner.nodes[0].gpus: unknown field; known: name, docker_url"),
    "topology file": ([{"name": "local", "topology": "{tmp}/missing.yaml"}], [GOOD_PROFILE], "",
                      None, "GPUSpawner.nodes[0] (local): {tmp}/missing.yaml"),
    "ignored Spawner option": ([LOCAL], [GOOD_PROFILE], "c.Spawner.mem_limit = '4G'\n", None,
                               "Spawner.mem_limit: GPUSpawner ignores it; set the profile "
                               "field 'memory'"),
    "culler policy": ([LOCAL], [GOOD_PROFILE], "", "users: {bob: {max_age: 2 days}}\n",
                      "idle culler --policies {tmp}/policies.yaml: users.bob.max_age: '2 days' "
                      "is not a duration"),
}


@pytest.mark.docker
@pytest.mark.hub
@pytest.mark.parametrize("kind", list(HUB_BAD))
def test_hub_with_wrong_config_stops_at_start(tmp_path, kind):
    """``jupyterhub`` exits 1 at start with the trait (or file), the field and the reason."""
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import _engine

    _engine()
    nodes, profiles, extra, policies, message = HUB_BAD[kind]
    nodes = [{k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in n.items()}
             for n in nodes]
    h = Hub(tmp_path, nodes, profiles, extra_config=extra)
    if policies is None:
        h.env["GPUSPAWNER_CULLER"] = "off"
    else:
        (tmp_path / "policies.yaml").write_text(policies)
        h.env["GPUSPAWNER_CULLER_POLICIES"] = str(tmp_path / "policies.yaml")
    with pytest.raises(RuntimeError) as e:
        h.start(timeout=60)
    assert "hub exited with 1" in str(e.value)
    assert f"gpuspawner configuration error: {message.format(tmp=tmp_path)}" in str(e.value)


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
    # other quotas (group_overrides) are a request's input, never another cluster
    assert get_cluster(nodes, "first-fit", {"default_user": {"servers": 1}}) is first
    second = get_cluster(nodes, "spread", {})
    assert second is not first and current_clusters() == [second]  # first was unused
    second.ledger.reserve(Bundle(cores=0, memory_bytes=2**20), Owner("ann"))
    third = get_cluster(nodes, "first-fit", {})
    assert third is second and current_clusters() == [second]
    reset_clusters()


def test_the_hub_ledger_gets_a_live_prior_from_the_profiles():
    from gpuspawner.hub.cluster import get_cluster, reset_clusters

    reset_clusters()
    profiles = [GOOD_PROFILE, {"slug": "g1", "cpu": 4, "memory": "8G", "gpus": 1}]
    cluster = get_cluster([{"name": "local", "topology": "auto"}], "fgd", {}, profiles)
    assert cluster.ledger.prior is not None
    reset_clusters()
