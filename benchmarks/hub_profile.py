"""Where the gpuspawner hub's main thread spends a spawn, at a given number of servers: the hub of
``benchmarks/hub_scale.py`` (gpuspawner's side only, the same configuration, fake engine,
configurable-http-proxy) spawns N servers, 10 at a time, and py-spy records the hub's main
thread during chosen windows of spawns (``--windows 750:1000,2250:2500``: the spawns 2,251 to
2,500, with 2,250 servers already running and the cluster sized for N).

Per window it prints the spawn rate, the hub's CPU seconds per spawn (``/proc``), and the
share of the main thread's samples (and milliseconds of them per spawn) of each cause:
JupyterHub's SQLite commits, its token hashing, its count of active users, its poll of every
server, and gpuspawner's own code (the spawner's construction, the pre-spawn hook, the usage
record). py-spy samples the thread while it is not idle: a commit waiting for its fsync counts,
so on a loaded machine the milliseconds are wall time, not CPU time; compare the shares and the
windows of one run.

``--in-process 1000,2500,5000``: no hub, no py-spy; gpuspawner's own per-spawn work in this
process at each size (hub_scale's nodes and profile, the cluster the hub's start builds, usage
records on, N - 300 servers booked first): CPU ms per spawn of ``GPUSpawner()``, the pre-spawn
hook (queue, ``Ledger.reserve``, ``UsageStore.open``), the launch (spec and fake backend),
``get_state`` and one ``poll``, over the last 300 spawns; with the hub start's shared
``nodes`` and, on a second line, without (a spawner's own deep copy, as before).

Usage: ``.venv/bin/python benchmarks/hub_profile.py [--servers 2500]
[--windows 750:1000,2250:2500] [--out DIR] [--py-spy PATH]``; needs py-spy
(``pip install py-spy``) and ``make chp``; ``--analyse FILE...`` prints the table of raw
recordings made before; ``--in-process SIZES``. Bounded by ``--time-limit`` (seconds, whole
run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import yaml
from jupyterhub.app import JupyterHub
from traitlets.config import Config

from gpuspawner.backends.spec import launch_spec
from gpuspawner.hub import config_check, runtime
from gpuspawner.hub.cluster import reset_clusters
from gpuspawner.hub.spawner import GPUSpawner

try:
    from benchmarks import hub_scale
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    import hub_scale  # type: ignore[no-redef]

#: (label, test of a raw stack line) of each cause, in the table's order
CAUSES: list[tuple[str, Callable[[str], bool]]] = [
    ("JupyterHub's SQLite commits (do_commit)", lambda s: "do_commit" in s),
    ("JupyterHub's token hashing (hash_token)", lambda s: "hash_token" in s),
    ("JupyterHub's count of active users", lambda s: "count_active_users" in s),
    ("JupyterHub's poll of every server", lambda s: "poll_and_notify" in s),
    ("gpuspawner, all its code", lambda s: "gpuspawner/" in s or "fake_backend" in s),
    ("  of which GPUSpawner() (the spawner's construction)",
     lambda s: "GPUSpawner.__init__" in s),
    ("  of which the pre-spawn hook (queue, placement, usage)",
     lambda s: "run_pre_spawn_hook" in s),
    ("  of which the usage record (UsageStore.open)", lambda s: "UsageStore.open" in s),
]


def analyse(path: Path, spawns: int) -> list[str]:
    """The table of one py-spy ``--format raw --threads`` recording of ``spawns`` spawns:
    each cause's share of the main thread's samples and its milliseconds per spawn (a sample
    is 10 ms at ``-r 100``). Raises OSError (no file), ValueError (not a raw recording)."""
    total, counts = 0, [0] * len(CAUSES)
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or "MainThread" not in frames[0] + frames[1]:
            continue
        total += int(n)
        for i, (_, test) in enumerate(CAUSES):
            if test(stack):
                counts[i] += int(n)
    out = [f"  main-thread samples {total} ({total / max(spawns, 1):.1f} a spawn)"]
    for (label, _), n in zip(CAUSES, counts, strict=True):
        out.append(f"  {label:58s} {100 * n / max(total, 1):5.1f} % "
                   f"{10 * n / max(spawns, 1):7.1f} ms a spawn")
    return out


def hub_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> int:
    clock = hub_scale.Clock(time.monotonic() + args.time_limit)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    with tempfile.TemporaryDirectory(prefix="hub-profile-") as tmp:
        folder = Path(tmp)
        responder, port = hub_scale.start_responder(folder, clock)
        hub = hub_scale.Hub("gpuspawner", folder / "gpuspawner", args.servers, port)
        hub.folder.mkdir()
        names = [f"u{i:05d}" for i in range(args.servers)]
        body = {"profile": hub_scale.PROFILE["slug"]}
        conn = aiohttp.TCPConnector(limit=args.concurrency + 4)
        try:
            async with aiohttp.ClientSession(
                    connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
                await hub.start(session, clock)
                await clock.bound("users", hub_scale.make_users(session, hub, names))
                assert hub.process is not None
                pid = hub.process.proc.pid
                done = 0
                for lo, hi in windows:
                    if lo > done:
                        await hub_scale.spawn_all(session, hub, names[done:lo], body,
                                                  args.concurrency, clock)
                    raw = out / f"pyspy_{lo}_{hi}.txt"
                    spy = subprocess.Popen(
                        [args.py_spy, "record", "--nonblocking", "-r", "100", "--format",
                         "raw", "--threads", "-o", str(raw), "-p", str(pid)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    await asyncio.sleep(1.0)  # (py-spy attached)
                    cpu0 = hub_cpu_s(pid)
                    times, wall = await hub_scale.spawn_all(session, hub, names[lo:hi], body,
                                                            args.concurrency, clock)
                    cpu = hub_cpu_s(pid) - cpu0
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                    n = hi - lo
                    print(f"spawns {lo + 1}-{hi} of {args.servers}: {n / wall:.1f} servers/s, "
                          f"hub CPU {1000 * cpu / n:.1f} ms a spawn, p50 "
                          f"{1000 * hub_scale.pct(times, .5):.0f} ms, load average "
                          f"{os.getloadavg()[0]:.1f}", flush=True)
                    for line in analyse(raw, n):
                        print(line, flush=True)
                    done = hi
        finally:
            hub.stop()
            responder.stop(5)
    return 0


class _User:
    """What GPUSpawner reads of JupyterHub's user outside a hub."""

    def __init__(self, name: str) -> None:
        self.name, self.groups, self.db, self.settings = name, [], None, {}
        self.url = f"/user/{name}/"


