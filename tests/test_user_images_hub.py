"""Users' own images on the real hub, through its REST API (real JupyterHub, proxy and engine):
the replays of three holes in the image-reference check, each an HTTP 400 naming
``image--unlisted-choice`` before anything is stored, booked or pulled:

- Docker Hub's other names (``index.docker.io``, ``Docker.io``) slipped past
  ``image_deny_patterns = [r"docker\\.io/.*"]``;
- a registry on loopback (the proxy's API, the hub's own port) had the engine call the hub's
  own services for the user, and the refusal quoted their answers;
- a non-ASCII tag passed the hub's check and failed in the engine (HTTP 500).

Marked ``hub`` and ``docker``; skipped with a reason when the engine, the single-user image or
configurable-http-proxy is missing (``make engine images chp``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of  # noqa: E402

pytestmark = [pytest.mark.hub, pytest.mark.docker]

#: a profile whose users may type any image (no validation_regex), as on the probed hub
PROFILES = [{"slug": "any", "display_name": "CPU, any image", "cpu": 1, "memory": "256M",
             "default": True, "profile_options": {"image": {
                 "unlisted_choice": {"enabled": True, "display_name": "Other image"}}}}]
USER = "imgprobe"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    engine = _engine()
    h = Hub(tmp_path_factory.mktemp("imageshub"), [{"name": "local", "topology": "auto"}],
            PROFILES, extra_config=(
                # the deny list of docs/howto/user-images.md
                "c.GPUSpawner.image_deny_patterns = [r'docker\\.io/.*']\n"
                "c.GPUSpawner.image_check_timeout = 30\n"))
    h.env["GPUSPAWNER_CULLER"] = "off"
    try:
        h.start()
        h.ensure_user(USER)
        yield h
    finally:
        h.api("DELETE", f"/users/{USER}/server")
        h.stop()
        for c in containers_of(engine, USER):
            engine.remove_container(c["Id"], force=True)


def spawn(hub: Hub, reference: str) -> tuple[int, str]:
    """POST the user's server with ``reference`` typed; (status, message). A spawn that was
    taken (the hole) is stopped again, so each case starts from no server."""
    r = hub.api("POST", f"/users/{USER}/server",
                {"profile": "any", "image--unlisted-choice": reference})
    message = r.json().get("message", "") if r.headers.get("Content-Type", "").startswith(
        "application/json") and r.text else r.text
    if r.status_code != 400:
        hub.api("DELETE", f"/users/{USER}/server")
        hub.wait_stopped(USER)
    return r.status_code, message


def assert_no_server(hub: Hub) -> None:
    assert not hub.api("GET", f"/users/{USER}").json()["servers"]


@pytest.mark.parametrize("reference", ["index.docker.io/library/x:1", "Docker.io/library/x:1",
                                       "registry-1.docker.io/library/x:1"])
def test_docker_hub_by_another_name_is_denied(hub, reference):
    code, message = spawn(hub, reference)
    assert code == 400, (code, message)
    assert message.startswith("image--unlisted-choice: ") and \
        "is not allowed on this hub (image_deny_patterns: docker\\.io/.*)" in message, message
    assert_no_server(hub)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
@pytest.mark.parametrize("which", ["GPUSPAWNER_PROXY_API_PORT", "GPUSPAWNER_HUB_PORT"])
def test_a_registry_on_the_hubs_host_is_refused_and_nothing_is_quoted(hub, host, which):
    """``127.0.0.1:PORT/x`` and ``localhost:PORT/x`` with PORT the proxy's API or the hub's
    public port: refused before the engine is asked, naming the setting that would allow it;
    no answer of those services in the message."""
    code, message = spawn(hub, f"{host}:{hub.env[which]}/x:1")
    assert code == 400, (code, message)
    assert message.startswith("image--unlisted-choice: registry ") and \
        "unless an admin lists it in c.GPUSpawner.allowed_registries" in message, message
    # the message names the refused registry, whose random port may itself hold "404"/"403"
    rest = message.replace(f"{host}:{hub.env[which]}", "")
    for quoted in ("response body", "Permission", "<html", "404", "403"):
        assert quoted not in rest, message
    assert_no_server(hub)


def test_a_non_ascii_tag_is_a_400(hub):
    code, message = spawn(hub, "registry:17010/x:tag\u00e9")
    assert code == 400, (code, message)
    assert message.startswith("image--unlisted-choice: ") and "only ASCII characters" in \
        message, message
    assert_no_server(hub)
