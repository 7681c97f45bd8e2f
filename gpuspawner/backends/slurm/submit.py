"""Submission of a server's Slurm job (a part of
:class:`~gpuspawner.backends.slurm.backend.SlurmBackend`): ``sbatch --hold`` (or slurmrestd)
with the options and script of :mod:`.job`, the allocation marked in ``AdminComment``, the
release, the wait for RUNNING, the read-back of what Slurm granted against the allocation, and
the wait for the port the server reports itself (:mod:`.ports`)."""

from __future__ import annotations

import asyncio
import pwd
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...placement import Allocation, Node, PlacementError
from ..base import (
    BackendUnavailable,
    LaunchFailed,
    LaunchRefused,
    Progress,
)
from ..spec import LaunchSpec
from .commands import JobInfo, SlurmError
from .common import HOLDING, REFUSED, controller_down
from .job import (
    admin_comment,
    check_readback,
    job_script,
    job_time,
    output_path,
    picked,
    plan_job,
)
from .output import RESULT_KEY_ENV, OutputRefused, ensure_user_folder, user_pattern
from .ports import PORT_REPORTS
from .rest import job_properties


class JobSubmission:
    """Submit a server's job and wait until it runs where the allocation says and answers.

    A part of :class:`~gpuspawner.backends.slurm.backend.SlurmBackend` (its traits, ``client``,
    ``log`` and ``_ask`` are the backend's), kept in its own module by concern."""

    async def _rest_jwt(self, renew: bool = False) -> str:
        """``rest_token``, or one made by ``scontrol token`` and kept until half its life
        (``renew``: make a new one; a given ``rest_token`` is returned as it is).

        Raises:
            SlurmError: scontrol token failed or printed no ``SLURM_JWT=``.
        """
        if self.rest_token:
            return self.rest_token
        token, renew_at = self._token
        if token and not renew and time.monotonic() < renew_at:
            return token
        out = await self.client.run("scontrol", "token", f"username={self.rest_token_user}",
                                    f"lifespan={self.rest_token_lifespan}")
        token = out.strip().partition("SLURM_JWT=")[2].split()[0] if "SLURM_JWT=" in out else ""
        if not token:
            raise SlurmError(["scontrol", "token"], 0, "printed no SLURM_JWT=")
        self._token = (token, time.monotonic() + self.rest_token_lifespan / 2)
        return token

    def _rest_job(self, plan: Any, alloc: Allocation) -> dict[str, Any]:
        """The v0.0.38 job properties of ``plan`` (:func:`~.rest.job_properties`).

        Raises:
            ValueError: the job cannot be expressed (see job_properties).
        """
        constraint = (self.rest_node_constraint.format(node=alloc.node)
                      if self.rest_node_constraint else "")
        return job_properties(plan.options, self.client._env(), node=alloc.node,
                              node_constraint=constraint)

    async def _submit(self, script: str, plan: Any, spec: LaunchSpec) -> int:
        """Submit the job by ``submit_via``; its id.

        Raises:
            SlurmError: sbatch or slurmrestd refused it or could not be reached.
            LaunchRefused: REST: the uid has no name on the hub host, or its primary group is
                not the spec's gid (v0.0.38 has no --gid).
        """
        if self.submit_via == "cli":
            return await self.client.sbatch(script, plan.options, user=str(spec.uid),
                                            group=str(spec.gid))
        try:
            pw = pwd.getpwuid(spec.uid)
        except KeyError:
            raise LaunchRefused(f"uid {spec.uid} has no user name on the hub host "
                                "(slurmrestd takes a name)") from None
        if pw.pw_gid != spec.gid:
            raise LaunchRefused(f"gid {spec.gid} is not the primary group of {pw.pw_name} "
                                f"({pw.pw_gid}); slurmrestd v0.0.38 cannot set a job's group")
        job_id = await self.rest.submit(script, self._rest_job(plan, spec.allocation),
                                        pw.pw_name)
        self.log.info("node %s: Slurm job %s submitted through slurmrestd as %s",
                      spec.allocation.node, job_id, pw.pw_name)
        return job_id

    async def _output_pattern(self, spec: LaunchSpec) -> str:
        """The job's ``--output`` pattern: ``output`` when set, else
        ``<output_dir>/<uid>/%x-%j.out`` in the user's folder 0700, made now
        (:func:`~.output.ensure_user_folder`, in the output executor's threads).

        Raises:
            LaunchFailed: the folder cannot be made the user's alone (the message says why).
        """
        if self.output:
            return str(self.output)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.output_reads.executor(), ensure_user_folder, self.output_dir, spec.uid,
                spec.gid)
        except OutputRefused as e:
            raise LaunchFailed(f"node {spec.allocation.node}: {e}") from None
        return user_pattern(self.output_dir, spec.uid)

    async def launch(self, spec: LaunchSpec, state: dict[str, Any], progress: Progress
                     ) -> tuple[str, int]:
        """Submit the server's job (held), mark it with the allocation, release it, wait
        until it runs on exactly the allocation, then until it reports its port.

        A notebook job (``spec.port`` 0) reports no port: its ``--time`` is its time limit
        plus ``job_time_margin`` (:func:`~.job.job_time`), the launch returns once it runs on
        its allocation (or has ended already: a short notebook may end before it is seen
        running; then :meth:`poll` says how), and ``state`` keeps what :meth:`read_output`
        needs (``kind`` "job", the user's ``uid``/``gid``, the job's ``name`` and its
        ``output_path``).

        Returns:
            (the node's ``host``, the port the job reported; 0 for a notebook job).

        Raises:
            LaunchRefused: the node is not configured, the allocation cannot be a Slurm job
                (a GPU share, no core), or sbatch says the node cannot satisfy it.
            LaunchFailed: sbatch refused the job; the job did not run in ``submit_timeout``
                or ended; Slurm granted other devices than the allocation (exact mode: the
                job is cancelled); no port in ``port_timeout``.
            BackendUnavailable: the controller does not answer, or the node cannot take jobs
                now (drained, down, not responding: ``scontrol show node``), so that the
                spawner marks it suspect instead of leaving a job waiting in the queue.
        """
        alloc = spec.allocation
        node = self._node(alloc.node)
        spec = self._command(spec)
        notebook_job = spec.port == 0
        result_key = ""
        if notebook_job:  # only frames signed with it count (.output.authentic_frames)
            result_key = secrets.token_hex(32)
            spec = replace(spec, env={**spec.env, RESULT_KEY_ENV: result_key})
        output = await self._output_pattern(spec)
        try:
            limit = (job_time(spec.time_limit, self.job_time_margin)
                     if notebook_job and spec.time_limit else self.time_limit)
            plan = plan_job(spec, node, mode=self.gpu_mode, partition=self.partition,
                            time_limit=limit, output=output,
                            extra=self.extra_sbatch_options)
            script = job_script(spec, python=self.python, scontrol=self._cmd("scontrol"),
                                prologue=self.job_prologue, listen=self.listen_address,
                                report_timeout=self.port_timeout)
            if self.submit_via == "rest":
                self._rest_job(plan, alloc)  # refuse what v0.0.38 cannot express, up front
        except ValueError as e:
            raise LaunchRefused(f"node {alloc.node}: {e}") from None
        # the home is checked and made by the job on its node (job.home_lines), never here
        for info in await self._ask(alloc.node, self.client.show_nodes(alloc.node)):
            if not info.usable and not info.resumable:
                # a drained or dead node would keep the job PENDING until submit_timeout (a
                # powered-down one is resumed by Slurm for the job: gpuspawner.elastic.slurm)
                raise BackendUnavailable(
                    alloc.node, f"node state {'+'.join([info.state, *sorted(info.flags)])}"
                    + (f" ({info.reason})" if info.reason else ""), "slurmd")
        state.update(node=alloc.node, output=output, submitted=time.time(), started=False)
        if notebook_job:
            state.update(kind="job", name=spec.name, uid=spec.uid, gid=spec.gid,
                         result_key=result_key)
            return await self._launch(spec, alloc, node, plan, script, state, progress, None)
        # the server reports its port itself, with its own API token (ports.REPORT_PORT):
        # expected before the job exists, so that no report can come too early
        token = str(spec.env.get("JUPYTERHUB_API_TOKEN", ""))
        try:
            report = PORT_REPORTS.expect(token)
        except ValueError as e:
            raise LaunchRefused(f"node {alloc.node}: {e}") from None
        try:
            return await self._launch(spec, alloc, node, plan, script, state, progress, report)
        finally:
            PORT_REPORTS.forget(token, report)

    async def _launch(self, spec: LaunchSpec, alloc: Allocation, node: Node, plan: Any,
                      script: str, state: dict[str, Any], progress: Progress,
                      report: asyncio.Future[int] | None) -> tuple[str, int]:
        """:meth:`launch` from the submission on (``report``: the server's port report, None
        for a notebook job)."""
        notebook_job = report is None
        try:
            job_id = await self._submit(script, plan, spec)
        except SlurmError as e:
            if controller_down(e):
                raise BackendUnavailable(alloc.node, e, "Slurm controller") from None
            cls = LaunchRefused if any(w in e.stderr for w in REFUSED) else LaunchFailed
            how = "sbatch" if self.submit_via == "cli" else "slurmrestd"
            raise cls(f"node {alloc.node}: {how} refused the job: {e.stderr}") from None
        state["job_id"] = job_id
        progress(35, f"submitted Slurm job {job_id} ({plan.gres or 'no GPU'}, "
                 f"{len(alloc.cpuset)} CPUs, {plan.memory_mb} MiB)")
        await self._ask(alloc.node, self.client.run(
            "scontrol", "update", f"JobId={job_id}", f"AdminComment={admin_comment(alloc)}"))
        await self._ask(alloc.node, self.client.run("scontrol", "release", str(job_id)))
        job = await self._wait_running(job_id, alloc.node, progress, ended_ok=notebook_job)
        state["started"] = True
        if notebook_job:
            state["output_path"] = output_path(job, str(state.get("output") or ""))
            if job.state != "RUNNING":  # it ran and ended already: poll says how
                return self.nodes[alloc.node].host, 0
        problems = check_readback(job, alloc, node, plan.memory_mb, self.gpu_mode)
        state["picked"] = granted = picked(job, node)
        # model mode: Slurm picked the devices, so the allocation must name them even when the
        # counts agree; exact mode: only the cores can differ (sbatch cannot name core ids)
        differs = sorted(granted["cpu_ids"]) != sorted(alloc.cpuset) or (
            self.gpu_mode == "model" and sorted(granted["gpu_uuids"]) != sorted(alloc.gpu_uuids))
        if (problems or differs) and self.ledger is not None:
            alloc, problems = await self._adopt(job, alloc, node, granted, plan.memory_mb,
                                                problems)
        if problems:
            await self._cancel(job_id, alloc.node)
            raise LaunchFailed(f"Slurm job {job_id} does not hold allocation {alloc.id}: "
                               f"{'; '.join(problems)}; the job was cancelled")
        if notebook_job:
            return self.nodes[alloc.node].host, 0
        progress(50, f"Slurm job {job_id} runs on {alloc.node}, waiting for its server to "
                 "report its port")
        assert report is not None
        port = await self._wait_port(job_id, alloc.node, report)
        state["port"] = port
        return self.nodes[alloc.node].host, port

    async def _adopt(self, job: JobInfo, alloc: Allocation, node: Node,
                     granted: Mapping[str, Any], memory_mb: int, problems: list[str]
                     ) -> tuple[Allocation, list[str]]:
        """Slurm cannot be told core ids (and picks GPUs in model mode): when it granted other
        cores (or, in model mode, GPUs) on the right node, the ledger adopts them if they are
        free there (:meth:`~gpuspawner.placement.Ledger.adopt`) and the job's AdminComment
        is marked again. Returns the allocation and what still differs."""
        assert self.ledger is not None
        if granted.get("node") != alloc.node or len(granted["cpu_ids"]) != len(alloc.cpuset):
            return alloc, problems
        gpus = granted["gpu_uuids"] if self.gpu_mode == "model" else None
        try:
            adopted = self.ledger.adopt(alloc.id, cpuset=granted["cpu_ids"], gpus=gpus)
        except PlacementError as e:
            return alloc, [*problems, f"the ledger cannot adopt what Slurm granted: {e}"]
        left = check_readback(job, adopted, node, memory_mb, self.gpu_mode)
        if left:
            return alloc, problems
        self.log.info("allocation %s adopted Slurm's cores %s (planned %s)", alloc.id,
                      adopted.cpuset_str(), alloc.cpuset_str())
        await self._ask(alloc.node, self.client.run(
            "scontrol", "update", f"JobId={job.job_id}",
            f"AdminComment={admin_comment(adopted)}"))
        return adopted, []

    async def _wait_running(self, job_id: int, node: str, progress: Progress,
                            ended_ok: bool = False) -> JobInfo:
        """Poll ``scontrol show job -d`` until the job is RUNNING with its detail lines, at
        most ``submit_timeout`` seconds (every 0.2 s, backing off to 1 s). ``ended_ok`` (a
        notebook job): a job that has ended already is returned, not a failure.

        Raises:
            LaunchFailed: it ended first, or it still waits at the deadline (then it is
                cancelled; the message gives Slurm's Reason).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.submit_timeout
        delay, said = 0.2, ""
        while True:
            job = await self._ask(node, self.client.show_job(job_id))
            if job is None:
                raise LaunchFailed(f"Slurm job {job_id} vanished before it ran")
            if job.state == "RUNNING" and job.details:
                return job
            if job.state not in HOLDING:
                if ended_ok and job.state != "CANCELLED":
                    return job
                raise LaunchFailed(await self._ended(job, state_output=None))
            if job.reason and job.reason != said and job.reason != "None":
                said = job.reason
                progress(40, f"Slurm job {job_id} {job.state.lower()}: {job.reason}")
            if loop.time() >= deadline:
                await self._cancel(job_id, node)
                raise LaunchFailed(f"Slurm job {job_id} was not running after "
                                   f"{self.submit_timeout:g} s ({job.state}, Reason="
                                   f"{job.reason}); the job was cancelled")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    async def _wait_port(self, job_id: int, node: str, report: asyncio.Future[int]) -> int:
        """Wait (``port_timeout``) for the port the server reports itself (``report``, from
        :data:`~.ports.PORT_REPORTS`), asking Slurm every 0.1 s, backing off to 1 s, whether
        the job still runs.

        Raises:
            LaunchFailed: the job ended first (with its report) or the deadline passed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.port_timeout
        delay = 0.1
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(report), delay)
            except asyncio.TimeoutError:
                pass
            job = await self._ask(node, self.client.show_job(job_id))
            if job is None:
                raise LaunchFailed(f"Slurm job {job_id} vanished before its server reported "
                                   "its port")
            if report.done():
                return report.result()
            if job.state != "RUNNING":
                raise LaunchFailed(await self._ended(job, state_output=None))
            if loop.time() >= deadline:
                raise LaunchFailed(f"the server of Slurm job {job_id} reported no port within "
                                   f"{self.port_timeout:g} s (it reports it once it listens)")
            delay = min(delay * 1.5, 1.0)

    async def _cancel(self, job_id: int, node: str) -> None:
        try:
            await self.client.scancel(job_id)
        except SlurmError as e:
            self.log.warning("node %s: scancel %s failed: %s", node, job_id, e)
