"""PyTorch holds itself to the server's GPU share (the PyTorch image, ``images/pytorch``).

A server with a GPU share gets ``GPUSPAWNER_GPU_MEMORY_LIMIT`` (bytes, its share of the GPU's
memory) from :func:`gpuspawner.gpushare.mechanism.share_limits`. In the PyTorch image every
IPython kernel loads this module as an extension (``/opt/venv/etc/ipython/
ipython_kernel_config.py``); it then makes PyTorch's caching allocator refuse allocations past
the share with ``torch.cuda.set_per_process_memory_fraction(limit / total)`` (PyTorch's docs,
"torch.cuda.set_per_process_memory_fraction": past the fraction an allocation raises
``torch.OutOfMemoryError``), on every visible device (a share's server sees one GPU).

Lazily, so that a kernel that never uses torch pays nothing:

* loading the extension imports no torch; it puts a one-shot finder on ``sys.meta_path`` that
  notices the first ``import torch`` (or, when torch is already imported, goes straight on);
* after torch is imported, the fraction is queued with ``torch.cuda._lazy_call``, which runs it
  when CUDA is first initialised (the first tensor on the GPU) and at once when CUDA is already
  initialised; the same private hook ``torch.cuda.manual_seed`` uses. Importing torch therefore
  creates no CUDA context, and a machine without CUDA never runs it.

Without the variable (a whole-GPU or CPU server) nothing is set. The fraction is a limit of
PyTorch's allocator only: memory taken by other libraries in the same process (the CUDA
context itself, cuDNN workspaces outside the allocator, other frameworks) is not counted; the
node's mechanism (docs/gpu-sharing.md) is what holds those.

Scripts (``python train.py``) can do the same with ``import gpuspawner.singleuser.torchshare as
t; t.install()`` before importing torch. ``gpuspawner-torch-check`` (:func:`check_main`) says
whether torch sees a GPU and what limit it runs under.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "ENV_LIMIT",
    "check_main",
    "install",
    "load_ipython_extension",
    "memory_fraction",
    "on_torch_imported",
    "applied",
]

#: the share's memory limit in bytes (gpuspawner.gpushare.mechanism.share_limits)
ENV_LIMIT = "GPUSPAWNER_GPU_MEMORY_LIMIT"
GiB = 1024**3

#: device index -> the fraction set on it (what this process did; for tests and the check)
applied: dict[int, float] = {}


def memory_fraction(limit_bytes: int, total_bytes: int) -> float:
    """The fraction of a device's memory that ``limit_bytes`` is, in (0, 1].

    Args:
        limit_bytes: the share's memory limit, bytes (> 0).
        total_bytes: the device's total memory as torch reports it, bytes (> 0).

    Returns:
        ``limit_bytes / total_bytes``, capped at 1.0 (a limit above the device's memory means
        the whole device).

    Raises:
        ValueError: when either is not positive.
    """
    if limit_bytes <= 0 or total_bytes <= 0:
        raise ValueError(f"limit and total must be > 0 bytes, got {limit_bytes}, {total_bytes}")
    return min(1.0, limit_bytes / total_bytes)


def _limit_from(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(ENV_LIMIT, "").strip()
    if not raw:
        return None
    try:
        limit = int(raw)
    except ValueError:
        print(f"gpuspawner: {ENV_LIMIT}={raw!r} is not a number of bytes; no GPU memory "
              "fraction set", file=sys.stderr)
        return None
    return limit if limit > 0 else None


def _apply(torch: Any, limit: int) -> None:
    """Set the fraction on every visible device (called by torch when CUDA initialises)."""
    for dev in range(torch.cuda.device_count()):
        total = int(torch.cuda.get_device_properties(dev).total_memory)
        frac = memory_fraction(limit, total)
        torch.cuda.set_per_process_memory_fraction(frac, dev)
        applied[dev] = frac


def on_torch_imported(torch: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Queue the share's memory fraction for when CUDA initialises in this process.

    Args:
        torch: the imported ``torch`` module (anything with ``torch.cuda._lazy_call`` and the
            ``torch.cuda`` functions named in the module docstring).
        environ: the environment to read ``GPUSPAWNER_GPU_MEMORY_LIMIT`` from (default
            ``os.environ``).

    Returns:
        True when a limit was queued (or applied, CUDA being initialised already), False when
        the environment names no limit or this torch has no CUDA hooks. Never initialises CUDA.
    """
    limit = _limit_from(os.environ if environ is None else environ)
    if limit is None:
        return False
    cuda = getattr(torch, "cuda", None)
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None:
        return False
    lazy_call(lambda: _apply(torch, limit))
    return True


