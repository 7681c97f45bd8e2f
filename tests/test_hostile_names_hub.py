"""The injective naming scheme probed as a hostile user would (docs/security.md, "Names").

Each attack is one test. The three that worked when the probe was written (marked "was a
hole" in a comment above the test) failed then and pass since their fixes.

- names: pairs built from the scheme itself (the 48-character boundary, ``-z``, escapes of
  shortened parts, named servers with ``-``, JupyterHub's lower-casing, Unicode spellings)
  never share a container, network, job, certificate or home name (pure);
- a second hub on the same engine never removes, joins or adopts the first hub's objects
  (real engine, no hub process);
- homes across the 0.x upgrade (real hub): a user whose *new* name is another user's 0.x home
  folder, a user whose 0.x name is a deleted user's current home, a symbolic link planted in
  one's own home;
- Slurm (the private cluster): job names are whole object names, ``remove_server`` finds held jobs
  by their exact name; the output file the hub reads when a server dies during start.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import replace
from itertools import product
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest

from gpuspawner.hub.identity import (
    MAX_NAME_CHARS,
    escape_name,
    is_shortened,
    job_object_name,
    legacy_safe_name,
    object_name,
    safe_name,
    unescape_name,
)

# -- names (pure) ---------------------------------------------------------------------------------


def _users() -> list[str]:
    """User names built to meet each other's parts."""
    long = "hn-" + "ä" * 30  # 63 escape characters: shortened
    out = [
        "x" * 48, "x" * 49, "x" * 47 + "_", "x" * 46 + "_",  # the boundary, both sides
        "x" * 45 + "é", "x" * 46 + "é",  # a 2-byte unit (6 chars) across the boundary
        long, long + "a", long[:-1],
        safe_name(long),  # a name spelling another's shortened part
        safe_name(long).replace("-z", "-7a"),  # ... with the mark read as an escape of "z"
        "hn--z" + "a" * 26, "hn-z", "-z", "z", "-7a",  # literal marks
        "a--b", "a-2d-2db", "a", "a-", "a-2d", "jupyter-a", "job-a",  # the separators
        "é", "e\u0301", "\uff45",  # NFC, NFD, full-width: three hub users, three names
        "\x0123", "\x123",  # escapism's collision
    ]
    for text in list(out):
        raw = unescape_name(safe_name(text))
        if raw is not None:
            out.append(raw)  # the text whose escape is that part
    return sorted(set(out))


#: server names JupyterHub 6 lets a user create (safe slugs: [a-z0-9-], no "--") and older
#: ones it still starts (allow_invalid_named_server_start)
SERVERS = ["", "a", "b", "2db", "z", "a-b", "a-2db", "zabc", "gpu-1", "x" * 30,
           "a-b-c-d-e-f-g-h-i-j-k-l-m-n-o", "a-z", "jupyter"]


def test_scheme_built_user_and_server_names_never_share_an_object_name():
    users = _users()
    names: dict[str, tuple[str, str]] = {}
    for user, server in product(users, SERVERS):
        name = object_name(user, server)
        assert names.setdefault(name, (user, server)) == (user, server), name
        assert len(name) <= len("jupyter---") + 2 * MAX_NAME_CHARS
        assert re.fullmatch(r"jupyter-[a-z0-9-]+", name)
    # networks are "<name>-net", certificates "server-<name>", folders "<name>": injective too
    assert len({n + "-net" for n in names}) == len(names)
    # notebook jobs: their own injective names, never a server's
    jobs = {job_object_name(u, j) for u, j in product(users, ["1", "a-b", "z", ""])}
    assert len(jobs) == len(users) * 4 and not jobs & set(names)
    parts = {safe_name(u): u for u in users}
    assert len(parts) == len(users)  # one home folder per user
    for part in parts:
        assert ("-z" in part) == is_shortened(part)


def test_the_boundary_is_where_the_docs_say():
    assert safe_name("x" * 48) == "x" * 48 and is_shortened(safe_name("x" * 49))
    assert is_shortened(safe_name("x" * 46 + "_"))  # 46 + 3 = 49 characters
    assert len(escape_name("x" * 45 + "_")) == 48 and not is_shortened(safe_name("x" * 45 + "_"))


