"""Idle culler for JupyterHub with GPUs: culls servers by activity (hub last_activity, network
bytes/s), GPU utilisation (NVML or dcgm-exporter) and age, under per-user, per-group and global
policies, with warnings, a dry run, a web API and Prometheus metrics. See README.md."""

__version__ = "0.1.0"
