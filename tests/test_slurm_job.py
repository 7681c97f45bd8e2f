"""The Slurm backend's pure pieces (no cluster): sbatch options from an allocation, the job
script (quoting, port report, PATH-free command), the readback check, the markers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuspawner.backends.base import (
    BackendUnavailable,
    LaunchFailed,
    LaunchRefused,
    NodeRuntime,
)
from gpuspawner.backends.slurm.backend import SlurmBackend, controller_down
from gpuspawner.backends.slurm.commands import SlurmClient, SlurmError, parse_job
from gpuspawner.backends.slurm.gres import gres_type
from gpuspawner.backends.slurm.job import (
    ADMIN_MARKER,
    admin_comment,
    allocation_of,
    check_extra_options,
    check_readback,
    gpu_positions,
    job_script,
    job_time,
    mem_mib,
    picked,
    plan_job,
    reported_port,
)
from gpuspawner.backends.slurm.ports import PORT_REPORTS
from gpuspawner.backends.spec import HomeMount, LaunchSpec, launch_spec
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import (
    Allocation,
    Bundle,
    GPUShare,
    Ledger,
    Node,
    NumaNode,
    Owner,
)
from gpuspawner.testing.port_sink import port_sink_api_url

REPO = Path(__file__).resolve().parents[1]
NODE1 = load_topology_file(REPO / "hub_config" / "slurm" / "node1.yaml")
GPU_A, GPU_B = sorted(NODE1.gpus, key=lambda g: g.index)
MiB = 2**20


def alloc_on(gpus: tuple[str, ...] = (GPU_B.uuid,), cpuset: tuple[int, ...] = (1,),
             memory: int = 300 * MiB) -> Allocation:
    return Allocation(id="a" * 32, owner=Owner("ann", "", ("g",)), node="node1",
                      gpus=tuple(GPUShare(u) for u in gpus), cpuset=cpuset, mems=(1,),
                      memory_bytes=memory, disk_bytes=0)


#: the API token of ann's server in these specs (its port report carries it)
ANN_TOKEN = "ann-server-token"


def report_when_awaited(token: str, port: int, timeout: float = 10.0) -> threading.Thread:
    """Report ``port`` for ``token`` (as the hub's handler would) as soon as a launch waits
    for it, from a thread."""
    def report() -> None:
        deadline = time.monotonic() + timeout
        while not PORT_REPORTS.report(token, port) and time.monotonic() < deadline:
            time.sleep(0.02)
    t = threading.Thread(target=report, daemon=True)
    t.start()
    return t


def spec_of(alloc: Allocation, **kw: object) -> LaunchSpec:
    args: dict = dict(name="jupyter-ann", user="ann", server="", allocation=alloc, image="x",
                      cmd=["/opt/jh/bin/jupyterhub-singleuser", "--debug"],
                      env={"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:8888/user/ann/",
                           "JUPYTERHUB_API_TOKEN": ANN_TOKEN},
                      uid=2001, gid=2001, port=8888, home=HomeMount("/home/ann", "/home/jovyan"))
    args.update(kw)
    return launch_spec(**args)


def test_mem_mib_rounds_up_and_is_never_zero() -> None:
    assert (mem_mib(0), mem_mib(1), mem_mib(MiB), mem_mib(MiB + 1)) == (1, 1, 1, 2)


def test_plan_pins_node_gpu_cores_and_memory() -> None:
    plan = plan_job(spec_of(alloc_on()), NODE1, partition="debug", time_limit="8:00:00",
                    extra=["--account=jhub"])
    opts = plan.options
    assert opts[0] == "--account=jhub"  # the admin's first: ours win
    for o in ("--job-name=jupyter-ann", "--nodelist=node1", "--ntasks=1", "--cpus-per-task=1",
              "--mem=300", f"--gres=gpu:{gres_type(GPU_B.uuid)}:1",
              "--gres-flags=enforce-binding", "--no-requeue", "--hold", "--chdir=/home/ann",
              "--comment=gpuspawner-submitted:" + "a" * 32, "--partition=debug",
              "--time=8:00:00", "--export=ALL"):
        assert o in opts
    assert plan.binding and plan.memory_mb == 300 and plan.workdir == "/home/ann"


def test_plan_drops_binding_for_gpus_on_two_numa_nodes_and_groups_models() -> None:
    both = alloc_on((GPU_A.uuid, GPU_B.uuid), (0, 1))
    plan = plan_job(spec_of(both), NODE1)
    assert not plan.binding and "--gres-flags=enforce-binding" not in plan.options
    assert plan.gres == f"gpu:{gres_type(GPU_A.uuid)}:1,gpu:{gres_type(GPU_B.uuid)}:1"
    assert plan_job(spec_of(both), NODE1, mode="model").gres == "gpu:FAKE:2"


@pytest.mark.parametrize("alloc, match", [
    (alloc_on(cpuset=()), "no cores"),
    (replace(alloc_on(), gpus=(GPUShare(GPU_B.uuid, 500),)), "share of 500"),
    (alloc_on(("GPU-nosuch",)), "has no GPU GPU-nosuch"),
])
def test_plan_refuses_what_slurm_cannot_express(alloc: Allocation, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_job(spec_of(alloc), NODE1)


@pytest.mark.parametrize("opt", ["--uid=0", "--gres=gpu:2", "-w", "--mem 5", "--export=NONE",
                                 "account=x"])
def test_extra_options_that_undo_pinning_are_refused(opt: str) -> None:
    with pytest.raises(ValueError):
        check_extra_options([opt])
    with pytest.raises(Exception, match="extra_sbatch_options"):
        SlurmBackend(extra_sbatch_options=[opt])


TRICKY = "a 'b' \"c\" $HOME `id` \\ ; x\ny"


def test_job_script_is_valid_bash_and_quotes_every_value(tmp_path: Path) -> None:
    spec = spec_of(alloc_on(), env={"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:8888/user/a/",
                                    "TRICKY": TRICKY})
    script = job_script(spec, python="/usr/bin/python3", prologue=["module load cuda"])
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert script.startswith("#!/bin/bash\n")
    assert "export HOME=/home/ann\n" in script  # the node's path, not the container's
    assert "module load cuda\n" in script
    assert "export JUPYTERHUB_SERVICE_URL=http://127.0.0.1:\"$port\"/user/a/" in script
    assert script.rstrip().endswith("exec /opt/jh/bin/jupyterhub-singleuser --debug")
    # the value comes back unchanged through bash
    env_only = script.split("module load cuda")[0]  # the exports, TRICKY over two lines
    out = subprocess.run(["bash", "-c", env_only + '\nprintf %s "$TRICKY"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == TRICKY


LISTEN = ("import os, socket, time; s = socket.socket(); "
          "s.bind(('127.0.0.1', int(os.environ['GPUSPAWNER_PORT']))); s.listen(); "
          "time.sleep(30)")


def test_job_script_picks_a_port_and_the_server_reports_it_once_it_listens(tmp_path: Path
                                                                          ) -> None:
    """Run the script with a stand-in server that listens on the picked port: the reporter
    sends the hub (the stand-in API, with the server's own token) that port, the one in
    JUPYTERHUB_SERVICE_URL and GPUSPAWNER_PORT; nothing is written to the job's Comment (no
    scontrol is called)."""
    called = tmp_path / "scontrol-called"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    fake.chmod(0o755)
    show = tmp_path / "show"
    show.write_text('#!/bin/sh\necho "$GPUSPAWNER_PORT $JUPYTERHUB_SERVICE_URL $PWD"\n'
                    f'exec /usr/bin/python3 -c "{LISTEN}"\n')
    show.chmod(0o755)
    spec = spec_of(alloc_on(), cmd=[str(show)], home=None,
                   env={"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:8888/user/ann/",
                        "JUPYTERHUB_API_TOKEN": "tok-listens",
                        "JUPYTERHUB_API_URL": port_sink_api_url()})
    script = job_script(spec, python="/usr/bin/python3", scontrol=str(fake), report_timeout=10)
    (tmp_path / "job.sh").write_text(script)

    async def launch() -> tuple[int, str]:
        fut = PORT_REPORTS.expect("tok-listens")
        proc = await asyncio.create_subprocess_exec(
            "bash", str(tmp_path / "job.sh"), stdout=asyncio.subprocess.PIPE,
            env={"SLURM_JOB_ID": "42", "PATH": os.environ["PATH"]})
        try:
            port = await asyncio.wait_for(fut, 15)
            assert proc.stdout is not None
            return port, (await proc.stdout.readline()).decode()
        finally:
            PORT_REPORTS.forget("tok-listens")
            proc.kill()
            await proc.wait()

    reported, line = asyncio.run(launch())
    port, url, cwd = line.split()
    assert int(port) == reported and 0 < reported < 65536 and cwd == "/tmp"
    assert url == f"http://127.0.0.1:{port}/user/ann/"
    assert not called.exists()


def test_a_port_another_process_listens_on_is_never_reported(tmp_path: Path) -> None:
    """The server does not listen on the picked port, another process does (here a child of
    the server): the reporter says so in the job's output and reports nothing."""
    serve = tmp_path / "serve"
    serve.write_text(f'#!/bin/sh\n/usr/bin/python3 -c "{LISTEN}" &\nsleep 30\n')
    serve.chmod(0o755)
    spec = spec_of(alloc_on(), cmd=[str(serve)], home=None,
                   env={"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:8888/user/ann/",
                        "JUPYTERHUB_API_TOKEN": "tok-other",
                        "JUPYTERHUB_API_URL": port_sink_api_url()})
    (tmp_path / "job.sh").write_text(job_script(spec, python="/usr/bin/python3",
                                                report_timeout=2))

    async def launch() -> tuple[bool, str]:
        fut = PORT_REPORTS.expect("tok-other")
        proc = await asyncio.create_subprocess_exec(
            "bash", str(tmp_path / "job.sh"), stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ["PATH"]}, start_new_session=True)
        try:
            assert proc.stderr is not None
            err = await asyncio.wait_for(proc.stderr.readline(), 15)
            return fut.done(), err.decode()
        finally:
            PORT_REPORTS.forget("tok-other")
            os.killpg(proc.pid, 9)
            await proc.wait()

    reported, err = asyncio.run(launch())
    assert not reported
    assert "was not reported to the hub: the server did not listen on it within 2 s" in err


