"""The one seam between the hub and whatever runs user servers.

The spawner (``gpuspawner.hub.spawner.GPUSpawner``) decides *what* a server gets: it validates
``user_options``, reserves an :class:`~gpuspawner.placement.Allocation` in the ledger and
builds a :class:`~gpuspawner.backends.spec.LaunchSpec`. A :class:`Backend` decides *how* it
runs: a Docker container on a node's engine (:class:`~gpuspawner.backends.docker_backend.
DockerBackend`), a batch job on a Slurm cluster, a pod. The spawner speaks only to this
interface, so a new backend never touches the spawner.

A backend keeps no per-server memory of its own: everything it needs to find a server again
lives in a JSON-able ``state`` dict that the spawner stores in the hub's database (JupyterHub's
``Spawner.get_state``) and hands back on every call. That is what makes a hub restart work:
the state and the objects' own labels (:meth:`Backend.list_managed`) are enough.

Lifecycle of one server, as the spawner drives it::

    prepare(server, alloc, state)       # e.g. the server's own network; gives its address
    cert_alt_names(alloc, state)        # internal_ssl: names the certificate must carry
    certs_path(host_dir)                # where the server sees its certificate folder
    launch(spec, state, progress)       # start it; returns (ip, port)
    exit_report(state)                  # while waiting for readiness: did it die?
    poll(state) / stop(state)           # later
    read_output(state, max_bytes)       # a notebook job's output (log and result)
    node_failure(state)                 # an ended notebook job: lost with its node?
    cleanup(state)                      # after any failure: remove everything, never raise

Errors: :class:`BackendUnavailable` (the node's engine or controller does not answer: the
spawner answers HTTP 503 and marks the node suspect), :class:`LaunchRefused` (the request
cannot run on this node as configured: HTTP 400), :class:`LaunchFailed` (the server could not
start, e.g. a missing image or a process that exited: HTTP 500). Anything else is a bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from traitlets.config import LoggingConfigurable

from ..placement import Allocation, Ledger, Node
from .spec import HUB_LABEL, LaunchSpec

#: the spawner whose server is being started in this task: what an admin's callable setting
#: (``DockerBackend.extra_host_config`` and the like, DockerSpawner's convention) receives. A
#: context variable, not an attribute of the one shared backend: concurrent spawns run in
#: tasks of their own, each seeing its own spawner.
current_spawner: ContextVar[Any] = ContextVar("gpuspawner_current_spawner", default=None)

#: a callable the backend reports spawn progress through: ``(percent 0..100, message)``
Progress = Callable[[int, str], None]


class BackendError(Exception):
    """Base of the errors a backend raises on purpose; ``status_code`` is the HTTP status the
    hub answers a spawn with (500: the server could not start)."""

    status_code = 500


class BackendUnavailable(BackendError):
    """The engine (or controller) of ``node`` does not answer.

    Attributes:
        node: node name. reason: what the client library said.
    """

    status_code = 503  # may pass: the hub marks the node down and places elsewhere

    def __init__(self, node: str, reason: object, what: str = "engine") -> None:
        super().__init__(f"node {node}: {what} unavailable: {reason}")
        self.node = node
        self.reason = reason


class LaunchRefused(BackendError):
    """The allocation cannot be honoured on its node as configured (e.g. a disk limit the
    node's storage driver cannot enforce with ``disk_limit_mode = "refuse"``)."""

    status_code = 400


class NameTaken(BackendError):
    """An engine object with the server's name exists and is not this server's (another
    owner's labels, or not made by gpuspawner): it is never removed, joined or reused
    (HTTP 409). With injective names (:mod:`~gpuspawner.hub.identity`) only a foreign object
    or a second hub on the same engine can hold the name.

    Attributes:
        kind: "container", "network", "job". name: the object's name. owner: its owner
            labels ({} when it carries none).
    """

    status_code = 409

    def __init__(self, node: str, kind: str, name: str, owner: Mapping[str, str]) -> None:
        whose = (f"of user {owner.get('gpuspawner.user')!r}, server "
                 f"{owner.get('gpuspawner.server', '')!r}" if owner.get("gpuspawner.user")
                 else "not made by gpuspawner")
        super().__init__(f"node {node}: a {kind} named {name} exists and is {whose}: not "
                         "touched; an admin must remove or rename it")
        self.kind, self.name, self.owner = kind, name, dict(owner)


def owner_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The owner labels (user, server, hub) among an engine object's ``labels``."""
    labels = labels or {}
    return {k: labels[k] for k in ("gpuspawner.user", "gpuspawner.server", HUB_LABEL)
            if k in labels}


def same_owner(found: Mapping[str, str] | None, wanted: Mapping[str, str]) -> bool:
    """Whether an object with labels ``found`` belongs to the owner ``wanted`` names: the
    same user and server, made by the same hub (an object without a hub label, made by 0.x,
    counts as any hub's)."""
    found = found or {}
    return (all(found.get(k) == wanted.get(k) for k in ("gpuspawner.user", "gpuspawner.server"))
            and found.get(HUB_LABEL) in (None, wanted.get(HUB_LABEL)))


def made_by(labels: Mapping[str, str] | None, hub_id: str) -> bool:
    """Whether a managed object with these labels is hub ``hub_id``'s (no hub label: 0.x,
    counted as ours; ``hub_id`` "": outside a hub, every object)."""
    found = (labels or {}).get(HUB_LABEL)
    return not hub_id or found is None or found == hub_id


class LaunchFailed(BackendError):
    """The server could not be started (missing image, the process exited during start)."""


class ImageRefused(BackendError):
    """A user's own image failed the check on a node (:meth:`Backend.check_image`): it cannot
    be pulled, is for another architecture, or ``jupyterhub-singleuser`` does not run in it
    (HTTP 400; the message says which, for the user)."""

    status_code = 400


@dataclass(frozen=True)
class ImageCheck:
    """What :meth:`Backend.check_image` found.

    Attributes:
        image: the reference checked. digest: the image's content id on the node
            (``sha256:...``; the engine's image ID). architecture: the image's (``amd64``).
        jupyterhub_version: what ``jupyterhub-singleuser --version`` printed.
    """

    image: str
    digest: str
    architecture: str
    jupyterhub_version: str


@dataclass
class NodeRuntime:
    """One configured node (an entry of ``c.GPUSpawner.nodes``) and its live state.

    Attributes:
        name: node name.
        host: address at which the node's servers are reached with host networking.
        topology: "auto" or the topology file's path the inventory came from.
        node: the inventory (placement model).
        docker_url: Docker engine URL of the node ("" = ``DOCKER_HOST``; Docker backend).
        network_pool: CIDR blocks of the node's server networks ("" = the backend's
            default; Docker backend; engines sharing one host need disjoint pools).
        suspect: set when the node stopped answering: servers the ledger no longer books may
            still run there, so the next placement on it sweeps them first.
        gpu_share: what holds GPU shares on the node
            (:class:`~gpuspawner.gpushare.mechanism.Mechanism`, chosen at hub start), or None
            (not chosen: a runtime made outside the hub's node configuration).
    """

    name: str
    host: str
    topology: str
    node: Node
    docker_url: str = ""
    network_pool: str = ""
    suspect: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    gpu_share: Any = None


@dataclass(frozen=True)
class ServerRef:
    """Which server an operation is about.

    Attributes:
        user: JupyterHub user name. server: server name ("" = the default server).
        name: the escaped, capped object name (``safe_name``): a valid container name, job
            name, DNS label and path component.
    """

    user: str
    server: str
    name: str

    @property
    def labels(self) -> dict[str, str]:
        """The owner labels every engine object of this server carries."""
        return {"gpuspawner.user": self.user, "gpuspawner.server": self.server}

    def owns(self, labels: Mapping[str, str] | None, hub_id: str = "") -> bool:
        """Whether an engine object with these labels is this server's: this user and server,
        made by hub ``hub_id`` (:func:`same_owner`)."""
        return same_owner(labels, {**self.labels, **({HUB_LABEL: hub_id} if hub_id else {})})


@dataclass(frozen=True)
class Managed:
    """One running server found by :meth:`Backend.list_managed` (restore after a restart).

    Attributes:
        node: node name. allocation: the allocation JSON it carries (label, job comment).
        handle: the backend's id of it (container id, job id), for :meth:`remove_managed`.
    """

    node: str
    allocation: str
    handle: str


class Backend(LoggingConfigurable):
    """Runs user servers for allocations. Subclasses are ``Configurable``: their settings are
    traits configured as ``c.<ClassName>.<trait>`` in ``jupyterhub_config.py``.

    The hub makes one backend per process (owned by the :class:`~gpuspawner.hub.cluster.
    Cluster`) and calls :meth:`bind` with the node table before anything else. Methods that
    talk to an engine are ``async`` and must not block the hub's event loop.
    """

    #: the name ``c.GPUSpawner.backend`` selects this class by
    backend_name = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nodes: Mapping[str, NodeRuntime] = {}
        #: the hub's ledger (set with the cluster), for :meth:`Ledger.adopt` when an engine
        #: grants other devices than planned (Slurm's core choice); None outside a hub
        self.ledger: Ledger | None = None
        #: the id of the hub this backend serves (:data:`~gpuspawner.backends.spec.HUB_LABEL`;
        #: set with the cluster, "" outside a hub): objects another hub made are not ours
        self.hub_id = ""

    def bind(self, nodes: Mapping[str, NodeRuntime]) -> None:
        """Receive the hub's node table (name -> :class:`~gpuspawner.hub.cluster.NodeRuntime`).
        """
        self.nodes = nodes

    def forget_node(self, node: str) -> None:
        """Drop what this backend keeps about ``node``'s engine (clients, network managers):
        an elastic node's engine changes between starts (:mod:`gpuspawner.elastic`)."""

    def check_config(self) -> None:
        """Check this backend's settings at hub start.

        Raises:
            ValueError: a setting is wrong (the message names it).
        """

    #: True when servers share a network namespace with other users' processes, so the hub
    #: must run with ``c.JupyterHub.internal_ssl`` (checked at start)
    requires_internal_ssl = False

    @property
    def listen_ip(self) -> str:
        """The address the server binds in its network namespace (the spawner's ``ip``
        default). Default "0.0.0.0": a namespace of its own, one interface."""
        return "0.0.0.0"

    # -- one server ------------------------------------------------------------------------
    async def prepare(self, server: ServerRef, alloc: Allocation, state: dict[str, Any]
                      ) -> dict[str, Any]:
        """Make what must exist before the server's certificate can be signed (its network
        and address). Returns the new state. Default: nothing to make.

        Raises:
            BackendUnavailable.
        """
        return dict(state)

    def cert_alt_names(self, alloc: Allocation, state: Mapping[str, Any]) -> list[str]:
        """Subject alternative names (``"IP:…"``, ``"DNS:…"``) for the server's internal_ssl
        certificate, besides localhost. Default: none."""
        return []

    def certs_path(self, host_dir: str) -> str:
        """Where the server sees ``host_dir``, the folder of its internal_ssl files (copied
        there by the spawner, owned by the user; :attr:`LaunchSpec.certs_dir`). Default: the
        same path (a shared file system)."""
        return host_dir

    async def check_image(self, node: str, image: str, uid: int, gid: int, timeout_s: float,
                          progress: Progress, max_bytes: int = 0) -> ImageCheck:
        """Check a user's own image on ``node`` before anything is booked for it: present or
        pulled, not larger than ``max_bytes`` (0: any size), for the node's architecture,
        ``jupyterhub-singleuser`` runs in it (in a throwaway container: no network, no
        devices, the user's uid, ``timeout_s`` seconds).
        Default: this backend runs no user images.

        Raises:
            ImageRefused: the image fails a check (the message says which).
            BackendUnavailable: the node's engine does not answer.
        """
        raise ImageRefused(f"the {type(self).__name__} backend does not run users' own images")

    async def launch(self, spec: LaunchSpec, state: dict[str, Any], progress: Progress
                     ) -> tuple[str, int]:
        """Start the server of ``spec`` (a new one: never reuse an old object); record its
        handle in ``state`` as soon as it exists, so :meth:`cleanup` can remove it.

        Returns:
            (ip, port) at which the hub reaches it.

        Raises:
            BackendUnavailable, LaunchRefused, LaunchFailed.
        """
        raise NotImplementedError

    async def exit_report(self, state: Mapping[str, Any]) -> str | None:
        """None while the launched server runs; else why it ended (exit code, last log
        lines), for the spawn's error message."""
        return None

    async def read_output(self, state: Mapping[str, Any], max_bytes: int) -> bytes | None:
        """The standard output of the ended program of ``state`` (a notebook job hands its
        executed notebook over this way), at most the last ``max_bytes`` bytes; None when
        this backend cannot read it or the program is gone. Default: None.

        Raises:
            BackendUnavailable: the node cannot be asked.
        """
        return None

    async def node_failure(self, state: Mapping[str, Any]) -> str | None:
        """Why the ended program of ``state`` was lost with its node, as far as the engine
        itself says so (Slurm: the job ended ``NODE_FAIL``), in words; None when it did not
        or this backend cannot tell (the job runner then asks for the node's state). Default:
        None.

        Raises:
            BackendUnavailable: the node cannot be asked.
        """
        return None

    async def poll(self, state: Mapping[str, Any]) -> int | None:
        """None while the server runs, else its exit status (JupyterHub ``Spawner.poll``).

        Raises:
            BackendUnavailable: the node cannot be asked.
        """
        raise NotImplementedError

    async def stop(self, state: Mapping[str, Any], now: bool = False) -> None:
        """Stop the server and remove every object it had (idempotent).

        Raises:
            BackendUnavailable: the node cannot be asked (the spawner releases anyway).
        """
        raise NotImplementedError

    async def cleanup(self, alloc: Allocation | None, state: Mapping[str, Any]) -> None:
        """Remove whatever :meth:`prepare` and :meth:`launch` made for
        this server, as far as ``state`` knows it (rollback of a failed spawn, after stop).
        Never raises: failures are logged."""

    async def remove_server(self, node: str, server: ServerRef) -> None:
        """Remove every object of ``server`` on ``node`` found by its labels alone (what an
        interrupted spawn left without spawner state).

        Raises:
            BackendUnavailable.
        """

    # -- the whole cluster ---------------------------------------------------------------------
    async def node_states(self) -> dict[str, tuple[str, str]]:
        """Each bound node's state as (``"up"`` | ``"drain"`` | ``"down"``, reason): whether it
        may take new servers (:meth:`gpuspawner.placement.Ledger.set_node_state`). Nodes left
        out count as up. Never raises: a node that cannot be asked is down. Default: all up."""
        return {}

    async def held_elsewhere(self) -> dict[str, str]:
        """GPUs of the bound nodes that something the hub did not start holds now (GPU or
        MIG UUID -> why), which a placement must not count as free. Default: none.

        Raises:
            BackendUnavailable: it cannot be asked now.
        """
        return {}

    async def list_managed(self) -> list[Managed]:
        """Every running server this project launched, on every reachable node, with the
        allocation it carries. Nodes that do not answer are logged and skipped."""
        return []

    async def remove_managed(self, found: Managed) -> None:
        """Remove one server found by :meth:`list_managed` (its owner is gone). Never
        raises."""

    async def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each running server and job of this hub has used so far (a
        cumulative counter), by allocation id, on every reachable node; {} where the backend
        cannot say (the usage records' ``cpu_seconds``, :mod:`gpuspawner.usage`). Never
        raises."""
        return {}

    async def sweep(self, node: str, booked: Callable[[str], bool],
                    owner_booked: Callable[[str, str], bool]) -> list[str]:
        """After ``node`` was unreachable: remove its servers whose allocation id
        ``booked(id)`` is False and per-server objects whose owner ``owner_booked(user,
        server)`` is False. Returns the removed handles.

        Raises:
            BackendUnavailable.
        """
        return []


#: ``c.GPUSpawner.backend`` short names -> classes (a dotted path works too)
BACKENDS: dict[str, str] = {
    "docker": "gpuspawner.backends.docker_backend.DockerBackend",
    "slurm": "gpuspawner.backends.slurm.backend.SlurmBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The :class:`Backend` subclass ``name`` selects: a short name of :data:`BACKENDS` or a
    dotted import path.

    Raises:
        ValueError: unknown name, not importable, or not a Backend subclass.
    """
    path = BACKENDS.get(name, name)
    module, _, attr = path.rpartition(".")
    if not module:
        raise ValueError(f"unknown backend {name!r}; one of {', '.join(BACKENDS)} or a "
                         "dotted class path")
    try:
        cls = getattr(import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"backend {name!r}: cannot import {path}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ValueError(f"backend {name!r}: {path} is not a gpuspawner Backend")
    return cls

