"""The isolation rule check without a hub (gpuspawner/hub/isolation.py, Cluster.check_isolation):
which FORWARD rules isolate a pool, which engines the hub can check, and a node without the
rule drained for new servers only, with the reason, until the rule is back."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

import gpuspawner.hub.cluster as cluster_module
from gpuspawner.hub.cluster import get_cluster, reset_clusters
from gpuspawner.hub.isolation import is_local_engine, parse_pools, uncovered

SHIPPED = ("-P FORWARD ACCEPT\n-A FORWARD -s 198.18.0.0/15 -d 198.18.0.0/15 -m comment "
           "--comment gpuspawner-isolation -j DROP\n")


@pytest.mark.parametrize("rules, pool, missing", [
    (SHIPPED, "198.18.0.0/16", []),
    (SHIPPED, "198.19.0.0/16,198.18.0.0/24", []),
    ("-P FORWARD ACCEPT\n", "198.18.0.0/16", ["198.18.0.0/16"]),
    ("-A FORWARD -s 198.18.0.0/16 -d 198.18.0.0/16 -j DROP\n", "198.18.0.0/15",
     ["198.18.0.0/15"]),  # a narrower rule leaves part of the pool open
    ("-A FORWARD -s 198.18.0.0/15 -d 198.18.0.0/15 -p tcp -j DROP\n", "198.18.0.0/16",
     ["198.18.0.0/16"]),  # only TCP: not isolation
    ("-A FORWARD ! -s 198.18.0.0/15 -d 198.18.0.0/15 -j DROP\n", "198.18.0.0/16",
     ["198.18.0.0/16"]),
    ("-A FORWARD -s 198.18.0.0/15 -d 198.18.0.0/15 -j ACCEPT\n", "198.18.0.0/16",
     ["198.18.0.0/16"]),
    ("-A FORWARD -s 198.18.0.0/15 -d 198.18.0.0/15 -j REJECT --reject-with "
     "icmp-port-unreachable\n", "198.18.0.0/16", []),
    ("-A FORWARD -j DROP\n", "198.18.0.0/16", []),  # everything dropped: isolated too
])
def test_which_rules_isolate_a_pool(rules: str, pool: str, missing: list[str]) -> None:
    assert uncovered(rules, parse_pools(pool)) == [ipaddress.IPv4Network(m) for m in missing]


def test_engines_the_hub_can_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert is_local_engine("") and is_local_engine("unix:///var/run/docker.sock")
    assert not is_local_engine("tcp://node-2:2376") and not is_local_engine("ssh://gpu-2")
    monkeypatch.setenv("DOCKER_HOST", "tcp://elsewhere:2376")
    assert not is_local_engine("")
    with pytest.raises(ValueError, match="network pool 'x'"):
        parse_pools("198.18.0.0/16,x")


@pytest.fixture
def cluster() -> Iterator[cluster_module.Cluster]:
    reset_clusters()
    yield get_cluster([{"name": "local", "topology": "auto"}], "fgd", {})
    reset_clusters()


async def test_a_node_without_the_rule_is_drained_until_it_is_back(
        cluster: cluster_module.Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = ["-P FORWARD ACCEPT\n"]
    reads = []

    async def read(timeout: float = 10.0) -> str:
        reads.append(1)
        return rules[0]

    monkeypatch.setattr(cluster_module, "read_forward_rules", read)
    missing = await cluster.check_isolation()
    assert list(missing) == ["local"]
    state, reason = cluster.ledger.node_state("local")
    assert state == "drain" and "the isolation firewall rule is missing on node local" in reason
    assert "scripts/network.sh on local" in reason
    await cluster.check_isolation(max_age=60)  # young enough: not read again
    assert len(reads) == 1
    rules[0] = SHIPPED
    assert await cluster.check_isolation() == {}
    assert cluster.ledger.node_state("local") == ("up", "")
    # a node down for another reason stays down when the rule comes and goes
    rules[0] = "-P FORWARD ACCEPT\n"
    cluster.ledger.set_node_state("local", "down", "engine gone")
    await cluster.check_isolation()
    assert cluster.ledger.node_state("local") == ("down", "engine gone")
    rules[0] = SHIPPED
    await cluster.check_isolation()
    assert cluster.ledger.node_state("local") == ("down", "engine gone")


async def test_an_unreadable_firewall_changes_nothing(
        cluster: cluster_module.Cluster, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    async def read(timeout: float = 10.0) -> str:
        raise cluster_module.IsolationCheckError("cannot run iptables: not found")

    monkeypatch.setattr(cluster_module, "read_forward_rules", read)
    assert await cluster.check_isolation() == {}
    await cluster.check_isolation()
    assert cluster.ledger.node_state("local") == ("up", "")
    assert sum("cannot be checked" in r.message for r in caplog.records) == 1
