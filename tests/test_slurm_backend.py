"""SlurmBackend against the private three-node cluster of scripts/slurm.sh, driven directly (no
hub): a server reserved by the ledger on node1 runs as a job of gpsuser1 holding exactly the
allocated GPU's IDX and core, answers HTTP at the address launch returns with the environment
of its spec (and none of the hub's), is found again by list_managed, and is gone after stop.
An allocation that Slurm did not grant - tampered readback, or a core that is not the GPU's -
fails the launch and cancels the job. A controller that does not answer is BackendUnavailable.

The cluster is shared with other tests: these use node1 only and never drain or stop a node.
Run with SLURM_CONF exported as scripts/slurm.sh prints it (else var/slurm of this checkout).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuspawner.backends.base import (
    BackendUnavailable,
    LaunchFailed,
    Managed,
    NodeRuntime,
    ServerRef,
    backend_class,
)
from gpuspawner.backends.slurm.backend import SlurmBackend
from gpuspawner.backends.slurm.commands import GresAlloc, JobInfo, JobNodeDetail, SlurmClient
from gpuspawner.backends.slurm.gres import gres_type
from gpuspawner.backends.slurm.job import ADMIN_MARKER, gpu_positions
from gpuspawner.backends.spec import HomeMount, LaunchSpec, launch_spec
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Allocation, Bundle, Ledger, Owner
from gpuspawner.testing.port_sink import port_sink_api_url
from gpuspawner.testing.slurm_hub import SERVER
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
JOB_USER = "gpsuser1"
MiB = 2**20
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def slurm_conf() -> str:
    """The running cluster's slurm.conf; skips (with the reason) when it is not up."""
    conf = os.environ.get("SLURM_CONF") or str(REPO / "var/slurm/etc/slurm.conf")
    if os.geteuid() != 0:
        pytest.skip("the Slurm backend submits as root (sbatch --uid)")
    if shutil.which("sinfo") is None or not os.path.isfile(conf):
        pytest.skip(f"no Slurm cluster ({conf} missing): start it with scripts/slurm.sh and "
                    "export SLURM_CONF as it prints")
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                             text=True, timeout=20, env={**os.environ, "SLURM_CONF": conf})
    except subprocess.TimeoutExpired:
        pytest.skip(f"the Slurm controller of {conf} does not answer (scripts/slurm.sh)")
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    if out.returncode != 0 or states.get("node1") not in ("idle", "mixed", "allocated"):
        pytest.skip(f"node1 of {conf} is not up ({out.stderr.strip() or states}): "
                    "scripts/slurm.sh")
    return conf


