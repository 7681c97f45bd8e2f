"""Read-back of the jobs Slurm runs for us (a part of
:class:`~gpuspawner.backends.slurm.backend.SlurmBackend`): a server's state and exit report
(with its output file's last lines, read with the job user's rights), its poll (and its
node's health), a notebook job's output (its log and result, read from its output file with
the job user's rights), and the jobs of ours found after a hub restart."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from ..base import (
    BackendUnavailable,
    Managed,
)
from .commands import JobInfo
from .common import HOLDING
from .job import allocation_of, expand_output, output_path


class JobReadback:
    """What Slurm says of our jobs: running, ended (why), or found after a restart.

    A part of :class:`~gpuspawner.backends.slurm.backend.SlurmBackend` (its traits, ``client``,
    ``log`` and ``_ask`` are the backend's), kept in its own module by concern."""

    async def exit_report(self, state: Mapping[str, Any]) -> str | None:
        """None while the job runs (or waits right after submit); else its state, exit code
        and the last 8 lines of its output file (when the hub can read it)."""
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return None
        job = await self._ask(node, self.client.show_job(int(job_id)))
        if job is None:
            return f"Slurm job {job_id} is no longer known to Slurm"
        if job.state == "RUNNING" or (job.state in HOLDING and self._fresh(state)):
            return None
        return await self._ended(job, state.get("output"))

    def _fresh(self, state: Mapping[str, Any]) -> bool:
        """Submitted less than ``submit_timeout`` ago and never seen running."""
        return (not state.get("started")
                and time.time() - float(state.get("submitted") or 0) < self.submit_timeout)

    async def poll(self, state: Mapping[str, Any]) -> int | None:
        """None while the job runs on a responding node; else an exit status: 0 when Slurm
        no longer knows the job, the job's exit code (at least 1 unless COMPLETED) when it
        ended, 1 when it waits (PENDING, except right after submit: :meth:`_fresh`).

        Raises:
            BackendUnavailable: the controller does not answer, or the job's node is DOWN or
                NOT_RESPONDING (its processes may outlive a dead slurmd: the spawner marks the
                node suspect, and the next placement there sweeps it).
        """
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return 0
        job = await self._ask(node, self.client.show_job(int(job_id)))
        if job is None:
            return 0
        if job.state == "RUNNING":
            infos = await self._cached_nodes(node)
            for n in job.node_list or (node,):
                info = infos.get(n)
                if info is not None and (not info.responding or info.state == "DOWN"):
                    raise BackendUnavailable(
                        n, f"node state {'+'.join([info.state, *sorted(info.flags)])}",
                        "slurmd")
            return None
        if job.state in HOLDING:
            return None if self._fresh(state) else 1
        code, _, signal = job.fields.get("ExitCode", "0:0").partition(":")
        status = int(code) if code.isdigit() else 1
        if state.get("kind") == "job" and status == 0 and signal.isdigit() and int(signal):
            # a notebook job ended by a signal (scancel from outside, Slurm's own --time):
            # 128 + the signal, as a container's exit status says it, which the job runner
            # reads (143 SIGTERM, 137 SIGKILL)
            return 128 + int(signal)
        return status if job.state == "COMPLETED" else max(status, 1)

    async def node_failure(self, state: Mapping[str, Any]) -> str | None:
        """"Slurm job N ended NODE_FAIL (Reason=...)" when the job ended with its node
        (slurmctld set the node down under it, or it stopped responding); None otherwise or
        when Slurm no longer knows the job.

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return None
        job = await self._ask(node, self.client.show_job(int(job_id)))
        if job is None or job.state not in NODE_FAILED:
            return None
        return (f"Slurm job {job.job_id} ended {job.state} on {','.join(job.node_list) or node}"
                f" (Reason={job.reason or 'None'})")

    async def read_output(self, state: Mapping[str, Any], max_bytes: int) -> bytes | None:
        """A notebook job's standard output (its log, then its result frame): the last
        ``max_bytes`` of its output file (``output_path``, on a file system the hub shares,
        read with the job user's rights: :func:`_read_tail`). None for a server's state, or
        when the file cannot be read (the hub cannot see it, it is gone)."""
        if state.get("kind") != "job" or not state.get("job_id"):
            return None
        path = str(state.get("output_path") or "")
        if not path:
            path = expand_output(str(state.get("output") or ""), state["job_id"],
                                 str(state.get("name", "")))
        if not path.startswith("/"):
            return None
        return await asyncio.to_thread(_read_tail, path, max_bytes, state.get("uid"),
                                       state.get("gid"))

    async def remove_output(self, state: Mapping[str, Any]) -> None:
        """Remove a notebook job's output file once the hub has read it (as the job's user:
        :func:`_remove_as`). Never raises."""
        path = str(state.get("output_path") or "")
        if state.get("kind") != "job" or not path.startswith("/"):
            return
        try:
            await asyncio.to_thread(_remove_as, path, state.get("uid"), state.get("gid"))
        except Exception as e:
            self.log.warning("node %s: removing %s failed: %s", state.get("node", "?"), path, e)

    async def _cached_nodes(self, node: str) -> dict[str, Any]:
        """Every node's :class:`~.commands.NodeInfo` by name, from one ``scontrol show
        node`` shared by all polls for ``node_state_max_age`` seconds (concurrent polls wait
        for the same call).

        Raises:
            BackendUnavailable: the controller does not answer (for ``node``).
        """
        loop = asyncio.get_running_loop()
        if self._nodes_lock is None or self._nodes_lock[0] is not loop:
            self._nodes_lock = (loop, asyncio.Lock())
        async with self._nodes_lock[1]:
            now = time.monotonic()
            if self._nodes_cache is None or now - self._nodes_cache[0] > self.node_state_max_age:
                infos = await self._ask(node, self.client.show_nodes())
                self._nodes_cache = (time.monotonic(), {i.name: i for i in infos})
            return self._nodes_cache[1]

    async def _ended(self, job: JobInfo, state_output: str | None) -> str:
        """Why a job is not running: state, exit code, reason and the output's last 8 lines.
        """
        text = (f"Slurm job {job.job_id} {job.state} (ExitCode={job.fields.get('ExitCode', '?')}"
                f", Reason={job.reason or 'None'})")
        if job.state == "OUT_OF_MEMORY":  # the words the job runner looks for
            text += " (out of memory)"
        path = output_path(job, state_output or "")
        gid = _GROUP.match(job.fields.get("GroupId", ""))
        lines = await asyncio.to_thread(
            _tail, path, 8, job.uid, int(gid.group(1)) if gid else None,
        ) if path.startswith("/") else ""
        return f"{text}; last lines of {path}:\n{lines}" if lines else text

    async def _our_jobs(self, node: str) -> list[tuple[JobInfo, str | None]]:
        """Every job Slurm knows, with the allocation JSON of ours (None for others), from
        ``squeue --json`` (:meth:`~.commands.SlurmClient.jobs`): in ``scontrol show job``'s
        text a user's ``Comment`` can forge a record naming another user's job, which a
        sweep then cancelled.

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        jobs = await self._ask(node, self.client.jobs())
        return [(j, allocation_of(j)) for j in jobs]

    async def list_managed(self) -> list[Managed]:
        """Every job of ours (AdminComment ``gpuspawner:`` + allocation JSON) that is
        PENDING, CONFIGURING, RUNNING or SUSPENDED, as Managed(allocation's node, JSON, job
        id). A controller that does not answer is logged: nothing is found."""
        try:
            jobs = await self._our_jobs("*")
        except BackendUnavailable as e:
            self.log.warning("cannot list Slurm jobs to restore allocations: %s", e)
            return []
        out = []
        for job, text in jobs:
            if text is None or job.state not in HOLDING:
                continue
            out.append(Managed(str(json.loads(text).get("node", "")), text, str(job.job_id)))
        return out


#: job states of a job that ended because its node failed (squeue(1) JOB STATE CODES)
NODE_FAILED = frozenset({"NODE_FAIL", "BOOT_FAIL"})
#: the gid of ``GroupId=name(gid)``
_GROUP = re.compile(r".*\((\d+)\)$")


def _tail(path: str, lines: int, uid: int | None = None, gid: int | None = None) -> str:
    """The last ``lines`` lines of the job's output file, read with the job user's rights
    ("" when it cannot be read; blocking). The file and its folders belong to the job's user,
    who could put a link to any file in their place: a hub running as root reads it in a
    ``tail`` running as ``uid:gid`` (no supplementary groups), never itself; otherwise it opens
    it without following a link (``O_NOFOLLOW``) and only when it is a regular file of
    ``uid``."""
    data = _read_tail(path, 16384, uid, gid, timeout=10)
    if data is None:
        return ""
    return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-lines:])