def test_jupyterhub_normalisation_makes_one_hub_user_before_names_are_made():
    """JupyterHub lower-cases user names (Authenticator.normalize_username, str.lower, no
    Unicode normalisation): spellings it merges are one hub user, one name; spellings it keeps
    apart (NFC, NFD, full width) are distinct users with distinct names."""
    from jupyterhub.auth import Authenticator

    norm = Authenticator().normalize_username
    assert norm("HN-Alice") == norm("hn-alice") == "hn-alice"
    assert norm("\u212aate") == "kate"  # the Kelvin sign lower-cases to "k"
    spellings = ["hn-\u00e9", "hn-e\u0301", "hn-\uff45", "hn-\u00c9"]
    assert len({safe_name(norm(s)) for s in spellings}) == 3  # É folds into é, the rest stay


# -- two hubs on one engine (real engine, no hub process) -----------------------------------------

IMAGE = "gpuspawner/singleuser:latest"


@pytest.fixture(scope="module")
def engine():
    docker = pytest.importorskip("docker")
    try:
        c = docker.APIClient(version="auto")
        c.inspect_image(IMAGE)
    except Exception as e:
        pytest.skip(f"needs a Docker engine and {IMAGE} (make engine images): {e}")
    return c


@pytest.mark.docker
async def test_a_second_hub_never_removes_joins_or_adopts_the_first_hubs_objects(engine):
    from gpuspawner.backends.base import NameTaken, ServerRef
    from gpuspawner.backends.docker_backend import DockerBackend
    from gpuspawner.backends.docker_network import NetworkManager, parse_pool
    from gpuspawner.backends.spec import HUB_LABEL, MANAGED_LABEL
    from tests.test_hub_e2e import remove_objects_of

    user = f"hn-twohub-{uuid.uuid4().hex[:6]}"
    ref = ServerRef(user, "", object_name(user, ""))
    hub_a, hub_b = f"hn-hub-a-{uuid.uuid4().hex[:8]}", f"hn-hub-b-{uuid.uuid4().hex[:8]}"
    owner_a = {**ref.labels, HUB_LABEL: hub_a}
    b = DockerBackend()
    b.hub_id = hub_b
    b.bind({"local": SimpleNamespace(docker_url="", network_pool="")})  # type: ignore[dict-item]
    try:
        net = NetworkManager(engine, parse_pool(b.server_network_pool)).create(
            f"{ref.name}-net", owner_a)
        cid = engine.create_container(IMAGE, ["sleep", "600"], name=ref.name,
                                      labels={MANAGED_LABEL: "1", **owner_a})["Id"]
        with pytest.raises(NameTaken, match="exists and is of user"):
            await b._remove_named("local", ref)  # never replaced
        with pytest.raises(NameTaken, match="network"):
            await b.prepare(ref, SimpleNamespace(node="local"), {})  # never joined
        await b.remove_server("local", ref)  # an interrupted spawn's clean-up: not ours
        assert cid not in {m.handle for m in await b.list_managed()}  # never adopted
        assert engine.inspect_container(cid)["Id"] == cid
        assert engine.inspect_network(net.name)["Labels"][HUB_LABEL] == hub_a
    finally:
        # hub_a is no hub this process started, so remove_objects_of (which removes only
        # those) leaves its objects: remove them by its label
        for c in engine.containers(all=True, filters={"label": f"{HUB_LABEL}={hub_a}"}):
            engine.remove_container(c["Id"], force=True)
        for n in engine.networks(filters={"label": f"{HUB_LABEL}={hub_a}"}):
            engine.remove_network(n["Id"])
        remove_objects_of(engine, [user])


# -- homes across the upgrade (real hub) ----------------------------------------------------------


#: characters a claimant's name may hold (no URL quoting surprises in the tests)
SAFE_URL = set("abcdefghijklmnopqrstuvwxyz0123456789-._~@+$!*")


def claimant(prefix: str) -> tuple[str, str]:
    """(long, short): ``long``'s 0.x name is shortened (cut escape, ``-``, 12 hex digits) and is
    the escape of ``short`` (under 0.x, ``short``'s kept name: the two shared a folder);
    both names start with ``prefix``.

    About a third of long names whose cut falls between escape units have such a ``short``:
    the hash's first two hex digits read as the escape of an ASCII character that is not
    kept (``$``, ``.``, ``@``, ...), the other ten as ten kept characters."""
    for i in range(1000):
        long = f"{prefix}{'x' * 40}{i}"
        short = unescape_name(legacy_safe_name(long))
        if short and short.startswith(prefix) and set(short[len(prefix):]) <= SAFE_URL:
            return long, short
    raise AssertionError(f"no claimant for {prefix!r}")