def test_job_script_needs_an_absolute_command_and_shell_names() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        job_script(spec_of(alloc_on(), cmd=["jupyterhub-singleuser"]), python="/usr/bin/python3")
    with pytest.raises(ValueError, match="shell identifier"):
        job_script(spec_of(alloc_on(), env={"A-B": "1"}), python="/usr/bin/python3")


def test_backend_replaces_a_bare_singleuser_command() -> None:
    b = SlurmBackend(server_command="/opt/jh/bin/jupyterhub-singleuser")
    spec = b._command(spec_of(alloc_on(), cmd=["jupyterhub-singleuser", "--x"]))
    assert spec.cmd == ("/opt/jh/bin/jupyterhub-singleuser", "--x")


JOB = """JobId=7 JobName=jupyter-ann
   UserId=ann(2001) GroupId=ann(2001) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=node1
     Nodes=node1 CPU_IDs={cpus} Mem=300 GRES=gpu:{gtype}:1(IDX:{idx})
   Comment={comment}
   AdminComment={admin}
"""


def job_text(cpus: str = "1", idx: int = 1, comment: str = "gpuspawner-port=40001",
             admin: str = "") -> str:
    return JOB.format(cpus=cpus, gtype=gres_type(GPU_B.uuid), idx=idx, comment=comment,
                      admin=admin or admin_comment(alloc_on()))


