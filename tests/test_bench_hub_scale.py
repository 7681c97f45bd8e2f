"""benchmarks/hub_scale.py at a tiny size: both hubs start, every phase runs, the table has both
columns and the run exits 0 (about 40 s on a 2-CPU machine: two hub starts dominate).

Also the fake engine's doubles on their own (no hub): FakeBackend's record of what runs and
FakeDockerClient's answers in docker-py's shapes; and the admin GPU map of a hub without
quotas, which the benchmark's hub is (the page answered 500 there before)."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from docker.errors import NotFound

from benchmarks.fake_backend import FakeBackend, FakeDockerClient
from benchmarks.hub_scale import CHP, fake_node
from gpuspawner.backends.base import NodeRuntime, ServerRef
from gpuspawner.backends.spec import launch_spec
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.service.views import map_view, page_templates
from gpuspawner.inventory.topology import node_from_dict
from gpuspawner.placement import Bundle, Ledger, Owner
from gpuspawner.webui import service_links

REPO = Path(__file__).resolve().parents[1]


def test_fake_backend_records_launch_poll_stop_and_restore_listing() -> None:
    backend = FakeBackend(responder_port=4242)
    backend.check_config()
    ledger = Ledger([node_from_dict(fake_node(0))])
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=1 << 30, gpu_milli=250), Owner("ann"))
    spec = launch_spec(name="jupyter-ann", user="ann", server="", allocation=alloc, image="i",
                       cmd=["x"], env={}, uid=1000, gid=100, port=8888)
    state: dict = {}

    async def scenario() -> None:
        assert await backend.launch(spec, state, lambda p, m: None) == ("127.0.0.1", 4242)
        assert await backend.poll(state) is None
        assert await backend.exit_report(state) is None
        [found] = await backend.list_managed()
        assert found.node == "fake-000" and alloc.id in found.allocation
        await backend.remove_server("fake-000", ServerRef("bob", "", "jupyter-bob"))
        assert await backend.poll(state) is None  # another owner's removal leaves it
        await backend.stop(state)
        assert await backend.poll(state) == 0
        assert "gone" in (await backend.exit_report(state) or "")
        assert await backend.list_managed() == []

    asyncio.run(scenario())


def test_fake_backend_without_responder_port_is_refused() -> None:
    with pytest.raises(ValueError, match="responder_port"):
        FakeBackend().check_config()


def test_fake_docker_client_answers_as_docker_py() -> None:
    c = FakeDockerClient("127.0.0.1", 4242)
    cid = c.create_container(name="jupyter-ann", image="i",
                             host_config=c.create_host_config(mem_limit="1G"))["Id"]
    assert c.inspect_container("jupyter-ann")["State"]["Running"] is False
    c.start(cid)
    assert c.inspect_container(cid)["State"]["Running"] is True
    assert c.port(cid, 8888) == [{"HostIp": "127.0.0.1", "HostPort": "4242"}]
    c.stop(cid)
    c.remove_container(cid)
    with pytest.raises(NotFound) as e:
        c.inspect_container("jupyter-ann")
    assert e.value.status_code == 404  # DockerSpawner reads e.response.status_code


def test_admin_map_renders_for_users_without_any_quota() -> None:
    node = node_from_dict(fake_node(0))
    ledger = Ledger([node])  # no quotas at all: every user's quota is None
    ledger.reserve(Bundle(cores=1, memory_bytes=1 << 30, gpu_milli=250), Owner("ann"))
    cluster = Cluster({node.name: NodeRuntime(node.name, "127.0.0.1", "x.yaml", node)}, ledger,
                      FakeBackend(responder_port=4242))
    view = map_view(cluster)
    [row] = view["quota_rows"]
    assert row["user"] == "ann" and row["usage"]["gpu_milli"] == 250
    assert set(row["quota"].values()) == {None}  # unlimited, every resource named
    html = page_templates().get_template("admin.html.j2").render(
        view=view, user={"name": "admin", "admin": True}, prefix="/services/gpuspawner/",
        hub_prefix="/hub/", refresh_s=5, links=service_links("/services/", "GPU map"),
        api_links=[("API", "/x")])
    assert 'data-quota-user="ann" data-gpu-milli="250" data-gpu-milli-limit=""' in html


@pytest.mark.hub
@pytest.mark.skipif(not CHP.exists(), reason="configurable-http-proxy not installed (make chp)")
def test_hub_scale_tiny_run_prints_both_columns() -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "hub_scale.py"), "--servers", "3",
         "--requests", "3", "--culler-repeat", "1", "--concurrency", "2",
         "--time-limit", "150"],
        cwd=REPO, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "gpuspawner" in line
                  and "dockerspawner" in line and not line.startswith(("hub_scale", "(*)")))
    table = lines[header:]
    for label in ("spawn: servers/s", "spawn: p50 / p99", "hub /hub/api/users",
                  "all 3 servers", "gpuspawner service api/nodes", "idle_culler",
                  "jupyterhub-idle-culler"):
        row = next((line for line in table if label in line), None)
        assert row is not None, (label, r.stdout)
    # every row of a phase both sides ran has a number in both columns
    spawn = next(line for line in table if "spawn: servers/s" in line).split()
    assert float(spawn[-1]) > 0 and float(spawn[-2]) > 0
    # the spawn's bookkeeping counted on both hubs: commits to JupyterHub's database (at least
    # the server's record) and one spawn POST per server
    per_spawn = next(line for line in table if "hub per spawn: commits" in line).split()
    assert float(per_spawn[-6]) >= 1 and float(per_spawn[-3]) >= 1, per_spawn
    assert float(per_spawn[-4]) == float(per_spawn[-1]) == 1.0, per_spawn
    culler = next(line for line in table if line.strip().startswith("idle_culler")).split()
    assert float(culler[-1]) > 0 and float(culler[-2]) > 0
    # each hub's loop probe answered: the longest callback of the spawns on both sides, the
    # service's own endpoints on ours, and the longest callbacks named
    spawns = next(line for line in table if "during the spawns" in line).split()
    assert float(spawns[-6]) > 0 and float(spawns[-3]) > 0, spawns  # "ms (n) gcs" per side
    row = next(line for line in table if "service admin page GETs" in line).split()
    assert float(row[4]) > 0 and row[-1] == "n/a", row
    # (named by the request's handler and path: the map page's own, or the hub's answer to
    # the service's check of the admin's token, whichever took longest; the page's first
    # render no longer runs long on the loop)
    named = [line for line in lines if line.startswith("  gpuspawner loop, service map: ")]
    assert named and all(re.search(r" ms request \w+Handler GET /(services/gpuspawner/admin"
                                   r"|hub/api/user)\b", line) for line in named), named


def _leftovers(mark: str) -> list[str]:
    """Command lines of the processes whose environment carries ``mark`` (the run's own:
    hub_scale, its hubs, proxies and responder inherit it; other tests' hubs do not)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.environ().get("GPUSPAWNER_TEST_MARK") == mark:
                found.append(" ".join(p.info.get("cmdline") or [])[:200])
        except (psutil.Error, OSError):
            continue
    return found


def test_hub_scale_stopped_by_sigterm_leaves_no_hub_or_proxy() -> None:
    """SIGTERM to a running hub_scale stops its hubs, proxies and responder and removes its
    temporary folder (before: the parent exited and left the gpuspawner hub, the responder and
    the proxy running)."""
    mark = secrets.token_hex(8)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "hub_scale.py"), "--servers", "400",
         "--requests", "3", "--culler-repeat", "1", "--time-limit", "300"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "GPUSPAWNER_TEST_MARK": mark})
    try:
        deadline = time.monotonic() + 120
        while not any("jupyterhub" in line for line in _leftovers(mark)):
            assert time.monotonic() < deadline, "no hub started"
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        folders = {arg for line in _leftovers(mark) for arg in line.split()
                   if "/hub-scale-" in arg}
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
        deadline = time.monotonic() + 20
        while _leftovers(mark):
            assert time.monotonic() < deadline, _leftovers(mark)
            time.sleep(0.2)
        top = {"/tmp/" + f.split("/tmp/", 1)[1].split("/")[0] for f in folders if "/tmp/" in f}
        assert not any(os.path.exists(t) for t in top), top
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
