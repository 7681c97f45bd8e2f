"""From a waiting request to its server answering on an elastic node started by the command
provider, beside the provider's start time alone (docs/howto/elastic-nodes.md).

What runs: the tests' provider programs (tests/doubles/elastic/start-node, stop-node: a Docker
engine in a network namespace of its own, scripts/elastic-engine.sh; its data root is kept, so
a start is a boot) and a real hub (hub_config, configurable-http-proxy) with node ``a`` (the
local engine, room for one server) and elastic node ``bench-el``.

1. **provider alone**: ``start-node`` run by hand, from its start until it printed the engine's
   URL (the engine answers then), ``--rounds`` times (each followed by ``stop-node``), after one
   untimed start and stop (the data root's first image load).
2. **request to answering**: the first user's server fills node ``a``; then, per round, a
   second user's spawn is POSTed and timed until its server answers through the proxy
   (``GET /user/NAME/api`` = 200, polled every 0.1 s), with ``scale_out_after = 0`` (the
   policy looks every 0.5 s); then the server is stopped and the node stopped once idle (1 s)
   before the next round.

The goal (issue's speed line): the median of 2 is at most the median of 1 plus 5 s.

Usage: ``.venv/bin/python benchmarks/elastic.py [--rounds 3]``; needs root (a network
namespace), the Docker engine, the single-user image and configurable-http-proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuspawner.inventory.local import read_local_node  # noqa: E402
from gpuspawner.inventory.topology import node_to_dict  # noqa: E402
from gpuspawner.placement import parse_cpu_list  # noqa: E402
from gpuspawner.testing.hubrunner import Hub  # noqa: E402
from gpuspawner.testing.waiting import wait_until  # noqa: E402

DOUBLES = REPO / "tests" / "doubles" / "elastic"
NODE = "bench-el"
POOL, LINK = "198.19.232.0/21", "198.19.231.252/30"


def topology(tmp: Path, name: str) -> str:
    d = node_to_dict(read_local_node(name))
    cpus = [
        c
        for n in d["numa_nodes"]
        for c in (n["cpus"] if isinstance(n["cpus"], list) else parse_cpu_list(str(n["cpus"])))
    ]
    d["numa_nodes"] = [{"id": 0, "cpus": cpus, "memory": 2**30}]
    d["gpus"] = []
    d.pop("links", None)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def provider(ctl: Path, what: str, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run(
        [str(DOUBLES / what), str(ctl), *args],
        check=True,
        capture_output=True,
        env=dict(os.environ, GPUSPAWNER_NODE=NODE),
    )
    return time.monotonic() - t0


def answering(hub: Hub, user: str) -> bool:
    try:
        r = requests.get(
            f"{hub.url}/user/{user}/api", timeout=5, headers={"Authorization": f"token {hub.token}"}
        )
    except requests.RequestException:
        return False
    return r.status_code == 200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuspawner-elastic-bench."))
    ctl = tmp / "ctl"
    ctl.mkdir()
    (ctl / "pool").write_text(POOL)
    (ctl / "link").write_text(LINK)
    topo = topology(tmp, NODE)
    (ctl / "topology.json").write_text(json.dumps(yaml.safe_load(Path(topo).read_text())))

    provider(ctl, "start-node", "cpu")  # untimed: the data root's first image load
    provider(ctl, "stop-node", NODE)
    alone = []
    for _ in range(args.rounds):
        alone.append(provider(ctl, "start-node", "cpu"))
        provider(ctl, "stop-node", NODE)

    cores = sum(len(n.cpus) for n in read_local_node("x").numa_nodes)
    profiles = [{"slug": "all", "cpu": cores, "memory": "256M", "queue": True, "default": True}]
    nodes = [
        {"name": "a", "topology": topology(tmp, "a")},
        {"name": NODE, "elastic": True, "category": "cpu", "topology": topo, "network_pool": POOL},
    ]
    extra = f"""
c.GPUSpawner.placement_policy = 'first-fit'
c.CommandProvider.start_command = [{str(DOUBLES / "start-node")!r}, {str(ctl)!r}]
c.CommandProvider.stop_command = [{str(DOUBLES / "stop-node")!r}, {str(ctl)!r}]
c.GPUElastic.scale_out_after = 0
c.GPUElastic.interval = 0.5
c.GPUElastic.idle_shutdown = 1
c.GPUElastic.backoff = 1
c.GPUElastic.starts_per_hour = 100
c.GPUElastic.join_timeout = 180
"""
    hub = Hub(tmp / "hub", nodes, profiles, extra_config=extra)
    hub.env["GPUSPAWNER_CULLER"] = "off"
    hub.start()
    full: list[float] = []
    running: list[float] = []
    try:
        for user in ("bench-a", "bench-b"):
            hub.ensure_user(user)
        for _ in range(args.rounds):  # the same spawn on a running node, for comparison
            t0 = time.monotonic()
            r = hub.api("POST", "/users/bench-a/server", {"profile": "all"})
            assert r.status_code in (201, 202), r.text
            wait_until(lambda: answering(hub, "bench-a"), 240)
            running.append(time.monotonic() - t0)
            hub.api("DELETE", "/users/bench-a/server")
            hub.wait_stopped("bench-a")
        hub.api("POST", "/users/bench-a/server", {"profile": "all"})
        hub.wait_ready("bench-a")
        for _ in range(args.rounds):
            t0 = time.monotonic()
            r = hub.api("POST", "/users/bench-b/server", {"profile": "all"})
            assert r.status_code in (201, 202), r.text
            wait_until(lambda: answering(hub, "bench-b"), 240)
            full.append(time.monotonic() - t0)
            hub.api("DELETE", "/users/bench-b/server")
            hub.wait_stopped("bench-b")
            wait_until(
                lambda: (
                    (ctl / "calls").read_text().count(f"stop {NODE}") >= 1 + args.rounds + len(full)
                ),
                60,
            )
    finally:
        for user in ("bench-a", "bench-b"):
            try:
                hub.api("DELETE", f"/users/{user}/server")
                hub.wait_stopped(user)
            except Exception:
                pass
        hub.stop()
        provider(ctl, "stop-node", NODE)
    a, f = statistics.median(alone), statistics.median(full)
    print(
        f"provider start alone (start-node until the engine answers), {args.rounds} rounds: "
        f"median {a:.2f} s  ({', '.join(f'{x:.2f}' for x in alone)})"
    )
    print(
        f"waiting request -> server answering on the started node, {args.rounds} rounds: "
        f"median {f:.2f} s  ({', '.join(f'{x:.2f}' for x in full)})"
    )
    n = statistics.median(running)
    print(
        f"the same spawn on a running node (a), {args.rounds} rounds: median {n:.2f} s  "
        f"({', '.join(f'{x:.2f}' for x in running)})"
    )
    print(
        f"overhead over the provider's start: {f - a:.2f} s (goal <= 5 s): "
        f"{'met' if f - a <= 5 else 'NOT met'}; of which the spawn itself {n:.2f} s, the "
        f"rest (policy look, join check, queue) {f - a - n:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
