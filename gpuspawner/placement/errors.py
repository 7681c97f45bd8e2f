"""Typed errors of the placement module. Each carries words a person can act on: the spawn form
and the REST API show ``str(error)`` as it is."""

from __future__ import annotations

from dataclasses import dataclass, field


class PlacementError(Exception):
    """Base class of every refusal of the placement module."""

    #: machine-readable reason, used as a Prometheus label and in JSON answers
    reason: str = "placement"


class PlacementRefused(PlacementError):
    """No node can take the bundle now.

    Attributes:
        reason: short key: ``no_gpu_model``, ``gpus``, ``gpu_share``, ``numa``, ``cores``,
            ``memory``, ``disk`` or ``no_nodes``.
        detail: the sentence shown to the user.
        best_node: the node that came closest, or None.
    """

    def __init__(self, reason: str, detail: str, best_node: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.best_node = best_node


class QuotaExceeded(PlacementError):
    """The bundle would take the user (or one of the user's groups) over a quota.

    Attributes:
        scope: ``"user"`` or ``"group"``.
        name: the user's or group's name.
        resource: ``gpus`` (milli-GPU), ``cores``, ``memory_bytes``, ``disk_bytes`` or ``servers``.
        limit: the quota, in the resource's unit.
        used: what is held now.
        requested: what the bundle asks for.
    """

    reason = "quota"

    def __init__(self, scope: str, name: str, resource: str, limit: int, used: int,
                 requested: int, detail: str) -> None:
        super().__init__(detail)
        self.scope = scope
        self.name = name
        self.resource = resource
        self.limit = limit
        self.used = used
        self.requested = requested
        self.detail = detail


class UnknownAllocation(PlacementError, KeyError):
    """``release`` of an allocation id the ledger does not hold."""

    reason = "unknown_allocation"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown allocation"


@dataclass
class RestoreConflict:
    """An allocation that ``restore`` refused because it would double-book or no longer fits.

    Attributes:
        allocation_id: the refused allocation.
        owner: ``user/server`` text.
        problem: what clashed, e.g. ``"GPU GPU-1 already held by alice/ (a1b2...)"``.
    """

    allocation_id: str
    owner: str
    problem: str


@dataclass
class RestoreReport:
    """What ``Ledger.restore`` did: ids booked again, and conflicts refused (never booked)."""

    restored: list[str] = field(default_factory=list)
    conflicts: list[RestoreConflict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was refused."""
        return not self.conflicts
