"""The ``gpuspawner`` hub service (``/services/gpuspawner/``): REST API, admin GPU map and
Prometheus metrics over the hub process's placement ledger. See ``app.py`` for the design
(it runs inside the hub process, one source of truth) and ``docs/service.md`` for its use."""

from .app import ADMIN_SCOPE, GPUService, hub_cluster
from .configure import configure_service
from .openapi import openapi_document
from .views import (
    allocation_views,
    map_view,
    node_views,
    schema_list_view,
    schema_view,
    usage_view,
)

__all__ = ["ADMIN_SCOPE", "GPUService", "allocation_views", "configure_service", "hub_cluster",
           "map_view", "node_views", "openapi_document", "schema_list_view", "schema_view",
           "usage_view"]
