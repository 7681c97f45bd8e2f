"""What the service shows, computed from the hub process's one
:class:`~gpuspawner.hub.cluster.Cluster`
(its ledger) at each request: no copy of the ledger, so nothing can drift. One cache: the JSON
view of each allocation (:func:`allocation_view`, :func:`allocation_json`), kept per
allocation object, which the ledger never changes (a new booking is a new object), so a
request over N allocations formats only those booked since the last one.

Units: memory and disk in bytes, GPUs in milli-GPU (1000 = one GPU) unless a key says
``gpus``, cores as logical CPU counts, times in seconds since the epoch.
"""

from __future__ import annotations

import colorsys
import datetime
import functools
import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from jinja2 import Environment, PackageLoader

from ...placement import GPU_MILLI, Allocation, Quota, Usage, format_bytes, format_cpu_list
from ...schemas import SCHEMA_NAMES, load_schema
from ...webui import environment
from ..cluster import Cluster

#: what a non-admin sees instead of another user's name
OTHER = "(another user)"


def node_views(cluster: Cluster, viewer: str | None) -> list[dict[str, Any]]:
    """``GET api/nodes``: the ledger's snapshot with per-node totals.

    Args:
        cluster: the hub's cluster.
        viewer: the requesting user's name, or None for an admin. A non-admin sees who holds
            a device only where it is themself; other holders read :data:`OTHER`, without
            allocation id or server name.

    Every viewer sees each node's ``state``/``state_reason``, ``gpu_share`` (what holds GPU
    shares there: ``{"mechanism": "dmem" | "mps" | "watchdog", "reason"}``, or null;
    :mod:`gpuspawner.gpushare.mechanism`) and each GPU's ``drained``
    (the reason, or null): a drained GPU takes no new servers, whoever asks. Admins also see
    who drained it and since when (``drained_by``: an admin's name or ``"health"``,
    ``drained_since``: seconds since the epoch).

    The answer's dicts and lists are new at every level (the caller may change them); the
    snapshot's are the ledger's, shared by every snapshot until their node changes, and are
    copied, never changed here.
    """
    out = []
    records = cluster.drain_records() if viewer is None else {}
    for shared in cluster.ledger.snapshot():
        # (every nested list and dict copied too: labels, cpus, cpus_free are the ledger's)
        node = {**shared, "labels": dict(shared["labels"]),
                "gpus": [{**g} for g in shared["gpus"]],
                "numa_nodes": [{**nn, "cpus": list(nn["cpus"]),
                                "cpus_free": list(nn["cpus_free"])}
                               for nn in shared["numa_nodes"]]}
        for g in node["gpus"]:
            g["holders"] = [_holder(h, viewer) for h in g["holders"]]
            if viewer is None:
                rec = records.get(g["uuid"]) if g.get("drained") is not None else None
                g["drained_by"] = rec.by if rec else None
                g["drained_since"] = rec.since if rec else None
        for nn in node["numa_nodes"]:
            nn["cpu_owners"] = {c: (u if viewer is None or u == viewer else OTHER)
                                for c, u in nn["cpu_owners"].items()}
        rt = cluster.nodes.get(node["name"])
        share = getattr(rt, "gpu_share", None)
        node["gpu_share"] = share.to_dict() if share is not None else None
        gpus = node["gpus"]
        node["summary"] = {
            "gpus_total": len(gpus),
            "gpus_free": sum(1 for g in gpus if g["milli_used"] == 0 and not g.get("drained")),
            "gpu_milli_used": sum(g["milli_used"] for g in gpus),
            "cores_total": sum(len(nn["cpus"]) for nn in node["numa_nodes"]),
            "cores_free": sum(len(nn["cpus_free"]) for nn in node["numa_nodes"]),
            "memory_bytes": sum(nn["memory_bytes"] for nn in node["numa_nodes"]),
            "memory_free_bytes": sum(nn["memory_free_bytes"] for nn in node["numa_nodes"]),
        }
        out.append(node)
    return out


