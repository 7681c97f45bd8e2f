"""Elastic nodes on the Slurm backend: Slurm's own power saving (issue 42, provider "slurm",
gpuspawner/elastic/slurm.py) on the private cluster's node4 (scripts/slurm.sh: State=CLOUD,
partition "power", ResumeProgram / SuspendProgram = scripts/slurm-power.sh, SuspendTime 15 s).

A real hub whose only profile fits node4 alone: while node4 is powered down the spawn waits in
the queue as *can start* (not refused), the policy makes node4 placeable, the server's Slurm
job resumes node4 through ResumeProgram (its slurmd started, var/slurm/log/power.log), the
server answers (another user can power node4 down neither through scontrol nor through the
suspend program), and after it is stopped Slurm suspends node4 again (SuspendProgram) and the
hub sets it off.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuspawner.backends.slurm.commands import SlurmClient, parse_nodes
from gpuspawner.elastic.slurm import slurm_power_state
from gpuspawner.hub.identity import object_name
from gpuspawner.testing.slurm_hub import OTHER, USER, SlurmHub, chp
from tests.test_slurm_backend import slurm_conf  # noqa: F401
from tests.test_slurm_hub import jobs_of
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.hub]

REPO = Path(__file__).resolve().parents[1]


def node4_flags(conf: str) -> tuple[str, frozenset[str]] | None:
    """node4's ``scontrol show node`` state and flags (None when Slurm does not know it)."""
    out = subprocess.run(["scontrol", "show", "node", "node4"], capture_output=True, text=True,
                         timeout=20, env={**os.environ, "SLURM_CONF": conf})
    if out.returncode != 0:
        return None
    (info,) = parse_nodes(out.stdout)
    return info.state, info.flags


def node4_state(conf: str) -> str:
    """node4's power state as the hub reads it ("" when Slurm does not know node4)."""
    got = node4_flags(conf)
    return "" if got is None else slurm_power_state(*got)


def powered_down_now(conf: str) -> bool:
    got = node4_flags(conf)
    return got is not None and "POWERED_DOWN" in got[1] and "POWERING_DOWN" not in got[1]


@pytest.fixture
def powered_down(slurm_conf: str) -> Iterator[Path]:  # noqa: F811
    """node4 powered down (waits for an earlier test's SuspendTime); yields power.log."""
    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    if not node4_state(slurm_conf):
        pytest.skip("the Slurm cluster has no node4 (restart it: scripts/slurm.sh --stop; "
                    "scripts/slurm.sh)")
    if node4_state(slurm_conf) == "down":  # an earlier resume that failed (ResumeTimeout)
        subprocess.run(["scontrol", "update", "NodeName=node4", "State=RESUME"], timeout=20,
                       env={**os.environ, "SLURM_CONF": slurm_conf}, check=False)
    wait_until(lambda: powered_down_now(slurm_conf), timeout=120, message="node4 powered down")
    yield Path(slurm_conf).parents[1] / "log" / "power.log"


