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
        back when it ends (the executed notebook travels there, compressed), and most bytes
        of JSON its result may decompress to; a larger result stays in the user's home
        only.""").tag(config=True)
    max_kept_jobs_per_user = Int(1000, help="""Ended jobs the hub keeps per user (the newest,
        with their executed notebooks, logs and HTML exports); at each new submission the
        user's older ended jobs are deleted from the jobs database (their outputs stay in the
        user's home). It bounds the database any one user can fill.""").tag(config=True)
    max_kept_bytes_per_user = Int(256 * 2**20, help="""Bytes of ended jobs the hub keeps per
        user in the jobs database (their snapshots, executed notebooks, logs and HTML exports,
        compressed as stored): when a job ends and at each submission, the user's oldest
        ended jobs are deleted until the rest fit (the newest ended job is always kept; the
        outputs stay in the user's home). With ``max_kept_jobs_per_user`` it bounds the
        database any one user can fill, whatever their jobs print.""").tag(config=True)
    max_active_jobs_per_user = Int(20, help="""Jobs a user may have queued, waiting,
        starting or running at once; more are refused with HTTP 429.""").tag(config=True)
    poll_interval = Float(5.0, help="""Seconds between two looks at a running job (ended?
        over its time limit?).""").tag(config=True)
    lost_after = Float(60.0, help="""Seconds a running job's node may leave the hub's
        questions unanswered before the job counts as lost (it is then stopped where it can
        be, and released).""").tag(config=True)

    # -- the job runner: limits on concurrent jobs, retries, logs --------------------------
    max_active_jobs_per_group = Dict(help="""Per group: {group: jobs each of its members
        may have active (queued, waiting, starting, running) at once}; a user in several
        named groups gets the largest, 0 = no limit. Users in none of them get
        max_active_jobs_per_user. What the jobs hold counts in GPUSpawner.quotas with the
        servers (a group's quota there caps its members together).""").tag(config=True)
    default_max_retries = Int(3, help="""How often a lost job (its node failed, its
        container vanished or was killed from outside, its GPU drained as unhealthy) is run
        again on a healthy node when its submission names no max_retries (Kubernetes Job
        backoffLimit: retries after the first run; 0 = never). A failed notebook (a cell
        raised) is never retried.""").tag(config=True)
    max_retries_max = Int(10, help="Most max_retries a submission may ask for.").tag(
        config=True)
    queue_priority = Int(0, help="""Priority of notebook jobs in the wait queue they share
        with interactive servers (c.GPUSpawner.queue_priority is the servers'): every waiting
        request of a higher priority starts before any of a lower one; fairness (DRF) orders
        those of one priority. E.g. -1: interactive servers go first.""").tag(config=True)
    retry_backoff = Float(10.0, help="""Seconds before the first retry of a lost job; each
        further retry waits twice as long, at most 360 s (Kubernetes Job's back-off).
        """).tag(config=True)
    max_log_bytes = Int(4 * 2**20, help="""Most characters of a job attempt's log kept
        in the jobs database (the last ones; GET api/jobs/{id}/log, gpuspawner jobs logs).
        The whole log is job.log in the job's folder.""").tag(config=True)

    @validate("default_max_retries", "max_retries_max", "retry_backoff")
    def _runner_not_negative(self, proposal: Any) -> Any:
        if proposal.value < 0:
            raise TraitError(f"GPUJobs.{proposal.trait.name}: must be >= 0, got "
                             f"{proposal.value}")
        return proposal.value

    @validate("max_log_bytes")
    def _positive_log(self, proposal: Any) -> Any:
        if proposal.value < 1:
            raise TraitError(f"GPUJobs.max_log_bytes: must be > 0, got {proposal.value}")
        return proposal.value

    @validate("max_active_jobs_per_group")
    def _active_group_limits(self, proposal: Any) -> dict[str, Any]:
        for group, n in proposal.value.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise TraitError(f"GPUJobs.max_active_jobs_per_group.{group}: must be a "
                                 f"whole number >= 0 (0 = no limit), got {n!r}")
        return proposal.value

    def active_jobs_limit(self, groups: list[str] | tuple[str, ...]) -> tuple[int, str]:
        """(how many active jobs a member of ``groups`` may have, 0 = no limit; the setting
        that says so): the largest of ``max_active_jobs_per_group`` over the named groups
        (0 wins), else ``max_active_jobs_per_user``."""
        named = {g: int(self.max_active_jobs_per_group[g]) for g in groups
                 if g in self.max_active_jobs_per_group}
        if not named:
            return int(self.max_active_jobs_per_user), "GPUJobs.max_active_jobs_per_user"
        group = max(named, key=lambda g: (named[g] == 0, named[g]))
        return named[group], f'GPUJobs.max_active_jobs_per_group["{group}"]'

    @validate("time_limit_default", "time_limit_max", "poll_interval", "lost_after",
              "max_notebook_bytes",
              "max_parameters_bytes", "max_output_bytes", "max_active_jobs_per_user",
              "max_kept_jobs_per_user", "max_kept_bytes_per_user")
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

    # -- job definitions (a notebook on a cron schedule) -----------------------------------
    max_definitions_per_user = Int(20, help="""Job definitions (notebooks on a schedule) a
        user may have; more are refused with HTTP 429. 0 = no limit. A group's own number
        in max_definitions_per_group wins.""").tag(config=True)
    max_definitions_per_group = Dict(help="""Per group: {group: number of job definitions
        each of its members may have}; a user in several named groups gets the largest,
        0 = no limit. Users in none of them get max_definitions_per_user.""").tag(
        config=True)
    schedule_interval = Float(30.0, help="""Most seconds the scheduler of job definitions
        sleeps between two looks; it wakes at the earliest next tick anyway, and when a
        definition is made or changed.""").tag(config=True)
    cron_seconds = Bool(False, help="""Accept a sixth cron field, seconds, last (croniter's
        order: ``* * * * * */30`` is every 30 seconds). Off: 5 fields, minute resolution, as
        in cron and Kubernetes CronJobs.""").tag(config=True)

    @validate("max_definitions_per_user")
    def _not_negative(self, proposal: Any) -> Any:
        if proposal.value < 0:
            raise TraitError(f"GPUJobs.{proposal.trait.name}: must be >= 0 (0 = no limit), "
                             f"got {proposal.value}")
        return proposal.value

    @validate("schedule_interval")
    def _positive_interval(self, proposal: Any) -> Any:
        if not proposal.value > 0:
            raise TraitError(f"GPUJobs.schedule_interval: must be > 0, got {proposal.value}")
        return proposal.value

    @validate("max_definitions_per_group")
    def _group_limits(self, proposal: Any) -> dict[str, Any]:
        for group, n in proposal.value.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise TraitError(f"GPUJobs.max_definitions_per_group.{group}: must be a "
                                 f"whole number >= 0 (0 = no limit), got {n!r}")
        return proposal.value

    def definition_limit(self, groups: list[str] | tuple[str, ...]) -> int:
        """How many job definitions a member of ``groups`` may have (0 = no limit): the
        largest of ``max_definitions_per_group`` over the named groups (0 wins: no limit),
        else ``max_definitions_per_user``."""
        named = [int(self.max_definitions_per_group[g]) for g in groups
                 if g in self.max_definitions_per_group]
        if not named:
            return int(self.max_definitions_per_user)
        return 0 if 0 in named else max(named)


#: the GPUSpawner traits a job reads
SPAWNER_TRAITS = ("nodes", "placement_policy", "quotas", "profiles", "backend", "image",
                  "home_path_template", "home_mount_point", "uid_map", "default_uid",
                  "default_gid", "state_dir", "volumes", "group_volumes",
                  "image_deny_patterns", "allowed_registries", "image_check_timeout",
                  "image_max_bytes")


def spawner_values(app: Any, names: tuple[str, ...] = SPAWNER_TRAITS) -> dict[str, Any]:
    """The hub spawner class's trait values a job reads (``names``,
    :func:`gpuspawner.hub.settings.spawner_values`)."""
    return hub_spawner_values(app, names)
