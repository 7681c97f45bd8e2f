"""Spawn time with a user's own image (``image--unlisted-choice``) against the profile's own
image, on the real Docker engine, in one run.

Each spawn is a GPUSpawner outside a hub (as the spawner tests make it) starting a stand-in
server that answers like Jupyter, then stopped; times are from ``start()`` until the server
answers. Three columns: the profile's image; a user's image the first time (its check runs:
``jupyterhub-singleuser --version`` in a throwaway container); the same image again (the
check is cached per digest and node, so only the reference is parsed). The user's image is
the single-user image under another tag, so the difference is the check alone.

With the project's registry running (``make registry``: ``scripts/registry.sh``, loopback) a
fourth column: the user's image pulled from that registry each time (the single-user image plus
a 64 MiB layer of its own, pushed once, removed from the engine before each spawn), so the time
is pull + check + spawn. ``--no-registry`` leaves it out.

    .venv/bin/python benchmarks/user_image.py --runs 5

Bounded: ``--runs`` spawns per column (default 5, at most 50), ``--time-limit`` seconds in all.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker
import yaml
from jupyterhub.objects import Hub
from traitlets.config import Config

from gpuspawner.hub.cluster import reset_clusters
from gpuspawner.hub.spawner import GPUSpawner
from gpuspawner.inventory.local import read_local_node
from gpuspawner.inventory.topology import node_to_dict
from gpuspawner.testing.fakes import FakeUser
from gpuspawner.testing.registry import (
    describe,
    drop_pushed_image,
    pulled_from,
    push_user_image,
    registry_address,
)

IMAGE = "gpuspawner/singleuser:latest"
USER_IMAGE = "gpuspawner/bench-user-image:1"
#: answers every GET like a Jupyter server (port 8888), as the spawner tests' stand-in
SERVER = ["python3", "-c", (
    "import http.server as h\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers()\n"
    "        self.wfile.write(b'{\"version\": \"0\"}')\n"
    "h.HTTPServer(('0.0.0.0', 8888), H).serve_forever()\n")]
PROFILES = [{"slug": "own", "cpu": 1, "memory": "256M", "profile_options": {
    "image": {"choices": {"default": {"display_name": "ours", "image": IMAGE,
                                      "default": True}},
              "unlisted_choice": {"enabled": True}}}}]


#: the project's registry on loopback, once main() found it (c.GPUSpawner.allowed_registries:
#: a loopback registry is refused unless listed)
ALLOWED: list[str] = []


def spawner(tmp: Path, user: str, options: dict) -> GPUSpawner:
    local = node_to_dict(read_local_node("bench"))
    local["gpus"] = []
    local.pop("links", None)
    topo = tmp / "bench.yaml"
    topo.write_text(yaml.safe_dump(local))
    cfg = Config()
    cfg.GPUSpawner.nodes = [{"name": "bench", "topology": str(topo)}]
    cfg.GPUSpawner.profiles = PROFILES
    cfg.GPUSpawner.cmd = SERVER
    cfg.GPUSpawner.state_dir = str(tmp / "state")
    cfg.GPUSpawner.allowed_registries = list(ALLOWED)
    sp = GPUSpawner(config=cfg, user=FakeUser(user), hub=Hub(), oauth_client_id=f"c-{user}",
                    api_token="bench-token")
    sp.user_options = options
    return sp


async def one(tmp: Path, user: str, options: dict) -> float:
    sp = spawner(tmp, user, options)
    t0 = time.perf_counter()
    await asyncio.wait_for(sp.start(), 120)
    took = time.perf_counter() - t0
    await sp.stop()
    return took


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=600)
    ap.add_argument("--no-registry", action="store_true",
                    help="leave out the column pulled from the project's registry")
    args = ap.parse_args(argv)
    runs = max(1, min(args.runs, 50))
    client = docker.APIClient(version="auto")
    client.tag(IMAGE, *USER_IMAGE.split(":"))
    deadline = time.monotonic() + args.time_limit
    cols: dict[str, list[float]] = {"profile's image": [], "user's image, first": [],
                                    "user's image, checked": []}
    address = None if args.no_registry else registry_address()
    if address:
        ALLOWED.append(address)
    pushed = None
    if address is not None:
        pushed = push_user_image(client, address, IMAGE)
        cols["user's image, pulled"] = []
        print(f"registry image: {describe(pushed)}", file=sys.stderr)
    elif not args.no_registry:
        print("no registry answers (make registry): no pulled column", file=sys.stderr)
    try:
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder)
            (tmp / "state").mkdir(mode=0o700)
            for i in range(runs):
                if time.monotonic() > deadline:
                    print("time limit reached", file=sys.stderr)
                    break
                reset_clusters()  # a fresh backend: the check's cache is empty again
                cols["profile's image"].append(await one(tmp, f"bench{i}a", {}))
                cols["user's image, first"].append(await one(
                    tmp, f"bench{i}b", {"image--unlisted-choice": USER_IMAGE}))
                cols["user's image, checked"].append(await one(
                    tmp, f"bench{i}c", {"image--unlisted-choice": USER_IMAGE}))
                if pushed is not None:
                    try:  # not on the engine: this spawn pulls it
                        client.remove_image(pushed.reference, force=True)
                    except docker.errors.ImageNotFound:
                        pass
                    cols["user's image, pulled"].append(await one(
                        tmp, f"bench{i}d", {"image--unlisted-choice": pushed.reference}))
                    if not pulled_from(client, pushed):
                        raise RuntimeError(f"{pushed.reference} was not pulled")
    finally:
        reset_clusters()
        client.remove_image(USER_IMAGE)
        if pushed is not None:
            drop_pushed_image(client, pushed)
    base = statistics.median(cols["profile's image"])
    print(f"spawn until the server answers, median of {len(cols[next(iter(cols))])} "
          f"(seconds; ratio to the profile's image)")
    for name, values in cols.items():
        med = statistics.median(values)
        print(f"  {name:24} {med:6.2f} s   x{med / base:4.2f}   "
              f"(min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
