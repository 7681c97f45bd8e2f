"""Names that cannot collide, replayed against a real JupyterHub, proxy and Docker engine
(docs/security.md, "Names"). The first two tests are the reproductions of gpuspawner 0.x's
collisions: on 0.x both pairs of users got one container name and one home.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest

docker = pytest.importorskip("docker")

from gpuspawner.hub.identity import legacy_safe_name, object_name, safe_name  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of, remove_objects_of  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]

#: 0.x gave both the name zo-c3-ab-5f-c3-b1-c3-ba-c3-b1ez-5fd-5fac18b1f594 (home, container)
HOME_VICTIM, HOME_ATTACKER = "zoë_ñúñez_dvořák", "zoë_ñúñez_d_ac18b1f594"
#: 0.x gave the victim's default server and the attacker's server "f13c9545cc1b" one name
SERVER_VICTIM, SERVER_ATTACKER, ATTACKER_SERVER = ("chloé.dvořák.sjöström", "chloé.dvořák.sj",
                                                   "f13c9545cc1b")
USERS = (HOME_VICTIM, HOME_ATTACKER, SERVER_VICTIM, SERVER_ATTACKER)
UID = 1000  # hub_config's default_uid


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nameshub")
    h = Hub(tmp, [{"name": "local", "topology": "auto"}],
            [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}],
            extra_config="c.GPUSpawner.http_timeout = 30\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    yield h
    h.stop()
    remove_objects_of(engine, [*USERS, "nm-foreign", "nm-otheruid", "nm-" + "long" * 20])


def homes(hub: Hub) -> Path:
    return Path(hub.env["GPUSPAWNER_STATE_DIR"]).parent / "home"


def spawn(hub: Hub, user: str, server: str = "", expect: int | None = None):
    hub.ensure_user(user)
    u = quote(user, safe="")
    path = f"/users/{u}/servers/{server}" if server else f"/users/{u}/server"
    r = hub.api("POST", path, {"profile": "cpu"})
    if expect is not None:
        assert r.status_code == expect, r.text
        return r
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(u, server)
    return r


def container_of(engine, user: str, server: str = "") -> dict:
    (c,) = [c for c in containers_of(engine, user)
            if c["Labels"].get("gpuspawner.server", "") == server]
    return c


def run(engine, cid: str, *cmd: str) -> str:
    ex = engine.exec_create(cid, list(cmd))
    return engine.exec_start(ex).decode(errors="replace").strip()


def test_two_users_with_a_colliding_0x_name_get_two_homes(hub, engine):
    assert legacy_safe_name(HOME_VICTIM) == legacy_safe_name(HOME_ATTACKER)  # the 0.x hole
    spawn(hub, HOME_VICTIM)
    victim = container_of(engine, HOME_VICTIM)
    run(engine, victim["Id"], "sh", "-c", "echo victim-only > $HOME/secret.txt")
    spawn(hub, HOME_ATTACKER)
    attacker = container_of(engine, HOME_ATTACKER)
    assert attacker["Names"] != victim["Names"]
    # one stream per exec: stdout and stderr of one exec arrive in either order
    assert "secret.txt" not in run(engine, attacker["Id"], "sh", "-c", "ls -A $HOME").split()
    assert run(engine, attacker["Id"], "sh", "-c", "cat $HOME/secret.txt 2>&1") \
        .endswith("No such file or directory")
    run(engine, attacker["Id"], "sh", "-c", "echo planted > $HOME/planted.txt")
    victim_home = homes(hub) / safe_name(HOME_VICTIM)
    assert (victim_home / "secret.txt").exists() and not (victim_home / "planted.txt").exists()
    # the victim's server was not replaced
    assert engine.inspect_container(victim["Id"])["State"]["Running"]
    assert container_of(engine, HOME_VICTIM)["Id"] == victim["Id"]
    for user in (HOME_ATTACKER, HOME_VICTIM):
        hub.api("DELETE", f"/users/{quote(user, safe='')}/server")
        hub.wait_stopped(quote(user, safe=""))


def test_a_named_server_cannot_take_over_another_users_server(hub, engine):
    assert legacy_safe_name(SERVER_ATTACKER) + "--" + legacy_safe_name(ATTACKER_SERVER) \
        == legacy_safe_name(SERVER_VICTIM)  # the 0.x hole
    spawn(hub, SERVER_VICTIM)
    victim = container_of(engine, SERVER_VICTIM)
    spawn(hub, SERVER_ATTACKER, ATTACKER_SERVER)
    attacker = container_of(engine, SERVER_ATTACKER, ATTACKER_SERVER)
    assert object_name(SERVER_ATTACKER, ATTACKER_SERVER) != object_name(SERVER_VICTIM, "")
    assert attacker["Id"] != victim["Id"]
    assert engine.inspect_container(victim["Id"])["State"]["Running"]
    # the victim's URL still reaches the victim's server, through the real proxy
    r = hub.api("GET", f"/users/{quote(SERVER_VICTIM, safe='')}")
    assert r.json()["servers"][""]["ready"]
    url = r.json()["servers"][""]["url"]
    answer = hub.login(SERVER_VICTIM).get(f"{hub.url}{url}api/contents", timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["type"] == "directory"
    hub.api("DELETE", f"/users/{quote(SERVER_ATTACKER, safe='')}/servers/{ATTACKER_SERVER}")
    hub.api("DELETE", f"/users/{quote(SERVER_VICTIM, safe='')}/server")
    hub.wait_stopped(quote(SERVER_VICTIM, safe=""))


def test_a_home_of_another_uid_is_refused_and_kept(hub, engine):
    home = homes(hub) / safe_name("nm-otheruid")
    home.mkdir(parents=True)
    (home / "theirs.txt").write_text("x")
    os.chown(home, 4242, 4242)
    r = spawn(hub, "nm-otheruid", expect=409)
    assert "belongs to uid 4242" in r.text and str(home) in r.text
    assert home.stat().st_uid == 4242 and (home / "theirs.txt").exists()
    assert containers_of(engine, "nm-otheruid") == []
    assert f"home {home} belongs to uid 4242" in hub.tail(400)  # the admin's log line
    wait_until(lambda: hub.server("nm-otheruid") is None, 30, 0.3, "no server record")


def test_a_foreign_container_with_the_name_is_left_alone(hub, engine):
    name = object_name("nm-foreign", "")
    engine.create_container("gpuspawner/singleuser:latest", ["sleep", "600"], name=name)
    try:
        r = spawn(hub, "nm-foreign", expect=409)
        assert "not made by gpuspawner" in r.text
        assert engine.inspect_container(name)["State"]["Status"] == "created"
    finally:
        engine.remove_container(name, force=True)


def test_a_home_made_under_the_0x_name_moves_to_the_new_name(hub, engine):
    user = "nm-" + "long" * 20
    old, new = legacy_safe_name(user), safe_name(user)
    assert old != new
    legacy = homes(hub) / old
    legacy.mkdir(parents=True)
    (legacy / "notebook.ipynb").write_text("{}")
    os.chown(legacy, UID, UID)
    spawn(hub, user)
    c = container_of(engine, user)
    assert run(engine, c["Id"], "sh", "-c", "ls $HOME") == "notebook.ipynb"
    assert not legacy.exists() and (homes(hub) / new / "notebook.ipynb").exists()
    hub.api("DELETE", f"/users/{user}/server")
    hub.wait_stopped(user)
