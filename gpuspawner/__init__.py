"""gpuspawner: a GPU-aware JupyterHub spawner with a NUMA-aware placement module."""

__version__ = "0.1.0"
