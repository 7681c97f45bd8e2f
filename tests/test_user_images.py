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
    check_allowed_registries,
    check_deny_patterns,
    check_registry,
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
    # splitDockerDomain: a first component that is not lowercase is a registry
    ("UPPER/case", ("UPPER", "case", None, None)),
])
def test_references_split_as_docker_reads_them(text, parts) -> None:
    p = parse_reference(text)
    assert (p["domain"], p["path"], p["tag"], p["digest"]) == parts


@pytest.mark.parametrize("text", [
    "", "UPPER/Case", "a b", "x:tag:tag", "x@sha256:short", "-x", "x/", "x:" + "t" * 129,
    "a" * 256, "x\n", "registry.example.org/x;rm -rf", "../x",
    # ASCII only: Go's \w (the tag's pattern) is ASCII, Python's matched these (issue 46)
    "registry:17010/x:tag\u00e9", "x:\u0661", "r\u00e9gistry.io/x", "x:t\u212a",
    "a" * 64,  # an image ID, not a name (normalize.go)
    "[::ffff:127.0.0.1]:5000/x",  # no IPv4-mapped IPv6 in the grammar
])
def test_malformed_references_are_refused(text) -> None:
    with pytest.raises(ValueError):
        parse_reference(text)


def test_normal_form() -> None:
    assert normalize_reference("ubuntu") == "docker.io/library/ubuntu:latest"
    assert normalize_reference("team/x:1") == "docker.io/team/x:1"
    assert normalize_reference("r.io/x@sha256:" + "b" * 64) == "r.io/x@sha256:" + "b" * 64


@pytest.mark.parametrize(("text", "normal"), [
    # Docker Hub's other names, and its name in upper case, are docker.io (issue 46, item 4)
    ("index.docker.io/library/x:1", "docker.io/library/x:1"),
    ("Docker.io/library/x:1", "docker.io/library/x:1"),
    ("registry-1.docker.io/library/x:1", "docker.io/library/x:1"),
    ("INDEX.DOCKER.IO/x", "docker.io/library/x:latest"),
    ("docker.io:443/x:1", "docker.io/library/x:1"),
    ("index.docker.io/team/x", "docker.io/team/x:latest"),
    # another registry: the host lowercased, its address canonical, HTTPS's port dropped
    ("Registry.Example.ORG:443/team/x:1", "registry.example.org/team/x:1"),
    ("registry.example.org:5000/x", "registry.example.org:5000/x:latest"),
    ("127.1:17010/x", "127.0.0.1:17010/x:latest"),
    ("0x7f.0.0.1:17010/x", "127.0.0.1:17010/x:latest"),
    ("[0:0::1]:5000/x", "[::1]:5000/x:latest"),
    ("UPPER/case", "upper/case:latest"),
    ("localhost/x", "localhost/x:latest"),
])
def test_the_normal_form_follows_the_engines_rules(text, normal) -> None:
    assert normalize_reference(text) == normal


@pytest.mark.parametrize("text", [
    "index.docker.io/library/x:1", "Docker.io/library/x:1", "registry-1.docker.io/library/x:1",
    "docker.io:443/library/x:1", "DOCKER.IO/library/x:1", "x:1", "library/x:1",
])
def test_the_deny_list_sees_docker_hub_by_any_name(text) -> None:
    r"""Issue 46, item 4: with the documented ``image_deny_patterns = [r"docker\.io/.*"]``,
    ``index.docker.io/library/x:1`` and ``Docker.io/library/x:1`` were accepted (and the
    first ran): the normal form neither mapped Docker Hub's other names nor lowercased the
    host. Now each is a 400 naming the field."""
    profiles = load_profiles([{"slug": "own", "cpu": 1, "profile_options": {
        "image": {"unlisted_choice": {"enabled": True}}}}])
    with pytest.raises(OptionsError) as e:
        parse_request({"profile": "own", "image--unlisted-choice": text}, profiles, [],
                      deny_images=check_deny_patterns([r"docker\.io/.*"]))
    assert e.value.field == "image--unlisted-choice"
    assert "is not allowed on this hub (image_deny_patterns: docker\\.io/.*)" in str(e.value)


OWN = [{"slug": "own", "cpu": 1, "profile_options": {
    "image": {"unlisted_choice": {"enabled": True}}}}]