def gpu_drain_view(cluster: Cluster, uuid: str, admin: bool = False) -> dict[str, Any]:
    """``POST``/``DELETE api/gpus/{uuid}/drain``: ``{"uuid", "node", "drained"}`` (the reason,
    or null) and, for admins, ``drained_by`` and ``drained_since`` (null when not drained).

    Raises:
        KeyError: no node has that GPU.
    """
    node = cluster.gpu_node(uuid)
    if node is None:
        raise KeyError(f"no node has GPU {uuid}")
    reason = cluster.ledger.drained_gpus().get(uuid)
    out: dict[str, Any] = {"uuid": uuid, "node": node, "drained": reason}
    if admin:
        rec = cluster.drain_records().get(uuid) if reason is not None else None
        out["drained_by"] = rec.by if rec else None
        out["drained_since"] = rec.since if rec else None
    return out


def _holder(h: Mapping[str, Any], viewer: str | None) -> dict[str, Any]:
    if viewer is None or h["user"] == viewer:
        return {**h, "mine": viewer is not None}
    return {"allocation": None, "user": OTHER, "server": None, "milli": h["milli"],
            "mine": False}


#: allocation id -> (the allocation, its view, its JSON text or ""): :func:`allocation_view`
_VIEWS: dict[str, tuple[Allocation, dict[str, Any], str]] = {}


def _cached(a: Allocation) -> tuple[Allocation, dict[str, Any], str]:
    # (also called from the admin map's worker thread: single dict reads and writes, and a
    # race makes the same view twice, never a wrong one)
    hit = _VIEWS.get(a.id)
    if hit is None or hit[0] is not a:  # (an allocation is frozen: a change is a new object)
        d = a.to_dict()
        d["gpu_milli"] = a.total_gpu_milli
        d["cpuset_text"] = a.cpuset_str()
        d["summary"] = a.summary()
        hit = _VIEWS[a.id] = (a, d, "")
    return hit


def allocation_view(a: Allocation) -> dict[str, Any]:
    """One allocation as JSON (``Allocation.to_dict`` plus readable fields), made once per
    allocation object and shared: callers must not change it."""
    return _cached(a)[1]


def _kept_text(a: Allocation) -> str:
    """The JSON text kept for this allocation object, or "" when none is kept yet."""
    hit = _VIEWS.get(a.id)
    return hit[2] if hit is not None and hit[0] is a else ""


def allocation_json(a: Allocation) -> str:
    """:func:`allocation_view` as JSON text (``json.dumps(..., sort_keys=True)``), made once per
    allocation object."""
    text = _kept_text(a)
    if not text:
        view = _cached(a)[1]
        text = json.dumps(view, sort_keys=True)
        _VIEWS[a.id] = (a, view, text)
    return text


def forget_released(current: Sequence[Allocation]) -> None:
    """Drop the cached views of allocations not in ``current`` (the ledger's whole list) once
    the cache holds more than twice as many as that (and 64): memory stays in proportion to
    what is booked."""
    if len(_VIEWS) > 2 * len(current) + 64:
        keep = {a.id for a in current}
        for key in list(_VIEWS):  # (a copy: the admin map's thread may add meanwhile)
            if key not in keep:
                _VIEWS.pop(key, None)


def allocation_views(cluster: Cluster, user: str | None = None) -> list[dict[str, Any]]:
    """``GET api/allocations``: every allocation (``user`` None) or one user's, oldest first
    (shared views: see :func:`allocation_view`)."""
    allocs = cluster.ledger.allocations(user)
    if user is None:
        forget_released(allocs)
    return [allocation_view(a) for a in allocs]


#: at most this many allocations not formatted yet are formatted on the event loop by one
#: ``GET api/allocations``; more (a burst of spawns since the last request) are formatted in
#: a worker thread (about 24 us each)
INLINE_FORMAT_MAX = 64


def allocation_list(cluster: Cluster, user: str | None = None) -> list[Allocation]:
    """Every allocation (``user`` None: also drops the cached views of released ones,
    :func:`forget_released`) or one user's, in the ledger's order (read on the event loop)."""
    allocs = cluster.ledger.allocations(user)
    if user is None:
        forget_released(allocs)
    return allocs


def unformatted(allocs: Sequence[Allocation]) -> int:
    """How many of ``allocs`` have no JSON text kept yet (a dict lookup each)."""
    return sum(1 for a in allocs if not _kept_text(a))