def _read_tail(path: str, max_bytes: int, uid: int | None = None, gid: int | None = None,
               timeout: float = 30) -> bytes | None:
    """The last ``max_bytes`` bytes of a job's output file, read with the job user's rights
    (None when it cannot be read; blocking), as :func:`_tail` reads: a hub running as root
    reads it in a ``tail`` running as ``uid:gid`` (no supplementary groups), never itself;
    otherwise it opens it without following a link and only when it is a regular file of
    ``uid``. ``timeout``: seconds the ``tail`` may take."""
    max_bytes = max(1, int(max_bytes))
    if uid is not None and uid != 0 and os.geteuid() == 0:
        try:
            out = subprocess.run(["tail", "-c", str(max_bytes), "--", path],
                                 capture_output=True, timeout=timeout, user=uid,
                                 group=gid if gid is not None else uid, extra_groups=[],
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            return None
        f.seek(max(0, st.st_size - max_bytes))
        return f.read(max_bytes)


def _remove_as(path: str, uid: int | None = None, gid: int | None = None) -> None:
    """Remove a job's output file as its user (a hub running as root runs ``rm`` as
    ``uid:gid``: the file's folder may be the user's to change); blocking."""
    if uid is not None and uid != 0 and os.geteuid() == 0:
        subprocess.run(["rm", "-f", "--", path], capture_output=True, timeout=30, user=uid,
                       group=gid if gid is not None else uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, check=False)
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid):
        os.unlink(path)
