"""LDAP login for a site: load it after the main configuration.

    # /etc/jupyterhub/jupyterhub_config.py
    load_subconfig("/path/to/gpuspawner/hub_config/jupyterhub_config.py")
    load_subconfig("/path/to/gpuspawner/hub_config/ldap.py")

It replaces the demo authenticator with :class:`gpuspawner.hub.auth.GPULDAPAuthenticator`
(jupyterhub-ldapauthenticator 2.x, plus LDAP groups as JupyterHub groups):

- users bind with ``uid=<name>,<people>``; a wrong password or an unknown user is refused;
- ``auth_state`` (encrypted in the hub database; needs ``JUPYTERHUB_CRYPT_KEY``, e.g.
  ``export JUPYTERHUB_CRYPT_KEY=$(openssl rand -hex 32)``) keeps ``uidNumber``, ``gidNumber``
  and ``homeDirectory``: GPUSpawner runs the container as uidNumber:gidNumber and gives the
  shared home (``c.GPUSpawner.home_path_template``) to them;
- the LDAP groups the user is in (under ``<groups>``) become the user's JupyterHub groups at
  every login (``manage_groups``), so profiles with ``groups: [gpu-users]`` and group quotas
  (``c.GPUSpawner.quotas["groups"]``) follow the directory;
- admins are the members of ``GPUSPAWNER_LDAP_ADMIN_GROUP`` (when they log in) and whoever
  ``c.Authenticator.admin_users`` names, nobody else: the shipped file's demo admin
  (``admin``) and its culling exemption apply only with the demo authenticator
  (:mod:`gpuspawner.hub.demo`), so a directory account named ``admin`` is an ordinary user.
  The hub's start-up log says who is admin.

Settings, from the environment (defaults in brackets) so one file serves every site:

======================================  =====================================================
``GPUSPAWNER_LDAP_URL``                 ``ldaps://ldap.example.org`` (ldap:// or ldaps://,
                                        optional port)
``GPUSPAWNER_LDAP_BASE_DN``             ``dc=example,dc=org``
``GPUSPAWNER_LDAP_PEOPLE``              ``ou=people,<base>``
``GPUSPAWNER_LDAP_GROUPS``              ``ou=groups,<base>``
``GPUSPAWNER_LDAP_TLS``                 ``on_connect`` for ldaps://, else ``before_bind``
                                        (StartTLS); ``insecure`` only on loopback (tests)
``GPUSPAWNER_LDAP_ALLOWED_GROUPS``      empty = every account may log in; else comma
                                        separated group names (cn under <groups>)
``GPUSPAWNER_LDAP_ADMIN_GROUP``         ``hub-admins``: members are JupyterHub admins
======================================  =====================================================
"""

import os
from urllib.parse import urlsplit

c = get_config()  # noqa: F821  (provided by JupyterHub's load_subconfig)

url = urlsplit(os.environ.get("GPUSPAWNER_LDAP_URL", "ldaps://ldap.example.org"))
base = os.environ.get("GPUSPAWNER_LDAP_BASE_DN", "dc=example,dc=org")
people = os.environ.get("GPUSPAWNER_LDAP_PEOPLE", f"ou=people,{base}")
groups = os.environ.get("GPUSPAWNER_LDAP_GROUPS", f"ou=groups,{base}")
tls = os.environ.get("GPUSPAWNER_LDAP_TLS",
                     "on_connect" if url.scheme == "ldaps" else "before_bind")
if tls == "insecure" and url.hostname not in ("127.0.0.1", "localhost", "::1"):
    raise ValueError("GPUSPAWNER_LDAP_TLS=insecure sends passwords in clear text; it is "
                     f"refused for {url.hostname!r} (allowed on loopback only)")

c.JupyterHub.authenticator_class = "gpu-ldap"  # gpuspawner.hub.auth.GPULDAPAuthenticator
a = c.GPULDAPAuthenticator
a.server_address = url.hostname or "localhost"
if url.port:
    a.server_port = url.port
a.tls_strategy = tls
a.bind_dn_template = [f"uid={{username}},{people}"]
# the posix account's ids and home: GPUSpawner reads them from auth_state
a.auth_state_attributes = ["uidNumber", "gidNumber", "homeDirectory"]
# LDAP groups -> JupyterHub groups at every login
a.manage_groups = True
a.group_search_base = groups
a.group_membership_filter = "(|(memberUid={uid})(member={userdn})(uniqueMember={userdn}))"
# LDAP user names are lower case letters, digits, '.', '_' and '-'
a.valid_username_regex = r"^[a-z][.a-z0-9_-]*$"

allowed = [g.strip() for g in os.environ.get("GPUSPAWNER_LDAP_ALLOWED_GROUPS", "").split(",")
           if g.strip()]
if allowed:
    c.Authenticator.allow_all = False
    a.allowed_groups = [f"cn={g},{groups}" for g in allowed]
    # ldapauthenticator checks allowed_groups with a BASE search on each group DN
    a.group_search_filter = "(|(member={userdn})(uniqueMember={userdn})(memberUid={uid}))"
else:
    c.Authenticator.allow_all = True

admin_group = os.environ.get("GPUSPAWNER_LDAP_ADMIN_GROUP", "hub-admins")
if admin_group:
    a.admin_ldap_groups = [admin_group]

# auth_state carries the posix ids; without a key JupyterHub refuses to store it
c.Authenticator.enable_auth_state = True
if not os.environ.get("JUPYTERHUB_CRYPT_KEY"):
    raise ValueError("hub_config/ldap.py: set JUPYTERHUB_CRYPT_KEY (openssl rand -hex 32); "
                     "auth_state holds uidNumber/gidNumber for the shared home")
