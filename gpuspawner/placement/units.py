"""Units: GPU shares in milli-GPU (:data:`GPU_MILLI`), size strings (``"4G"``, ``"512M"``,
``"1.5Ti"``, ``"64 GB"``) to bytes and back, and durations (``"7d"``, ``"12h"``) to seconds.

Suffixes follow JupyterHub's ``ByteSpecification`` (K, M, G, T are powers of 1024, as in
``c.Spawner.mem_limit = "4G"``); the explicit IEC forms ``Ki``/``KiB`` ... are accepted as well,
and SI forms ``kB``/``MB``/``GB``/``TB`` mean powers of 1000 only when written with a ``B`` and
an upper-case prefix after a space is not required.
"""

from __future__ import annotations

import re

#: one whole GPU in milli-GPU (the unit of GPU shares everywhere: 250 = a quarter GPU, as the
#: Alibaba traces and the FGD simulator count them)
GPU_MILLI = 1000

_BINARY = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGTP]?)(i?)(B?)\s*$", re.IGNORECASE)


def parse_bytes(value: str | int | float) -> int:
    """Parse a size to bytes.

    ``4G`` = ``4Gi`` = ``4GiB`` = 4 * 1024**3 (JupyterHub's convention); ``4GB`` = 4 * 1000**3.
    Plain numbers are bytes.

    Raises:
        ValueError: not a size, or negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value}")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 512M, 4G, 1.5T or a number of bytes)")
    number, prefix, iec, b = m.groups()
    prefix = prefix.upper()
    if b and prefix and not iec:
        factor = 1000 ** list(_BINARY).index(prefix)
    else:
        factor = _BINARY[prefix]
    return int(float(number) * factor)


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*$")


def parse_seconds(value: str | int | float) -> float:
    """A duration in seconds from a number of seconds or a string ``"90"``, ``"90s"``,
    ``"10m"``, ``"2h"``, ``"7d"`` (the idle culler's policy durations' form).

    Raises:
        ValueError: not a duration, or negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise ValueError(f"not a duration: {value!r} (use e.g. 600, '10m', '12h', '7d')")
        seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if seconds < 0:
        raise ValueError(f"must be >= 0 seconds, got {value!r}")
    return seconds


def format_bytes(n: int) -> str:
    """Human size with binary units, e.g. ``68719476736 -> "64.0 GiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"  # pragma: no cover


#: how a GPU share reads (milli-GPU -> words); other shares read as a decimal fraction
SHARE_WORDS = {500: "½", 250: "¼", 750: "¾"}


def share_words(milli: int) -> str:
    """A GPU share in words: ``"¼"`` for 250 milli-GPU, else the fraction (``"0.1"``)."""
    return SHARE_WORDS.get(milli, f"{milli / GPU_MILLI:g}")
