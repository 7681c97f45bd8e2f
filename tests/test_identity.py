"""Names are injective (gpuspawner.hub.identity; docs/security.md, "Names") and a home is never
handed from one uid to another (gpuspawner.backends.home)."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gpuspawner.backends.home import HomeOwnedByOther, ensure_home
from gpuspawner.hub.identity import (
    HASH_CHARS,
    MAX_NAME_CHARS,
    escape_name,
    is_shortened,
    legacy_home_owner,
    legacy_home_to_move,
    legacy_safe_name,
    object_name,
    safe_name,
    unescape_name,
)

#: any Unicode text, lone surrogates included (a name part must never raise)
NAMES = st.text(st.characters(codec=None, exclude_categories=()), max_size=80)
PART = re.compile(r"[a-z0-9-]+")


def split_object_name(name: str) -> tuple[str, str]:
    """The (user part, server part) of an object name: the inverse the proof relies on."""
    body = name.removeprefix("jupyter-")
    user, sep, server = body.partition("--")
    return user, server


def adversarial(name: str) -> list[str]:
    """Raw names built from the scheme to meet ``name``'s part: the text whose escape is the
    part (a kept name spelling a shortened one), that text cut at each ``-``, and the part
    with its hash's first characters read as escapes."""
    part = safe_name(name)
    out = [part, part + "-", part.replace("-z", "-7a")]
    raw = unescape_name(part)
    if raw is not None:
        out.append(raw)
    for i in [m.start() for m in re.finditer("-", part)]:
        out.extend([part[:i], part[:i] + "_" + part[i + 1:]])
    return out


@given(NAMES, NAMES, NAMES, NAMES)
@settings(max_examples=400, deadline=None)
@example("zoë_ñúñez_dvořák", "", "zoë_ñúñez_d_ac18b1f594", "")
@example("chloé.dvořák.sjöström", "", "chloé.dvořák.sj", "f13c9545cc1b")
@example("\x12" + "3", "", "\x01" + "23", "")
def test_distinct_user_server_pairs_never_share_an_object_name(u1, s1, u2, s2):
    assume(u1 and u2 and (u1, s1) != (u2, s2))
    assert object_name(u1, s1) != object_name(u2, s2)


@given(NAMES.filter(bool))
@settings(max_examples=300, deadline=None)
@example("zoë_ñúñez_dvořák")
@example("n" * 300)
def test_names_built_from_the_scheme_do_not_collide(name):
    for other in adversarial(name):
        if other and other != name:
            assert safe_name(other) != safe_name(name), (name, other)
            assert object_name(other, "") != object_name(name, "")
            for server in ("", "z", name[:5]):
                assert object_name(other, server) != object_name(name, "x" + server)


@given(NAMES, NAMES)
@settings(max_examples=300, deadline=None)
def test_parts_have_the_shape_the_proof_needs(user, server):
    assume(user)
    for text in (user, server):
        part = safe_name(text)
        assert len(part) <= MAX_NAME_CHARS
        assert part == "" or PART.fullmatch(part)
        assert "--" not in part and not part.endswith("-")
        long = len(escape_name(text)) > MAX_NAME_CHARS
        assert ("-z" in part) == is_shortened(part) and (long <= is_shortened(part))
        if not is_shortened(part):
            assert unescape_name(part) == text
    assert split_object_name(object_name(user, server)) == (safe_name(user), safe_name(server))


def test_the_0x_collisions_are_gone():
    assert legacy_safe_name("zoë_ñúñez_dvořák") == legacy_safe_name("zoë_ñúñez_d_ac18b1f594")
    assert safe_name("zoë_ñúñez_dvořák") != safe_name("zoë_ñúñez_d_ac18b1f594")
    assert f"jupyter-{legacy_safe_name('chloé.dvořák.sjöström')}" == (
        f"jupyter-{legacy_safe_name('chloé.dvořák.sj')}--{legacy_safe_name('f13c9545cc1b')}")
    assert object_name("chloé.dvořák.sjöström", "") != object_name("chloé.dvořák.sj",
                                                                   "f13c9545cc1b")
    # escapism writes byte 0x01 then "23" and byte 0x12 then "3" alike; we do not
    assert legacy_safe_name("\x0123") == legacy_safe_name("\x123")
    assert safe_name("\x0123") != safe_name("\x123")


def test_ordinary_names_keep_their_0x_name():
    """Existing deployments: every name whose escape fits and holds no byte below 0x10 has
    the same container, network and home name as in 0.x."""
    for name in ("alice", "Bob", "a.b@c+d_e", "jürgen", "user-1", "x" * 48, "ünïcødé"):
        assert safe_name(name) == legacy_safe_name(name), name