def topology_nodes() -> dict[str, NodeRuntime]:
    out = {}
    for name in ("node1", "node2"):
        path = REPO / "hub_config" / "slurm" / f"{name}.yaml"
        out[name] = NodeRuntime(name=name, host="127.0.0.1", topology=str(path),
                                node=load_topology_file(path))
    return out


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A folder of the job user: the server's home and the jobs' output files."""
    user = pwd.getpwnam(JOB_USER)
    d = Path(tempfile.mkdtemp(prefix="gps-slurmbe-", dir="/tmp"))
    os.chown(d, user.pw_uid, user.pw_gid)
    d.chmod(0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_backend(conf: str, workdir: Path, **traits: Any) -> SlurmBackend:
    backend = SlurmBackend(slurm_conf=conf, python="/usr/bin/python3", submit_timeout=40,
                           port_timeout=20, stop_timeout=30,
                           output=str(workdir / "slurm-%x-%j.out"), **traits)
    backend.bind(topology_nodes())
    return backend


@pytest.fixture(scope="module")
def backend(slurm_conf: str, workdir: Path) -> SlurmBackend:
    b = make_backend(slurm_conf, workdir)
    b.check_config()
    return b


@pytest.fixture(scope="module")
def client(slurm_conf: str) -> SlurmClient:
    return SlurmClient(conf=slurm_conf, timeout=30)


TRICKY = "a 'b' \"c\" $HOME `id` \\ ; x\ny"


def server_spec(alloc: Allocation, home: Path, name: str) -> LaunchSpec:
    user = pwd.getpwnam(JOB_USER)
    prefix = f"/user/{JOB_USER}/"
    return launch_spec(
        name=name, user=JOB_USER, server="", allocation=alloc, image="(none)",
        cmd=["/usr/bin/python3", "-c", SERVER],
        env={"JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:8888{prefix}",
             "JUPYTERHUB_SERVICE_PREFIX": prefix, "TRICKY": TRICKY,
             # the server reports its port with its own token (a stand-in of the hub's API)
             "JUPYTERHUB_API_URL": port_sink_api_url(),
             "JUPYTERHUB_API_TOKEN": f"tok-{name}-{uuid.uuid4().hex}"},
        uid=user.pw_uid, gid=user.pw_gid, port=8888,
        home=HomeMount(str(home), f"/home/{JOB_USER}"))


def ledger_pair() -> tuple[Allocation, Allocation]:
    """Two 1-GPU bundles on node1 from the ledger: a filler booked first (held in the ledger
    only), then the server's, which therefore gets the GPU a scheduler would not pick first
    whenever the ledger books index 0 first."""
    nodes = topology_nodes()
    ledger = Ledger([rt.node for rt in nodes.values()])
    bundle = Bundle(cores=1, memory_bytes=256 * MiB, gpus=1)
    filler = ledger.reserve(bundle, Owner("filler"), nodes=["node1"])
    alloc = ledger.reserve(bundle, Owner(JOB_USER), nodes=["node1"])
    return filler, alloc


@dataclass
class Launched:
    alloc: Allocation
    filler: Allocation
    spec: LaunchSpec
    state: dict[str, Any]
    ip: str
    port: int
    progress: list[str]

    @property
    def job_id(self) -> int:
        return int(self.state["job_id"])


@pytest.fixture(scope="module")
def launched(backend: SlurmBackend, client: SlurmClient, workdir: Path
             ) -> Iterator[Launched]:
    os.environ["GPS_HUB_SECRET"] = "the hub's secret"  # must not reach the job
    filler, alloc = ledger_pair()
    spec = server_spec(alloc, workdir, f"gps-test-{uuid.uuid4().hex[:6]}")
    state: dict[str, Any] = {}
    progress: list[str] = []
    try:
        ip, port = run(backend.launch(spec, state, lambda p, m: progress.append(m)))
        yield Launched(alloc, filler, spec, state, ip, port, progress)
    finally:
        os.environ.pop("GPS_HUB_SECRET", None)
        run(backend.cleanup(alloc, state))


def test_backend_is_registered() -> None:
    assert backend_class("slurm") is SlurmBackend


def test_job_runs_on_the_allocated_gpu_and_core(
        launched: Launched, client: SlurmClient) -> None:
    job = run(client.show_job(launched.job_id))
    assert job is not None and job.state == "RUNNING"
    assert (job.user, job.name) == (JOB_USER, launched.spec.name)
    assert job.node_list == ("node1",)
    node1 = topology_nodes()["node1"].node
    (uuid_,) = launched.alloc.gpu_uuids
    assert uuid_ != launched.filler.gpu_uuids[0]
    idx = gpu_positions(node1)[uuid_]
    assert job.gres_indices("node1") == {gres_type(uuid_): (idx,)}
    detail = job.node_detail("node1")
    assert detail is not None
    assert detail.cpu_ids == launched.alloc.cpuset
    numa = {n.id: n for n in node1.numa_nodes}[node1.gpu(uuid_).numa_node]
    assert detail.cpu_ids == numa.cpus  # the GPU's own core (enforce-binding)
    assert detail.memory_mb == 256
    assert job.fields["AdminComment"] == ADMIN_MARKER + launched.alloc.to_json()
    assert job.fields.get("Requeue") == "0"
    assert any("submitted Slurm job" in m for m in launched.progress)
    picked = launched.state["picked"]
    assert (picked["node"], picked["cpu_ids"], picked["gpu_uuids"], picked["memory_mb"]) == (
        "node1", list(launched.alloc.cpuset), [uuid_], 256)


def test_the_jobs_output_file_is_its_users_alone(launched: Launched) -> None:
    """The job's output file (a server's log; a notebook job's executed notebook with its
    outputs) was made with the hub's umask (022): readable by every account on the node, in
    the default /tmp. sbatch now runs with umask 077, which Slurm hands to the job
    (SLURM_UMASK), so the file is 0600."""
    path = Path(launched.spec.home.host_path if launched.spec.home else "") / \
        f"slurm-{launched.spec.name}-{launched.job_id}.out"
    wait_until(path.exists, timeout=30, interval=0.2, message=f"{path} made by the job")
    st = path.stat()
    assert st.st_uid == pwd.getpwnam(JOB_USER).pw_uid
    assert oct(st.st_mode & 0o777) == "0o600", oct(st.st_mode)


def test_a_users_comment_cannot_forge_another_users_job(
        backend: SlurmBackend, client: SlurmClient, launched: Launched) -> None:
    """Slurm keeps a newline in a job's ``Comment`` and ``scontrol show job`` prints it as it
    is, so a user's own job could print a second record: ``JobId=`` of another user's server
    with an ``AdminComment`` of the user's choosing. The sweep read it as a server of ours
    whose allocation is not booked and cancelled the other user's job; a restore would have
    booked the forged allocation. The hub now lists jobs with ``squeue --json``."""
    victim = launched.job_id
    forged = json.dumps({"id": "f0rged", "node": "node1", "owner": {"user": JOB_USER}})
    comment = (f"x\nJobId={victim} JobName={launched.spec.name}\n   JobState=RUNNING\n"
               f"   AdminComment=gpuspawner:{forged}")
    attacker = run(client.sbatch("#!/bin/sh\ntrue\n", ["--hold", "--mem=10",
                                                        "--output=/dev/null",
                                                        "--job-name=attacker",
                                                        f"--comment={comment}"],
                                 user=JOB_USER))
    try:
        text = run(client.run("scontrol", "show", "job", "-d"))
        assert f"\nJobId={victim} JobName={launched.spec.name}\n   JobState" in text  # forged
        removed = run(backend.sweep("node1", lambda aid: aid != "f0rged", lambda u, s: True))
        assert removed == []
        assert all("f0rged" not in m.allocation for m in run(backend.list_managed()))
        job = run(client.show_job(victim))
        assert job is not None and job.state == "RUNNING"
    finally:
        run(client.scancel(attacker))


def get_json(ip: str, port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def test_server_answers_at_the_returned_address_with_its_spec(launched: Launched,
                                                               workdir: Path) -> None:
    assert launched.ip == "127.0.0.1" and launched.port != 8888
    seen = wait_until(lambda: _try_get(launched.ip, launched.port), timeout=20, interval=0.2,
                      message=f"server at {launched.ip}:{launched.port}")
    assert seen["path"] == f"/user/{JOB_USER}/api"
    assert seen["uid"] == pwd.getpwnam(JOB_USER).pw_uid
    assert seen["cpus"] == list(launched.alloc.cpuset)
    assert seen["cwd"] == str(workdir)
    env = seen["env"]
    assert env["TRICKY"] == TRICKY  # shlex quoting survives quotes, $, backticks, newlines
    assert env["HOME"] == str(workdir)  # the home's path on the node, not the mount point
    assert env["GPUSPAWNER_PORT"] == str(launched.port)
    assert env["JUPYTERHUB_SERVICE_URL"] == f"http://127.0.0.1:{launched.port}/user/{JOB_USER}/"
    assert Allocation.from_json(env["GPUSPAWNER_ALLOCATION"]) == launched.alloc
    assert env["GPS_HUB_SECRET"] is None  # the hub's environment stays out of the job


def _try_get(ip: str, port: int) -> dict[str, Any] | None:
    try:
        return get_json(ip, port, f"/user/{JOB_USER}/api")
    except OSError:
        return None


def test_poll_and_exit_report_see_it_running(backend: SlurmBackend, launched: Launched
                                             ) -> None:
    assert run(backend.poll(launched.state)) is None
    assert run(backend.exit_report(launched.state)) is None


def test_list_managed_finds_it_with_its_allocation(backend: SlurmBackend, launched: Launched
                                                   ) -> None:
    found = run(backend.list_managed())
    ours = [m for m in found if m.handle == str(launched.job_id)]
    assert ours == [Managed("node1", launched.alloc.to_json(), str(launched.job_id))]
    assert Allocation.from_json(ours[0].allocation) == launched.alloc


def test_sweep_keeps_booked_jobs(backend: SlurmBackend, launched: Launched) -> None:
    removed = run(backend.sweep("node1", booked=lambda a: a == launched.alloc.id,
                                owner_booked=lambda u, s: True))
    assert str(launched.job_id) not in removed
    assert run(backend.poll(launched.state)) is None


def test_stop_removes_the_job(backend: SlurmBackend, client: SlurmClient,
                              launched: Launched) -> None:
    run(backend.stop(launched.state))
    assert launched.job_id not in run(client.squeue([launched.job_id]))
    assert run(backend.poll(launched.state)) is not None
    assert str(launched.job_id) not in {m.handle for m in run(backend.list_managed())}
    report = run(backend.exit_report(launched.state))
    assert report is not None and str(launched.job_id) in report


# --------------------------------------------------------------------------- mismatches


def _gone(client: SlurmClient, job_id: int) -> bool:
    return job_id not in run(client.squeue([job_id]))


def test_tampered_readback_fails_the_launch_and_cancels_the_job(
        slurm_conf: str, client: SlurmClient, workdir: Path) -> None:
    backend = make_backend(slurm_conf, workdir)
    alloc, _ = ledger_pair()  # a consistent allocation: Slurm grants it as asked
    node1 = topology_nodes()["node1"].node
    (uuid_,) = alloc.gpu_uuids
    other = 1 - gpu_positions(node1)[uuid_]
    real_show = backend.client.show_job

    async def tampered(job_id: int) -> JobInfo | None:
        job = await real_show(job_id)
        if job is None or not job.details:
            return job
        d = job.details[0]
        fake = JobNodeDetail(d.nodes, d.cpu_ids, d.memory_mb,
                             (GresAlloc("gpu", gres_type(uuid_), 1, (other,)),))
        return replace(job, details=(fake,))

    backend.client.show_job = tampered  # type: ignore[method-assign]
    state: dict[str, Any] = {}
    spec = server_spec(alloc, workdir, f"gps-tamper-{uuid.uuid4().hex[:6]}")
    try:
        with pytest.raises(LaunchFailed) as e:
            run(backend.launch(spec, state, lambda p, m: None))
        assert f"(IDX:{other})" in str(e.value) and "cancelled" in str(e.value)
        wait_until(lambda: _gone(client, state["job_id"]), timeout=30, interval=0.3,
                   message=f"job {state.get('job_id')} cancelled")
    finally:
        run(backend.cleanup(alloc, state))


def test_core_that_is_not_the_gpus_fails_the_launch(
        slurm_conf: str, client: SlurmClient, workdir: Path) -> None:
    """An allocation naming a GPU with the other NUMA node's core: Slurm binds the GPU's own
    core (enforce-binding), the readback sees CPU_IDs differ, and the job is cancelled."""
    backend = make_backend(slurm_conf, workdir)
    alloc, _ = ledger_pair()
    node1 = topology_nodes()["node1"].node
    gpu = node1.gpu(alloc.gpu_uuids[0])
    wrong = next(n for n in node1.numa_nodes if n.id != gpu.numa_node)
    alloc = replace(alloc, id=Allocation.new_id(), cpuset=wrong.cpus, mems=(wrong.id,),
                    memory_by_numa=((wrong.id, alloc.memory_bytes),))
    state: dict[str, Any] = {}
    spec = server_spec(alloc, workdir, f"gps-wrongcpu-{uuid.uuid4().hex[:6]}")
    try:
        with pytest.raises(LaunchFailed) as e:
            run(backend.launch(spec, state, lambda p, m: None))
        assert "CPU_IDs=" in str(e.value)
        wait_until(lambda: _gone(client, state["job_id"]), timeout=30, interval=0.3,
                   message=f"job {state.get('job_id')} cancelled")
    finally:
        run(backend.cleanup(alloc, state))


# --------------------------------------------------------------------------- configuration


def test_check_config_names_an_unknown_node(slurm_conf: str, workdir: Path) -> None:
    backend = make_backend(slurm_conf, workdir)
    rt = topology_nodes()["node1"]
    backend.bind({"node9": replace(rt, name="node9")})
    with pytest.raises(ValueError, match=r"nodes\[0\] \(node9\)\.name: Slurm does not know"):
        backend.check_config()


def test_check_config_names_a_gpu_without_its_gres_type(slurm_conf: str, workdir: Path
                                                        ) -> None:
    backend = make_backend(slurm_conf, workdir)
    rt = topology_nodes()["node1"]
    gpus = (replace(rt.node.gpus[0], uuid="GPU-00000000-0000-0000-0000-000000000000"),
            *rt.node.gpus[1:])
    backend.bind({"node1": replace(rt, node=replace(rt.node, gpus=gpus))})
    with pytest.raises(ValueError, match=r"nodes\[0\] \(node1\)\.topology: GPU GPU-0000"):
        backend.check_config()


def test_unreachable_controller_is_backend_unavailable(
        slurm_conf: str, workdir: Path, tmp_path: Path) -> None:
    # the same cluster's configuration with the controller on a port where nothing listens
    text = Path(slurm_conf).read_text()
    (tmp_path / "slurm.conf").write_text(text.replace("SlurmctldPort=17001",
                                                      "SlurmctldPort=17091"))
    for extra in ("gres.conf", "cgroup.conf"):
        if (Path(slurm_conf).parent / extra).exists():
            shutil.copy(Path(slurm_conf).parent / extra, tmp_path / extra)
    backend = make_backend(str(tmp_path / "slurm.conf"), workdir, command_timeout=3)
    with pytest.raises(BackendUnavailable) as e:
        run(backend.poll({"node": "node1", "job_id": 1}))
    assert e.value.node == "node1"
    assert run(backend.list_managed()) == []
    backend.check_config()  # a controller that is down does not stop the hub's start


# --------------------------------------------------------------------------- other paths


#: a server that listens on its port (so that it is reported), then fails
DIES = ("import os, socket, sys, time; s = socket.socket(); "
        "s.bind(('127.0.0.1', int(os.environ['GPUSPAWNER_PORT']))); s.listen(); "
        "print('boom-' + os.environ['GPUSPAWNER_PORT'], file=sys.stderr, flush=True); "
        "time.sleep(2); sys.exit(3)")


def test_server_that_dies_is_reported_with_its_output(
        slurm_conf: str, client: SlurmClient, workdir: Path) -> None:
    """The server listens and reports its port, then its command fails: poll gives the exit
    status and exit_report the job's state with the last lines of its output file."""
    backend = make_backend(slurm_conf, workdir)
    alloc, _ = ledger_pair()
    spec = replace(server_spec(alloc, workdir, f"gps-dies-{uuid.uuid4().hex[:6]}"),
                   # it listens 2 s after its port report, so launch returns first
                   cmd=("/usr/bin/python3", "-c", DIES))
    state: dict[str, Any] = {}
    try:
        _, port = run(backend.launch(spec, state, lambda p, m: None))
        assert run(backend.poll(state)) is None
        status = wait_until(lambda: run(backend.poll(state)), timeout=30, interval=0.3,
                            message="poll reports the dead server")
        assert status == 3
        report = wait_until(lambda: run(backend.exit_report(state)), timeout=10,
                            message="exit report")
        assert "FAILED" in report and "ExitCode=3:0" in report
        assert f"boom-{port}" in report
    finally:
        run(backend.cleanup(alloc, state))


