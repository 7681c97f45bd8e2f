"""The simulator's command line: ``gpuspawner simulate`` and ``python -m gpuspawner.simulate``.

:func:`add_arguments` adds the options to a parser and :func:`run` acts on the parsed
arguments (``gpuspawner simulate``, :mod:`gpuspawner.cli`, uses both); :func:`main` is
``python -m gpuspawner.simulate`` (:mod:`gpuspawner.simulate.__main__`). ``--method ledger``
(the default) reads the trace (:mod:`~gpuspawner.simulate.traces`) and runs
:mod:`~gpuspawner.simulate.engine`; ``--method paper`` and ``--compare`` run
:mod:`~gpuspawner.simulate.paper_method`; ``--mode replay --queue`` replays the trace without
and with the wait queue (:func:`~gpuspawner.simulate.engine.compare_queue`). Output:
:mod:`~gpuspawner.simulate.report`. An input file that is missing or malformed is a message
on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuspawner.placement import DEFAULT_POLICY, POLICIES
from gpuspawner.placement.model import NUMA_POLICIES
from gpuspawner.simulate import paper_method
from gpuspawner.simulate.elastic import compare_elastic, format_elastic, plot_elastic
from gpuspawner.simulate.engine import MODES, compare_queue, simulate
from gpuspawner.simulate.paper import PAPER_POLICIES
from gpuspawner.simulate.report import format_compare, format_json, format_queue, format_table
from gpuspawner.simulate.traces import (
    load_nodes,
    load_pods,
    read_node_rows,
    sample_nodes,
    trace_name,
    trace_path,
)


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser`` (used by ``gpuspawner simulate``)."""
    parser.add_argument("--nodes", required=True, metavar="NODES.csv",
                        help="node list: sn,cpu_milli,memory_mib,gpu,model")
    parser.add_argument("--pods", default=None, metavar="PODS.csv",
                        help="pod list: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,"
                             "...,creation_time,deletion_time,...]")
    parser.add_argument("--policy", default=DEFAULT_POLICY,
                        choices=[*POLICIES, *(p for p in PAPER_POLICIES if p not in POLICIES),
                                 "all"],
                        help="placement policy, or 'all' for every policy side by side "
                             f"(default: {DEFAULT_POLICY})")
    parser.add_argument("--mode", default="fill", choices=MODES,
                        help="fill: draw pods until demand reaches GPU capacity (Weng et al., "
                             "ATC '23); replay: place and release at the trace's times "
                             "(default: fill)")
    parser.add_argument("--numa-split", type=_positive_int, default=2, metavar="N",
                        help="NUMA nodes per node with >= 2 GPUs (default: 2)")
    parser.add_argument("--numa-policy", default="strict", choices=NUMA_POLICIES,
                        help="the bundles' NUMA policy (default: strict)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for fill-mode sampling and the random policy (default: 0)")
    parser.add_argument("--max-pods", type=_positive_int, default=None, metavar="N",
                        help="stop after N arriving pods (fill) / replay the first N pods")
    parser.add_argument("--explain-refusals", action="store_true",
                        help="have the ledger explain each refusal (slower, O(nodes) per "
                             "refusal, as in the spawner) and count refusals by reason")
    parser.add_argument("--queue", action="store_true",
                        help="replay mode: replay twice, without and with the hub's wait queue "
                             "(a pod that fits the capacity but not what is free waits, and "
                             "keeps its duration), and print both side by side")
    parser.add_argument("--queue-users", type=_positive_int, default=50, metavar="N",
                        help="--queue: spread the anonymous trace pods over N users "
                             "(crc32 of the pod name) for the queue's fairness (default: 50)")
    parser.add_argument("--max-bypass", type=_non_negative_int, default=3, metavar="N",
                        help="--queue: how often later pods may start ahead of a blocked "
                             "head on its nodes before the closest of them is reserved for it "
                             "(default: 3)")
    parser.add_argument("--elastic", type=_positive_int, default=None, metavar="N",
                        help="replay mode: the last N nodes are elastic (started when a request "
                             "waits, stopped when idle; docs/howto/elastic-nodes.md): waits and "
                             "node-hours against the fixed cluster, one row per --idle-shutdown")
    parser.add_argument("--start-s", type=float, default=300.0, metavar="S",
                        help="--elastic: seconds an elastic node takes to start (default: 300)")
    parser.add_argument("--idle-shutdown", default="300,900,1800,3600", metavar="LIST",
                        help="--elastic: idle_shutdown settings to compare, seconds, comma "
                             "separated (default: 300,900,1800,3600)")
    parser.add_argument("--scale-out-after", type=float, default=0.0, metavar="S",
                        help="--elastic: seconds a request waits before a node is started "
                             "for it (default: 0)")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="--elastic: also draw the curve (node-hours against the mean and "
                             "95th-percentile wait, one point per --idle-shutdown) to the PNG "
                             "FILE (needs matplotlib: the test and docs extras)")
    parser.add_argument("--sample-nodes", type=_positive_int, default=None, metavar="N",
                        help="use N nodes spread evenly over the node list (a smaller cluster, "
                             "so that the trace contends) (default: all)")
    parser.add_argument("--json", action="store_true",
                        help="print JSON (an object, or a list with --policy all)")
    paper = parser.add_argument_group(
        "paper method", "the FGD paper's experiment (Weng et al., ATC '23) on a milli-CPU "
        "cluster model: see gpuspawner.simulate.paper_method")
    paper.add_argument("--method", default="ledger", choices=("ledger", "paper"),
                       help="ledger: --mode fill/replay through the Ledger (whole cores, NUMA); "
                            "paper: tune the pod list to 130%% of GPU capacity, shuffle, place "
                            "once each, read the allocation at 100%% arrived (default: ledger)")
    paper.add_argument("--compare", action="store_true",
                       help="paper method: every policy on every trace of --traces for every "
                            "seed of --seeds, one summary table with the paper's means")
    paper.add_argument("--seeds", default=None, metavar="LIST",
                       help="paper method seeds, e.g. 42-51 or 42,43 (default: 42-51)")
    paper.add_argument("--traces", default=None, metavar="LIST",
                       help="--compare: pod lists, comma separated, by short name "
                            "(default -> openb_pod_list_default.csv beside --nodes) or path "
                            "(default: default,multigpu50,gpushare100)")
    paper.add_argument("--policies", default=None, metavar="LIST",
                       help="--compare: policies, comma separated (default: all paper-method "
                            "policies)")
    paper.add_argument("--cpu-rounding", default="none", choices=("none", "ceil"),
                       help="paper method: none keeps milli-CPU (the paper); ceil rounds pods "
                            "and nodes up to whole CPUs (what cpusets can give) (default: none)")
    paper.add_argument("--until", type=float, default=100.5, metavar="PERCENT",
                       help="paper method: stop once arrived GPU demand passes this percent of "
                            "capacity; 130 offers the whole tuned list (default: 100.5, later "
                            "pods cannot change the 100%% reading)")
    paper.add_argument("--exact-fgd", action="store_true",
                       help="paper method: fgd picks the smallest exact fragmentation growth "
                            "instead of the Go plugin's integer sigmoid score")
    paper.add_argument("--paper-numa", default="none", choices=("none", "strict"),
                       help="paper method: none (the paper: no NUMA) or strict (nodes with >= 2 "
                            "GPUs get --numa-split NUMA nodes; a whole-GPU pod that fits one "
                            "NUMA node must take its GPUs from one) (default: none)")
    paper.add_argument("--node-order", default="shuffled", choices=paper_method.NODE_ORDERS,
                       help="paper method: which node wins a tie of scores: shuffled (the "
                            "paper's simulator: a random node ranking per seed) or name (the "
                            "smallest node name) (default: shuffled)")
    paper.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                       help="--compare: processes to run in parallel (default: 1)")


