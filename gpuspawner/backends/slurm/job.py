"""One user server as a Slurm batch job: the sbatch options, the job script and the check of
what Slurm granted against the allocation. Everything here is pure (spec in, text out); the
:class:`~gpuspawner.backends.slurm.backend.SlurmBackend` runs the commands.

Markers that the backend reads back with ``scontrol show job -d`` (scontrol(1)):

* ``AdminComment=gpuspawner:<allocation JSON>``: which allocation the job holds. Only a Slurm
  administrator may set AdminComment (scontrol(1) "AdminComment ... Can only be set by a Slurm
  administrator"), so the job's user cannot rewrite it; the job's ``Comment`` can be changed
  by its owner (seen with Slurm 22.05: ``scontrol update jobid=N comment=x`` as the owner
  exits 0). A Comment is also capped at 1024 characters (1025 was refused with "Pathname of a
  file, directory or other parameter too long"), too short for an allocation with many GPUs
  or groups; AdminComment took 70,000.
* ``Comment=gpuspawner-submitted:<allocation id>`` from sbatch. The port is never written
  there (every user may read a job's Comment where Slurm's ``PrivateData`` does not hide it, and
  another user who learnt it could bind it first): the server reports it to the hub itself,
  with its own API token, once it listens (:mod:`.ports`, :func:`job_script`).

Units: memory in MiB for Slurm (``--mem``, ``Mem=``), bytes in the allocation.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ...placement import Allocation, Node
from ...placement.units import GPU_MILLI
from ..spec import LaunchSpec
from .commands import JobInfo
from .gres import gres_devices, gres_type
from .ports import REPORT_PORT

__all__ = [
    "ADMIN_MARKER",
    "PORT_MARKER",
    "SUBMIT_MARKER",
    "FORBIDDEN_OPTIONS",
    "JobPlan",
    "admin_comment",
    "allocation_of",
    "check_readback",
    "gpu_positions",
    "job_script",
    "expand_output",
    "job_time",
    "mem_mib",
    "output_path",
    "picked",
    "plan_job",
    "reported_port",
]

#: AdminComment prefix of our jobs; the allocation JSON follows
ADMIN_MARKER = "gpuspawner:"
#: Comment of a job just submitted (then the allocation id)
SUBMIT_MARKER = "gpuspawner-submitted:"
#: Comment by which jobs of earlier versions reported their port (no longer written or read:
#: every user could read it; the server reports its port to the hub itself, :mod:`.ports`)
PORT_MARKER = "gpuspawner-port="

#: sbatch options the backend sets itself; ``extra_sbatch_options`` may not override them
FORBIDDEN_OPTIONS = (
    "--uid", "--gid", "--job-name", "-J", "--nodelist", "-w", "--exclude", "-x", "--nodes",
    "-N", "--ntasks", "-n", "--cpus-per-task", "-c", "--mem", "--mem-per-cpu", "--mem-per-gpu",
    "--gres", "--gpus", "-G", "--gpus-per-node", "--gpus-per-task", "--gres-flags",
    "--comment", "--output", "-o", "--error", "-e", "--chdir", "-D", "--hold", "-H",
    "--requeue", "--no-requeue", "--export", "--export-file", "--get-user-env", "--wrap",
    "--exclusive", "--oversubscribe", "-s", "--array", "-a",
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")

#: a free TCP port of the given address, printed (the kernel picks it: bind to port 0)
_PICK_PORT = ("import socket,sys;h=sys.argv[1];"
              "s=socket.socket(socket.AF_INET6 if ':' in h else socket.AF_INET);"
              "s.bind((h,0));print(s.getsockname()[1])")


def mem_mib(memory_bytes: int) -> int:
    """``--mem`` in MiB for ``memory_bytes``: rounded up, at least 1 (``--mem=0`` would ask
    for all of the node's memory, sbatch(1))."""
    return max(1, -(-int(memory_bytes) // 2**20))


def gpu_positions(node: Node) -> dict[str, int]:
    """Each GPU's (or MIG instance's) ``IDX`` as Slurm reports it: its position among the
    node's GRES devices in gres.conf, which :func:`~gpuspawner.backends.slurm.gres.gres_conf`
    writes in :func:`~gpuspawner.backends.slurm.gres.gres_devices` order (GPUs by ``index``,
    a MIG-enabled GPU replaced by its instances)."""
    return {u: i for i, (u, _g, _m) in enumerate(gres_devices(node))}


def check_extra_options(options: Sequence[str]) -> None:
    """Refuse admin sbatch options that would undo the pinning or the identity of the job.

    Raises:
        ValueError: the first option of :data:`FORBIDDEN_OPTIONS` found (``--mem=1`` and
            ``--mem 1`` alike).
    """
    for opt in options:
        name = re.split(r"[=\s]", opt.strip(), maxsplit=1)[0]
        if name in FORBIDDEN_OPTIONS:
            raise ValueError(f"{opt!r}: the backend sets {name} itself")
        if not name.startswith("-"):
            raise ValueError(f"{opt!r}: write each sbatch option as --name=value")


@dataclass(frozen=True)
class JobPlan:
    """What :func:`plan_job` decided.

    Attributes:
        options: sbatch arguments (the script goes on stdin).
        gres: the ``--gres`` value ("" without GPUs).
        binding: whether ``--gres-flags=enforce-binding`` is set.
        memory_mb: ``--mem`` in MiB.
        workdir: the job's working directory on the node.
    """

    options: tuple[str, ...]
    gres: str
    binding: bool
    memory_mb: int
    workdir: str


def _gres(alloc: Allocation, node: Node, mode: str) -> tuple[str, bool]:
    """The ``--gres`` value and whether enforce-binding applies.

    exact: ``gpu:<gres_type(uuid)>:1`` per GPU. model: ``gpu:<model>:N`` per model. Binding
    only when every GPU sits on one NUMA node: Slurm 22.05 refused two GPUs of different
    sockets with enforce-binding outright (``FAILED BadConstraints``, docs/slurm.md).

    MIG instances (exact mode only): ``gpu:<gres_type(MIG uuid)>:1`` each, bound like GPUs by
    their parent GPU's NUMA node. Model mode refuses them: there Slurm picks the devices and
    the ledger adopts its pick, which it can do for whole GPUs only.

    Raises:
        ValueError: a GPU share (milli < 1000), a GPU or MIG instance the node does not have,
            a MIG instance in model mode, or a model that is no valid GRES type.
    """
    if not alloc.gpus and not alloc.mig:
        return "", False
    parts: list[str] = []
    numa: set[int | None] = set()
    models: dict[str, int] = {}
    if alloc.mig:
        if mode != "exact":
            raise ValueError("MIG instances need the Slurm backend's gpu_mode 'exact' (one "
                             "GRES type per device); gpu_mode 'model' lets Slurm pick devices, "
                             "which the ledger can adopt for whole GPUs only")
        parents = {m.uuid: g for _u, g, m in gres_devices(node) if m is not None}
        for inst in alloc.mig:
            if inst.uuid not in parents:
                raise ValueError(f"node {node.name} has no MIG instance {inst.uuid}")
            numa.add(parents[inst.uuid].numa_node)
            parts.append(f"gpu:{gres_type(inst.uuid)}:1")
    for share in alloc.gpus:
        if share.milli != GPU_MILLI:
            raise ValueError(f"GPU {share.uuid}: a share of {share.milli} milli-GPU cannot be "
                             "expressed as a Slurm GRES (whole GPUs only)")
        try:
            gpu = node.gpu(share.uuid)
        except KeyError as e:
            raise ValueError(str(e.args[0])) from None
        numa.add(gpu.numa_node)
        if mode == "exact":
            parts.append(f"gpu:{gres_type(gpu.uuid)}:1")
        else:
            if not _MODEL.match(gpu.model):
                raise ValueError(f"GPU {gpu.uuid}: model {gpu.model!r} is no valid GRES type")
            models[gpu.model] = models.get(gpu.model, 0) + 1
    if mode != "exact":
        parts = [f"gpu:{m}:{n}" for m, n in models.items()]
    return ",".join(parts), len(numa) == 1 and None not in numa


def job_time(seconds: int, margin: int = 60) -> str:
    """A notebook job's ``--time`` in whole minutes (sbatch(1): "minutes"): its time limit
    plus ``margin`` seconds, rounded up. Slurm's limit is the backstop for a hub that is down
    when the limit passes; the hub stops the job at its limit itself (SIGTERM, then SIGKILL
    after Slurm's KillWait), before Slurm would.

    Raises:
        ValueError: a time limit below 1 s or a negative margin.
    """
    if seconds < 1 or margin < 0:
        raise ValueError(f"a job's time limit must be >= 1 s and its margin >= 0, got "
                         f"{seconds} and {margin}")
    return str(-(-(int(seconds) + int(margin)) // 60))


def output_path(job: JobInfo, pattern: str) -> str:
    """The job's output file: Slurm's ``StdOut`` (expanded by scontrol), else ``pattern`` (the
    ``--output`` given) with the job id (``%j``) and name (``%x``) filled in (sbatch(1),
    "filename pattern")."""
    return expand_output(job.fields.get("StdOut", "") or pattern, job.job_id, job.name)


def expand_output(pattern: str, job_id: int | str, name: str) -> str:
    """``pattern`` with sbatch's ``%j`` (job id) and ``%x`` (job name) filled in."""
    return pattern.replace("%j", str(job_id)).replace("%x", name)


def workdir_of(spec: LaunchSpec) -> str:
    """The job's working directory: the home's path on the node (a job runs in the node's own
    file system: no mount), else the spec's working directory, else ``/tmp``."""
    if spec.home is not None:
        return spec.home.host_path
    return spec.working_dir or "/tmp"


def plan_job(spec: LaunchSpec, node: Node, *, mode: str = "exact", partition: str = "",
             time_limit: str = "", output: str = "/tmp/gpuspawner-%x-%j.out",
             extra: Sequence[str] = ()) -> JobPlan:
    """The sbatch options of one server (sbatch(1)).

    ``extra`` (the admin's options) come first, ours after them. Ours: ``--job-name`` (the
    object name), ``--nodelist`` (the allocation's node), one task with
    ``--cpus-per-task=len(cpuset)``, ``--mem`` in MiB, ``--gres`` (exact: one per-device type
    per GPU; model: ``gpu:<model>:N``) with ``--gres-flags=enforce-binding`` when the GPUs sit
    on one NUMA node, ``--no-requeue`` (a requeued job would come back PENDING on other
    devices), ``--hold`` (the backend sets the AdminComment, then releases it: the job never
    runs unmarked), ``--chdir``, ``--output`` and ``--comment`` (:data:`SUBMIT_MARKER`),
    ``--export=ALL`` (the job gets the submitting environment, which the backend keeps to
    ``PATH`` and ``SLURM_CONF``), ``--partition`` and ``--time`` when set.

    Raises:
        ValueError: an empty cpuset (a job needs a core), a GPU the node lacks, a GPU share,
            a bad model (see :func:`_gres`), or a forbidden extra option.
    """
    check_extra_options(extra)
    alloc = spec.allocation
    if not alloc.cpuset:
        raise ValueError("the allocation has no cores; a Slurm job needs at least one")
    if mode not in ("exact", "model"):
        raise ValueError(f"unknown gpu_mode {mode!r}")
    gres, binding = _gres(alloc, node, mode)
    memory_mb = mem_mib(alloc.memory_bytes)
    workdir = workdir_of(spec)
    opts = [*extra, f"--job-name={spec.name}", f"--nodelist={alloc.node}", "--nodes=1",
            "--ntasks=1", f"--cpus-per-task={len(alloc.cpuset)}", f"--mem={memory_mb}"]
    if gres:
        opts.append(f"--gres={gres}")
        if binding:
            opts.append("--gres-flags=enforce-binding")
    opts += ["--no-requeue", "--hold", f"--chdir={workdir}", f"--output={output}",
             f"--comment={SUBMIT_MARKER}{alloc.id}", "--export=ALL"]
    if partition:
        opts.append(f"--partition={partition}")
    if time_limit:
        opts.append(f"--time={time_limit}")
    return JobPlan(tuple(opts), gres, binding, memory_mb, workdir)


def home_lines(spec: LaunchSpec) -> list[str]:
    """Shell lines by which the job, as the user on its node, applies the home rules
    (:func:`gpuspawner.backends.home.ensure_home`) where the server runs: a missing home is
    moved from its 0.x name (a folder of the user's) or made 0700 in its parent folder; a
    missing parent (the shared file system not mounted on the node) is exit 73 naming the
    node and the folder; a home that is not a folder of the user's is exit 74. Nothing is
    made on the hub's machine. No lines without a home."""
    if spec.home is None:
        return []
    q = shlex.quote
    home = spec.home.host_path
    parent = os.path.dirname(os.path.normpath(home)) or "."
    lines = [
        f"gps_home={q(home)} gps_parent={q(parent)}",
        'gps_node="${SLURMD_NODENAME:-$(hostname)}"',
        'if [ ! -e "$gps_home" ] && [ ! -L "$gps_home" ]; then',
        '  [ -d "$gps_parent" ] || { echo "gpuspawner: node $gps_node: the folder $gps_parent'
        ' of the home $gps_home does not exist there: is the shared file system mounted on'
        ' that node?" >&2; exit 73; }',
    ]
    legacy = spec.home.legacy_path
    if legacy and legacy != home:
        lines += [f"  gps_legacy={q(legacy)}",
                  '  if [ -d "$gps_legacy" ] && [ ! -L "$gps_legacy" ] && [ -O "$gps_legacy" ];'
                  ' then mv -T -- "$gps_legacy" "$gps_home" 2>/dev/null || true; fi']
    lines += [
        # another server of the same user may make it at the same time: that is fine
        '  mkdir -m 0700 -- "$gps_home" 2>/dev/null || [ -d "$gps_home" ] || { echo'
        ' "gpuspawner: node $gps_node: cannot make the home $gps_home" >&2; exit 73; }',
        "fi",
        'if [ -L "$gps_home" ] || [ ! -d "$gps_home" ] || [ ! -O "$gps_home" ]; then',
        '  echo "gpuspawner: node $gps_node: home $gps_home belongs to uid'
        ' $(stat -c %u -- "$gps_home"), not to uid $(id -u): refused; an admin must check'
        ' which user it belongs to" >&2; exit 74',
        "fi",
    ]
    return lines


def job_script(spec: LaunchSpec, *, python: str, scontrol: str = "scontrol",
               prologue: Sequence[str] = (), listen: str = "127.0.0.1",
               report_timeout: float = 30.0) -> str:
    """The batch script of one server (or notebook job), built from the spec alone (never
    from ``user_options``).

    A bash script that exports ``spec.env`` (every value quoted with :func:`shlex.quote`;
    ``HOME`` is the home's path on the node), runs the admin's ``prologue`` lines, changes to
    the working directory, picks a free port of the server's address with ``python`` (bind
    to port 0: the kernel chooses), puts the port into ``JUPYTERHUB_SERVICE_URL`` (where
    jupyterhub-singleuser 5/6 reads its address and port; it cannot take port 0: a URL
    without a port means 80) and ``GPUSPAWNER_PORT``, starts the reporter
    (:data:`~.ports.REPORT_PORT`, with ``python``) beside it and ``exec``\\ s ``spec.cmd``: the
    reporter tells the hub the port, with the server's own API token, only once the server's
    process (the script's PID, kept by ``exec``) listens on it, at most ``report_timeout``
    seconds after the start. The port is published nowhere else. Jobs share their node's
    network, so a fixed port could be taken; batchspawner's ``batchspawner-singleuser``
    likewise picks the port on the node before the server starts and reports it to the hub
    with the server's token.

    A notebook job's spec (``port`` 0: nothing listens) gets no port: the script exports the
    environment, runs the prologue, applies the home rules, changes to the working directory
    and ``exec``\\ s the job's program (``python -c`` :mod:`gpuspawner.jobs.execute`), whose
    standard output (the log and the result frame) is the job's ``--output`` file.

    Exit codes of the script before the server runs: 70 (no working directory), 71 (no free
    port), 73 and 74 (the home: :func:`home_lines`).

    Args:
        spec: the server.
        python: absolute path of a Python 3 on the node (only its standard library is used).
        scontrol: the scontrol command on the node (unused: kept for callers).
        report_timeout: seconds the reporter waits for the server to listen.
        prologue: admin shell lines run before the server (``module load ...``).
        listen: the address to bind when the spec has no ``JUPYTERHUB_SERVICE_URL``.

    Raises:
        ValueError: an environment name that is no shell identifier, or a command whose first
            word is not an absolute path (the job's PATH is not the hub's).
    """
    env = dict(spec.env)
    if spec.home is not None:
        env["HOME"] = spec.home.host_path
    url = env.pop("JUPYTERHUB_SERVICE_URL", "")
    if not spec.cmd or not spec.cmd[0].startswith("/"):
        raise ValueError(f"the server command must start with an absolute path, got "
                         f"{spec.cmd[:1]!r}")
    q = shlex.quote
    what = "notebook job" if spec.port == 0 else "server"
    lines = ["#!/bin/bash",
             f"# gpuspawner: {what} {spec.name} (allocation {spec.allocation.id}), written by",
             "# SlurmBackend from the launch spec."]
    for key in sorted(env):
        if not _ENV_NAME.match(key):
            raise ValueError(f"environment name {key!r} is not a shell identifier")
        lines.append(f"export {key}={q(str(env[key]))}")
    lines += list(prologue)
    workdir = workdir_of(spec)
    host = listen
    before = after = ""
    if url:
        parts = urlsplit(url)
        host = parts.hostname or "0.0.0.0"
        netloc_host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else (
            parts.hostname or "")
        before = urlunsplit((parts.scheme, netloc_host + ":", "", "", ""))
        after = urlunsplit(("", "", parts.path, parts.query, parts.fragment))
    lines += home_lines(spec)
    lines.append(
        f"cd -- {q(workdir)} || {{ echo 'gpuspawner: cannot enter {workdir}' >&2; exit 70; }}")
    if spec.port == 0:  # a notebook job: no port to pick or report
        lines.append("exec " + " ".join(q(a) for a in spec.cmd))
        return "\n".join(lines) + "\n"
    lines += [
        f"port=$({q(python)} -c {q(_PICK_PORT)} {q(host)}) "
        f"|| {{ echo 'gpuspawner: no free port on {host}' >&2; exit 71; }}",
        'export GPUSPAWNER_PORT="$port"',
    ]
    if url:
        lines.append(f'export JUPYTERHUB_SERVICE_URL={q(before)}"$port"{q(after)}')
    # the server reports its port itself once it listens (never a field others read)
    lines.append(f'{q(python)} -c {q(REPORT_PORT)} "$$" "$port" {float(report_timeout):g} &')
    lines.append("exec " + " ".join(q(a) for a in spec.cmd))
    return "\n".join(lines) + "\n"


def admin_comment(alloc: Allocation) -> str:
    """The AdminComment of the allocation's job: :data:`ADMIN_MARKER` + its JSON."""
    return ADMIN_MARKER + alloc.to_json()


def allocation_of(job: JobInfo) -> str | None:
    """The allocation JSON a job of ours carries in its AdminComment, None for other jobs
    (or an AdminComment that is no JSON object with an ``id``)."""
    text = job.fields.get("AdminComment", "")
    if not text.startswith(ADMIN_MARKER):
        return None
    body = text[len(ADMIN_MARKER):]
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return body if isinstance(data, dict) and "id" in data else None


def reported_port(job: JobInfo) -> int | None:
    """The port the job reported in its Comment (``gpuspawner-port=N``), None before it did
    or for a value that is no port 1..65535."""
    text = job.comment
    if not text.startswith(PORT_MARKER):
        return None
    value = text[len(PORT_MARKER):].strip()
    if not value.isdigit() or not 0 < int(value) < 65536:
        return None
    return int(value)


def picked(job: JobInfo, node: Node) -> dict[str, Any]:
    """What Slurm gave the job on ``node`` (JSON-able): ``node``, ``cpu_ids``, ``memory_mb``
    and ``gpus`` ({GRES type: [IDX, ...]}) with ``gpu_uuids`` (the node's GPUs at those IDX
    positions, :func:`gpu_positions`), for state and the ledger to adopt (model mode)."""
    d = job.node_detail(node.name)
    by_pos = {pos: uuid for uuid, pos in gpu_positions(node).items()}
    gpus = job.gres_indices(node.name)
    return {
        "node": node.name if d is not None else "",
        "cpu_ids": list(d.cpu_ids) if d is not None else [],
        "memory_mb": d.memory_mb if d is not None else None,
        "gpus": {t: list(i) for t, i in gpus.items()},
        "gpu_uuids": [by_pos.get(i, f"IDX {i}") for t in sorted(gpus) for i in gpus[t]],
    }


def check_readback(job: JobInfo, alloc: Allocation, node: Node, memory_mb: int,
                   mode: str = "exact") -> list[str]:
    """Differences between what Slurm granted (``scontrol show job -d``) and the allocation;
    empty when they agree.

    exact: the job runs on the allocation's node only, its ``CPU_IDs`` are the allocation's
    cpuset (Slurm's CPU ids, equal to the kernel's where the node has one thread per core,
    numbered socket by socket), ``Mem=`` is ``memory_mb``, and its GPUs are exactly the
    allocation's: each one's per-device type with that GPU's ``IDX``. model: the node, the
    number of CPUs, the memory and the number of GPUs.
    """
    problems: list[str] = []
    if tuple(job.node_list) != (alloc.node,):
        problems.append(f"runs on {','.join(job.node_list) or 'no node'}, not {alloc.node}")
    d = job.node_detail(alloc.node)
    if d is None:
        return problems + [f"holds nothing on {alloc.node}"]
    if d.memory_mb is not None and d.memory_mb != memory_mb:
        problems.append(f"Mem={d.memory_mb} MiB, not {memory_mb}")
    gpus = job.gres_indices(alloc.node)
    if mode == "exact":
        if sorted(d.cpu_ids) != sorted(alloc.cpuset):
            problems.append(f"CPU_IDs={','.join(map(str, d.cpu_ids)) or 'none'}, not the "
                            f"allocated cores {alloc.cpuset_str()}")
        pos = gpu_positions(node)
        want: dict[str, tuple[int, ...]] = {}
        for uuid in alloc.device_ids:
            t = gres_type(uuid)
            want[t] = tuple(sorted(want.get(t, ()) + (pos.get(uuid, -1),)))
        got = {t.lower(): i for t, i in gpus.items()}
        if got != want:
            problems.append(f"GRES {_gres_text(got)}, not the allocated {_gres_text(want)}")
    else:
        if len(d.cpu_ids) != len(alloc.cpuset):
            problems.append(f"{len(d.cpu_ids)} CPUs, not {len(alloc.cpuset)}")
        count = sum(len(i) for i in gpus.values())
        if count != len(alloc.device_ids):
            problems.append(f"{count} GPUs, not {len(alloc.device_ids)}")
    return problems


def _gres_text(gres: Mapping[str, tuple[int, ...]]) -> str:
    if not gres:
        return "none"
    return ",".join(f"{t}(IDX:{','.join(map(str, i))})" for t, i in sorted(gres.items()))
