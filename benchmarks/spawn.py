"""Spawn time: REST request to ready server, GPUSpawner against plain DockerSpawner with the same
image, the same network setup (a bridge network per server, reached by IP) and memory limit,
sequential and concurrent, in the same run (for the concurrent spawns also the spread from the
first to the last ready server and the CPU seconds each server's container had used when it was
ready, from the engine's stats); plus the cost of placement and bookkeeping per spawn
(profile check, ledger reserve, container config, release) measured in-process without Docker.

Ready is the hub's own "ready" event on the spawn's progress stream (JupyterHub's
``GET /users/{name}/server/progress``): one open request per spawn, where polling the user
model every 0.3 s from each waiting client kept the hub's loop busy (up to 89% of it in a
profile with 8 concurrent spawns on 2 loaded cores) and so slowed the spawns it measured.
Both spawners get GPUSpawner's start and HTTP timeouts of hub_config (120 s, 60 s). A failed
spawn is reported and left out of the figures. Each phase prints the load average and the hub
process's CPU seconds (user + system) while it ran; ``--first`` chooses which spawner runs
first (alternate it between runs on a shared machine).

Needs the engine, the image and configurable-http-proxy (``make engine images chp``).
Run: ``.venv/bin/python benchmarks/spawn.py [--sequential 5] [--concurrent 8]
[--first dockerspawner]``.
Bounded: at most ``--sequential`` + ``--concurrent`` spawns per spawner, each with a 180 s limit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuspawner.testing.hubrunner import Hub  # noqa: E402

PLAIN = """
import ipaddress
import itertools
from dockerspawner import DockerSpawner

_BLOCKS = itertools.count()

class NetDockerSpawner(DockerSpawner):
    \"\"\"Plain DockerSpawner with the same network setup as GPUSpawner (ENVIRONMENT.md): a
    bridge network of its own per server (a /28 with an explicit subnet, made before the
    container, removed after it), the server on port 8888 in its namespace, reached by IP.\"\"\"
    async def start(self):
        net = ipaddress.ip_network("198.19.128.0/17").subnets(new_prefix=28)
        subnet = next(itertools.islice(net, next(_BLOCKS), None))
        gw = str(next(subnet.hosts()))
        self.network_name = f"bench-{self.escaped_name}"
        ipam = {"Driver": "default", "Config": [{"Subnet": str(subnet), "Gateway": gw}]}
        await self.docker("create_network", self.network_name, driver="bridge", ipam=ipam)
        return await super().start()

    async def stop(self, now=False):
        await super().stop(now=now)
        await self.docker("remove_network", f"bench-{self.escaped_name}")

