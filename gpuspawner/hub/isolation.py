"""Is the isolation firewall rule there? (docs/security.md, "What isolates what")

Users' servers on one node are kept apart by one host firewall rule, added by
``scripts/network.sh``::

    iptables -I FORWARD -s POOL -d POOL -m comment --comment gpuspawner-isolation -j DROP

Without it (a reboot without a persistent rule set, someone's ``iptables -F``), every server
reaches every other one. The hub reads the host's ``FORWARD`` chain (``iptables -S FORWARD``)
when it starts and every minute (:class:`~gpuspawner.hub.cluster.Cluster`), and a node whose
server networks (``network_pool``, else ``c.DockerBackend.server_network_pool``) no rule
covers takes no new servers until the rule is back.

Only engines on the hub's own host (a ``unix://`` socket, or ``docker_url`` "" without a
remote ``DOCKER_HOST``) can be checked from the hub: the rule of a remote engine's node lives
in that node's firewall, which the hub cannot read (docs/install.md says how to keep it there).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shlex

__all__ = ["RESTORE_COMMAND", "IsolationCheckError", "is_local_engine", "missing_message",
           "parse_pools", "read_forward_rules", "uncovered"]

#: what restores the rule (run on the node, as root)
RESTORE_COMMAND = "scripts/network.sh"


class IsolationCheckError(RuntimeError):
    """The host firewall could not be read (no ``iptables``, not root, a timeout)."""


def is_local_engine(docker_url: str) -> bool:
    """Whether a node's engine (its ``docker_url``; "" = ``DOCKER_HOST``, else the local
    socket) runs on the hub's own host, whose firewall the hub can read."""
    url = docker_url or os.environ.get("DOCKER_HOST", "")
    return not url or url.startswith(("unix://", "/"))


def parse_pools(text: str) -> list[ipaddress.IPv4Network]:
    """The CIDR blocks of a pool (``"198.18.0.0/16"``, several separated by commas).

    Raises:
        ValueError: a block is not an IPv4 CIDR block (the message names it).
    """
    out = []
    for item in text.split(","):
        if item.strip():
            try:
                out.append(ipaddress.IPv4Network(item.strip(), strict=False))
            except ValueError as e:
                raise ValueError(f"network pool {item.strip()!r}: {e}") from None
    return out


def _dropping_rules(rules: str) -> list[tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]]:
    """(source, destination) of each ``-A FORWARD`` rule of ``iptables -S`` output that drops
    (or rejects) all traffic between two blocks: no negation, no protocol, port or interface
    match (a comment is fine)."""
    out = []
    for line in rules.splitlines():
        words = shlex.split(line) if line.startswith("-A FORWARD ") else []
        if not words or "!" in words:
            continue
        opts: dict[str, str] = {}
        i, plain = 2, True
        while i < len(words):
            w = words[i]
            if w in ("-s", "-d", "-j") and i + 1 < len(words):
                opts[w] = words[i + 1]
                i += 2
            elif w == "-m" and i + 1 < len(words) and words[i + 1] == "comment":
                i += 4 if i + 2 < len(words) and words[i + 2] == "--comment" else 2
            elif w == "--reject-with":
                i += 2
            else:
                plain = False
                break
        if not plain or opts.get("-j") not in ("DROP", "REJECT"):
            continue
        try:
            src = ipaddress.IPv4Network(opts.get("-s", "0.0.0.0/0"), strict=False)
            dst = ipaddress.IPv4Network(opts.get("-d", "0.0.0.0/0"), strict=False)
        except ValueError:
            continue
        out.append((src, dst))
    return out


def uncovered(rules: str, pools: list[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
    """The blocks of ``pools`` that no rule of ``rules`` (``iptables -S FORWARD``'s output)
    isolates: a plain DROP/REJECT rule whose source and destination both contain the block."""
    drops = _dropping_rules(rules)
    return [p for p in pools
            if not any(p.subnet_of(s) and p.subnet_of(d) for s, d in drops)]


async def read_forward_rules(timeout: float = 10.0) -> str:
    """``iptables -S FORWARD`` of this host (at most ``timeout`` seconds).

    Raises:
        IsolationCheckError: iptables is missing, fails (e.g. not root) or does not answer
            in time; the message says which.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            "iptables", "-S", "FORWARD", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise IsolationCheckError(f"cannot run iptables: {e}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise IsolationCheckError(f"iptables -S FORWARD did not answer in {timeout:g} s") \
            from None
    if proc.returncode != 0:
        raise IsolationCheckError(f"iptables -S FORWARD failed ({proc.returncode}): "
                                  f"{err.decode(errors='replace').strip()[:300]}")
    return out.decode(errors="replace")


def missing_message(node: str, blocks: list[ipaddress.IPv4Network]) -> str:
    """Why node ``node`` takes no new servers, and the command that restores the rule."""
    pools = ",".join(str(b) for b in blocks)
    return (f"the isolation firewall rule is missing on node {node}: no FORWARD rule drops "
            f"traffic between its server networks ({pools}), so servers could reach each "
            f"other; new servers are refused there until an admin runs "
            f"GPUSPAWNER_NETWORK_POOL={pools} {RESTORE_COMMAND} on {node} "
            f"(docs/install.md: keep it across reboots)")
