"""LDAP end to end (marked ``docker``): a real slapd on loopback (tests/ldap_server.py), a real hub
loading ``hub_config/ldap.py`` after the main configuration, logins through the hub's login form
over HTTP, GPUSpawner containers on the real engine.

Checks: auth_state keeps uidNumber/gidNumber/homeDirectory; LDAP groups become JupyterHub groups;
the host home directory ends up owned by the LDAP uid/gid and the container runs as them;
gpu-users members are offered the GPU profile and students members are not; wrong passwords,
unknown users and accounts outside the allowed groups are refused; the third GPU of a gpu-users
member with a 2-GPU quota is refused (GPUs held as in tests/test_service_hub.py: labelled
containers restored into the ledger at hub start).
"""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest
import requests

from gpuspawner.testing.waiting import wait_until
from tests.hubrunner import REPO, Hub, own
from tests.ldap_server import BASE_DN, ROOT_DN, ROOT_PW, USERS
from tests.test_service_hub import (
    DGX,
    EXTRA_ADMIN_SCOPES,
    engine_or_skip,
    hold,
    register_owners,
    remove_held,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.ldap]
USER = {u.uid: u for u in USERS}
LDAP_CONFIG = REPO / "hub_config" / "ldap.py"


@pytest.fixture(scope="module")
def engine():
    return engine_or_skip()


@pytest.fixture(scope="module")
def hub(engine, slapd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ldaphub")
    remove_held(engine)
    hold(engine, "dgx", "dave", "g1", [2], [8, 9])
    hold(engine, "dgx", "dave", "g2", [3], [10, 11])
    nodes = [{"name": "local", "topology": "auto"}, {"name": "dgx", "topology": str(DGX)}]
    profiles = [
        {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "256M",
         "nodes": ["local"], "default": True},
        {"slug": "a100", "display_name": "1 x A100", "cpu": 2, "memory": "1G", "gpus": 1,
         "gpu_models": ["A100"], "groups": ["gpu-users"]},
    ]
    h = Hub(tmp, nodes, profiles, extra_config=(
        f"load_subconfig({str(LDAP_CONFIG)!r})\n" + EXTRA_ADMIN_SCOPES +
        "c.GPUSpawner.quotas = {'default_user': {'gpus': 2, 'servers': 3}}\n"))
    h.env.update({
        "GPUSPAWNER_LDAP_URL": f"ldap://127.0.0.1:{slapd.port}",
        "GPUSPAWNER_LDAP_BASE_DN": "dc=example,dc=org",
        "GPUSPAWNER_LDAP_TLS": "insecure",  # loopback only (ldap.py refuses it elsewhere)
        "GPUSPAWNER_LDAP_ALLOWED_GROUPS": "gpu-users,students,hub-admins",
        "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
    })
    h.start()
    register_owners(h, [("dave", "g1"), ("dave", "g2")])
    yield h
    for user in h.api("GET", "/users").json():
        for server in (user.get("servers") or {}):
            h.api("DELETE", f"/users/{user['name']}/servers/{server}" if server
                  else f"/users/{user['name']}/server")
    for user in h.api("GET", "/users").json():
        for server in (user.get("servers") or {}):
            h.wait_stopped(user["name"], server)
    h.stop()
    remove_held(engine)


@pytest.mark.parametrize("name", ["alice", "bob", "dave", "erin"])
def test_login_form_keeps_posix_ids_and_groups(hub, name):
    u = USER[name]
    s, r = hub.form_login(name, u.password)
    assert r.status_code == 200, r.text[:300]
    assert "/hub/login" not in r.url
    model = hub.api("GET", f"/users/{name}").json()
    assert model["groups"] == sorted(u.groups)
    assert model["admin"] is (name == "erin")  # hub-admins -> admin
    state = model["auth_state"]
    assert state["uidNumber"] == u.uid_number
    assert state["gidNumber"] == u.gid_number
    assert state["homeDirectory"] == u.home


@pytest.mark.parametrize("name, password", [
    ("alice", "not-her-password"),
    ("nobody", "whatever"),
    ("carol", "carol-pw-3"),  # a valid account in none of the allowed groups
])
def test_refused_logins(hub, name, password):
    s, r = hub.form_login(name, password)
    assert r.status_code == 403, (r.status_code, r.url)
    assert "Invalid username or password" in r.text
    # not logged in: the hub sends the session back to its login page
    r = s.get(f"{hub.url}/hub/home", allow_redirects=False, timeout=30)
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]
    if name != "alice":  # no hub user is made for a refused login
        assert hub.api("GET", f"/users/{name}").status_code == 404


