"""Recorded placement decisions: fixed scenarios whose every decision (node, GPUs, cores,
memory, or the refusal) is written down, so a change meant to make the ledger faster can be
checked to decide exactly as before (tests/test_placement_decisions.py).

The scenarios are synthetic (no I/O, a seeded ``random.Random``), shaped like the Alibaba GPU
trace (Weng et al., USENIX ATC '23): GPU models with 1-8 GPUs per node on 2 NUMA nodes, CPU-only
nodes, pods asking for shares, whole GPUs, model constraints or no GPU. Arrivals and departures
(churn) are mixed so that releases, the refusal path and the ``fgd`` caches are all exercised.

Regenerate the fixture (only when a decision change is intended):
``.venv/bin/python -m tests.placement_decisions``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path

from gpuspawner.placement import Allocation, Bundle, Ledger, Owner, PlacementRefused
from gpuspawner.placement.policies import pod_type_of
from gpuspawner.placement.workload import typical_pods
from gpuspawner.simulate import load_nodes, load_pods, make_node, replicate_nodes

FIXTURE = Path(__file__).parent / "data" / "placement" / "fgd_decisions.json.gz"
TRACE_DIGESTS = Path(__file__).parent / "data" / "placement" / "fgd_trace_digests.json"
#: the look-ahead's (``fgd-mem-lookahead``, the default since issue 44): recorded with the code
#: before its speed work (c. 053b2d8), so that work can be checked to decide exactly as before
LOOKAHEAD_POLICY = "fgd-mem-lookahead"
LOOKAHEAD_FIXTURE = Path(__file__).parent / "data" / "placement" / "mem_lookahead_decisions.json.gz"
LOOKAHEAD_TRACE_DIGESTS = (Path(__file__).parent / "data" / "placement"
                           / "mem_lookahead_trace_digests.json")
#: the Alibaba GPU trace, where the checkout has the shared data folder beside it
TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"

MODELS = ("T4", "V100M16", "V100M32", "P100", "G2", "G3")

#: name -> (seed, nodes, steps, numa_policy, static workload, departure probability, explain,
#: health: requests restricted to some nodes, GPUs drained and nodes drained or down now and
#: then)
SCENARIOS: dict[str, tuple[int, int, int, str, bool, float, bool, bool]] = {
    "strict-learned-churn": (1, 160, 2500, "strict", False, 0.35, False, False),
    "prefer-static-churn": (2, 160, 2500, "prefer", True, 0.35, True, False),
    "none-learned-fill": (3, 120, 1500, "none", False, 0.0, False, False),
    "strict-static-fill": (4, 200, 2000, "strict", True, 0.1, True, False),
    "strict-learned-health": (5, 150, 2500, "strict", False, 0.3, True, True),
}


def cluster(rng: random.Random, count: int):
    """``count`` trace-shaped nodes (:func:`gpuspawner.simulate.make_node`, 2 NUMA nodes)."""
    nodes = []
    for i in range(count):
        gpus = rng.choice((0, 0, 1, 2, 2, 4, 4, 8, 8, 8))
        model = rng.choice(MODELS) if gpus else ""
        cpu = rng.choice((32, 64, 96, 128)) * 1000
        mem = rng.choice((128, 256, 512, 768)) * 1024
        nodes.append(make_node(f"n{i:04d}", cpu, mem, gpus, model))
    return nodes


def bundles(rng: random.Random, count: int, numa_policy: str) -> list[Bundle]:
    """``count`` trace-shaped bundles (the pod mix drawn from)."""
    out = []
    for _ in range(count):
        kind = rng.random()
        gpus = milli = 0
        if kind < 0.45:
            milli = rng.choice((100, 200, 250, 300, 500, 700, 900))
        elif kind < 0.85:
            gpus = rng.choice((1, 1, 1, 2, 2, 4, 8))
        models: tuple[str, ...] = ()
        if (gpus or milli) and rng.random() < 0.15:
            models = tuple(rng.sample(MODELS, rng.choice((1, 2))))
        cores = rng.choice((1, 2, 4, 6, 8, 12, 16, 24, 32))
        mem = rng.choice((1, 4, 8, 16, 32, 64, 128)) * 2**30
        out.append(Bundle(cores=cores, memory_bytes=mem, gpus=gpus, gpu_milli=milli,
                          gpu_models=models, numa_policy=numa_policy))  # type: ignore[arg-type]
    return out


def record(name: str, policy: str = "fgd") -> list[str]:
    """The decisions of one scenario under ``policy``, one line each: ``+ node gpus cpus mems``
    for a grant, ``! reason closest-node sentence`` for a refusal, ``- index`` for a departure
    (by arrival index), ``~ ...`` for a GPU drained or undrained or a node state set."""
    seed, n_nodes, steps, numa_policy, static, depart, explain, health = SCENARIOS[name]
    rng = random.Random(seed)
    nodes = cluster(rng, n_nodes)
    mix = bundles(rng, 300, numa_policy)
    workload = typical_pods(pod_type_of(b) for b in mix) if static else None
    ledger = Ledger(nodes, policy, seed=seed, workload=workload, clock=lambda: 0.0)
    names = [n.name for n in nodes]
    uuids = [g.uuid for n in nodes for g in n.gpus]
    held: list[tuple[int, str]] = []
    out: list[str] = []
    for i in range(steps):
        if held and rng.random() < depart:
            j, aid = held.pop(rng.randrange(len(held)))
            ledger.release(aid)
            out.append(f"- {j}")
            continue
        allowed = None
        if health:
            x = rng.random()
            if x < 0.03:
                uuid = rng.choice(uuids)
                if rng.random() < 0.5:
                    ledger.drain_gpu(uuid, "test")
                else:
                    ledger.undrain_gpu(uuid)
                out.append(f"~ gpu {uuid}")
                continue
            if x < 0.05:
                node = rng.choice(names)
                state = rng.choice(("up", "up", "drain", "down"))
                ledger.set_node_state(node, state)
                out.append(f"~ node {node} {state}")
                continue
            if x < 0.3:
                allowed = rng.sample(names, rng.randint(1, len(names) // 3))
        b = mix[rng.randrange(len(mix))]
        try:
            a = ledger.reserve(b, Owner(f"u{i}", "s"), allowed, explain=explain)
        except PlacementRefused as e:
            out.append(f"! {e.reason} {e.best_node or '-'} {e.detail}")
            continue
        held.append((i, a.id))
        out.append(_grant(a))
    return out


def record_trace(folder: Path, size: int, steps: int, numa_policy: str = "strict",
                 seed: int = 0, refresh_tolerance: float | None = 0.0,
                 policy: str = "fgd") -> list[str]:
    """The decisions of the benchmark's fill run on the Alibaba trace in ``folder``
    (``openb_node_list_all_node.csv`` replicated to ``size`` nodes, 0 = as is, and
    ``openb_pod_list_default.csv`` drawn with ``random.Random(seed)``), ``steps`` arrivals at
    most, lines as :func:`record` writes them.

    ``refresh_tolerance``: the learned workload's (``FragmentationModel.refresh_tolerance``).
    The recorded digests were written when every learned change was adopted, so they are
    checked with 0: the decision code itself is unchanged; the tolerance, the one intended
    change of decisions since, is tested in tests/test_workload_refresh.py. ``policy``: the
    ledger's (the look-ahead's digests are recorded with the tolerance the ledger ships,
    ``None`` here keeps it)."""
    nodes = load_nodes(folder / "openb_node_list_all_node.csv")
    if size:
        nodes = replicate_nodes(nodes, size)
    pods = load_pods(folder / "openb_pod_list_default.csv")
    ledger = Ledger(nodes, policy, seed=seed, clock=lambda: 0.0)
    if refresh_tolerance is not None:
        ledger._c.frag.refresh_tolerance = refresh_tolerance
    capacity = ledger.gpu_milli_capacity()
    rng = random.Random(seed)
    requested = 0
    out: list[str] = []
    for i in range(steps):
        if requested >= capacity:
            break
        pod = pods[rng.randrange(len(pods))]
        b = pod.bundle(numa_policy)
        requested += b.total_gpu_milli
        try:
            a = ledger.reserve(b, Owner(pod.name, str(i)), explain=False)
        except PlacementRefused as e:
            out.append(f"! {e.reason}")
            continue
        out.append(_grant(a))
    return out


def _grant(a: Allocation) -> str:
    gpus = ",".join(f"{g.uuid.rsplit('-', 1)[1]}:{g.milli}" for g in a.gpus)
    cpus = ",".join(map(str, a.cpuset))
    mems = ",".join(f"{n}:{m >> 20}" for n, m in a.memory_by_numa)
    return f"+ {a.node} {gpus} {cpus} {mems}"


def digest(lines: list[str]) -> str:
    """sha256 of the decision lines."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