def test_a_server_for_a_powered_down_node_resumes_it_and_slurm_suspends_it_after(
        slurm_conf: str, powered_down: Path, tmp_path: Path) -> None:  # noqa: F811
    log = powered_down
    before = log.read_text() if log.exists() else ""
    client = SlurmClient(conf=slurm_conf, timeout=30)
    node4 = {"name": "node4", "topology": str(REPO / "hub_config/slurm/node4.yaml"),
             "host": "127.0.0.1", "elastic": True, "category": "cpu1", "provider": "slurm"}
    hub = SlurmHub(tmp_path, slurm_conf, profiles=[
        {"slug": "cpu", "display_name": "1 core", "cpu": 1, "memory": "256M", "gpus": 0,
         "nodes": ["node4"], "queue": True, "default": True}], extra=f"""
c.GPUSpawner.nodes = list(c.GPUSpawner.nodes) + [{node4!r}]
c.SlurmBackend.partition = "debug,power"
c.GPUElastic.scale_out_after = 4
c.GPUElastic.interval = 1
c.GPUElastic.join_timeout = 120
c.GPUElastic.categories = {{"cpu1": {{"start_s": 30}}}}
c.GPUSpawner.start_timeout = 150
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}
import logging as _logging
_logging.getLogger("gpuspawner").addHandler(_logging.StreamHandler())
_logging.getLogger("gpuspawner").setLevel(_logging.INFO)
c.SlurmBackend.submit_timeout = 120  # the job waits for ResumeProgram and node4's slurmd
from gpuspawner.hub.config_check import check_hub_config
check_hub_config(c)  # builds the cluster and attaches its elastic nodes
""")
    hub.start()
    try:
        hub.ensure_user(USER)
        t0 = time.monotonic()
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "cpu"})
        assert r.status_code == 202, r.text
        # can start: it waits in the hub's queue (no Slurm job yet), told a node is started
        msgs = hub.progress(USER, until="is started if this waits")
        assert any("a node (category cpu1) is started if this waits" in m for m in msgs), msgs
        assert not [j for j in jobs_of(client, object_name(USER, ""))
                    if j.state in ("PENDING", "CONFIGURING", "RUNNING")]
        hub.wait_ready(USER, timeout=170)
        ready_s = time.monotonic() - t0
        # (jobs of the same name that ended before may still be listed: MinJobAge)
        (job,) = [j for j in jobs_of(client, object_name(USER, "")) if j.state == "RUNNING"]
        assert job.node_list == ("node4",) and job.user == USER
        new = log.read_text()[len(before):]
        assert "resume node4: started slurmd" in new, new  # Slurm ran ResumeProgram
        assert node4_state(slurm_conf) == "running"
        assert "elastic node node4: placeable" in hub.tail(2000)
        print(f"spawn to ready on a powered-down node: {ready_s:.1f} s")
        # another user can neither power node4 down under the running server through Slurm
        # (an administrator's command) nor through the suspend program itself
        other = pwd.getpwnam(OTHER)
        as_other = ["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}",
                    "--init-groups"]
        env = {"PATH": os.environ["PATH"], "SLURM_CONF": slurm_conf}
        r1 = subprocess.run([*as_other, "scontrol", "update", "NodeName=node4",
                             "State=POWER_DOWN_FORCE"], capture_output=True, text=True,
                            timeout=30, env=env)
        assert r1.returncode != 0, r1
        # (Slurm 22.05 answers a user who is no operator "Invalid user id")
        assert any(w in (r1.stderr + r1.stdout).lower()
                   for w in ("invalid user id", "denied")), r1
        suspend = Path(slurm_conf).parent / "node-suspend"
        subprocess.run([*as_other, str(suspend), "node4"], capture_output=True, text=True,
                       timeout=30, env=env)
        assert node4_state(slurm_conf) == "running"
        assert hub.server(USER)["ready"]
        assert "suspend node4" not in log.read_text()[len(before):]
        mark = len(log.read_text())

        assert hub.api("DELETE", f"/users/{USER}/server").status_code in (202, 204)
        hub.wait_stopped(USER, timeout=60)
        t1 = time.monotonic()
        # SuspendTime (15 s) after it fell idle, SuspendProgram stops its slurmd
        wait_until(lambda: "suspend node4: stopped slurmd" in log.read_text()[mark:],
                   timeout=120, message="SuspendProgram for node4")
        wait_until(lambda: powered_down_now(slurm_conf), timeout=60,
                   message="node4 powered down")
        wait_until(lambda: "elastic node node4 is powered down (Slurm)" in hub.tail(4000),
                   timeout=30, message="the hub sets node4 off")
        print(f"stop to powered down: {time.monotonic() - t1:.1f} s")
    finally:
        try:
            if hub.server(USER) is not None:
                hub.api("DELETE", f"/users/{USER}/server")
                hub.wait_stopped(USER)
        finally:
            hub.stop()
            shutil.rmtree(hub.home, ignore_errors=True)
