"""Level one of the placement: which node. Two-level scheduling as in Backend.AI's Sokovan
(seed 003): a node-selection policy picks the node, then :mod:`.devices` picks the devices.

Policies, selectable by name (``POLICIES``):

``fgd`` (default)
    Fragmentation gradient descent (Weng et al., "Beware of Fragmentation: Scheduling
    GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23): the node whose
    expected GPU fragmentation for the observed request mix grows least; ties go to the node
    with the least free GPU capacity (packing), CPU-only bundles thereby to nodes without free
    GPUs. Nodes are grouped by GPU signature, so a decision costs O(distinct signatures), not
    O(nodes).
``first-fit``
    The first node, in configuration order, that fits.
``best-fit``
    Pack: the node left with the least free GPU capacity, then cores, then memory.
``spread``
    The node with the most free capacity of what the bundle asks for most.
``random``
    A uniformly random node among those that fit (seeded).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Protocol

from .devices import plan, quick_fit
from .fragmentation import Demand, FragmentationModel
from .model import GPU_MILLI, Bundle
from .state import NodeState, Plan

Choice = tuple[NodeState, Plan]
NodeFilter = Callable[[NodeState], bool]


class ClusterView(Protocol):
    """What a policy may read: node states in configuration order, the GPU-signature buckets,
    the fragmentation model and a seeded random generator."""

    states: list[NodeState]
    buckets: dict[tuple[int, int, int], dict[str, NodeState]]
    versions: dict[tuple[int, int, int], int]
    no_fit: dict[int, dict[tuple[int, int, int], int]]
    shapes: dict[tuple, int]
    frag: FragmentationModel
    rng: random.Random


def demand_of(bundle: Bundle, aligned: bool) -> Demand:
    """The bundle as a fragmentation task type."""
    return Demand(bundle.gpus, bundle.gpu_milli,
                  frozenset(m.lower() for m in bundle.gpu_models), aligned)


def _try(states: Iterable[NodeState], bundle: Bundle, spill: bool,
         ok: NodeFilter | None) -> Choice | None:
    for st in states:
        if ok is not None and not ok(st):
            continue
        if quick_fit(st, bundle, not spill):
            p = plan(st, bundle, spill)
            if p is not None:
                return st, p
    return None


def first_fit(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """The first node in configuration order with room."""
    return _try(c.states, bundle, spill, ok)


def _left(st: NodeState, bundle: Bundle) -> tuple[float, float, float]:
    gpu_cap = len(st.gpu_used) * GPU_MILLI or 1
    cpu_cap = st.node.cpu_count or 1
    mem_cap = st.node.memory_bytes or 1
    return ((st.free_gpu_milli() - bundle.total_gpu_milli) / gpu_cap,
            (st.free_cpu_count() - bundle.cores) / cpu_cap,
            (st.free_memory() - bundle.memory_bytes) / mem_cap)


def best_fit(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """Pack: least free capacity left (GPU, then cores, then memory, as fractions)."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]
    fits.sort(key=lambda st: (_left(st, bundle), st.order))
    return _try(fits, bundle, spill, None)


def spread(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """Most free capacity of the bundle's main resource (GPUs for GPU bundles, else cores)."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]

    def key(st: NodeState):
        g, cpu, mem = _left(st, bundle)
        return ((-g, -cpu, -mem) if bundle.total_gpu_milli else (-cpu, -mem, g)), st.order

    fits.sort(key=key)
    return _try(fits, bundle, spill, None)


def random_fit(c: ClusterView, bundle: Bundle, spill: bool,
               ok: NodeFilter | None) -> Choice | None:
    """A random node with room (uniform among those that pass the quick check)."""
    fits = [st for st in c.states if (ok is None or ok(st)) and quick_fit(st, bundle)]
    while fits:
        i = c.rng.randrange(len(fits))
        st = fits[i]
        p = plan(st, bundle, spill)
        if p is not None:
            return st, p
        fits[i] = fits[-1]
        fits.pop()
    return None


_MISS = object()


def fgd(c: ClusterView, bundle: Bundle, spill: bool, ok: NodeFilter | None) -> Choice | None:
    """Fragmentation gradient descent over GPU-signature buckets (see module docstring)."""
    d = demand_of(bundle, aligned=not spill)
    frag = c.frag
    free = frag.free
    table = frag.deltas(d)
    miss = _MISS
    # a bucket's nodes have fewer than 2**cpu_class free cores and 2**mem_class free MiB
    cores = bundle.cores
    mib = bundle.memory_bytes >> 20
    # buckets where this very bundle shape found no room, unchanged since (fill: no release)
    if ok is None:
        shape = c.shapes.get((bundle, spill))
        if shape is None:
            if len(c.shapes) > 10_000:
                c.shapes.clear()
                c.no_fit.clear()
            shape = c.shapes[(bundle, spill)] = len(c.shapes)
        no_fit = c.no_fit.setdefault(shape, {})
    else:
        no_fit = {}
    versions = c.versions
    scored = []
    for key in c.buckets:
        sid, cpu_class, mem_class = key
        if cores >> cpu_class or mib >> mem_class:
            continue
        if no_fit.get(key, -1) == versions[key]:
            continue
        delta = table.get(sid, miss)
        if delta is miss:
            delta = frag.delta(sid, d)
        if delta is not None:
            scored.append((delta, free[sid], -cpu_class, key))
    if not scored:
        return None
    # usually the best bucket has room: find it in one pass, sort only when it does not
    first = min(scored)
    got = _try(c.buckets[first[3]].values(), bundle, spill, ok)
    if got is not None:
        return got
    if ok is None:
        no_fit[first[3]] = versions[first[3]]
    scored.sort()
    for _delta, _free, _cls, key in scored[1:]:
        got = _try(c.buckets[key].values(), bundle, spill, ok)
        if got is not None:
            return got
        if ok is None:
            no_fit[key] = versions[key]
    return None


PolicyFn = Callable[[ClusterView, Bundle, bool, "NodeFilter | None"], "Choice | None"]

POLICIES: dict[str, PolicyFn] = {
    "fgd": fgd,
    "first-fit": first_fit,
    "best-fit": best_fit,
    "spread": spread,
    "random": random_fit,
}

DEFAULT_POLICY = "fgd"


def get_policy(name: str) -> PolicyFn:
    """The policy function for a name.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of "
                         f"{', '.join(POLICIES)}") from None
