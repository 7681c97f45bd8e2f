"""``GET api/profiles``: the profiles the caller may use (for servers and notebook jobs), so a
client can offer them, e.g. as the environments of jupyter-scheduler's JupyterLab UI
(:mod:`gpuspawner.singleuser.scheduler`).

A profile is listed when :meth:`~gpuspawner.hub.profiles.Profile.allowed_for` the caller's
groups (the rule :func:`~gpuspawner.hub.profiles.choose_profile` applies to a spawn or a job
submission); admins are not exempt there, so they are not here either.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from ..profiles import Profile, ProfileConfigError, load_profiles
from ..settings import spawner_values
from ..spawner import GPUSpawner
from .app import _Base, _hub_app


def profile_view(profile: Profile, time_limits: tuple[int, int] | None) -> dict[str, Any]:
    """One profile as ``api/profiles`` answers it: ``slug``, ``display_name``,
    ``description``, ``default``, ``summary`` (the bundle for people, e.g. ``"1 x A100, 8 cores,
    32.0 GiB"``), the bundle's ``cores``, ``memory`` (bytes), ``gpus``, ``gpu_milli``,
    ``mig``, ``mig_count``, ``gpu_models``, and ``time_limit`` (``{"default": s, "max": s}`` of
    notebook jobs, or None when jobs are not running on this hub), ``images`` (the profile's
    ``profile_options.image`` choices: ``key``, ``display_name``, ``image``, ``default``; a
    job's ``image`` names a key) and ``own_image`` (its ``unlisted_choice`` is enabled: a
    job's ``image--unlisted-choice`` may name an image of the user's own)."""
    b = profile.bundle
    option = profile.image_option
    return {
        "slug": profile.slug, "display_name": profile.display_name,
        "description": profile.description, "default": profile.default,
        "summary": b.describe(), "cores": b.cores, "memory": b.memory_bytes, "gpus": b.gpus,
        "gpu_milli": b.gpu_milli, "mig": b.mig or None, "mig_count": b.mig_count if b.mig else 0,
        "gpu_models": list(b.gpu_models),
        "time_limit": ({"default": time_limits[0], "max": time_limits[1]}
                       if time_limits else None),
        "images": [{"key": c.key, "display_name": c.display_name, "image": c.image,
                    "default": c is option.default_choice()}
                   for c in option.choices] if option else [],
        "own_image": bool(option and option.unlisted),
    }


class ProfilesHandler(_Base):
    """``GET api/profiles``: ``{"profiles": [...]}`` (:func:`profile_view`), in configuration
    order, only those the caller's groups may use. 503 when the hub does not use GPUSpawner
    or its profiles do not load."""

    def _profiles(self) -> tuple[list[Profile], Any]:
        """The profiles and the time limits of jobs: the jobs runner's (what a submission is
        checked against) when it runs, else the hub's configuration."""
        runner = getattr(getattr(self.service, "jobs", None), "runner", None)
        if runner is not None:
            return runner.profiles(), runner.settings.time_limits
        app = _hub_app()
        cls = app.spawner_class
        if not (isinstance(cls, type) and issubclass(cls, GPUSpawner)):
            raise web.HTTPError(503, f"the hub's spawner_class is {cls!r}, not a GPUSpawner")
        try:
            return load_profiles(spawner_values(app, ("profiles",))["profiles"]), None
        except ProfileConfigError as e:
            raise web.HTTPError(503, f"the hub's profiles do not load: {e}") from None

    async def get(self) -> None:
        user = self.require_user()
        if user.get("groups") is not None:
            groups = list(user["groups"])
        else:
            info = self.service.user_lookup(user["name"])
            groups = info[1] if info else []
        profiles, limits = self._profiles()
        self.write_json({"profiles": [profile_view(p, limits(p.slug) if limits else None)
                                      for p in profiles if p.allowed_for(groups)]})


def profile_routes(prefix: str, kw: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The route of ``api/profiles`` under ``prefix`` (given to
    :class:`~gpuspawner.hub.service.app.GPUService` as one of its ``extra_routes``)."""
    return [(prefix + "api/profiles", ProfilesHandler, kw)]


__all__ = ["ProfilesHandler", "profile_routes", "profile_view"]