#: A's 0.x home folder is B's home folder today: B is made after the upgrade, before A's
#: first spawn
HOME_VICTIM, HOME_ATTACKER = claimant("hn-victim-")
#: the same with distinct uids (uid_map)
UID_VICTIM, UID_ATTACKER = claimant("hn-uidvic-")
#: B's 0.x name is A's home folder today; A spawned under the new names
MOVE_ATTACKER, MOVE_VICTIM = claimant("hn-mover-")
DEL_ATTACKER, DEL_VICTIM = claimant("hn-delmv-")
LINKER, LINKEE = "hn-linker", "hn-linkee"
HUB_USERS = (HOME_VICTIM, HOME_ATTACKER, UID_VICTIM, UID_ATTACKER, MOVE_ATTACKER, MOVE_VICTIM,
             DEL_ATTACKER, DEL_VICTIM, LINKER, LINKEE)
UID = 1000  # hub_config's default_uid, every demo user's


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    from tests.hubrunner import Hub
    from tests.test_hub_e2e import _engine, remove_objects_of

    _engine()  # skips without configurable-http-proxy
    tmp = tmp_path_factory.mktemp("hostilenames")
    uid_map = {UID_VICTIM: {"uid": 3101}, UID_ATTACKER: {"uid": 3102}}
    h = Hub(tmp, [{"name": "local", "topology": "auto"}],
            [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}],
            extra_config=f"c.GPUSpawner.http_timeout = 30\nc.GPUSpawner.uid_map = {uid_map!r}\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    yield h
    h.stop()
    remove_objects_of(engine, HUB_USERS)


def homes(hub) -> Path:
    return Path(hub.env["GPUSPAWNER_STATE_DIR"]).parent / "home"


def q(user: str) -> str:
    return quote(user, safe="")


def make_user(hub, user: str) -> None:
    r = hub.api("POST", f"/users/{q(user)}")
    assert r.status_code in (201, 409), r.text


def spawn(hub, user: str, expect: int | None = None):
    make_user(hub, user)
    r = hub.api("POST", f"/users/{q(user)}/server", {"profile": "cpu"})
    if expect is not None:
        assert r.status_code == expect, r.text
        return r
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(q(user))
    return r


def spawn_if_allowed(hub, user: str) -> bool:
    """Spawn ``user``'s server: True when it runs, False when refused with 409 (what a fix may
    answer for a home it cannot attribute)."""
    make_user(hub, user)
    r = hub.api("POST", f"/users/{q(user)}/server", {"profile": "cpu"})
    if r.status_code == 409:
        return False
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(q(user))
    return True


def stop(hub, user: str) -> None:
    if hub.server(q(user)) is not None:
        hub.api("DELETE", f"/users/{q(user)}/server")
        hub.wait_stopped(q(user))


def sh(engine, user: str, script: str) -> str:
    from tests.test_hub_e2e import containers_of

    (c,) = containers_of(engine, user)
    ex = engine.exec_create(c["Id"], ["sh", "-c", script])
    return engine.exec_start(ex).decode(errors="replace").strip()


def plant_home(path: Path, uid: int, secret: str) -> None:
    path.mkdir(parents=True)
    (path / "secret.txt").write_text(secret)
    os.chown(path / "secret.txt", uid, uid)
    path.chmod(0o700)
    os.chown(path, uid, uid)


@pytest.mark.docker
@pytest.mark.hub
# was a hole: a user whose new (kept) name part is another user's 0.x home folder is handed that
# folder as its home ('kept', same uid) before the victim's first spawn moves it; the victim's
# move is then refused because the attacker exists (shared uid: demo/default_uid)
def test_a_new_name_equal_to_another_users_0x_home_does_not_get_it(hub, engine):
    victim, attacker = HOME_VICTIM, HOME_ATTACKER
    old = legacy_safe_name(victim)
    # B's escape spells A's 0.x folder (under 0.x they shared it); today B's part is shortened
    assert escape_name(attacker) == old != safe_name(attacker)
    plant_home(homes(hub) / old, UID, "victim-0x-secret")  # A's home, made by 0.x
    make_user(hub, victim)  # A: a user of the hub who has not spawned since the upgrade
    try:
        if spawn_if_allowed(hub, attacker):  # B: any name, made after the upgrade
            seen = sh(engine, attacker, "cat $HOME/secret.txt 2>&1; ls -A $HOME")
            assert "victim-0x-secret" not in seen, f"the attacker reads the victim's home: {seen}"
            stop(hub, attacker)
        spawn(hub, victim)
        # a folder some other name spells is not moved automatically: it stays for the admin
        assert (homes(hub) / old / "secret.txt").read_text().strip() == "victim-0x-secret"
    finally:
        stop(hub, attacker)
        stop(hub, victim)


