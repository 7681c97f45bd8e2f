"""A spawn request is checked once (gpuspawner.hub.request): the ``user-options`` schema is the
one statement of its shape, profiles load once per configuration, and every step of a spawn
gets the same checked request."""

from __future__ import annotations

import os

import pytest

from gpuspawner.hub import request as request_mod
from gpuspawner.hub.profiles import USER_OPTION_KEYS, OptionsError, load_profiles
from gpuspawner.hub.request import ServerRequest, checked_request, parse_request
from gpuspawner.schemas import load_schema

PROFILES = [
    {"slug": "cpu", "cpu": 1, "memory": "1G", "default": True},
    {"slug": "gpu", "cpu": 2, "memory": "2G", "gpus": 1},
    {"slug": "staff", "cpu": 1, "memory": "1G", "groups": ["staff"]},
]


@pytest.mark.parametrize(("options", "message"), [
    ({"cpu": 4}, "cpu: unknown option; allowed: profile, queue, image, image--unlisted-choice"),
    ({"profile": "cpu", "image": "evil"}, "image: profile 'cpu' offers no choice of image"),
    ({"profile": "cpu", "image--unlisted-choice": "x"},
     "image--unlisted-choice: profile 'cpu' offers no choice of image"),
    ({"queue": "yes"}, "queue: must be true (wait when the GPUs are busy) or false (fail now), "
                       "got 'yes'"),
    ({"profile": None}, "profile: must be a string (a profile slug), got null; leave the key "
                        "out for the default profile"),
    ({"profile": 3}, "profile: must be a string (a profile slug), got 3"),
    ([1, 2], "user_options: must be a JSON object, got list"),
    ("cpu", "user_options: must be a JSON object, got str"),
    ({"profile": "nope"}, "profile: unknown profile 'nope'; choose one of: cpu, gpu"),
    ({"profile": "staff"}, "profile: profile 'staff' is not available to your groups"),
    ({"profile": "cpu" * 40}, "user_options: 135 bytes is more than the 100 allowed"),
])
def test_a_bad_request_names_its_field(options: object, message: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse_request(options, load_profiles(PROFILES), [], max_bytes=100)
    assert str(e.value).startswith(message), str(e.value)


def test_a_request_carries_the_profile_and_the_queue_choice() -> None:
    profiles = load_profiles(PROFILES)
    r = parse_request({}, profiles, [])
    assert (r.profile.slug, r.queue, dict(r.options)) == ("cpu", False, {})
    r = parse_request({"profile": "gpu"}, profiles, [])
    assert (r.profile.slug, r.queue) == ("gpu", True)  # GPU profiles wait by default
    assert parse_request({"profile": "gpu", "queue": False}, profiles, []).queue is False
    r = parse_request({"profile": "staff"}, profiles, ["staff", "a"])
    assert (r.profile.slug, r.groups) == ("staff", ("a", "staff"))
    assert isinstance(r, ServerRequest)


def test_an_overlong_reference_is_refused_by_the_schema() -> None:
    with pytest.raises(OptionsError, match="image--unlisted-choice: is 300 characters long; at "
                                           "most 255"):
        parse_request({"image--unlisted-choice": "a" * 300}, load_profiles(PROFILES), [])


def test_the_schema_is_the_one_statement_of_the_keys() -> None:
    assert USER_OPTION_KEYS == set(load_schema("user-options")["properties"])


def test_a_spawn_parses_its_options_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = request_mod.parse_request

    def counting(*args: object, **kw: object) -> ServerRequest:
        calls.append(args[0])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(request_mod, "parse_request", counting)
    monkeypatch.setattr(request_mod, "_CHECKED", type(request_mod._CHECKED)())
    profiles = load_profiles(PROFILES)
    first = checked_request({"profile": "gpu"}, profiles, ["b", "a"], 4096)
    # the guard, the trait, apply_user_options and placement ask again: no new parse
    for _ in range(3):
        assert checked_request({"profile": "gpu"}, load_profiles(PROFILES), ["a", "b"],
                               4096) is first
    assert len(calls) == 1
    # other options, other groups, another limit or other profiles: parsed again
    checked_request({"profile": "cpu"}, profiles, ["a", "b"], 4096)
    checked_request({"profile": "gpu"}, profiles, ["a"], 4096)
    checked_request({"profile": "gpu"}, profiles, ["a", "b"], 100)
    checked_request({"profile": "gpu"}, load_profiles(PROFILES + [
        {"slug": "x", "cpu": 1}]), ["a", "b"], 4096)
    assert len(calls) == 5
    # a refusal is not kept: asked twice, parsed twice, refused twice
    for _ in range(2):
        with pytest.raises(OptionsError):
            checked_request({"profile": "staff"}, profiles, [], 4096)
    assert len(calls) == 7


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_mod, "_CHECKED", type(request_mod._CHECKED)())
    monkeypatch.setattr(request_mod, "CACHE_SIZE", 4)
    profiles = load_profiles(PROFILES)
    for i in range(10):
        checked_request({"profile": "cpu"}, profiles, [f"g{i}"])
    assert len(request_mod._CHECKED) == 4


def test_profiles_load_once_per_configuration(tmp_path: object) -> None:
    a, b = load_profiles(PROFILES), load_profiles([dict(p) for p in PROFILES])
    assert a is not b and all(x is y for x, y in zip(a, b, strict=True))  # same, new list
    a.clear()
    assert len(load_profiles(PROFILES)) == 3  # a caller's change to its list stays its own
    changed = [dict(PROFILES[0], cpu=2), *PROFILES[1:]]
    assert load_profiles(changed)[0].bundle.cores == 2

    path = os.path.join(str(tmp_path), "profiles.yaml")
    with open(path, "w") as f:
        f.write("- {slug: one, cpu: 1}\n")
    first = load_profiles(path)
    assert load_profiles(path)[0] is first[0]
    with open(path, "w") as f:
        f.write("- {slug: one, cpu: 3}\n")
    st = os.stat(path)  # a rewrite within the clock's resolution: make the time differ
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert load_profiles(path)[0].bundle.cores == 3
