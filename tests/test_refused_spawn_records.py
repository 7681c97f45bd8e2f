"""A refused spawn leaves the hub's database as it was (gpuspawner.hub.user_options.watch_spawn),
against a real JupyterHub + configurable-http-proxy + Docker engine (``docker``, ``hub``).

The hole replayed (found probing as a hostile user): JupyterHub's ``POST
/users/{name}/servers/{server}`` makes the named server's record before the spawn, and a spawn
refused with HTTP 400 (bad ``user_options``) kept it. Five refused spawns on new names left five
empty records; the user then got "already has the maximum of 5 named servers"
(``named_server_limit_per_user`` = 5, the shipped config) while the user model listed no
servers. A spawn refused for capacity also kept its options as the next start's defaults.
"""

from __future__ import annotations

import pytest

docker = pytest.importorskip("docker")

from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import MiB, _engine, topology  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
USER = "st-refused"
OWNER = "st-refused-kept"  # the second test's user: independent of the first one's records


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusedhub")
    nodes = [{"name": "st-node", "topology": topology(tmp, "st-node", 1024 * MiB)}]
    profiles = [
        {"slug": "cpu", "cpu": 0, "memory": "256M", "default": True},
        # valid options, refused at placement: no node has an A100 (HTTP 400)
        {"slug": "a100", "cpu": 0, "memory": "256M", "gpus": 1, "gpu_models": ["A100"]},
    ]
    # the shipped config's limits, stated here so the test does not depend on them
    h = Hub(tmp, nodes, profiles, extra_config="c.JupyterHub.allow_named_servers = True\n"
                                               "c.JupyterHub.named_server_limit_per_user = 5\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    (tmp / "home").mkdir()  # the base of the shipped home_path_template, as a mounted share
    h.start()
    yield h
    for user in (USER, OWNER):
        for name in records(h, user):
            h.api("DELETE", f"/users/{user}/servers/{name}", {"remove": True})
    h.stop()


def records(hub, user: str = USER) -> dict:
    """Every named server record of ``user``, stopped ones too."""
    r = hub.api("GET", f"/users/{user}?include_stopped_servers")
    assert r.status_code == 200, r.text
    return {k: v for k, v in (r.json().get("servers") or {}).items() if k}


def test_refused_spawns_on_new_names_leave_no_records(hub):
    hub.ensure_user(USER)
    refused = [({"profile": "no-such-profile"}, "profile")] * 6 + [
        ({"profile": "a100"}, "A100")]
    for i, (options, word) in enumerate(refused):
        r = hub.api("POST", f"/users/{USER}/servers/st-bad{i}", options)
        assert r.status_code == 400, r.text
        message = r.json()["message"]
        # the sixth one used to be refused for the limit: five empty records were left
        assert "maximum" not in message and word in message, (i, message, list(records(hub)))
    assert records(hub) == {}
    # a valid spawn on a new name is not refused for the limit, and starts
    r = hub.api("POST", f"/users/{USER}/servers/st-good", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER, "st-good")
    assert list(records(hub)) == ["st-good"]
    hub.api("DELETE", f"/users/{USER}/servers/st-good", {"remove": True})
    wait_until(lambda: records(hub) == {}, 60, 0.3, "st-good stopped and removed")


def test_refused_spawn_on_an_existing_server_keeps_it_and_its_options(hub):
    hub.ensure_user(OWNER)
    r = hub.api("PUT", f"/users/{OWNER}/servers/st-kept", {"user_options": {"profile": "cpu"}})
    assert r.status_code == 201, r.text
    # refused by the options guard, then by placement (valid options: no A100 here)
    for options in ({"profile": "no-such-profile"}, {"profile": "a100"}):
        r = hub.api("POST", f"/users/{OWNER}/servers/st-kept", options)
        assert r.status_code == 400, r.text
        kept = records(hub, OWNER)
        assert {k: v["user_options"] for k, v in kept.items()} == {
            "st-kept": {"profile": "cpu"}}, options
    hub.api("DELETE", f"/users/{OWNER}/servers/st-kept", {"remove": True})
    wait_until(lambda: records(hub, OWNER) == {}, 30, 0.3, "st-kept removed")
