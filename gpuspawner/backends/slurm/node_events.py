"""Node events of the Slurm backend (a part of
:class:`~gpuspawner.backends.slurm.backend.SlurmBackend`): Slurm's view of each node (up,
drained, down) and the sweep of a node's jobs whose allocation the ledger no longer books
(after an outage)."""

from __future__ import annotations

import json
from collections.abc import Callable

from .common import HOLDING
from .job import gpu_positions

#: job states in which a job holds its node's devices (squeue(1) JOB STATE CODES)
HOLDS_DEVICES = frozenset({"CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "STOPPED"})


class NodeEvents:
    """Each node's state as Slurm sees it, and the sweep after an outage.

    A part of :class:`~gpuspawner.backends.slurm.backend.SlurmBackend` (its traits, ``client``,
    ``log`` and ``_ask`` are the backend's), kept in its own module by concern."""

    async def node_states(self) -> dict[str, tuple[str, str]]:
        """Slurm's view of each bound node (``scontrol show node``; slurm.conf(5) node
        states): DOWN, NOT_RESPONDING (``*``), FAIL or a reboot -> "down"; DRAIN/DRAINING ->
        "drain"; else "up". The reason is Slurm's ``Reason``. A controller that does not answer
        makes every node "down" (no job could start)."""
        try:
            infos = {n.name: n for n in await self.client.show_nodes()}
        except Exception as e:
            return {name: ("down", f"Slurm controller unavailable: {e}") for name in self.nodes}
        out: dict[str, tuple[str, str]] = {}
        for name in self.nodes:
            info = infos.get(name)
            if info is None:
                out[name] = ("down", "Slurm does not know this node")
            elif info.drained and info.responding and info.state != "DOWN":
                out[name] = ("drain", f"Slurm: drained: {info.reason or 'no reason given'}")
            elif info.resumable:
                # Slurm's power saving resumes it (ResumeProgram) for a job: not responding
                # until its slurmd registers, yet jobs sent there start then
                # (gpuspawner.elastic.slurm)
                out[name] = ("up", "Slurm: powered down or powering up (power saving)")
            elif not info.usable:
                flags = "+".join(sorted(info.flags))
                out[name] = ("down", f"Slurm: {info.state}{'+' + flags if flags else ''}"
                                     f"{': ' + info.reason if info.reason else ''}")
            else:
                out[name] = ("up", "")
        return out

    async def held_elsewhere(self) -> dict[str, str]:
        """GPUs (and MIG instances) of the bound nodes that jobs the hub did not submit hold
        now, UUID -> why (``"held by Slurm job 41 of gpsuser2 (not submitted by the hub)"``),
        read from ``squeue --json``: a job holding devices (configuring, running, suspended,
        completing) without our AdminComment (which only a Slurm administrator can set), its
        GRES ``IDX`` on each node mapped to the node's devices (:func:`~.job.gpu_positions`).
        A spawn booked there could only pend in Slurm's queue.

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        out: dict[str, str] = {}
        positions = {name: {i: u for u, i in gpu_positions(rt.node).items()}
                     for name, rt in self.nodes.items()}
        for job, text in await self._our_jobs("*"):
            if text is not None or job.state not in HOLDS_DEVICES:
                continue
            for node in job.node_list:
                pos = positions.get(node)
                if pos is None:
                    continue
                for indices in job.gres_indices(node).values():
                    for i in indices:
                        if i in pos:
                            out[pos[i]] = (f"held by Slurm job {job.job_id} of "
                                           f"{job.user or job.uid} (not submitted by the hub)")
        return out

    async def sweep(self, node: str, booked: Callable[[str], bool],
                    owner_booked: Callable[[str, str], bool]) -> list[str]:
        """Cancel our jobs on ``node`` (by allocation) whose allocation id is not booked.

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        removed = []
        for job, text in await self._our_jobs(node):
            if text is None or job.state not in HOLDING:
                continue
            data = json.loads(text)
            if data.get("node") != node or booked(str(data.get("id"))):
                continue
            self.log.warning("node %s: cancelling Slurm job %s, allocation %s not booked",
                             node, job.job_id, data.get("id"))
            await self._ask(node, self.client.scancel(job.job_id))
            removed.append(str(job.job_id))
        return removed
