"""gpuspawner: a GPU-aware JupyterHub spawner with a NUMA-aware placement module.

``gpuspawner.GPUSpawner`` is imported lazily so that the placement module and the CLI work
without JupyterHub installed.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["GPUSpawner", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "GPUSpawner":
        from .hub.spawner import GPUSpawner

        return GPUSpawner
    raise AttributeError(f"module 'gpuspawner' has no attribute {name!r}")