def allocations_text(allocs: Sequence[Allocation]) -> str:
    """``allocs`` as a JSON array, from each allocation's kept text (made for those that have
    none: safe in a worker thread, the allocations being frozen)."""
    return "[" + ", ".join(allocation_json(a) for a in allocs) + "]"


def allocations_json(cluster: Cluster, user: str | None = None) -> str:
    """:func:`allocation_views` as JSON text, the same as ``json.dumps(allocation_views(...),
    sort_keys=True)``, from each allocation's cached text: what ``GET api/allocations``
    answers, at the cost of a join once the allocations were formatted."""
    return allocations_text(allocation_list(cluster, user))


#: field names of Quota and Usage (``dataclasses.fields`` at each call was most of the admin
#: map's own time at 1,000 users)
_QUOTA_FIELDS = tuple(f.name for f in fields(Quota))
_USAGE_FIELDS = tuple(f.name for f in fields(Usage))


def quota_dict(q: Quota | None) -> dict[str, int | None] | None:
    """A quota's limits by resource (None = unlimited), or None when there is no quota."""
    if q is None:
        return None
    return {name: getattr(q, name) for name in _QUOTA_FIELDS}


def usage_dict(u: Usage) -> dict[str, int]:
    """What is held by resource (``Usage.to_dict``): milli-GPU, cores, bytes, servers."""
    return {name: getattr(u, name) for name in _USAGE_FIELDS}


def usage_view(cluster: Cluster, user: str, groups: Iterable[str],
               held: Sequence[Allocation] | None = None) -> dict[str, Any]:
    """``GET api/users/{name}/usage``: what the user holds, their quota, what each of their
    groups holds against its quota, what they may still take (the tightest limit), and their
    GPU shares over their memory now (``gpu_share_notices``: :meth:`Cluster.share_notices`).
    ``held``: the user's allocations when the caller has them already (the admin map asks for
    every user: one pass over the ledger, not one per user)."""
    ledger = cluster.ledger
    groups = sorted(set(groups))
    table = ledger.quotas
    return {
        "user": user,
        "groups": groups,
        "usage": usage_dict(ledger.usage(user)),
        "quota": quota_dict(table.user_quota(user)),
        "remaining": ledger.quota_remaining(user, groups),
        "group_quotas": [{
            "group": g,
            "usage": usage_dict(ledger.group_usage(g)),
            "quota": quota_dict(table.groups.get(g)),
        } for g in groups],
        "allocations": [a.id for a in (ledger.allocations(user) if held is None else held)],
        # shares over their GPU memory now (the watchdog's; the Lab GPU panel shows them)
        "gpu_share_notices": cluster.share_notices(user),
    }


# -- the admin map ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=65536)
def owner_colour(user: str) -> str:
    """A stable colour per user (hue from a hash of the name), as CSS ``hsl()``."""
    hue = int(hashlib.sha256(user.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue}, 65%, 45%)"


@functools.lru_cache(maxsize=4096)
def _mix(hue_css: str, fraction: float) -> str:
    """Lighter for less use: a share at 25 % is pale, an exclusive GPU full colour."""
    hue = int(hue_css[4:].split(",")[0])
    light = 0.88 - 0.43 * max(0.0, min(1.0, fraction))
    r, g, b = colorsys.hls_to_rgb(hue / 360, light, 0.65)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def page_templates() -> Environment:
    """The service's page templates (``service/templates``), which extend the hub-look layout
    of :mod:`gpuspawner.webui`."""
    return environment(PackageLoader("gpuspawner.hub", "service/templates"))


@functools.lru_cache(maxsize=4096)
def text_colour(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (``#rrggbb`` or ``hsl(h, s%,
    l%)``): the WCAG 2 contrast ratio against each (relative luminance, WCAG 2.1 §1.4.3)."""
    if background.startswith("hsl("):
        h, sat, light = (float(x.strip(" %")) for x in background[4:-1].split(","))
        rgb = colorsys.hls_to_rgb(h / 360, light / 100, sat / 100)
    else:
        rgb = tuple(int(background[i:i + 2], 16) / 255 for i in (1, 3, 5))

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2])
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def _health_text(cluster: Cluster, uuid: str) -> tuple[str, str]:
    """(``ok`` | ``unhealthy`` | ``unknown``, text) of a GPU's latest health reading (this
    host's GPUs only: :meth:`Cluster.health_nodes`)."""
    h = getattr(cluster, "last_health", {}).get(uuid)
    if h is None:
        return "unknown", "health not read"
    if h.healthy:
        return "ok", "healthy"
    return "unhealthy", "; ".join(h.reasons) or "unhealthy"


