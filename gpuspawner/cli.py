"""The ``gpuspawner`` command.

Subcommands:

* ``gpuspawner inventory [--name NAME] [--sysfs-root DIR] [--proc-root DIR] [--disk-path DIR]
  [-o FILE]``: describe this host (NUMA nodes from sysfs, GPUs from NVML) and print it as a
  topology file (``docs/topology-files.md``), ready to be copied to the hub for a remote node.
* ``gpuspawner slurm-gres --topology FILE [--topology FILE ...] --dev-dir DIR
  [--numbering {sequential,index}]``: the gres.conf of a Slurm cluster whose nodes the topology
  files describe, one GRES Type per GPU (:mod:`gpuspawner.backends.slurm.gres`), followed by one
  comment line per node, ``# slurm.conf NodeName=NAME Gres=VALUE``, giving the ``Gres=`` value
  of that node's line in slurm.conf (``scripts/slurm.sh`` reads it from there). A MIG-enabled
  GPU's instances get one line each, ``MultipleFiles=`` from the topology's ``mig[].files``
  (docs/mig.md).
* ``gpuspawner health``, ``gpuspawner drain-gpu UUID --reason TEXT``, ``gpuspawner undrain-gpu
  UUID``: GPU health of this host and drains through the hub (:mod:`gpuspawner.health_cli`).
* ``gpuspawner generate-config [--culler] [-o FILE]``: a commented ``jupyterhub_config.py``
  with every option of GPUSpawner (its JupyterHub ``Spawner`` options included), DockerBackend,
  SlurmBackend, GPULDAPAuthenticator, GPUJobs and GPUUsage (:data:`CONFIG_CLASSES`), as
  ``jupyterhub --generate-config`` writes JupyterHub's
  (:func:`generate_config`); ``--culler``: the idle culler's ``idle_culler_config.py``.
* ``gpuspawner jobs submit|list|show|cancel|output``: notebook jobs through the hub's
  gpuspawner service (:mod:`gpuspawner.jobs.client`, docs/jobs.md).
* ``gpuspawner usage [--db PATH] [--from WHEN] [--to WHEN] [--group-by KEYS] [--user NAME]
  [--tz ZONE] [--format table|json|csv]``: a usage report from the usage database
  (:mod:`gpuspawner.usage.cli`, docs/usage.md).
* ``gpuspawner simulate ...``: provided by :mod:`gpuspawner.simulate` (its ``add_arguments`` and
  ``run``, from :mod:`gpuspawner.simulate.cli`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from . import simulate
from .backends.slurm.gres import GresError, check_types, gres_conf, gres_devices, node_gres
from .health_cli import add_subcommands as _add_health
from .inventory.local import read_local_node
from .inventory.topology import TopologyError, dump_topology, load_topology_file
from .jobs.client import add_subcommands as _add_jobs
from .usage.cli import add_subcommands as _add_usage

log = logging.getLogger(__name__)


def _cmd_inventory(args: argparse.Namespace) -> int:
    try:
        node = read_local_node(args.name, sysfs_root=args.sysfs_root, proc_root=args.proc_root,
                               disk_path=args.disk_path)
    except (OSError, ValueError) as e:
        print(f"gpuspawner inventory: cannot read this host: {e}", file=sys.stderr)
        return 1
    text = dump_topology(node)
    _write(text, args.output)
    return 0


def _write(text: str, output: str | None) -> None:
    """``text`` to the file ``output``, or to stdout for None or "-"."""
    if output and output != "-":
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def _add_inventory(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inventory", help="print this host as a topology file (YAML)",
                       description="Describe this host (NUMA nodes from sysfs, GPUs from NVML) "
                       "as a gpuspawner topology file.")
    p.add_argument("--name", default=None, help="node name (default: the host name)")
    p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted (default /sys)")
    p.add_argument("--proc-root", default="/proc",
                   help="where procfs is mounted (default /proc)")
    p.add_argument("--disk-path", default=None,
                   help="a path on the container filesystem; its size is the node's disk "
                   "(default /var/lib/docker if it exists, else /)")
    p.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_inventory)


def _cmd_slurm_gres(args: argparse.Namespace) -> int:
    args.topology = list(args.topology or [])
    if not args.topology and not args.model_topology:
        print("gpuspawner slurm-gres: give --topology or --model-topology", file=sys.stderr)
        return 2  # a usage error, as argparse's
    model_files = list(args.model_topology or [])
    try:
        nodes = [load_topology_file(path) for path in [*args.topology, *model_files]]
    except TopologyError as e:
        print(f"gpuspawner slurm-gres: {e}", file=sys.stderr)
        return 1
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        print(f"gpuspawner slurm-gres: node name(s) given twice: {', '.join(dupes)}",
              file=sys.stderr)
        return 1
    dev_dir = os.path.abspath(args.dev_dir)
    modes = {n.name: ("model" if i >= len(args.topology) else "exact")
             for i, n in enumerate(nodes)}
    sources = ", ".join([*args.topology, *model_files])
    lines = [f"# gres.conf made by gpuspawner slurm-gres from {sources}",
             "# one GRES Type per GPU, derived from its UUID (gpuspawner.backends.slurm.gres)",
             "AutoDetect=off"]
    try:
        # per-GPU types are cluster-wide
        check_types(u for n in nodes if modes[n.name] == "exact" for u, _g, _m in gres_devices(n))
        number = 0
        for node in nodes:
            files = {}
            for g in sorted(node.gpus, key=lambda g: g.index):
                n = number if args.numbering == "sequential" else g.index
                files[g.uuid] = os.path.join(dev_dir, f"nvidia{n}")
                number += 1
            lines.extend(gres_conf(node, files, modes[node.name]))
        for node in nodes:
            gres = node_gres(node, modes[node.name])
            if gres:
                lines.append(f"# slurm.conf NodeName={node.name} Gres={gres}")
    except GresError as e:
        print(f"gpuspawner slurm-gres: {e}", file=sys.stderr)
        return 1
    text = "\n".join(lines) + "\n"
    _write(text, args.output)
    return 0


def _add_slurm_gres(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slurm-gres", help="gres.conf (one GRES Type per GPU) from topology files",
                       description="Print the gres.conf of a Slurm cluster described by topology "
                       "files, one GRES Type per GPU derived from its UUID, and per node the "
                       "Gres= value for slurm.conf as a '# slurm.conf NodeName=N Gres=V' line.")
    p.add_argument("--topology", action="append", metavar="FILE",
                   help="a node's topology file (docs/topology-files.md); repeat per node")
    p.add_argument("--model-topology", action="append", metavar="FILE",
                   help="a node whose GPUs get their model as GRES Type (the Slurm backend's "
                   "gpu_mode 'model'); repeat per node; numbered after the --topology ones")
    p.add_argument("--dev-dir", required=True, metavar="DIR",
                   help="directory of the GPU device files nvidiaN (/dev on a real node)")
    p.add_argument("--numbering", choices=("sequential", "index"), default="sequential",
                   help="N of nvidiaN: 'sequential' numbers the GPUs of all nodes one after "
                   "the other (nodes sharing one host, as scripts/slurm.sh runs them); 'index' "
                   "uses each GPU's index on its own node (default: sequential)")
    p.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_slurm_gres)


#: (module, class) of the hub's configurable classes in ``gpuspawner generate-config``
CONFIG_CLASSES = (("gpuspawner.hub.spawner", "GPUSpawner"),
                  ("gpuspawner.backends.docker_backend", "DockerBackend"),
                  ("gpuspawner.backends.slurm.backend", "SlurmBackend"),
                  ("gpuspawner.hub.auth", "GPULDAPAuthenticator"),
                  ("gpuspawner.hub.jobs.settings", "GPUJobs"),
                  ("gpuspawner.usage.settings", "GPUUsage"))


def generate_config(culler: bool = False) -> str:
    """A commented configuration file, every option with its help and default, written by
    traitlets' ``Configurable.class_config_section`` as ``jupyterhub --generate-config``
    writes JupyterHub's.

    Each class's section holds all its options under its own name (``c.GPUSpawner.*`` with
    the ``Spawner`` options it inherits; ``c.GPULDAPAuthenticator.*`` with ldapauthenticator's
    and JupyterHub's ``Authenticator`` options). ``Spawner`` options that GPUSpawner ignores
    (:data:`~gpuspawner.hub.config_check.IGNORED_SPAWNER_OPTIONS`) carry the profile field that
    replaces them instead of JupyterHub's help: setting one stops the hub.

    Args:
        culler: the idle culler's ``idle_culler_config.py`` (``c.IdleCuller.*``) instead.
    """
    # the hub's classes need the optional "hub" dependencies (jupyterhub ...); the other
    # subcommands run without them, so they are imported here, not at the top
    from .hub.config_check import IGNORED_SPAWNER_OPTIONS

    if culler:
        from idle_culler.app import IdleCuller  # (optional: jupyterhub, traitlets, tornado)

        classes: list[type] = [IdleCuller]
        head = ["# Configuration file of the idle culler (idle_culler_config.py in its working",
                "# directory; command-line options win). Made by: gpuspawner generate-config "
                "--culler"]
    else:
        classes, missing = [], []
        for module, name in CONFIG_CLASSES:
            try:
                classes.append(getattr(importlib.import_module(module), name))
            except ImportError as e:  # the LDAP authenticator without ldapauthenticator
                missing.append(f"# {name}: not installed here ({e})")
        head = ["# gpuspawner options for jupyterhub_config.py: GPUSpawner, its backends, the",
                "# LDAP authenticator, notebook jobs and usage accounting. Made by: gpuspawner",
                "# generate-config.",
                "# JupyterHub's own options (c.JupyterHub.*): jupyterhub --generate-config.",
                *missing]
    lines = [*head, "", "c = get_config()  # noqa", ""]
    for cls in classes:
        blocks = cls.class_config_section(classes).split("\n\n")
        for i, block in enumerate(blocks):
            for trait, field in IGNORED_SPAWNER_OPTIONS.items():
                tail = f"# c.{cls.__name__}.{trait} = "
                if cls.__name__ == "GPUSpawner" and tail in block:
                    setting = block[block.index(tail):]
                    blocks[i] = (f"## Ignored by GPUSpawner: set the profile field '{field}' "
                                 "in c.GPUSpawner.profiles.\n#  Setting it stops the hub at "
                                 f"start.\n{setting}")
        lines += ["\n\n".join(blocks), ""]
    return "\n".join(lines)


def _cmd_generate_config(args: argparse.Namespace) -> int:
    _write(generate_config(culler=args.culler), args.output)
    return 0


def _add_generate_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate-config", help="print every option as a commented config file",
                       description="Print a commented configuration file with every option of "
                       "GPUSpawner, DockerBackend, SlurmBackend, GPULDAPAuthenticator, GPUJobs, "
                       "GPUUsage (their help, defaults and units), for jupyterhub_config.py.")
    p.add_argument("--culler", action="store_true",
                   help="the idle culler's options (idle_culler_config.py) instead")
    p.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_generate_config)


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    doc = (simulate.__doc__ or "").strip()
    p = sub.add_parser("simulate", help="simulate placement of bundles on nodes",
                       description=doc.splitlines()[0] if doc else None)
    simulate.add_arguments(p)
    p.set_defaults(func=simulate.run)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with all subcommands."""
    parser = argparse.ArgumentParser(prog="gpuspawner",
                                     description="GPU-aware JupyterHub spawner tools")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v: info, -vv: debug) on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_inventory(sub)
    _add_slurm_gres(sub)
    _add_health(sub)
    _add_generate_config(sub)
    _add_jobs(sub)
    _add_usage(sub)
    _add_simulate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gpuspawner`` command.

    Args:
        argv: arguments without the program name; None reads ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 when the subcommand failed, 2 for usage errors.
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse exits on usage errors and --help
        return int(e.code) if isinstance(e.code, int) else 2
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
