"""GPU pressure: who waits in gpuspawner's queue for which GPU model.

gpuspawner keeps a spawn that fits the cluster but not what is free now in a wait queue and
serves it at ``GET /services/gpuspawner/api/queue`` (:meth:`idle_culler.hub.HubClient.gpu_queue`
gives the document's shape). While an entry waits for GPUs of a model that an idle GPU server
holds, or for any GPU, the culler applies the user's shorter ``pressure_idle_timeout`` to that
server (:mod:`idle_culler.core`). This module turns the queue document into :class:`Demand`
and answers, for the GPU models a server holds, who is waiting (:meth:`Demand.match`).

A waiting spawn shortens only the timeouts of servers on a node where it would fit once they
were gone (:class:`NodeCapacity`, read from gpuspawner's inventory ``api/nodes``): a node its
profile may use, enough GPUs of a model it accepts (a shareable one for a GPU share), its cores
and its memory. A spawn for
four A100 makes no pressure on a node with two, whatever they run: culling there frees
nothing it could use.

Models are compared case-insensitively, as gpuspawner's placement does
(``gpuspawner.placement.devices.model_allowed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the ``waiting_gpus`` key (and our label) for entries that accept any GPU model
ANY_MODEL = "GPU"


@dataclass(frozen=True)
class Want:
    """What one waiting entry asks for: ``models`` (lower-cased; empty = any model), whole
    ``gpus`` or a ``gpu_milli`` share, ``cores`` and ``memory_bytes`` (bytes)."""

    user: str
    models: frozenset[str]
    gpus: int = 0
    gpu_milli: int = 0
    cores: int = 0
    memory_bytes: int = 0
    #: the nodes it may use (its profile's); empty = any
    nodes: frozenset[str] = frozenset()

    def accepts(self, model: str) -> bool:
        """Whether a GPU of ``model`` may serve this entry (case-insensitive)."""
        return not self.models or model.lower() in self.models


@dataclass(frozen=True)
class NodeCapacity:
    """One node of gpuspawner's inventory, as a waiting spawn could use it once its servers
    were gone: ``gpus`` ((model lower-cased, shareable) per GPU), ``cores`` and
    ``memory_bytes`` (bytes, all NUMA nodes)."""

    name: str
    gpus: tuple[tuple[str, bool], ...] = ()
    cores: int = 0
    memory_bytes: int = 0

    @classmethod
    def from_json(cls, node: dict[str, Any]) -> NodeCapacity:
        """A node of ``GET api/nodes`` (``name``, ``gpus: [{"model", "shareable"}]``,
        ``numa_nodes: [{"cpus", "memory_bytes"}]``, or ``summary.cores_total`` /
        ``summary.memory_bytes``).

        Raises:
            ValueError: a field has the wrong type (the message names the node).
        """
        try:
            gpus = tuple((str(g.get("model") or "").lower(), bool(g.get("shareable")))
                         for g in node.get("gpus") or [])
            numa = node.get("numa_nodes") or []
            summary = node.get("summary") or {}
            cores = int(summary.get("cores_total") or sum(len(n.get("cpus") or [])
                                                          for n in numa))
            memory = int(summary.get("memory_bytes") or sum(int(n.get("memory_bytes") or 0)
                                                            for n in numa))
            return cls(str(node["name"]), gpus, cores, memory)
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise ValueError(f"inventory node {str(node)[:80]}: {err!r}") from None

    def fits(self, want: Want) -> bool:
        """Whether ``want`` could run on this node were it empty: a node it may use, enough
        GPUs of a model it accepts (one shareable GPU for a share), its cores and memory
        (0 = not known, not checked)."""
        if want.nodes and self.name not in want.nodes:
            return False
        usable = [s for m, s in self.gpus if want.accepts(m)]
        if want.gpus and len(usable) < want.gpus:
            return False
        if want.gpu_milli and not any(usable):
            return False
        if self.cores and want.cores > self.cores:
            return False
        return not (self.memory_bytes and want.memory_bytes > self.memory_bytes)


@dataclass(frozen=True)
class Pressure:
    """Who waits for the GPUs of one server: ``users`` (distinct user names, when the token
    may read every entry; else empty), ``spawns`` (waiting entries), ``models`` (the waited-for
    models the server holds, :data:`ANY_MODEL` for "any GPU")."""

    users: frozenset[str]
    spawns: int
    models: tuple[str, ...]

    @property
    def text(self) -> str:
        """``"2 users waiting for A100"``, ``"1 user waiting for A100 or any GPU"``; counts
        spawns (``"3 spawns waiting for ..."``) when the entries were not readable."""
        what = " or ".join("any GPU" if m == ANY_MODEL else m for m in self.models)
        if self.users:
            n, noun = len(self.users), "user"
        else:
            n, noun = self.spawns, "spawn"
        return f"{n} {noun}{'' if n == 1 else 's'} waiting for {what}"

    def to_json(self) -> dict[str, Any]:
        return {"waiting_users": len(self.users) if self.users else None,
                "waiting_spawns": self.spawns, "models": list(self.models)}


@dataclass
class Demand:
    """The queue's GPU demand: ``spawns`` (model or :data:`ANY_MODEL`, lower-cased -> entries
    waiting), ``users`` (same keys -> user names; complete only when ``complete``), ``names``
    (lower-cased key -> the queue's spelling), ``length`` (all entries, GPU or not),
    ``wants`` (the readable entries that want GPUs, for the fit on a node)."""

    length: int = 0
    spawns: dict[str, int] = field(default_factory=dict)
    users: dict[str, set[str]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    complete: bool = False
    wants: list[Want] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Demand:
        """Read the queue document (:meth:`idle_culler.hub.HubClient.gpu_queue`).

        ``waiting_gpus`` says which models are waited for (authoritative: it counts every
        entry whoever asks); the entries, where the token sees all of them
        (``len(entries) == length``), give the distinct users. An entry wants GPUs when
        ``gpus`` or ``gpu_milli`` is above 0; its ``gpu_models`` (empty = any model) name what
        it accepts.

        Raises:
            ValueError: a field has the wrong type (the message names it).
        """
        try:
            length = int(doc.get("length") or 0)
            waiting = doc.get("waiting_gpus") or {}
            entries = doc.get("entries") or []
            if not isinstance(waiting, dict) or not isinstance(entries, list):
                raise TypeError("waiting_gpus must be an object and entries a list")
            d = cls(length=length)
            for model, n in waiting.items():
                if int(n) > 0:
                    d._name(str(model))
                    d.spawns[str(model).lower()] = int(n)
            d.complete = len(entries) >= length
            for e in entries:
                if not (int(e.get("gpus") or 0) > 0 or int(e.get("gpu_milli") or 0) > 0):
                    continue
                d.wants.append(Want(
                    str(e["user"]), frozenset(str(m).lower() for m in e.get("gpu_models") or []),
                    int(e.get("gpus") or 0), int(e.get("gpu_milli") or 0),
                    int(e.get("cores") or 0), int(e.get("memory_bytes") or 0),
                    frozenset(str(n) for n in e.get("nodes") or [])))
                for model in e.get("gpu_models") or [ANY_MODEL]:
                    key = d._name(str(model))
                    d.users.setdefault(key, set()).add(str(e["user"]))
                    if not waiting:  # an older document: count from the entries
                        d.spawns[key] = d.spawns.get(key, 0) + 1
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise ValueError(f"queue document: {err!r}") from None
        return d

    def _name(self, model: str) -> str:
        key = model.lower()
        self.names.setdefault(key, model)
        return key

    def __bool__(self) -> bool:
        return bool(self.spawns)

    def specific_models(self) -> bool:
        """True when some entry waits for a named model (then the culler needs each server's
        GPU models, from gpuspawner's inventory)."""
        return any(k != ANY_MODEL.lower() for k in self.spawns)

    def match(self, models: set[str], node: NodeCapacity | None = None) -> Pressure | None:
        """Who waits for GPUs that a server holding GPUs of ``models`` could free (entries for
        one of ``models``, and entries for any model); None when nobody does. ``models`` may be
        empty (a GPU server whose models are unknown): then only "any GPU" entries count.

        With ``node`` (the server's node, from the inventory) only the readable entries that
        would fit on that node count (:meth:`NodeCapacity.fits`): an entry the culler cannot
        read, or that could never run there, shortens no one's timeout on it."""
        if node is not None:
            return self._match_on(models, node)
        held = {m.lower() for m in models}
        keys = sorted(k for k in self.spawns if k in held)
        if ANY_MODEL.lower() in self.spawns:
            keys.append(ANY_MODEL.lower())
        if not keys:
            return None
        users: set[str] = set()
        if self.complete:
            for k in keys:
                users |= self.users.get(k, set())
        # an entry accepting several of the matched models is counted once per model in
        # waiting_gpus: the largest count is the lower bound we can state
        spawns = max(self.spawns[k] for k in keys)
        return Pressure(frozenset(users), spawns, tuple(self.names[k] for k in keys))

    def _match_on(self, models: set[str], node: NodeCapacity) -> Pressure | None:
        """:meth:`match` for a server on ``node``: the entries that accept one of ``models``
        (or any model) and fit ``node``."""
        held = {m.lower() for m in models}
        fitting = [w for w in self.wants
                   if (not w.models or w.models & held) and node.fits(w)]
        if not fitting:
            return None
        keys = sorted({m for w in fitting for m in w.models & held})
        if any(not w.models for w in fitting):
            keys.append(ANY_MODEL.lower())
        for k in keys:
            self.names.setdefault(k, ANY_MODEL if k == ANY_MODEL.lower() else k)
        users = frozenset(w.user for w in fitting) if self.complete else frozenset()
        return Pressure(users, len(fitting), tuple(self.names[k] for k in keys))
