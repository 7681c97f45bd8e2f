"""Quotas per user and per group, checked inside the ledger's atomic reservation step.

A *user* quota limits what one user holds in all (all servers, all nodes). A *group* quota limits
what all members of the group hold together (the project quota of Backend.AI, seed 003). A user
without an entry of their own gets ``default_user``; a group without an entry is unlimited.
A field left as None is unlimited. GPU amounts are in milli-GPU (1000 = one whole GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import QuotaExceeded
from .units import GPU_MILLI, format_bytes, parse_bytes


@dataclass(frozen=True)
class Usage:
    """Resources held: milli-GPU, cores, memory bytes, disk bytes, running servers."""

    gpu_milli: int = 0
    cores: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    servers: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, int]:
        """JSON-ready dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Quota:
    """Upper limits; None = unlimited.

    Attributes:
        gpu_milli: milli-GPU (``Quota.from_dict({"gpus": 2})`` gives 2000).
        cores: logical CPUs.
        memory_bytes: bytes.
        disk_bytes: bytes.
        servers: running servers.
    """

    gpu_milli: int | None = None
    cores: int | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    servers: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "quota") -> Quota:
        """Build from config: keys ``gpus`` (whole GPUs, may be fractional) or ``gpu_milli``,
        ``cores``, ``memory`` / ``disk`` (size strings like "64G" or bytes), ``servers``.

        Raises:
            ValueError: unknown key or bad value; the message starts with ``where.key``.
        """
        out: dict[str, int | None] = {}
        for key, value in data.items():
            try:
                if value is None:
                    continue
                if key == "gpus":
                    out["gpu_milli"] = round(float(value) * GPU_MILLI)
                elif key in ("gpu_milli", "cores", "servers"):
                    out[key] = int(value)
                elif key in ("memory", "memory_bytes"):
                    out["memory_bytes"] = parse_bytes(value)
                elif key in ("disk", "disk_bytes"):
                    out["disk_bytes"] = parse_bytes(value)
                else:
                    raise ValueError("unknown key; expected gpus, gpu_milli, cores, memory, "
                                     "disk or servers")
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}.{key}: {e}") from None
            if any(v is not None and v < 0 for v in out.values()):
                raise ValueError(f"{where}.{key}: must be >= 0")
        return cls(**out)

    def describe(self, resource: str, value: int) -> str:
        """Format an amount of ``resource`` for people (GPUs, cores, GiB)."""
        return _fmt(resource, value)


def _fmt(resource: str, value: int) -> str:
    if resource == "gpu_milli":
        n = value / GPU_MILLI
        return f"{n:g} GPU" + ("" if n == 1 else "s")
    if resource in ("memory_bytes", "disk_bytes"):
        return format_bytes(value)
    if resource == "cores":
        return f"{value} core" + ("" if value == 1 else "s")
    return f"{value} server" + ("" if value == 1 else "s")


_LABEL = {"gpu_milli": "GPUs", "cores": "cores", "memory_bytes": "memory",
          "disk_bytes": "disk", "servers": "servers"}


@dataclass
class QuotaTable:
    """The site's quotas.

    Attributes:
        users: per-user quotas by user name.
        groups: per-group quotas (the members' sum) by group name.
        default_user: applies to users without an entry in ``users``; None = unlimited.
    """

    users: dict[str, Quota] = field(default_factory=dict)
    groups: dict[str, Quota] = field(default_factory=dict)
    default_user: Quota | None = None

    @classmethod
    def from_config(cls, users: Mapping[str, Any] | None = None,
                    groups: Mapping[str, Any] | None = None,
                    default_user: Mapping[str, Any] | None = None) -> QuotaTable:
        """Build from plain dicts as they appear in ``jupyterhub_config.py``.

        Raises:
            ValueError: a malformed entry (the message names it, e.g. ``groups.students.gpus``).
        """
        return cls(
            users={u: Quota.from_dict(q, f"users.{u}") for u, q in (users or {}).items()},
            groups={g: Quota.from_dict(q, f"groups.{g}") for g, q in (groups or {}).items()},
            default_user=Quota.from_dict(default_user, "default_user") if default_user else None,
        )

    def user_quota(self, user: str) -> Quota | None:
        """The quota that limits one user's own total, or None."""
        return self.users.get(user, self.default_user)

    def check(self, user: str, groups: tuple[str, ...], request: Usage,
              user_used: Usage, group_used: Mapping[str, Usage]) -> None:
        """Raise QuotaExceeded if ``request`` on top of current use breaks a user or group quota.

        Raises:
            QuotaExceeded: naming the scope, the resource, the limit and what is left.
        """
        checks: list[tuple[str, str, Quota, Usage]] = []
        uq = self.user_quota(user)
        if uq is not None:
            checks.append(("user", user, uq, user_used))
        for g in groups:
            gq = self.groups.get(g)
            if gq is not None:
                checks.append(("group", g, gq, group_used.get(g, Usage())))
        for scope, name, quota, used in checks:
            for f in fields(Quota):
                limit = getattr(quota, f.name)
                want = getattr(request, f.name)
                have = getattr(used, f.name)
                if limit is None or want == 0 or have + want <= limit:
                    continue
                left = max(0, limit - have)
                who = "your quota" if scope == "user" else f"group {name}'s quota"
                detail = (f"over {who} for {_LABEL[f.name]}: asked for {_fmt(f.name, want)}, "
                          f"{_fmt(f.name, have)} of {_fmt(f.name, limit)} in use, "
                          f"{who} allows {_fmt(f.name, left)} more")
                raise QuotaExceeded(scope, name, f.name, limit, have, want, detail)

    def remaining(self, user: str, groups: tuple[str, ...], user_used: Usage,
                  group_used: Mapping[str, Usage]) -> dict[str, int | None]:
        """What the user may still take of each resource (the tightest of the user's quota and
        each group's), None where unlimited. Units as in :class:`Usage`."""
        out: dict[str, int | None] = {f.name: None for f in fields(Quota)}
        pairs: list[tuple[Quota, Usage]] = []
        uq = self.user_quota(user)
        if uq is not None:
            pairs.append((uq, user_used))
        for g in groups:
            if g in self.groups:
                pairs.append((self.groups[g], group_used.get(g, Usage())))
        for quota, used in pairs:
            for f in fields(Quota):
                limit = getattr(quota, f.name)
                if limit is None:
                    continue
                left = max(0, limit - getattr(used, f.name))
                cur = out[f.name]
                out[f.name] = left if cur is None else min(cur, left)
        return out
