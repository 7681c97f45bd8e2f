"""A user's own image pulled for real from an allowed registry (issue 26, item 2): the project's
private registry on loopback (``scripts/registry.sh``, ``make registry``), a user's image pushed
there and removed from the engine, then a spawn with ``image--unlisted-choice`` = that
reference pulls it (progress in bytes), checks it and runs the server in it, and nothing is
booked while the pull runs (a pull never holds a core, memory or a GPU).

Marked ``docker``; skipped with a reason when no engine, no single-user image or no registry
answers (``make engine images registry``).

Also the replays of issue 46, items 5 and 6, on the real engine: a reference naming a
registry on loopback (a stand-in service that answers every request 404 with a "secret" body)
is refused before the engine is asked; listed in ``allowed_registries``, the engine pulls from
it and the refusal shows the engine's error class, never the body; a non-ASCII tag is a 400.
"""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
import time

import pytest

docker = pytest.importorskip("docker")
from tornado import web  # noqa: E402

from gpuspawner.testing.registry import (  # noqa: E402
    drop_pushed_image,
    pulled_from,
    push_user_image,
    registry_address,
)
from tests.test_spawner_docker import IMAGE, client, container_id, make_spawner  # noqa: E402, F401

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def registry_image(client):  # noqa: F811 - the fixture imported above
    address = registry_address()
    if address is None:
        pytest.skip("needs the project's registry on loopback (make registry)")
    image = push_user_image(client, address, IMAGE)
    yield image
    drop_pushed_image(client, image)


def own_profiles(address: str) -> list[dict]:
    """One GPU profile that takes only images of the registry at ``address``."""
    return [{"slug": "own", "cpu": 1, "memory": "256M", "gpus": 1, "profile_options": {
        "image": {"unlisted_choice": {
            "enabled": True, "validation_regex": re.escape(address) + r"/[a-z0-9._/-]+:[\w.-]+",
            "validation_message": f"an image of {address}"}}}}]


async def test_a_registry_image_is_pulled_with_progress_before_anything_is_booked(
        make_spawner, client, registry_image):  # noqa: F811
    ref = registry_image.reference
    with pytest.raises(docker.errors.ImageNotFound):
        client.inspect_image(ref)  # not on the engine: the spawn must pull it
    address = ref.split("/", 1)[0]
    sp = make_spawner("pulluser", options={"profile": "own", "image--unlisted-choice": ref},
                      profiles=own_profiles(address), image_check_timeout=120,
                      allowed_registries=[address])  # loopback: refused unless listed
    seen: list[tuple[str, list[str]]] = []  # each event, the ledger's owners at that time
    emit = sp._emit

    def watch(progress: int, message: str) -> None:
        seen.append((message, [a.owner.user for a in sp.cluster.ledger.allocations()]))
        emit(progress, message)

    sp._emit = watch
    # (the engine has the NVIDIA hook's test double, scripts/dockerd.sh: the GPU container
    # starts, with no GPU inside)
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(sp.start(), 180)
    except Exception as e:  # noqa: BLE001 - report what the spawn said
        pytest.fail(f"spawn failed: {e}; events {[m for m, _ in seen]}")
    took = time.perf_counter() - t0
    try:
        pulls = [(m, owners) for m, owners in seen if m.startswith(f"pulling image {ref}: ")]
        assert pulls, [m for m, _ in seen]
        # bytes: "N of M MiB", M the layer that was not on the engine (64 MiB of random bytes)
        done, total = (int(x) for x in re.fullmatch(r".*: (\d+) of (\d+) MiB", pulls[-1][0])
                       .groups())
        assert done == total and abs(total - registry_image.layer_bytes / 2**20) <= 2, pulls
        # nothing booked during the pull and the check; booked after them
        assert all("pulluser" not in owners for _, owners in pulls), seen
        checked = next(i for i, (m, _) in enumerate(seen) if m.startswith(f"Image {ref} checked"))
        assert all("pulluser" not in owners for _, owners in seen[:checked + 1]), seen
        placed = next(i for i, (m, _) in enumerate(seen) if m.startswith("Placed:"))
        assert placed > checked
        # (other tests' servers on this engine may be in the ledger too: only ours counts)
        (alloc,) = [a for a in sp.cluster.ledger.allocations() if a.owner.user == "pulluser"]
        assert len(alloc.gpu_uuids) == 1
        # the server runs from the pulled image, whose digest the registry gave
        assert pulled_from(client, registry_image)
        info = client.inspect_container(container_id(sp))
        assert info["Config"]["Image"] == ref and info["State"]["Running"], info["State"]
        state = sp.get_state()["image"]
        assert state["reference"] == ref
        assert state["digest"] == client.inspect_image(ref)["Id"]
        print(f"pull + check + spawn of {ref}: {took:.2f} s")
    finally:
        await sp.stop()
    assert [a for a in sp.cluster.ledger.allocations() if a.owner.user == "pulluser"] == []