c.JupyterHub.spawner_class = NetDockerSpawner
c.NetDockerSpawner.image = "gpuspawner/singleuser:latest"
c.NetDockerSpawner.use_internal_ip = True
c.NetDockerSpawner.remove = True
c.NetDockerSpawner.pull_policy = "never"
c.NetDockerSpawner.mem_limit = "256M"
c.NetDockerSpawner.extra_create_kwargs = {"user": "1000:100"}
c.NetDockerSpawner.environment = {"HOME": "/tmp"}
c.NetDockerSpawner.start_timeout = 120  # GPUSpawner's, in hub_config
c.NetDockerSpawner.http_timeout = 60
"""

PROFILES = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]


def wait_ready_event(hub: Hub, user: str, timeout: float = 180) -> None:
    """Read the spawn's progress stream until the hub's "ready" event. Raises RuntimeError on
    its "failed" event, a stream that ends without either, or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with hub.session.get(f"{hub.api_url}/users/{user}/server/progress", stream=True,
                         timeout=30, headers={"Authorization": f"token {hub.token}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"progress of {user}: {r.status_code} {r.text[:200]}")
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("ready"):
                    return
                if event.get("failed"):
                    raise RuntimeError(f"spawn of {user} failed: {event.get('message')}")
            if time.monotonic() > deadline:
                break
    raise RuntimeError(f"spawn of {user}: no ready event within {timeout:g} s")


#: per spawned user: the CPU seconds its container had used when the hub said it was ready
SERVER_CPU_S: dict[str, float] = {}
#: per spawned user: time.perf_counter() at the hub's ready event
READY_AT: dict[str, float] = {}


def container_cpu_s(user: str) -> float | None:
    """CPU seconds (user + system) the container of ``user``'s server has used so far, from the
    engine's stats (``one_shot``: no second sample); None when it is not found. Both spawners
    name it ``jupyter-<user>`` here (GPUSpawner's object name, DockerSpawner's default)."""
    import docker

    client = docker.APIClient(version="auto")
    for c in client.containers(filters={"name": f"jupyter-{user}"}):
        if f"/jupyter-{user}" in c.get("Names", []):
            stats = client.stats(c["Id"], stream=False, one_shot=True)
            return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
    return None


def spawn_once(hub: Hub, user: str, body: dict | None) -> float:
    """Seconds from the spawn request to the hub's ready event; the server's CPU at that
    moment goes to :data:`SERVER_CPU_S` (read after the time is taken)."""
    t0 = time.perf_counter()
    r = hub.api("POST", f"/users/{user}/server", body, timeout=180)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn of {user} failed: {r.status_code} {r.text}")
    wait_ready_event(hub, user, timeout=180)
    ready = READY_AT[user] = time.perf_counter()
    cpu = container_cpu_s(user)
    if cpu is not None:
        SERVER_CPU_S[user] = cpu
    return ready - t0


def hub_cpu_s(hub: Hub) -> float:
    """The hub process's CPU seconds so far (user + system, /proc/PID/stat)."""
    assert hub.proc is not None
    fields = Path(f"/proc/{hub.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_all(hub: Hub, users: list[str]) -> None:
    for u in users:
        hub.api("DELETE", f"/users/{u}/server")
    for u in users:
        hub.wait_stopped(u, timeout=60)


def measure(hub: Hub, tag: str, body: dict | None, sequential: int,
            concurrent: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"sequential": [], "concurrent": []}
    users = [f"{tag}s{i}" for i in range(sequential)]
    cpu0, load0 = hub_cpu_s(hub), os.getloadavg()[0]
    for u in users:
        hub.ensure_user(u)
        try:
            out["sequential"].append(spawn_once(hub, u, body))
        except Exception as e:  # reported, the run goes on
            print(f"  {tag}: sequential spawn of {u} failed: {str(e)[:300]}", file=sys.stderr)
        stop_all(hub, [u])
    print(f"  {tag} sequential: load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"hub CPU {hub_cpu_s(hub) - cpu0:.1f} s (spawns and stops)")
    users = [f"{tag}c{i}" for i in range(concurrent)]
    for u in users:
        hub.ensure_user(u)
    times: dict[str, float] = {}
    errors: dict[str, str] = {}

    def run(u: str) -> None:
        try:
            times[u] = spawn_once(hub, u, body)
        except Exception as e:  # reported below, the run goes on
            errors[u] = str(e)[:300]

    threads = [threading.Thread(target=run, args=(u,)) for u in users]
    cpu0, load0 = hub_cpu_s(hub), os.getloadavg()[0]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    print(f"  {tag} concurrent: load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"hub CPU {hub_cpu_s(hub) - cpu0:.1f} s (spawns)")
    ready = [READY_AT[u] for u in users if u in times]
    cpus = [SERVER_CPU_S[u] for u in users if u in SERVER_CPU_S and u in times]
    if ready and cpus:
        print(f"  {tag} concurrent: first to last ready {max(ready) - min(ready):.2f} s; "
              f"servers' CPU at ready: median {statistics.median(cpus):.2f} s, "
              f"min {min(cpus):.2f}, max {max(cpus):.2f}")
    out["concurrent"] = [times[u] for u in users if u in times]
    for u, e in errors.items():
        print(f"  {tag}: concurrent spawn of {u} failed: {e}", file=sys.stderr)
    stop_all(hub, users)
    return out


def bookkeeping_ms(n: int = 2000) -> tuple[float, float]:
    """Median and p99 of profile check + reserve + launch spec + container config + release,
    ms."""
    from jupyterhub.objects import Hub as HubObj

    from gpuspawner.backends.docker import container_config
    from gpuspawner.backends.spec import launch_spec
    from gpuspawner.hub.cluster import reset_clusters
    from gpuspawner.hub.spawner import GPUSpawner
    from gpuspawner.placement import Owner
    from gpuspawner.testing.fakes import FakeUser

    reset_clusters()
    sp = GPUSpawner(user=FakeUser("bench"), hub=HubObj(), oauth_client_id="c", api_token="t",
                    profiles=PROFILES, nodes=[{"name": "local", "topology": "auto"}])
    sp.user_options = {"profile": "cpu"}
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        profile = sp.chosen_profile()
        alloc = sp.cluster.ledger.reserve(profile.bundle, Owner("bench"))
        spec = launch_spec(name="jupyter-bench", user="bench", server="", allocation=alloc,
                           image="img", cmd=["jupyterhub-singleuser"], env=sp.get_env(),
                           uid=1000, gid=100, port=8888)
        container_config(spec, network="jupyter-bench-net", fixed_ip="198.18.0.2")
        sp.cluster.ledger.release(alloc.id)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequential", type=int, default=5)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--first", choices=("gpuspawner", "dockerspawner"), default="gpuspawner",
                    help="which spawner's hub runs first")
    args = ap.parse_args()
    med, p99 = bookkeeping_ms()
    print(f"placement + bookkeeping per spawn: median {med:.3f} ms, p99 {p99:.3f} ms")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [{"name": "local", "topology": "auto"}]
        runs = [("gpuspawner", "", {"profile": "cpu"}), ("dockerspawner", PLAIN, None)]
        if args.first == "dockerspawner":
            runs.reverse()
        for name, extra, body in runs:
            hub = Hub(Path(tmp) / name, nodes, PROFILES, extra_config=extra)
            hub.start(timeout=180)  # a loaded machine starts a hub slowly
            try:
                results[name] = measure(hub, name[:3], body, args.sequential,
                                        args.concurrent)
            finally:
                hub.stop()
    print(f"{'spawner':<14} {'mode':<11} {'n':>3} {'median s':>9} {'max s':>7}")
    for name in ("gpuspawner", "dockerspawner"):
        r = results[name]
        for mode, xs in r.items():
            if xs:
                print(f"{name:<14} {mode:<11} {len(xs):>3} {statistics.median(xs):>9.2f} "
                      f"{max(xs):>7.2f}")
    for mode in ("sequential", "concurrent"):
        if not (results["gpuspawner"][mode] and results["dockerspawner"][mode]):
            continue
        ratio = (statistics.median(results["gpuspawner"][mode])
                 / statistics.median(results["dockerspawner"][mode]))
        print(f"ratio gpuspawner/dockerspawner ({mode}, medians): {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