@pytest.mark.docker
@pytest.mark.hub
def test_with_distinct_uids_the_0x_home_of_another_uid_is_refused(hub, engine):
    """The same attack where uids differ (uid_map; LDAP's uidNumber alike): the attacker
    gets a home of its own, the victim's 0.x folder stays untouched."""
    victim, attacker = UID_VICTIM, UID_ATTACKER
    folder = homes(hub) / legacy_safe_name(victim)
    assert escape_name(attacker) == folder.name != safe_name(attacker)
    plant_home(folder, 3101, "uid-victim-secret")
    make_user(hub, victim)
    try:
        spawn(hub, attacker)  # a home of its own: its part is not the victim's folder
        assert sh(engine, attacker, "test -e $HOME/secret.txt && echo leak || echo own") \
            == "own"
        st = folder.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (3101, 0o700)
        assert (folder / "secret.txt").read_text() == "uid-victim-secret"
    finally:
        stop(hub, attacker)


def _victim_home_and_attacker(hub, engine, victim: str, attacker: str, secret: str) -> Path:
    """The victim spawns under the new names (its home is the attacker's 0.x name), leaves a
    secret and stops."""
    # the victim's escape is the attacker's 0.x folder; the victim's part today is not
    assert escape_name(victim) == legacy_safe_name(attacker) != safe_name(victim)
    spawn(hub, victim)
    sh(engine, victim, f"echo {secret} > $HOME/secret.txt")
    stop(hub, victim)
    home = homes(hub) / safe_name(victim)
    assert (home / "secret.txt").read_text().strip() == secret
    return home


@pytest.mark.docker
@pytest.mark.hub
def test_a_0x_name_equal_to_an_existing_users_home_does_not_move_it(hub, engine):
    """B's 0.x name is A's current home folder and A is a user of the hub: B's spawn does not
    move A's home into B's (legacy_home_owner), B gets a home of its own."""
    victim, attacker = MOVE_VICTIM, MOVE_ATTACKER
    home = _victim_home_and_attacker(hub, engine, victim, attacker, "mover-secret")
    try:
        spawn(hub, attacker)
        assert sh(engine, attacker, "test -e $HOME/secret.txt && echo leak || echo own") \
            == "own"
        assert (home / "secret.txt").read_text().strip() == "mover-secret"
    finally:
        stop(hub, attacker)


@pytest.mark.docker
@pytest.mark.hub
# was a hole: once user A is deleted from the hub's database (its home stays on disk), a user B
# whose 0.x name is A's current home folder gets that home moved into B's new home at its first
# spawn (same uid); A, made again later, finds an empty home
def test_a_deleted_users_home_is_not_moved_into_another_users_home(hub, engine):
    victim, attacker = DEL_VICTIM, DEL_ATTACKER
    home = _victim_home_and_attacker(hub, engine, victim, attacker, "deleted-secret")
    r = hub.api("DELETE", f"/users/{q(victim)}")  # the admin prunes the user; files stay
    assert r.status_code == 204, r.text
    try:
        if spawn_if_allowed(hub, attacker):
            seen = sh(engine, attacker, "cat $HOME/secret.txt 2>&1; ls -A $HOME")
            assert "deleted-secret" not in seen, f"the attacker got the victim's home: {seen}"
        assert (home / "secret.txt").read_text().strip() == "deleted-secret"
    finally:
        stop(hub, attacker)


@pytest.mark.docker
@pytest.mark.hub
def test_a_link_planted_in_ones_home_is_never_followed(hub, engine):
    """Links in one's own home to another home (its host path), to / and to themselves: the
    next spawn keeps the home as it is (the rules look at the folder, never into it), the
    other home is untouched and not reachable from the container."""
    other = homes(hub) / safe_name(LINKEE)
    plant_home(other, UID, "linkee-secret")
    before = other.stat()
    spawn(hub, LINKER)
    try:
        mine = homes(hub) / safe_name(LINKER)
        sh(engine, LINKER, f"ln -s {other} $HOME/other; ln -s {other}/secret.txt $HOME/s; "
                           "ln -s / $HOME/root; ln -s loop $HOME/loop")
        stop(hub, LINKER)
        spawn(hub, LINKER)  # the home is checked again, as root, with the links in it
        assert sh(engine, LINKER, "cat $HOME/other/secret.txt $HOME/s 2>&1 | "
                                  "grep -c linkee-secret") == "0"
        st = mine.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == UID
        after = other.stat()
        assert (after.st_ino, after.st_uid, after.st_mode, after.st_mtime) == (
            before.st_ino, before.st_uid, before.st_mode, before.st_mtime)
        assert sorted(p.name for p in other.iterdir()) == ["secret.txt"]
    finally:
        stop(hub, LINKER)