def test_readback_agrees_with_the_allocation() -> None:
    assert gpu_positions(NODE1) == {GPU_A.uuid: 0, GPU_B.uuid: 1}
    assert check_readback(parse_job(job_text()), alloc_on(), NODE1, 300) == []


@pytest.mark.parametrize("text, word", [
    (job_text(cpus="0"), "CPU_IDs=0"),
    (job_text(idx=0), "(IDX:0)"),
    (job_text().replace("NodeList=node1", "NodeList=node2"), "runs on node2"),
    (job_text().replace("Mem=300", "Mem=200"), "Mem=200"),
])
def test_readback_names_each_difference(text: str, word: str) -> None:
    problems = check_readback(parse_job(text), alloc_on(), NODE1, 300)
    assert problems and word in "; ".join(problems)


def test_model_mode_checks_counts_and_records_the_pick() -> None:
    job = parse_job(job_text(cpus="0", idx=0))
    assert check_readback(job, alloc_on(), NODE1, 300, mode="model") == []
    got = picked(job, NODE1)
    assert got["cpu_ids"] == [0] and got["gpu_uuids"] == [GPU_A.uuid]


def test_markers_read_back() -> None:
    job = parse_job(job_text())
    assert allocation_of(job) == alloc_on().to_json()
    assert reported_port(job) == 40001
    assert reported_port(parse_job(job_text(comment="gpuspawner-port=99999"))) is None
    assert allocation_of(parse_job(job_text(admin="someone else's"))) is None
    assert allocation_of(parse_job(job_text(admin=ADMIN_MARKER + "[1]"))) is None


