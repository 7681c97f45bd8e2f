"""The settings of notebook jobs (``c.GPUJobs.*`` in ``jupyterhub_config.py``) and the
GPUSpawner settings a job shares with servers (profiles, image, uid/gid, home, state folder),
read from the hub's configuration the way traitlets resolves them for the spawner class."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ...jobs.model import Limits
from ..settings import spawner_values as hub_spawner_values

#: the jobs database's file in the state folder (GPUSpawner.state_dir)
JOBS_DB_FILE = "gpuspawner-jobs.sqlite"


class GPUJobs(LoggingConfigurable):
    """Notebook jobs through the hub's one cluster (docs/jobs.md)."""

    enabled = Bool(True, help="""Offer notebook jobs (api/jobs of the gpuspawner service,
        `gpuspawner jobs`). Jobs run through GPUSpawner's backend; only the Docker backend
        runs them so far.""").tag(config=True)
    db_url = Unicode("", help="""SQLAlchemy URL of the jobs database. Empty = SQLite,
        gpuspawner-jobs.sqlite in GPUSpawner.state_dir (made mode 0600). A PostgreSQL URL
        works where its driver is installed.""").tag(config=True)
    time_limit_default = Int(3600, help="""Seconds a job may run when its submission names
        no time_limit (and its profile has no default in profile_time_limits).""").tag(
        config=True)
    time_limit_max = Int(24 * 3600, help="""Most seconds a job may ask for (a profile's
        own maximum in profile_time_limits wins).""").tag(config=True)
    profile_time_limits = Dict(help="""Per profile: {slug: {"default": seconds, "max":
        seconds}}; either key may be left out (then time_limit_default / time_limit_max).
        """).tag(config=True)
    max_notebook_bytes = Int(2 * 2**20, help="""Largest notebook a submission may carry (its
        JSON, bytes). Outputs are dropped from the snapshot; the rest travels to the job
        compressed, at most 1 MiB.""").tag(config=True)
    max_parameters_bytes = Int(16 * 2**10, help="Largest parameters (JSON, bytes).").tag(
        config=True)
    max_output_bytes = Int(64 * 2**20, help="""Most bytes of a job's standard output read
        back when it ends (the executed notebook travels there, compressed); a larger result
        stays in the user's home only.""").tag(config=True)
    max_active_jobs_per_user = Int(20, help="""Jobs a user may have queued, waiting,
        starting or running at once; more are refused with HTTP 429.""").tag(config=True)
    poll_interval = Float(5.0, help="""Seconds between two looks at a running job (ended?
        over its time limit?).""").tag(config=True)
    lost_after = Float(60.0, help="""Seconds a running job's node may leave the hub's
        questions unanswered before the job counts as lost (it is then stopped where it can
        be, and released).""").tag(config=True)

    @validate("time_limit_default", "time_limit_max", "poll_interval", "lost_after",
              "max_notebook_bytes",
              "max_parameters_bytes", "max_output_bytes", "max_active_jobs_per_user")
    def _positive(self, proposal: Any) -> Any:
        if not proposal.value > 0:
            raise TraitError(f"GPUJobs.{proposal.trait.name}: must be > 0, got "
                             f"{proposal.value}")
        return proposal.value

    @validate("profile_time_limits")
    def _profile_limits(self, proposal: Any) -> dict[str, Any]:
        for slug, entry in proposal.value.items():
            if not isinstance(entry, dict) or set(entry) - {"default", "max"}:
                raise TraitError(f"GPUJobs.profile_time_limits.{slug}: must be "
                                 '{"default": seconds, "max": seconds}')
            for key, v in entry.items():
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise TraitError(f"GPUJobs.profile_time_limits.{slug}.{key}: must be a "
                                     f"whole number of seconds >= 1, got {v!r}")
        return proposal.value

    @property
    def limits(self) -> Limits:
        return Limits(max_notebook_bytes=self.max_notebook_bytes,
                      max_parameters_bytes=self.max_parameters_bytes)

    def time_limits(self, profile: str) -> tuple[int, int]:
        """(default, maximum) seconds for jobs of ``profile``."""
        entry = self.profile_time_limits.get(profile) or {}
        maximum = int(entry.get("max", self.time_limit_max))
        return min(int(entry.get("default", self.time_limit_default)), maximum), maximum


#: the GPUSpawner traits a job reads
SPAWNER_TRAITS = ("nodes", "placement_policy", "quotas", "profiles", "backend", "image",
                  "home_path_template", "home_mount_point", "uid_map", "default_uid",
                  "default_gid", "state_dir")


def spawner_values(app: Any, names: tuple[str, ...] = SPAWNER_TRAITS) -> dict[str, Any]:
    """The hub spawner class's trait values a job reads (``names``,
    :func:`gpuspawner.hub.settings.spawner_values`)."""
    return hub_spawner_values(app, names)
