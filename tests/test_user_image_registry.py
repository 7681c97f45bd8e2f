"""A user's own image pulled for real from an allowed registry (issue 26, item 2): the project's
private registry on loopback (``scripts/registry.sh``, ``make registry``), a user's image pushed
there and removed from the engine, then a spawn with ``image--unlisted-choice`` = that
reference pulls it (progress in bytes), checks it and runs the server in it, and nothing is
booked while the pull runs (a pull never holds a core, memory or a GPU).

Marked ``docker``; skipped with a reason when no engine, no single-user image or no registry
answers (``make engine images registry``)."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

docker = pytest.importorskip("docker")

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
    sp = make_spawner("pulluser", options={"profile": "own", "image--unlisted-choice": ref},
                      profiles=own_profiles(ref.split("/", 1)[0]), image_check_timeout=120)
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
