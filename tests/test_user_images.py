"""Users' own images within what admins allow (gpuspawner.hub.images): the reference grammar,
the profile's ``profile_options.image`` (KubeSpawner's shape), the choice a request makes and
every way found to step outside the allow pattern. The real engine's tests (a user image runs
as confined as ours; an image without jupyterhub-singleuser is refused before anything is
booked) are in tests/test_spawner_docker.py."""

from __future__ import annotations

import re

import pytest

from gpuspawner.backends.base import ImageRefused
from gpuspawner.backends.docker_image import check_image_blocking
from gpuspawner.hub.config_check import HubConfigError, check_spawner_settings
from gpuspawner.hub.images import (
    ImageOptionError,
    ImageRequestError,
    check_deny_patterns,
    choose_image,
    normalize_reference,
    parse_image_option,
    parse_reference,
)
from gpuspawner.hub.profiles import OptionsError, ProfileConfigError, load_profiles
from gpuspawner.hub.request import parse_request

OPTION = {
    "display_name": "Image",
    "choices": {
        "pytorch": {"display_name": "PyTorch", "default": True,
                    "kubespawner_override": {"image": "registry.example.org/pytorch:2.4"}},
        "tf": {"display_name": "TensorFlow", "image": "registry.example.org/tf:2.16"},
    },
    "unlisted_choice": {"enabled": True, "display_name": "Other",
                        "validation_regex": r"registry\.example\.org/[a-z0-9/._-]+(:[\w.-]+)?",
                        "validation_message": "an image of registry.example.org"},
}
PROFILES = [{"slug": "gpu", "cpu": 1, "profile_options": {"image": OPTION}},
            {"slug": "plain", "cpu": 1, "default": True}]


@pytest.mark.parametrize(("text", "parts"), [
    ("ubuntu", (None, "ubuntu", None, None)),
    ("team/image:1.0", (None, "team/image", "1.0", None)),
    ("registry.example.org:5000/a/b:c", ("registry.example.org:5000", "a/b", "c", None)),
    ("localhost/x", ("localhost", "x", None, None)),
    ("r.io/x@sha256:" + "a" * 64, ("r.io", "x", None, "sha256:" + "a" * 64)),
])
def test_references_split_as_docker_reads_them(text, parts) -> None:
    p = parse_reference(text)
    assert (p["domain"], p["path"], p["tag"], p["digest"]) == parts


@pytest.mark.parametrize("text", [
    "", "UPPER/case", "a b", "x:tag:tag", "x@sha256:short", "-x", "x/", "x:" + "t" * 129,
    "a" * 256, "x\n", "registry.example.org/x;rm -rf", "../x",
])
def test_malformed_references_are_refused(text) -> None:
    with pytest.raises(ValueError):
        parse_reference(text)


def test_normal_form() -> None:
    assert normalize_reference("ubuntu") == "docker.io/library/ubuntu:latest"
    assert normalize_reference("team/x:1") == "docker.io/team/x:1"
    assert normalize_reference("r.io/x@sha256:" + "b" * 64) == "r.io/x@sha256:" + "b" * 64


def test_choices_default_and_unknown() -> None:
    option = parse_image_option(OPTION, "p")
    assert choose_image({}, option, "gpu") == ("registry.example.org/pytorch:2.4", False)
    assert choose_image({"image": "tf"}, option, "gpu") == ("registry.example.org/tf:2.16",
                                                            False)
    with pytest.raises(ImageRequestError, match="image: unknown image 'jax' for profile 'gpu'; "
                                                "choose one of: pytorch, tf"):
        choose_image({"image": "jax"}, option, "gpu")
    assert choose_image({}, None, "plain") == ("", False)


@pytest.mark.parametrize(("text", "message"), [
    # the pattern must match the whole reference: no suffix or prefix rides along
    ("registry.example.org.evil.com/x:1", "is not allowed on profile 'gpu': an image of "
                                          "registry.example.org"),
    ("evil.com/registry.example.org/x", "is not allowed on profile 'gpu'"),
    ("registry.example.org/x:1@sha256:" + "c" * 64, "is not allowed on profile 'gpu'"),
    ("ubuntu", "is not allowed on profile 'gpu'"),
    ("Registry.example.org/X", "is not a valid image reference"),
])
def test_an_unlisted_reference_outside_the_pattern_is_refused(text, message) -> None:
    option = parse_image_option(OPTION, "p")
    with pytest.raises(ImageRequestError) as e:
        choose_image({"image--unlisted-choice": text}, option, "gpu")
    assert e.value.field == "image--unlisted-choice" and message in str(e.value), str(e.value)