def map_view(cluster: Cluster) -> dict[str, Any]:
    """Everything the admin page renders: per node, one cell per GPU and one per NUMA node's
    cores (coloured by owner and utilisation), the allocations table and quota use."""
    nodes = node_views(cluster, None)
    ledger = cluster.ledger
    colours: dict[str, str] = {}
    rows = []
    for node in nodes:
        gpu_cells = []
        for g in node["gpus"]:
            owners = sorted({h["user"] for h in g["holders"]})
            for u in owners:
                colours.setdefault(u, owner_colour(u))
            frac = g["milli_used"] / GPU_MILLI
            colour = _mix(colours[owners[0]], frac) if owners else "#eeeeee"
            drained = g.get("drained")
            health, health_text = _health_text(cluster, g["uuid"])
            gpu_cells.append({
                "uuid": g["uuid"], "index": g["index"], "model": g["model"] or "GPU",
                "memory": format_bytes(g["memory_bytes"]) if g.get("memory_bytes") else "",
                "numa_node": g["numa_node"], "milli_used": g["milli_used"],
                "owners": owners, "colour": colour, "text_colour": text_colour(colour),
                "health": health, "health_text": health_text,
                "drained": drained, "drained_by": g.get("drained_by"),
                "title": f"GPU {g['index']} {g['model']} {g['uuid']}: "
                         + (f"{g['milli_used']}/1000 milli, " + ", ".join(owners)
                            if owners else "free")
                         + (f"; drained by {g.get('drained_by') or '?'}: {drained}"
                            if drained is not None else "")
                         + f"; {health_text}",
            })
        numa_cells = []
        for nn in node["numa_nodes"]:
            total = len(nn["cpus"])
            used = total - len(nn["cpus_free"])
            by_user: dict[str, int] = {}
            for u in nn["cpu_owners"].values():
                by_user[u] = by_user.get(u, 0) + 1
            for u in by_user:
                colours.setdefault(u, owner_colour(u))
            segments = [{"user": u, "cores": n, "colour": colours[u],
                         "percent": 100 * n / total} for u, n in sorted(by_user.items())]
            numa_cells.append({
                "id": nn["id"], "cores_total": total, "cores_used": used,
                "cpus": format_cpu_list(nn["cpus"]),
                "memory": format_bytes(nn["memory_bytes"]),
                "memory_used": format_bytes(nn["memory_bytes"] - nn["memory_free_bytes"]),
                "utilisation": used / total if total else 0.0,
                "segments": segments,
            })
        rows.append({"name": node["name"], "summary": node["summary"], "gpus": gpu_cells,
                     "numa": numa_cells, "state": node.get("state", "up"),
                     "state_reason": node.get("state_reason", ""),
                     "gpu_share": node.get("gpu_share")})
    allocs = ledger.allocations()
    forget_released(allocs)
    by_user: dict[str, list[Allocation]] = {}
    for a in allocs:  # one pass (a scan per user was quadratic: 1.2 s at 1,000 servers)
        by_user.setdefault(a.owner.user, []).append(a)
    users = sorted(set(by_user) | set(ledger.quotas.users))
    quota_rows = []
    unlimited = quota_dict(Quota())
    for u in users:  # the usage and quota of usage_view (its other parts are not shown)
        # no quota: every limit None (unlimited), which the page shows as usage alone
        quota_rows.append({"user": u, "usage": usage_dict(ledger.usage(u)),
                           "quota": quota_dict(ledger.quotas.user_quota(u)) or unlimited,
                           "colour": colours.get(u) or owner_colour(u)})
    group_rows = [{"group": g, "usage": usage_dict(ledger.group_usage(g)),
                   "quota": quota_dict(q) or {}} for g, q in sorted(ledger.quotas.groups.items())]
    return {
        "nodes": rows,
        "allocations": [allocation_view(a) for a in allocs],
        "quota_rows": quota_rows,
        "group_rows": group_rows,
        "default_quota": quota_dict(ledger.quotas.default_user),
        "legend": sorted(colours.items()),
        "drained": sum(1 for r in rows for g in r["gpus"] if g["drained"] is not None),
        "totals": {
            "gpus": sum(r["summary"]["gpus_total"] for r in rows),
            "gpus_free": sum(r["summary"]["gpus_free"] for r in rows),
            "gpu_milli_used": sum(r["summary"]["gpu_milli_used"] for r in rows),
            "allocations": len(allocs),
        },
        "policy": ledger.policy_name,
        "moves": [dict(m, when=datetime.datetime.fromtimestamp(m["at"]).strftime(
            "%Y-%m-%d %H:%M:%S")) for m in reversed(cluster.moves)],
    }


