"""GPULDAPAuthenticator against a real slapd on loopback (tests/ldap_server.py): binds, posix
ids in auth_state, LDAP groups as JupyterHub group names, refusals. No hub, no engine."""

from __future__ import annotations

import pytest

from gpuspawner.hub.auth import GPULDAPAuthenticator
from tests.ldap_server import BASE_DN, USERS

pytestmark = pytest.mark.ldap


@pytest.fixture
def auth(slapd) -> GPULDAPAuthenticator:
    a = GPULDAPAuthenticator(
        server_address="127.0.0.1", server_port=slapd.port, tls_strategy="insecure",
        bind_dn_template=[f"uid={{username}},ou=people,{BASE_DN}"],
        group_search_base=f"ou=groups,{BASE_DN}", admin_ldap_groups=["hub-admins"],
        allow_all=True)
    return a


@pytest.mark.parametrize("user", USERS, ids=[u.uid for u in USERS])
async def test_login_gives_posix_ids_and_groups(auth, user):
    model = await auth.authenticate(None, {"username": user.uid, "password": user.password})
    assert model is not None
    assert model["name"] == user.uid
    state = model["auth_state"]
    assert state["uidNumber"] == user.uid_number and isinstance(state["uidNumber"], int)
    assert state["gidNumber"] == user.gid_number
    assert state["homeDirectory"] == user.home
    assert model["groups"] == sorted(user.groups)
    assert model.get("admin", False) is ("hub-admins" in user.groups)
    # the spawner's reader finds the ids where ldapauthenticator puts them too
    assert state["user_attributes"]["uidNumber"] == [user.uid_number]


@pytest.mark.parametrize("name, password", [
    ("alice", "wrong"), ("alice", ""), ("nobody", "x"), ("alice)(uid=*", "alice-pw-1"),
])
async def test_refused(auth, name, password):
    assert await auth.authenticate(None, {"username": name, "password": password}) is None


async def test_group_name_map_and_allowed_groups(auth, slapd):
    auth.group_name_map = {"gpu-users": "gpu"}
    auth.only_mapped_groups = True
    model = await auth.authenticate(None, {"username": "alice", "password": "alice-pw-1"})
    assert model["groups"] == ["gpu"]
    bob = await auth.authenticate(None, {"username": "bob", "password": "bob-pw-2"})
    assert bob["groups"] == []
    # allowed_groups (ldapauthenticator's own check) lets only members in
    auth.allow_all = False
    auth.allowed_groups = [f"cn=gpu-users,ou=groups,{BASE_DN}"]
    carol = await auth.authenticate(None, {"username": "carol", "password": "carol-pw-3"})
    assert await auth.check_allowed("carol", carol) is False
    assert carol is not None and carol["auth_state"]["ldap_groups"] == []
    alice = await auth.authenticate(None, {"username": "alice", "password": "alice-pw-1"})
    assert await auth.check_allowed("alice", alice) is True