def test_a_shortened_name_keeps_a_readable_prefix_and_a_130_bit_hash():
    part = safe_name("n" * 300)
    assert part.startswith("nnnn") and re.fullmatch(rf"n+-z[a-z2-7]{{{HASH_CHARS}}}", part)
    assert len(part) == MAX_NAME_CHARS
    with pytest.raises(ValueError, match="needs"):
        safe_name("n" * 300, limit=20)


def test_a_0x_home_moves_only_when_no_one_else_may_own_it():
    # the victim's 0.x name (shortened) is spelled by the attacker's escape: it stays put,
    # and the attacker's part today is not that folder either
    old = legacy_safe_name("zoë_ñúñez_dvořák")
    assert escape_name("zoë_ñúñez_d_ac18b1f594") == old
    assert legacy_home_to_move("zoë_ñúñez_dvořák") is None
    assert safe_name("zoë_ñúñez_d_ac18b1f594") != old
    assert legacy_home_to_move("n" * 60) == legacy_safe_name("n" * 60)  # hash "fb88…": no text
    assert legacy_home_to_move("n" * 61) is None  # "-7e…" spells "~": someone may own it
    assert legacy_home_to_move("alice") is None  # the same name today
    # a 0.x kept name that changed (a byte below 0x10) moves unless it is someone's today
    assert legacy_home_to_move("\x0123") is None  # "-123" is "\x12" "3" today
    assert legacy_home_to_move("a\x01") == "a-1"
    assert legacy_home_owner("a-1") is None


def test_a_name_shaped_like_a_0x_shortened_part_is_shortened():
    """A name whose escape looks like a 0.x shortened part (35 characters, "-", 12 hex
    digits) could be another user's 0.x home folder: its part today is shortened."""
    name = "x" * 35 + ".0123456789"  # escape: 35 x, "-2e", "0123456789"
    assert escape_name(name) == legacy_safe_name(name) == "x" * 35 + "-2e0123456789"
    assert is_shortened(safe_name(name))
    assert legacy_home_to_move(name) is None  # that folder may be someone else's 0.x home


# -- homes --------------------------------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@needs_root
def test_a_missing_home_is_made_0700_for_the_uid(tmp_path):
    home = tmp_path / "homes" / "alice"
    home.parent.mkdir()
    assert ensure_home(str(home), 4001, 4002) == "made"
    st = home.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4001, 4002, 0o700)
    assert ensure_home(str(home), 4001, 4002) == "kept"


@needs_root
def test_a_home_of_another_uid_is_never_given_away(tmp_path, caplog):
    home = tmp_path / "bob"
    home.mkdir()
    os.chown(home, 4001, 4001)
    with pytest.raises(HomeOwnedByOther, match="belongs to uid 4001, not to user 'eve'"):
        ensure_home(str(home), 4666, 4666, user="eve")
    assert home.stat().st_uid == 4001
    assert "belongs to uid 4001" in caplog.text
    assert HomeOwnedByOther(str(home), 1, 2).status_code == 409


@needs_root
def test_a_link_or_file_in_the_homes_place_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chown(target, 4001, 4001)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(HomeOwnedByOther, match="is not a folder"):
        ensure_home(str(tmp_path / "link"), 4001, 4001)
    (tmp_path / "file").write_text("")
    with pytest.raises(HomeOwnedByOther):
        ensure_home(str(tmp_path / "file"), 0, 0)


@needs_root
def test_a_0x_home_moves_only_when_it_is_the_users(tmp_path):
    legacy, home = tmp_path / "old", tmp_path / "new"
    legacy.mkdir()
    (legacy / "work.ipynb").write_text("{}")
    os.chown(legacy, 4001, 4001)
    assert ensure_home(str(home), 4666, 4666, legacy=str(legacy)) == "made"
    assert legacy.exists() and not (home / "work.ipynb").exists()  # another uid's: ignored
    home.rmdir()
    assert ensure_home(str(home), 4001, 4001, legacy=str(legacy)) == "moved"
    assert (home / "work.ipynb").exists() and not legacy.exists()


@needs_root
def test_servers_of_one_user_starting_together_share_the_new_home(tmp_path):
    """Two named servers of one user spawn at once: both see their home, neither fails on
    the other's mkdir (a CI failure on Slurm before the fix: "cannot make the home")."""
    from concurrent.futures import ThreadPoolExecutor

    home = tmp_path / "alice"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: ensure_home(str(home), 4001, 4001), range(16)))
    assert results.count("made") == 1 and set(results) == {"made", "kept"}