def test_controller_down_is_told_from_a_refusal() -> None:
    assert controller_down(SlurmError(["squeue"], None, "timed out after 3 s"))
    assert controller_down(SlurmError(["squeue"], 1, "slurm_load_jobs error: Unable to "
                                      "contact slurm controller (connect failure)"))
    assert not controller_down(SlurmError(["sbatch"], 1, "Batch job submission failed: "
                                          "Requested node configuration is not available"))


def test_listen_ip_and_cert_names_follow_the_node() -> None:
    b = SlurmBackend()
    b.bind({"node1": NodeRuntime("node1", "198.18.2.3", "x", NODE1)})
    assert b.listen_ip == "127.0.0.1"
    assert b.cert_alt_names(alloc_on(), {}) == ["IP:198.18.2.3"]
    b.bind({"node1": NodeRuntime("node1", "gpu01.example", "x", NODE1)})
    assert b.cert_alt_names(alloc_on(), {}) == ["DNS:gpu01.example"]


# --------------------------------------------------------------------------- the backend's
# decisions against a stand-in client (no cluster): node failure, refusals, submit timeout


class FakeClient(SlurmClient):
    """Answers the Slurm commands from canned text; records every command."""

    def __init__(self, job: str | None = None, node_state: str = "IDLE",
                 sbatch_error: SlurmError | None = None) -> None:
        super().__init__(conf=None)
        self.job, self.node_state, self.sbatch_error = job, node_state, sbatch_error
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *args: str, stdin: str | None = None,
                  timeout: float | None = None) -> str:
        self.calls.append(args)
        if args[0] == "sbatch":
            if self.sbatch_error is not None:
                raise self.sbatch_error
            return "17\n"
        if args[:3] == ("scontrol", "show", "job"):
            if self.job is None:
                raise SlurmError(list(args), 1, "slurm_load_jobs error: Invalid job id "
                                 "specified")
            return self.job
        if args[:3] == ("scontrol", "show", "node"):
            return (f"NodeName=node1 Arch=x86_64 CoresPerSocket=1\n   CPUTot=2 "
                    f"RealMemory=4000\n   State={self.node_state} ThreadsPerCore=1\n")
        return ""


def fake_backend(client: FakeClient, **traits: object) -> SlurmBackend:
    b = SlurmBackend(python="/usr/bin/python3", **traits)
    b.bind({"node1": NodeRuntime("node1", "127.0.0.1", "x", NODE1)})
    b._client = client
    return b


def state_job(state: str, exit_code: str = "0:0") -> str:
    return job_text().replace("JobState=RUNNING", f"JobState={state}").replace(
        "Dependency=(null)", f"Dependency=(null)\n   ExitCode={exit_code}")


def run(coro):  # noqa: ANN001, ANN201 (any coroutine, its result)
    return asyncio.run(coro)


@pytest.mark.parametrize("node_state", ["DOWN*+NOT_RESPONDING", "IDLE*", "DOWN"])
@pytest.mark.parametrize("job_state", ["RUNNING", "COMPLETING"])
def test_poll_raises_unavailable_for_a_job_on_a_dead_node(node_state: str, job_state: str
                                                          ) -> None:
    b = fake_backend(FakeClient(state_job(job_state), node_state=node_state))
    with pytest.raises(BackendUnavailable) as e:
        run(b.poll({"node": "node1", "job_id": 7, "started": True}))
    assert e.value.node == "node1"