def _config(folder: Path, servers: int) -> Config:
    """hub_scale's gpuspawner settings for ``servers`` (one node per 24), files in ``folder``."""
    c = Config()
    topo = folder / "topology"
    topo.mkdir()
    nodes = []
    for i in range(max(1, -(-servers // hub_scale.SERVERS_PER_NODE))):
        node = hub_scale.fake_node(i)
        path = topo / f"{node['name']}.yaml"
        path.write_text(yaml.safe_dump(node))
        nodes.append({"name": node["name"], "topology": str(path)})
    (folder / "state").mkdir(mode=0o700)
    c.JupyterHub.db_url = f"sqlite:///{folder}/jupyterhub.sqlite"
    c.GPUSpawner.backend = "benchmarks.fake_backend.FakeBackend"
    c.FakeBackend.responder_port = 1  # (never reached: no readiness check here)
    c.GPUSpawner.state_dir = str(folder / "state")
    c.GPUSpawner.nodes = nodes
    c.GPUSpawner.profiles = [hub_scale.PROFILE]
    c.GPUSpawner.placement_policy = "fgd"
    return c


async def _spawn(c: Config, name: str, t: dict[str, float] | None = None) -> GPUSpawner:
    """One spawn of ``name`` up to the backend (no readiness check); CPU seconds of each step
    added to ``t``."""
    clock = time.process_time
    t0 = clock()
    s = GPUSpawner(config=c, user=_User(name), _log_name=name)
    s.user_options = {"profile": hub_scale.PROFILE["slug"]}
    t1 = clock()
    await s.run_pre_spawn_hook()
    t2 = clock()
    assert s._prepared is not None
    profile, alloc = s._prepared
    spec = launch_spec(name=s.object_name, user=name, server="", allocation=alloc, image="x",
                       cmd=list(s.cmd), env={}, uid=1000, gid=100, port=s.port, home=None,
                       certs_dir="", mounts=s.mounts(profile), helper_image="x")
    await s.backend_obj.launch(spec, s.backend_state, s._emit)
    s._prepared = None
    t3 = clock()
    s.get_state()
    t4 = clock()
    if t is not None:
        for key, dt in (("GPUSpawner()", t1 - t0), ("pre-spawn hook", t2 - t1),
                        ("launch", t3 - t2), ("get_state", t4 - t3)):
            t[key] = t.get(key, 0.0) + dt
    return s


async def in_process(sizes: list[int], shared: bool, k: int = 300) -> list[str]:
    """``--in-process``'s lines, one per size. ``shared``: the hub start's shared ``nodes``
    (:func:`~gpuspawner.hub.config_check.share_checked_settings`)."""
    lines = []
    app = JupyterHub.instance()
    app.log.setLevel("WARN")
    for n in sizes:
        reset_clusters()
        with tempfile.TemporaryDirectory(prefix="hub-profile-") as tmp:
            c = _config(Path(tmp), n)
            cluster = config_check._check_and_build(c, usage=True)
            if shared:
                config_check.share_checked_settings(c)
            runtime.attach(app, cluster)
            running = [await _spawn(c, f"u{i:05d}") for i in range(n - k)]
            t: dict[str, float] = {}
            for i in range(n - k, n):
                await _spawn(c, f"u{i:05d}", t)
                t0 = time.process_time()
                await running[i % len(running)].poll()
                t["poll"] = t.get("poll", 0.0) + time.process_time() - t0
            lines.append(f"  {n} servers, {len(cluster.nodes)} nodes, "
                         f"{'shared' if shared else 'own copy'}: "
                         + ", ".join(f"{key} {1000 * v / k:.3f}" for key, v in t.items()))
            cluster.usage.store.engine.dispose()
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=2500)
    ap.add_argument("--windows", default="750:1000,2250:2500",
                    help="spawns recorded, LO:HI[,LO:HI...] (servers already running: LO)")
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=2400.0)
    ap.add_argument("--out", type=Path, default=Path("hub-profile"),
                    help="folder of py-spy's raw recordings")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    ap.add_argument("--analyse", type=Path, nargs="*", default=None,
                    help="print the table of raw recordings (named pyspy_LO_HI.txt)")
    ap.add_argument("--in-process", default=None, metavar="SIZES",
                    help="gpuspawner's per-spawn CPU ms in this process at these sizes")
    args = ap.parse_args(argv)
    if args.in_process:
        sizes = [int(x) for x in args.in_process.split(",")]
        print("gpuspawner's own work per spawn, CPU ms (last 300 spawns of each size):")
        for shared in (True, False):
            for line in asyncio.run(in_process(sizes, shared)):
                print(line, flush=True)
        return 0
    if args.analyse is not None:
        for path in args.analyse:
            lo, hi = (int(x) for x in path.stem.split("_")[-2:])
            print(f"{path}: spawns {lo + 1}-{hi}")
            for line in analyse(path, hi - lo):
                print(line)
        return 0
    try:
        return asyncio.run(run(args))
    except hub_scale.TimeLimit as e:
        print(f"hub_profile: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