#: what the stand-in service answers to every request (the engine quotes it in its error)
SECRET = b"SECRET-BODY-of-a-hub-service {\"token\": \"abc\"}"


@pytest.fixture
def service_on_loopback():
    """A stand-in for a service on the hub's host (the gpuspawner service, the proxy's API):
    every GET and HEAD is answered 404 with :data:`SECRET`; yields ``(port, requests seen)``."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.requestline)
            self.send_response(404)
            self.send_header("Content-Length", str(len(SECRET)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(SECRET)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()
    thread.join(10)


#: a CPU profile whose users may type any image (no validation_regex), as in issue 46
ANY_IMAGE = [{"slug": "own", "cpu": 1, "memory": "256M", "profile_options": {
    "image": {"unlisted_choice": {"enabled": True}}}}]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_registry_on_loopback_is_refused_before_the_engine_calls_it(
        make_spawner, client, service_on_loopback, host):  # noqa: F811
    """Issue 46, item 5: ``127.0.0.1:PORT/x`` and ``localhost:PORT/x`` made the engine send
    requests to services on the hub's host, and the 400 quoted their answers. Now a 400
    naming the field and ``allowed_registries``; the service is never called."""
    port, seen = service_on_loopback
    ref = f"{host}:{port}/x:1"
    sp = make_spawner("ssrf", options={"profile": "own", "image--unlisted-choice": ref},
                      profiles=ANY_IMAGE, image_check_timeout=30)
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    message = str(e.value)
    assert e.value.status_code == 400, message
    assert "image--unlisted-choice" in message and "allowed_registries" in message, message
    assert "SECRET" not in message
    assert seen == []  # the engine never called it
    assert [a for a in sp.cluster.ledger.allocations() if a.owner.user == "ssrf"] == []


async def test_a_listed_registrys_answer_is_never_shown(
        make_spawner, client, service_on_loopback):  # noqa: F811
    """Listed by the admin, the loopback "registry" is pulled from; the engine's error quotes
    its 404 body, and the 400 carries the engine's error class and a fixed phrase instead."""
    port, seen = service_on_loopback
    ref = f"127.0.0.1:{port}/x:1"
    sp = make_spawner("ssrf2", options={"profile": "own", "image--unlisted-choice": ref},
                      profiles=ANY_IMAGE, image_check_timeout=30,
                      allowed_registries=[f"127.0.0.1:{port}"])
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    message = str(e.value)
    assert e.value.status_code == 400, message
    assert seen, "the engine did not call the listed registry"
    assert "SECRET" not in message and "token" not in message, message
    assert re.search(r"cannot be pulled \(APIError \d+: the registry has no such image or "
                     r"tag\)", message), message


async def test_a_non_ascii_tag_is_a_400_on_the_real_engine(make_spawner, client):  # noqa: F811
    """Issue 46, item 6: ``registry:17010/x:tagé`` passed the hub's check and the engine's
    refusal escaped as docker.errors.APIError (HTTP 500). Now a 400 naming the field."""
    sp = make_spawner("taguser", options={"profile": "own",
                                          "image--unlisted-choice": "registry:17010/x:tag\u00e9"},
                      profiles=ANY_IMAGE, image_check_timeout=30)
    with pytest.raises(web.HTTPError) as e:
        await asyncio.wait_for(sp.start(), 90)
    assert e.value.status_code == 400, e.value
    assert "image--unlisted-choice" in str(e.value) and "ASCII" in str(e.value), str(e.value)
