"""The spawn form: one card per profile with live availability, quota and group permission,
rendered with Jinja2 (``templates/profiles.html.j2``, overridable through
``GPUSpawner.additional_template_paths``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, select_autoescape
from tornado import web
from traitlets import List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..placement import GPU_MILLI, Ledger
from .profiles import OptionsError, Profile, ProfileConfigError, choose_profile, load_profiles
from .user_options import pending_refusal


def profile_cards(profiles: Sequence[Profile], ledger: Ledger, user: str,
                  groups: Iterable[str], queued: Mapping[str, int] | None = None
                  ) -> list[dict[str, Any]]:
    """What the form shows per profile: availability now, quota, group permission and the
    queue.

    Args:
        queued: profile slug -> spawns waiting for it in the queue.

    Returns:
        one dict per profile: slug, display_name, description, bundle (text), default,
        available (bool), reason (why not), availability ("3 of 8 A100 free now" or ""),
        queue (bool: a spawn of it waits when its GPUs are busy), queued (int: spawns
        waiting for it), waits (bool: a spawn now would wait in the queue).
    """
    queued = queued or {}
    groups = list(groups)
    left = ledger.quota_remaining(user, groups)
    cards = []
    for p in profiles:
        b = p.bundle
        card: dict[str, Any] = {"slug": p.slug, "display_name": p.display_name,
                                "description": p.description, "bundle": b.describe(),
                                "default": p.default, "available": True, "reason": "",
                                "availability": "", "queue": p.queue,
                                "queued": int(queued.get(p.slug, 0)), "waits": False}
        if b.total_gpu_milli:
            free, total = ledger.free_gpus(b.gpu_models, p.nodes)
            models = "/".join(b.gpu_models) or "GPU"
            card["availability"] = f"{free} of {total} {models} free now"
            need = b.gpus or 1
            if total == 0:
                card.update(available=False, reason=f"no {models} on this hub")
            elif b.gpus and free < need and p.queue:
                card.update(waits=True, reason=f"all {models} busy now: you will wait in the "
                                                "queue")
            elif b.gpus and free < need:
                card.update(available=False, reason=f"only {free} {models} free now")
        if not p.allowed_for(groups):
            card.update(available=False, reason="not available to your group")
        else:
            for key, need in (("gpu_milli", b.total_gpu_milli), ("cores", b.cores),
                              ("memory_bytes", b.memory_bytes), ("disk_bytes", b.disk_bytes),
                              ("servers", 1)):
                if left.get(key) is not None and need > left[key]:
                    card.update(available=False, reason=f"over your quota ({key})")
                    break
        cards.append(card)
    return cards


def quota_line(ledger: Ledger, user: str, groups: Iterable[str]) -> str:
    """"you use 1 of your 2 GPUs" when the user has a GPU quota, else ""."""
    usage = ledger.usage(user)
    left = ledger.quota_remaining(user, groups)
    if left.get("gpu_milli") is None:
        return ""
    total = (usage.gpu_milli + left["gpu_milli"]) / GPU_MILLI
    return f"you use {usage.gpu_milli / GPU_MILLI:g} of your {total:g} GPUs"


def render_form(template_name: str, extra_paths: Sequence[str], **context: Any) -> str:
    """Render ``template_name``, looked up in ``extra_paths`` first, then in the package."""
    loaders: list[Any] = [FileSystemLoader(p) for p in extra_paths]
    loaders.append(PackageLoader("gpuspawner.hub", "templates"))
    env = Environment(loader=ChoiceLoader(loaders), autoescape=select_autoescape(["html", "j2"]))
    return env.get_template(template_name).render(**context)


class OptionsFormMixin(LoggingConfigurable):
    """The spawn form of :class:`~gpuspawner.hub.spawner.GPUSpawner`: profile cards with live
    availability, ``options_from_form`` and an early ``apply_user_options`` check. Expects the
    spawner's ``profiles``, ``cluster``, ``user``, ``group_names``, ``chosen_profile`` and
    ``raise_options_refusal``."""

    profile_form_template = Unicode(
        "profiles.html.j2",
        help="Jinja2 template name of the spawn form (see additional_template_paths).",
    ).tag(config=True)

    additional_template_paths = List(
        Unicode(),
        help="Directories searched before the built-in templates (override the form).",
    ).tag(config=True)

    @default("options_form")
    def _default_options_form(self) -> str:
        return ""  # get_options_form renders the profile cards

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        def apply_user_options(spawner: Any, user_options: dict[str, Any]) -> None:
            """Validate early (JupyterHub runs this before start and answers 400 for an
            HTTPError); start() checks again against the current configuration. A refusal
            the user_options guard recorded before storage is raised here."""
            spawner.raise_options_refusal()
            spawner.chosen_profile()
        return apply_user_options

    @default("options_from_form")
    def _default_options_from_form(self) -> Any:
        def options_from_form(formdata: dict[str, list[str]]) -> dict[str, Any]:
            values = formdata.get("profile") or []
            out: dict[str, Any] = {"profile": values[0]} if values else {}
            if (formdata.get("fail_now") or [""])[0] in ("on", "true", "1"):
                out["queue"] = False
            return out
        return options_from_form

    @property
    def group_names(self) -> list[str]:
        """Names of the user's JupyterHub groups."""
        return sorted(g.name for g in getattr(getattr(self, "user", None), "groups", []) or [])

    def raise_options_refusal(self) -> None:
        """Raise the HTTP 400 recorded when refused ``user_options`` were kept out of the
        database (gpuspawner.hub.user_options) or out of this spawner."""
        refused = pending_refusal(getattr(self, "orm_spawner", None)) or self._options_refusal
        self._options_refusal = None
        if refused is not None:
            raise refused

    def chosen_profile(self) -> Profile:
        """The profile ``user_options`` ask for. Raises web.HTTPError 400 (bad options, the
        field named) or 500 (bad profile configuration)."""
        try:
            return choose_profile(self.user_options, self.load_profile_list(), self.group_names)
        except ProfileConfigError as e:
            raise web.HTTPError(500, f"profile configuration: {e}") from None
        except OptionsError as e:
            raise web.HTTPError(400, str(e)) from None

    def load_profile_list(self) -> list[Profile]:
        """The validated profiles. Raises ProfileConfigError for bad configuration."""
        return load_profiles(self.profiles)  # type: ignore[attr-defined]

    def profile_cards(self) -> list[dict[str, Any]]:
        """The form's cards for this user (:func:`profile_cards`)."""
        cluster = self.cluster  # type: ignore[attr-defined]
        queued = cluster.queue.wq.count_by_profile() if cluster.queue is not None else {}
        return profile_cards(self.load_profile_list(), cluster.ledger,
                             self.user.name, self.group_names,  # type: ignore[attr-defined]
                             queued)

    async def get_options_form(self) -> str:
        """The spawn form: profile cards with live availability (Jinja2 template), unless the
        admin configured ``options_form`` themselves."""
        if self.options_form:  # type: ignore[attr-defined]
            return await super().get_options_form()  # type: ignore[misc]
        s: Any = self
        await s.cluster.ensure_restored(s._owner_exists)
        return render_form(self.profile_form_template, self.additional_template_paths,
                           cards=self.profile_cards(), spawner=self,
                           quota_text=quota_line(s.cluster.ledger, s.user.name,
                                                 s.group_names))