def test_a_node_without_the_homes_folder_fails_naming_node_and_folder(
        slurm_conf: str, client: SlurmClient, workdir: Path) -> None:
    """The job checks the home on its node: the home's parent folder (the shared file
    system) is missing there, so the launch fails naming the node and the folder, and
    nothing is made on the hub's machine or the node."""
    backend = make_backend(slurm_conf, workdir)
    alloc, _ = ledger_pair()
    missing = workdir / "not-mounted"
    spec = replace(server_spec(alloc, workdir, f"gps-nohome-{uuid.uuid4().hex[:6]}"),
                   home=HomeMount(str(missing / JOB_USER), f"/home/{JOB_USER}"))
    state: dict[str, Any] = {}
    try:
        with pytest.raises(LaunchFailed) as e:
            run(backend.launch(spec, state, lambda p, m: None))
        assert f"node {alloc.node}: the folder {missing} of the home" in str(e.value)
        assert not missing.exists()
    finally:
        run(backend.cleanup(alloc, state))


def test_held_job_counts_as_alive_only_right_after_submit(
        backend: SlurmBackend, client: SlurmClient) -> None:
    """PENDING is not alive (batchspawner kept a requeued job "ready"); only a job submitted
    less than submit_timeout ago and never seen running may wait."""
    name = f"gps-held-{uuid.uuid4().hex[:6]}"
    job_id = run(client.sbatch("#!/bin/sh\ntrue\n", [
        "--hold", f"--job-name={name}", "--mem=10", "--chdir=/tmp", "--output=/dev/null",
        "--comment=gpuspawner-submitted:x"], user=JOB_USER))
    try:
        fresh = {"node": "node1", "job_id": job_id, "submitted": time.time(), "started": False}
        assert run(backend.poll(fresh)) is None
        assert run(backend.exit_report(fresh)) is None
        assert run(backend.poll(dict(fresh, started=True))) == 1
        assert run(backend.poll(dict(fresh, submitted=time.time() - 3600))) == 1
        # an interrupted launch left it held and unmarked: remove_server finds it by name
        run(backend.remove_server("node1", ServerRef("other", "", name + "-x")))
        assert job_id in run(client.squeue([job_id]))
        run(backend.remove_server("node1", ServerRef(JOB_USER, "", name)))
        wait_until(lambda: _gone(client, job_id), timeout=30, interval=0.3,
                   message=f"held job {job_id} cancelled by remove_server")
    finally:
        run(client.scancel(job_id))