def run(args: argparse.Namespace) -> int:
    """Run the simulation the parsed arguments describe and print the result.

    Returns:
        0 on success, 2 when an input file is missing or malformed (message on stderr).
    """
    if getattr(args, "method", "ledger") == "paper" or getattr(args, "compare", False):
        return _run_paper(args)
    if args.pods is None:
        print("error: --pods is required (or use --method paper --compare with --traces)",
              file=sys.stderr)
        return 2
    if args.policy not in POLICIES and args.policy != "all":
        print(f"error: policy {args.policy!r} exists only in --method paper", file=sys.stderr)
        return 2
    if getattr(args, "elastic", None):
        return _run_elastic(args)
    if getattr(args, "queue", False):
        return _run_queue(args)
    try:
        nodes = load_nodes(args.nodes, numa_split=args.numa_split)
        if args.sample_nodes is not None:
            nodes = sample_nodes(nodes, args.sample_nodes)
        pods = load_pods(args.pods)
        policies = list(POLICIES) if args.policy == "all" else [args.policy]
        results = [simulate(nodes, pods, policy, args.mode, numa_policy=args.numa_policy,
                            seed=args.seed, max_pods=args.max_pods,
                            explain=args.explain_refusals) for policy in policies]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        payload: Any = results if args.policy == "all" else results[0]
        print(format_json(payload))
    else:
        print(format_table(results))
    return 0


