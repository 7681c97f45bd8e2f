"""A small async client for the Slurm commands, and pure parsers for what they print.

:class:`SlurmClient` runs ``sbatch --parsable``, ``squeue``, ``scontrol show job -d``,
``scontrol show node``, ``scontrol update`` and ``scancel`` as asyncio subprocesses with
``SLURM_CONF`` in their environment and a timeout; a failure raises :class:`SlurmError`.
The parsers turn the ``key=value`` text of ``scontrol show job -d`` (:func:`parse_job`) and
``scontrol show node`` (:func:`parse_nodes`) into :class:`JobInfo` and :class:`NodeInfo`.
Slurm 22.05 has no ``scontrol --json`` (``squeue --json`` exists but lacks the per-node CPU and
GRES index detail that ``scontrol show job -d`` prints), hence the text parsers, used for one
job at a time. The listing of every job (:meth:`SlurmClient.jobs`, which sweeps, restores and
clean-ups act on) is ``squeue --json`` (:func:`parse_jobs_json`): in the text, a user's
``Comment`` with a newline reads as a record of another job.

Sources for the formats: scontrol(1) ("show job -d": "Nodes=... CPU_IDs=... Mem=... GRES=..."
detail lines; "show node"), sbatch(1) (``--parsable``: "jobid[;cluster_name]"), squeue(1)
(``--format`` ``%i``/``%T``/``%R``), slurm.conf(5) node states, and the output captured from the
private cluster of ``scripts/slurm.sh`` in ``tests/data/slurm/``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...placement.model import parse_cpu_list

__all__ = [
    "GresAlloc",
    "JOB_UMASK",
    "JobInfo",
    "JobNodeDetail",
    "NodeInfo",
    "SlurmClient",
    "SlurmError",
    "expand_cpu_ids",
    "expand_hostlist",
    "parse_gres_detail",
    "parse_job",
    "parse_jobs",
    "parse_jobs_json",
    "parse_key_values",
    "parse_nodes",
]


#: the umask the Slurm commands run with under a root hub, which sbatch hands to the job
#: (``SLURM_UMASK``): the job's output file is its user's alone
JOB_UMASK = 0o077


class SlurmError(RuntimeError):
    """A Slurm command that failed, timed out or could not be started.

    Attributes:
        command: the argument vector that was run.
        returncode: its exit status; None when it timed out or could not be started.
        stderr: what it wrote on stderr (stripped), or why it did not run.
    """

    def __init__(self, command: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.stderr = stderr
        status = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(f"{' '.join(self.command)} {status}: {stderr}")


# --------------------------------------------------------------------------- plain syntax


def expand_cpu_ids(text: str) -> tuple[int, ...]:
    """Expand Slurm's CPU id list (``CPU_IDs=0-1,3`` in ``scontrol show job -d``) to sorted ids.

    Raises:
        ValueError: not a list of ids and ranges.
    """
    return parse_cpu_list(text.strip())


_HOSTLIST_PART = re.compile(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist (``node[1-3,5],gpu07``) to names, in order (scontrol(1)
    "show hostnames"; zero padding of ranges such as ``n[01-10]`` is kept).

    Supports one bracket per name, which is what Slurm prints for names like ``node1``.

    Returns:
        The names; ``()`` for ``""`` or ``(null)``.

    Raises:
        ValueError: unbalanced brackets or a bad range.
    """
    text = text.strip()
    if not text or text == "(null)":
        return ()
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _HOSTLIST_PART.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"not a hostlist: {text!r}")
        prefix, ranges, suffix = m.groups()
        if ranges is None:
            if "]" in prefix:
                raise ValueError(f"not a hostlist: {text!r}")
            out.append(prefix + suffix)
        else:
            for part in ranges.split(","):
                lo, _, hi = part.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ValueError(f"bad range {part!r} in hostlist {text!r}")
                width = len(lo)
                for i in range(int(lo), int(hi or lo) + 1):
                    out.append(f"{prefix}{i:0{width}d}{suffix}")
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"not a hostlist: {text!r}")
            pos += 1
    return tuple(out)