def test_gpu_profile_offered_to_gpu_users_only(hub):
    s, _ = hub.form_login("alice", USER["alice"].password)
    html = s.get(f"{hub.url}/hub/spawn/alice", timeout=30).text
    assert 'data-profile="a100" data-available="true"' in html
    assert 'value="a100">' in html  # an enabled radio button
    s, _ = hub.form_login("bob", USER["bob"].password)
    html = s.get(f"{hub.url}/hub/spawn/bob", timeout=30).text
    assert 'data-profile="a100" data-available="false"' in html
    assert 'value="a100" disabled' in html
    assert "not available to your group" in html
    # and a REST request for it is refused, not only hidden
    r = hub.api("POST", "/users/bob/server", {"profile": "a100"})
    assert r.status_code == 400 and "not available to your groups" in r.json()["message"]


def test_home_owned_by_ldap_ids(hub, engine):
    u = USER["alice"]
    s, _ = hub.form_login("alice", u.password)
    r = s.post(f"{hub.url}/hub/spawn/alice", data={"profile": "cpu",
                                                   "_xsrf": s.cookies.get("_xsrf")},
               timeout=60)
    assert r.status_code == 200, r.text[:300]
    hub.wait_ready("alice", timeout=90)
    home = hub.state_dir / "home" / "alice"
    st = os.stat(home)
    assert (st.st_uid, st.st_gid) == (u.uid_number, u.gid_number)
    assert st.st_mode & 0o777 == 0o700
    (c,) = own(engine.containers(filters={"label": "gpuspawner.user=alice"}))
    ex = engine.exec_create(c["Id"], ["sh", "-c", "id -u; id -g; touch $HOME/x && echo ok"])
    uid, gid, ok = engine.exec_start(ex).decode().split()
    assert (int(uid), int(gid), ok) == (u.uid_number, u.gid_number, "ok")
    assert os.stat(home / "x").st_uid == u.uid_number
    hub.api("DELETE", "/users/alice/server")
    hub.wait_stopped("alice")


QUOTA_MESSAGE = "over your quota for GPUs: asked for 1 GPU, 2 GPUs of 2 GPUs in use"


def test_third_gpu_refused_form_and_rest(hub):
    s, _ = hub.form_login("dave", USER["dave"].password)
    html = s.get(f"{hub.url}/hub/spawn/dave", timeout=30).text
    assert "you use 2 of your 2 GPUs" in html
    assert 'data-profile="a100" data-available="false"' in html and "over your quota" in html
    r = s.post(f"{hub.url}/hub/spawn/dave", data={"profile": "a100",
                                                  "_xsrf": s.cookies.get("_xsrf")}, timeout=60)
    assert QUOTA_MESSAGE in r.text
    r = hub.api("POST", "/users/dave/servers/third", {"profile": "a100"})
    assert r.status_code == 400 and QUOTA_MESSAGE in r.json()["message"]
    assert not hub.api("GET", "/users/dave").json()["servers"]


ADMIN_LDIF = f"""dn: uid=admin,ou=people,{BASE_DN}
changetype: add
objectClass: inetOrgPerson
objectClass: posixAccount
uid: admin
cn: Admin
sn: Admin
uidNumber: 10009
gidNumber: 20002
homeDirectory: /home/admin
userPassword: admin-pw-9

dn: cn=students,ou=groups,{BASE_DN}
changetype: modify
add: memberUid
memberUid: admin
"""


def test_the_demo_admin_is_no_admin_with_ldap(hub, slapd):
    """Issue 46 item 8: loaded as docs/howto/ldap.md says, hub_config/ldap.py kept the demo's
    ``admin_users = {"admin"}`` and culler_policies.yaml's exemption: a directory account named
    ``admin`` (an ordinary student here) became a hub admin, got the gpuspawner service's
    admin role and was never culled. Now the demo admin exists only with the demo
    authenticator; this hub's admins are those its settings name (none: members of
    hub-admins become admins when they log in), and the start-up log says so."""
    # nobody named admin was made an admin at start (before: the user existed, admin)
    assert hub.api("GET", "/users/admin").status_code == 404
    log = hub.log_path.read_text(errors="replace")
    assert "hub admins named in the configuration (GPULDAPAuthenticator): none" in log
    assert "hub admins: none" in log
    # a directory account named admin logs in as the student it is
    r = subprocess.run(["ldapmodify", "-x", "-H", slapd.url, "-D", ROOT_DN, "-w", ROOT_PW],
                       input=ADMIN_LDIF, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    s, r = hub.form_login("admin", "admin-pw-9")
    assert r.status_code == 200 and "/hub/login" not in r.url, r.text[:300]
    model = hub.api("GET", "/users/admin").json()
    assert model["groups"] == ["students"] and model["admin"] is False
    roles = model["roles"]
    assert "user" in roles and "gpuspawner-service-admins" not in roles, roles
    # and the idle culler does not exempt them
    url = f"{hub.url}/services/idle-culler/api/policy?user=admin&groups=students"

    def policy() -> dict | None:
        try:
            r = requests.get(url, headers={"Authorization": f"token {hub.token}"}, timeout=10)
        except requests.RequestException:
            return None
        return r.json()["policy"] if r.status_code == 200 else None

    pol = wait_until(policy, 60, 0.5, "the idle culler's policy API answers")
    assert pol["exempt"]["value"] is False, pol["exempt"]
