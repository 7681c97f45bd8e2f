"""gpuspawner.singleuser.gpuviews: a jupyter_server extension with this session's GPUs and
their usage.

``GET /api/gpuspawner/gpus`` and ``GET /api/gpuspawner/metrics`` (see docs/gpu-views.md),
answered from one background sampler thread (:mod:`.sampler`) shared by every client.

Settings (``GPUViews`` in the server's config, defaults from the environment):
``nvml`` (``module:attr`` of an NVML replacement, ``$GPUSPAWNER_NVML_FACTORY``),
``interval`` (1 s, ``$GPUSPAWNER_SAMPLE_INTERVAL``), ``standby_after`` (30 s,
``$GPUSPAWNER_STANDBY_AFTER``), ``history_seconds`` (300), ``culler_url``
(``$GPUSPAWNER_CULLER_URL``).
"""

from __future__ import annotations

import os
from typing import Any

from .sampler import Sampler, load_nvml


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpuspawner.singleuser.gpuviews"}]


def _settings(server_app: Any) -> dict[str, Any]:
    cfg = server_app.config.get("GPUViews", {})
    env = os.environ
    return {
        "nvml": cfg.get("nvml", env.get("GPUSPAWNER_NVML_FACTORY", "")),
        "interval": float(cfg.get("interval", env.get("GPUSPAWNER_SAMPLE_INTERVAL", 1.0))),
        "standby_after": float(cfg.get("standby_after",
                                       env.get("GPUSPAWNER_STANDBY_AFTER", 30.0))),
        "history_seconds": float(cfg.get("history_seconds", 300.0)),
        "culler_url": cfg.get("culler_url", env.get("GPUSPAWNER_CULLER_URL")),
    }


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .handlers import (
        CullerStatus,
        OwnUsage,
        ShareNotices,
        kernel_pid_resolver,
        setup_handlers,
    )

    s = _settings(server_app)
    nvml = None
    if s["nvml"]:
        nvml = load_nvml(s["nvml"])
    sampler = Sampler(nvml, interval=s["interval"], standby_after=s["standby_after"],
                      history_seconds=s["history_seconds"],
                      pid_resolver=kernel_pid_resolver(server_app.kernel_manager)).start()
    web_app = server_app.web_app
    web_app.settings["gpuspawner_sampler"] = sampler
    web_app.settings["gpuspawner_culler"] = CullerStatus(s["culler_url"])
    web_app.settings["gpuspawner_share_notices"] = ShareNotices()
    web_app.settings["gpuspawner_own_usage"] = OwnUsage()
    setup_handlers(web_app, web_app.settings["base_url"])
    server_app.log.info("gpuspawner.singleuser.gpuviews: /api/gpuspawner/{gpus,metrics} "
                        "(sampler every "
                        "%.1fs, standby after %.0fs)", s["interval"], s["standby_after"])


def _unload_jupyter_server_extension(server_app: Any) -> None:
    """Stop the sampler (called by jupyter_server versions that unload extensions; the thread
    is a daemon otherwise)."""
    sampler = server_app.web_app.settings.pop("gpuspawner_sampler", None)
    if sampler is not None:
        sampler.stop()


# the names jupyter_server looks up, also without the underscore
load_jupyter_server_extension = _load_jupyter_server_extension
