"""The Docker engine's side of a launch: a :class:`~gpuspawner.backends.spec.LaunchSpec` as
``create_container`` arguments (pure, :func:`container_config`), the rules for disk limits
(:func:`disk_rule`).

Every limit comes from the docker docs (``docker run`` reference): ``cpuset_cpus`` /
``cpuset_mems`` pin cores and memory nodes, ``mem_limit`` = ``memswap_limit`` allows no swap
beyond the limit, ``device_requests`` with ``driver="nvidia"`` and GPU UUIDs as
``device_ids`` expose exactly those GPUs (the NVIDIA container toolkit's ``--gpus
device=UUID``), ``storage_opt size`` limits the writable layer where the storage driver
enforces it, ``pids_limit``, ``security_opt no-new-privileges``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..placement import format_bytes
from .spec import LaunchSpec

#: capabilities asked of the NVIDIA container runtime (docker docs, "--gpus": capabilities
#: map to NVIDIA_DRIVER_CAPABILITIES)
GPU_CAPABILITIES = [["gpu", "compute", "utility"]]
#: where a server's internal_ssl files are mounted, read-only, in its container
CERTS_MOUNT = "/etc/gpuspawner/certs"
#: storage drivers on which ``storage_opt size`` is enforced (docker docs, "docker run
#: --storage-opt"): btrfs, zfs, and overlay2 on xfs with project quotas (pquota)
DISK_LIMIT_DRIVERS = ("btrfs", "zfs")


class DiskLimitUnsupported(ValueError):
    """The node's storage driver cannot limit disk and the mode is "refuse"."""


def container_config(spec: LaunchSpec, *, network: str | None = None,
                     fixed_ip: str | None = None, pids_limit: int = 4096,
                     storage_opt: Mapping[str, str] | None = None,
                     base_host: Mapping[str, Any] | None = None,
                     base_create: Mapping[str, Any] | None = None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(create_kwargs, host_config_kwargs)`` for ``APIClient.create_container`` and
    ``APIClient.create_host_config``.

    The admin's ``base_host`` / ``base_create`` (``extra_host_config`` /
    ``extra_create_kwargs``) are kept; pinning and hardening win where they overlap.

    Args:
        spec: the server.
        network: network mode (a network name, "host"); None = the engine's default.
        fixed_ip: the container's address on ``network`` (internal_ssl certificates name it).
        pids_limit: most processes in the container.
        storage_opt: e.g. ``{"size": "1073741824"}`` (see :func:`disk_rule`).

    Raises:
        ValueError: a bind of the Docker socket (a user with it owns the node).
    """
    from docker.types import DeviceRequest

    alloc = spec.allocation
    host: dict[str, Any] = dict(base_host or {})
    mem = alloc.memory_bytes or None
    host.update({
        "cpuset_cpus": alloc.cpuset_str() or None,
        "cpuset_mems": alloc.mems_str() or None,
        "mem_limit": mem,
        "memswap_limit": mem,
        "privileged": False,
        "security_opt": sorted(set(host.get("security_opt") or []) | {"no-new-privileges"}),
        "pids_limit": pids_limit,
        # removed by stop/rollback/poll, not by the engine: a container that exits during
        # start must still be there to read its exit code and last log lines
        "auto_remove": False,
        "network_mode": network,
    })
    if alloc.gpus or alloc.mig:
        # GPUs and MIG instances alike by UUID: the NVIDIA container toolkit takes a MIG
        # device's "MIG-<uuid>" in device_ids / NVIDIA_VISIBLE_DEVICES as it takes "GPU-<uuid>"
        # (NVIDIA MIG user guide, "Running CUDA Applications as Containers")
        host["device_requests"] = [DeviceRequest(
            driver="nvidia", device_ids=alloc.device_ids,
            capabilities=GPU_CAPABILITIES)]
    if storage_opt:
        host["storage_opt"] = dict(storage_opt)
    binds = dict(host.get("binds") or {})
    if spec.home is not None:
        binds[spec.home.host_path] = {"bind": spec.home.mount_point, "mode": "rw"}
    if spec.certs_dir:
        binds[spec.certs_dir] = {"bind": CERTS_MOUNT, "mode": "ro"}
    for m in spec.mounts:  # the site's data (gpuspawner.hub.volumes); "ro": a read-only bind
        if m.source in binds:
            raise ValueError(f"{m.source} is mounted twice (at {binds[m.source]['bind']} and "
                             f"{m.target})")
        binds[m.source] = {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
    for path in binds:
        if "docker.sock" in str(path):
            raise ValueError(f"refusing to mount the Docker socket ({path})")
    if binds:
        host["binds"] = binds
    host = {k: v for k, v in host.items() if v is not None}

    create: dict[str, Any] = dict(base_create or {})
    labels = dict(create.get("labels") or {})
    labels.update(spec.labels)
    create.update({
        "image": spec.image, "name": spec.name, "command": list(spec.cmd),
        "environment": dict(spec.env), "labels": labels, "user": f"{spec.uid}:{spec.gid}",
    })
    if spec.port:  # 0: a notebook job, nothing listens
        create["ports"] = {f"{spec.port}/tcp": None}
    if spec.working_dir:
        create["working_dir"] = spec.working_dir
    if network and fixed_ip:
        create["networking_config"] = {"EndpointsConfig": {network: {
            "IPAMConfig": {"IPv4Address": fixed_ip}}}}
    return create, host


def disk_rule(disk_bytes: int, *, supported: bool, driver: str, image_bytes: int,
              mode: str) -> tuple[dict[str, str], str]:
    """How a profile's disk is honoured on a node: ``(storage_opt, progress message)``.

    On btrfs and zfs the quota of a container's subvolume/dataset also counts the image's own
    bytes, so the limit is the profile's disk plus ``image_bytes`` (seen on btrfs: a write past
    the profile's disk fails, docs/topology-files.md). Where the driver cannot enforce a size
    (overlay2 on ext4), ``mode`` "account" books the disk in the ledger only, "refuse" raises.

    Raises:
        DiskLimitUnsupported: ``mode`` is "refuse" and the driver cannot limit disk.
    """
    if not disk_bytes:
        return {}, ""
    if supported:
        size = disk_bytes + (image_bytes if driver in DISK_LIMIT_DRIVERS else 0)
        return {"size": str(size)}, (f"disk limited to {format_bytes(disk_bytes)} writable "
                                     f"({driver} storage_opt size)")
    if mode == "refuse":
        raise DiskLimitUnsupported(f"storage driver {driver} cannot limit disk; "
                                   "disk_limit_mode is 'refuse'")
    return {}, (f"disk {format_bytes(disk_bytes)} accounted only: storage driver {driver} "
                "cannot enforce a size limit")