#: keys whose value runs to the end of the line (it may hold spaces and ``=``): scontrol prints
#: each of them on a line of its own (a job's ``Features=`` is not one of them: it shares its
#: line with ``DelayBoot=``)
_LINE_KEYS = frozenset({
    "Comment", "AdminComment", "SystemComment", "Command", "WorkDir", "StdErr", "StdIn",
    "StdOut", "OS", "Reason", "AvailableFeatures", "ActiveFeatures",
})


def parse_key_values(text: str) -> dict[str, str]:
    """Parse one ``scontrol show`` record (``Key=Value`` pairs separated by white space) to a
    dict.

    A word without ``=`` continues the value before it (``Reason=test [root@2026-...]``); the
    keys of :data:`_LINE_KEYS` take the rest of their line. Of a key seen twice the first value
    is kept (the job detail lines are parsed separately, :func:`parse_job`).

    Returns:
        Keys to values, as printed (``(null)`` is kept).
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        key, eq, rest = stripped.partition("=")
        if eq and key in _LINE_KEYS:
            out.setdefault(key, rest.rstrip())
            continue
        last: str | None = None
        for word in stripped.split():
            k, eq, v = word.partition("=")
            if eq and k and (last is None or k[0].isalpha()):
                if k in out:
                    last = None  # a repeated key: ignore it and its continuation
                    continue
                out[k] = v
                last = k
            elif last is not None:
                out[last] = f"{out[last]} {word}"
    return out


def _records(text: str, first_key: str) -> list[str]:
    """Split ``scontrol show`` output into records, each starting with ``first_key=``."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(f"{first_key}="):
            records.append([line])
        elif records and line.strip():
            records[-1].append(line)
    return ["\n".join(r) for r in records]


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class GresAlloc:
    """One GRES of a job on one node, from the ``GRES=`` field of a detail line.

    Attributes:
        name: e.g. ``gpu``.
        type: the GRES type (``gpu-5a0c...``), ``""`` when none was given.
        count: how many.
        indices: the device indexes within the node (``IDX:0-1,3``): the position of the device
            among the node's devices of that name in gres.conf, not a /dev/nvidiaN number;
            ``()`` when Slurm printed none (a count-only GRES).
    """

    name: str
    type: str
    count: int
    indices: tuple[int, ...] = ()


_GRES_ITEM = re.compile(r"([^,(]+)(?:\(([^)]*)\))?")


def parse_gres_detail(text: str) -> tuple[GresAlloc, ...]:
    """Parse the ``GRES=`` value of a detail line of ``scontrol show job -d``, e.g.
    ``gpu:gpu-5a0c:1(IDX:1)`` or ``gpu:a:1(IDX:0),gpu:b:2(IDX:2-3)`` (scontrol(1)).

    Returns:
        One :class:`GresAlloc` per entry; ``()`` for an empty value.

    Raises:
        ValueError: an entry that is not ``name[:type][:count][(IDX:list)]``.
    """
    text = text.strip()
    out: list[GresAlloc] = []
    pos = 0
    while pos < len(text):
        m = _GRES_ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"not a GRES list: {text!r}")
        spec, paren = m.group(1), m.group(2)
        parts = spec.split(":")
        name = parts[0]
        gtype = ""
        count = 1
        if len(parts) == 3:
            gtype, count_text = parts[1], parts[2]
        elif len(parts) == 2:
            count_text = parts[1]
            if not count_text.isdigit():
                gtype, count_text = count_text, "1"
        elif len(parts) == 1:
            count_text = "1"
        else:
            raise ValueError(f"not a GRES entry: {spec!r}")
        if not name or not count_text.isdigit():
            raise ValueError(f"not a GRES entry: {spec!r}")
        count = int(count_text)
        indices: tuple[int, ...] = ()
        if paren is not None:
            label, _, idx = paren.partition(":")
            if label == "IDX":
                indices = parse_cpu_list(idx) if idx and idx != "N/A" else ()
        out.append(GresAlloc(name=name, type=gtype, count=count, indices=indices))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"not a GRES list: {text!r}")
            pos += 1
    return tuple(out)


@dataclass(frozen=True)
class JobNodeDetail:
    """One detail line of ``scontrol show job -d``: what the job holds on these nodes.

    Attributes:
        nodes: the node names (the line's ``Nodes=`` hostlist, expanded).
        cpu_ids: Slurm's CPU ids on each of those nodes (``CPU_IDs=0-1,3`` expanded).
        memory_mb: ``Mem=`` in MiB, None when absent.
        gres: ``GRES=`` entries with their device indexes.
    """

    nodes: tuple[str, ...]
    cpu_ids: tuple[int, ...]
    memory_mb: int | None
    gres: tuple[GresAlloc, ...]


