"""LDAP login for GPUSpawner hubs: ``jupyterhub-ldapauthenticator`` 2.x plus LDAP groups as
JupyterHub groups and posix ids in ``auth_state``.

``ldapauthenticator`` 2.0.2 (its ``ldapauthenticator.py``) binds as the user, checks
``allowed_groups`` (group DNs) and returns ``auth_state = {"ldap_groups": [...],
"user_attributes": {...}}``; it never returns JupyterHub group *names*, so JupyterHub's
``Authenticator.manage_groups`` (JupyterHub >= 2.2: ``authenticate`` may return ``groups``, the
hub then sets the user's memberships at every login) has nothing to work with.
:class:`GPULDAPAuthenticator` adds that: with the same bound connection it searches
``group_search_base`` for the groups the user belongs to (posixGroup ``memberUid``, or
``member``/``uniqueMember`` with the user's DN) and returns their ``cn`` as ``groups``. It also
copies ``uidNumber``, ``gidNumber`` and ``homeDirectory`` to the top level of ``auth_state`` as
single values, where :meth:`gpuspawner.hub.spawner.GPUSpawner.run_auth_state_hook` reads them.

Configuration for a site: ``hub_config/ldap.py``.
"""

from __future__ import annotations

from typing import Any

import ldap3
from ldap3.utils.conv import escape_filter_chars
from ldapauthenticator import LDAPAuthenticator
from traitlets import Bool, Dict, List, Unicode, default

#: auth_state keys copied to the top level (posix account attributes, RFC 2307)
POSIX_KEYS = ("uidNumber", "gidNumber", "homeDirectory")

# private key carrying the group search result from get_user_attributes to authenticate
_GROUPS_KEY = "__gpuspawner_groups__"


def _single(value: Any) -> Any:
    """ldap3 returns every attribute as a list; a posix attribute has one value."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


class GPULDAPAuthenticator(LDAPAuthenticator):
    """LDAPAuthenticator whose LDAP groups become JupyterHub groups (``manage_groups``) and
    whose ``auth_state`` carries the posix ids that own the user's shared home."""

    @default("manage_groups")
    def _default_manage_groups(self) -> bool:
        return True

    @default("auth_state_attributes")
    def _default_auth_state_attributes(self) -> list[str]:
        return list(POSIX_KEYS)

    group_search_base = Unicode(
        "",
        help="""Where the groups live, e.g. "ou=groups,dc=example,dc=org". Every group under
        it that matches group_membership_filter becomes a JupyterHub group of the same name
        (group_name_attribute) at each login. Empty = no group sync (groups stay as the hub
        has them; with manage_groups the user then has no groups).
        """,
    ).tag(config=True)

    group_membership_filter = Unicode(
        "(|(memberUid={uid})(member={userdn})(uniqueMember={userdn}))",
        help="""Search filter for the user's groups: {uid} is the account's uid attribute,
        {userdn} its DN (both escaped, RFC 4515). The default covers posixGroup (RFC 2307),
        groupOfNames and groupOfUniqueNames.""",
    ).tag(config=True)

    group_name_attribute = Unicode(
        "cn", help="Attribute of a group entry that names the JupyterHub group.",
    ).tag(config=True)

    group_name_map = Dict(
        Unicode(),
        help="""Rename LDAP groups on their way in: {ldap name: JupyterHub name}. Groups not
        listed keep their LDAP name.""",
    ).tag(config=True)

    only_mapped_groups = Bool(
        False,
        help="True: only groups listed in group_name_map become JupyterHub groups.",
    ).tag(config=True)

    admin_ldap_groups = List(
        Unicode(),
        help="""JupyterHub group names (after group_name_map) whose members log in as hub
        admins. Membership is checked at each login; leaving the group does not revoke admin
        rights given earlier (JupyterHub keeps them until an admin removes them).""",
    ).tag(config=True)

    uid_attribute = Unicode(
        "uid", help="Account attribute substituted for {uid} in group_membership_filter.",
    ).tag(config=True)

    posix_keys = List(
        Unicode(), default_value=list(POSIX_KEYS),
        help="user_attributes copied to the top level of auth_state as single values.",
    ).tag(config=True)

    # -- LDAP queries (run on the connection bound as the user) ------------------------------
    def get_user_attributes(self, conn: ldap3.Connection, userdn: str) -> dict[str, Any]:
        """The parent's attributes, plus the user's group names under a private key (taken
        out again in :meth:`authenticate`). Called by the parent's ``authenticate`` with the
        connection bound as the user, after a successful bind."""
        attrs = dict(super().get_user_attributes(conn, userdn) or {})
        attrs[_GROUPS_KEY] = self.search_groups(conn, userdn)
        return attrs

    def search_groups(self, conn: ldap3.Connection, userdn: str) -> list[str]:
        """Names of the JupyterHub groups the user belongs to (sorted), from
        ``group_search_base``; [] when it is empty."""
        if not self.group_search_base:
            return []
        uid = ""
        if conn.search(search_base=userdn, search_scope=ldap3.BASE,
                       search_filter="(objectClass=*)", attributes=[self.uid_attribute]):
            values = conn.entries[0].entry_attributes_as_dict.get(self.uid_attribute) or []
            uid = str(_single(values) or "")
        flt = self.group_membership_filter.format(uid=escape_filter_chars(uid),
                                                  userdn=escape_filter_chars(userdn))
        conn.search(search_base=self.group_search_base, search_scope=ldap3.SUBTREE,
                    search_filter=flt, attributes=[self.group_name_attribute])
        names: set[str] = set()
        for entry in conn.entries:
            name = _single(entry.entry_attributes_as_dict.get(self.group_name_attribute))
            if not name:
                continue
            name = str(name)
            if name in self.group_name_map:
                names.add(self.group_name_map[name])
            elif not self.only_mapped_groups:
                names.add(name)
        return sorted(names)

    async def authenticate(self, handler: Any, data: dict[str, str]) -> dict[str, Any] | None:
        """The parent's login (bind as the user), then ``groups`` and the posix ids.

        Returns:
            None (refused: unknown user, wrong or empty password, filters), or
            ``{"name", "auth_state", "groups"}`` where ``auth_state`` holds ``uidNumber``
            and ``gidNumber`` (int), ``homeDirectory`` (str), ``ldap_groups`` and
            ``user_attributes`` (the parent's).
        """
        model = await super().authenticate(handler, data)
        if not model:
            return None
        state = dict(model.get("auth_state") or {})
        attrs = dict(state.get("user_attributes") or {})
        groups = attrs.pop(_GROUPS_KEY, [])
        state["user_attributes"] = attrs
        for key in self.posix_keys:
            value = _single(attrs.get(key))
            if value is None:
                continue
            if key in ("uidNumber", "gidNumber"):
                value = int(value)
            state[key] = value
        model["auth_state"] = state
        if self.manage_groups:
            model["groups"] = groups
        if set(groups) & set(self.admin_ldap_groups):
            model["admin"] = True
        self.log.info("LDAP login %s: uid %s gid %s, groups %s", model["name"],
                      state.get("uidNumber"), state.get("gidNumber"), ", ".join(groups) or "-")
        return model
