"""The spawn form: one card per profile with live availability, quota and group permission,
rendered with Jinja2 (``templates/profiles.html.j2``, overridable through
``GPUSpawner.additional_template_paths``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, select_autoescape

from ..placement import GPU_MILLI, Ledger
from .profiles import Profile


def profile_cards(profiles: Sequence[Profile], ledger: Ledger, user: str,
                  groups: Iterable[str]) -> list[dict[str, Any]]:
    """What the form shows per profile: availability now, quota and group permission.

    Returns:
        one dict per profile: slug, display_name, description, bundle (text), default,
        available (bool), reason (why not), availability ("3 of 8 A100 free now" or "").
    """
    groups = list(groups)
    left = ledger.quota_remaining(user, groups)
    cards = []
    for p in profiles:
        b = p.bundle
        card: dict[str, Any] = {"slug": p.slug, "display_name": p.display_name,
                                "description": p.description, "bundle": b.describe(),
                                "default": p.default, "available": True, "reason": "",
                                "availability": ""}
        if b.total_gpu_milli:
            free, total = ledger.free_gpus(b.gpu_models)
            models = "/".join(b.gpu_models) or "GPU"
            card["availability"] = f"{free} of {total} {models} free now"
            need = b.gpus or 1
            if total == 0:
                card.update(available=False, reason=f"no {models} on this hub")
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