@dataclass(frozen=True)
class JobInfo:
    """A job as ``scontrol show job -d`` shows it.

    Attributes:
        job_id: ``JobId``.
        name: ``JobName``.
        state: ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``, ``CANCELLED``, ...).
        reason: ``Reason`` (``None`` while running; ``ReqNodeNotAvail, ...`` while waiting).
        node_list: the ``NodeList`` hostlist expanded (``()`` while pending).
        comment: ``Comment`` (``""`` for ``(null)``).
        user: the user name of ``UserId=name(uid)``; uid: its number (None if unparsable).
        details: the detail lines (only while the job holds resources).
        fields: every ``key=value`` of the record (first occurrence), as printed.
    """

    job_id: int
    name: str
    state: str
    reason: str
    node_list: tuple[str, ...]
    comment: str
    user: str
    uid: int | None
    details: tuple[JobNodeDetail, ...] = ()
    fields: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    def node_detail(self, node: str) -> JobNodeDetail | None:
        """The detail line that covers ``node``, None when the job holds nothing there."""
        for d in self.details:
            if node in d.nodes:
                return d
        return None

    def gres_indices(self, node: str, name: str = "gpu") -> dict[str, tuple[int, ...]]:
        """Device indexes of GRES ``name`` on ``node``, by type (``""`` for no type)."""
        d = self.node_detail(node)
        out: dict[str, tuple[int, ...]] = {}
        if d is not None:
            for g in d.gres:
                if g.name == name:
                    out[g.type] = tuple(sorted(set(out.get(g.type, ()) + g.indices)))
        return out


_DETAIL = re.compile(r"^\s+Nodes=\S+ ")
_USER = re.compile(r"^(.*)\((\d+)\)$")


def _null(value: str | None) -> str:
    return "" if value in (None, "(null)") else value


def _parse_detail(line: str) -> JobNodeDetail:
    kv: dict[str, str] = {}
    for word in line.split():
        k, eq, v = word.partition("=")
        if eq:
            kv[k] = v
    mem = kv.get("Mem", "")
    return JobNodeDetail(
        nodes=expand_hostlist(kv.get("Nodes", "")),
        cpu_ids=expand_cpu_ids(kv["CPU_IDs"]) if kv.get("CPU_IDs") else (),
        memory_mb=int(mem) if mem.isdigit() else None,
        gres=parse_gres_detail(kv.get("GRES", "")),
    )


def parse_job(text: str) -> JobInfo:
    """Parse one record of ``scontrol show job -d ID``.

    Args:
        text: the command's output (one job).

    Returns:
        The job.

    Raises:
        ValueError: no ``JobId=`` record, or a malformed detail line.
    """
    jobs = parse_jobs(text)
    if len(jobs) != 1:
        raise ValueError(f"expected one job record, found {len(jobs)}")
    return jobs[0]


def parse_jobs(text: str) -> list[JobInfo]:
    """Parse every record of ``scontrol show job -d`` (records start with ``JobId=``).

    Raises:
        ValueError: a record whose ``JobId`` is not a number or a malformed detail line.
    """
    out = []
    for record in _records(text, "JobId"):
        detail_lines = [ln for ln in record.splitlines() if _DETAIL.match(ln)]
        rest = "\n".join(ln for ln in record.splitlines() if not _DETAIL.match(ln))
        kv = parse_key_values(rest)
        job_id = kv.get("JobId", "")
        if not job_id.isdigit():
            raise ValueError(f"not a job id: {job_id!r}")
        user, uid = kv.get("UserId", ""), None
        m = _USER.match(user)
        if m:
            user, uid = m.group(1), int(m.group(2))
        out.append(JobInfo(
            job_id=int(job_id),
            name=kv.get("JobName", ""),
            state=kv.get("JobState", ""),
            reason=kv.get("Reason", ""),
            node_list=expand_hostlist(kv.get("NodeList", "")),
            comment=_null(kv.get("Comment")),
            user=user,
            uid=uid,
            details=tuple(_parse_detail(ln) for ln in detail_lines),
            fields=kv,
        ))
    return out


