"""One culling pass: signals -> policy -> keep / warn / cull, for every ready server.

Per server (``user/server``), with ``now`` in epoch seconds and the user's effective policy
(:mod:`idle_culler.policies`), each reason has a *due time*:

- ``max_age``: ``started + max_age`` (even when active);
- ``idle``: ``last + idle_timeout`` where ``last`` is the latest of the hub's
  ``last_activity`` (proxy traffic and activity reported by the single-user server), the last
  time the container's network rate was at or above ``network_floor`` (bytes/s; Docker stats),
  and, under a GPU policy, the last GPU sample at or above ``gpu_idle_threshold`` (or the last
  pass at which the mean over ``gpu_window`` was): a busy GPU is activity;
- ``gpu_idle``: now, once the mean utilisation (percent) of the allocation's GPUs over the whole
  ``gpu_window`` (seconds) is below ``gpu_idle_threshold``; ``now + warning`` when it is already
  below over the last ``gpu_window - warning`` seconds (so that the warning can come first).

- ``pressure_idle``: ``last + pressure_idle_timeout`` while gpuspawner's wait queue holds a
  spawn that wants GPUs of a model the server's allocation holds, or any GPU
  (:mod:`idle_culler.pressure`); only for GPU servers, only where ``idle_timeout`` is on and
  longer (it is the shorter idle timeout "under pressure"); the queue is read once per pass
  and any failure to read it means no pressure (never cull early on a guess).

``idle``, ``pressure_idle`` and ``gpu_idle`` are never due before ``started + grace_period``.
The earliest due reason wins. Without a warning lead time a server is culled when due <= now.
With one, the server is first marked "will be culled at T, because ..." as soon as due <= now +
warning, and culled at ``max(due, warned_since + warning)``; if activity resumes (due moves
past now + warning) the mark is withdrawn. Pending, starting or not-ready servers are never
culled; exempt users are never culled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuspawner.server_state import ServerState

from .gpu import GPUHistory
from .hub import HubAPIError, HubClient
from .netstats import NetworkMeter
from .policies import PolicySet
from .pressure import Demand, NodeCapacity, Pressure

log = logging.getLogger("idle_culler")

#: users decided together: their servers' network counters are read at once
NETWORK_BATCH = 100
#: the reasons a server is culled, as used in the cull log and the Prometheus label
REASONS = ("idle", "pressure_idle", "gpu_idle", "max_age")


def parse_ts(value: str | None) -> float | None:
    """Epoch seconds from the hub's ISO 8601 timestamps (``2026-01-01T00:00:00.123Z``)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    """ISO 8601 UTC, second resolution, from epoch seconds."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_uuids(server: dict[str, Any]) -> list[str]:
    """GPU UUIDs of the server's allocation in its spawner ``state``, read through
    :class:`gpuspawner.server_state.ServerState` (GPUSpawner stores
    ``state["allocation"]["gpus"] = [{"uuid": ..., "milli": ...}]``; needs the
    ``admin:server_state`` scope to be visible)."""
    return ServerState.from_state(server.get("state")).gpu_uuids


@dataclass
class Decision:
    """What a pass decided for one server. ``action``: ``keep`` | ``warn`` | ``cull`` |
    ``skip`` (pending / not ready); ``reason``: one of :data:`REASONS`, or ``exempt``,
    ``active``, ``pending``; ``due``/``cull_at``: epoch seconds; ``figures``: the measured
    values (seconds, percent, bytes/s) the decision was based on."""

    user: str
    server: str
    action: str
    reason: str
    message: str = ""
    due: float | None = None
    cull_at: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.user}/{self.server}"

    def to_json(self) -> dict[str, Any]:
        d = {"user": self.user, "server": self.server, "action": self.action,
             "reason": self.reason, "message": self.message, "figures": self.figures,
             "policy": self.policy}
        if self.due is not None:
            d["due"] = iso(self.due)
        if self.cull_at is not None:
            d["cull_at"] = iso(self.cull_at)
        return d


@dataclass
class Warning_:
    reason: str
    since: float
    cull_at: float


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