def test_sweep_cancels_a_job_whose_allocation_is_not_booked(
        slurm_conf: str, client: SlurmClient, workdir: Path) -> None:
    """(With the admin's partition, time limit, extra options and prologue, seen in the job.)"""
    backend = make_backend(slurm_conf, workdir, partition="debug", time_limit="0:10:00",
                           extra_sbatch_options=["--nice=5"],
                           job_prologue=["export FROM_PROLOGUE=yes"])
    alloc, _ = ledger_pair()
    state: dict[str, Any] = {}
    spec = server_spec(alloc, workdir, f"gps-sweep-{uuid.uuid4().hex[:6]}")
    try:
        ip, port = run(backend.launch(spec, state, lambda p, m: None))
        job = run(client.show_job(state["job_id"]))
        assert job is not None
        assert (job.fields["Partition"], job.fields["TimeLimit"], job.fields["Nice"]) == (
            "debug", "00:10:00", "5")
        seen = wait_until(lambda: _try_get(ip, port), timeout=20, interval=0.2,
                          message=f"server at {ip}:{port}")
        assert seen["env"]["FROM_PROLOGUE"] == "yes"
        assert run(backend.sweep("node2", booked=lambda a: False,
                                 owner_booked=lambda u, s: False)) == []
        removed = run(backend.sweep("node1", booked=lambda a: a != alloc.id,
                                    owner_booked=lambda u, s: True))
        assert removed == [str(state["job_id"])]
        wait_until(lambda: _gone(client, state["job_id"]), timeout=30, interval=0.3,
                   message=f"job {state['job_id']} swept")
    finally:
        run(backend.cleanup(alloc, state))