#: trace runs with a stored digest: name -> (size, steps, numa_policy)
TRACE_RUNS: dict[str, tuple[int, int, str]] = {
    "trace-1523-strict": (0, 6000, "strict"),
    "trace-1523-none": (0, 3000, "none"),
    "trace-10000-strict": (10_000, 3000, "strict"),
}


#: the look-ahead's trace runs with a stored digest: name -> (size, steps, numa_policy)
LOOKAHEAD_TRACE_RUNS: dict[str, tuple[int, int, str]] = {
    "trace-1523-strict": (0, 9000, "strict"),
    "trace-1523-none": (0, 9000, "none"),
    "trace-10000-strict": (10_000, 4000, "strict"),
}


def main(which: str = "fgd") -> None:
    """Write the fixtures of ``which`` (``fgd`` or ``lookahead``) from the current code."""
    if which == "lookahead":
        fixture, digests_file, runs = (LOOKAHEAD_FIXTURE, LOOKAHEAD_TRACE_DIGESTS,
                                       LOOKAHEAD_TRACE_RUNS)
        policy, tolerance = LOOKAHEAD_POLICY, None
    else:
        fixture, digests_file, runs = FIXTURE, TRACE_DIGESTS, TRACE_RUNS
        policy, tolerance = "fgd", 0.0
    fixture.parent.mkdir(parents=True, exist_ok=True)
    data = {name: record(name, policy) for name in SCENARIOS}
    with gzip.open(fixture, "wt", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    for name, lines in data.items():
        grants = sum(x.startswith("+") for x in lines)
        print(f"{name}: {len(lines)} steps, {grants} grants")
    if TRACE.is_dir():
        digests = {}
        for name, (size, steps, numa) in runs.items():
            lines = record_trace(TRACE, size, steps, numa, refresh_tolerance=tolerance,
                                 policy=policy)
            digests[name] = {"steps": len(lines), "sha256": digest(lines)}
            print(f"{name}: {len(lines)} steps, {digests[name]['sha256'][:12]}")
        digests_file.write_text(json.dumps(digests, indent=1) + "\n")


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:2])
