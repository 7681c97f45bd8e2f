"""Trace-driven placement simulator: replay the Alibaba GPU cluster trace through the ledger.

The trace is the 2023 Alibaba GPU trace ("openb") of Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23. The
package, by role (each module's docstring states its rules and where they come from):

* :mod:`~gpuspawner.simulate.traces`: the node and pod lists as placement nodes and pods
  (:func:`load_nodes`, :func:`load_pods`, :class:`TraceFormatError`), with the rules the
  trace does not settle (NUMA layout, whole cores, memory, GPUs, a pod's GPU demand).
* :mod:`~gpuspawner.simulate.engine`: the simulation over :class:`~gpuspawner.placement.Ledger`
  (:func:`simulate`, modes ``fill`` and ``replay``) and the metrics of a run.
* :mod:`~gpuspawner.simulate.paper_method`: ``--method paper`` and ``--compare``, the FGD
  paper's experiment on :mod:`gpuspawner.simulate.paper`'s milli-CPU cluster model.
* :mod:`~gpuspawner.simulate.report`: the text tables and JSON a run prints.
* :mod:`~gpuspawner.simulate.cli`: the command line (:func:`add_arguments`, :func:`run`,
  :func:`main`); ``__main__`` makes it ``python -m gpuspawner.simulate``.

It uses :mod:`gpuspawner.placement`, never the hub or an engine (import-linter contract "the
simulator uses placement, never the hub or an engine", pyproject.toml).

Run ``python -m gpuspawner.simulate --help`` (or ``gpuspawner simulate``) for the command line.
"""

from gpuspawner.simulate.cli import add_arguments, main, run
from gpuspawner.simulate.engine import (
    METRIC_KEYS,
    MODES,
    simulate,
    simulate_fill,
    simulate_replay,
)
from gpuspawner.simulate.report import format_table
from gpuspawner.simulate.traces import (
    NODE_COLUMNS,
    POD_COLUMNS,
    Pod,
    TraceFormatError,
    load_nodes,
    load_pods,
    make_node,
    read_node_rows,
    replicate_nodes,
    trace_name,
    trace_path,
)

__all__ = [
    "METRIC_KEYS", "MODES", "NODE_COLUMNS", "POD_COLUMNS", "Pod", "TraceFormatError",
    "add_arguments", "format_table", "load_nodes", "load_pods", "make_node", "main",
    "read_node_rows", "replicate_nodes", "run", "simulate", "simulate_fill", "simulate_replay",
    "trace_name", "trace_path",
]