def test_hub_config_check_names_slurm_settings_and_nodes(slurm_conf: str) -> None:
    """The hub's start-up check (check_spawner_settings) builds the Slurm backend: a wrong
    c.SlurmBackend setting is named as such, an unknown node under GPUSpawner.nodes."""
    from traitlets.config import Config

    from gpuspawner.hub.cluster import reset_clusters
    from gpuspawner.hub.config_check import (
        HubConfigError,
        check_hub_config,
        check_spawner_settings,
    )
    from gpuspawner.hub.proxy import GPUProxy

    topo = REPO / "hub_config" / "slurm"
    settings = {"backend": "slurm",
                "nodes": [{"name": "node1", "topology": str(topo / "node1.yaml")}],
                "profiles": [{"slug": "g", "cpu": 1, "memory": "256M", "gpus": 1}]}
    cases = [
        ({"slurm_conf": "/nonexistent/slurm.conf"}, settings,
         "SlurmBackend.slurm_conf: no such file '/nonexistent/slurm.conf'"),
        ({"slurm_conf": slurm_conf, "extra_sbatch_options": ["--uid=0"]}, settings,
         "SlurmBackend.extra_sbatch_options: '--uid=0': the backend sets --uid itself"),
        ({"slurm_conf": slurm_conf},
         dict(settings, nodes=[{"name": "node9", "topology": str(topo / "node1.yaml")}]),
         "GPUSpawner.nodes[0] (node9).name: Slurm does not know node 'node9'"),
    ]
    try:
        for traits, spawner_settings, message in cases:
            reset_clusters()
            config = Config()
            config.SlurmBackend = Config(traits)
            with pytest.raises(HubConfigError) as e:
                check_spawner_settings(spawner_settings, config)
            assert str(e.value).startswith(message), str(e.value)
        reset_clusters()
        config = Config()
        config.SlurmBackend = Config({"slurm_conf": slurm_conf})
        check_spawner_settings(settings, config)  # a right configuration passes
        # ... but the whole hub config needs internal_ssl: jobs share the node's network
        reset_clusters()
        config.GPUSpawner = Config(settings)
        with pytest.raises(SystemExit, match=r"JupyterHub.internal_ssl: must be True with "
                                             "SlurmBackend"):
            check_hub_config(config)
        # ... and a proxy whose route accepts only its own server's certificate
        reset_clusters()
        config.JupyterHub.internal_ssl = True
        for other in (None, "configurable-http-proxy", "jupyterhub.proxy.ConfigurableHTTPProxy",
                      "no.such.Proxy"):
            if other is not None:
                config.JupyterHub.proxy_class = other
            with pytest.raises(SystemExit, match=r'JupyterHub.proxy_class: must be "gpuspawner" '
                                                 "with SlurmBackend and internal_ssl"):
                check_hub_config(config)
            reset_clusters()
        for ours in ("gpuspawner", "gpuspawner.hub.proxy.GPUProxy", GPUProxy):
            config.JupyterHub.proxy_class = ours
            check_hub_config(config)
            reset_clusters()
        config.JupyterHub.internal_ssl = False
        config.SlurmBackend.allow_plain_http = True  # a trusted test cluster
        check_hub_config(config)
    finally:
        reset_clusters()
