"""The real hub at scale: N servers (default 1,000) on JupyterHub + configurable-http-proxy with a
fake engine, GPUSpawner against DockerSpawner's bookkeeping, side by side in one run.

What runs (each side on a hub of its own, one after the other, never both at once): a real
JupyterHub 6 process with its configurable-http-proxy, on loopback ports, SQLite and every file
in a temporary folder; the same hub settings on both sides (DummyAuthenticator, WARN logging,
``cleanup_servers = False``, JupyterHub's default poll interval and spawn limits). The hub
configuration is written here, not ``hub_config/jupyterhub_config.py``, whose first lines make a
Docker network: this benchmark never talks to a Docker engine. Every "server" of both sides is
one shared responder process on 127.0.0.1 (``benchmarks/fake_backend.py``) reached at the
server's own path, which answers both spawners' readiness checks at once, so what differs
between the columns is the hub-side bookkeeping of the two spawners only:

- **gpuspawner**: ``c.JupyterHub.spawner_class = "gpu"`` with
  ``c.GPUSpawner.backend = "benchmarks.fake_backend.FakeBackend"``, the gpuspawner service
  (``configure_service``) and ``check_hub_config`` (the runtime made at hub start), as the
  shipped configuration has them. Fake nodes from topology files (32 cores on 2 NUMA nodes,
  8 shareable 80 GB GPUs each; one node per 24 servers); every server asks for the profile
  ``small`` (1 core, 2 GiB, a quarter GPU). Measured: GPUSpawner's whole spawn (options check,
  queue, fgd placement and the ledger's atomic reserve, launch spec, its own readiness check,
  state) down to the Backend interface.
- **dockerspawner**: ``DockerSpawner`` 14 (``FakeDockerSpawner``) with docker-py's
  ``APIClient`` replaced by an in-memory engine that answers at once: DockerSpawner's image
  check, create, start, port lookup, poll by inspect and its one-thread executor run as in
  production. No placement, no ledger, no REST service: the reference a DockerSpawner site runs.

Phases, per side:

1. **spawn**: ``POST /hub/api/users/{name}/server`` through the proxy for N users (made
   first, untimed), at most ``--concurrency`` at a time; a spawn's time runs from the POST to
   the server being ready (the POST's 201, or for a 202 the user model saying ready, polled
   every 50 ms); throughput = N / wall time of the whole phase.
2. **REST**: with N servers running, ``--requests`` sequential GETs per endpoint through the
   proxy, p50 and p99: the hub's own ``/hub/api/users?state=ready`` (a page of 200) on both
   sides; "all servers in one request": gpuspawner's ``api/allocations`` (every allocation
   with its devices) beside the hub's ``/hub/api/users?state=ready&limit=N`` (servers without
   resources: what a DockerSpawner site has); the service's ``api/nodes``, ``api/queue``,
   ``api/users/{name}/usage``, its ``admin`` GPU map page and ``metrics`` (gpuspawner only).
3. **culler**: one pass over the N running servers, ``--culler-repeat`` times, median:
   the project's ``idle_culler`` (policies with group and user entries, a GPU policy and a
   10-minute history of 60 samples per GPU, as benchmarks/culler.py) and
   jupyterhub-idle-culler 2, each with its own least-privilege token against the hub's API
   port. Every server is active, so nothing is culled and the hub is the same for each pass.
   On the dockerspawner side servers carry no GPU allocation, so the GPU signal has nothing to
   read there.

gpuspawner's hub runs with the collector thresholds ``wire_hub`` sets
(``gpuspawner.hub.collector.HUB_GC_THRESHOLD``), DockerSpawner's with Python's; ``--gc-python``
gives gpuspawner's hub Python's too (the hub before that module), ``--gc-threshold`` others.

Usage: ``.venv/bin/python benchmarks/hub_scale.py [--servers 1000] [--concurrency 10]
[--requests 100] [--culler-repeat 3] [--time-limit 900]``. Needs configurable-http-proxy
(``make chp``). Bounded: N servers per side, every wait under the one ``--time-limit``
(seconds, whole run; exit 2 when it runs out). Cleans up what it starts (hubs, proxies, the
responder, the temporary folder) on every exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import jupyterhub
import yaml
from jupyterhub_idle_culler import cull_idle

from gpuspawner.hub.collector import HUB_GC_THRESHOLD, check_gc_threshold
from idle_culler.core import Culler
from idle_culler.gpu import GPUHistory
from idle_culler.hub import HubClient
from idle_culler.policies import PolicySet

try:
    from benchmarks import loop_probe
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    import loop_probe  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
FAKE_BACKEND = REPO / "benchmarks" / "fake_backend.py"

#: servers of one fake node (32 cores, 8 GPUs in quarters = 32 servers; 24 leaves room)
SERVERS_PER_NODE = 24
PROFILE = {"slug": "small", "display_name": "small", "cpu": 1, "memory": "2G", "gpus": 0.25,
           "default": True}
SIDES = ("gpuspawner", "dockerspawner")

ADMIN_SCOPES = ["admin:users", "admin:groups", "admin:servers", "list:users", "read:users",
                "access:services", "read:metrics"]
OURS_CULLER_SCOPES = ["list:users", "read:users:activity", "read:users:groups", "read:servers",
                      "delete:servers", "admin:server_state"]
REF_CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]

COMMON_CONFIG = """
import sys
sys.path.insert(0, {repo!r})
c = get_config()  # noqa
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.log_level = "warn"
c.ConfigurableHTTPProxy.pid_file = "proxy.pid"
c.JupyterHub.pid_file = "jupyterhub.pid"
c.JupyterHub.db_url = "sqlite:///jupyterhub.sqlite"
c.JupyterHub.cookie_secret = bytes.fromhex({secret!r})
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"admin"}}
c.JupyterHub.cleanup_servers = False
c.JupyterHub.log_level = "WARN"
c.JupyterHub.api_page_max_limit = {page_max}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60
c.JupyterHub.services = [
    {{"name": "bench-admin", "api_token": {admin_token!r}}},
    {{"name": "ours-culler", "api_token": {ours_token!r}}},
    {{"name": "reference-culler", "api_token": {ref_token!r}}},
]
from benchmarks.loop_probe import install as _install_loop_probe
_install_loop_probe({folder!r})
c.JupyterHub.load_roles = [
    {{"name": "bench-admin", "services": ["bench-admin"], "scopes": {admin_scopes!r}}},
    {{"name": "ours-culler", "services": ["ours-culler"], "scopes": {ours_scopes!r}}},
    {{"name": "reference-culler", "services": ["reference-culler"],
      "scopes": {ref_scopes!r}}},
]
"""

GPUSPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "gpu"
c.GPUSpawner.backend = "benchmarks.fake_backend.FakeBackend"
c.FakeBackend.responder_port = {responder_port}
c.GPUSpawner.state_dir = {state_dir!r}
c.GPUSpawner.nodes = {nodes!r}
c.GPUSpawner.profiles = {profiles!r}
c.GPUSpawner.placement_policy = "fgd"
{gc_lines}from gpuspawner.hub.service import configure_service
configure_service(c)
from gpuspawner.hub.config_check import check_hub_config
check_hub_config(c)
"""

DOCKERSPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "benchmarks.fake_backend.FakeDockerSpawner"
c.FakeDockerSpawner.responder_port = {responder_port}
c.FakeDockerSpawner.remove = True
"""

T = TypeVar("T")


class TimeLimit(Exception):
    """The run's ``--time-limit`` ran out (the message names the phase)."""


@dataclass
class Clock:
    """The whole run's deadline (``time.monotonic()`` seconds)."""

    deadline: float

    def left(self, phase: str) -> float:
        """Seconds left. Raises TimeLimit naming ``phase`` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeLimit(f"time limit reached during {phase}")
        return left

    async def bound(self, phase: str, aw: Awaitable[T]) -> T:
        """``aw`` under the time left. Raises TimeLimit naming ``phase``."""
        try:
            return await asyncio.wait_for(aw, self.left(phase))
        except asyncio.TimeoutError:
            raise TimeLimit(f"time limit reached during {phase}") from None


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_node(i: int) -> dict[str, Any]:
    """Topology (docs/topology-files.md) of fake node ``i``: 2 NUMA nodes of 16 cores and
    128 GiB, 8 shareable 80 GB A100s (4 per NUMA node), 1 TB disk."""
    name = f"fake-{i:03d}"
    return {
        "name": name, "disk": "1T",
        "numa_nodes": [{"id": 0, "cpus": "0-15", "memory": "128G"},
                       {"id": 1, "cpus": "16-31", "memory": "128G"}],
        "gpus": [{"uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{name}/{k}')}", "index": k,
                  "model": "A100", "memory": "80G", "numa_node": k // 4, "shareable": True}
                 for k in range(8)],
    }


# -- processes -------------------------------------------------------------------------------
class Process:
    """A child process in a session of its own, its output in ``log``; :meth:`stop` sends
    SIGTERM to the whole session (the hub's proxy with it), SIGKILL after ``grace`` s."""

    def __init__(self, argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace: float = 30) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["CONFIGPROXY_AUTH_TOKEN"] = secrets.token_hex(16)
    env.pop("DOCKER_HOST", None)  # nothing here may reach an engine
    return env


def start_responder(folder: Path, clock: Clock) -> tuple[Process, int]:
    """Start the shared responder; returns it and its port. Raises RuntimeError (it exited)
    or TimeLimit."""
    port_file = folder / "responder.port"
    p = Process([sys.executable, str(FAKE_BACKEND), "--port-file", str(port_file)],
                folder, folder / "responder.log", child_env())
    while not port_file.exists():
        clock.left("responder start")
        if p.proc.poll() is not None:
            raise RuntimeError(f"responder exited with {p.proc.returncode}:\n{p.tail()}")
        time.sleep(0.05)
    return p, int(port_file.read_text())


@dataclass
class Hub:
    """One side's hub: its folder, ports and tokens (:meth:`start` writes the config)."""

    side: str
    folder: Path
    servers: int
    responder_port: int
    #: gpuspawner's hub only: gc.freeze() once started (``--gc-freeze``), and thresholds
    gc_freeze: bool = False
    gc_threshold: tuple[int, int, int] | None = None
    port: int = field(default_factory=free_port)
    hub_api_port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(24))
    ours_token: str = field(default_factory=lambda: secrets.token_hex(24))
    ref_token: str = field(default_factory=lambda: secrets.token_hex(24))
    process: Process | None = None
    #: phase -> the hub loop's report for it (:meth:`loop_report`)
    loop: dict[str, dict[str, Any]] = field(default_factory=dict)
    _reports: int = 0

    @property
    def url(self) -> str:
        """The proxy's public URL (what users reach)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The hub's own API (what hub-managed services reach, the cullers here)."""
        return f"http://127.0.0.1:{self.hub_api_port}/hub/api"

    def config(self) -> str:
        text = COMMON_CONFIG.format(
            repo=str(REPO), port=self.port, hub_api_port=self.hub_api_port,
            proxy_api_port=free_port(), chp=str(CHP), secret=secrets.token_hex(32),
            page_max=max(200, self.servers), admin_token=self.admin_token,
            ours_token=self.ours_token, ref_token=self.ref_token,
            admin_scopes=ADMIN_SCOPES, ours_scopes=OURS_CULLER_SCOPES,
            ref_scopes=REF_CULLER_SCOPES, folder=str(self.folder))
        if self.side == "gpuspawner":
            topo = self.folder / "topology"
            topo.mkdir()
            nodes = []
            for i in range(max(1, math.ceil(self.servers / SERVERS_PER_NODE))):
                node = fake_node(i)
                path = topo / f"{node['name']}.yaml"
                path.write_text(yaml.safe_dump(node))
                nodes.append({"name": node["name"], "topology": str(path)})
            state = self.folder / "state"
            state.mkdir(mode=0o700)
            text += GPUSPAWNER_CONFIG.format(responder_port=self.responder_port,
                                             state_dir=str(state), nodes=nodes,
                                             profiles=[PROFILE], gc_lines=self.gc_lines())
        else:
            text += DOCKERSPAWNER_CONFIG.format(responder_port=self.responder_port)
        return text

    def gc_lines(self) -> str:
        """The config lines of the collector's settings: the thresholds through
        ``gpuspawner.hub.collector.set_hub_gc_threshold`` as ``wire_hub`` sets them (this
        benchmark's hub has no services, so it does not call ``wire_hub``), or
        ``--gc-freeze``'s lines; none for Python's defaults."""
        if self.gc_freeze:
            return ("from jupyterhub.app import JupyterHub as _JupyterHub\n"
                    "from benchmarks.loop_probe import freeze_after_start as _freeze\n"
                    f"_freeze(_JupyterHub.instance(), {self.gc_threshold!r})\n")
        if self.gc_threshold is None:
            return ""
        return ("from gpuspawner.hub.collector import set_hub_gc_threshold as _gc_threshold\n"
                f"_gc_threshold({self.gc_threshold!r})\n")

    async def start(self, session: aiohttp.ClientSession, clock: Clock) -> None:
        """Start the hub and wait until its API answers through the proxy. Raises
        RuntimeError (the hub exited, with its log's tail) or TimeLimit."""
        cfg = self.folder / "jupyterhub_config.py"
        cfg.write_text(self.config())
        self.process = Process([sys.executable, "-m", "jupyterhub", "-f", str(cfg)],
                               self.folder, self.folder / "hub.log", child_env())
        while True:
            clock.left(f"{self.side}: hub start")
            if self.process.proc.poll() is not None:
                raise RuntimeError(f"{self.side} hub exited with "
                                   f"{self.process.proc.returncode}:\n{self.process.tail()}")
            try:
                async with session.get(f"{self.url}/hub/api/",
                                       timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def rss_mib(self) -> float | None:
        """The hub process's resident memory (MiB), from /proc; None where unreadable."""
        if self.process is None:
            return None
        try:
            for line in Path(f"/proc/{self.process.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.admin_token}"}

    async def loop_report(self, phase: str) -> dict[str, Any]:
        """The hub's loop probe (benchmarks/loop_probe.py) since the last report, kept under
        ``phase`` in :attr:`loop`; a new window starts. Raises TimeoutError (no report)."""
        assert self.process is not None
        self._reports += 1
        report = await loop_probe.read_report(self.process.proc.pid, self.folder,
                                              self._reports)
        self.loop[phase] = report
        return report


# -- phases ----------------------------------------------------------------------------------
async def api(session: aiohttp.ClientSession, hub: Hub, method: str, path: str,
              body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
    """One hub API call through the proxy; the JSON answer. Raises RuntimeError on another
    status."""
    async with session.request(method, f"{hub.url}/hub/api{path}", headers=hub.headers(),
                               data=None if body is None else json.dumps(body)) as r:
        text = await r.text()
        if r.status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {r.status} {text[:300]}")
        return json.loads(text) if text else None


async def make_users(session: aiohttp.ClientSession, hub: Hub, names: list[str]) -> None:
    for i in range(0, len(names), 200):
        await api(session, hub, "POST", "/users", {"usernames": names[i:i + 200]},
                  ok=(201, 409))
    for g in range(10):  # groups for the culler's group policies
        await api(session, hub, "POST", f"/groups/g{g}", ok=(201, 409))
        await api(session, hub, "POST", f"/groups/g{g}/users", {"users": names[g::10]})


async def spawn_one(session: aiohttp.ClientSession, hub: Hub, name: str,
                    body: dict[str, Any]) -> float:
    """POST the user's server and wait until it is ready; seconds. Raises RuntimeError when
    the spawn is refused or fails."""
    t0 = time.perf_counter()
    async with session.post(f"{hub.url}/hub/api/users/{name}/server", headers=hub.headers(),
                            data=json.dumps(body)) as r:
        if r.status not in (201, 202):
            raise RuntimeError(f"spawn of {name}: HTTP {r.status} {(await r.text())[:300]}")
        pending = r.status == 202
    delay = 0.05
    while pending:
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)
        model = await api(session, hub, "GET", f"/users/{name}")
        server = (model.get("servers") or {}).get("")
        if server is None:
            raise RuntimeError(f"spawn of {name} failed (server gone)")
        pending = not server.get("ready")
    return time.perf_counter() - t0


async def spawn_all(session: aiohttp.ClientSession, hub: Hub, names: list[str],
                    body: dict[str, Any], concurrency: int, clock: Clock
                    ) -> tuple[list[float], float]:
    """Spawn every name's server, ``concurrency`` at a time. Returns (seconds per spawn,
    wall seconds of the phase). Raises RuntimeError (a failed spawn) or TimeLimit."""
    sem = asyncio.Semaphore(concurrency)

    async def one(name: str) -> float:
        async with sem:
            return await spawn_one(session, hub, name, body)

    t0 = time.perf_counter()
    times = await clock.bound(f"{hub.side}: spawn",
                              asyncio.gather(*(one(n) for n in names)))
    return list(times), time.perf_counter() - t0


async def count_ready(session: aiohttp.ClientSession, hub: Hub) -> int:
    """Servers the hub says are ready (paged through the whole user list)."""
    ready, offset = 0, 0
    while True:
        async with session.get(f"{hub.url}/hub/api/users",
                               params={"state": "ready", "offset": offset, "limit": 200},
                               headers={**hub.headers(), "Accept":
                                        "application/jupyterhub-pagination+json"}) as r:
            page = await r.json()
        ready += len(page["items"])
        if not page["_pagination"]["next"]:
            return ready
        offset += 200


async def latency(session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int,
                  clock: Clock, phase: str) -> list[float]:
    """``n`` sequential GETs of ``url`` (one warm-up first); milliseconds each. Raises
    RuntimeError on a status other than 200, or TimeLimit."""
    out: list[float] = []
    for i in range(n + 1):
        clock.left(phase)
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {url}: HTTP {r.status} {(await r.text())[:200]}")
        if i:
            out.append((time.perf_counter() - t0) * 1000)
    return out


async def rest_phase(session: aiohttp.ClientSession, hub: Hub, n: int, clock: Clock
                     ) -> dict[str, list[float]]:
    """Each endpoint's GETs (milliseconds), by key; the hub's loop report of each endpoint's
    GETs is kept in ``hub.loop`` under the same key."""
    h = hub.headers()
    hub_api = f"{hub.url}/hub/api"
    phase = f"{hub.side}: REST"
    svc = f"{hub.url}/services/gpuspawner"
    urls = {"hub users page": f"{hub_api}/users?state=ready&limit=200"}
    if hub.side == "gpuspawner":
        urls.update({"all servers": f"{svc}/api/allocations",
                     "service nodes": f"{svc}/api/nodes",
                     "service queue": f"{svc}/api/queue",
                     "service usage": f"{svc}/api/users/u00000/usage",
                     "service map": f"{svc}/admin",
                     "service metrics": f"{svc}/metrics"})
    else:
        urls["all servers"] = f"{hub_api}/users?state=ready&limit={hub.servers}"
    out = {}
    for key, url in urls.items():
        out[key] = await latency(session, url, h, n, clock, phase)
        await clock.bound(phase, hub.loop_report(key))
    return out


async def gpu_uuids(session: aiohttp.ClientSession, hub: Hub) -> list[str]:
    """GPU UUIDs of every allocation (gpuspawner's service); [] on the other side."""
    if hub.side != "gpuspawner":
        return []
    async with session.get(f"{hub.url}/services/gpuspawner/api/allocations",
                           headers=hub.headers()) as r:
        allocs = await r.json()
    return sorted({g["uuid"] for a in allocs for g in a.get("gpus", [])})


async def culler_phase(hub: Hub, names: list[str], uuids: list[str], repeat: int,
                       clock: Clock) -> dict[str, list[float]]:
    """``repeat`` alternating passes of idle_culler and jupyterhub-idle-culler; seconds each.
    Raises AssertionError when a pass does not see every server or culls one."""
    history = GPUHistory()
    now = time.time()
    for u in uuids:  # within the last second: after every server started (the culler counts
        for k in range(60):  # no sample from before a server's start)
            history.add(u, 40.0, now - 1 + k / 60)
    policies = PolicySet({
        "global": {"idle_timeout": "1d", "gpu_idle_threshold": 5, "gpu_window": "10m",
                   "warning": "10m", "max_age": "7d"},
        "groups": {f"g{g}": {"idle_timeout": f"{g + 1}d"} for g in range(5)},
        "users": {n: {"exempt": True} for n in names[::97]},
    })
    client = HubClient(hub.api_url, hub.ours_token, concurrency=10)
    ours = Culler(client, policies, history=history, page_size=200)
    ref_log = logging.getLogger("reference-culler")
    ref_log.setLevel(logging.WARNING)
    out: dict[str, list[float]] = {"idle_culler": [], "jupyterhub-idle-culler": []}
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            ds = await clock.bound(f"{hub.side}: culler", ours.run_pass())
            out["idle_culler"].append(time.perf_counter() - t0)
            assert len(ds) == len(names), (len(ds), ours.last_pass)
            assert not any(d.action == "cull" for d in ds)
            if uuids:  # the GPU signal read GPUSpawner's state and the history
                assert any(d.figures.get("gpu_mean_percent") == 40.0 for d in ds)
            t0 = time.perf_counter()
            await clock.bound(f"{hub.side}: culler", cull_idle(
                hub.api_url, hub.ref_token, inactive_limit=86400, logger=ref_log,
                concurrency=10, api_page_size=200))
            out["jupyterhub-idle-culler"].append(time.perf_counter() - t0)
    finally:
        client.close()
    return out


@dataclass
class SideResult:
    """What one side measured (seconds for spawns and culler passes, ms for REST)."""

    spawn: list[float]
    spawn_wall: float
    rest: dict[str, list[float]]
    culler: dict[str, list[float]]
    rss_mib: float | None
    #: the hub loop's report per phase (benchmarks/loop_probe.py; ms)
    loop: dict[str, dict[str, Any]] = field(default_factory=dict)


async def run_side(side: str, folder: Path, responder_port: int, args: argparse.Namespace,
                   clock: Clock) -> SideResult:
    folder.mkdir()
    hub = Hub(side, folder, args.servers, responder_port,
              gc_freeze=args.gc_freeze and side == "gpuspawner",
              gc_threshold=gc_threshold_of(args) if side == "gpuspawner" else None)
    names = [f"u{i:05d}" for i in range(args.servers)]
    # the same body on both sides (DockerSpawner ignores the key): JupyterHub's User.spawn
    # stores a request's user_options with a database commit only when a body is sent
    body = {"profile": PROFILE["slug"]}
    conn = aiohttp.TCPConnector(limit=args.concurrency + 4)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()

        def done(what: str) -> None:
            print(f"  {side}: {what} ({time.perf_counter() - t0:.1f} s)", flush=True)

        try:
            await hub.start(session, clock)
            done("hub up")
            await clock.bound(f"{side}: users", make_users(session, hub, names))
            done(f"{len(names)} users made")
            await clock.bound(f"{side}: loop", hub.loop_report("start"))
            times, wall = await spawn_all(session, hub, names, body, args.concurrency, clock)
            await clock.bound(f"{side}: loop", hub.loop_report("spawn"))
            ready = await clock.bound(f"{side}: count", count_ready(session, hub))
            if ready != args.servers:
                raise RuntimeError(f"{side}: {ready} of {args.servers} servers ready")
            done(f"{ready} servers spawned and ready")
            rss = hub.rss_mib()
            await clock.bound(f"{side}: loop", hub.loop_report("count"))
            rest = await rest_phase(session, hub, args.requests, clock)
            done("REST measured")
            uuids = await clock.bound(f"{side}: allocations", gpu_uuids(session, hub))
            await clock.bound(f"{side}: loop", hub.loop_report("allocations"))
            culler = await culler_phase(hub, names, uuids, args.culler_repeat, clock)
            await clock.bound(f"{side}: loop", hub.loop_report("culler"))
            done("culler passes measured")
        except BaseException:
            if hub.process is not None:
                print(f"--- {side} hub log (tail) ---\n{hub.process.tail()}", file=sys.stderr)
            raise
        finally:
            hub.stop()
            done("hub stopped")
            if args.log_dir is not None:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(folder / "hub.log", args.log_dir / f"{side}-hub.log")
    return SideResult(times, wall, rest, culler, rss, hub.loop)


# -- report ----------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def report(results: dict[str, SideResult], args: argparse.Namespace) -> list[str]:
    """The side-by-side table, as lines."""
    ours, ref = results["gpuspawner"], results["dockerspawner"]
    w = 52
    lines = [f"{'':<{w}} {'gpuspawner':>17} {'dockerspawner':>17}"]

    def row(label: str, a: str, b: str) -> None:
        lines.append(f"{label:<{w}} {a:>17} {b:>17}")

    def ms(xs: list[float]) -> str:
        return f"{pct(xs, .5):.1f} / {pct(xs, .99):.1f}"

    row(f"spawn: servers/s ({args.servers}, {args.concurrency} at a time)",
        f"{len(ours.spawn) / ours.spawn_wall:.1f}", f"{len(ref.spawn) / ref.spawn_wall:.1f}")
    row("spawn: wall time of all, s", f"{ours.spawn_wall:.1f}", f"{ref.spawn_wall:.1f}")
    row("spawn: p50 / p99 per server, ms", ms([t * 1000 for t in ours.spawn]),
        ms([t * 1000 for t in ref.spawn]))
    def per_spawn(result: SideResult) -> str:
        r = result.loop.get("spawn") or {}
        n = max(1, len(result.spawn))
        db = sum(v for k, v in r.get("commits", {}).items() if k.startswith("jupyterhub"))
        spawns = sum(v for k, v in r.get("requests", {}).items()
                     if k == "UserServerAPIHandler")
        return f"{db / n:.2f} / {spawns / n:.2f}"

    row("hub per spawn: commits to its database / spawn POSTs", per_spawn(ours),
        per_spawn(ref))
    row("hub RSS after the spawns, MiB", f"{ours.rss_mib or 0:.0f}", f"{ref.rss_mib or 0:.0f}")
    row(f"REST p50 / p99 ms, {args.requests} GETs each:", "", "")
    row("  hub /hub/api/users?state=ready (200 per page)", ms(ours.rest["hub users page"]),
        ms(ref.rest["hub users page"]))
    row(f"  all {args.servers} servers, one request (*)", ms(ours.rest["all servers"]),
        ms(ref.rest["all servers"]))
    for key, path in (("service nodes", "api/nodes"), ("service queue", "api/queue"),
                      ("service usage", "api/users/{name}/usage"),
                      ("service map", "admin (GPU map page)"),
                      ("service metrics", "metrics (Prometheus)")):
        row(f"  gpuspawner service {path}", ms(ours.rest[key]), "n/a")
    row(f"culler pass over {args.servers} servers, s (median of {args.culler_repeat}):",
        "", "")
    for key in ("idle_culler", "jupyterhub-idle-culler"):
        row(f"  {key}", f"{statistics.median(ours.culler[key]):.3f}",
            f"{statistics.median(ref.culler[key]):.3f}")
    row("hub loop: longest callback ms (callbacks > 20 ms) full GCs:", "", "")

    def stall(result: SideResult, phase: str) -> str:
        r = result.loop.get(phase)
        if r is None:
            return "n/a"
        full = r.get("gc", {}).get("count", [0, 0, 0])[2]
        return f"{r['max_ms']:.1f} ({r['over_ms']['20']}) {full}"

    for phase, label in (("spawn", "  during the spawns"),
                         ("hub users page", "  hub users page GETs"),
                         ("all servers", "  all servers GETs (*)"),
                         ("service nodes", "  service api/nodes GETs"),
                         ("service queue", "  service api/queue GETs"),
                         ("service usage", "  service api/users/{name}/usage GETs"),
                         ("service map", "  service admin page GETs"),
                         ("service metrics", "  service metrics GETs"),
                         ("culler", "  culler passes")):
        row(label, stall(ours, phase), stall(ref, phase))

    def worst(result: SideResult) -> str:  # every window after the users were made
        ms = [r["max_ms"] for p, r in result.loop.items() if p != "start"]
        return f"{max(ms, default=0):.1f}"

    row("  longest of all, after start (goal <= 20 ms)", worst(ours), worst(ref))

    def full_gc(result: SideResult) -> str:  # generation 2, every window after start
        windows = [r["gc"] for p, r in result.loop.items() if p != "start" and "gc" in r]
        if not windows:
            return "n/a"
        return (f"{sum(w['count'][2] for w in windows)}, "
                f"{max(w['max_ms'][2] for w in windows):.0f} ms")

    row("hub full garbage collections after start, longest", full_gc(ours), full_gc(ref))
    ends = [(r.loop.get("culler") or {}).get("gc", {}) for r in (ours, ref)]
    row("hub objects tracked by the collector, at the end",
        *(f"{e['objects'] / 1e6:.2f} M"
          + (f" +{e['frozen'] / 1e6:.2f} M frozen" if e.get("frozen") else "")
          if e.get("objects") else "n/a" for e in ends))
    lines.append("(*) gpuspawner: service api/allocations (every allocation with its devices);"
                 " dockerspawner: hub /hub/api/users?state=ready&limit=N (no resources)")
    for side, result in (("gpuspawner", ours), ("dockerspawner", ref)):
        for phase in ("spawn", "service map", "all servers", "hub users page", "culler"):
            r = result.loop.get(phase)
            for ms, what in (r or {}).get("longest", [])[:args.show_callbacks]:
                lines.append(f"  {side} loop, {phase}: {ms:.1f} ms {what}")
    return lines


async def run(args: argparse.Namespace) -> int:
    # SIGTERM cancels the run as Ctrl-C does (asyncio.run's own SIGINT handling): every
    # finally below runs on the loop (hubs, proxies, responder, temporary folder)
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    clock = Clock(time.monotonic() + args.time_limit)
    load_before = os.getloadavg()[0]
    results: dict[str, SideResult] = {}
    with tempfile.TemporaryDirectory(prefix="hub-scale-") as tmp:
        folder = Path(tmp)
        responder, port = start_responder(folder, clock)
        try:
            for side in SIDES:
                results[side] = await run_side(side, folder / side, port, args, clock)
        finally:
            responder.stop(5)
    print(f"hub_scale: {args.servers} servers per side, fake engine (no Docker), "
          f"JupyterHub {jupyterhub.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before / "
          f"{os.getloadavg()[0]:.1f} after")
    ours = gc_threshold_of(args)
    print(f"collector thresholds: gpuspawner's hub {ours or 'Python defaults'}"
          f"{' (as wire_hub sets them)' if ours == HUB_GC_THRESHOLD else ''}"
          f"{', gc.freeze() after start' if args.gc_freeze else ''}; "
          f"dockerspawner's hub Python defaults {gc.get_threshold()}")
    for line in report(results, args):
        print(line)
    return 0


def gc_threshold_of(args: argparse.Namespace) -> tuple[int, int, int] | None:
    """gpuspawner's hub's collector thresholds: ``--gc-threshold``, else None with
    ``--gc-python``, else what ``wire_hub`` sets (:data:`HUB_GC_THRESHOLD`)."""
    if args.gc_threshold is not None:
        return args.gc_threshold
    return None if args.gc_python else HUB_GC_THRESHOLD


def threshold_arg(text: str) -> tuple[int, int, int]:
    """``--gc-threshold``'s value: three integers, comma-separated, checked as the hub checks
    them (:func:`gpuspawner.hub.collector.check_gc_threshold`: each >= 1), so that a value
    the hub's configuration would refuse is refused here, before any hub starts."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("three integers, e.g. 50000,20,100") from None
    try:
        return check_gc_threshold(values, "--gc-threshold")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=1000, help="servers per side")
    ap.add_argument("--concurrency", type=int, default=10, help="spawns at a time")
    ap.add_argument("--requests", type=int, default=100, help="GETs per REST endpoint")
    ap.add_argument("--culler-repeat", type=int, default=3, help="passes per culler")
    ap.add_argument("--time-limit", type=float, default=900.0,
                    help="seconds for the whole run (exit 2 when exceeded)")
    ap.add_argument("--show-callbacks", type=int, default=2,
                    help="the longest hub loop callbacks shown per side and phase")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gpuspawner's hub: gc.collect() and gc.freeze() once it has started")
    ap.add_argument("--gc-threshold", type=threshold_arg, default=None, metavar="G0,G1,G2",
                    help="gpuspawner's hub: gc.set_threshold(G0, G1, G2) instead of what "
                    "wire_hub sets (after the freeze with --gc-freeze)")
    ap.add_argument("--gc-python", action="store_true",
                    help="gpuspawner's hub: Python's collector thresholds, as DockerSpawner's "
                    "hub (the hub before gpuspawner.hub.collector)")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="copy each side's hub log here (the temporary folder goes)")
    args = ap.parse_args(argv)
    if args.servers < 1 or args.concurrency < 1 or args.requests < 1 or args.culler_repeat < 1:
        ap.error("--servers, --concurrency, --requests and --culler-repeat must be >= 1")
    if not CHP.exists():
        print(f"configurable-http-proxy not found at {CHP} (make chp)", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING)
    try:
        return asyncio.run(run(args))
    except TimeLimit as e:
        print(f"hub_scale: {e} (--time-limit {args.time_limit:g} s)", file=sys.stderr)
        return 2
    except asyncio.CancelledError:  # SIGTERM, after the clean-up
        print("hub_scale: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
