"""The Slurm backend's pieces against the real private three-node cluster of scripts/slurm.sh.

One job, submitted through :class:`SlurmClient` as the unprivileged ``gpsuser1`` and asking for
the second GPU of node2 by its GRES type with ``--gres-flags=enforce-binding``, must run on
node2, hold exactly that GPU's index and the core of its NUMA node, be allowed that GPU's device
file and refused the node's other one by the device cgroup; scancel must take it out of the
queue. Draining a node must show in the node parser. Each wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuspawner.backends.slurm.commands import JobInfo, SlurmClient, SlurmError
from gpuspawner.backends.slurm.gres import gres_type, node_gres
from gpuspawner.inventory.topology import load_topology_file
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm.sh"
TOPOLOGIES = {n: load_topology_file(REPO / "hub_config" / "slurm" / f"{n}.yaml")
              for n in ("node1", "node2")}
DEV = REPO / "var" / "slurm" / "dev"
JOB_USER = "gpsuser1"


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """Start (or find running) the cluster; its slurm.conf path."""
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        if shutil.which("slurmctld") is None:
            pytest.skip("the Slurm packages could not be installed: " + proc.stderr[-2000:])
        pytest.fail(f"scripts/slurm.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("export SLURM_CONF=")]
    assert line, f"scripts/slurm.sh printed no SLURM_CONF line: {proc.stdout!r}"
    return line[-1].split("=", 1)[1]


@pytest.fixture(scope="session")
def client(slurm_conf: str) -> SlurmClient:
    return SlurmClient(conf=slurm_conf, timeout=30)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one client call to its end (the tests are synchronous: wait_until polls)."""
    return asyncio.run(coro)


def test_nodes_carry_the_gres_made_from_the_topology(client: SlurmClient) -> None:
    nodes = {n.name: n for n in run(client.show_nodes())}
    assert set(nodes) == {"node1", "node2", "node3", "node4"}
    # node4: no GPU, 1 core, under Slurm's power saving (State=CLOUD; tests/test_slurm_power.py)
    assert (nodes["node4"].gres, nodes["node4"].cpus, nodes["node4"].real_memory_mb) == (
        "", 1, 1000)
    assert "CLOUD" in nodes["node4"].flags
    # node3 types its GPUs by model (the backend's model mode): one count per model
    assert nodes["node3"].gres == "gpu:FAKE:2(S:0-1)"
    for name, topo in TOPOLOGIES.items():
        node = nodes[name]
        assert (node.cpus, node.real_memory_mb) == (2, 4000)
        # scontrol adds the socket of each GPU: gpu:TYPE:1(S:0) - the NUMA node of the topology
        expected = [f"{entry}(S:{g.numa_node})"
                    for entry, g in zip(node_gres(topo).split(","),
                                        sorted(topo.gpus, key=lambda g: g.index), strict=True)]
        assert node.gres.split(",") == expected


# --------------------------------------------------------------------------- one pinned job

JOB_SCRIPT = """#!/usr/bin/python3
import errno, json, os, time
result = {{"uid": os.getuid(), "cpus": sorted(os.sched_getaffinity(0))}}
for name, path in (("own", {own!r}), ("other", {other!r})):
    try:
        os.close(os.open(path, os.O_RDONLY))
        result[name] = "opened"
    except OSError as e:
        result[name] = errno.errorcode.get(e.errno, str(e.errno))
with open({out!r} + ".tmp", "w") as f:
    json.dump(result, f)
os.rename({out!r} + ".tmp", {out!r})
time.sleep(300)  # hold the allocation until the test cancels the job
"""


class PinnedJob:
    """The job of this module and what it was asked for."""

    def __init__(self, job_id: int, gpu_uuid: str, own_dev: str, other_dev: str,
                 result: Path) -> None:
        self.job_id = job_id
        self.gpu_uuid = gpu_uuid
        self.own_dev = own_dev
        self.other_dev = other_dev
        self.result = result


@pytest.fixture(scope="module")
def pinned_job(client: SlurmClient) -> Iterator[PinnedJob]:
    # GPU B of node2: not on the node, core or device index a scheduler would pick first
    node2 = TOPOLOGIES["node2"]
    gpu_a, gpu_b = sorted(node2.gpus, key=lambda g: g.index)
    # device files as scripts/slurm.sh numbers them: node1 has nvidia0,1 and node2 nvidia2,3
    own_dev, other_dev = str(DEV / "nvidia3"), str(DEV / "nvidia2")
    user = pwd.getpwnam(JOB_USER)
    outdir = Path(tempfile.mkdtemp(prefix="gps-slurm-", dir="/tmp"))
    os.chown(outdir, user.pw_uid, user.pw_gid)
    outdir.chmod(0o700)
    result = outdir / "result.json"
    script = JOB_SCRIPT.format(own=own_dev, other=other_dev, out=str(result))
    job_id = run(client.sbatch(script, [
        f"--gres=gpu:{gres_type(gpu_b.uuid)}:1", "--gres-flags=enforce-binding",
        "--ntasks=1", "--cpus-per-task=1", "--mem=100", f"--chdir={outdir}",
        f"--output={outdir}/slurm-%j.out", "--job-name=gps-pinned", "--comment=pinned test",
    ], user=JOB_USER))
    try:
        yield PinnedJob(job_id, gpu_b.uuid, own_dev, other_dev, result)
    finally:
        try:
            run(client.scancel(job_id))
        except SlurmError:
            pass
        shutil.rmtree(outdir, ignore_errors=True)


