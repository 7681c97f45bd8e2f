"""The site's data beside the home (gpuspawner.hub.volumes): the mount rules checked at hub
start and the mounts a server gets (the real engine's test, a read-only dataset and a group's
project folder: tests/test_spawner_docker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.backends.docker import container_config
from gpuspawner.backends.spec import Mount
from gpuspawner.hub.config_check import HubConfigError, check_spawner_settings
from gpuspawner.hub.profiles import ProfileConfigError, load_profiles
from gpuspawner.hub.volumes import (
    VolumeConfigError,
    VolumeSpec,
    check_volume_settings,
    mounts_for,
    parse_volumes,
)
from tests.test_launch_spec import spec as make_spec  # a spec without an engine

HOMES = "/shared/home/{username}"


def check(volumes=None, group_volumes=None, profiles=(), **kw):
    kw.setdefault("home_path_template", HOMES)
    kw.setdefault("check_exists", False)
    return check_volume_settings(volumes, group_volumes, profiles, **kw)


def test_dockerspawner_shapes_are_read() -> None:
    specs = parse_volumes({"/data/imagenet": {"bind": "/data/imagenet", "mode": "ro"},
                           "/opt/tools": "/opt/tools",
                           "/scratch/{username}": {"bind": "/scratch"}}, "GPUSpawner.volumes")
    assert specs == [VolumeSpec("/data/imagenet", "/data/imagenet", True),
                     VolumeSpec("/opt/tools", "/opt/tools", False),  # mode left out: rw
                     VolumeSpec("/scratch/{username}", "/scratch", False)]


@pytest.mark.parametrize(("volumes", "group_volumes", "kw", "message"), [
    ({"data": "/data"}, None, {}, "GPUSpawner.volumes['data']: host path 'data' must be an "
                                  "absolute path"),
    ({"/data/../etc": "/data"}, None, {}, "must not contain '..'"),
    ({"/data": {"bind": "/d", "mode": "rx"}}, None, {},
     "GPUSpawner.volumes['/data'].mode: must be 'ro' or 'rw', got 'rx'"),
    ({"/data": {"target": "/d"}}, None, {}, "unknown key 'target'; known: bind, mode"),
    ({"/data": 3}, None, {}, "must be the path in the server or"),
    ({"/data/{user}": "/d"}, None, {}, "unknown template {user}; allowed: {username}"),
    ({"/data/{group}": "/d"}, None, {}, "unknown template {group}"),
    (["/data"], None, {}, "GPUSpawner.volumes: must be a dict"),
    ({"/data": "/"}, None, {}, "would cover a system folder"),
    ({"/data": "/proc/x"}, None, {}, "would cover a system folder"),
    ({"/data": "/home/{username}"}, None, {}, "is the home's mount point"),
    ({"/var/run/docker.sock": "/d"}, None, {}, "refusing to mount the Docker socket"),
    ({"/run/docker": "/d"}, None, {}, "refusing to mount the Docker socket"),
    ({"/srv/hub/state": "/d"}, None, {"state_dir": "/srv/hub/state"},
     "the hub's state folder (/srv/hub/state) must not be mounted"),
    ({"/srv": "/d"}, None, {"state_dir": "/srv/hub/state"}, "the hub's state folder"),
    ({"/shared/home/alice": "/alice"}, None, {},
     "is inside the homes (/shared/home) but not the user's own home"),
    ({"/shared/home/{username}x": "/x"}, None, {}, "not the user's own home"),
    ({"/shared": "/shared"}, None, {}, "holds every user's home (/shared/home)"),
    ({"/shared/home/{username}": "/h"}, None, {}, "is the user's home itself"),
    # a folder inside the user's own home: the user may replace it by a link to any host
    # folder (say /), which the engine follows as root when it makes the bind mount
    ({"/shared/home/{username}/big": "/big"}, None, {},
     "is inside the user's home (/shared/home/{username}), which the user controls"),
    ({"/shared/home/{username}/a/b": {"bind": "/b", "mode": "ro"}}, None, {},
     "a symbolic link put in its place"),
    ({"/a": "/data", "/b": "/data"}, None, {}, "bind '/data' is already the mount point of"),
    # a user named "home" got /shared/home/scratch: the home of the user named "scratch"
    ({"/shared/{username}/scratch": "/scratch"}, None, {},
     "a user or group named 'home' would get a folder inside the homes (/shared/home)"),
    (None, {"physics": {"/shared/{group}": "/g"}}, {}, "a user or group named 'home'"),
    # a user named "physics" got the physics project folder
    ({"/projects/{username}": "/mine"}, {"physics": {"/projects/{group}": "/p"}}, {},
     "with {username} and {group} swapped: a user named like a group"),
    (None, {"physics": {"/p/{group}": "/p"}}, {"backend": "slurm"},
     "GPUSpawner.group_volumes['physics']: mounts are not supported with the Slurm backend"),
    (None, {"../x": {"/p/{group}": "/p"}}, {}, "a group name with '/' or '..'"),
    (None, ["x"], {}, "GPUSpawner.group_volumes: must be a dict {group: volumes}"),
])
def test_each_bad_mount_is_refused_with_its_setting(volumes, group_volumes, kw, message):
    with pytest.raises(VolumeConfigError) as e:
        check(volumes, group_volumes, **kw)
    assert message in str(e.value), str(e.value)


#: the issue's configuration: a group's project folder read-write, a dataset inside it
PROJECTS = {"physics": {"/srv/projects/{group}": {"bind": "/projects/{group}", "mode": "rw"}}}


@pytest.mark.parametrize(("volumes", "group_volumes", "profile_volumes", "message"), [
    # issue 46, item 1: a member replaced datasets by a link to the homes' parent folder
    (None, PROJECTS, {"/srv/projects/physics/datasets": {"bind": "/data", "mode": "ro"}},
     "GPUSpawner.profiles (p).volumes['/srv/projects/physics/datasets']: lies inside (or for "
     "some user's or group's name is) GPUSpawner.group_volumes['physics']"
     "['/srv/projects/{group}'], the mount that users can write"),
    # the group's own entry inside its folder: a member redirects it for the other members
    (None, {"physics": {"/srv/projects/{group}": "/p",
                        "/srv/projects/{group}/ref": {"bind": "/ref", "mode": "ro"}}}, None,
     "GPUSpawner.group_volumes['physics']['/srv/projects/{group}/ref']: lies inside"),
    # a read-write scratch per user, a shared folder beside it: a user named 'shared' owns it
    ({"/scratch/{username}": "/scratch", "/scratch/shared/tools": "/tools"}, None, None,
     "GPUSpawner.volumes['/scratch/shared/tools']: lies inside (or for some user's or group's "
     "name is) GPUSpawner.volumes['/scratch/{username}']"),
    ({"/scratch/{username}": "/scratch", "/scratch/shared": {"bind": "/t", "mode": "ro"}},
     None, None,
     "GPUSpawner.volumes['/scratch/shared']: lies inside"),
])
def test_a_mount_inside_a_folder_users_can_write_is_refused_naming_both(
        volumes, group_volumes, profile_volumes, message) -> None:
    """Issue 46, item 1: a mount whose host folder lies inside a folder users can write
    through another setting is refused at hub start, the message naming both settings."""
    profiles = load_profiles([{"slug": "p", "volumes": profile_volumes}]) \
        if profile_volumes else []
    with pytest.raises(VolumeConfigError) as e:
        check(volumes, group_volumes, profiles)
    assert message in str(e.value), str(e.value)


def test_mounts_beside_folders_users_can_write_pass() -> None:
    """What the nesting rule keeps: a dataset beside the projects, the group's folder itself
    in a profile, another group's entry, read-only folders holding others, two users' templates
    with different suffixes."""
    (p,) = load_profiles([{"slug": "p", "volumes": {
        "/srv/datasets": {"bind": "/data", "mode": "ro"},
        "/srv/projects/physics": {"bind": "/physics", "mode": "ro"}}}])
    check({"/srv/ro": {"bind": "/ro", "mode": "ro"}, "/srv/ro/inner": "/inner",
           "/scratch/{username}-rw": "/s", "/scratch/{username}-ro/x": "/x"},
          {**PROJECTS, "chem": {"/srv/projects/physics-ref": {"bind": "/ref", "mode": "ro"}}},
          [p])


def test_the_hub_refuses_a_mount_inside_a_group_folder_at_start(tmp_path: Path) -> None:
    """The start-time check through the hub's settings (as jupyterhub loads them): the
    issue's configuration stops the hub, naming the profile's and the group's settings."""
    from gpuspawner.hub.cluster import reset_clusters

    (tmp_path / "projects" / "physics" / "datasets").mkdir(parents=True)
    reset_clusters()
    try:
        with pytest.raises(HubConfigError) as e:
            check_spawner_settings({
                "profiles": [{"slug": "data", "cpu": 1, "volumes": {
                    str(tmp_path / "projects" / "physics" / "datasets"): {
                        "bind": "/data", "mode": "ro"}}}],
                "home_path_template": str(tmp_path / "home" / "{username}"),
                "group_volumes": {"physics": {str(tmp_path / "projects" / "{group}"): {
                    "bind": "/projects/{group}", "mode": "rw"}}},
                "state_dir": str(tmp_path / "state")})
        assert str(e.value).startswith("GPUSpawner.profiles (data).volumes[")
        assert "GPUSpawner.group_volumes['physics']" in str(e.value)
    finally:
        reset_clusters()


