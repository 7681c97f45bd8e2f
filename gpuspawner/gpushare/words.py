"""What a GPU share gives, in one sentence for users: the spawn form's profile cards
(:func:`gpuspawner.hub.form.profile_cards`), the JupyterLab GPU panel (the single-user server's
``GET /api/gpuspawner/gpus``, ``share``) and docs/gpu-sharing.md say the same words, e.g.::

    1/4 of an A100 80GB: 20 GiB of GPU memory, compute time shared; held by the kernel
    (a GPU memory limit per server)

The standard library only: the single-user side imports it and must not import placement or the
hub (``pyproject.toml``, contract "the single-user side knows nothing of the hub").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["MECHANISM_WORDS", "fraction_words", "share_text"]

#: milli-GPU per GPU (``gpuspawner.placement.model.GPU_MILLI``, repeated: this module is a leaf)
GPU_MILLI = 1000

#: how each mechanism holds a share (``gpuspawner.gpushare.mechanism.MECHANISMS``)
MECHANISM_WORDS = {
    "dmem": "held by the kernel (a GPU memory limit per server, cgroup dmem)",
    "mps": "held by NVIDIA MPS (a GPU memory limit and a share of the GPU's SMs per server)",
    "watchdog": "watched: over its GPU memory for long, a notebook is warned and then its "
                "kernel is interrupted",
}

_FRACTIONS = {500: "1/2", 250: "1/4", 750: "3/4", 125: "1/8", 200: "1/5", 100: "1/10"}


def fraction_words(milli: int) -> str:
    """A share of one GPU in words: ``"1/4"`` for 250 milli-GPU, ``"1/3"`` for 333 or 334,
    else the decimal fraction (``"0.15"``).

    Raises:
        ValueError: ``milli`` is not in 1..999 (a share is less than one GPU).
    """
    if not 0 < milli < GPU_MILLI:
        raise ValueError(f"a GPU share is 1..999 milli-GPU, got {milli!r}")
    if milli in _FRACTIONS:
        return _FRACTIONS[milli]
    if milli in (333, 334):
        return "1/3"
    return f"{milli / GPU_MILLI:g}"


def _article(model: str) -> str:
    """"an" before a vowel sound: "an A100", "an H100", "an L4", "an RTX 6000"; "a" before
    "V100", "T4", "GPU"."""
    if not model:
        return "a"
    first = model[0].upper()
    spelled = len(model) == 1 or not model[1].islower()  # a letter read by its name
    if first in "AEIOU" or (spelled and first in "FHLMNRSX"):
        return "an"
    return "a"


def _gib(n: int) -> str:
    """Bytes in GiB, one decimal where needed: ``"20 GiB"``, ``"2.5 GiB"``; under 1 GiB in
    MiB."""
    if n < 2**30:
        return f"{n // 2**20} MiB"
    return f"{round(n / 2**30, 1):g} GiB"


def share_text(milli: int, share_memory_bytes: Sequence[int], model: str = "",
               mechanisms: Mapping[str, str] | Sequence[str] = ()) -> str:
    """One sentence: what a share of ``milli`` milli-GPU gives and what holds it.

    Args:
        milli: the share, 1..999 milli-GPU.
        share_memory_bytes: the share's GPU memory in bytes (``milli / 1000`` of the GPU's,
            rounded down, as :func:`gpuspawner.gpushare.mechanism.share_limits` sets
            ``GPUSPAWNER_GPU_MEMORY_LIMIT``), one per GPU size the share may land on (a profile
            over 40 and 80 GB GPUs: two); empty when unknown.
        model: the GPU model as the form names it (``"A100 80GB"``), "" for "a GPU".
        mechanisms: node -> mechanism (``"dmem"`` | ``"mps"`` | ``"watchdog"``) of the nodes the
            share may land on, or a sequence of mechanisms; empty: the holder is not said.

    Returns:
        e.g. ``"1/4 of an A100 80GB: 20 GiB of GPU memory, compute time shared; held by the
        kernel (...)"``; under MPS the compute part reads ``"25 % of its SMs"``; nodes with
        different mechanisms are named: ``"...; on n1: held by ...; on n2: watched: ..."``.

    Raises:
        ValueError: ``milli`` is not a share (see :func:`fraction_words`).
    """
    what = f"{fraction_words(milli)} of {_article(model)} {model or 'GPU'}"
    sizes = sorted(set(share_memory_bytes))
    memory = "/".join(_gib(b).removesuffix(" GiB") for b in sizes[:-1])
    memory = f"{memory}/{_gib(sizes[-1])}" if memory else (_gib(sizes[-1]) if sizes else "")
    by_node = dict(mechanisms) if isinstance(mechanisms, Mapping) else {}
    kinds = sorted(set(by_node.values()) if by_node else set(mechanisms))
    compute = (f"{max(1, milli // 10)} % of its SMs" if kinds == ["mps"]
               else "compute time shared")
    parts = [f"{memory} of GPU memory" if memory else "its share of the GPU memory", compute]
    text = f"{what}: {', '.join(parts)}"
    if len(kinds) == 1:
        return f"{text}; {MECHANISM_WORDS.get(kinds[0], kinds[0])}"
    if by_node:
        held = "; ".join(
            f"on {', '.join(sorted(n for n, m in by_node.items() if m == k))}: "
            f"{MECHANISM_WORDS.get(k, k)}" for k in kinds)
        return f"{text}; {held}"
    return text
