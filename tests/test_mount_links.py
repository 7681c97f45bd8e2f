"""Mounts that cannot be redirected (issue 46, item 1): every host path a server gets is
checked on its node before the engine is handed it (gpuspawner.backends.home
.check_mount_paths): no symbolic link in it, every folder above it root's (or a uid of
``c.DockerBackend.mount_owners``) and writable by no one else. The rules on a folder tree
here, then the issue's attack replayed with the real engine and real containers, through the
hub's process (a local engine) and through the root helper on the node (``home_on_node``
"always", as for a remote engine)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gpuspawner.backends.home import MountPathUnsafe, check_mount_paths
from gpuspawner.backends.home_script import check_paths

#: two users of one uid, as the demo's users are
UID, GID = 4471, 4472


def tree(tmp_path: Path) -> Path:
    """``srv/data`` (root, 0755) in a root folder, and ``srv/group`` root:GID 2775 (a group's
    project folder its members write) holding ``srv/group/sets``."""
    srv = tmp_path / "srv"
    (srv / "data").mkdir(parents=True)
    (srv / "group" / "sets").mkdir(parents=True)
    os.chown(srv / "group", 0, GID)
    os.chmod(srv / "group", 0o2775)
    return srv


def test_the_rules_on_a_folder_tree(tmp_path: Path) -> None:
    srv = tree(tmp_path)
    assert check_paths([str(srv / "data"), str(srv / "group")], [0]) == {"result": "checked"}
    # below a folder its group may write: a member may replace sets by a link at any time
    got = check_paths([str(srv / "group" / "sets")], [0])
    assert got["path"] == str(srv / "group" / "sets")
    assert got["reason"].startswith(f"{srv / 'group'} may be written by its group")
    # a symbolic link anywhere in the path, the last component too
    os.symlink(srv / "data", srv / "link")
    assert check_paths([str(srv / "link")], [0])["reason"] == f"{srv / 'link'} is a symbolic link"
    assert check_paths([str(srv / "link" / "x")], [0])["reason"].endswith("is a symbolic link")
    # a folder above the path owned by another uid, unless mount_owners lists it
    (srv / "mine" / "sub").mkdir(parents=True)
    os.chown(srv / "mine", UID, GID)
    assert "belongs to uid 4471" in check_paths([str(srv / "mine" / "sub")], [0])["reason"]
    assert check_paths([str(srv / "mine" / "sub")], [0, UID]) == {"result": "checked"}
    # the last component may be anyone's (a user's own scratch folder) ...
    assert check_paths([str(srv / "mine")], [0]) == {"result": "checked"}
    # ... but not for the homes' folder (strict), and not in a sticky folder others write
    assert "belongs to uid" in check_paths([], [0], strict=[str(srv / "mine")])["reason"]
    sticky = srv / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "root-owned").mkdir()
    (sticky / "users").mkdir()
    os.chown(sticky / "users", UID, GID)
    assert check_paths([str(sticky / "root-owned")], [0]) == {"result": "checked"}
    assert "(sticky)" in check_paths([str(sticky / "users")], [0])["reason"]
    # a missing mount folder is refused (the engine would make it as root); a missing homes'
    # folder is left to the home's rules (HomeParentMissing names it)
    assert check_paths([str(srv / "none")], [0])["reason"] == f"{srv / 'none'} does not exist"
    assert check_paths([], [0], strict=[str(srv / "none")]) == {"result": "checked"}
    with pytest.raises(MountPathUnsafe, match=f"node n1: host path {srv / 'link'} refused: "
                                              f"{srv / 'link'} is a symbolic link"):
        check_mount_paths([str(srv / "link")], [0], node="n1")


docker = pytest.importorskip("docker")

from tornado import web  # noqa: E402

from gpuspawner.testing.fakes import FakeUser  # noqa: E402
from tests.test_spawner_docker import client, container_id, make_spawner  # noqa: E402,F401


def run(client, sp, cmd: str) -> tuple[int, str]:  # noqa: F811 - the fixture's value
    """``sh -c cmd`` in the server's container, as the server's user."""
    ex = client.exec_create(container_id(sp), ["sh", "-c", cmd])
    out = client.exec_start(ex).decode().strip()
    return client.exec_inspect(ex["Id"])["ExitCode"], out


@pytest.mark.docker
@pytest.mark.parametrize("home_on_node", ["auto", "always"])
async def test_a_dataset_replaced_by_a_link_in_a_group_folder_is_never_mounted(
        make_spawner, client, tmp_path, home_on_node):  # noqa: F811 - fixtures
    """The issue's attack: the physics group's project folder is mounted rw, a profile mounts
    the dataset folder inside it at /data. A member renames ``datasets`` in their server and
    puts a link to the homes' folder in its place; their next server with the dataset
    profile had every home at /data (another user's 0600 files included: the users share one
    uid). Now that spawn is refused naming the path, and nothing is booked or made."""
    homes = tmp_path / "home"
    (homes / "bob").mkdir(parents=True)
    (homes / "bob" / "secret.txt").write_text("bob's secret\n")
    os.chmod(homes / "bob" / "secret.txt", 0o600)
    for p in (homes / "bob", homes / "bob" / "secret.txt"):
        os.chown(p, UID, GID)
    os.chmod(homes / "bob", 0o700)
    projects = tmp_path / "projects"
    datasets = projects / "physics" / "datasets"
    datasets.mkdir(parents=True)
    (datasets / "labels.txt").write_text("cat\n")
    os.chown(projects / "physics", 0, GID)
    os.chmod(projects / "physics", 0o2775)  # the group's members write it
    settings = dict(
        home_on_node=home_on_node, uid_map={"linkuser": {"uid": UID, "gid": GID}},
        group_volumes={"physics": {str(projects) + "/{group}": {"bind": "/projects/{group}",
                                                               "mode": "rw"}}},
        profiles=[{"slug": "cpu", "cpu": 1, "memory": "256M"},
                  {"slug": "data", "cpu": 1, "memory": "256M",
                   "volumes": {str(datasets): {"bind": "/data", "mode": "ro"}}}])

    member = make_spawner("linkuser", **settings)
    member.user = FakeUser("linkuser", groups=("physics",))
    await asyncio.wait_for(member.start(), 90)
    try:
        code, out = run(client, member, "cd /projects/physics && mv datasets old && "
                                         f"ln -s {homes} datasets && ls -l")
        assert code == 0, out
    finally:
        await member.stop()
    assert os.path.islink(datasets)

    again = make_spawner("linkuser", options={"profile": "data"}, **settings)
    again.user = FakeUser("linkuser", groups=("physics",))
    try:
        await asyncio.wait_for(again.start(), 90)
    except web.HTTPError as e:
        refused = str(e.log_message or e)
    else:
        try:
            leaked = run(client, again, "ls /data; cat /data/bob/secret.txt")[1]
        finally:
            await again.stop()
        pytest.fail(f"the spawn was not refused: /data shows {leaked!r}")
    assert f"node gpunode: host path {datasets} refused: " in refused, refused
    assert again.cluster.ledger.allocations() == []
    assert client.containers(all=True, filters={"label": "gpuspawner.user=linkuser"}) == []


@pytest.mark.docker
@pytest.mark.parametrize("home_on_node", ["auto", "always"])
@pytest.mark.parametrize("where", ["mount", "extra_host_config"])
async def test_a_notebook_jobs_linked_mount_never_reaches_the_engine(
        client, tmp_path, home_on_node, where):  # noqa: F811 - fixtures
    """A notebook job's spec (no port, no home, as the job runner makes it) launched on a
    node: a mount folder that is a symbolic link (here to the homes' folder), from the site's
    mounts or from the admin's ``extra_host_config`` binds, is refused before any container
    is made, in the hub (local engine) or by the helper on the node ("always")."""
    from dataclasses import replace
    from types import SimpleNamespace

    from gpuspawner.backends.docker_backend import DockerBackend
    from gpuspawner.backends.spec import Mount
    from tests.test_launch_spec import alloc
    from tests.test_launch_spec import spec as make_spec
    from tests.test_spawner_docker import IMAGE

    (tmp_path / "home" / "bob").mkdir(parents=True)
    link = tmp_path / "datasets"
    os.symlink(tmp_path / "home", link)
    extra = {"binds": {str(link): {"bind": "/data", "mode": "ro"}}} \
        if where == "extra_host_config" else {}
    backend = DockerBackend(network_isolation="host", home_on_node=home_on_node,
                            extra_host_config=extra)
    backend.bind({"n1": SimpleNamespace(docker_url="", network_pool="",  # type: ignore[dict-item]
                                        host="127.0.0.1")})
    job = replace(make_spec(name=f"gpuspawner-test-job-{home_on_node}-{where}", image=IMAGE,
                            cmd=["ls", "/data"], helper_image=IMAGE,
                            allocation=alloc(gpus=(), cpus=(0,), mems=(0,)),
                            mounts=(Mount(str(link), "/data"),) if where == "mount" else ()),
                  port=0, time_limit=60)
    state: dict = {}
    try:
        try:
            await backend.launch(job, state, lambda pct, text: None)
        except MountPathUnsafe as e:
            assert str(e).startswith(f"node n1: host path {link} refused: {link} is a "
                                     "symbolic link"), str(e)
        else:
            client.wait(state["container_id"], timeout=60)
            listed = client.logs(state["container_id"]).decode().split()
            pytest.fail(f"the job ran with the link mounted: /data listed {listed}")
        assert "container_id" not in state
    finally:
        if state.get("container_id"):
            client.remove_container(state["container_id"], force=True)
