"""Users' own images as a user sees them (issue 26, item 2), in Debian's Chromium driven by Python
Playwright, on the real hub and engine, with the project's private registry on loopback
(``scripts/registry.sh``, ``make registry``):

- the spawn form offers the profile's images and an "other image" field; the user types the
  reference of an image in the allowed registry (not on the engine), submits, sees the pull's
  progress in bytes on the spawn page, then gets JupyterLab running in that image;
- a reference outside the profile's allow pattern is refused with the reason on the page, and
  no server is created.

Marked ``browser``, ``hub``, ``docker``; skipped with a reason when Chromium, axe-core, the
engine or the registry is missing. Screenshots go to var/screenshots/ (and docs/ when missing,
or with GPUSPAWNER_UPDATE_DOCS=1), as in tests/test_pages_browser.py.
"""

from __future__ import annotations

import re

import pytest

from tests.hubrunner import Hub

pytest.importorskip("docker")
sync_api = pytest.importorskip("playwright.sync_api")

from gpuspawner.testing.registry import (  # noqa: E402
    drop_pushed_image,
    push_user_image,
    registry_address,
)
from tests.test_hub_e2e import _engine, containers_of  # noqa: E402
from tests.test_pages_browser import (  # noqa: E402
    IMAGE,
    PENDING_PAGE,
    _page,
    _shot,
    _skip_reasons,
    browser,  # noqa: F401 (the fixture)
    serious_violations,
    wait_js,
)

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.docker,
              pytest.mark.skipif(bool(_skip_reasons()), reason="; ".join(_skip_reasons()))]

USERS = ("iris", "ivan")


def profiles(address: str) -> list[dict]:
    """One profile offering the site's image and, where users type one, images of the
    registry at ``address`` only."""
    return [{"slug": "own", "display_name": "CPU, your image", "cpu": 1, "memory": "512M",
             "default": True, "profile_options": {"image": {
                 "display_name": "Image",
                 "choices": {"lab": {"display_name": "JupyterLab (the site's image)",
                                     "image": IMAGE, "default": True}},
                 "unlisted_choice": {
                     "enabled": True, "display_name": "Other image",
                     "validation_regex": re.escape(address) + r"/[a-z0-9._/-]+(:[\w.-]+)?",
                     "validation_message": f"an image of the site's registry {address}"}}}}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    engine = _engine()
    address = registry_address()
    if address is None:
        pytest.skip("needs the project's registry on loopback (make registry)")
    image = push_user_image(engine, address, IMAGE)
    h = Hub(tmp_path_factory.mktemp("imagehub"), [{"name": "local", "topology": "auto"}],
            profiles(address), extra_config=(
                f"c.GPUSpawner.image = {IMAGE!r}\n"
                "c.GPUSpawner.image_check_timeout = 180\n"
                # the registry is on loopback: refused unless the admin lists it
                f"c.GPUSpawner.allowed_registries = [{address!r}]\n"
                # always the progress page, however fast the spawn (JupyterHub's default: 10 s)
                "c.JupyterHub.tornado_settings = {'slow_spawn_timeout': 0}\n"))
    h.env["GPUSPAWNER_CULLER"] = "off"
    try:
        h.start()
        yield h, engine, image
    finally:
        for u in USERS:
            h.api("DELETE", f"/users/{u}/server")
        h.stop()
        for u in USERS:
            for c in containers_of(engine, u):
                engine.remove_container(c["Id"], force=True)
        drop_pushed_image(engine, image)


def _choose_other_image(page, reference: str) -> None:
    page.wait_for_selector(".gpus-form")
    page.select_option("[data-testid=image-choice-own]", "--unlisted-choice")
    page.fill("[data-testid=image-unlisted-own]", reference)


def test_a_user_pulls_their_image_and_gets_jupyterlab_in_it(setup, browser):  # noqa: F811
    hub, engine, image = setup
    ref = image.reference
    with pytest.raises(Exception, match="No such image"):
        engine.inspect_image(ref)  # the spawn must pull it
    hub.ensure_user("iris")
    page = _page(browser, hub, "iris")
    try:
        page.goto(f"{hub.url}/hub/spawn/iris")
        page.wait_for_selector(".gpus-form")
        # the profile's images and the "other image" field, labelled
        options = page.eval_on_selector_all("[data-testid=image-choice-own] option",
                                            "els => els.map(e => e.textContent)")
        assert options == ["JupyterLab (the site's image)", "Other image"], options
        assert page.get_by_label("Other image", exact=True).count() == 1
        _choose_other_image(page, ref)
        assert serious_violations(page) == []
        _shot(page, "user-image-form.png")
        page.click("#spawn_form button[type=submit]")
        # the spawn page: the pull in bytes, the check, then the placement (after the pull)
        pulled = re.escape(f"pulling image {ref}: ") + r"(\d+) of (\d+) MiB"
        wait_js(page, f"() => /{pulled.replace('/', '[/]')}/.test(document.getElementById("
                "'progress-log')?.textContent || '')", 120_000, "the pull's progress")
        wait_js(page, "() => /Placed: 1 core/.test(document.getElementById("
                "'progress-log')?.textContent || '')", 120_000, "the placement after the check")
        log = page.text_content("#progress-log") or ""
        sizes = [(int(a), int(b)) for a, b in re.findall(pulled, log)]
        assert sizes and sizes[-1][0] == sizes[-1][1] and sizes[-1][1] >= 60, log
        assert log.index("pulling image") < log.index(f"Image {ref} checked") \
            < log.index("Placed:"), log
        page.eval_on_selector("#progress-details", "d => { d.open = true }")
        assert serious_violations(page, PENDING_PAGE) == []
        _shot(page, "user-image-pull.png")
        # JupyterLab, in the pulled image
        page.wait_for_url(re.compile(r".*/user/iris/lab.*"), timeout=180_000)
        page.locator("#gpuspawner-gpu-status").wait_for(timeout=60_000)
        (c,) = containers_of(engine, "iris")
        assert c["Image"] == ref, c["Image"]
        assert f"{ref.rsplit(':', 1)[0]}@{image.digest}" in engine.inspect_image(ref)["RepoDigests"]
    finally:
        page.context.close()


def test_an_image_outside_the_allow_pattern_is_refused_with_the_reason(setup, browser):  # noqa: F811
    hub, engine, image = setup
    address = image.reference.split("/", 1)[0]
    hub.ensure_user("ivan")
    page = _page(browser, hub, "ivan")
    try:
        page.goto(f"{hub.url}/hub/spawn/ivan")
        _choose_other_image(page, "docker.io/library/ubuntu:22.04")
        page.click("#spawn_form button[type=submit]")
        reason = f"is not allowed on profile 'own': an image of the site's registry {address}"
        # the body is null for a moment while the form's answer loads
        wait_js(page, f"() => !!document.body && document.body.textContent.includes({reason!r})",
                60_000, "the refusal's reason")
        # on the form itself, shown again with the error above it (JupyterHub's spawn page)
        assert page.locator(".gpus-form").count() == 1
        text = page.inner_text("body")
        assert "image--unlisted-choice" in text and "docker.io/library/ubuntu:22.04" in text, text
        assert serious_violations(page, PENDING_PAGE) == []
        _shot(page, "user-image-refused.png")
    finally:
        page.context.close()
    assert not hub.api("GET", "/users/ivan").json()["servers"]
    assert containers_of(engine, "ivan") == []