# -- Slurm ----------------------------------------------------------------------------------------

# the cluster's fixtures (they skip, with the reason, when it is not up)
from tests.test_slurm_backend import (  # noqa: E402, F401  (fixtures)
    JOB_USER,
    client,
    ledger_pair,
    make_backend,
    server_spec,
    slurm_conf,
    workdir,
)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.slurm
def test_slurm_job_names_are_whole_object_names_and_cancelled_by_exact_name(
        slurm_conf, client):  # noqa: F811
    """Two servers of one user whose object names (almost 90 characters) differ only in their
    last character: Slurm keeps both names whole, and remove_server of one (an interrupted
    spawn's clean-up, which finds held jobs by name) never cancels the other's job."""
    from gpuspawner.backends.base import ServerRef

    backend = make_backend(slurm_conf, Path("/tmp"))
    user = f"hn-slurm-{uuid.uuid4().hex[:6]}-" + "\u00e9" * 20  # a shortened part
    refs = [ServerRef(user, s, object_name(user, s)) for s in
            ("a-" + "b" * 28, "a-" + "b" * 27 + "c")]  # 30: JupyterHub's longest
    assert len(refs[0].name) > 85 and refs[0].name[:-1] == refs[1].name[:-1]
    ids = []
    try:
        for ref in refs:
            ids.append(_run(client.sbatch("#!/bin/sh\ntrue\n", [
                "--hold", f"--job-name={ref.name}", "--mem=10", "--chdir=/tmp",
                "--output=/dev/null", "--comment=gpuspawner-submitted:x"], user=JOB_USER)))
        for job_id, ref in zip(ids, refs, strict=True):
            assert _run(client.show_job(job_id)).name == ref.name
        _run(backend.remove_server("node1", refs[1]))
        assert ids[0] in set(_run(client.squeue(ids)))
    finally:
        for job_id in ids:
            _run(client.scancel(job_id))


@pytest.mark.slurm
# was a hole: when a Slurm server died during start the hub (root) read the last lines of
# the job's output file, following a symbolic link the job's user put in its place, and showed
# them in the spawn error (any root-readable file leaked to the user)
def test_a_link_in_place_of_the_job_output_is_not_followed_by_the_hub(
        slurm_conf, client, workdir):  # noqa: F811
    from gpuspawner.backends.base import LaunchFailed

    vault = Path(tempfile.mkdtemp(prefix="hn-vault-"))  # root's, 0700
    secret = f"hn-root-only-{uuid.uuid4().hex}"
    (vault / "secret").write_text(secret + "\n")
    (vault / "secret").chmod(0o600)
    backend = make_backend(slurm_conf, workdir)
    alloc, _ = ledger_pair()
    name = f"hn-outlink-{uuid.uuid4().hex[:6]}"
    # what the user's own server (say a line of ~/.jupyter/jupyter_server_config.py) does
    script = (f'f={workdir}/slurm-{name}-"$SLURM_JOB_ID".out; cat {vault}/secret 2>/dev/null '
              f'&& exit 9; rm -f "$f"; ln -s {vault}/secret "$f"; exit 3')
    spec = replace(server_spec(alloc, workdir, name), cmd=("/bin/sh", "-c", script))
    state: dict[str, Any] = {}
    try:
        try:
            _run(backend.launch(spec, state, lambda p, m: None))
            deadline = time.monotonic() + 30
            report = None
            while report is None and time.monotonic() < deadline:
                report = _run(backend.exit_report(state))
                time.sleep(0.3)
            message = str(report)
        except LaunchFailed as e:
            message = str(e)
        assert "ExitCode=3" in message, message  # the job user could not read it itself
        assert secret not in message, f"the spawn error shows a root-only file: {message}"
    finally:
        _run(backend.cleanup(alloc, state))
        shutil.rmtree(vault, ignore_errors=True)