def test_polls_share_one_node_state_call_per_period() -> None:
    """Ten polls of running servers make ten ``scontrol show job -d`` and one ``scontrol
    show node``; once ``node_state_max_age`` is over, a dead node is seen by the next poll."""
    client = FakeClient(job_text(), node_state="MIXED")
    b = fake_backend(client, node_state_max_age=60)
    state = {"node": "node1", "job_id": 7, "started": True}

    async def polls() -> list[int | None]:
        return list(await asyncio.gather(*(b.poll(state) for _ in range(10))))

    assert run(polls()) == [None] * 10
    kinds = [c[:3] for c in client.calls]
    assert kinds.count(("scontrol", "show", "job")) == 10
    assert kinds.count(("scontrol", "show", "node")) == 1
    client.node_state = "DOWN*+NOT_RESPONDING"
    assert run(b.poll(state)) is None  # the cached answer, still fresh
    b.node_state_max_age = 0.0  # the period is over
    with pytest.raises(BackendUnavailable):
        run(b.poll(state))


@pytest.mark.parametrize("job, status", [
    (job_text(), None),
    (state_job("FAILED", "2:0"), 2),
    (state_job("CANCELLED", "0:15"), 1),
    (state_job("NODE_FAIL", "0:0"), 1),
    (state_job("COMPLETED", "0:0"), 0),
    # the script has ended, Slurm is still ending the job: not yet known whether it completed
    # (a notebook job that exited 0 was read as failed when a poll fell here)
    (state_job("COMPLETING", "0:0"), None),
    (state_job("PENDING"), 1),
    (None, 0),
])
def test_poll_status_by_job_state(job: str | None, status: int | None) -> None:
    b = fake_backend(FakeClient(job, node_state="MIXED"))
    assert run(b.poll({"node": "node1", "job_id": 7, "started": True})) == status


@pytest.mark.parametrize("error, kind", [
    (SlurmError(["sbatch"], 1, "Batch job submission failed: Requested node configuration "
                "is not available"), "LaunchRefused"),
    (SlurmError(["sbatch"], 1, "Batch job submission failed: Invalid account"),
     "LaunchFailed"),
    (SlurmError(["sbatch"], None, "timed out after 30 s"), "BackendUnavailable"),
])
def test_sbatch_errors_become_typed_backend_errors(error: SlurmError, kind: str) -> None:
    b = fake_backend(FakeClient(sbatch_error=error))
    state: dict = {}
    with pytest.raises(Exception) as e:
        run(b.launch(spec_of(alloc_on(), home=None), state, lambda p, m: None))
    assert type(e.value).__name__ == kind
    assert "job_id" not in state


def test_a_job_that_stays_pending_is_cancelled_with_slurms_reason() -> None:
    pending = state_job("PENDING").replace("Reason=None", "Reason=Resources")
    client = FakeClient(pending)
    b = fake_backend(client, submit_timeout=0.5)
    state: dict = {}
    with pytest.raises(LaunchFailed, match="Reason=Resources"):
        run(b.launch(spec_of(alloc_on(), home=None), state, lambda p, m: None))
    assert state["job_id"] == 17
    assert ("scancel", "17") in client.calls
    marked = [c for c in client.calls if c[:2] == ("scontrol", "update")]
    assert marked and marked[0][3] == "AdminComment=" + admin_comment(alloc_on())
    assert ("scontrol", "release", "17") in client.calls


def test_a_gpu_share_is_refused_before_anything_is_submitted() -> None:
    client = FakeClient()
    b = fake_backend(client)
    alloc = replace(alloc_on(), gpus=(GPUShare(GPU_B.uuid, 250),))
    with pytest.raises(LaunchRefused, match="share of 250"):
        run(b.launch(spec_of(alloc, home=None), {}, lambda p, m: None))
    assert client.calls == []


@pytest.mark.parametrize("node_state", ["IDLE+DRAIN", "DOWN*+NOT_RESPONDING", "IDLE*"])
def test_a_node_that_cannot_take_jobs_is_unavailable_before_submit(node_state: str) -> None:
    client = FakeClient(node_state=node_state)
    b = fake_backend(client)
    with pytest.raises(BackendUnavailable) as e:
        run(b.launch(spec_of(alloc_on(), home=None), {}, lambda p, m: None))
    assert e.value.node == "node1" and node_state.split("+")[0].rstrip("*") in str(e.value)
    assert not [c for c in client.calls if c[0] == "sbatch"]


