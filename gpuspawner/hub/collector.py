"""The hub process's garbage-collector thresholds (``gc.set_threshold``), set by
:func:`gpuspawner.hub.wiring.wire_hub` when the configuration is read.

CPython's cyclic collector (3.11: ``Modules/gcmodule.c``) collects generation 0 every
``threshold0`` net allocations of container objects (default 700), generation 1 every
``threshold1`` collections of generation 0 (10), and the oldest every ``threshold2`` of
generation 1 (10) once the objects that reached it since its last collection exceed a quarter
of those it holds. A JupyterHub at 1,000 servers holds about half a million tracked objects,
and each full collection walks all of them on the event loop: 560-690 ms on the benchmark's
machines (docs/benchmarks.md, "The hub's garbage collector"). What sets those collections off
is the hub's own request handlers: a page of ``GET /hub/api/users`` builds thousands of dicts
that are alive while it runs, so collections of the young generations every 700 allocations
move them into the oldest, where they die. With ``threshold0`` at 10,000 most of them die
young, and the benchmark's hub made no full collection after its start instead of six.

The thresholds are process-wide (JupyterHub's own objects too); ``wire_hub(...,
gc_threshold=None)`` keeps Python's. Python's documentation: ``gc.set_threshold``,
https://docs.python.org/3/library/gc.html#gc.set_threshold.
"""

from __future__ import annotations

import gc

__all__ = ["HUB_GC_THRESHOLD", "check_gc_threshold", "set_hub_gc_threshold"]

#: the thresholds the hub runs with (generation 0 allocations, generation 0 collections per
#: generation 1 collection, generation 1 collections per full collection)
HUB_GC_THRESHOLD: tuple[int, int, int] = (10_000, 10, 10)


def check_gc_threshold(value: object, name: str = "gc_threshold") -> tuple[int, int, int]:
    """``value`` as three integers for ``gc.set_threshold``.

    Args:
        value: a sequence of three integers, generation 0's >= 1 (0 would turn automatic
            collection off, which a hub that runs for months must not do) and the others >= 1.
        name: the setting's name for the message.

    Raises:
        ValueError: naming ``name``, the value and what is wrong with it.
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        raise ValueError(f"{name}: {value!r} is not three integers (generation 0 allocations, "
                         "then generation 0 and 1 collections), e.g. (10000, 10, 10)")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: item {i} ({v!r}) of {tuple(value)!r} is not an integer "
                             ">= 1 (0 would stop the collector)")
        out.append(v)
    return (out[0], out[1], out[2])


def set_hub_gc_threshold(threshold: object = HUB_GC_THRESHOLD,
                         ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Set this process's collector thresholds (checked by :func:`check_gc_threshold`).

    Returns:
        ``(before, after)``: the thresholds before and after, for the log.

    Raises:
        ValueError: from :func:`check_gc_threshold`; nothing is changed then.
    """
    after = check_gc_threshold(threshold)
    before = gc.get_threshold()
    gc.set_threshold(*after)
    return (before[0], before[1], before[2]), after