def test_good_mounts_pass(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    specs = check({str(tmp_path / "data"): {"bind": "/data", "mode": "ro"},
                   "/scratch/{username}": "/scratch"},
                  {"physics": {"/projects/{group}": "/projects/{group}"}},
                  state_dir=str(tmp_path / "state"), check_exists=True)
    assert len(specs) == 3
    # an untemplated folder must exist on the hub's host
    with pytest.raises(VolumeConfigError, match="the host folder does not exist"):
        check({str(tmp_path / "missing"): "/m"}, check_exists=True)


def test_a_profiles_mounts_are_checked_with_its_name() -> None:
    with pytest.raises(ProfileConfigError, match=r"profiles\[0\] \(a\)\.volumes\['rel'\]: host "
                                                 "path 'rel' must be an absolute path"):
        load_profiles([{"slug": "a", "volumes": {"rel": "/x"}}])
    (p,) = load_profiles([{"slug": "a", "volumes": {"/shared/home/bob": "/bob"}}])
    with pytest.raises(VolumeConfigError, match=r"GPUSpawner.profiles \(a\).volumes.*not the "
                                                "user's own home"):
        check(profiles=[p])


def test_mounts_follow_groups_templates_and_profiles() -> None:
    site = parse_volumes({"/data": {"bind": "/data", "mode": "ro"},
                          "/scratch/{username}": "/scratch"}, "v")
    groups = parse_volumes({"/projects/{group}": "/projects/{group}"}, "g", group="physics") + \
        parse_volumes({"/projects/{group}": "/projects/{group}"}, "g", group="chem")
    profile = parse_volumes({"/data-v2": {"bind": "/data", "mode": "ro"}}, "p")
    got = mounts_for([*site, *groups, *profile], "ann", ["physics", "staff"])
    assert got == (Mount("/data-v2", "/data", True),  # the profile's replaces the site's
                   Mount("/scratch/ann", "/scratch", False),
                   Mount("/projects/physics", "/projects/physics", False))
    assert all("chem" not in m.source for m in mounts_for(groups, "bob", ["physics"]))
    assert mounts_for(groups, "eve", []) == ()


def test_docker_binds_carry_the_mode() -> None:
    spec = make_spec(mounts=(Mount("/data", "/data", True), Mount("/s/ann", "/scratch", False)))
    binds = container_config(spec, network="n")[1]["binds"]
    assert binds["/data"] == {"bind": "/data", "mode": "ro"}
    assert binds["/s/ann"] == {"bind": "/scratch", "mode": "rw"}
    with pytest.raises(ValueError, match="mounted twice"):
        container_config(make_spec(mounts=(Mount("/data", "/a"), Mount("/data", "/b"))),
                         network="n")


def test_the_hub_refuses_a_bad_mount_at_start(tmp_path: Path) -> None:
    from gpuspawner.hub.cluster import reset_clusters

    reset_clusters()
    with pytest.raises(HubConfigError, match=r"^GPUSpawner.volumes\['/shared'\]: holds every "
                                             "user's home"):
        check_spawner_settings({"profiles": [{"slug": "cpu", "cpu": 1}],
                                "home_path_template": "/shared/home/{username}",
                                "volumes": {"/shared": "/shared"},
                                "state_dir": str(tmp_path)})
    reset_clusters()



async def test_a_notebook_job_gets_the_mounts_a_server_of_its_user_gets() -> None:
    from types import SimpleNamespace

    import nbformat

    from gpuspawner.hub.jobs.runner import JobRunner
    from tests.test_launch_spec import alloc

    (profile,) = load_profiles([{"slug": "p", "cpu": 1, "volumes": {
        "/models": {"bind": "/models", "mode": "ro"}}}])
    spawner = {"image": "img", "home_path_template": "", "home_mount_point": "/home/{username}",
               "volumes": {"/data": {"bind": "/data", "mode": "ro"}},
               "group_volumes": {"physics": {"/projects/{group}": "/projects/{group}"},
                                 "chem": {"/projects/{group}": "/chem"}}}

    async def user_ids(row):
        return 1000, 100

    runner = SimpleNamespace(spawner=spawner, _user_ids=user_ids)
    runner.image_of = lambda options, profile: JobRunner.image_of(runner, options, profile)
    nb = nbformat.v4.new_notebook()
    row = SimpleNamespace(user="ann", id="j1", name="n", output_dir="~/jobs/n/x",
                          parameters="{}", time_limit=60, notebook_dict=nb,
                          get_json=lambda key, default=None: ["physics"] if key == "groups"
                          else default)
    spec = await JobRunner._spec(runner, row, profile, alloc())
    assert spec.mounts == (Mount("/data", "/data", True),
                           Mount("/projects/physics", "/projects/physics", False),
                           Mount("/models", "/models", True))
