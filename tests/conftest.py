"""Fixtures shared by several test modules."""

from tests.ldap_server import slapd  # noqa: F401  (a private slapd for the LDAP tests)