class Culler:
    """The pass logic, independent of how it is scheduled or configured (see
    :class:`idle_culler.app.IdleCuller`). ``clock`` returns epoch seconds (tests shift it)."""

    def __init__(self, hub: HubClient, policies: PolicySet, *, history: GPUHistory | None = None,
                 network: NetworkMeter | None = None, dry_run: bool = False,
                 cull_users: bool = False, remove_named_servers: bool = False,
                 page_size: int = 0, cull_log: str | Path | None = None,
                 metrics: Any = None, clock: Callable[[], float] = time.time,
                 gpuspawner_url: str | None = None, queue_timeout: float = 10.0) -> None:
        self.hub = hub
        self.policies = policies
        self.history = history or GPUHistory()
        self.network = network
        self.dry_run = dry_run
        self.cull_users = cull_users
        self.remove_named_servers = remove_named_servers
        self.page_size = page_size
        self.cull_log = Path(cull_log) if cull_log else None
        self.metrics = metrics
        self.clock = clock
        self.warnings: dict[str, Warning_] = {}
        self._net_active: dict[str, float] = {}
        self._gpu_active: dict[str, float] = {}
        #: "user/server" -> latest decision (the status the web API shows)
        self.status: dict[str, Decision] = {}
        #: the last culls (newest last), also in the cull log
        self.recent: list[dict[str, Any]] = []
        self.last_pass: dict[str, Any] = {}
        self.seen_gpus: set[str] = set()
        #: where gpuspawner's service is (``http://127.0.0.1:8000/services/gpuspawner/``);
        #: None: no queue, never culled early
        self.gpuspawner_url = gpuspawner_url.rstrip("/") + "/" if gpuspawner_url else None
        self.queue_timeout = queue_timeout
        #: the queue's GPU demand read at the start of this pass (None: no pressure)
        self.demand: Demand | None = None
        #: GPU UUID -> model, from gpuspawner's inventory (kept across passes)
        self.gpu_model: dict[str, str] = {}
        #: GPU UUID -> node name, and node name -> what it could hold, from the same inventory
        self.gpu_node: dict[str, str] = {}
        self.node_capacity: dict[str, NodeCapacity] = {}
        #: what the last queue read gave, for the status (``ok``, ``length``, ``error``)
        self.queue_status: dict[str, Any] = {}
        self._no_service_logged = False
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ decision
    def evaluate(self, user: dict[str, Any], name: str, server: dict[str, Any],
                 now: float) -> Decision:
        """Decide for one server (pure apart from the warning and activity memory)."""
        uname = user["name"]
        key = f"{uname}/{name}"
        pol = self.policies.resolve(uname, user.get("groups") or [])
        pj = pol.to_json()
        if server.get("pending") or not server.get("ready"):
            self.warnings.pop(key, None)
            return Decision(uname, name, "skip", "pending",
                            f"server is {server.get('pending') or 'not ready'}", policy=pj)
        if pol.exempt:
            self.warnings.pop(key, None)
            return Decision(uname, name, "keep", "exempt", "exempt by policy", policy=pj)

        started = parse_ts(server.get("started"))
        started = now if started is None else started
        hub_last = parse_ts(server.get("last_activity"))
        hub_last = started if hub_last is None else hub_last
        age = now - started
        fig: dict[str, Any] = {"age_s": round(age, 1),
                               "hub_inactive_s": round(now - hub_last, 1)}
        last = hub_last

        # network bytes/s from Docker stats (only where a floor is set and the signal exists)
        if self.network is not None and pol.network_floor > 0:
            rate = self.network.observe(key, server.get("state") or {}, now)
            if rate is not None:
                fig["net_rate_Bps"] = round(rate, 1)
                if rate >= pol.network_floor:
                    self._net_active[key] = now
            if key in self._net_active:
                last = max(last, self._net_active[key])

        # GPU utilisation over the window
        due_gpu: float | None = None
        state = ServerState.from_state(server.get("state"))
        uuids = state.gpu_uuids
        self.seen_gpus.update(uuids)
        if uuids:
            fig["gpus"] = uuids
        if uuids and pol.gpu_idle_threshold > 0:
            w = self.history.mean(uuids, pol.gpu_window, now, pol.gpu_idle_threshold,
                                  since=started)
            fig.update({"gpu_mean_percent": None if w.mean is None else round(w.mean, 1),
                        "gpu_window_s": pol.gpu_window, "gpu_samples": w.samples,
                        "gpu_window_covered": w.covered})
            if w.busy_at is not None:  # the last sample at or above the threshold
                self._gpu_active[key] = max(self._gpu_active.get(key, 0.0), w.busy_at)
            if w.mean is not None and w.mean >= pol.gpu_idle_threshold:
                self._gpu_active[key] = now
            elif w.covered and w.mean is not None:
                due_gpu = now
            elif pol.warning > 0 and pol.warning < pol.gpu_window:
                part = self.history.mean(uuids, pol.gpu_window - pol.warning, now,
                                         since=started)
                if part.covered and part.mean is not None and \
                        part.mean < pol.gpu_idle_threshold:
                    due_gpu = now + pol.warning
            if key in self._gpu_active:
                last = max(last, self._gpu_active[key])
        fig["inactive_s"] = round(now - last, 1)
        pressure = self.pressure_on(uuids, state.node) if (
            pol.pressure_idle_timeout > 0 and pol.idle_timeout > pol.pressure_idle_timeout
        ) else None
        if pressure is not None:
            fig["pressure"] = pressure.to_json()

        dues: list[tuple[float, str, str]] = []
        grace_end = started + pol.grace_period
        if pol.max_age > 0:
            dues.append((started + pol.max_age, "max_age",
                         f"running for {_fmt_s(age)}, max age {_fmt_s(pol.max_age)}"))
        if pol.idle_timeout > 0:
            dues.append((max(last + pol.idle_timeout, grace_end), "idle",
                         f"no activity for {_fmt_s(now - last)}, "
                         f"idle timeout {_fmt_s(pol.idle_timeout)}"))
        if pressure is not None:
            dues.append((max(last + pol.pressure_idle_timeout, grace_end), "pressure_idle",
                         f"culled early: {pressure.text} (no activity for "
                         f"{_fmt_s(now - last)}, idle timeout under pressure "
                         f"{_fmt_s(pol.pressure_idle_timeout)} instead of "
                         f"{_fmt_s(pol.idle_timeout)})"))
        if due_gpu is not None:
            mean = fig.get("gpu_mean_percent")
            dues.append((max(due_gpu, grace_end), "gpu_idle",
                         f"GPU utilisation {mean}% over {_fmt_s(pol.gpu_window)}, "
                         f"below {pol.gpu_idle_threshold:g}%"))
        if not dues:
            self.warnings.pop(key, None)
            return Decision(uname, name, "keep", "active", "no limit applies", figures=fig,
                            policy=pj)
        due, reason, why = min(dues)
        warn = self.warnings.get(key)
        if pol.warning <= 0:
            if due <= now:
                return Decision(uname, name, "cull", reason, why, due, now, fig, pj)
            return Decision(uname, name, "keep", "active", f"next: {reason} at {iso(due)}",
                            due, None, fig, pj)
        if due > now + pol.warning:
            self.warnings.pop(key, None)
            return Decision(uname, name, "keep", "active", f"next: {reason} at {iso(due)}",
                            due, None, fig, pj)
        if warn is None:
            warn = self.warnings[key] = Warning_(reason, now, 0.0)
        warn.reason = reason
        warn.cull_at = max(due, warn.since + pol.warning)
        if now >= warn.cull_at:
            self.warnings.pop(key, None)
            return Decision(uname, name, "cull", reason, why, due, warn.cull_at, fig, pj)
        return Decision(uname, name, "warn", reason,
                        f"will be culled at {iso(warn.cull_at)}, because {why}",
                        due, warn.cull_at, fig, pj)

    def pressure_on(self, uuids: list[str], node: str = "") -> Pressure | None:
        """Who waits in the queue (read this pass) for GPUs a server holding ``uuids`` on
        ``node`` could free; None for a CPU-only server, without a queue, or when nobody waits
        for its models. Only entries that would fit on the server's node count (its capacity
        from the inventory; the node is the state's, else the one listing its GPUs): a spawn
        that could never run there shortens nobody's timeout on it. A GPU whose model is
        unknown (inventory not readable) matches only entries that accept any model."""
        if not uuids or not self.demand:
            return None
        models = {self.gpu_model[u] for u in uuids if self.gpu_model.get(u)}
        name = node or next((self.gpu_node[u] for u in uuids if u in self.gpu_node), "")
        return self.demand.match(models, self.node_capacity.get(name))

    def set_inventory(self, nodes: list[dict[str, Any]]) -> None:
        """Keep what gpuspawner's inventory (``GET api/nodes``) says: each GPU's model and
        node, each node's capacity (:class:`~idle_culler.pressure.NodeCapacity`).

        Raises:
            ValueError: a node of ``nodes`` is malformed (the message names it).
        """
        for n in nodes:
            cap = NodeCapacity.from_json(n)
            self.node_capacity[cap.name] = cap
            for g in n.get("gpus") or []:
                if isinstance(g, dict) and g.get("uuid"):
                    self.gpu_model[str(g["uuid"])] = str(g.get("model") or "")
                    self.gpu_node[str(g["uuid"])] = cap.name

    async def read_queue(self) -> Demand | None:
        """Read gpuspawner's wait queue (once per pass) and, when entries wait for named
        models, its inventory (GPU UUID -> model). Never raises: no URL, a 404 (no gpuspawner
        service: logged once), or any error (logged) give None, i.e. no pressure this pass;
        an inventory that cannot be read leaves the last one read (models only match "any
        GPU" entries for GPUs it never listed)."""
        if self.gpuspawner_url is None or not self.policies.sets("pressure_idle_timeout"):
            self.queue_status = {"ok": False, "error": "not read (no gpuspawner URL or no "
                                 "pressure_idle_timeout in the policies)"}
            return None
        url = self.gpuspawner_url + "api/queue"
        try:
            doc = await self.hub.gpu_queue(url, self.queue_timeout)
            if doc is None:
                if not self._no_service_logged:
                    log.warning("no gpuspawner service at %s (404): no culling under pressure "
                                "until it answers", url)
                    self._no_service_logged = True
                self.queue_status = {"ok": False, "error": f"{url}: 404"}
                return None
            demand = Demand.from_json(doc)
        except (HubAPIError, ValueError) as e:
            log.warning("reading the queue failed, no culling under pressure this pass: %s", e)
            if self.metrics:
                self.metrics.errors.inc()
            self.queue_status = {"ok": False, "error": str(e)[:300]}
            return None
        self._no_service_logged = False
        if demand:  # the models and the nodes' capacity: who would fit where
            try:
                self.set_inventory(await self.hub.gpu_nodes(
                    self.gpuspawner_url + "api/nodes", self.queue_timeout))
            except (HubAPIError, ValueError) as e:
                log.warning("reading gpuspawner's inventory failed (only 'any GPU' entries "
                            "count for GPUs not seen before): %s", e)
        self.queue_status = {"ok": True, "length": demand.length,
                             "waiting_gpus": {demand.names[k]: n
                                              for k, n in sorted(demand.spawns.items())}}
        return demand

    # ------------------------------------------------------------------ pass
    async def run_pass(self) -> list[Decision]:
        """One pass over all ready servers; returns every decision. Listing errors (after the
        hub client's retries) abort the pass (nothing is culled on partial knowledge of a
        server: each decision uses only that server's model from this pass); an error while
        culling one server is logged and counted and does not stop the others."""
        async with self._lock:
            return await self._run_pass()

    async def _run_pass(self) -> list[Decision]:
        t0 = time.perf_counter()
        self.demand = await self.read_queue()
        now = self.clock()
        decisions: list[Decision] = []
        tasks: list[asyncio.Task[None]] = []
        seen: set[str] = set()
        errors = 0

        async def handle_user(user: dict[str, Any], ds: list[Decision]) -> None:
            nonlocal errors
            culled = 0
            for d in ds:
                if d.action != "cull":
                    continue
                try:
                    await self.cull(d, now)
                    culled += 1
                except Exception as e:
                    errors += 1
                    d.action, d.message = "error", f"cull failed: {e}"
                    log.error("culling %s failed: %s", d.key, e)
                    if self.metrics:
                        self.metrics.errors.inc()
            if (self.cull_users and not self.dry_run and culled and culled == len(
                    user.get("servers") or {}) and not user.get("admin")):
                try:
                    await self.hub.delete_user(user["name"])
                    log.info("deleted user %s (no servers left)", user["name"])
                except HubAPIError as e:
                    log.error("deleting user %s failed: %s", user["name"], e)

        def decide(user: dict[str, Any]) -> None:
            nonlocal errors
            ds = []
            for name, server in (user.get("servers") or {}).items():
                try:
                    d = self.evaluate(user, name, server, now)
                except Exception as e:  # a malformed model must not stop the pass
                    errors += 1
                    log.exception("evaluating %s/%s", user.get("name"), name)
                    d = Decision(user.get("name", "?"), name, "error", "error", str(e))
                ds.append(d)
                seen.add(d.key)
                self.status[d.key] = d
            decisions.extend(ds)
            if any(d.action == "cull" for d in ds):
                tasks.append(asyncio.ensure_future(handle_user(user, ds)))

        async def decide_batch(batch: list[dict[str, Any]]) -> None:
            try:
                await self.read_network(batch)
            except Exception:  # evaluate() then reads each server itself
                log.exception("reading network counters")
            for user in batch:
                decide(user)

        # users are decided in batches so that the network counters of a batch are read at
        # once (an engine answers a stats call at its next sampling tick, up to 1 s)
        batch: list[dict[str, Any]] = []
        try:
            async for user in self.hub.users(self.page_size):
                batch.append(user)
                if len(batch) >= NETWORK_BATCH:
                    await decide_batch(batch)
                    batch = []
            ok = True
        except HubAPIError as e:
            ok = False
            errors += 1
            log.error("pass aborted: listing users failed: %s", e)
            if self.metrics:
                self.metrics.errors.inc()
        await decide_batch(batch)  # every user listed is decided, also in an aborted pass
        if tasks:
            await asyncio.gather(*tasks)
        if ok:
            for k in list(self.status):
                if k not in seen:
                    del self.status[k]
            for memory in (self.warnings, self._net_active, self._gpu_active):
                for k in list(memory):
                    if k not in seen:
                        del memory[k]
            if self.network is not None:
                self.network.forget(seen)
        dt = time.perf_counter() - t0
        counts: dict[str, int] = {}
        for d in decisions:
            counts[d.action] = counts.get(d.action, 0) + 1
        self.last_pass = {"time": iso(now), "duration_s": round(dt, 4), "complete": ok,
                          "servers": len(decisions), "actions": counts, "errors": errors,
                          "dry_run": self.dry_run, "queue": self.queue_status}
        if self.metrics:
            self.metrics.passes.labels("complete" if ok else "aborted").inc()
            self.metrics.pass_seconds.observe(dt)
            self.metrics.warned.set(sum(1 for d in decisions if d.action == "warn"))
        log.info("pass: %d servers, %s, %.3fs%s", len(decisions), counts, dt,
                 " (dry run)" if self.dry_run else "")
        return decisions

    async def read_network(self, users: list[dict[str, Any]]) -> None:
        """Read the network counters of these users' ready servers whose policy sets a
        ``network_floor``, concurrently (:meth:`NetworkMeter.prefetch`); :meth:`evaluate`
        then uses these readings. Nothing without a network meter."""
        if self.network is None:
            return
        items = []
        for user in users:
            pol = self.policies.resolve(user.get("name", ""), user.get("groups") or [])
            if pol.exempt or pol.network_floor <= 0:
                continue
            for name, server in (user.get("servers") or {}).items():
                if server.get("ready") and not server.get("pending"):
                    items.append((f"{user.get('name', '')}/{name}", server.get("state") or {}))
        await self.network.prefetch(items)

    async def cull(self, d: Decision, now: float) -> None:
        """Stop the server (unless dry run), then log and count it."""
        status = None
        if not self.dry_run:
            status = await self.hub.stop_server(
                d.user, d.server, remove=self.remove_named_servers)
            if status == 202:
                log.warning("%s is slow to stop (202)", d.key)
        record = {"time": iso(now), "user": d.user, "server": d.server, "reason": d.reason,
                  "message": d.message, "figures": d.figures,
                  "policy_source": {k: v["source"] for k, v in d.policy.items()},
                  "policy": {k: v["value"] for k, v in d.policy.items()},
                  "dry_run": self.dry_run, "hub_status": status}
        log.info("%s %s: %s (%s)", "would cull" if self.dry_run else "culled", d.key,
                 d.reason, d.message)
        if self.cull_log is not None:
            self.cull_log.parent.mkdir(parents=True, exist_ok=True)
            with self.cull_log.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        self.recent = (self.recent + [record])[-200:]
        if self.metrics:
            self.metrics.culls.labels(d.reason, str(self.dry_run).lower()).inc()

    def user_status(self, user: str | None) -> dict[str, Any]:
        """Status of ``user``'s servers (all users when None), for the web API."""
        servers = [d.to_json() for k, d in sorted(self.status.items())
                   if user is None or d.user == user]
        culls = [r for r in self.recent if user is None or r["user"] == user]
        return {"servers": servers, "recent_culls": culls, "last_pass": self.last_pass}