def running(client: SlurmClient, job_id: int) -> JobInfo | None:
    job = run(client.show_job(job_id))
    return job if job is not None and job.state == "RUNNING" and job.details else None


def test_pinned_job_runs_on_the_gpus_node_with_its_index_and_core(
        client: SlurmClient, pinned_job: PinnedJob) -> None:
    job = wait_until(lambda: running(client, pinned_job.job_id), timeout=60, interval=0.5,
                     message=lambda: f"job {pinned_job.job_id} running: "
                     f"{run(client.show_job(pinned_job.job_id))}")
    assert (job.user, job.uid) == (JOB_USER, pwd.getpwnam(JOB_USER).pw_uid)
    assert job.comment == "pinned test"
    assert job.node_list == ("node2",)
    node2 = TOPOLOGIES["node2"]
    gpus = sorted(node2.gpus, key=lambda g: g.index)
    index = [g.uuid for g in gpus].index(pinned_job.gpu_uuid)
    assert index == 1
    # exactly that GPU: its index among node2's gres.conf lines, nothing else
    assert job.gres_indices("node2") == {gres_type(pinned_job.gpu_uuid): (index,)}
    # enforce-binding: the one core bound to it is the CPU of its NUMA node
    numa = {n.id: n for n in node2.numa_nodes}[gpus[index].numa_node]
    detail = job.node_detail("node2")
    assert detail is not None and detail.cpu_ids == numa.cpus == (1,)


def test_pinned_job_may_open_its_gpu_and_not_the_other(
        client: SlurmClient, pinned_job: PinnedJob) -> None:
    wait_until(pinned_job.result.exists, timeout=60, interval=0.5,
               message=lambda: f"{pinned_job.result} written by job {pinned_job.job_id} "
               f"({run(client.show_job(pinned_job.job_id))})")
    result = json.loads(pinned_job.result.read_text())
    assert result["uid"] == pwd.getpwnam(JOB_USER).pw_uid  # the job ran as the user
    assert result["cpus"] == [1]  # task/cgroup + affinity: the bound core only
    # allowed by the device cgroup, no driver behind it: "No such device or address"
    assert result["own"] == "ENXIO"
    # the node's other GPU: refused by the device cgroup
    assert result["other"] == "EPERM"


def test_scancel_removes_the_job_from_the_queue(
        client: SlurmClient, pinned_job: PinnedJob) -> None:
    wait_until(lambda: pinned_job.job_id in run(client.squeue()), timeout=30, interval=0.5,
               message=f"job {pinned_job.job_id} in squeue")
    run(client.scancel(pinned_job.job_id))
    wait_until(lambda: pinned_job.job_id not in run(client.squeue()), timeout=60,
               interval=0.5, message=lambda: f"job {pinned_job.job_id} gone from squeue: "
               f"{run(client.squeue())}")
    job = run(client.show_job(pinned_job.job_id))
    assert job is None or job.state == "CANCELLED"


def test_unknown_gres_type_is_refused_with_slurms_message(client: SlurmClient) -> None:
    with pytest.raises(SlurmError) as e:
        run(client.sbatch("#!/bin/sh\ntrue\n", [f"--gres=gpu:{gres_type('GPU-nosuch')}:1",
                                                "--mem=10"], user=JOB_USER))
    assert e.value.returncode == 1
    assert "Requested node configuration is not available" in e.value.stderr


# --------------------------------------------------------------------------- drain / resume


def test_drain_shows_in_the_node_parser_and_resume_clears_it(client: SlurmClient) -> None:
    try:
        run(client.update_node("node2", "drain", reason="test"))
        (node,) = run(client.show_nodes("node2"))
        assert node.drained and "DRAIN" in node.flags and not node.usable
        assert node.reason == "test"
        (other,) = run(client.show_nodes("node1"))
        assert not other.drained
    finally:
        run(client.update_node("node2", "resume"))
    # resume may leave the node NOT_RESPONDING until the next ping
    node = wait_until(lambda: next((n for n in run(client.show_nodes("node2")) if n.usable),
                                   None),
                      timeout=30, interval=0.5, message="node2 usable again after resume")
    assert not node.drained and node.reason == ""