def parse_jobs_json(text: str) -> list[JobInfo]:
    """The jobs of ``squeue --json`` as :class:`JobInfo` (``fields``: ``JobName``,
    ``JobState``, ``Comment``, ``AdminComment``, ``UserId``). Their detail lines carry only
    the GRES each node holds (``gres_detail``, one entry per node of ``nodes``, e.g.
    ``gpu:<type>:1(IDX:0)``: :meth:`JobInfo.gres_indices` reads them), no CPU ids or memory.

    What a job's user sets (its name, its ``Comment``, its paths) comes as a JSON string
    there. In ``scontrol show job`` it is printed as it is: a ``Comment`` holding a newline
    and ``JobId=...`` reads as a record of its own, which named another user's job with an
    ``AdminComment`` of the attacker's choosing (docs/security.md). Slurm 22.05's
    ``squeue --json`` (data_parser v0.0.38) gives ``job_state`` as a string, later versions as
    a list of flags whose first is the state: both are read.

    Raises:
        ValueError: not squeue's JSON (no ``jobs`` list, or a job without a numeric id).
    """
    data = json.loads(text)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("squeue --json printed no jobs list")
    out = []
    for j in jobs:
        job_id = j.get("job_id") if isinstance(j, dict) else None
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise ValueError(f"squeue --json: a job without a numeric job_id: {job_id!r}")
        state = j.get("job_state") or ""
        if isinstance(state, list):
            state = state[0] if state else ""
        uid = j.get("user_id")
        nodes = expand_hostlist(str(j.get("nodes") or ""))
        gres = j.get("gres_detail") or []
        details = tuple(
            JobNodeDetail((node,), (), None, parse_gres_detail(str(text)))
            for node, text in zip(nodes, gres if isinstance(gres, list) else [], strict=False)
            if _gres_detail_ok(str(text)))
        fields = {"JobName": str(j.get("name") or ""), "JobState": str(state),
                  "Comment": str(j.get("comment") or ""),
                  "AdminComment": str(j.get("admin_comment") or ""),
                  "UserId": f"{j.get('user_name') or ''}({uid})"}
        out.append(JobInfo(
            job_id=job_id, name=fields["JobName"], state=fields["JobState"],
            reason=str(j.get("state_reason") or ""),
            node_list=nodes,
            comment=fields["Comment"], user=str(j.get("user_name") or ""),
            uid=uid if isinstance(uid, int) else None, details=details, fields=fields))
    return out


