"""Node health in the hub's cluster (gpuspawner.hub.cluster.Cluster.refresh_health) with a
test double of the Backend interface: a node the backend reports down takes no new placements,
comes back after a sweep when it is up again, and a remote engine cannot use topology "auto"."""

from __future__ import annotations

import pytest

from gpuspawner.backends.base import Backend, NodeRuntime
from gpuspawner.hub.cluster import Cluster, NodeConfigError, parse_node_config
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from tests.factories import make_node


class FakeBackend(Backend):
    """Test double of the Backend interface: node states set by the test, sweeps recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, tuple[str, str]] = {}
        self.swept: list[str] = []
        self.asked = 0

    async def node_states(self) -> dict[str, tuple[str, str]]:
        self.asked += 1
        return dict(self.states)

    async def sweep(self, node, booked, owner_booked) -> list[str]:
        self.swept.append(node)
        return []


def cluster() -> tuple[Cluster, FakeBackend]:
    nodes = [make_node("n1", gpus=1), make_node("n2", gpus=1)]
    ledger = Ledger(nodes, policy="first-fit")
    table = {n.name: NodeRuntime(n.name, "127.0.0.1", "test", n) for n in nodes}
    backend = FakeBackend()
    backend.bind(table)
    return Cluster(table, ledger, backend), backend


async def test_down_node_takes_nothing_until_it_is_up_and_swept():
    c, backend = cluster()
    backend.states = {"n1": ("down", "Docker engine unavailable: refused")}
    await c.refresh_health()
    gpu = Bundle(cores=1, gpus=1, numa_policy="none")
    assert c.ledger.reserve(gpu, Owner("a")).node == "n2"
    with pytest.raises(PlacementRefused, match="node n1 is down"):
        c.ledger.reserve(gpu, Owner("b"))
    await c.refresh_health()  # within max_age: not asked again
    assert backend.asked == 1
    backend.states = {}
    await c.refresh_health(max_age=0)
    assert backend.swept == ["n1"]  # what outlived the outage is removed before new work
    assert c.ledger.reserve(gpu, Owner("b")).node == "n1"


async def test_mark_suspect_takes_a_node_out_at_once():
    c, backend = cluster()
    c.mark_suspect("n1", "node n1: Docker engine unavailable: timeout")
    assert c.ledger.node_state("n1")[0] == "down"
    await c.refresh_health()  # mark_suspect asks for a fresh check; the engine answers again
    assert c.ledger.node_state("n1") == ("up", "")
    assert backend.swept == ["n1"]


def test_remote_engine_needs_a_topology_file():
    with pytest.raises(NodeConfigError, match=r"nodes\[0\] \(far\).topology: 'auto' reads"):
        parse_node_config([{"name": "far", "docker_url": "tcp://198.18.7.2:2376",
                            "topology": "auto"}])
    # a second engine on this host (a unix socket) may still read this host
    (rt,) = parse_node_config([{"name": "here", "docker_url": "unix:///tmp/none.sock"}])
    assert rt.name == "here"

