"""The hub's own workload prior for ``fgd``: task types counted from its allocation history,
decayed over days, turned into typical pods the way the FGD simulator does
(:func:`~.workload.typical_pods`, ``pkg/utils/frag.go`` ``GetTypicalPods``: the most frequent
types covering 95 % of the weight, CPU-only types included).

Why decayed: the paper's prior is the whole trace, a static mix; a hub's mix drifts (courses
start and end, a new GPU model arrives). Each allocation adds weight 1 at its creation time, and
weight halves every ``half_life_days``; a type nobody asked for in a few half-lives drops out.

Fallback when the hub is new (decayed weight below ``min_weight``): the history is blended with
``fallback`` (e.g. one entry per spawn profile, :meth:`LivePrior.from_bundles`) given the
missing weight, ``min_weight - history``; so the first allocations refine the profile mix
instead of replacing it. With no fallback and no history, :meth:`LivePrior.workload` returns
None and the ledger learns the mix online from the bundles it sees
(:class:`~.fragmentation.FragmentationModel`).

Pure: no I/O, no clock of its own (times are passed in or come from the ``clock`` argument).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .model import GPU_MILLI, Allocation, Bundle, now
from .workload import PodType, typical_pods

DAY = 86_400.0


def pod_type_of_bundle(bundle: Bundle) -> PodType:
    """A bundle as a task type: cores x 1000 milli-CPU, whole GPUs or a share, allowed models
    joined by ``|``."""
    models = "|".join(bundle.gpu_models)
    if bundle.gpus:
        return PodType(bundle.cores * 1000, GPU_MILLI, bundle.gpus, models)
    if bundle.gpu_milli:
        return PodType(bundle.cores * 1000, bundle.gpu_milli, 1, models)
    return PodType(bundle.cores * 1000)


def pod_type_of_allocation(alloc: Allocation) -> PodType:
    """What an allocation held as a task type (the models it was allowed are not recorded in
    an allocation, so the type allows any model)."""
    cpu = len(alloc.cpuset) * 1000
    if not alloc.gpus:
        return PodType(cpu)
    if len(alloc.gpus) == 1 and alloc.gpus[0].milli < GPU_MILLI:
        return PodType(cpu, alloc.gpus[0].milli, 1)
    return PodType(cpu, GPU_MILLI, len(alloc.gpus))


class LivePrior:
    """Decayed counts of task types, and the typical pods they give.

    Args:
        half_life_days: a record's weight halves every this many days (> 0).
        min_weight: below this decayed weight the fallback fills the gap (>= 0).
        threshold: percent of the weight the typical pods must cover (the paper: 95).
        fallback: ``[(PodType, frequency)]`` for a new hub; frequencies are normalised.
        clock: seconds since the epoch, used when a call passes no time.

    Raises:
        ValueError: ``half_life_days <= 0`` or ``min_weight < 0``.
    """

    def __init__(self, half_life_days: float = 7.0, min_weight: float = 50.0,
                 threshold: int = 95, fallback: Sequence[tuple[PodType, float]] = (),
                 clock: Callable[[], float] = now) -> None:
        if half_life_days <= 0 or min_weight < 0:
            raise ValueError("half_life_days must be > 0 and min_weight >= 0")
        self.half_life_s = half_life_days * DAY
        self.min_weight = min_weight
        self.threshold = threshold
        total = sum(p for _, p in fallback)
        self.fallback = [(t, p / total) for t, p in fallback if p > 0] if total > 0 else []
        self._clock = clock
        self._t0: float | None = None  # reference time of the stored (scaled) weights
        self._w: dict[PodType, float] = {}

    @classmethod
    def from_bundles(cls, bundles: Iterable[Bundle], **kw: Any) -> LivePrior:
        """A prior whose fallback is the given bundles (e.g. the spawn profiles), equal
        weights."""
        types: dict[PodType, float] = {}
        for b in bundles:
            t = pod_type_of_bundle(b)
            types[t] = types.get(t, 0.0) + 1.0
        return cls(fallback=list(types.items()), **kw)

    def _scale(self, t: float) -> float:
        """2 ** ((t - t0) / half_life), re-basing t0 when the exponent grows large."""
        if self._t0 is None:
            self._t0 = t
        x = (t - self._t0) / self.half_life_s
        if x > 500:  # keep floats finite: re-base every stored weight to t
            f = 2.0 ** -x
            self._w = {k: v * f for k, v in self._w.items() if v * f > 1e-12}
            self._t0 = t
            x = 0.0
        return 2.0 ** x

    def record(self, t: PodType, when: float | None = None, weight: float = 1.0) -> None:
        """Count one task of type ``t`` at ``when`` (seconds since the epoch; default now)."""
        when = self._clock() if when is None else when
        self._w[t] = self._w.get(t, 0.0) + weight * self._scale(when)

    def record_allocation(self, alloc: Allocation) -> None:
        """Count an allocation at its creation time."""
        self.record(pod_type_of_allocation(alloc), alloc.created or None)

    def record_bundle(self, bundle: Bundle, when: float | None = None) -> None:
        """Count a granted bundle (keeps the allowed GPU models)."""
        self.record(pod_type_of_bundle(bundle), when)

    def counts(self, when: float | None = None) -> dict[PodType, float]:
        """The decayed weight of each type at ``when`` (default now)."""
        if self._t0 is None:
            return {}
        when = self._clock() if when is None else when
        f = 2.0 ** (-(when - self._t0) / self.half_life_s)
        return {k: v * f for k, v in self._w.items() if v * f > 0}

    def weight(self, when: float | None = None) -> float:
        """Total decayed weight at ``when``."""
        return sum(self.counts(when).values())

    def workload(self, when: float | None = None) -> list[tuple[PodType, float]] | None:
        """The typical pods at ``when``: history plus fallback filling ``min_weight``, then
        :func:`~.workload.typical_pods`. None when there is neither history nor fallback."""
        counts = self.counts(when)
        gap = max(0.0, self.min_weight - sum(counts.values()))
        if gap > 0:
            for t, p in self.fallback:
                counts[t] = counts.get(t, 0.0) + gap * p
        if not any(v > 0 for v in counts.values()):
            return None
        return typical_pods(counts, threshold=self.threshold)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state (for the hub to persist beside its database, if it wants)."""
        return {"t0": self._t0, "half_life_s": self.half_life_s,
                "weights": [[t.milli_cpu, t.milli_gpu, t.gpu_number, t.gpu_type, w]
                            for t, w in self._w.items()]}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore :meth:`to_dict` output (weights re-based to this prior's half-life).

        Raises:
            ValueError: malformed data.
        """
        try:
            t0 = data["t0"]
            half = float(data.get("half_life_s", self.half_life_s))
            weights = {PodType(int(c), int(m), int(n), str(ty)): float(w)
                       for c, m, n, ty, w in data["weights"]}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed prior state: {e}") from None
        if t0 is None:
            self._t0, self._w = None, {}
            return
        if not math.isclose(half, self.half_life_s):
            raise ValueError("the saved prior used another half-life")
        self._t0, self._w = float(t0), weights