def test_the_deny_list_sees_the_normal_form() -> None:
    option = parse_image_option({"unlisted_choice": {"enabled": True}}, "p")
    deny = check_deny_patterns([r"docker\.io/.*", r".*:latest"])
    assert choose_image({"image--unlisted-choice": "r.io/x:1"}, option, "p", deny) == (
        "r.io/x:1", True)
    for text in ("ubuntu:22.04", "library/ubuntu:22.04", "r.io/x"):  # docker.io / :latest
        with pytest.raises(ImageRequestError, match="not allowed on this hub"):
            choose_image({"image--unlisted-choice": text}, option, "p", deny)


def test_only_listed_images_where_unlisted_is_off() -> None:
    option = parse_image_option({"choices": OPTION["choices"]}, "p")
    with pytest.raises(ImageRequestError, match="offers only its listed images: pytorch, tf"):
        choose_image({"image--unlisted-choice": "registry.example.org/x"}, option, "gpu")


@pytest.mark.parametrize(("value", "message"), [
    ({}, "offers nothing"),
    ({"choices": {"a": {"display_name": "A"}}}, "choices.a: names no image"),
    ({"choices": {"a": {"display_name": "A", "kubespawner_override": {
        "image": "x", "cpu_limit": 4}}}}, "only image may be set here, got 'cpu_limit'"),
    ({"choices": {"a": {"display_name": "A", "image": "Bad Ref"}}}, "choices.a.image:"),
    ({"choices": {"a": {"display_name": "A", "image": "x", "default": True},
                  "b": {"display_name": "B", "image": "y", "default": True}}},
     "more than one has default"),
    ({"unlisted_choice": {"enabled": True, "validation_regex": "("}},
     "validation_regex: not a regular expression"),
])
def test_bad_image_options_are_named(value, message) -> None:
    with pytest.raises(ImageOptionError, match=re.escape(message)):
        parse_image_option(value, "profiles[0] (gpu).profile_options.image")


def test_a_profile_carries_its_option_and_the_schema_refuses_other_options() -> None:
    gpu = load_profiles(PROFILES)[0]
    assert gpu.image_option is not None and gpu.image_option.unlisted
    with pytest.raises(ProfileConfigError, match=r"profile_options.cpu_limit: unknown field"):
        load_profiles([{"slug": "x", "profile_options": {"cpu_limit": {}}}])


def test_the_request_names_the_image_field() -> None:
    profiles = load_profiles(PROFILES)
    r = parse_request({"profile": "gpu", "image--unlisted-choice": "registry.example.org/a:1"},
                      profiles, [])
    assert (r.image, r.user_image) == ("registry.example.org/a:1", True)
    with pytest.raises(OptionsError, match="image: profile 'plain' offers no choice of image"):
        parse_request({"profile": "plain", "image": "tf"}, profiles, [])


@pytest.mark.parametrize(("settings", "message"), [
    ({"image_deny_patterns": ["("]}, "GPUSpawner.image_deny_patterns[0]: not a regular "
                                     "expression"),
    ({"profiles": PROFILES, "backend": "slurm"},
     "GPUSpawner.profiles (gpu).profile_options.image: users' own images are not supported "
     "with the Slurm backend"),
])
def test_the_hub_refuses_bad_image_settings_at_start(settings, message, tmp_path) -> None:
    from gpuspawner.hub.cluster import reset_clusters

    reset_clusters()
    with pytest.raises(HubConfigError) as e:
        check_spawner_settings({"profiles": [{"slug": "cpu", "cpu": 1}],
                                "state_dir": str(tmp_path), **settings})
    assert str(e.value).startswith(message), str(e.value)
    reset_clusters()


class PullingEngine:
    """A test double of docker-py's APIClient for a pull: the image is not on the node, and
    ``pull(stream=True)`` yields the engine's progress events (three 40 MiB layers announced
    one after another, then their progress); counts the events it handed out."""

    def __init__(self) -> None:
        self.sent = 0

    def inspect_image(self, image: str) -> dict:
        from docker.errors import ImageNotFound
        raise ImageNotFound("no such image")

    def pull(self, repo: str, tag: str, stream: bool, decode: bool):
        events = [{"id": f"l{i}", "status": "Downloading",
                   "progressDetail": {"current": 0, "total": 40 * 2**20}} for i in range(3)]
        events += [{"id": f"l{i}", "status": "Downloading",
                    "progressDetail": {"current": 40 * 2**20, "total": 40 * 2**20}}
                   for i in range(3)]
        for e in events:
            self.sent += 1
            yield e


def test_a_pull_stops_once_its_layers_pass_the_size_limit() -> None:
    cli, said = PullingEngine(), []
    with pytest.raises(ImageRefused) as e:
        check_image_blocking(cli, "n1", "registry.example.org/big:1", 1000, 100, 30,
                             said.append, {}, max_bytes=100 * 2**20)
    assert "larger than users' images may be here: its layers are at least 120 MiB, at most " \
        "100 MiB" in str(e.value)
    assert cli.sent == 3  # the third layer's announcement passed 100 MiB: no more was read
