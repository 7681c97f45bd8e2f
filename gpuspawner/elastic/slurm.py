"""Elastic nodes of the Slurm backend: Slurm's own power saving (provider ``"slurm"``).

A node entry with ``elastic: true``, a ``category`` and ``provider: "slurm"`` names a Slurm node
under Slurm's power saving (``SuspendProgram`` / ``ResumeProgram`` / ``SuspendTime`` in
slurm.conf, often ``State=CLOUD``; slurm.conf(5), Slurm's power_save.html). Slurm starts and
stops it: a job sent to a powered-down node makes slurmctld run ``ResumeProgram`` and start
the job once the node registers; ``SuspendTime`` seconds after it fell idle slurmctld runs
``SuspendProgram``. The hub only shows the state and chooses when to send a server there:

- powered down (``scontrol show node``: ``POWERED_DOWN`` or ``POWERING_DOWN``, sinfo ``~`` or
  ``%``) with nothing booked: ``off`` in the ledger (*can start*: a request that fits only it
  waits in the queue, as for any elastic node; nothing is placed there);
- the default policy (or the site's, ``c.GPUElastic.policy``) decides a start (a request waited
  ``scale_out_after``, within ``max_nodes`` and ``starts_per_hour``): the node is ``starting``
  and ``up`` in the ledger, so the waiting request is placed there and its job submitted;
  slurmctld resumes the node for it ("a node is being started (Slurm power saving), about N
  min" while it waits);
- powered up (no power flag) and responding: ``running``; its health is the backend's as for
  any node;
- back to ``off`` when Slurm has powered it down and nothing is booked there, or when a start
  got no booking within ``join_timeout`` (the request went elsewhere or was withdrawn).

The hub never stops such a node itself (``idle_shutdown`` and the policy's stops do not apply:
Slurm's ``SuspendTime`` does), keeps no state file (Slurm's state is the truth, read every
``interval``), and never runs ``ResumeProgram`` or ``SuspendProgram`` itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..placement.queue import QueueEntry
from .config import ElasticSettings
from .manager import ElasticManager, Slot, _minutes
from .policy import Decision

log = logging.getLogger("gpuspawner")

__all__ = ["POWER_FLAGS", "SlurmPowerManager", "slurm_power_state"]

#: ``scontrol show node`` state flags of power saving (Slurm 22.05: POWERED_DOWN,
#: POWERING_DOWN, POWERING_UP, POWER_DOWN = asked to power down)
POWER_FLAGS = frozenset({"POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN"})


def slurm_power_state(state: str, flags: frozenset[str]) -> str:
    """Where a node under Slurm's power saving stands, from its ``scontrol show node`` state
    and flags (:class:`~gpuspawner.backends.slurm.commands.NodeInfo`):

    ``"down"`` (DOWN, FAIL or drained: a failed resume is DOWN+POWERED_DOWN), ``"off"``
    (powered down or powering down), ``"starting"`` (POWERING_UP), ``"running"`` (powered up:
    no power flag).
    """
    if state == "DOWN" or "FAIL" in flags or "DRAIN" in flags or state in ("DRAINED", "DRAIN"):
        return "down"
    if "POWERING_UP" in flags:
        return "starting"
    if flags & {"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"}:
        return "off"
    return "running"


class SlurmPowerManager(ElasticManager):
    """The elastic manager of Slurm power-saving nodes (see the module's docstring): the
    policy's starts make a powered-down node placeable; Slurm does the rest.

    Args:
        cluster: the hub's :class:`~gpuspawner.hub.cluster.Cluster` (Slurm backend).
        settings: the checked ``c.GPUElastic``.
    """

    def __init__(self, cluster: Any, settings: ElasticSettings, clock: Any = None) -> None:
        kwargs = {"clock": clock} if clock is not None else {}
        super().__init__(cluster, settings, {}, **kwargs)
        #: what Slurm said last per node: "off", "starting", "running", "down", "unknown"
        self.slurm_state: dict[str, str] = {n: "unknown" for n in self.slots}

    # -- wiring ---------------------------------------------------------------------------
    def attach(self) -> None:
        """Bind the backend to every node (the Slurm backend submits to powered-down nodes
        too), set the elastic nodes ``off`` until Slurm's state is read, hang the notes."""
        self.cluster.backend.bind(dict(self.cluster.nodes))
        for slot in self.slots.values():
            self.cluster.ledger.set_node_state(slot.name, "off", self._off_reason(slot))
        self.cluster.elastic = self
        self.cluster.queue.wait_note = self.note

    def live(self, name: str) -> bool:
        """Whether the backend's health applies to node ``name``: a fixed node, or one
        being started or running."""
        slot = self.slots.get(name)
        return slot is None or slot.state in ("starting", "running")

    def save(self) -> None:
        """Nothing: Slurm keeps the nodes' power states."""

    def load(self) -> None:
        """Nothing: Slurm keeps the nodes' power states (read at each step)."""

    def _off_reason(self, slot: Slot) -> str:
        cs = self.settings.categories[slot.category]
        return (
            f"elastic node of category {slot.category}: powered down by Slurm's power saving, "
            f"started by Slurm when a request needs it ({_minutes(cs.start_s)})"
        )

    def note(self, entry: QueueEntry) -> str | None:
        """As :meth:`ElasticManager.note`, naming Slurm's power saving for a start."""
        text = super().note(entry)
        if text and text.startswith("a node is being started, "):
            text = "a node is being started (Slurm power saving), " + text[len(
                "a node is being started, "):]
        return text

    # -- Slurm's state --------------------------------------------------------------------
    async def sync(self) -> None:
        """Read the nodes' power states from Slurm (``scontrol show node``) and follow them
        (module docstring). A controller that does not answer changes nothing."""
        try:
            infos = {n.name: n for n in await self.cluster.backend.client.show_nodes()}
        except Exception as e:
            log.warning("elastic nodes (Slurm): scontrol show node failed: %s", e)
            return
        booked: set[str] = {a.node for a in self.cluster.ledger.allocations()}
        now = self._clock()
        for slot in self.slots.values():
            info = infos.get(slot.name)
            power = "down" if info is None else slurm_power_state(info.state, info.flags)
            before = self.slurm_state.get(slot.name)
            self.slurm_state[slot.name] = power
            if power != before:
                log.info("elastic node %s: Slurm says %s", slot.name,
                         "unknown node" if info is None else
                         "+".join([info.state, *sorted(info.flags)]))
            if power == "running" and slot.state != "running":
                slot.state, slot.joined_at, slot.idle_since, slot.error = "running", now, None, ""
                self._backoff.pop(slot.category, None)
                self.cluster.ledger.set_node_state(slot.name, "up")
                log.info("elastic node %s is powered up (Slurm)", slot.name)
                self._moved()
            elif power in ("off", "down") and slot.state == "running" and slot.name not in booked:
                slot.state, slot.joined_at, slot.idle_since = "off", 0.0, None
                reason = (self._off_reason(slot) if power == "off" else
                          f"Slurm: {info.state if info else 'unknown node'}"
                          f"{': ' + info.reason if info and info.reason else ''}")
                self.cluster.ledger.set_node_state(slot.name, "off", reason)
                log.info("elastic node %s is powered down (Slurm)", slot.name)
                self._moved()
            elif slot.state == "starting" and slot.name not in booked and power != "starting" \
                    and now - slot.started_at > self.settings.join_timeout:
                slot.state = "off"
                self.cluster.ledger.set_node_state(slot.name, "off", self._off_reason(slot))
                log.info("elastic node %s: nothing was sent there within join_timeout; off "
                         "again", slot.name)
                self._moved()
            elif slot.state == "off" and power == "down":
                self.cluster.ledger.set_node_state(
                    slot.name, "off",
                    f"{self._off_reason(slot)}; Slurm says it is down"
                    f"{': ' + info.reason if info and info.reason else ''}")

    async def step(self) -> list[Decision]:
        """One look: Slurm's states (:meth:`sync`), then the policy's starts."""
        await self.sync()
        return await super().step()

    def _may_stop(self, d: Decision) -> bool:
        return False  # Slurm's SuspendTime powers idle nodes down, not the hub

    async def _start(self, slot: Slot) -> None:
        """Make the node placeable: the waiting request is placed there, its job submitted,
        and slurmctld resumes the node for it (ResumeProgram)."""
        cs = self.settings.categories[slot.category]
        slot.handle = ""  # the hub never stops it
        self.cluster.ledger.set_node_state(
            slot.name, "up",
            f"being started by Slurm's power saving for a job, {_minutes(cs.start_s)}")
        log.info("elastic node %s: placeable; Slurm resumes it for the job sent there",
                 slot.name)
        self._moved()

    def status(self) -> list[dict[str, Any]]:
        """As :meth:`ElasticManager.status`, with ``slurm``: Slurm's power state."""
        out = super().status()
        for row in out:
            row["provider"] = "slurm"
            row["slurm"] = self.slurm_state.get(row["name"], "unknown")
        return out


def check_slurm_providers(provs: Mapping[str, str], backend_name: str) -> None:
    """``provider: "slurm"`` needs the Slurm backend, and the Slurm backend needs it.

    Raises:
        ValueError: the node and why.
    """
    for pname, node in provs.items():
        if backend_name == "slurm" and pname != "slurm":
            raise ValueError(
                f"node {node}'s provider: {pname!r}; elastic nodes of the slurm backend use "
                "provider \"slurm\" (Slurm's power saving starts and stops them)")
        if backend_name != "slurm" and pname == "slurm":
            raise ValueError(
                f"node {node}'s provider: \"slurm\" (Slurm's power saving) needs "
                "c.GPUSpawner.backend = \"slurm\"")
