"""One culling pass over a real hub with N users and servers (default 1,000): idle_culler vs
jupyterhub-idle-culler 2.x, on the same hub in the same run.

The hub is a real JupyterHub + configurable-http-proxy on loopback
(gpuspawner/testing/culler_hub.py) with a very cheap spawner (no process: every server is
answered by one HTTP server inside the hub, each carrying a 1-GPU allocation in its state).
Each culler gets its own least-privilege token (ours also reads server state and groups).
Both passes see the same servers, all active, so
neither culls anything and the hub is unchanged between repetitions; the passes alternate,
``--repeat`` times each, and the median is compared.

Our pass computes the extra signals: groups resolved against a policy file with group and
user entries, and the mean GPU utilisation over a 10-minute window of 60 samples per GPU
(in-memory history, as the NVML / dcgm-exporter sources fill it).

Usage: .venv/bin/python benchmarks/culler.py [--users 1000] [--repeat 3] [--page-size 200]
Bounded: every wait has a deadline (--deadline seconds for the whole run).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jupyterhub_idle_culler import cull_idle  # noqa: E402

from gpuspawner.testing.culler_hub import CullerHub, fake_gpu_uuid  # noqa: E402
from idle_culler.core import Culler  # noqa: E402
from idle_culler.gpu import GPUHistory  # noqa: E402
from idle_culler.hub import HubClient  # noqa: E402
from idle_culler.policies import PolicySet  # noqa: E402

OURS = "ours-" + "a" * 32
REF = "reference-" + "b" * 32
EXTRA = f"""
c.JupyterHub.services.append({{"name": "ours", "api_token": {OURS!r}}})
c.JupyterHub.services.append({{"name": "reference", "api_token": {REF!r}}})
c.JupyterHub.load_roles.append({{"name": "ours", "services": ["ours"], "scopes": [
    "list:users", "read:users:activity", "read:users:groups", "read:servers",
    "delete:servers", "admin:server_state"]}})
c.JupyterHub.load_roles.append({{"name": "reference", "services": ["reference"], "scopes": [
    "list:users", "read:users:activity", "read:servers", "delete:servers"]}})
c.JupyterHub.log_level = "WARN"
c.JupyterHub.api_page_max_limit = 500
"""


def populate(hub: CullerHub, n: int, deadline: float) -> None:
    names = [f"u{i:05d}" for i in range(n)]
    for i in range(0, n, 200):
        r = hub.api("POST", "/users", {"usernames": names[i:i + 200]}, timeout=120)
        assert r.status_code in (201, 409), r.text
    for g in range(10):
        members = names[g::10]
        hub.api("POST", f"/groups/g{g}")
        r = hub.api("POST", f"/groups/g{g}/users", {"users": members}, timeout=120)
        assert r.status_code == 200, r.text

    def spawn(name: str) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError("populate: deadline")
        hub.spawn(name)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(spawn, names))
    # wait until every server is ready
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("servers not ready before the deadline")
        ready = 0
        offset = 0
        while True:
            page = hub.session.get(
                f"{hub.api_url}/users", params={"state": "ready", "offset": offset,
                                                "limit": 500},
                headers={"Authorization": f"token {hub.token}",
                         "Accept": "application/jupyterhub-pagination+json"},
                timeout=60).json()
            ready += len(page["items"])
            if not page["_pagination"]["next"]:
                break
            offset += 500
        if ready >= n:
            break
        time.sleep(0.5)
    print(f"populated: {n} users, {n} servers ready in {time.perf_counter() - t0:.1f}s")


async def run(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.deadline
    with tempfile.TemporaryDirectory(prefix="culler-bench-") as d:
        hub = CullerHub(Path(d), spawner="gpuspawner.testing.culler_hub.CheapGPUSpawner",
                        extra_config=EXTRA)
        hub.start()
        try:
            populate(hub, args.users, deadline)
            history = GPUHistory()
            now = time.time()
            for i in range(args.users):  # samples after every server started: the culler
                u = fake_gpu_uuid(f"u{i:05d}", "")  # counts none from before a server's start
                for k in range(60):
                    history.add(u, 40.0, now - 1 + k / 60)
            policies = PolicySet({
                "global": {"idle_timeout": "1d", "gpu_idle_threshold": 5, "gpu_window": "10m",
                           "warning": "10m", "max_age": "7d"},
                "groups": {f"g{g}": {"idle_timeout": f"{g + 1}d"} for g in range(5)},
                "users": {f"u{i:05d}": {"exempt": True} for i in range(0, args.users, 97)},
            })
            client = HubClient(hub.api_url, OURS, concurrency=10)
            ours = Culler(client, policies, history=history, page_size=args.page_size)
            ref_log = logging.getLogger("reference")
            ref_log.setLevel(logging.WARNING)
            t_ours: list[float] = []
            t_ref: list[float] = []
            for _ in range(args.repeat):
                if time.monotonic() > deadline:
                    raise TimeoutError("benchmark: deadline")
                t0 = time.perf_counter()
                ds = await asyncio.wait_for(ours.run_pass(), args.deadline)
                t_ours.append(time.perf_counter() - t0)
                assert len(ds) == args.users, (len(ds), ours.last_pass)
                assert not any(d.action == "cull" for d in ds)
                assert sum(1 for d in ds if d.figures.get("gpu_mean_percent") == 40.0) > 0
                t0 = time.perf_counter()
                await asyncio.wait_for(cull_idle(
                    hub.api_url, REF, inactive_limit=86400, logger=ref_log, concurrency=10,
                    api_page_size=args.page_size), args.deadline)
                t_ref.append(time.perf_counter() - t0)
            client.close()
        finally:
            hub.stop()
    mo, mr = statistics.median(t_ours), statistics.median(t_ref)
    print(f"servers: {args.users}, page size: {args.page_size}, repeats: {args.repeat}")
    print(f"idle_culler pass:            median {mo:.3f}s  (all: "
          f"{', '.join(f'{t:.3f}' for t in t_ours)})")
    print(f"jupyterhub-idle-culler pass: median {mr:.3f}s  (all: "
          f"{', '.join(f'{t:.3f}' for t in t_ref)})")
    print(f"ratio ours/reference: {mo / mr:.2f}  (goal <= 1.00)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--page-size", type=int, default=200)
    ap.add_argument("--deadline", type=float, default=600.0, help="seconds for the whole run")
    args = ap.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