def _gres_detail_ok(text: str) -> bool:
    """Whether ``text`` is a GRES list :func:`parse_gres_detail` reads (a job's GRES are
    Slurm's text, not the user's; an entry it cannot read is left out, not an error)."""
    try:
        parse_gres_detail(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeInfo:
    """A node as ``scontrol show node`` shows it.

    Attributes:
        name: ``NodeName``.
        state: the base state of ``State=`` (``IDLE``, ``MIXED``, ``ALLOCATED``, ``DOWN``,
            ``UNKNOWN``, ...), without flags or the ``*`` suffix.
        flags: the ``+``-joined flags (``DRAIN``, ``NOT_RESPONDING``, ``COMPLETING``, ...);
            a ``*`` after the base state (not responding) is added as ``NOT_RESPONDING``.
        cpus: ``CPUTot``; real_memory_mb: ``RealMemory`` in MiB.
        gres: ``Gres`` as printed (``gpu:TYPE:1(S:0),...``), ``""`` for ``(null)``.
        reason: ``Reason`` without the ``[user@time]`` suffix, ``""`` when none.
        fields: every ``key=value`` of the record, as printed.
    """

    name: str
    state: str
    flags: frozenset[str]
    cpus: int
    real_memory_mb: int
    gres: str
    reason: str
    fields: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def drained(self) -> bool:
        """True when the node is drained or draining (``DRAIN`` flag; slurm.conf(5) states)."""
        return "DRAIN" in self.flags or self.state in ("DRAINED", "DRAINING", "DRAIN")

    @property
    def responding(self) -> bool:
        """False when slurmctld has lost contact with the node's slurmd."""
        return "NOT_RESPONDING" not in self.flags

    @property
    def usable(self) -> bool:
        """True when new jobs can start there: responding, not down, drained or failing."""
        return (self.responding and not self.drained
                and self.state in ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
                and not {"FAIL", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
                & self.flags)

    @property
    def resumable(self) -> bool:
        """True when Slurm's power saving has it powered down, or is powering it up, and
        starts a job sent there once it is up (ResumeProgram; slurm.conf(5), power_save.html):
        not DOWN, drained or failing. Such a node does not respond until it is up."""
        return (bool({"POWERED_DOWN", "POWERING_UP"} & self.flags) and self.state != "DOWN"
                and not self.drained and "FAIL" not in self.flags)


_REASON_SUFFIX = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")


def parse_node_state(text: str) -> tuple[str, frozenset[str]]:
    """Split ``State=`` of ``scontrol show node`` (``IDLE+DRAIN``, ``DOWN*+NOT_RESPONDING``,
    ``IDLE*``) into the base state and its flags (see :class:`NodeInfo`)."""
    parts = [p for p in text.strip().split("+") if p]
    if not parts:
        return "", frozenset()
    base = parts[0]
    flags = set(parts[1:])
    if base.endswith("*"):
        base = base.rstrip("*")
        flags.add("NOT_RESPONDING")
    return base, frozenset(flags)


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def parse_nodes(text: str) -> list[NodeInfo]:
    """Parse ``scontrol show node [NAME]`` (records start with ``NodeName=``).

    Returns:
        One :class:`NodeInfo` per record, in the printed order.
    """
    out = []
    for record in _records(text, "NodeName"):
        kv = parse_key_values(record)
        state, flags = parse_node_state(kv.get("State", ""))
        reason = _null(kv.get("Reason"))
        out.append(NodeInfo(
            name=kv.get("NodeName", ""),
            state=state,
            flags=flags,
            cpus=_int(kv.get("CPUTot")),
            real_memory_mb=_int(kv.get("RealMemory")),
            gres=_null(kv.get("Gres")),
            reason=_REASON_SUFFIX.sub("", reason),
            fields=kv,
        ))
    return out


# --------------------------------------------------------------------------- the client


_INVALID_JOB = "Invalid job id specified"


class SlurmClient:
    """Runs the Slurm commands of one cluster.

    Args:
        conf: path of the cluster's slurm.conf, given to every command as ``SLURM_CONF``;
            None keeps the caller's environment (``SLURM_CONF`` or the built-in default).
        timeout: seconds a command may take before it is killed and :class:`SlurmError`
            raised (a controller that is down makes each command wait its own retries, about
            18 s for squeue with the default ``MessageTimeout``).
        bin_dir: directory of the commands; None searches ``PATH``.
        umask: the commands' umask, which sbatch hands to the job (``SLURM_UMASK``) and
            slurmstepd makes the job's output file with. None: :data:`JOB_UMASK` (the file is
            the job user's alone) when this process runs as root, which reads the file as the
            job's user; else this process's own (a hub running as SlurmUser reads the file
            itself, so it must stay readable to it).
    """

    def __init__(self, conf: str | os.PathLike[str] | None = None, timeout: float = 30.0,
                 bin_dir: str | None = None, umask: int | None = None) -> None:
        self.conf = os.fspath(conf) if conf is not None else None
        self.timeout = timeout
        self.bin_dir = bin_dir
        self.umask = umask if umask is not None else (
            JOB_UMASK if os.geteuid() == 0 else -1)  # -1: subprocess leaves it as it is

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf is not None:
            env["SLURM_CONF"] = self.conf
        return env

    async def run(self, *args: str, stdin: str | None = None,
                  timeout: float | None = None) -> str:
        """Run one command (``args[0]`` is ``sbatch``, ``squeue``, ...) and return its stdout.

        Raises:
            SlurmError: it could not start, exited non-zero, or ran past ``timeout``
                (default: the client's) seconds and was killed.
        """
        argv = list(args)
        if self.bin_dir:
            argv[0] = os.path.join(self.bin_dir, argv[0])
        limit = self.timeout if timeout is None else timeout
        try:
            # sbatch hands its umask to the job (SLURM_UMASK), and slurmstepd makes the job's
            # output file with it: under JOB_UMASK a server's log, or a notebook job's
            # executed notebook, is readable by the job's user only (sbatch(1), "SLURM_UMASK")
            proc = await asyncio.create_subprocess_exec(
                *argv, env=self._env(), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, umask=self.umask,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL)
        except OSError as e:
            raise SlurmError(argv, None, f"cannot run: {e}") from e
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), limit)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(argv, None, f"timed out after {limit:g} s") from None
        if proc.returncode != 0:
            raise SlurmError(argv, proc.returncode, err.decode(errors="replace").strip())
        return out.decode(errors="replace")

    async def sbatch(self, script: str, options: Sequence[str] = (), *,
                     user: str | None = None, group: str | None = None) -> int:
        """Submit a batch script (sbatch(1), read from stdin) and return the job id.

        Args:
            script: the whole script, starting with ``#!``.
            options: sbatch options, e.g. ``["--gres=gpu:TYPE:1", "--gres-flags=enforce-binding"]``;
                passed as separate arguments, never through a shell.
            user: run the job as this user (``--uid``; the caller must be root or SlurmUser,
                sbatch(1)); group: its group (``--gid``, default: ``user``'s own group name).

        Raises:
            SlurmError: sbatch refused the job; ValueError: its ``--parsable`` answer
                (``jobid[;cluster]``) holds no job id.
        """
        argv = ["sbatch", "--parsable", *options]
        if user is not None:
            argv += [f"--uid={user}", f"--gid={group or user}"]
        out = await self.run(*argv, stdin=script)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise ValueError(f"sbatch --parsable printed {out!r}, not a job id")
        return int(job_id)

    async def squeue(self, job_ids: Sequence[int] = (),
                     states: str | None = None) -> dict[int, str]:
        """The queue as ``{job_id: state}`` (``squeue -h -o "%i %T"``).

        Args:
            job_ids: only these jobs (``--jobs``); empty for all.
            states: ``--states`` (e.g. ``all``); None for squeue's default (pending, running,
                completing, ... - jobs that ended are not shown).

        Raises:
            SlurmError: squeue failed (an unknown job id is not an error: it is just absent).
        """
        argv = ["squeue", "--noheader", "--format=%i %T"]
        if job_ids:
            argv.append("--jobs=" + ",".join(str(j) for j in job_ids))
        if states:
            argv.append(f"--states={states}")
        try:
            out = await self.run(*argv)
        except SlurmError as e:
            if job_ids and _INVALID_JOB in e.stderr:
                return {}
            raise
        queue: dict[int, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                queue[int(parts[0])] = parts[1]
        return queue

    async def jobs(self) -> list[JobInfo]:
        """Every job Slurm knows, ended ones included (``squeue --json --states=all``,
        :func:`parse_jobs_json`: no detail lines, and no way for a job's own text to read as
        another job).

        Raises:
            SlurmError: squeue failed; ValueError: it printed no JSON of jobs.
        """
        return parse_jobs_json(await self.run("squeue", "--json", "--states=all"))

    async def show_job(self, job_id: int) -> JobInfo | None:
        """``scontrol show job -d ID`` parsed; None when Slurm no longer knows the job.

        Raises:
            SlurmError: scontrol failed for another reason.
        """
        try:
            out = await self.run("scontrol", "show", "job", "-d", str(int(job_id)))
        except SlurmError as e:
            if _INVALID_JOB in e.stderr:
                return None
            raise
        return parse_job(out)

    async def show_nodes(self, name: str | None = None) -> list[NodeInfo]:
        """``scontrol show node [NAME]`` parsed.

        Raises:
            SlurmError: scontrol failed (including an unknown node name).
        """
        argv = ["scontrol", "show", "node"]
        if name is not None:
            argv.append(name)
        return parse_nodes(await self.run(*argv))

    async def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        """``scontrol update nodename=NAME state=STATE [reason=REASON]`` (scontrol(1):
        ``drain`` and ``down`` need a reason; ``resume`` returns a node to service).

        Raises:
            SlurmError: scontrol refused it.
        """
        argv = ["scontrol", "update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            argv.append(f"reason={reason}")
        await self.run(*argv)

    async def scancel(self, job_id: int, signal: str | None = None) -> None:
        """``scancel [--signal=SIG] ID`` (scancel(1)); cancelling a job that has ended is not
        an error.

        Raises:
            SlurmError: scancel failed.
        """
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        argv.append(str(int(job_id)))
        await self.run(*argv)