@pytest.mark.parametrize("text", [
    "127.0.0.1:17010/x", "localhost:17010/x", "127.0.0.1:8081/hub/api", "localhost/x",
    "LocalHost:5000/x", "127.1:8001/x", "2130706433:8001/x", "[::1]:5000/x",
    "[::ffff:7f00:1]:5000/x", "0.0.0.0:8000/x", "169.254.169.254/latest",
    "[fe80::1]:80/x", "198.18.0.1:8081/x", "198.19.255.254:8888/x", "registry.localhost/x",
])
def test_a_registry_on_the_hubs_own_host_or_networks_is_refused(text) -> None:
    """Issue 46, item 5: with ``unlisted_choice`` and no ``validation_regex``, images named
    ``127.0.0.1:PORT/...`` or ``localhost:PORT/...`` made the engine send requests to the
    gpuspawner service and the proxy's API (and the 400 quoted their answers). Now such a
    registry is a 400 naming the field and the setting, before anything is pulled."""
    with pytest.raises(OptionsError) as e:
        parse_request({"profile": "own", "image--unlisted-choice": text}, load_profiles(OWN),
                      [])
    assert e.value.field == "image--unlisted-choice", str(e.value)
    assert "images are not pulled from there unless an admin lists it in " \
        "c.GPUSpawner.allowed_registries" in str(e.value)


def test_the_hosts_own_names_are_refused(monkeypatch) -> None:
    import socket

    from gpuspawner.hub import images

    monkeypatch.setattr(socket, "gethostname", lambda: "Hubhost.example.org")
    images._own_names.cache_clear()
    try:
        for registry in ("hubhost.example.org:5000", "hubhost", "localhost"):
            with pytest.raises(ValueError, match="a name of the hub's own host"):
                check_registry(registry)
        check_registry("registry.example.org")
    finally:
        images._own_names.cache_clear()


def test_allowed_registries_let_a_listed_one_through() -> None:
    allowed = check_allowed_registries(["127.0.0.1:17010", "LOCALHOST"])
    assert allowed == {"127.0.0.1:17010", "localhost"}
    profiles = load_profiles(OWN)
    for text in ("127.0.0.1:17010/team/x:1", "127.1:17010/team/x:1", "localhost:5000/x",
                 "localhost/x"):
        r = parse_request({"profile": "own", "image--unlisted-choice": text}, profiles, [],
                          allowed_registries=allowed)
        assert (r.image, r.user_image) == (text, True)
    with pytest.raises(OptionsError, match="allowed_registries"):  # another port of 127.0.0.1
        parse_request({"profile": "own", "image--unlisted-choice": "127.0.0.1:8081/x"},
                      profiles, [], allowed_registries=allowed)
    # a registry elsewhere needs no listing
    r = parse_request({"profile": "own", "image--unlisted-choice": "10.1.2.3:5000/x"},
                      profiles, [])
    assert r.image == "10.1.2.3:5000/x"


@pytest.mark.parametrize(("value", "message"), [
    ("127.0.0.1:17010", "GPUSpawner.allowed_registries: must be a list"),
    ([5], "GPUSpawner.allowed_registries[0]: must be a registry"),
    (["ok.example.org", "http://x"], "GPUSpawner.allowed_registries[1]: 'http://x' is not a "
                                     "registry"),
    (["r\u00e9g.io"], "GPUSpawner.allowed_registries[0]: "),
    (["r.io:99999"], "GPUSpawner.allowed_registries[0]: 'r.io:99999': port 99999"),
])
def test_bad_allowed_registries_are_named(value, message) -> None:
    with pytest.raises(ImageOptionError) as e:
        check_allowed_registries(value)
    assert str(e.value).startswith(message), str(e.value)


def test_a_non_ascii_tag_is_a_400_naming_the_field() -> None:
    """Issue 46, item 6: ``registry:17010/x:tagé`` passed the reference check (Python's \\w
    is Unicode) and the engine's refusal was an uncaught APIError (HTTP 500). Now a 400
    naming the field, before the engine is asked."""
    with pytest.raises(OptionsError) as e:
        parse_request({"profile": "own", "image--unlisted-choice": "registry:17010/x:tag\u00e9"},
                      load_profiles(OWN), [])
    assert e.value.field == "image--unlisted-choice"
    assert "only ASCII characters" in str(e.value)


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
    ({"allowed_registries": ["http://127.0.0.1:17010"]},
     "GPUSpawner.allowed_registries[0]: 'http://127.0.0.1:17010' is not a registry"),
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


