"""Attaching the elastic nodes to the hub's cluster at start (:func:`attach_elastic`): the
Docker backend's manager (:class:`~gpuspawner.elastic.manager.ElasticManager`, with its
providers) or the Slurm backend's (:class:`~gpuspawner.elastic.slurm.SlurmPowerManager`,
Slurm's power saving)."""

from __future__ import annotations

import os
from typing import Any

from ..placement import Node
from .config import ElasticConfigError, GPUElastic, elastic_settings
from .manager import ELASTIC_FILE_NAME, ElasticManager, topology_problem
from .provider import Provider, provider_class
from .slurm import SlurmPowerManager, check_slurm_providers

__all__ = ["attach_elastic"]


def attach_elastic(cluster: Any, config: Any, state_dir: str) -> ElasticManager | None:
    """Make the hub's elastic manager when ``c.GPUSpawner.nodes`` has elastic entries (at hub
    start, after the cluster is built): check ``c.GPUElastic`` and the providers' settings,
    bind the backend to the running nodes, load the state file
    (``gpuspawner-elastic.json`` in ``state_dir`` unless ``c.GPUElastic.state_file``).

    Returns:
        the manager, or None without elastic nodes.
    Raises:
        ElasticConfigError: the setting or node entry that is wrong.
    """
    cats: dict[str, list[str]] = {}
    provs: dict[str, str] = {}
    shapes: dict[str, Node] = {}
    for i, (name, rt) in enumerate(cluster.nodes.items()):
        el = rt.extra.get("elastic")
        if not el:
            continue
        c = el["category"]
        if c in shapes:
            problem = topology_problem(shapes[c], rt.node)
            if problem:
                raise ElasticConfigError(
                    f"nodes[{i}] ({name}).topology: category {c}'s nodes "
                    f"share one topology; this one has {problem}"
                )
        shapes.setdefault(c, rt.node)
        cats.setdefault(c, []).append(name)
        provs[el["provider"]] = name
    if not cats:
        return None
    backend_name = getattr(cluster.backend, "backend_name", "")
    try:
        check_slurm_providers(provs, backend_name)
    except ValueError as e:
        raise ElasticConfigError(str(e)) from None
    if backend_name == "slurm":  # Slurm's power saving starts and stops them (elastic/slurm.py)
        conf = GPUElastic(config=config) if config is not None else GPUElastic()
        slurm_manager = SlurmPowerManager(cluster, elastic_settings(conf, cats, ""))
        slurm_manager.attach()
        return slurm_manager
    if backend_name != "docker":
        raise ElasticConfigError("GPUSpawner.nodes: elastic nodes need the docker backend "
                                 "(or the slurm backend, with provider \"slurm\")")
    providers: dict[str, Provider] = {}
    for pname, node in provs.items():
        try:
            cls = provider_class(pname)
            p = cls(config=config) if config is not None else cls()
            check = getattr(p, "check_config", None)
            if check is not None:
                check()
        except ValueError as e:
            raise ElasticConfigError(f"node {node}'s provider: {e}") from None
        providers[pname] = p
    conf = GPUElastic(config=config) if config is not None else GPUElastic()
    default_file = os.path.join(state_dir, ELASTIC_FILE_NAME) if state_dir else ""
    settings = elastic_settings(conf, cats, default_file)
    manager = ElasticManager(cluster, settings, providers)
    manager.attach()
    return manager
