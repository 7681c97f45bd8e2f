"""Read-back of the jobs Slurm runs for us (a part of
:class:`~gpuspawner.backends.slurm.backend.SlurmBackend`): a server's state and exit report
(with its output file's last lines), its poll (and its node's health), a notebook job's output
(its log and result, read from its output file; only result frames with the job's key count),
and the jobs of ours found after a hub restart. Output files are read as
:mod:`.output` says: no link followed, only a regular file of the job's user, a bounded tail,
in an executor of their own with a limit per user and a deadline per read."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from ..base import (
    BackendError,
    BackendUnavailable,
    Managed,
)
from .commands import JobInfo
from .common import HOLDING
from .job import allocation_of, expand_output, output_path
from .output import OutputReads, OutputRefused, authentic_frames, read_tail


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
        """None while the job runs (RUNNING, or COMPLETING: Slurm still ending it) on a
        responding node; else an exit status: 0 when Slurm no longer knows the job, the job's
        exit code (at least 1 unless COMPLETED) when it ended, 1 when it waits (PENDING, except
        right after submit: :meth:`_fresh`).

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
        if job.state in ("RUNNING", "COMPLETING"):
            # COMPLETING: the batch script has ended but Slurm is still ending the job (its
            # epilog, its processes): its JobState says COMPLETING and not yet whether it
            # COMPLETED, so it is read as running until then (it was read as ended with 1: a
            # notebook job that exited 0 failed when a poll fell in that window)
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
        read by :meth:`_read_output_file`). None for a server's state, or when the file is not
        there (the hub cannot see it, it is gone). A job launched with a result key
        (``result_key``) keeps only the result frames signed with it
        (:func:`~.output.authentic_frames`).

        Raises:
            OutputRefused: the file is a link, a FIFO, not a regular file, or another uid's.
            BackendError: the user's reads are busy, or the read passed its deadline.
        """
        if state.get("kind") != "job" or not state.get("job_id"):
            return None
        path = str(state.get("output_path") or "")
        if not path:
            path = expand_output(str(state.get("output") or ""), state["job_id"],
                                 str(state.get("name", "")))
        if not path.startswith("/"):
            return None
        uid = state.get("uid")
        out = await self._read_output_file(path, max_bytes, None if uid is None else int(uid))
        key = state.get("result_key")
        return authentic_frames(out, str(key)) if out is not None and key else out

    async def remove_output(self, state: Mapping[str, Any]) -> None:
        """Remove a notebook job's output file once the hub has read it (as the job's user:
        :func:`_remove_as`, in :attr:`output_reads`' threads). Never raises."""
        path = str(state.get("output_path") or "")
        if state.get("kind") != "job" or not path.startswith("/"):
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.output_reads.executor(), _remove_as, path, state.get("uid"),
                state.get("gid"), self.output_read_timeout)
        except Exception as e:
            self.log.warning("node %s: removing %s failed: %s", state.get("node", "?"), path, e)

    @property
    def output_reads(self) -> OutputReads:
        """The executor of output reads (made on first use from the ``output_read*``
        traits)."""
        if self._output_reads is None:
            self._output_reads = OutputReads(self.output_read_threads,
                                             self.output_reads_per_user,
                                             self.output_read_timeout)
        return self._output_reads

    async def _read_output_file(self, path: str, max_bytes: int, uid: int | None
                                ) -> bytes | None:
        """The last ``max_bytes`` of a job's output file, read in :attr:`output_reads` as one
        of ``uid``'s reads (:func:`~.output.read_tail`: a regular file of ``uid``, no link
        followed, no FIFO waited on). None when it does not exist or cannot be read.

        Raises:
            OutputRefused: the file is a link, a FIFO, not a regular file, or another uid's.
            BackendError: ``uid``'s reads are busy, or the read passed its deadline.
        """
        try:
            return await self.output_reads.run(uid, read_tail, path, max_bytes, uid)
        except OutputRefused:
            raise
        except OSError as e:
            self.log.debug("cannot read the job output %s: %s", path, e)
            return None

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
        if not path.startswith("/"):
            return text
        try:
            data = await self._read_output_file(path, 16384, job.uid)
        except OutputRefused as e:
            return f"{text}; {e}"
        except BackendError as e:
            return f"{text}; its output cannot be read now: {e}"
        lines = "\n".join((data or b"").decode("utf-8", "replace").strip().splitlines()[-8:])
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


def _remove_as(path: str, uid: int | None = None, gid: int | None = None,
               timeout: float = 30.0) -> None:
    """Remove a job's output file as its user (a hub running as root runs ``rm`` as
    ``uid:gid``, killed after ``timeout`` seconds: the file's folder may be the user's to
    change); blocking."""
    if uid is not None and uid != 0 and os.geteuid() == 0:
        subprocess.run(["rm", "-f", "--", path], capture_output=True, timeout=timeout, user=uid,
                       group=gid if gid is not None else uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, check=False)
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid):
        os.unlink(path)
