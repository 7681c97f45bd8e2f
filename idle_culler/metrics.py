"""Prometheus metrics of the culler (prometheus_client), in a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """``idle_culler_culls_total{reason, dry_run}``: servers culled (or, in a dry run, that
    would have been) by reason (``idle``, ``pressure_idle``, ``gpu_idle``, ``max_age``);
    ``idle_culler_passes_total{result}``: passes, ``complete`` or ``aborted``;
    ``idle_culler_pass_seconds``: pass duration (seconds);
    ``idle_culler_errors_total``: hub API failures after retries;
    ``idle_culler_warned_servers``: servers under a cull warning after the last pass."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.culls = Counter("idle_culler_culls", "Servers culled, by reason",
                             ["reason", "dry_run"], registry=self.registry)
        self.passes = Counter("idle_culler_passes", "Culling passes", ["result"],
                              registry=self.registry)
        self.pass_seconds = Histogram("idle_culler_pass_seconds", "Duration of a pass (s)",
                                      registry=self.registry,
                                      buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300))
        self.errors = Counter("idle_culler_errors", "Hub API failures after retries",
                              registry=self.registry)
        self.warned = Gauge("idle_culler_warned_servers",
                            "Servers under a cull warning after the last pass",
                            registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