class _TorchFinder(importlib.abc.MetaPathFinder):
    """One-shot: finds ``torch`` through the other finders and runs
    :func:`on_torch_imported` once its module has executed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        _remove_finder()
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            try:
                on_torch_imported(module)
            except Exception as e:  # noqa: BLE001 - never break the user's import
                print(f"gpuspawner: GPU memory fraction not set: {e}", file=sys.stderr)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchFinder)]


def install(environ: Mapping[str, str] | None = None) -> str:
    """Make torch hold itself to the share in this process, lazily (module docstring).

    Returns:
        ``"no limit"`` (no ``GPUSPAWNER_GPU_MEMORY_LIMIT``: nothing done), ``"queued"`` (torch
        was imported already), or ``"waiting for import torch"``.
    """
    env = os.environ if environ is None else environ
    if _limit_from(env) is None:
        return "no limit"
    torch = sys.modules.get("torch")
    if torch is not None:
        on_torch_imported(torch, env)
        return "queued"
    _remove_finder()
    sys.meta_path.insert(0, _TorchFinder())
    return "waiting for import torch"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuspawner.singleuser.torchshare`` (the PyTorch image loads it in every
    kernel): :func:`install`."""
    install()


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the import hook (a fraction already set stays set)."""
    _remove_finder()


def check_main(argv: Sequence[str] | None = None) -> int:
    """``gpuspawner-torch-check``: import torch, say what it sees, multiply on the GPU if any.

    Prints one line per fact. Exit codes: 0 torch runs on a CUDA device; 2 no CUDA device
    visible (the message says why it may be so); 1 torch fails to import or the GPU
    computation fails.
    """
    install()
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"torch does not import: {e}")
        return 1
    cuda_build = torch.version.cuda or "none (CPU build)"
    print(f"torch {torch.__version__} imports (CUDA build: {cuda_build})")
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", os.environ.get("NVIDIA_VISIBLE_DEVICES"))
        devs = sorted(p for p in os.listdir("/dev") if p.startswith("nvidia")) \
            if os.path.isdir("/dev") else []
        print("no CUDA device visible: torch.cuda.is_available() is False "
              f"(NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES={visible!r}, "
              f"/dev/nvidia*: {', '.join(devs) or 'none'}); this server has no GPU: "
              "start it with a GPU profile")
        return 2
    try:
        props = torch.cuda.get_device_properties(0)
        a = torch.randn(1024, 1024, device="cuda")
        s = float((a @ a).sum().item())
    except Exception as e:  # noqa: BLE001
        print(f"CUDA device visible but the computation failed: {e}")
        return 1
    print(f"CUDA devices: {torch.cuda.device_count()}; device 0: {props.name}, "
          f"{props.total_memory / GiB:.1f} GiB; 1024x1024 matmul ok (sum {s:.3g})")
    limit = _limit_from(os.environ)
    if limit is None:
        print("no GPU memory limit (a whole GPU, or no share)")
    else:
        print(f"GPU memory limit {limit / GiB:.2f} GiB: per-process memory fraction "
              + ", ".join(f"device {d}: {f:.3f}" for d, f in sorted(applied.items())))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(check_main(sys.argv[1:]))
