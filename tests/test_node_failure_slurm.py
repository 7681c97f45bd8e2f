"""A server moves off a Slurm node that fails: node1's slurmd gets SIGKILL (the node stops
answering), the hub's poll sees the server's node fail and restarts the server as a job on
node2, reachable at the user's URL again. Docs: docs/howto/node-failure.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from gpuspawner.testing.slurm_hub import USER, SlurmHub, chp
from tests.test_slurm_backend import slurm_conf  # noqa: F401
from tests.test_slurm_node_failure import restart_cluster, slurmd_pid

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.slow]


def node_of(hub: SlurmHub) -> str:
    """The node the user's server answers from ("" when it does not answer)."""
    try:
        r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=5)
    except Exception:
        return ""
    try:
        return json.loads(r.json()["env"]["GPUSPAWNER_ALLOCATION"])["node"]
    except (ValueError, KeyError, TypeError):  # the hub's page while it is not routed
        return ""


def test_a_server_moves_off_a_slurm_node_that_goes_down(slurm_conf: str,  # noqa: F811
                                                         tmp_path: Path) -> None:
    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    hub = SlurmHub(tmp_path, slurm_conf,
                   profiles=[{"slug": "cpu", "cpu": 1, "memory": "256M", "default": True}],
                   extra="c.GPUSpawner.placement_policy = 'first-fit'\n")
    hub.start()
    try:
        hub.ensure_user(USER)
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER, timeout=90)
        assert node_of(hub) == "node1"
        os.kill(slurmd_pid("node1"), signal.SIGKILL)
        t0 = time.monotonic()
        deadline = t0 + 150
        while time.monotonic() < deadline and node_of(hub) != "node2":
            time.sleep(0.5)
        seconds = time.monotonic() - t0
        assert node_of(hub) == "node2", "\n".join(
            line for line in hub.tail(3000).splitlines()
            if "xsrf" not in line and "/hub/login" not in line and " 302 " not in line)[-8000:]
        print(f"slurmd of node1 killed -> the user's URL answers from node2: {seconds:.1f} s")
        assert hub.api("GET", f"/users/{USER}").json()["servers"][""]["ready"] is True
    finally:
        try:
            if hub.server(USER) is not None:
                hub.api("DELETE", f"/users/{USER}/server")
                hub.wait_stopped(USER)
        finally:
            try:
                hub.stop()
            finally:
                restart_cluster()
                shutil.rmtree(hub.home, ignore_errors=True)
