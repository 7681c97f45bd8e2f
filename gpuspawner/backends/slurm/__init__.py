"""The Slurm engine's pieces: GPUs as per-device GRES types (:mod:`.gres`) and an
async client for the Slurm commands with parsers for their output (:mod:`.commands`).

The private three-node cluster that the tests run against is started by ``scripts/slurm.sh``
(``make slurm``); its gres.conf comes from ``gpuspawner slurm-gres``.
"""

from .commands import (
    JobInfo,
    NodeInfo,
    SlurmClient,
    SlurmError,
    expand_cpu_ids,
    expand_hostlist,
    parse_gres_detail,
    parse_job,
    parse_nodes,
)
from .gres import GresError, check_types, gres_conf, gres_type, node_gres, slurm_gres_id

__all__ = [
    "GresError",
    "JobInfo",
    "NodeInfo",
    "SlurmClient",
    "SlurmError",
    "check_types",
    "expand_cpu_ids",
    "expand_hostlist",
    "gres_conf",
    "gres_type",
    "node_gres",
    "parse_gres_detail",
    "parse_job",
    "parse_nodes",
    "slurm_gres_id",
]
