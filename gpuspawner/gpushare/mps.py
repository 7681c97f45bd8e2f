"""MPS control daemons that gpuspawner runs itself: one per shared GPU, a container each
(``gpu_share: mps-daemon``, docs/gpu-sharing.md "MPS").

What the daemon and its clients need, from NVIDIA's documentation:

* The MPS control daemon is ``nvidia-cuda-mps-control``; ``-d`` runs it as a daemon, ``-f`` in
  the foreground (the container's main process here). It serves the GPUs visible to it: a
  daemon per GPU sees that GPU only (NVIDIA MPS docs, "Starting MPS control daemon":
  ``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, then
  ``nvidia-cuda-mps-control -d``; https://docs.nvidia.com/deploy/mps/). Here the container is
  given that one GPU by UUID (a device request, as a server gets its GPUs), so it sees no
  other.
* The daemon, the MPS server it spawns and the clients talk through named pipes and unix
  sockets in ``CUDA_MPS_PIPE_DIRECTORY``, which must be the same for all of them; the daemon
  writes ``control.log`` and ``server.log`` to ``CUDA_MPS_LOG_DIRECTORY`` (nvidia-cuda-mps-
  control(1)). The pipe directory is a Docker volume of the GPU's own, mounted in the daemon
  and in each client at :data:`PIPE_MOUNT`; the log directory is a second volume mounted in
  the daemon only (its logs name every client's uid and pid: they are the admin's).
* The MPS server and its clients also share POSIX shared memory (``/dev/shm``): NVIDIA's
  Kubernetes device plugin gives its MPS daemon and its clients one ``tmpfs`` as ``/dev/shm``
  ("MPS Support in the GPU Device Plugin"); others run both in the host's IPC namespace. Here
  the daemon's container has a shareable IPC namespace (``IpcMode: shareable``) and each
  client joins it (``IpcMode: container:<daemon>``): the clients of one GPU share that
  namespace with each other and with the daemon, and none of them the host's.
* ``nvidia-cuda-mps-control`` and ``nvidia-cuda-mps-server`` come from the node's driver: the
  NVIDIA container toolkit mounts them into a container asked for the ``compute`` capability,
  so the daemon's image needs no CUDA of its own (not seen on a GPU here).
* Stopping: ``echo quit | nvidia-cuda-mps-control`` asks the daemon to shut down (nvidia-
  cuda-mps-control(1), "quit"); the container is then stopped and removed.

The Docker backend (:class:`~gpuspawner.backends.docker_backend.DockerBackend`) starts a GPU's
daemon before its first MPS client starts and stops it after its last client stopped. This
module is the pure part: names, labels and the container's arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLIENT_LABEL",
    "DAEMON_COMMAND",
    "DAEMON_LABEL",
    "LOG_MOUNT",
    "PIPE_MOUNT",
    "QUIT_COMMAND",
    "READY_COMMAND",
    "UID_LABEL",
    "MpsDaemon",
    "client_host_config",
    "daemon_for",
]

#: where the GPU's pipe volume is mounted, in the daemon and in every client
#: (``CUDA_MPS_PIPE_DIRECTORY`` of both)
PIPE_MOUNT = "/run/nvidia-mps"
#: where the daemon's log volume is mounted (``CUDA_MPS_LOG_DIRECTORY``; the daemon only)
LOG_MOUNT = "/var/log/nvidia-mps"
#: the daemon's container runs this (``c.DockerBackend.mps_daemon_command`` overrides it)
DAEMON_COMMAND = ("nvidia-cuda-mps-control", "-f")
#: run in the daemon's container before it is stopped
QUIT_COMMAND = ("sh", "-c", "echo quit | nvidia-cuda-mps-control")
#: exits 0 once the daemon is ready: its control pipe is in the pipe directory (the daemon
#: makes ``control`` there when it starts; nvidia-cuda-mps-control(1), "FILES")
READY_COMMAND = ("test", "-e", f"{PIPE_MOUNT}/control")
#: label of a daemon's container and volumes: the GPU's UUID
DAEMON_LABEL = "gpuspawner.mps_daemon"
#: label of an MPS client's container (a server with a share under a managed daemon): the
#: GPU's UUID; the daemon stops when no container with it is left on the node
CLIENT_LABEL = "gpuspawner.mps_client"
#: label of an MPS client's container: the uid it runs as (MPS serves one uid at a time: a
#: server starting beside clients of another uid is told it will wait)
UID_LABEL = "gpuspawner.mps_uid"
#: capabilities asked of the NVIDIA container runtime for the daemon (its binaries come with
#: ``compute``; ``utility`` for nvidia-smi when an admin looks inside)
DAEMON_CAPABILITIES = [["gpu", "compute", "utility"]]


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", text).strip("-.").lower()


@dataclass(frozen=True)
class MpsDaemon:
    """One GPU's MPS control daemon on one node: what to create.

    Attributes:
        gpu: the GPU's UUID (``GPU-...``). name: the container's name.
        pipe_volume, log_volume: the names of its two Docker volumes.
        image: the daemon's image. command: its main process.
        env: its environment. labels: of the container and the volumes.
    """

    gpu: str
    name: str
    pipe_volume: str
    log_volume: str
    image: str
    command: Sequence[str] = DAEMON_COMMAND
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def create_kwargs(self) -> dict[str, Any]:
        """``APIClient.create_container``'s arguments, but ``host_config``: root (the control
        daemon starts each MPS server as its client's uid), ``command`` as the entrypoint
        (the image's own does not run)."""
        return {"image": self.image, "entrypoint": list(self.command[:1]),
                "command": list(self.command[1:]), "name": self.name, "user": "0:0",
                "environment": dict(self.env), "labels": dict(self.labels),
                "detach": True}

    def host_kwargs(self) -> dict[str, Any]:
        """``APIClient.create_host_config``'s arguments: the GPU by UUID (a device request of
        driver ``nvidia``), the two volumes, a shareable IPC namespace, no network, restarted
        by the engine unless stopped (a client's CUDA context needs its daemon)."""
        return {  # (docker-py makes a DeviceRequest of each dict)
            "device_requests": [{"driver": "nvidia", "device_ids": [self.gpu],
                                 "capabilities": DAEMON_CAPABILITIES}],
            "binds": {self.pipe_volume: {"bind": PIPE_MOUNT, "mode": "rw"},
                      self.log_volume: {"bind": LOG_MOUNT, "mode": "rw"}},
            "ipc_mode": "shareable",
            "network_mode": "none",
            "security_opt": ["no-new-privileges"],
            "restart_policy": {"Name": "unless-stopped"},
        }


def daemon_for(node: str, gpu: str, image: str, command: Sequence[str] = DAEMON_COMMAND,
               labels: Mapping[str, str] | None = None) -> MpsDaemon:
    """The daemon of GPU ``gpu`` on ``node`` (pure): named ``gpuspawner-mps-<node>-<uuid>``,
    its volumes ``<name>-pipe`` and ``<name>-log``, ``CUDA_MPS_PIPE_DIRECTORY`` and
    ``CUDA_MPS_LOG_DIRECTORY`` at their mounts, ``NVIDIA_DRIVER_CAPABILITIES`` compute and
    utility; ``labels`` (the hub's) plus :data:`DAEMON_LABEL`.

    Raises:
        ValueError: ``gpu`` or ``image`` is empty.
    """
    if not gpu or not image:
        raise ValueError("an MPS daemon needs a GPU UUID and an image")
    name = f"gpuspawner-mps-{_slug(node)}-{_slug(gpu)}"
    return MpsDaemon(
        gpu=gpu, name=name, pipe_volume=f"{name}-pipe", log_volume=f"{name}-log", image=image,
        command=tuple(command),
        env={"CUDA_MPS_PIPE_DIRECTORY": PIPE_MOUNT, "CUDA_MPS_LOG_DIRECTORY": LOG_MOUNT,
             "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
        labels={**(labels or {}), DAEMON_LABEL: gpu})


def client_host_config(host: Mapping[str, Any], daemon: MpsDaemon) -> dict[str, Any]:
    """A client's ``create_host_config`` arguments with the daemon's pipe volume at
    :data:`PIPE_MOUNT` (read-write: clients make their own pipes there) and the daemon's IPC
    namespace (pure).

    Raises:
        ValueError: ``host`` already mounts something at :data:`PIPE_MOUNT`, or sets an
            ``ipc_mode`` of its own.
    """
    binds = dict(host.get("binds") or {})
    if any(isinstance(v, Mapping) and v.get("bind") == PIPE_MOUNT for v in binds.values()):
        raise ValueError(f"{PIPE_MOUNT} is already mounted; the MPS pipe volume goes there")
    if host.get("ipc_mode") not in (None, "", "private"):
        raise ValueError(f"ipc_mode {host['ipc_mode']!r} is set; an MPS client joins its "
                         "daemon's IPC namespace")
    binds[daemon.pipe_volume] = {"bind": PIPE_MOUNT, "mode": "rw"}
    return {**host, "binds": binds, "ipc_mode": f"container:{daemon.name}"}