@pytest.mark.parametrize("trait", ["submit_timeout", "port_timeout", "stop_timeout",
                                   "command_timeout"])
def test_timeouts_must_be_positive(trait: str) -> None:
    with pytest.raises(Exception, match=f"SlurmBackend.{trait}: must be > 0"):
        SlurmBackend(**{trait: 0})


def one_numa_node1() -> Node:
    """node1 as if its two cores were on one NUMA node (a real socket has many cores, so
    Slurm's pick among them may differ from the ledger's)."""
    mem = sum(n.memory_bytes for n in NODE1.numa_nodes)
    return replace(NODE1, numa_nodes=(NumaNode(0, (0, 1), mem),),
                   gpus=tuple(replace(g, numa_node=0) for g in NODE1.gpus))


@pytest.mark.parametrize("free", [True, False], ids=["adopted", "held"])
def test_the_ledger_adopts_slurms_core_when_it_is_free(free: bool) -> None:
    """Slurm granted the other core of the GPU's NUMA node: the ledger takes it (and the job
    is marked again with the adopted allocation) when it is free, else the launch fails and
    the job is cancelled."""
    node = one_numa_node1()
    ledger = Ledger([node])
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=300 * MiB, gpus=1,
                                  gpu_models=(GPU_B.model,)), Owner("ann"))
    if alloc.gpu_uuids != [GPU_B.uuid]:  # the job text holds GPU B
        alloc = ledger.adopt(alloc.id, gpus=[GPU_B.uuid])
    other = 1 - alloc.cpuset[0]
    if not free:
        ledger.reserve(Bundle(cores=1), Owner("bob"))  # takes the other core
    client = FakeClient(job_text(cpus=str(other)), node_state="MIXED")
    b = SlurmBackend(python="/usr/bin/python3", submit_timeout=5, port_timeout=5)
    b.bind({"node1": NodeRuntime("node1", "127.0.0.1", "x", node)})
    b._client = client
    b.ledger = ledger
    state: dict = {}
    if free:
        report_when_awaited(ANN_TOKEN, 40001)
        ip, port = run(b.launch(spec_of(alloc, home=None), state, lambda p, m: None))
        assert port == 40001
        adopted = ledger.get(alloc.id)
        assert adopted.cpuset == (other,) and adopted.gpu_uuids == [GPU_B.uuid]
        marks = [c[3] for c in client.calls if c[:2] == ("scontrol", "update")]
        assert marks[-1] == "AdminComment=" + admin_comment(adopted)
    else:
        with pytest.raises(LaunchFailed, match="cannot adopt.*held"):
            run(b.launch(spec_of(alloc, home=None), state, lambda p, m: None))
        assert ("scancel", "17") in client.calls
        assert ledger.get(alloc.id) == alloc


# --------------------------------------------------------------------------- notebook jobs
# (a launch spec with port 0 from the job runner: no port, the job's own --time, its output
# read back from the output file)


def notebook_job_spec(**kw: object) -> LaunchSpec:
    """A notebook job's spec as the job runner makes it (port 0, a time limit)."""
    args: dict = dict(name="job-ann--" + "f" * 32, user="ann", server="job/" + "f" * 32,
                      allocation=alloc_on(), image="x",
                      cmd=["python3", "-c", "print('the job')"],
                      env={"GPUSPAWNER_JOB_NAME": "n", "TRICKY": TRICKY}, uid=2001, gid=2001,
                      port=1, home=HomeMount("/home/ann", "/home/jovyan"))
    args.update(kw)
    return replace(launch_spec(**args), port=0, time_limit=100)


def test_job_time_is_whole_minutes_past_the_limit_and_its_margin() -> None:
    assert [job_time(s) for s in (1, 59, 60, 61, 3600)] == ["2", "2", "2", "3", "61"]
    assert job_time(120, 0) == "2" and job_time(121, 0) == "3"
    with pytest.raises(ValueError):
        job_time(0)
    with pytest.raises(Exception, match="job_time_margin: must be >= 0"):
        SlurmBackend(job_time_margin=-1)


