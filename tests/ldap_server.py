"""A private OpenLDAP ``slapd`` on a free loopback port, with a small directory of posix users
in two groups, for the LDAP tests (see ../shared/ENVIRONMENT.md, "LDAP").

The server uses its own ``slapd.conf`` and an mdb database in a temporary folder, so the
system's slapd (if any) is never touched. Debian's ``slapd`` and ``ldap-utils`` are installed by
``scripts/ldap.sh`` (a prerequisite of ``make test``); :func:`ensure_installed` runs that script
when they are missing.

Directory (base ``dc=example,dc=org``)::

    ou=people:  alice (uid 10001, gid 20001, gpu-users), bob (uid 10002, gid 20002, students),
                carol (uid 10003, gid 20003, in no group), dave (10004, 20001, gpu-users),
                erin (10005, 20005, hub-admins)
    ou=groups:  posixGroups gpu-users (memberUid alice, dave), students (bob),
                hub-admins (erin)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hubrunner import free_port

REPO = Path(__file__).resolve().parents[1]
SLAPD = "/usr/sbin/slapd"
BASE_DN = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{BASE_DN}"
ROOT_PW = "directory-manager-secret"
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")


@dataclass(frozen=True)
class LdapUser:
    """A posix account of the test directory (``uidNumber``/``gidNumber`` own the home)."""

    uid: str
    password: str
    uid_number: int
    gid_number: int
    groups: tuple[str, ...]

    @property
    def home(self) -> str:
        return f"/home/{self.uid}"


USERS = (
    LdapUser("alice", "alice-pw-1", 10001, 20001, ("gpu-users",)),
    LdapUser("bob", "bob-pw-2", 10002, 20002, ("students",)),
    LdapUser("carol", "carol-pw-3", 10003, 20003, ()),
    LdapUser("dave", "dave-pw-4", 10004, 20001, ("gpu-users",)),
    LdapUser("erin", "erin-pw-5", 10005, 20005, ("hub-admins",)),
)
GROUPS = {"gpu-users": 20001, "students": 20002, "hub-admins": 20005}


def ensure_installed() -> None:
    """Install slapd + ldap-utils with ``scripts/ldap.sh`` when missing (root, apt).

    Raises:
        RuntimeError: the script failed (its output is in the message).
    """
    if os.path.exists(SLAPD) and shutil.which("ldapsearch"):
        return
    r = subprocess.run([str(REPO / "scripts" / "ldap.sh")], capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/ldap.sh failed:\n{r.stdout}\n{r.stderr}")




def init_ldif(users: tuple[LdapUser, ...] = USERS) -> str:
    """The directory's entries as LDIF (passwords stored in clear: a test directory only)."""
    parts = [f"""dn: {BASE_DN}
objectClass: dcObject
objectClass: organization
o: example
dc: example

dn: ou=people,{BASE_DN}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{BASE_DN}
objectClass: organizationalUnit
ou: groups
"""]
    for u in users:
        parts.append(f"""dn: uid={u.uid},ou=people,{BASE_DN}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: {u.uid}
cn: {u.uid.title()}
sn: {u.uid.title()}
uidNumber: {u.uid_number}
gidNumber: {u.gid_number}
homeDirectory: {u.home}
loginShell: /bin/bash
userPassword: {u.password}
""")
    for name, gid in GROUPS.items():
        members = "".join(f"memberUid: {u.uid}\n" for u in users if name in u.groups)
        parts.append(f"""dn: cn={name},ou=groups,{BASE_DN}
objectClass: posixGroup
cn: {name}
gidNumber: {gid}
{members}""")
    return "\n".join(parts)


class Slapd:
    """One slapd process serving the test directory on ``ldap://127.0.0.1:<port>/``.

    Args:
        workdir: an empty folder for the configuration, database and log.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"ldap://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen | None = None

    def _write(self) -> Path:
        db = self.workdir / "db"
        db.mkdir(parents=True, exist_ok=True)
        includes = "\n".join(f"include /etc/ldap/schema/{s}.schema" for s in SCHEMAS)
        conf = self.workdir / "slapd.conf"
        conf.write_text(f"""{includes}
pidfile {self.workdir / 'slapd.pid'}
argsfile {self.workdir / 'slapd.args'}
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 67108864
suffix "{BASE_DN}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PW}
directory {db}
access to attrs=userPassword by self auth by anonymous auth by * none
access to * by * read
""")
        ldif = self.workdir / "init.ldif"
        ldif.write_text(init_ldif())
        r = subprocess.run(["/usr/sbin/slapadd", "-f", str(conf), "-l", str(ldif)],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"slapadd failed: {r.stderr}")
        return conf

    def start(self, timeout: float = 20) -> None:
        """Start slapd in the foreground (``-d 0``) and wait, at most ``timeout`` seconds,
        until an anonymous search of the base answers."""
        conf = self._write()
        log = open(self.workdir / "slapd.log", "ab")
        self.proc = subprocess.Popen([SLAPD, "-d", "0", "-f", str(conf), "-h", self.url],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"slapd exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'slapd.log').read_text()[-2000:]}")
            r = subprocess.run(["ldapsearch", "-x", "-H", self.url, "-b", BASE_DN, "-s",
                                "base", "dn"], capture_output=True, timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"slapd did not answer on {self.url} in {timeout}s")

    def stop(self) -> None:
        """Terminate this slapd (only the process started here)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    """A private slapd on loopback for one test module (imported by the LDAP test modules)."""
    ensure_installed()
    server = Slapd(tmp_path_factory.mktemp("slapd"))
    server.start()
    yield server
    server.stop()
