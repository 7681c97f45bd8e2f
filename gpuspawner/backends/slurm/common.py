"""What the parts of :class:`~gpuspawner.backends.slurm.backend.SlurmBackend` share: how a
failed Slurm command is told apart (controller down or a refusal), the job states that hold an
allocation, the configuration error, and the command client whose commands see a clean
environment."""

from __future__ import annotations

import os

from traitlets import TraitError

from .commands import SlurmClient, SlurmError

__all__ = ["DOWN", "HOLDING", "REFUSED", "CleanEnvClient", "SlurmConfigError", "controller_down"]

#: words in a Slurm command's stderr that mean the controller did not answer
DOWN = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
        "Zero Bytes were transmitted", "Communication connection failure",
        "Could not establish a configuration source", "Unable to process configuration")
#: sbatch refusals that mean "cannot run on this node as configured" (HTTP 400, not 500)
REFUSED = ("Requested node configuration is not available", "Invalid generic resource",
           "Requested partition configuration not available", "Invalid node name",
           "Memory required by task is not available", "More processors requested")
#: job states a server of ours may be in while it holds (or is about to hold) its allocation
HOLDING = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED"})


class SlurmConfigError(TraitError, ValueError):
    """A wrong ``c.SlurmBackend.*`` setting found at start (the message names it). A
    TraitError, so the hub's configuration check reports it under the backend's own name, not
    under ``GPUSpawner.nodes``."""


def controller_down(e: SlurmError) -> bool:
    """Whether a failed command means the controller (or the commands) cannot be reached, as
    opposed to a refusal: it timed out or did not start, or printed one of :data:`DOWN`."""
    return e.returncode is None or any(w in e.stderr for w in DOWN)


class CleanEnvClient(SlurmClient):
    """A :class:`SlurmClient` whose commands see only ``PATH`` and ``SLURM_CONF``: sbatch
    copies its environment into the job (``--export=ALL``), and the hub's (proxy token,
    cookie secret, database URL) must not reach a user's job."""

    def _env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
               "LANG": "C.UTF-8"}
        conf = self.conf or os.environ.get("SLURM_CONF", "")
        if conf:
            env["SLURM_CONF"] = conf
        return env