def schema_list_view(prefix: str) -> list[dict[str, Any]]:
    """``GET api/schemas``: the configuration's JSON Schemas (:mod:`gpuspawner.schemas`), one
    item per schema: ``name``, ``title`` (what it describes, e.g. ``GPUSpawner.profiles``),
    ``description`` and ``url`` (``<prefix>api/schemas/<name>``, the schema itself)."""
    out = []
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        out.append({"name": name, "title": schema["title"],
                    "description": schema["description"], "id": schema["$id"],
                    "url": f"{prefix}api/schemas/{name}"})
    return out


def schema_view(name: str) -> dict[str, Any] | None:
    """``GET api/schemas/{name}``: the JSON Schema (draft 2020-12) ``name``, or None when
    there is none of that name."""
    return load_schema(name) if name in SCHEMA_NAMES else None


def queue_view(cluster: Cluster, viewer: str | None, now: float | None = None
               ) -> dict[str, Any]:
    """``GET api/queue``: the wait queue in its fair order.

    ``length``, ``by_profile`` (slug -> entries) and ``waiting_gpus`` (GPU model, or "GPU"
    for any model -> entries that want GPUs of it) count every entry for everyone; ``entries``
    lists all of them for admins (``viewer`` None), else only the viewer's. An entry:
    ``id, user, server, profile, position`` (1-based), ``enqueued`` (ISO 8601 UTC),
    ``waited_s`` (seconds), ``wants`` (words), ``gpus``, ``gpu_milli``, ``gpu_models``,
    ``cores``, ``memory_bytes``, ``nodes`` (the nodes it may use; empty = any), ``bypassed``,
    ``restored`` (waiting for its re-spawn after a hub restart), ``note`` (e.g. "a node
    is being started for this, about 2 min": :mod:`gpuspawner.elastic`; "" = none) and
    ``fairshare_factor`` (the owner's fair-share factor over decayed past GPU usage, 0..1,
    1 = no past usage or fair share over time off:
    :meth:`~gpuspawner.placement.queue.WaitQueue.fairshare_factor`).
    """
    t = time.time() if now is None else now
    q = cluster.queue
    order = q.wq.order() if q is not None else []
    factors = q.wq.fairshare_factors() if q is not None else {}
    waiting_gpus: dict[str, int] = {}
    entries = []
    for i, e in enumerate(order, 1):
        b = e.bundle
        if b.total_gpu_milli:
            for m in b.gpu_models or ("GPU",):
                waiting_gpus[m] = waiting_gpus.get(m, 0) + 1
        if viewer is not None and e.owner.user != viewer:
            continue
        entries.append({
            "id": e.id, "user": e.owner.user, "server": e.owner.server, "profile": e.profile,
            "position": i,
            "enqueued": datetime.datetime.fromtimestamp(e.enqueued, datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "waited_s": round(max(0.0, t - e.enqueued), 1),
            "wants": q.wq.gpus_wanted(e) or b.describe(),  # type: ignore[union-attr]
            "gpus": b.gpus, "gpu_milli": b.gpu_milli, "gpu_models": list(b.gpu_models),
            "cores": b.cores, "memory_bytes": b.memory_bytes, "nodes": list(e.nodes),
            "bypassed": e.bypassed,
            "restored": not e.claimed,
            "note": q.note(e) or "",  # type: ignore[union-attr]
            "fairshare_factor": round(factors.get(e.owner.user, 1.0), 6),
        })
    return {"length": len(order),
            "by_profile": q.wq.count_by_profile() if q is not None else {},
            "waiting_gpus": waiting_gpus, "entries": entries}
