"""Spawn to ready, the Docker backend against the Slurm backend, same profile, same run.

Both hubs run GPUSpawner with the real ``jupyterhub-singleuser`` and the profile "1 core,
512 MiB" (no GPU: the Docker node of this machine has none; the Slurm nodes' GPUs are fake
device files). Docker: a new container on its own bridge network (``make engine images``).
Slurm: a batch job on the private three-node cluster of ``scripts/slurm.sh`` (``make slurm``),
running as the job user, which picks its port and reports it through the job's Comment.
Goal: Slurm within 2x of Docker (medians).

Run: ``.venv/bin/python benchmarks/spawn_backends.py [--n 5]``. Bounded: ``--n`` sequential
spawns per backend, each with a 120 s limit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuspawner.testing.hubrunner import Hub, HubProcess  # noqa: E402
from gpuspawner.testing.slurm_hub import USER, SlurmHub  # noqa: E402

PROFILE = {"slug": "cpu", "display_name": "1 core", "cpu": 1, "memory": "512M",
           "default": True}


def spawn_times(hub: HubProcess, user: str, n: int) -> list[float]:
    """``n`` sequential REST spawns of ``user``'s server, seconds from the POST to ready."""
    out = []
    hub.ensure_user(user)
    for _ in range(n):
        t0 = time.perf_counter()
        r = hub.api("POST", f"/users/{user}/server", {"profile": "cpu"}, timeout=120)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"spawn failed: {r.status_code} {r.text[:300]}")
        hub.wait_ready(user, timeout=120)
        out.append(time.perf_counter() - t0)
        hub.api("DELETE", f"/users/{user}/server")
        hub.wait_stopped(user, timeout=60)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="sequential spawns per backend")
    args = ap.parse_args()
    conf = os.environ.get("SLURM_CONF") or str(REPO / "var/slurm/etc/slurm.conf")
    if not Path(conf).exists():
        print(f"no Slurm cluster ({conf}): make slurm", file=sys.stderr)
        return 2
    site = (Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
            / "site-packages")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        docker = Hub(Path(tmp) / "docker", [{"name": "local", "topology": "auto"}], [PROFILE])
        docker.start()
        try:
            results["docker"] = spawn_times(docker, "benchdocker", args.n)
        finally:
            docker.stop()
        (Path(tmp) / "slurm").mkdir()
        slurm = SlurmHub(Path(tmp) / "slurm", conf,
                         cmd=["/usr/bin/python3", "-m", "jupyterhub.singleuser"],
                         environment={"PYTHONPATH": str(site)},
                         profiles=[dict(PROFILE, nodes=["node1"])])
        slurm.start()
        try:
            results["slurm"] = spawn_times(slurm, USER, args.n)
        finally:
            slurm.stop()
            shutil.rmtree(slurm.home, ignore_errors=True)
    print(f"{'backend':<8} {'n':>3} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, xs in results.items():
        print(f"{name:<8} {len(xs):>3} {statistics.median(xs):>9.2f} {min(xs):>7.2f} "
              f"{max(xs):>7.2f}")
    ratio = statistics.median(results["slurm"]) / statistics.median(results["docker"])
    print(f"ratio slurm/docker (medians): {ratio:.2f} (goal: at most 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