def _run_queue(args: argparse.Namespace) -> int:
    """``--mode replay --queue``: the trace without and with the wait queue, side by side
    (:func:`~gpuspawner.simulate.engine.compare_queue`)."""
    if args.mode != "replay":
        print("error: --queue needs --mode replay", file=sys.stderr)
        return 2
    if args.policy == "all":
        print("error: --queue compares one policy; name it with --policy", file=sys.stderr)
        return 2
    try:
        nodes = load_nodes(args.nodes, numa_split=args.numa_split)
        if args.sample_nodes is not None:
            nodes = sample_nodes(nodes, args.sample_nodes)
        pods = load_pods(args.pods)
        results = compare_queue(nodes, pods, args.policy, numa_policy=args.numa_policy,
                                seed=args.seed, max_pods=args.max_pods,
                                explain=args.explain_refusals, users=args.queue_users,
                                max_bypass=args.max_bypass)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(format_json(results))
    else:
        gpus = sum(len(n.gpus) for n in nodes)
        print(f"# replay {Path(args.pods).name} on {len(nodes)} nodes ({gpus} GPUs), policy "
              f"{args.policy}, numa {args.numa_policy}; queue: {args.queue_users} users, "
              f"max_bypass {args.max_bypass}")
        print(format_queue(results))
        tenths = results[1].get("unallocated_gpus_by_tenth") or []
        print("# queue: unallocated GPUs by tenth of the span (time-weighted): "
              + " ".join(f"{v:.1f}" for v in tenths))
    return 0


def _run_elastic(args: argparse.Namespace) -> int:
    """``--mode replay --elastic N``: the fixed cluster and one elastic replay per
    ``--idle-shutdown`` value (:func:`~gpuspawner.simulate.elastic.compare_elastic`)."""
    if args.mode != "replay" or args.policy == "all":
        print("error: --elastic needs --mode replay and one --policy", file=sys.stderr)
        return 2
    try:
        idle = [float(x) for x in args.idle_shutdown.split(",") if x.strip()]
        nodes = load_nodes(args.nodes, numa_split=args.numa_split)
        if args.sample_nodes is not None:
            nodes = sample_nodes(nodes, args.sample_nodes)
        pods = load_pods(args.pods)
        rows = compare_elastic(nodes, pods, args.policy, elastic=args.elastic,
                               start_s=args.start_s, idle_shutdowns=idle,
                               scale_out_after_s=args.scale_out_after,
                               numa_policy=args.numa_policy, seed=args.seed,
                               max_pods=args.max_pods, users=args.queue_users,
                               max_bypass=args.max_bypass)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(format_json(rows))
    else:
        print(f"# replay {Path(args.pods).name} on {len(nodes)} nodes, the last "
              f"{args.elastic} elastic (start {args.start_s:g} s, scale out after "
              f"{args.scale_out_after:g} s), policy {args.policy}")
        print(format_elastic(rows))
    if args.plot:
        try:
            plot_elastic(rows, idle, args.plot,
                         title=f"{Path(args.pods).name}: {len(nodes)} nodes, {args.elastic} "
                               f"elastic (start {args.start_s:g} s), policy {args.policy}")
        except ImportError as e:
            print(f"error: --plot needs matplotlib (pip install matplotlib): {e}",
                  file=sys.stderr)
            return 2
        except (OSError, ValueError) as e:
            print(f"error: --plot {args.plot}: {e}", file=sys.stderr)
            return 2
        print(f"# curve drawn to {args.plot}", file=sys.stderr)
    return 0


