"""Elastic capacity: nodes started when the wait queue needs them and stopped when idle, by a
provider (the admin's own programs: :class:`CommandProvider`) under a policy (the default, or
the site's own callable). docs/howto/elastic-nodes.md.

Not part of :mod:`gpuspawner.placement` (pure placement): this package talks to providers and
the hub's cluster; the ledger only knows elastic nodes that are not running as state ``off``.
"""

from .attach import attach_elastic
from .config import ElasticConfigError, GPUElastic
from .manager import ElasticManager, topology_problem
from .policy import Decision, ElasticView, default_policy
from .provider import CommandProvider, Provider, ProviderError, StartedNode

__all__ = [
    "CommandProvider",
    "Decision",
    "ElasticConfigError",
    "ElasticManager",
    "ElasticView",
    "GPUElastic",
    "Provider",
    "ProviderError",
    "StartedNode",
    "attach_elastic",
    "default_policy",
    "topology_problem",
]
