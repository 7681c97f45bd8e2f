"""Spawn progress for JupyterHub's progress API (``Spawner.progress``): the spawner and its
backend emit ``(percent, message)`` events while a server starts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from traitlets.config import LoggingConfigurable


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