#: what a service that is no registry answered, as the engine quotes it (seen with a stand-in
#: on loopback: the engine's words are "error parsing HTTP 404 response body: ...")
BODY = 'error parsing HTTP 404 response body: invalid character \'S\' looking for beginning ' \
       'of value: "SECRET-BODY {\\"token\\": \\"abc\\"}"'


class FailingPull(PullingEngine):
    """A pull the engine refuses: ``how`` "stream" (an error event in the pull's stream) or
    "api" (the engine's HTTP error on the pull, as docker-py raises it), its words quoting a
    response body."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def pull(self, repo: str, tag: str, stream: bool, decode: bool):
        from docker.errors import APIError

        if self.how == "api":
            raise APIError("500 Server Error", explanation=BODY)
        yield {"status": "Pulling from x", "id": tag}
        yield {"errorDetail": {"message": BODY}, "error": BODY}


@pytest.mark.parametrize(("how", "error_class"), [("stream", "pull error"),
                                                  ("api", "APIError")])
def test_a_failed_pull_shows_no_response_body(how, error_class, caplog) -> None:
    """Issue 46, item 5: the 400 shown to the user quoted the answer of whatever the engine
    called (the engine's error words carry the response body). Now the engine's error class
    and a fixed phrase; the words go to the hub's log only."""
    with pytest.raises(ImageRefused) as e:
        check_image_blocking(FailingPull(how), "n1", "registry.example.org/x:1", 1000, 100, 30,
                             lambda _: None, {})
    message = str(e.value)
    assert "SECRET" not in message and "token" not in message, message
    assert message == (f"image 'registry.example.org/x:1' is not on node n1 and cannot be "
                       f"pulled ({error_class}: the registry has no such image or tag)"), message
    assert "SECRET-BODY" in caplog.text  # for the admin


class RefusingEngine(PullingEngine):
    """The engine answers 400 to a name it does not parse (docker-py: a plain APIError)."""

    def inspect_image(self, image: str) -> dict:
        import requests
        from docker.errors import APIError

        response = requests.Response()
        response.status_code = 400
        raise APIError("400 Client Error", response=response,
                       explanation="invalid reference format")


def test_an_engine_refusal_of_the_name_is_an_image_refusal() -> None:
    """Issue 46, item 6: the engine's 400 on a name it does not parse escaped
    check_image_blocking as docker.errors.APIError (an HTTP 500); now an ImageRefused (400
    naming the field), whatever the hub's own check let through."""
    with pytest.raises(ImageRefused, match=r"the engine on node n1 refused the name "
                                           r"\(APIError 400\)"):
        check_image_blocking(RefusingEngine(), "n1", "registry:17010/x:tag", 1000, 100, 30,
                             lambda _: None, {})


def test_the_hubs_own_server_pools_are_refused_too(tmp_path, monkeypatch) -> None:
    """A site's server networks outside 198.18.0.0/15 (``DockerBackend.server_network_pool``,
    a node's ``network_pool``) are the servers' networks too: the hub registers them at start
    and a registry there is refused as one on 198.18.0.0/15."""
    from traitlets.config import Config

    from gpuspawner.hub import images
    from gpuspawner.hub.cluster import reset_clusters
    from gpuspawner.hub.config_check import check_hub_config

    monkeypatch.setattr(images, "_POOLS", [])
    profiles = load_profiles(OWN)
    for text in ("100.64.0.9:5000/x", "100.65.3.4/x"):  # not refused before the hub starts
        parse_request({"profile": "own", "image--unlisted-choice": text}, profiles, [])
    reset_clusters()
    c = Config()
    c.GPUSpawner.profiles = OWN
    c.GPUSpawner.state_dir = str(tmp_path)
    c.GPUSpawner.nodes = [{"name": "local", "topology": "auto",
                           "network_pool": "100.64.0.0/24"}]
    c.DockerBackend.server_network_pool = "100.65.0.0/16"
    try:
        check_hub_config(c)
    finally:
        reset_clusters()
    for text, network in (("100.64.0.9:5000/x", "100.64.0.0/24"),
                          ("100.65.3.4/x", "100.65.0.0/16")):
        with pytest.raises(OptionsError, match=f"is an address in {network}, the hub's own "
                                               "host or its servers' networks"):
            parse_request({"profile": "own", "image--unlisted-choice": text}, profiles, [])
