"""Network isolation of user servers on a Docker engine: one small bridge network per server.

Why one network per server: with ``network_mode=host`` a user's process shares the hub's
network namespace and can take the hub's ports or a neighbour's "free" port (the exploits in
``docs/security.md``). On a bridge network each server has its own namespace, listens on a
fixed port there and is reached by its IP (DockerSpawner's ``use_internal_ip``). Docker's
``com.docker.network.bridge.enable_icc=false`` only works through Docker's iptables rules, which
are off when the engine runs with ``--iptables=false``; so every server gets its own /28 and the
host drops forwarded traffic between those networks with one firewall rule
(``iptables -I FORWARD -s POOL -d POOL -j DROP``, added by ``scripts/network.sh``). Traffic
between the host and a container is not forwarded and still flows: the hub API listens on the
hub network's gateway address, which every container reaches through the host.

Addresses come from an explicit pool (default 198.18.0.0/15, the benchmarking range of RFC
2544): the hub network is its first /28, server networks are carved from the rest. Every
network is created with an explicit subnet (docker docs, "docker network create --subnet").
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: label on every network gpuspawner creates
from .base import owner_labels, same_owner

NETWORK_LABEL = "gpuspawner.managed"
#: the pool every gpuspawner network is taken from (RFC 2544 benchmarking range)
DEFAULT_POOL = "198.18.0.0/15"
#: the hub's own network (its gateway is the hub API's address)
DEFAULT_HUB_NETWORK = "gpuspawner-hub"
DEFAULT_HUB_SUBNET = "198.18.0.0/28"
#: pool of the per-server networks; subnets in use on the engine (the hub's included) are
#: skipped
DEFAULT_SERVER_POOL = DEFAULT_POOL


class NetworkConfigError(ValueError):
    """A malformed network setting (the message names the setting)."""


class NetworkTaken(RuntimeError):
    """A network of the wanted name exists with other owner labels (or not ours).

    Attributes:
        name: the network. owner: its owner labels ({} when not made by gpuspawner).
    """

    def __init__(self, name: str, owner: Mapping[str, str]) -> None:
        super().__init__(f"network {name} belongs to {dict(owner) or 'someone else'}")
        self.name, self.owner = name, dict(owner)


class NetworkPoolExhausted(RuntimeError):
    """Every subnet of the server pool is in use on this engine."""


@dataclass(frozen=True)
class ServerNetwork:
    """One server's network on one engine.

    Attributes:
        name: Docker network name.
        subnet: the network's subnet (a /28 by default: 14 addresses).
        gateway: the host's address on it (the first address).
        server_ip: the container's fixed address (the second address).
    """

    name: str
    subnet: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    server_ip: ipaddress.IPv4Address

    @classmethod
    def in_subnet(cls, name: str, subnet: ipaddress.IPv4Network) -> ServerNetwork:
        """The network ``name`` on ``subnet``: gateway = first host, server = second host."""
        hosts = subnet.hosts()
        gateway = next(hosts)
        return cls(name, subnet, gateway, next(hosts))

    def to_dict(self) -> dict[str, str]:
        """{"name", "subnet"} (for spawner state)."""
        return {"name": self.name, "subnet": str(self.subnet)}

    @classmethod
    def from_dict(cls, d: Mapping[str, str]) -> ServerNetwork:
        """Inverse of :meth:`to_dict`."""
        return cls.in_subnet(d["name"], ipaddress.IPv4Network(d["subnet"]))


def parse_pool(text: str | Iterable[str], setting: str = "server_network_pool"
               ) -> list[ipaddress.IPv4Network]:
    """Parse a pool: CIDR blocks separated by commas (or a list of them).

    Raises:
        NetworkConfigError: not an IPv4 CIDR block, or a block overlapping a private (RFC
            1918) range: user networks must never take a range the site's own networks use.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            net = ipaddress.IPv4Network(item, strict=True)
        except ValueError as e:
            raise NetworkConfigError(f"{setting}: {item!r} is not an IPv4 CIDR block: {e}") \
                from None
        if any(net.overlaps(ipaddress.IPv4Network(p)) for p in
               ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")):
            raise NetworkConfigError(f"{setting}: {item} overlaps a private (RFC 1918) range; "
                                     "use 198.18.0.0/15 or another range reserved for you")
        out.append(net)
    if not out:
        raise NetworkConfigError(f"{setting}: empty")
    return out


def used_subnets(networks: Iterable[Mapping[str, Any]]) -> list[ipaddress.IPv4Network]:
    """The IPv4 subnets of Docker networks (``docker network inspect`` / ``networks()``
    dicts: ``IPAM.Config[].Subnet``)."""
    out = []
    for n in networks:
        for cfg in ((n.get("IPAM") or {}).get("Config") or []):
            try:
                out.append(ipaddress.IPv4Network(cfg.get("Subnet", ""), strict=False))
            except ValueError:
                continue
    return out


def free_subnet(pool: list[ipaddress.IPv4Network], prefixlen: int,
                used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /``prefixlen`` block of ``pool`` that overlaps nothing in ``used``.

    Raises:
        NetworkPoolExhausted: none is free.
    """
    taken = sorted(used, key=lambda n: (int(n.network_address), n.prefixlen))
    for block in pool:
        if block.prefixlen > prefixlen:
            continue
        for candidate in block.subnets(new_prefix=prefixlen):
            if not any(candidate.overlaps(t) for t in taken):
                return candidate
    raise NetworkPoolExhausted(f"no free /{prefixlen} left in "
                               f"{', '.join(str(p) for p in pool)}")


class NetworkManager:
    """Creates and removes per-server networks on one engine (a low-level
    ``docker.APIClient``). Blocking: call from a worker thread. Thread-safe: a lock
    serialises the choice of subnet so two spawns never pick the same one.

    Args:
        client: the engine's ``docker.APIClient``.
        pool: CIDR blocks server networks are carved from.
        prefixlen: size of each server network (28 = 14 addresses).
    """

    def __init__(self, client: Any, pool: list[ipaddress.IPv4Network], prefixlen: int = 28
                 ) -> None:
        if not 16 <= prefixlen <= 29:
            raise NetworkConfigError(f"server_network_prefix: must be 16..29, got {prefixlen}")
        self.client = client
        self.pool = pool
        self.prefixlen = prefixlen
        self._lock = threading.Lock()

    def create(self, name: str, labels: Mapping[str, str]) -> ServerNetwork:
        """Create bridge network ``name`` on a free subnet of the pool, or return it when it
        exists already with the same owner ``labels`` (a retried spawn).

        Raises:
            NetworkTaken: it exists and is not ours or has another owner (when ``labels``
                name one: the shared network has none).
            NetworkPoolExhausted: no subnet left.
            docker.errors.APIError: the engine refused (other than an overlap, retried).
        """
        from docker.errors import APIError
        from docker.types import IPAMConfig, IPAMPool

        with self._lock:
            existing = self.client.networks(names=[name])
            for n in existing:
                if n.get("Name") == name:
                    info = self.client.inspect_network(n["Id"])
                    found = info.get("Labels") or {}
                    if owner_labels(labels) and (found.get(NETWORK_LABEL) != "1"
                                                 or not same_owner(found, labels)):
                        raise NetworkTaken(name, owner_labels(found)
                                           if found.get(NETWORK_LABEL) == "1" else {})
                    subnets = used_subnets([info])
                    if subnets:
                        return ServerNetwork.in_subnet(name, subnets[0])
            used = used_subnets(self.client.networks())
            for _ in range(8):
                subnet = free_subnet(self.pool, self.prefixlen, used)
                net = ServerNetwork.in_subnet(name, subnet)
                ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet),
                                                         gateway=str(net.gateway))])
                try:
                    self.client.create_network(
                        name, driver="bridge", ipam=ipam, check_duplicate=True,
                        labels={NETWORK_LABEL: "1", **labels},
                        options={"com.docker.network.bridge.enable_icc": "false"})
                    return net
                except APIError as e:
                    # a network made outside this process took the subnet meanwhile
                    if "overlap" not in str(e).lower():
                        raise
                    used.append(subnet)
            raise NetworkPoolExhausted("could not find a free subnet after 8 tries")

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Remove network ``name``; a missing one is fine. With ``labels``, only when its
        owner labels are those (another owner's network of that name is left alone).
        Containers still attached make the engine refuse (``docker.errors.APIError``)."""
        from docker.errors import NotFound

        try:
            if labels is not None:
                found = self.client.inspect_network(name).get("Labels") or {}
                if found.get(NETWORK_LABEL) != "1" or not same_owner(found, labels):
                    return
            self.client.remove_network(name)
        except NotFound:
            pass


def ensure_hub_network(client: Any = None, name: str = DEFAULT_HUB_NETWORK,
                       subnet: str = DEFAULT_HUB_SUBNET) -> str:
    """Create the hub's bridge network when missing and return its gateway address, where the
    hub API listens so that containers reach it (the host owns that address). Called from the
    hub configuration before the hub binds.

    Raises:
        NetworkConfigError: ``subnet`` is not a valid block, or the network exists on another
            subnet.
        docker.errors.DockerException: the engine does not answer.
    """
    import docker
    from docker.types import IPAMConfig, IPAMPool

    (block,) = parse_pool(subnet, "hub_network_subnet")
    net = ServerNetwork.in_subnet(name, block)
    client = client or docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
    found = [n for n in client.networks(names=[name]) if n.get("Name") == name]
    if found:
        subnets = used_subnets([client.inspect_network(found[0]["Id"])])
        if subnets != [block]:
            raise NetworkConfigError(f"hub network {name!r} exists with subnet(s) "
                                     f"{[str(s) for s in subnets]}, expected {block}")
        return str(net.gateway)
    client.create_network(name, driver="bridge", check_duplicate=True,
                          labels={NETWORK_LABEL: "1", "gpuspawner.role": "hub"},
                          ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(block),
                                                                 gateway=str(net.gateway))]))
    return str(net.gateway)
