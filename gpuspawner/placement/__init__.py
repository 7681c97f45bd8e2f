"""NUMA-aware, atomic placement of CPU/GPU/RAM/disk bundles: pure logic, no I/O.

Inventory in (:class:`Node`), allocation out (:class:`Allocation`), through one
:class:`Ledger`. See ``docs/placement.md`` for the rules.
"""

from .errors import (
    PlacementError,
    PlacementRefused,
    QuotaExceeded,
    RestoreConflict,
    RestoreReport,
    UnknownAllocation,
)
from .ledger import DEFAULT_POLICY, NODE_STATES, POLICIES, Ledger
from .model import (
    GPU,
    GPU_MILLI,
    NUMA_POLICIES,
    Allocation,
    Bundle,
    GPULink,
    GPUShare,
    InvalidBundle,
    MigInstance,
    MigShare,
    Node,
    NumaNode,
    Owner,
    format_cpu_list,
    parse_cpu_list,
)
from .prior import LivePrior
from .quota import Quota, QuotaTable, Usage
from .units import format_bytes, parse_bytes
from .workload import PodType, typical_pods

__all__ = [
    "GPU", "GPU_MILLI", "NUMA_POLICIES", "POLICIES", "DEFAULT_POLICY", "Allocation", "Bundle",
    "GPULink", "GPUShare", "InvalidBundle", "Ledger", "NODE_STATES", "LivePrior", "Node",
    "MigInstance", "MigShare", "NumaNode", "Owner",
    "PodType", "typical_pods",
    "PlacementError", "PlacementRefused", "Quota", "QuotaExceeded", "QuotaTable",
    "RestoreConflict", "RestoreReport", "UnknownAllocation", "Usage", "format_bytes",
    "format_cpu_list", "parse_bytes", "parse_cpu_list",
]
