"""Two hubs on one Docker engine (each with its own state folder) never adopt, sweep or
replace each other's servers (docs/security.md, "Names": the hub label). Before the hub label,
the second hub's first spawn restored the first hub's containers into its ledger and removed
them as servers of users it does not have."""

from __future__ import annotations

import pytest

docker = pytest.importorskip("docker")

from gpuspawner.backends.spec import HUB_LABEL  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine, containers_of, remove_objects_of  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]

USERS = ("th-alice", "th-bob")
PROFILES = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hubs(engine, tmp_path_factory):
    made = []
    for name in ("a", "b"):
        h = Hub(tmp_path_factory.mktemp(f"twohubs-{name}"), [{"name": "local",
                                                              "topology": "auto"}], PROFILES)
        h.env["GPUSPAWNER_CULLER"] = "off"
        made.append(h)
    made[0].start()
    yield made
    for h in made:
        h.stop()
    remove_objects_of(engine, USERS)


def spawn(hub: Hub, user: str) -> int:
    hub.ensure_user(user)
    return hub.api("POST", f"/users/{user}/server", {"profile": "cpu"}).status_code


def test_a_second_hub_leaves_the_first_hubs_servers_alone(hubs, engine):
    a, b = hubs
    assert spawn(a, "th-alice") in (201, 202)
    a.wait_ready("th-alice")
    (first,) = containers_of(engine, "th-alice")
    b.start()
    assert spawn(b, "th-bob") in (201, 202)  # b restores what it finds on the engine first
    b.wait_ready("th-bob")
    # the same user name on b: refused, a's server untouched
    b.ensure_user("th-alice")
    r = b.api("POST", "/users/th-alice/server", {"profile": "cpu"})
    assert r.status_code == 409, r.text
    assert "exists and is of user 'th-alice'" in r.text
    (still,) = containers_of(engine, "th-alice")
    assert still["Id"] == first["Id"] and still["State"] == "running"
    assert a.server("th-alice")["ready"]
    ids = {c["Labels"][HUB_LABEL] for c in containers_of(engine, "th-alice")
           + containers_of(engine, "th-bob")}
    assert len(ids) == 2  # one id per hub
    # a restart of b (restore again) keeps a's server too
    b.stop()
    b.start()
    assert b.api("GET", "/users/th-bob").json()["servers"][""]["ready"] is not None
    (still,) = containers_of(engine, "th-alice")
    assert still["Id"] == first["Id"]
    for h, user in ((a, "th-alice"), (b, "th-bob")):
        h.api("DELETE", f"/users/{user}/server")
        h.wait_stopped(user)
