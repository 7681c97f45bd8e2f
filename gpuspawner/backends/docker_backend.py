"""DockerBackend: each server a new container on its node's Docker engine, pinned to its
allocation (GPU UUIDs as ``device_requests``, ``cpuset_cpus``/``cpuset_mems``, memory, disk,
pids), alone on its own bridge network (``docs/security.md``).

Configured as ``c.DockerBackend.*``. The container's arguments come from the pure
:func:`~gpuspawner.backends.docker.container_config`; the network from
:class:`~gpuspawner.backends.docker_network.NetworkManager`. Every engine call runs in a
worker thread (``asyncio.to_thread``) so the hub's event loop never waits on the engine; an
engine that cannot be reached raises :class:`~gpuspawner.backends.base.BackendUnavailable`.

Per-server ``state`` keys: ``node``, ``container_id``, ``network`` (a
:class:`~gpuspawner.backends.docker_network.ServerNetwork` as a dict) and ``ip``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from traitlets import Any as AnyTrait
from traitlets import CaselessStrEnum, Enum, Float, Int, List, TraitError, Unicode, validate

from ..gpushare.mechanism import (
    ShareLimits,
    prepare_dmem_cgroup,
    remove_dmem_cgroup,
    share_limits,
)
from ..gpushare.mps import (
    CLIENT_LABEL,
    DAEMON_COMMAND,
    DAEMON_LABEL,
    PIPE_MOUNT,
    QUIT_COMMAND,
    READY_COMMAND,
    UID_LABEL,
    MpsDaemon,
    client_host_config,
    daemon_for,
)
from ..placement import Allocation
from . import home_script
from .base import (
    Backend,
    BackendUnavailable,
    ImageCheck,
    LaunchFailed,
    LaunchRefused,
    Managed,
    NameTaken,
    Progress,
    ServerRef,
    current_spawner,
    made_by,
    owner_labels,
)
from .docker import (
    CERTS_MOUNT,
    DISK_LIMIT_DRIVERS,
    DiskLimitUnsupported,
    container_config,
    disk_rule,
)
from .docker_image import check_image_blocking
from .docker_network import (
    DEFAULT_SERVER_POOL,
    NetworkManager,
    NetworkTaken,
    ServerNetwork,
    parse_pool,
)
from .home import check_mount_paths, ensure_home, raise_for
from .spec import ALLOCATION_LABEL, HUB_LABEL, MANAGED_LABEL, LaunchSpec

#: the home rules' source, run by ``python3 -c`` in the helper container
HOME_SCRIPT = inspect.getsource(home_script)


def engine_down(e: BaseException) -> bool:
    """Whether ``e`` says the engine cannot be reached (as opposed to an API refusal)."""
    if isinstance(e, requests.exceptions.ConnectionError):
        return True
    return isinstance(e, DockerException) and not isinstance(e, APIError)


def engine_tls(folder: str) -> docker.tls.TLSConfig:
    """The TLS settings of engines reached over the network: the CA ``folder/ca.pem`` verifies
    the engine, ``folder/cert.pem`` and ``folder/key.pem`` are the hub's client certificate
    (the Docker CLI's ``DOCKER_CERT_PATH`` layout).

    Raises:
        ValueError: a file is missing or unreadable.
    """
    files = {name: os.path.join(folder, name) for name in ("ca.pem", "cert.pem", "key.pem")}
    for path in files.values():
        if not os.access(path, os.R_OK):
            raise ValueError(f"{path}: missing or not readable (ca.pem, cert.pem and key.pem "
                             "are needed)")
    return docker.tls.TLSConfig(client_cert=(files["cert.pem"], files["key.pem"]),
                                ca_cert=files["ca.pem"], verify=True)


def bind_sources(host: Mapping[str, Any]) -> list[str]:
    """The host paths a ``create_host_config`` argument dict would have the engine bind-mount:
    ``binds`` (a dict's keys, or ``"src:dst[:mode]"`` strings) and ``mounts`` of type bind;
    named volumes (no leading ``/``) are not host paths."""
    binds = host.get("binds") or {}
    out = [str(k) for k in binds] if isinstance(binds, Mapping) else \
        [str(b).split(":", 1)[0] for b in binds]
    for m in host.get("mounts") or []:
        if isinstance(m, Mapping) and m.get("Type", "volume") == "bind":
            out.append(str(m.get("Source", "")))
    return [p for p in out if p.startswith("/")]


class TLSEngineClient(docker.APIClient):
    """A client of an engine over TLS that ignores the environment (``trust_env``): requests
    would otherwise verify the engine against ``REQUESTS_CA_BUNDLE`` instead of ca.pem, and
    send engine calls through ``HTTPS_PROXY``."""

    @property
    def trust_env(self) -> bool:  # type: ignore[override]
        return False

    @trust_env.setter
    def trust_env(self, value: bool) -> None:  # requests.Session.__init__ sets it
        pass


def plain_remote_engine(url: str) -> bool:
    """Whether ``url`` reaches an engine over the network without TLS of its own: tcp:// or
    http:// to a host that is not loopback."""
    if not url.startswith(("tcp://", "http://")):
        return False
    host = urlsplit(url).hostname or ""
    return host not in ("localhost", "::1") and not host.startswith("127.")


def log_tail(cli: Any, cid: str, max_bytes: int, chunk_bytes: int = 2**20) -> bytes:
    """The last ``max_bytes`` bytes of container ``cid``'s standard output (all of it when
    ``max_bytes`` <= 0), read as a stream (docker SDK ``APIClient.logs(stream=True)``) and
    kept in a buffer of at most ``max_bytes + chunk_bytes``: the log is the user's, and
    ``logs()`` without a stream returns it whole, however large.

    Raises:
        docker.errors.NotFound: no such container.
    """
    buf = bytearray()
    for chunk in cli.logs(cid, stdout=True, stderr=False, stream=True, follow=False):
        buf += chunk
        if max_bytes > 0 and len(buf) > max_bytes + chunk_bytes:
            del buf[:len(buf) - max_bytes]
    return bytes(buf[-max_bytes:]) if max_bytes > 0 else bytes(buf)


class DockerBackend(Backend):
    """Run each server in a new container on its node's Docker engine."""

    backend_name = "docker"

    network_isolation = Enum(
        ["per-server", "shared", "host"],
        default_value="per-server",
        help="""How servers are networked (docs/security.md).

        "per-server" (default): each server gets its own bridge network, a
        /server_network_prefix block of server_network_pool, and its own network namespace;
        it listens on the spawner's `port` there and the hub reaches it by IP. With the host
        firewall rule of scripts/network.sh, users' containers cannot reach each other.
        "shared": all servers on the bridge network `network_name` (created if missing on a
        free block of server_network_pool); containers of different users can reach each
        other. "host": network_mode=host, the server on 127.0.0.1:`port` in the hub's own
        namespace, so one server per node. Only for a single trusted user: any user process
        can then take the hub's ports.
        """,
    ).tag(config=True)

    network_name = Unicode(
        "gpuspawner-servers",
        help='The one network of network_isolation = "shared".',
    ).tag(config=True)

    server_network_pool = Unicode(
        DEFAULT_SERVER_POOL,
        help="""CIDR blocks (comma separated) server networks are carved from. Every network
        gets an explicit subnet; blocks in use on the engine are skipped. Private (RFC 1918)
        ranges are refused. Checked when the hub starts. A node's own network_pool wins.""",
    ).tag(config=True)

    server_network_prefix = Int(
        28, help="Prefix length of each per-server network (28: 14 addresses).",
    ).tag(config=True)

    disk_limit_mode = Enum(
        ["refuse", "account"],
        default_value="account",
        help="""When a profile asks for disk and the node's storage driver cannot enforce
        storage_opt size (only btrfs, zfs and overlay2 on xfs+pquota can): "refuse" fails the
        spawn, "account" books the disk in the ledger without a limit. Spawn progress says
        which.
        """,
    ).tag(config=True)

    pids_limit = Int(4096, help="Maximum processes in a container (docker pids_limit).").tag(
        config=True)

    pull_policy = CaselessStrEnum(
        ["never", "ifnotpresent", "always", "skip"],
        default_value="never",
        help="""Whether the image is pulled before a container is made: "never" (the admin
        builds or loads images on every node; a missing image fails the spawn with a clear
        message), "ifnotpresent", "always"; DockerSpawner's spellings, in any case
        ("IfNotPresent", "Always", "Never", "skip"). "skip" is "never" here (DockerSpawner's
        skip does not look for the image; here a missing image still fails with the clear
        message). Unlike DockerSpawner (default ifnotpresent) the default is never: nodes
        pull nothing an admin did not build or load (users' own images are pulled when
        missing, within GPUSpawner.image_max_bytes, whatever this says). The value is kept
        in lower case.""",
    ).tag(config=True)

    extra_host_config = AnyTrait(
        {},
        help="""Extra ``create_host_config`` arguments (docker SDK), a dict or a callable
        (spawner) returning one (or an awaitable of one). Pinning and hardening win where they
        overlap; a bind of the Docker socket is refused.""",
    ).tag(config=True)

    extra_create_kwargs = AnyTrait(
        {},
        help="Extra ``create_container`` arguments (docker SDK), a dict or a callable.",
    ).tag(config=True)

    stop_timeout = Int(
        10, help="Seconds a server gets to exit after SIGTERM before it is killed (stop).",
    ).tag(config=True)

    home_on_node = Enum(
        ["auto", "always"],
        default_value="auto",
        help="""Where the user's home folder is checked and made (gpuspawner.backends.home):
        "auto": in the hub's process for a node whose engine is on this machine (a unix
        socket), else on the node itself, through a short-lived helper container
        (``home_helper_image``; root, no network, the home's parent folder mounted and the
        node's / read-only); "always": through the helper container on every node. Either
        way nothing is made on a machine where the home's parent folder (the shared file
        system) is missing: the spawn fails naming the node and the folder. The same place
        checks every host path the server mounts first (``mount_owners``): the helper then
        runs for a server with mounts and no home too.""",
    ).tag(config=True)

    home_helper_image = Unicode(
        "", help="""Image of the home helper container (``home_on_node``), which runs
        ``python3`` as root with the parent folder of every user's home mounted (and the
        node's / read-only): an image the
        admin trusts, with ``python3`` on its PATH. Empty: the admin's image of the server
        being started (the profile's ``image`` or ``c.GPUSpawner.image``), never a user's
        own image (a profile's ``unlisted_choice``), whose code would otherwise run there as
        root. Pulled like a server's image (``pull_policy``).""",
    ).tag(config=True)

    mps_daemon_image = Unicode(
        "", help="""Image of the MPS control daemons gpuspawner runs on nodes whose GPU shares
        are held by ``mps-daemon`` (``c.GPUSpawner.gpu_share_mode`` or a node's
        ``gpu_share``; gpuspawner.gpushare.mps): one container per shared GPU, root, no
        network, that GPU by UUID. The image needs no CUDA: the NVIDIA container toolkit
        mounts the driver's nvidia-cuda-mps-control and nvidia-cuda-mps-server into it.
        Empty: the admin's image of the server being started (as ``home_helper_image``).""",
    ).tag(config=True)

    mps_daemon_command = List(
        Unicode(), list(DAEMON_COMMAND), minlen=1,
        help="""The MPS control daemon container's command: NVIDIA's control daemon in the
        foreground (``nvidia-cuda-mps-control -f``), its pipe and log directories from
        CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY (set by gpuspawner).""",
    ).tag(config=True)

    mps_daemon_start_timeout = Float(
        20.0, help="""Seconds an MPS control daemon (``mps_daemon_image``) has to make its
        control pipe before the server that needs it fails to start.""",
    ).tag(config=True)

    mount_owners = List(
        Int(), [0],
        help="""Uids that may own the folders above a mounted host path (the homes' folder,
        a mount's parent folders; :func:`gpuspawner.backends.home.check_mount_paths`), checked
        at every spawn and job start on the node, before the engine is handed the path: no
        component a symbolic link, every folder above the last component owned by one of
        these uids and writable by no one else (sticky folders such as /tmp excepted).
        Default: root only; for a node on this machine the hub's own uid counts too. Add a
        uid only if no user can act as it.""",
    ).tag(config=True)

    engine_timeout = Int(
        30, help="""Seconds one Docker API call may take before the node's engine counts as
        unavailable (docker SDK ``timeout``); a health check uses at most 5 s.""",
    ).tag(config=True)

    tls_cert_path = Unicode(
        "", help="""Folder with the hub's TLS files for engines reached over the network
        (a node's docker_url "tcp://host:2376" or "https://..."), the layout of the Docker
        CLI's DOCKER_CERT_PATH: ca.pem (the CA that signed the engines' server certificates),
        cert.pem and key.pem (the hub's client certificate and key, accepted by engines run
        with --tlsverify). Every such engine is then reached over TLS, its certificate
        verified against ca.pem (host name included). Empty: a non-loopback tcp:// or http://
        engine is refused at start (plain TCP gives root on the node to whoever reaches the
        port). A node with docker_url "" uses DOCKER_HOST, DOCKER_TLS_VERIFY and
        DOCKER_CERT_PATH instead. Checked when the hub starts.""",
    ).tag(config=True)

    @validate("server_network_prefix")
    def _validate_prefix(self, proposal: Any) -> int:
        if not 16 <= proposal.value <= 29:
            raise TraitError(f"DockerBackend.server_network_prefix: must be 16..29, got "
                             f"{proposal.value}")
        return proposal.value

    @validate("server_network_pool")
    def _validate_pool(self, proposal: Any) -> str:
        try:
            parse_pool(proposal.value, "DockerBackend.server_network_pool")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal.value

    @validate("tls_cert_path")
    def _validate_tls(self, proposal: Any) -> str:
        if proposal.value:
            try:
                engine_tls(proposal.value)
            except ValueError as e:
                raise TraitError(f"DockerBackend.tls_cert_path: {e}") from None
        return proposal.value

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._clients: dict[str, docker.APIClient] = {}
        self._networks: dict[tuple[str, int], NetworkManager] = {}
        self._disk: dict[str, tuple[bool, str]] = {}
        #: users' images that passed the check, by node then digest (docker_image)
        self._image_checks: dict[str, dict[str, ImageCheck]] = {}
        #: (node, GPU UUID) -> held while that GPU's MPS daemon is started or stopped and a
        #: client of it created (a client never starts against a daemon being stopped)
        self._mps_locks: dict[tuple[str, str], asyncio.Lock] = {}

    def check_config(self) -> None:
        """Each node's ``network_pool`` parses and is not private; an engine reached over the
        network is reached over TLS (``tls_cert_path``) unless it is on loopback.

        Raises:
            ValueError: the node entry and the problem.
        """
        for i, rt in enumerate(self.nodes.values()):
            if rt.network_pool:
                parse_pool(rt.network_pool, f"nodes[{i}] ({rt.name}).network_pool")
            if plain_remote_engine(rt.docker_url) and not self.tls_cert_path:
                raise ValueError(
                    f"nodes[{i}] ({rt.name}).docker_url: {rt.docker_url} is plain TCP: whoever "
                    "reaches that port is root on the node; run the engine with --tlsverify "
                    "and set c.DockerBackend.tls_cert_path (ca.pem, cert.pem, key.pem)")

    @property
    def listen_ip(self) -> str:
        """Host networking shares the hub's namespace: loopback only."""
        return "127.0.0.1" if self.network_isolation == "host" else "0.0.0.0"

    # -- per node -------------------------------------------------------------------------------
    def client(self, node: str) -> docker.APIClient:
        """Low-level Docker client of ``node``'s engine (made on first use)."""
        if node not in self._clients:
            url = self.nodes[node].docker_url if node in self.nodes else ""
            if url:
                if self.tls_cert_path and url.startswith(("tcp://", "https://")):
                    self._clients[node] = TLSEngineClient(
                        base_url=url, version="auto", timeout=self.engine_timeout,
                        tls=engine_tls(self.tls_cert_path))
                else:
                    self._clients[node] = docker.APIClient(base_url=url, version="auto",
                                                           timeout=self.engine_timeout)
            else:
                self._clients[node] = docker.APIClient(
                    version="auto", timeout=self.engine_timeout,
                    **docker.utils.kwargs_from_env())
        return self._clients[node]

    def forget_node(self, node: str) -> None:
        """Drop ``node``'s client, network managers, disk-limit answer and image checks (an
        elastic node's next start has another engine)."""
        cli = self._clients.pop(node, None)
        if cli is not None:
            cli.close()
        for key in [k for k in self._networks if k[0] == node]:
            del self._networks[key]
        self._disk.pop(node, None)
        self._image_checks.pop(node, None)

    def networks(self, node: str, prefixlen: int | None = None) -> NetworkManager:
        """The manager of ``node``'s server networks: blocks of the node's ``network_pool``
        (else ``server_network_pool``) of /``prefixlen`` (default
        ``server_network_prefix``)."""
        prefixlen = prefixlen or self.server_network_prefix
        key = (node, prefixlen)
        if key not in self._networks:
            rt = self.nodes.get(node)
            pool = (rt.network_pool if rt else "") or self.server_network_pool
            self._networks[key] = NetworkManager(self.client(node), parse_pool(pool),
                                                 prefixlen)
        return self._networks[key]

    def disk_limit_supported(self, node: str) -> tuple[bool, str]:
        """Whether ``node``'s engine enforces ``storage_opt size``, and its storage driver
        (blocking: one ``docker info``, cached). overlay2 counts only on an xfs backing file
        system (docker docs, "--storage-opt")."""
        if node not in self._disk:
            info = self.client(node).info()
            driver = str(info.get("Driver", ""))
            backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
            self._disk[node] = (driver in DISK_LIMIT_DRIVERS
                                or (driver == "overlay2" and backing == "xfs"), driver)
        return self._disk[node]

    async def _call(self, node: str, fn: Callable[..., Any] | str, *args: Any,
                    **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker thread; ``fn`` may name a method of the node's
        ``APIClient`` (the client is made in the thread too: ``version="auto"`` asks the
        engine). An unreachable engine becomes BackendUnavailable(node)."""
        def run() -> Any:
            call = getattr(self.client(node), fn) if isinstance(fn, str) else fn
            return call(*args, **kwargs)

        try:
            return await asyncio.to_thread(run)
        except Exception as e:
            if engine_down(e):
                raise BackendUnavailable(node, e, "Docker engine") from None
            raise

    async def _resolved(self, value: Any) -> dict[str, Any]:
        """A dict, or a callable(spawner) returning one (or an awaitable of one); the spawner
        is the one starting in this task (:data:`~gpuspawner.backends.base.current_spawner`)."""
        if callable(value):
            value = value(current_spawner.get())
        if inspect.isawaitable(value):
            value = await value
        return dict(value or {})

    # -- one server -------------------------------------------------------------------------------
    def _network_label(self, server: ServerRef) -> str:
        return f"{server.name}-net"

    def _owner(self, server: ServerRef) -> dict[str, str]:
        """The owner labels of the server's objects: user, server and this hub."""
        return {**server.labels, **({HUB_LABEL: self.hub_id} if self.hub_id else {})}

    async def prepare(self, server: ServerRef, alloc: Allocation, state: dict[str, Any]
                      ) -> dict[str, Any]:
        """Per-server isolation: create the server's own network (its fixed address goes
        into ``state["ip"]``). Shared: make sure the shared network exists."""
        state = dict(state, node=alloc.node)
        if self.network_isolation == "per-server":
            try:
                net = await self._call(alloc.node,
                                       lambda *a: self.networks(alloc.node).create(*a),
                                       self._network_label(server), self._owner(server))
            except NetworkTaken as e:
                raise NameTaken(alloc.node, "network", e.name, e.owner) from None
            state["network"] = net.to_dict()
            state["ip"] = str(net.server_ip)
        elif self.network_isolation == "shared":
            await self._call(alloc.node, lambda *a: self.networks(alloc.node, 24).create(*a),
                             self.network_name, {})
        return state

    def cert_alt_names(self, alloc: Allocation, state: Mapping[str, Any]) -> list[str]:
        """The server's fixed IP (per-server), or the node's host address (host mode)."""
        if state.get("ip"):
            return [f"IP:{state['ip']}"]
        if self.network_isolation == "host":
            host = self.nodes[alloc.node].host
            return [f"IP:{host}" if host[:1].isdigit() else f"DNS:{host}"]
        return []

    def certs_path(self, host_dir: str) -> str:
        """The certificate folder is mounted read-only at ``/etc/gpuspawner/certs``."""
        return CERTS_MOUNT

    async def launch(self, spec: LaunchSpec, state: dict[str, Any], progress: Progress
                     ) -> tuple[str, int]:
        """Make the home, apply the disk rule, check (or pull) the image, create a *new*
        container from the spec and start it.

        A GPU share gets the limits of its node's mechanism (:mod:`gpuspawner.gpushare.
        mechanism`): the ``GPUSPAWNER_GPU_*`` (and MPS) environment; under MPS the control
        daemon's pipe directory and the host's IPC namespace (MPS clients reach the daemon
        through both); under dmem a cgroup parent of its own, made here with its
        ``dmem.max`` before the container starts (the node's engine on this host, with the
        cgroupfs cgroup driver). Under ``mps-daemon`` the GPU's MPS control daemon
        (:mod:`gpuspawner.gpushare.mps`) is started first if it does not run, and the server
        mounts its pipe volume and joins its IPC namespace.

        Raises:
            LaunchRefused: a disk limit the node cannot enforce in "refuse" mode; a dmem share
                on a node whose cgroups this host cannot write.
            LaunchFailed: the image is missing, or the engine refuses the container.
            BackendUnavailable: the engine does not answer.
        """
        node = spec.allocation.node
        if self.hub_id:
            spec = replace(spec, labels={**spec.labels, HUB_LABEL: self.hub_id})
        share = self.share_limits(spec)
        if share.env:
            spec = replace(spec, env={**spec.env, **share.env})
        base_host = await self._resolved(self.extra_host_config)
        base_create = await self._resolved(self.extra_create_kwargs)
        # the host paths, checked on the node (and the home made) before the engine sees any
        checked = await self._check_node(node, spec, base_host, progress)
        storage_opt = await self._disk_rule(spec, progress)
        await self._ensure_image(node, spec.image)
        progress(40, f"creating container from {spec.image}")
        # a leftover of this server: never reused; anyone else's: never touched
        await self._remove_named(node, ServerRef(spec.user, spec.server, spec.name))
        net = ServerNetwork.from_dict(state["network"]) if state.get("network") else None
        if self.network_isolation == "per-server" and net is not None:
            network, fixed_ip = net.name, str(net.server_ip)
        elif self.network_isolation == "host":
            network, fixed_ip = "host", None
        else:
            network, fixed_ip = self.network_name, None
        try:
            create, host = container_config(
                spec, network=network, fixed_ip=fixed_ip, pids_limit=self.pids_limit,
                storage_opt=storage_opt,
                base_host=base_host, base_create=base_create)
        except ValueError as e:
            raise LaunchFailed(str(e)) from None
        if share.mps_pipe_directory:  # the admin's daemon's folder, not a user's path
            host["ipc_mode"] = "host"
            host["binds"] = {**(host.get("binds") or {}), share.mps_pipe_directory: {
                "bind": share.mps_pipe_directory, "mode": "rw"}}
            checked = {*checked, os.path.normpath(share.mps_pipe_directory)}
        daemon = None
        if share.mps_daemon_gpu:
            daemon = daemon_for(node, share.mps_daemon_gpu,
                                self.mps_daemon_image or spec.helper_image or spec.image,
                                self.mps_daemon_command, self._hub_labels())
            try:
                host = client_host_config(host, daemon)
            except ValueError as e:
                raise LaunchFailed(f"node {node}: {e}") from None
            create["labels"] = {**create.get("labels", {}), CLIENT_LABEL: daemon.gpu,
                                UID_LABEL: str(spec.uid)}
            state["mps_gpu"] = daemon.gpu
        if share.cgroup_parent:
            await self._dmem_parent(node, share)
            host["cgroup_parent"] = state["cgroup_parent"] = share.cgroup_parent
            progress(40, f"GPU memory held by the kernel: {share.cgroup_parent} dmem.max")
        unchecked = sorted({os.path.normpath(p) for p in bind_sources(host)} - checked)
        if unchecked:  # never a path the node's check did not see
            raise LaunchFailed(f"node {node}: host path {unchecked[0]} was not checked on the "
                               "node: refused")
        def create_container() -> Any:
            cli = self.client(node)
            return cli.create_container(host_config=cli.create_host_config(**host), **create)

        lock = self._mps_lock(node, daemon.gpu) if daemon else None
        if lock is not None:
            await lock.acquire()
        try:
            if daemon is not None:
                progress(40, f"MPS control daemon of GPU {daemon.gpu}: {daemon.name}")
                await self._mps_daemon_up(node, daemon)
                me = str((create.get("labels") or {}).get("gpuspawner.user", ""))
                if await self._mps_other_users(node, daemon.gpu, me):
                    # MPS clients of one GPU share the daemon's IPC namespace: /dev/shm and
                    # System V segments (tests/test_attack_usage.py): one user per GPU
                    raise LaunchRefused(
                        f"node {node}: GPU {daemon.gpu} runs under MPS (mps-daemon) for "
                        "another user's server; its MPS clients share one IPC namespace "
                        "(/dev/shm), so a GPU's shares serve one user at a time under "
                        "mps-daemon: try again when it is free, or pick another profile")
            try:
                obj = await self._call(node, create_container)
            except APIError as e:
                raise LaunchFailed(f"node {node}: the engine refused the container: "
                                   f"{e.explanation or e}") from None
            state["container_id"] = obj["Id"]
            try:
                await self._call(node, "start", obj["Id"])
            except APIError as e:
                raise LaunchFailed(f"node {node}: the engine could not start the container: "
                                   f"{e.explanation or e}") from None
        finally:
            if lock is not None:
                lock.release()
        if net is not None:
            ip = str(net.server_ip)
        elif self.network_isolation == "host":
            ip = self.nodes[node].host
        else:
            info = await self._call(node, "inspect_container", obj["Id"])
            ip = info["NetworkSettings"]["Networks"][self.network_name]["IPAddress"]
        state["ip"] = ip
        return ip, spec.port

    #: where cgroup v2 is mounted on this host (the dmem parents are made there)
    cgroup_root = "/sys/fs/cgroup"

    def share_limits(self, spec: LaunchSpec) -> ShareLimits:
        """The limits of the server's GPU share on its node (:func:`~gpuspawner.gpushare.
        mechanism.share_limits`); none when the node has no mechanism chosen."""
        rt = self.nodes.get(spec.allocation.node)
        mech = getattr(rt, "gpu_share", None)
        if rt is None or mech is None:
            return ShareLimits()
        try:
            return share_limits(spec.allocation, {g.uuid: g for g in rt.node.gpus}, mech,
                                spec.name)
        except KeyError:  # a GPU the inventory does not list: nothing to hold it to
            return ShareLimits()

    async def _dmem_parent(self, node: str, share: ShareLimits) -> None:
        """Make the dmem cgroup parent (:func:`~gpuspawner.gpushare.mechanism.
        prepare_dmem_cgroup`). Raises LaunchRefused where this host cannot."""
        if not self._engine_is_local(node):
            raise LaunchRefused(f"node {node}: a dmem GPU share needs the node's engine on "
                                "the hub's host (its cgroups are written here); set the "
                                "node's gpu_share to watchdog or mps")
        info = await self._call(node, "info")
        if info.get("CgroupDriver") != "cgroupfs":
            raise LaunchRefused(f"node {node}: a dmem GPU share needs Docker's cgroupfs cgroup "
                                f"driver (this engine: {info.get('CgroupDriver')})")
        try:
            await asyncio.to_thread(prepare_dmem_cgroup, share, self.cgroup_root)
        except OSError as e:
            raise LaunchRefused(f"node {node}: cannot write the dmem limit of "
                                f"{share.cgroup_parent}: {e}") from None

    # -- MPS control daemons (gpu_share: mps-daemon) ---------------------------------------------
    def _hub_labels(self) -> dict[str, str]:
        return {HUB_LABEL: self.hub_id} if self.hub_id else {}

    def _mps_lock(self, node: str, gpu: str) -> asyncio.Lock:
        return self._mps_locks.setdefault((node, gpu), asyncio.Lock())

    async def _mps_daemon_up(self, node: str, daemon: MpsDaemon) -> None:
        """Start ``daemon`` unless it runs (its lock held): its two volumes, then its
        container (:meth:`~gpuspawner.gpushare.mps.MpsDaemon.host_kwargs`); a stopped one of
        this hub is removed and made again.

        Raises:
            LaunchFailed: a container of that name that is not this hub's daemon of this GPU;
                the engine refuses the daemon, or it exits at once (its last log lines).
        """
        try:
            info = await self._call(node, "inspect_container", daemon.name)
        except NotFound:
            info = None
        if info is not None:
            labels = (info.get("Config") or {}).get("Labels") or {}
            if labels.get(DAEMON_LABEL) != daemon.gpu or not made_by(labels, self.hub_id):
                raise LaunchFailed(f"node {node}: a container named {daemon.name} is not this "
                                   f"hub's MPS daemon of GPU {daemon.gpu}: not touched")
            if (info.get("State") or {}).get("Running"):
                return
            await self._call(node, "remove_container", info["Id"], force=True)
        await self._ensure_image(node, daemon.image)
        for volume in (daemon.pipe_volume, daemon.log_volume):
            await self._call(node, "create_volume", volume, labels=dict(daemon.labels))

        def create() -> Any:
            cli = self.client(node)
            return cli.create_container(
                host_config=cli.create_host_config(**daemon.host_kwargs()),
                **daemon.create_kwargs())

        try:
            cid = (await self._call(node, create))["Id"]
            await self._call(node, "start", cid)
        except APIError as e:
            raise LaunchFailed(f"node {node}: the engine refused the MPS daemon "
                               f"{daemon.name}: {e.explanation or e}") from None
        # ready once its control pipe is there: a client's CUDA that finds no daemon runs
        # without MPS, past its limits (nvidia-cuda-mps-control(1))
        deadline = asyncio.get_running_loop().time() + self.mps_daemon_start_timeout
        while True:
            st = (await self._call(node, "inspect_container", cid)).get("State") or {}
            if not st.get("Running"):
                tail = (await self._call(node, "logs", cid, tail=8)).decode("utf-8",
                                                                             "replace")
                raise LaunchFailed(f"node {node}: the MPS daemon {daemon.name} exited with "
                                   f"code {st.get('ExitCode')}: {tail.strip()}")
            ex = await self._call(node, "exec_create", cid, list(READY_COMMAND))
            await self._call(node, "exec_start", ex)
            if (await self._call(node, "exec_inspect", ex)).get("ExitCode") == 0:
                break
            if asyncio.get_running_loop().time() >= deadline:
                raise LaunchFailed(f"node {node}: the MPS daemon {daemon.name} made no "
                                   f"{PIPE_MOUNT}/control in {self.mps_daemon_start_timeout:g}"
                                   " s")
            await asyncio.sleep(0.2)
        self.log.info("node %s: MPS control daemon %s started for GPU %s", node, daemon.name,
                      daemon.gpu)

    async def _mps_other_users(self, node: str, gpu: str, user: str) -> list[str]:
        """The hub users (``gpuspawner.user`` labels) of this hub's other MPS clients of
        ``gpu`` on ``node`` that are not ``user``."""
        found = await self._call(node, "containers", filters={"label": [f"{CLIENT_LABEL}={gpu}"]})
        return sorted({(c.get("Labels") or {}).get("gpuspawner.user", "?") for c in found
                       if made_by(c.get("Labels"), self.hub_id)} - {user})

    async def _mps_release(self, node: str, gpu: str) -> None:
        """After an MPS client of ``gpu`` is gone: stop its daemon when no client of it is
        left on ``node`` (``quit`` to the control daemon, then the container and the pipe
        volume removed; the log volume stays for the admin). Never raises."""
        async with self._mps_lock(node, gpu):
            try:
                left = await self._call(node, "containers", all=True, filters={
                    "label": [f"{CLIENT_LABEL}={gpu}"]})
                left = [c for c in left if made_by(c.get("Labels"), self.hub_id)]
                if left:
                    return
                found = await self._call(node, "containers", all=True, filters={
                    "label": [f"{DAEMON_LABEL}={gpu}"]})
                for c in found:
                    if not made_by(c.get("Labels"), self.hub_id):
                        continue
                    if c.get("State") == "running":
                        try:
                            ex = await self._call(node, "exec_create", c["Id"],
                                                  list(QUIT_COMMAND))
                            await self._call(node, "exec_start", ex)
                        except APIError as e:
                            self.log.info("node %s: MPS daemon %s: quit: %s", node,
                                          c["Id"][:12], e)
                        await self._call(node, "stop", c["Id"], timeout=self.stop_timeout)
                    await self._call(node, "remove_container", c["Id"], force=True)
                    pipe = f"{(c.get('Names') or ['/'])[0].lstrip('/')}-pipe"
                    try:
                        await self._call(node, "remove_volume", pipe, force=True)
                    except NotFound:
                        pass
                    self.log.info("node %s: MPS control daemon of GPU %s stopped (no client "
                                  "left)", node, gpu)
            except Exception as e:  # noqa: BLE001 - a stop never fails on the daemon
                self.log.warning("node %s: stopping the MPS daemon of GPU %s: %s", node,
                                 gpu, e)

    def _engine_is_local(self, node: str) -> bool:
        """Whether ``node``'s engine runs on this machine (a unix socket)."""
        rt = self.nodes.get(node)
        url = (rt.docker_url if rt else "") or os.environ.get("DOCKER_HOST", "")
        return not url or url.startswith("unix://")

    async def _check_node(self, node: str, spec: LaunchSpec, base_host: Mapping[str, Any],
                          progress: Progress) -> set[str]:
        """Where the server runs (here for a node on this machine, else in the helper
        container on the node: ``home_on_node``): check every host path the container will
        get (:func:`~gpuspawner.backends.home.check_mount_paths`: the site's mounts, the
        certificates' folder, ``extra_host_config``'s binds, the homes' folder), then apply the
        home rules (:func:`~gpuspawner.backends.home.ensure_home`).

        Returns:
            the host paths checked (the home's included).
        Raises:
            MountPathUnsafe, HomeOwnedByOther, HomeParentMissing, LaunchFailed,
            BackendUnavailable.
        """
        home = spec.home
        paths = [m.source for m in spec.mounts] + bind_sources(base_host)
        if spec.certs_dir:
            paths.append(spec.certs_dir)
        paths = list(dict.fromkeys(os.path.normpath(p) for p in paths))
        strict = [os.path.dirname(os.path.normpath(home.host_path))] if home else []
        checked = set(paths) | ({os.path.normpath(home.host_path)} if home else set())
        if not paths and home is None:
            return checked
        owners = sorted({0, *self.mount_owners})
        if self.home_on_node == "auto" and self._engine_is_local(node):
            owners = sorted({*owners, os.geteuid()})  # the hub's own folders on its machine

            def here() -> None:
                check_mount_paths(paths, owners, strict=strict, node=node)
                if home is not None:
                    ensure_home(home.host_path, spec.uid, spec.gid, legacy=home.legacy_path,
                                user=spec.user, node=node)

            await asyncio.to_thread(here)
            return checked
        what = f"the home {home.host_path}" if home else "the mounted folders"
        progress(25, f"checking {what} on node {node}")
        args: dict[str, Any] = {"check": {"paths": paths, "owners": owners, "strict": strict,
                                          "root": home_script.HOST_ROOT}}
        if home is not None:
            args.update(path=home.host_path, uid=spec.uid, gid=spec.gid,
                        legacy=home.legacy_path)
        # never the user's own image: it would run as root beside every home
        helper = self.home_helper_image or spec.helper_image or spec.image
        await self._ensure_image(node, helper)
        answer = await self._call(node, self._home_helper, node, helper, args)
        raise_for(answer, home.host_path if home else "", spec.uid, user=spec.user, node=node)
        return checked

    def _home_helper(self, node: str, image: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run :mod:`~gpuspawner.backends.home_script` on ``node`` in a helper container
        of ``image`` (blocking): root (to give the folder away), no network, the node's root
        folder read-only at ``home_script.HOST_ROOT`` (the paths are looked at there, links
        not followed), the home's parent folder bind-mounted at its own path (a missing one
        makes the engine refuse: nothing is made on the node; the script checks its path
        before it touches it), ``python3`` as the entrypoint (the image's own entrypoint does
        not run). Returns the script's answer."""
        cli = self.client(node)
        mounts = [docker.types.Mount(home_script.HOST_ROOT, "/", type="bind", read_only=True)]
        parent = ""
        if args.get("path"):
            parent = os.path.dirname(os.path.normpath(args["path"]))
            mounts.append(docker.types.Mount(parent, parent, type="bind"))
        try:
            cid = cli.create_container(
                image, ["-c", HOME_SCRIPT, json.dumps(args)], entrypoint=["python3"],
                user="0:0",
                network_disabled=True, labels={"gpuspawner.home-helper": "1"},
                host_config=cli.create_host_config(
                    mounts=mounts, security_opt=["no-new-privileges"],
                    cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"]))["Id"]
        except APIError as e:
            if "bind source path does not exist" in str(e.explanation or e):
                return {"error": home_script.NO_PARENT, "parent": parent}
            raise LaunchFailed(f"node {node}: home helper container refused: "
                               f"{e.explanation or e}") from None
        try:
            cli.start(cid)
            code = cli.wait(cid, timeout=60).get("StatusCode")
            out = cli.logs(cid, stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            try:
                cli.remove_container(cid, force=True)
            except (APIError, NotFound):
                pass
        try:
            return dict(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            return {"error": "os", "message": f"helper exited with {code}: {out[-300:]}"}

    async def _disk_rule(self, spec: LaunchSpec, progress: Progress) -> dict[str, str]:
        """``storage_opt`` for the allocation's disk (:func:`disk_rule`)."""
        alloc = spec.allocation
        if not alloc.disk_bytes:
            return {}
        supported, driver = await self._call(alloc.node, self.disk_limit_supported, alloc.node)
        image_bytes = 0
        if supported:
            try:
                info = await self._call(alloc.node, "inspect_image", spec.image)
                image_bytes = int(info.get("Size") or 0)
            except (APIError, NotFound, ValueError):
                image_bytes = 0
        try:
            storage_opt, message = disk_rule(alloc.disk_bytes, supported=supported,
                                             driver=driver, image_bytes=image_bytes,
                                             mode=self.disk_limit_mode)
        except DiskLimitUnsupported as e:
            raise LaunchRefused(f"node {alloc.node}: {e}") from None
        if message:
            progress(30, message)
        return storage_opt

    async def _ensure_image(self, node: str, image: str) -> None:
        """The image is on the node (pulled per ``pull_policy``).

        Raises:
            LaunchFailed: missing with pull_policy "never", or the pull failed.
        """
        present = True
        try:
            await self._call(node, "inspect_image", image)
        except (ImageNotFound, NotFound):
            present = False
        if self.pull_policy == "always" or (not present and self.pull_policy == "ifnotpresent"):
            repo, tag = docker.utils.parse_repository_tag(image)
            try:
                await self._call(node, "pull", repo, tag=tag or "latest")
                return
            except APIError as e:
                raise LaunchFailed(f"image {image!r}: pull on node {node} failed: {e}") from None
        if not present:
            raise LaunchFailed(f"image {image!r} is not on node {node}; the admin must build "
                               "or pull it (make images)")

    async def check_image(self, node: str, image: str, uid: int, gid: int, timeout_s: float,
                          progress: Progress, max_bytes: int = 0) -> ImageCheck:
        """A user's own image on ``node``: pulled if missing (progress in MiB; stopped once its
        layers pass ``max_bytes``), at most ``max_bytes`` on the node (0: any), for the node's
        architecture, ``jupyterhub-singleuser --version`` runs in it in a throwaway container
        (no network, no devices, the user's uid; :mod:`~gpuspawner.backends.docker_image`),
        once per image digest and node.

        Raises:
            ImageRefused: a check failed (the message says which).
            BackendUnavailable: the node's engine does not answer.
        """
        loop = asyncio.get_running_loop()
        known = self._image_checks.setdefault(node, {})

        def report(text: str) -> None:
            loop.call_soon_threadsafe(progress, 12, text)

        return await self._call(node, lambda: check_image_blocking(
            self.client(node), node, image, uid, gid, timeout_s, report, known, max_bytes))

    async def _remove_named(self, node: str, server: ServerRef) -> None:
        """Remove the container named ``server.name`` when it is this server's leftover.

        Raises:
            NameTaken: a container of that name belongs to someone else (or not to us).
        """
        try:
            info = await self._call(node, "inspect_container", server.name)
        except NotFound:
            return
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(MANAGED_LABEL) != "1" or not server.owns(labels, self.hub_id):
            raise NameTaken(node, "container", server.name,
                            owner_labels(labels) if labels.get(MANAGED_LABEL) == "1" else {})
        try:
            await self._call(node, "remove_container", info["Id"], v=True, force=True)
        except NotFound:
            pass

    async def exit_report(self, state: Mapping[str, Any]) -> str | None:
        """None while the container runs; else its exit code (and OOM kill) with its last 8
        log lines."""
        node, cid = state.get("node", ""), state.get("container_id")
        if not cid:
            return None
        st = (await self._call(node, "inspect_container", cid)).get("State") or {}
        if st.get("Running"):
            return None
        try:
            logs = (await self._call(node, "logs", cid, tail=8)).decode(
                "utf-8", "replace").strip()
        except Exception:
            logs = ""
        text = f"container {cid[:12]} exited during start with code {st.get('ExitCode')}"
        if st.get("OOMKilled"):
            text += " (out of memory)"
        return f"{text}; last log lines:\n{logs}" if logs else text

    async def read_output(self, state: Mapping[str, Any], max_bytes: int) -> bytes | None:
        """The container's standard output (not its standard error), the last ``max_bytes``
        bytes (all of it when ``max_bytes`` <= 0); None when the container is gone. The log
        is streamed and only its tail kept (:func:`log_tail`): a job may print gigabytes."""
        node, cid = state.get("node", ""), state.get("container_id")
        if not cid:
            return None
        try:
            return await self._call(node, lambda: log_tail(self.client(node), cid, max_bytes))
        except NotFound:
            return None

    async def poll(self, state: Mapping[str, Any]) -> int | None:
        """None while the container runs; its exit code once it stopped; 0 when it is gone.
        """
        node, cid = state.get("node", ""), state.get("container_id")
        if not cid:
            return 0
        try:
            info = await self._call(node, "inspect_container", cid)
        except NotFound:
            return 0
        st = info.get("State") or {}
        if st.get("Running") or st.get("Status") in ("created", "restarting"):
            return None
        return int(st.get("ExitCode") or 0)

    async def stop(self, state: Mapping[str, Any], now: bool = False) -> None:
        """Stop (SIGTERM, ``stop_timeout``) and remove the container."""
        node, cid = state.get("node", ""), state.get("container_id")
        if not cid:
            return
        try:
            if not now:
                await self._call(node, "stop", cid, timeout=self.stop_timeout)
            await self._call(node, "remove_container", cid, v=True, force=True)
        except NotFound:
            pass
        except APIError as e:
            if e.status_code not in (404, 409):
                raise
        if state.get("cgroup_parent"):
            await asyncio.to_thread(remove_dmem_cgroup, str(state["cgroup_parent"]),
                                    self.cgroup_root)
        if state.get("mps_gpu"):
            await self._mps_release(node, str(state["mps_gpu"]))

    async def cleanup(self, alloc: Allocation | None, state: Mapping[str, Any]) -> None:
        """Remove the container and the server's network as far as ``state`` knows them.
        Never raises."""
        node = state.get("node") or (alloc.node if alloc else "")
        if not node or node not in self.nodes:
            return
        if state.get("cgroup_parent"):  # after the container: the kernel refuses it before
            await self._drop_dmem_parent(node, state)
        cid = state.get("container_id")
        if cid:
            try:
                await self._call(node, "remove_container", cid, v=True,
                                 force=True)
            except NotFound:
                pass
            except Exception as e:
                self.log.warning("node %s: removing container %s failed: %s", node, cid[:12], e)
        net = state.get("network")
        if net:
            try:
                await self._call(node, lambda n: self.networks(node).remove(n), net["name"])
            except Exception as e:
                self.log.warning("node %s: removing network %s failed: %s", node, net["name"], e)
        if state.get("mps_gpu"):  # after the client: the daemon stops with its last client
            await self._mps_release(node, str(state["mps_gpu"]))

    async def _drop_dmem_parent(self, node: str, state: Mapping[str, Any]) -> None:
        """Remove the dmem cgroup parent once its container is gone (never raises)."""
        cid = state.get("container_id")
        if cid:
            try:
                await self._call(node, "remove_container", cid, v=True, force=True)
            except Exception:  # noqa: BLE001 - gone already, or the cleanup below reports it
                pass
        await asyncio.to_thread(remove_dmem_cgroup, str(state["cgroup_parent"]),
                                self.cgroup_root)

    async def remove_server(self, node: str, server: ServerRef) -> None:
        """Remove the containers labelled with this user and server, and its network."""
        found = await self._call(node, "containers", all=True, filters={"label": [
            f"{MANAGED_LABEL}=1", f"gpuspawner.user={server.user}",
            f"gpuspawner.server={server.server}"]})
        for c in found:
            if not made_by(c.get("Labels"), self.hub_id):
                continue  # the same user name on another hub sharing this engine
            try:
                await self._call(node, "remove_container", c["Id"], v=True, force=True)
            except NotFound:
                pass
        if self.network_isolation == "per-server":
            await self._call(node, lambda n: self.networks(node).remove(n, self._owner(server)),
                             self._network_label(server))

    # -- the whole cluster ----------------------------------------------------------------------
    async def node_states(self) -> dict[str, tuple[str, str]]:
        """``docker ping`` every node's engine at once (5 s at most): a node whose engine does
        not answer is ``("down", "Docker engine unavailable: …")``."""
        async def one(name: str) -> tuple[str, tuple[str, str]]:
            try:
                await asyncio.wait_for(self._call(name, "ping"), 5)
                return name, ("up", "")
            except (BackendUnavailable, asyncio.TimeoutError) as e:
                reason = getattr(e, "reason", None) or "no answer in 5 s"
                return name, ("down", f"Docker engine unavailable: {reason}")
            except Exception as e:  # an API error: the engine answers, but wrongly
                return name, ("down", f"Docker engine error: {e}")

        return dict(await asyncio.gather(*(one(n) for n in self.nodes)))

    async def list_managed(self) -> list[Managed]:
        """Containers with our labels that run (or were created) on every reachable node."""
        out: list[Managed] = []
        for name in self.nodes:
            try:
                found = await self._call(name, "containers", all=True,
                                         filters={"label": f"{MANAGED_LABEL}=1"})
            except Exception as e:  # engine down: report, do not crash the hub
                self.log.warning("node %s: cannot list containers to restore allocations: %s",
                                 name, e)
                continue
            for c in found:
                text = (c.get("Labels") or {}).get(ALLOCATION_LABEL)
                if text and made_by(c.get("Labels"), self.hub_id) and c.get("State") in (
                        "running", "created", "restarting"):
                    out.append(Managed(name, text, c["Id"]))
        return out

    async def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each running container of this hub used so far, by allocation id: the
        engine's stats (``GET /containers/{id}/stats?stream=false&one-shot=true``,
        ``cpu_stats.cpu_usage.total_usage``: nanoseconds of the container's cgroup), one call
        per container. A node or container that does not answer is skipped. Never raises."""
        out: dict[str, float] = {}
        for name in self.nodes:
            try:
                found = await self._call(name, "containers", filters={
                    "label": f"{MANAGED_LABEL}=1", "status": "running"})
            except Exception as e:  # noqa: BLE001 - an engine down: no figures from it
                self.log.debug("node %s: no CPU figures: %s", name, e)
                continue
            for c in found:
                labels = c.get("Labels") or {}
                if not made_by(labels, self.hub_id):
                    continue
                try:
                    alloc_id = json.loads(labels.get(ALLOCATION_LABEL, ""))["id"]
                    stats = await self._call(name, "stats", c["Id"], stream=False,
                                             one_shot=True)
                    ns = stats["cpu_stats"]["cpu_usage"]["total_usage"]
                except Exception:  # noqa: BLE001 - gone meanwhile, no label, no stats
                    continue
                out[str(alloc_id)] = float(ns) / 1e9
        return out

    async def remove_managed(self, found: Managed) -> None:
        """Remove the container (force). Never raises."""
        try:
            await self._call(found.node, "remove_container",
                             found.handle, v=True, force=True)
        except Exception as e:
            self.log.warning("node %s: removing container %s failed: %s", found.node,
                             found.handle[:12], e)

    async def sweep(self, node: str, booked: Callable[[str], bool],
                    owner_booked: Callable[[str, str], bool]) -> list[str]:
        """Remove containers whose allocation is not booked, server networks whose owner
        holds nothing, and MPS control daemons of this hub with no client left (a hub that
        stopped between a GPU's last client and its daemon)."""
        removed = []
        for c in await self._call(node, "containers", all=True,
                                  filters={"label": f"{MANAGED_LABEL}=1"}):
            if not made_by(c.get("Labels"), self.hub_id):
                continue  # another hub's
            try:
                alloc_id = json.loads((c.get("Labels") or {}).get(ALLOCATION_LABEL, ""))["id"]
            except (ValueError, KeyError, TypeError):
                alloc_id = None
            if alloc_id is None or not booked(alloc_id):
                self.log.warning("node %s: removing container %s, not booked in the ledger",
                                 node, c["Id"][:12])
                await self._call(node, "remove_container", c["Id"], v=True, force=True)
                removed.append(c["Id"])
        for n in await self._call(node, "networks", filters={"label": "gpuspawner.user"}):
            labels = n.get("Labels") or {}
            if not made_by(labels, self.hub_id):
                continue
            if not owner_booked(labels.get("gpuspawner.user", ""),
                                labels.get("gpuspawner.server", "")):
                try:
                    await self._call(node, "remove_network", n["Id"])
                except Exception as e:  # still in use by something else: leave it
                    self.log.info("node %s: network %s kept: %s", node, n.get("Name"), e)
        for c in await self._call(node, "containers", all=True,
                                  filters={"label": DAEMON_LABEL}):
            gpu = (c.get("Labels") or {}).get(DAEMON_LABEL, "")
            if gpu and made_by(c.get("Labels"), self.hub_id):
                await self._mps_release(node, gpu)
        return removed