def _run_paper(args: argparse.Namespace) -> int:
    """``--method paper`` and ``--compare`` (see :mod:`gpuspawner.simulate.paper_method`)."""
    numa = args.paper_numa
    try:
        seeds = (paper_method.parse_seeds(args.seeds) if args.seeds
                 else list(paper_method.DEFAULT_SEEDS))
        rows = read_node_rows(args.nodes)
        folder = Path(args.nodes).parent
        if args.compare:
            names = ([t.strip() for t in args.traces.split(",") if t.strip()] if args.traces
                     else list(paper_method.DEFAULT_TRACES))
            paths = [trace_path(n, folder) for n in names]
        else:
            if args.pods is None:
                raise ValueError("--pods is required without --compare")
            paths = [Path(args.pods)]
        if args.policies:
            policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        elif args.compare or args.policy == "all":
            policies = list(PAPER_POLICIES)
        else:
            policies = [args.policy]
        unknown = [p for p in policies if p not in PAPER_POLICIES]
        if unknown:
            raise ValueError(f"unknown paper-method policy {unknown[0]!r}; choose from "
                             f"{', '.join(PAPER_POLICIES)}")
        traces = {trace_name(p): paper_method.tasks_of(load_pods(p), args.cpu_rounding)
                  for p in paths}
        t0 = time.perf_counter()
        results = paper_method.compare(rows, traces, policies, seeds, jobs=args.jobs,
                                       cpu_rounding=args.cpu_rounding, until=args.until,
                                       exact_fgd=args.exact_fgd, numa=numa,
                                       numa_split=args.numa_split,
                                       node_order=args.node_order)
        wall = time.perf_counter() - t0
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    comparable = (Path(args.nodes).name == "openb_node_list_gpu_node.csv" and numa == "none"
                  and args.cpu_rounding == "none" and args.node_order == "shuffled")
    summary = paper_method.summarize(results, paper=comparable)
    wins = paper_method.default_wins(results)
    pairs = [p for pol in policies if pol.startswith("fgd-")
             for p in paper_method.paired(results, pol)]
    if args.json:
        print(format_json({"runs": results, "summary": summary, "default_wins": wins,
                           "paired": pairs, "wall_s": wall}))
    else:
        print(f"# paper method: nodes {args.nodes}, seeds {','.join(map(str, seeds))}, "
              f"cpu_rounding {args.cpu_rounding}, numa {numa}, exact_fgd {args.exact_fgd}, "
              f"node_order {args.node_order}, "
              f"until {args.until:g}%, wall {wall:.1f} s")
        print(format_compare(summary, wins, pairs))
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    """Entry point of ``python -m gpuspawner.simulate``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner.simulate",
        description="Replay the Alibaba GPU trace (Weng et al., ATC '23) through the ledger "
                    "and report GPU allocation, refusals, NUMA alignment and decision latency.")
    add_arguments(parser)
    return run(parser.parse_args(None if argv is None else list(argv)))

