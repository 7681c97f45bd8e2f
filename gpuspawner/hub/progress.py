"""Spawn progress for JupyterHub's progress API (``Spawner.progress``): the spawner and its
backend emit ``(percent, message)`` events while a server starts."""

from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from tornado import web
from traitlets.config import LoggingConfigurable

from ..placement import GPU_MILLI, Allocation, Node
from ..placement.units import share_words
from .form import gpu_memory_text, plural, size_text


def _numbers(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


def placement_message(alloc: Allocation, node: Node | None = None, *,
                      show_node: bool = False) -> str:
    """Where a server was placed, in the words of the spawn form, for the progress page, e.g.
    ``"1 x A100 80 GB (GPU 3), 8 cores on NUMA node 1, 64 GiB memory"``; a share reads
    ``"¼ of a shared T4 16 GB (GPU 0), ..."``, MIG instances ``"1 x MIG 1g.10gb (A100 GPU 0),
    ..."``. ``node`` (the allocation's node) gives GPU models,
    memory and indices, and whether NUMA is worth naming (a node with one NUMA node: not);
    without it GPUs are counted only. ``show_node`` appends ``" on node <name>"`` (hubs with
    several nodes). A placement that spilt across NUMA nodes ends with the ledger's note."""
    parts = []
    if alloc.gpus:
        gpus = []
        for share in alloc.gpus:
            try:
                gpus.append(node.gpu(share.uuid) if node is not None else None)
            except KeyError:
                gpus.append(None)
        known = [g for g in gpus if g is not None]
        models = sorted({g.model for g in known if g.model})
        sizes = sorted({g.memory_bytes for g in known if g.memory_bytes})
        what = " ".join(x for x in ("/".join(models),
                                    "/".join(gpu_memory_text(m) for m in sizes)) if x)
        where = ""
        if known:
            label = "GPU" if len(known) == 1 else "GPUs"
            where = f" ({label} {_numbers([g.index for g in known])})"
        milli = alloc.gpus[0].milli
        if len(alloc.gpus) == 1 and milli < GPU_MILLI:
            share = share_words(milli)
            parts.append(f"{share} of a shared {what or 'GPU'}{where}")
        else:
            n = len(alloc.gpus)
            parts.append((f"{n} x {what}" if what else plural(n, "GPU")) + where)
    if alloc.mig:  # e.g. "2 x MIG 1g.10gb (A100 GPU 0)"
        profiles = sorted({m.profile for m in alloc.mig})
        on = []
        for gpu_uuid in dict.fromkeys(m.gpu for m in alloc.mig):
            try:
                g = node.gpu(gpu_uuid) if node is not None else None
            except KeyError:
                g = None
            if g is not None:
                on.append(f"{g.model} GPU {g.index}".strip())
        parts.append(f"{len(alloc.mig)} x MIG {'/'.join(profiles)}"
                     + (f" ({', '.join(on)})" if on else ""))
    cores = plural(len(alloc.cpuset), "core")
    if node is None or len(node.numa_nodes) > 1:
        mems = list(alloc.mems)
        if mems:
            cores += f" on NUMA {'node' if len(mems) == 1 else 'nodes'} {_numbers(mems)}"
    parts.append(cores)
    if alloc.memory_bytes:
        parts.append(f"{size_text(alloc.memory_bytes)} memory")
    if alloc.disk_bytes:
        parts.append(f"{size_text(alloc.disk_bytes)} disk")
    text = ", ".join(parts)
    if show_node:
        text += f" on node {alloc.node}"
    if alloc.note:
        text += f" ({alloc.note})"
    return text


def refusal(code: int, message: str, form_url: str, slug: str) -> web.HTTPError:
    """The HTTP error a refused spawn raises: ``message`` is the reason (the REST API's
    ``message`` and the form's error, as before); its HTML form (``jupyterhub_html_message``,
    see ``jupyterhub.utils.format_exception``), which the progress page and the "not running"
    page show instead, adds a link back to the spawn form at ``form_url`` with the same profile
    checked (``#profile=<slug>``, honoured by the form's script; the form itself also checks
    the last choice). No ``jupyterhub_message``: JupyterHub's form page prefers a text message
    to the HTML one, and its API would answer that instead of the reason."""
    e = web.HTTPError(code, message)
    href = f"{form_url}#profile={quote(slug, safe='')}"
    e.jupyterhub_html_message = (  # type: ignore[attr-defined]
        f'{html.escape(message)} <a href="{html.escape(href)}" class="gpus-back">'
        "Back to the form (same profile selected)</a>")
    return e


class ProgressEvents(LoggingConfigurable):
    """Collects events (:meth:`_emit`) and streams them (:meth:`progress`) until the spawn is
    over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict[str, Any]] = []
        self._event_signal = asyncio.Event()

    def _emit(self, progress: int, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._events.append({"progress": progress, "message": message})
        self._event_signal.set()

    def spawn_form_url(self) -> str:
        """This server's spawn form, e.g. ``/hub/spawn/ann/gpu`` (JupyterHub's
        ``SpawnHandler`` URL)."""
        from jupyterhub.utils import url_path_join

        s: Any = self
        base = getattr(getattr(s, "hub", None), "base_url", None) or "/hub/"
        user = getattr(s.user, "escaped_name", None) or quote(s.user.name, safe="")
        return url_path_join(base, "spawn", user, quote(s.name or "", safe=""))

    def refused(self, code: int, message: str, slug: str) -> web.HTTPError:
        """:func:`refusal` for this server's form."""
        return refusal(code, message, self.spawn_form_url(), slug)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Spawn progress events: placement, network, disk limit, launch (JupyterHub API)."""
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if not getattr(self, "_spawn_pending", False) or self.ready:
                break
            self._event_signal.clear()
            try:
                await asyncio.wait_for(self._event_signal.wait(), 1)
            except asyncio.TimeoutError:
                pass