def test_a_notebook_jobs_script_picks_no_port_and_execs_the_job_python(tmp_path: Path) -> None:
    b = SlurmBackend(job_python="/opt/jobenv/bin/python")
    spec = b._command(notebook_job_spec(home=None))
    assert spec.cmd[0] == "/opt/jobenv/bin/python"
    # a server's python3 stays (only a job's program is the job's Python)
    assert b._command(spec_of(alloc_on(), cmd=["python3", "x"])).cmd[0] == "python3"
    script = job_script(spec, python="/usr/bin/python3")
    assert "port=" not in script and "Comment=" not in script and "# gpuspawner: notebook job" \
        in script
    assert script.rstrip().endswith("exec /opt/jobenv/bin/python -c 'print('\"'\"'the job'"
                                    "\"'\"')'")
    path = tmp_path / "job.sh"
    path.write_text(script.replace("/opt/jobenv/bin/python", "/usr/bin/python3"))
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout == "the job\n"


class JobClient(FakeClient):
    """A notebook job's commands: sbatch records its options, the job has ended (COMPLETED)
    by the time it is first shown, with its output file."""

    def __init__(self, out: Path, state: str = "COMPLETED", exit_code: str = "0:0") -> None:
        job = state_job(state, exit_code).replace("JobName=jupyter-ann",
                                                  "JobName=job-ann--" + "f" * 32)
        super().__init__(job + f"   StdOut={out}\n", node_state="MIXED")


def test_a_notebook_job_gets_its_time_limit_as_time_and_may_end_before_it_is_seen(
        tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    out.write_bytes(b"log\n" * 10)
    client = JobClient(out)
    b = fake_backend(client, time_limit="8:00:00", job_time_margin=60)
    state: dict = {}
    ip, port = run(b.launch(notebook_job_spec(), state, lambda p, m: None))
    assert (ip, port) == ("127.0.0.1", 0)
    (sbatch,) = [c for c in client.calls if c[0] == "sbatch"]
    assert "--time=3" in sbatch and "--time=8:00:00" not in sbatch  # 100 s + 60 s -> 3 min
    assert state["kind"] == "job" and (state["uid"], state["gid"]) == (2001, 2001)
    assert state["output_path"] == str(out)
    assert run(b.poll(state)) == 0
    # the file is this test's: read (and removed) as its owner
    state = dict(state, uid=os.geteuid(), gid=os.getegid())
    assert run(b.read_output(state, 8)) == b"log\nlog\n"  # the last max_bytes
    assert run(b.read_output({k: v for k, v in state.items() if k != "kind"}, 8)) is None
    run(b.cleanup(None, state))
    assert not out.exists() and ("scancel", "17") in client.calls


@pytest.mark.parametrize("job_state, exit_code, status, failed", [
    ("COMPLETED", "0:0", 0, False),
    ("FAILED", "1:0", 1, False),
    ("CANCELLED", "0:15", 143, False),  # scancel from outside: as a container's SIGTERM
    ("TIMEOUT", "0:9", 137, False),
    ("NODE_FAIL", "0:15", 143, True),
    ("OUT_OF_MEMORY", "0:125", 253, False),
])
def test_a_notebook_jobs_end_as_the_job_runner_reads_it(
        job_state: str, exit_code: str, status: int, failed: bool) -> None:
    b = fake_backend(FakeClient(state_job(job_state, exit_code), node_state="MIXED"))
    state = {"node": "node1", "job_id": 7, "started": True, "kind": "job"}
    assert run(b.poll(state)) == status
    why = run(b.node_failure(state))
    assert (why is not None) == failed
    if failed:
        assert why.startswith("Slurm job 7 ended NODE_FAIL on node1")
    report = run(b.exit_report(state))
    assert ("(out of memory)" in report) == (job_state == "OUT_OF_MEMORY")
    # a server's poll is as before: at least 1 unless COMPLETED
    assert run(b.poll({**state, "kind": None})) == (0 if job_state == "COMPLETED" else
                                                    max(1, int(exit_code.split(":")[0])))
