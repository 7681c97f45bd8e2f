"""The one shared backend and many spawners: an admin's callable setting
(``c.DockerBackend.extra_host_config = lambda spawner: ...``) receives the spawner whose server
this task starts, also when spawns interleave (gpuspawner.backends.base.current_spawner), and
each backend error carries the HTTP status the hub answers with."""

from __future__ import annotations

import asyncio

from gpuspawner.backends.base import (
    BackendError,
    BackendUnavailable,
    LaunchFailed,
    LaunchRefused,
    current_spawner,
)
from gpuspawner.backends.docker_backend import DockerBackend


def test_concurrent_spawns_each_resolve_their_own_spawner():
    seen: list[tuple[str, str]] = []

    async def host_config(spawner: str) -> dict:
        await asyncio.sleep(0.01)  # the other spawn runs meanwhile
        return {"mem_limit": spawner}

    backend = DockerBackend(extra_host_config=host_config)

    async def spawn(name: str) -> None:
        current_spawner.set(name)  # what GPUSpawner.start does first
        await asyncio.sleep(0)
        seen.append((name, (await backend._resolved(backend.extra_host_config))["mem_limit"]))

    async def both() -> None:
        await asyncio.gather(asyncio.ensure_future(spawn("alice")),
                             asyncio.ensure_future(spawn("bob")))

    asyncio.run(both())
    assert sorted(seen) == [("alice", "alice"), ("bob", "bob")]


def test_backend_errors_carry_the_hub_status():
    assert BackendUnavailable("n1", "gone").status_code == 503
    assert LaunchRefused("no").status_code == 400
    assert LaunchFailed("exited").status_code == BackendError("x").status_code == 500
