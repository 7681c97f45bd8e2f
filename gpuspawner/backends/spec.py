"""What to run for one user server, independent of the engine that runs it.

The spawner turns an :class:`~gpuspawner.placement.Allocation` and the user into a
:class:`LaunchSpec` (pure, :func:`launch_spec`); a backend turns the spec into engine calls
(``gpuspawner.backends.docker.container_config`` for the Docker engine). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..placement import Allocation

#: label holding the allocation JSON (restore after a hub restart reads it)
ALLOCATION_LABEL = "gpuspawner.allocation"
#: label marking objects made by gpuspawner
MANAGED_LABEL = "gpuspawner.managed"
#: label naming the hub that made an object (its id: :mod:`gpuspawner.hub.hub_id`); objects
#: without it were made by gpuspawner 0.x and count as the one hub's
HUB_LABEL = "gpuspawner.hub"


@dataclass(frozen=True)
class HomeMount:
    """The user's home: ``host_path`` on the node, mounted read-write at ``mount_point``.
    ``legacy_path``: the folder gpuspawner 0.x used for this user, moved to ``host_path``
    when that is missing (:func:`~gpuspawner.backends.home.ensure_home`); None when there is
    none or another user may own it."""

    host_path: str
    mount_point: str
    legacy_path: str | None = None


@dataclass(frozen=True)
class Mount:
    """A folder of the node mounted into the server (the site's data: datasets, project
    folders; :mod:`gpuspawner.hub.volumes`): ``source`` on the node, ``target`` in the server,
    read-only when ``read_only`` (enforced by the engine: a write fails with EROFS)."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class LaunchSpec:
    """One user server, as any backend needs it.

    Attributes:
        name: engine object name (escaped and capped: a valid container or job name).
        user: JupyterHub user name. server: server name ("" = default server).
        allocation: what the ledger booked (node, GPUs by UUID, cpuset, NUMA memory nodes,
            memory and disk in bytes).
        image: container image.
        cmd: the full command line of the server.
        env: environment (``JUPYTERHUB_*`` from the hub, plus the allocation's variables).
        uid, gid: the ids the server runs as and the home belongs to.
        home: the shared home, or None.
        working_dir: the server's working directory, or None for the image's.
        port: where the server listens inside its own network namespace; 0 = nothing
            listens (a notebook job's spec, made by replacing the port: no port is exposed).
        labels: labels every engine object of this server carries (allocation included).
        certs_dir: host folder with the server's internal_ssl files (read-only mount), or "".
        mounts: the site's folders mounted beside the home (:class:`Mount`), in order.
        time_limit: a notebook job's time limit in seconds (0: none, a server's). The job
            runner stops the job at its limit itself; a backend with a limit of its own
            (Slurm's ``--time``) sets it a little later, as a backstop while the hub is down.
        helper_image: the image of the short-lived helpers a backend runs as root on the node
            (the home's check and creation, ``DockerBackend.home_on_node``): an image the
            admin chose (the profile's or the spawner's), never a user's own, whose entrypoint
            or ``python3`` would then run as root beside every user's home.
    """

    name: str
    user: str
    server: str
    allocation: Allocation
    image: str
    cmd: tuple[str, ...]
    env: Mapping[str, str]
    uid: int
    gid: int
    port: int
    home: HomeMount | None = None
    working_dir: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    certs_dir: str = ""
    mounts: tuple[Mount, ...] = ()
    time_limit: int = 0
    helper_image: str = ""


def allocation_env(alloc: Allocation) -> dict[str, str]:
    """The allocation as environment variables: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    ``OMP_NUM_THREADS`` and ``CPU_LIMIT`` (cores), ``MEM_LIMIT`` (bytes), as
    jupyter-resource-usage reads them, ``GPUSPAWNER_ALLOCATION`` (JSON) and
    ``NVIDIA_VISIBLE_DEVICES`` (GPU and ``MIG-`` instance UUIDs, or ``void``; NVIDIA
    container toolkit docs)."""
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "OMP_NUM_THREADS": str(max(1, len(alloc.cpuset))),
        "MEM_LIMIT": str(alloc.memory_bytes),
        "CPU_LIMIT": str(len(alloc.cpuset)),
        "GPUSPAWNER_ALLOCATION": alloc.to_json(),
        "NVIDIA_VISIBLE_DEVICES": ",".join(alloc.device_ids) or "void",
    }


def launch_spec(*, name: str, user: str, server: str, allocation: Allocation, image: str,
                cmd: Sequence[str], env: Mapping[str, str], uid: int, gid: int, port: int,
                home: HomeMount | None = None, certs_dir: str = "",
                mounts: Sequence[Mount] = (), helper_image: str = "") -> LaunchSpec:
    """Build the spec of one server: the environment gains the allocation's variables (and
    ``HOME`` with a home mount), the labels name the owner and carry the allocation, the
    working directory is the home. ``helper_image``: the admin's image for root helpers
    (:class:`LaunchSpec`); empty means ``image``, which is then an image the admin chose: a
    caller that runs a user's own image must pass the admin's here.

    Raises:
        ValueError: a uid/gid below 0, a port outside 1..65535, or an empty command.
    """
    if uid < 0 or gid < 0:
        raise ValueError(f"uid/gid must be >= 0, got {uid}:{gid}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be 1..65535, got {port}")
    if not cmd:
        raise ValueError("the server command is empty")
    full_env = dict(env)
    full_env.update(allocation_env(allocation))
    if home is not None:
        full_env["HOME"] = home.mount_point
    labels = {ALLOCATION_LABEL: allocation.to_json(), MANAGED_LABEL: "1",
              "gpuspawner.user": user, "gpuspawner.server": server}
    return LaunchSpec(name=name, user=user, server=server, allocation=allocation, image=image,
                      cmd=tuple(cmd), env=full_env, uid=uid, gid=gid, port=port, home=home,
                      working_dir=home.mount_point if home else None, labels=labels,
                      certs_dir=certs_dir, mounts=tuple(mounts),
                      helper_image=helper_image or image)
