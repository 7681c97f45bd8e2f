"""SlurmBackend: each server a Slurm batch job pinned to its allocation.

Configured as ``c.SlurmBackend.*`` with ``c.GPUSpawner.backend = "slurm"`` (docs/slurm.md).
The hub runs the Slurm commands (:class:`~gpuspawner.backends.slurm.commands.SlurmClient`)
as root: ``sbatch --uid/--gid`` submits as the user (sbatch(1): "user root only").

Launch (:meth:`SlurmBackend.launch`): ``sbatch --hold`` with the options of
:func:`~gpuspawner.backends.slurm.job.plan_job` and the script of
:func:`~gpuspawner.backends.slurm.job.job_script`; ``scontrol update AdminComment=`` with the
allocation; ``scontrol release``; wait (``submit_timeout``) for RUNNING; read back
``scontrol show job -d``: node, ``CPU_IDs`` and GRES ``IDX`` must be the allocation's (exact
mode), else the job is cancelled and :class:`LaunchFailed` raised; wait (``port_timeout``) for
the port the server reports itself once it listens, with its own API token (:mod:`.ports`,
never through a field other users read); return (the node's ``host``, that port).

Per-server ``state`` keys: ``node``, ``job_id``, ``submitted`` (seconds since the epoch),
``started`` (True once RUNNING was seen), ``output`` (the job's output file pattern),
``port``, and ``picked`` (what Slurm granted, :func:`~.job.picked`: in model mode the devices
the ledger should adopt).

Notebook jobs (docs/jobs.md; a launch spec with port 0, from
:class:`~gpuspawner.hub.jobs.runner.JobRunner`) run the same way without a port: the job
script ``exec``\\ s ``job_python -c`` :mod:`gpuspawner.jobs.execute` (papermill), ``--time`` is
the job's time limit plus ``job_time_margin``, and the hub reads the job's log and result
from its output file (:meth:`~.readback.JobReadback.read_output`, as the job's user), then
removes the file. Their ``state`` also has ``kind`` ("job"), ``name``, ``uid``, ``gid`` and
``output_path`` (the output file, as Slurm expanded it).

The hub's environment never reaches a job: the commands run with ``PATH`` and ``SLURM_CONF``
only (sbatch exports the submitting environment to the job), and the job script sets the
server's environment from the spec.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, default, validate

from ...placement import Allocation, Node
from ..base import (
    Backend,
    BackendUnavailable,
    LaunchRefused,
    Managed,
    ServerRef,
)
from ..spec import LaunchSpec
from .commands import SlurmClient, SlurmError, parse_nodes
from .common import HOLDING, CleanEnvClient, SlurmConfigError, controller_down
from .gres import gres_type
from .job import (
    ADMIN_MARKER,
    SUBMIT_MARKER,
    check_extra_options,
)
from .node_events import NodeEvents
from .output import OutputReads, check_output_settings
from .readback import JobReadback
from .rest import REST_EXTRA_KEYS, SlurmRestClient
from .submit import JobSubmission

__all__ = ["SlurmBackend", "SlurmConfigError", "controller_down"]

class SlurmBackend(JobSubmission, JobReadback, NodeEvents, Backend):
    """Run each server as a Slurm batch job on its allocation's node."""

    backend_name = "slurm"

    slurm_conf = Unicode(
        help="""Path of the cluster's slurm.conf, given to every Slurm command as SLURM_CONF.
        Default: the hub's SLURM_CONF environment variable ("" = Slurm's built-in default).""",
    ).tag(config=True)

    @default("slurm_conf")
    def _default_conf(self) -> str:
        return os.environ.get("SLURM_CONF", "")

    bin_dir = Unicode(
        "", help="Directory of sbatch, squeue, scontrol, scancel on the hub and the nodes "
        '("" = PATH).',
    ).tag(config=True)

    gpu_mode = Enum(
        ["exact", "model"], default_value="exact",
        help="""How GPUs are requested. "exact": each GPU by its own GRES type (gres.conf from
        `gpuspawner slurm-gres`, one Type per GPU UUID), so the job gets exactly the GPUs the
        ledger chose, and the launch checks Slurm's IDX and CPU_IDs against the allocation.
        "model": `--gres=gpu:<model>:N` on the allocation's node (gres.conf with model types);
        Slurm picks the devices, and what it picked is recorded in the server's state.""",
    ).tag(config=True)

    partition = Unicode("", help='sbatch --partition ("" = the default partition).').tag(
        config=True)

    time_limit = Unicode(
        "", help='sbatch --time, e.g. "8:00:00" ("" = the partition\'s default).',
    ).tag(config=True)

    server_command = Unicode(
        help="""Absolute path of jupyterhub-singleuser on the nodes; replaces a bare
        `jupyterhub-singleuser` as the first word of the spawner's cmd (a job does not get the
        hub's PATH). Default: the hub's own sys.prefix/bin/jupyterhub-singleuser.""",
    ).tag(config=True)

    @default("server_command")
    def _default_server_command(self) -> str:
        return os.path.join(sys.prefix, "bin", "jupyterhub-singleuser")

    python = Unicode(
        help="""Absolute path of a Python 3 on the nodes; the job script uses it (standard
        library only) to pick a free port and to report it to the hub once the server listens
        there. Default: the hub's own interpreter.""",
    ).tag(config=True)

    @default("python")
    def _default_python(self) -> str:
        return sys.executable

    job_python = Unicode(
        help="""Absolute path of the Python 3 on the nodes that runs notebook jobs
        (``python -c`` :mod:`gpuspawner.jobs.execute`, docs/jobs.md): it needs papermill,
        ipykernel (the notebooks' ``python3`` kernel) and nbconvert (the HTML export), e.g. a
        virtual environment on the shared file system (``scripts/slurm-jobenv.sh`` makes one
        for the test cluster). Default: ``python``.""",
    ).tag(config=True)

    @default("job_python")
    def _default_job_python(self) -> str:
        return self.python

    job_time_margin = Int(
        60, help="""Seconds added to a notebook job's time limit for its sbatch ``--time``
        (rounded up to whole minutes): the hub stops a job at its limit itself; Slurm's limit
        is the backstop while the hub is down.""",
    ).tag(config=True)

    extra_sbatch_options = List(
        Unicode(),
        help="""Extra sbatch options (admin only, never from users), e.g. ["--account=jhub",
        "--qos=interactive"]. Options the backend sets (--uid, --gres, --nodelist, --mem, ...)
        are refused.""",
    ).tag(config=True)

    job_prologue = List(
        Unicode(), help="Shell lines the job script runs before the server (admin only), "
        'e.g. ["module load cuda/12"].',
    ).tag(config=True)

    output = Unicode(
        "",
        help="""sbatch --output pattern (%x job name, %j job id) on the node; "" (the default)
        is ``<output_dir>/<uid>/%x-%j.out``, in a folder 0700 of the job's user that the hub
        makes before each submission, where no other user can create the file first, link
        it, read it or append to it. The hub reads a server's last lines when it dies during
        start, and a notebook job's log and result: put it on a file system the hub shares.
        A pattern whose folder other accounts may write (like /tmp) is refused at start.""",
    ).tag(config=True)

    output_dir = Unicode(
        "/var/lib/gpuspawner/slurm-output",
        help="""Folder of the users' output folders (``<uid>/``, each 0700 of its user, made by
        the hub) when ``output`` is "": root's, writable by no other account (the hub makes it
        0711 when it is missing), on a file system the hub and the nodes share.""",
    ).tag(config=True)

    output_read_threads = Int(
        4, help="""Threads of the hub's own executor that reads job output files (a notebook
        job's log and result, a dead server's last lines): never the threads the hub needs
        for spawns.""",
    ).tag(config=True)

    output_reads_per_user = Int(
        2, help="""Reads of one user's output files at a time; more wait their turn (within
        ``output_read_timeout``), so no user can hold all of ``output_read_threads``.""",
    ).tag(config=True)

    output_read_timeout = Float(
        10.0, help="""Seconds one read of a job's output file may take, waiting for its turn
        included: the read itself stops then (a FIFO or a link is refused at once).""",
    ).tag(config=True)

    allow_plain_http = Bool(
        False,
        help="""Allow a hub without ``c.JupyterHub.internal_ssl``. Jobs share their node's
        network namespace (Slurm has no network isolation; Backend.AI's Sokovan notes gives
        the same reason), so any process on the node can connect to a user's server port:
        with internal_ssl the hub, the proxy and the server verify each other's certificates
        and other connections fail the TLS handshake. Only for a test cluster with one
        trusted user.""",
    ).tag(config=True)

    @property
    def requires_internal_ssl(self) -> bool:
        """True unless ``allow_plain_http``: the hub refuses to start without internal_ssl."""
        return not self.allow_plain_http

    listen_address = Unicode(
        "127.0.0.1",
        help="""Address servers bind (the spawner's `ip` default). Jobs share their node's
        network namespace: the test cluster's nodes are all on this host's loopback. A real
        site sets the nodes' own address (or 0.0.0.0) and relies on internal_ssl.""",
    ).tag(config=True)

    submit_timeout = Float(
        60.0, help="Seconds a submitted job may take to be RUNNING before the spawn fails.",
    ).tag(config=True)

    port_timeout = Float(
        30.0, help="Seconds a running job's server may take to listen and report its port.",
    ).tag(config=True)

    stop_timeout = Float(
        30.0, help="Seconds stop waits for a cancelled job to leave the queue.",
    ).tag(config=True)

    command_timeout = Float(
        30.0, help="Seconds one Slurm command may take (then the controller counts as down).",
    ).tag(config=True)

    node_state_max_age = Float(
        3.0,
        help="""Seconds one ``scontrol show node`` answer serves ``poll`` for every server:
        polling many servers asks Slurm for its node states at most once per this period
        (``scontrol show job -d`` stays one call per server).""",
    ).tag(config=True)

    submit_via = Enum(
        ["cli", "rest"], default_value="cli",
        help="""How a server's job is submitted. "cli" (the default): ``sbatch --uid/--gid``
        on the hub host, which must then run as root (sbatch(1): --uid is for root only).
        "rest": ``POST /slurm/v0.0.38/job/submit`` to slurmrestd (``rest_url``) with a JWT of
        root or SlurmUser that names the user in ``X-SLURM-USER-NAME`` (Slurm 22.05's
        openapi/v0.0.38; docs/slurm-backend.md "Submitting through slurmrestd" says what
        v0.0.38 cannot express). Either way the backend marks, releases, reads back and
        cancels the job with scontrol and scancel.""",
    ).tag(config=True)

    rest_url = Unicode(
        "", help='slurmrestd\'s base URL for submit_via = "rest", e.g. "http://127.0.0.1:6820".',
    ).tag(config=True)

    rest_token = Unicode(
        help="""A JWT of root or SlurmUser for slurmrestd (``scontrol token
        username=slurm lifespan=...``). Default: the hub's SLURM_JWT environment variable;
        "" makes the hub ask ``scontrol token username=<rest_token_user>
        lifespan=<rest_token_lifespan>`` itself and renew it at half its life.""",
    ).tag(config=True)

    @default("rest_token")
    def _default_rest_token(self) -> str:
        return os.environ.get("SLURM_JWT", "")

    rest_token_user = Unicode(
        "root", help="Whose token the hub makes when rest_token is empty (root or SlurmUser: "
        "only their tokens may submit for another user).",
    ).tag(config=True)

    rest_token_lifespan = Int(
        3600, help="Seconds a token the hub makes lives (scontrol token lifespan=).",
    ).tag(config=True)

    rest_node_constraint = Unicode(
        "",
        help="""A node feature template that pins a REST job to its node ("{node}" is the
        node's name), e.g. "{node}" with slurm.conf ``Features=node1`` on node1. slurmrestd
        v0.0.38 has no node list: without this, only a per-device GRES type (exact mode with
        GPUs) pins the node, and other jobs are refused.""",
    ).tag(config=True)

    @validate("extra_sbatch_options")
    def _validate_extra(self, proposal: Any) -> list[str]:
        try:
            check_extra_options(proposal.value)
        except ValueError as e:
            raise TraitError(f"SlurmBackend.extra_sbatch_options: {e}") from None
        return proposal.value

    @validate("job_time_margin")
    def _validate_margin(self, proposal: Any) -> int:
        if proposal.value < 0:
            raise TraitError(f"SlurmBackend.job_time_margin: must be >= 0 seconds, got "
                             f"{proposal.value}")
        return proposal.value

    @validate("output_read_threads", "output_reads_per_user")
    def _validate_reads(self, proposal: Any) -> int:
        if proposal.value < 1:
            raise TraitError(f"SlurmBackend.{proposal.trait.name}: must be >= 1, got "
                             f"{proposal.value}")
        return proposal.value

    @validate("submit_timeout", "port_timeout", "stop_timeout", "command_timeout",
              "output_read_timeout")
    def _validate_positive(self, proposal: Any) -> float:
        if not proposal.value > 0:
            raise TraitError(f"SlurmBackend.{proposal.trait.name}: must be > 0 seconds, got "
                             f"{proposal.value}")
        return proposal.value

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client: SlurmClient | None = None
        self._rest: SlurmRestClient | None = None
        self._token: tuple[str, float] = ("", 0.0)  # (made token, renew after: monotonic s)
        self._nodes_cache: tuple[float, dict[str, Any]] | None = None
        self._nodes_lock: tuple[Any, asyncio.Lock] | None = None  # (its event loop, lock)
        self._output_reads: OutputReads | None = None

    @property
    def client(self) -> SlurmClient:
        """The Slurm command client (made on first use from the traits)."""
        if self._client is None:
            self._client = CleanEnvClient(conf=self.slurm_conf or None,
                                          timeout=self.command_timeout,
                                          bin_dir=self.bin_dir or None)
        return self._client

    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    @property
    def rest(self) -> SlurmRestClient:
        """The slurmrestd client (made on first use from the traits)."""
        if self._rest is None:
            self._rest = SlurmRestClient(self.rest_url, self._rest_jwt,
                                         timeout=self.command_timeout)
        return self._rest

    # -- configuration ----------------------------------------------------------------------
    def check_config(self) -> None:
        """At hub start: slurm_conf exists, server_command and python are absolute paths,
        and every bound node is known to Slurm (``scontrol show node``) with, in exact mode,
        the GRES type of each of its GPUs. A controller that does not answer is logged, not
        fatal (the hub may start before it).

        Raises:
            SlurmConfigError: a ``c.SlurmBackend.*`` setting that is wrong.
            ValueError: the node entry and field that is wrong.
        """
        if self.slurm_conf and not os.path.isfile(self.slurm_conf):
            raise SlurmConfigError(f"SlurmBackend.slurm_conf: no such file "
                                   f"{self.slurm_conf!r}")
        for trait in ("server_command", "python", "job_python"):
            if not getattr(self, trait).startswith("/"):
                raise SlurmConfigError(f"SlurmBackend.{trait}: must be an absolute path, got "
                                       f"{getattr(self, trait)!r}")
        check_output_settings(self.output, self.output_dir)
        if self.submit_via == "rest":
            if not self.rest_url.startswith(("http://", "https://")):
                raise SlurmConfigError("SlurmBackend.rest_url: submit_via is \"rest\": give "
                                       f"slurmrestd's http(s) URL, got {self.rest_url!r}")
            for opt in self.extra_sbatch_options:
                key = opt.partition("=")[0].lstrip("-").replace("-", "_")
                if key not in REST_EXTRA_KEYS:
                    raise SlurmConfigError(
                        f"SlurmBackend.extra_sbatch_options: {opt!r} has no slurmrestd "
                        f"v0.0.38 job property (submit_via = \"rest\" passes on "
                        f"{', '.join(sorted(REST_EXTRA_KEYS))})")
            if self.rest_node_constraint:
                try:
                    self.rest_node_constraint.format(node="x")
                except (KeyError, IndexError, ValueError) as e:
                    raise SlurmConfigError(f"SlurmBackend.rest_node_constraint: "
                                           f"{self.rest_node_constraint!r}: {e!r}") from None
        if not self.nodes:
            return
        try:
            proc = subprocess.run([self._cmd("scontrol"), "show", "node"], capture_output=True,
                                  text=True, timeout=self.command_timeout,
                                  env=CleanEnvClient(self.slurm_conf or None)._env(), check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.log.warning("SlurmBackend: cannot ask Slurm for its nodes at start: %s", e)
            return
        if proc.returncode != 0:
            err = SlurmError(["scontrol", "show", "node"], proc.returncode, proc.stderr.strip())
            if controller_down(err):
                self.log.warning("SlurmBackend: Slurm controller does not answer at start: %s",
                                 err)
                return
            raise SlurmConfigError(f"SlurmBackend: {err}")
        known = {n.name: n for n in parse_nodes(proc.stdout)}
        for i, rt in enumerate(self.nodes.values()):
            where = f"nodes[{i}] ({rt.name})"
            info = known.get(rt.name)
            if info is None:
                raise ValueError(f"{where}.name: Slurm does not know node {rt.name!r} "
                                 f"(scontrol show node lists {', '.join(sorted(known))})")
            if self.gpu_mode == "exact":
                types = {e.split("(")[0].split(":")[1].lower() for e in info.gres.split(",")
                         if e.count(":") >= 2}
                for g in rt.node.gpus:
                    if gres_type(g.uuid) not in types:
                        raise ValueError(
                            f"{where}.topology: GPU {g.uuid} has no GRES type "
                            f"{gres_type(g.uuid)} in Slurm's Gres= of {rt.name} (write "
                            "gres.conf and Gres= with `gpuspawner slurm-gres`)")
            if info.cpus and rt.node.cpu_count > info.cpus:
                raise ValueError(f"{where}.topology: {rt.node.cpu_count} CPUs, Slurm's "
                                 f"CPUTot is {info.cpus}")

    @property
    def listen_ip(self) -> str:
        """``listen_address``: jobs share their node's network namespace."""
        return self.listen_address

    def cert_alt_names(self, alloc: Allocation, state: Mapping[str, Any]) -> list[str]:
        """The node's host address (the server listens in the node's own namespace)."""
        rt = self.nodes.get(alloc.node)
        if rt is None:
            return []
        host = rt.host
        return [f"IP:{host}" if host[:1].isdigit() or ":" in host else f"DNS:{host}"]

    # -- helpers --------------------------------------------------------------------------------
    async def _ask(self, node: str, coro: Any) -> Any:
        """Await a client call; any :class:`SlurmError` becomes BackendUnavailable(node)."""
        try:
            return await coro
        except SlurmError as e:
            raise BackendUnavailable(node, e, "Slurm controller") from None

    def _node(self, name: str) -> Node:
        rt = self.nodes.get(name)
        if rt is None:
            raise LaunchRefused(f"node {name} is not configured (c.GPUSpawner.nodes)")
        return rt.node

    def _command(self, spec: LaunchSpec) -> LaunchSpec:
        """The spec with a bare ``jupyterhub-singleuser`` replaced by ``server_command``, and
        a notebook job's bare ``python3`` (port 0) by ``job_python``."""
        if spec.cmd and spec.cmd[0] == "jupyterhub-singleuser":
            return replace(spec, cmd=(self.server_command, *spec.cmd[1:]))
        if spec.port == 0 and spec.cmd and spec.cmd[0] in ("python3", "python"):
            return replace(spec, cmd=(self.job_python, *spec.cmd[1:]))
        return spec

    # -- one server -------------------------------------------------------------------------
    async def prepare(self, server: ServerRef, alloc: Allocation, state: dict[str, Any]
                      ) -> dict[str, Any]:
        """Nothing to make before the job; records the node."""
        return dict(state, node=alloc.node)

    async def stop(self, state: Mapping[str, Any], now: bool = False) -> None:
        """scancel the job (``now``: SIGKILL at once) and wait, at most ``stop_timeout``
        seconds, until it left squeue (a job whose node is dead may stay COMPLETING: then
        it is logged and left to Slurm).

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return
        await self._ask(node, self.client.scancel(int(job_id), "KILL" if now else None))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout
        delay = 0.1
        while int(job_id) in await self._ask(node, self.client.squeue([int(job_id)])):
            if loop.time() >= deadline:
                self.log.warning("node %s: Slurm job %s still in the queue %g s after scancel",
                                 node, job_id, self.stop_timeout)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    async def cleanup(self, alloc: Allocation | None, state: Mapping[str, Any]) -> None:
        """scancel the job ``state`` names, if any; a notebook job's output file, which the
        hub has read by now, is removed (:meth:`remove_output`). Never raises."""
        job_id = state.get("job_id")
        if job_id:
            try:
                await self.client.scancel(int(job_id))
            except Exception as e:
                self.log.warning("node %s: scancel %s failed: %s", state.get("node", "?"),
                                 job_id, e)
        await self.remove_output(state)

    async def remove_server(self, node: str, server: ServerRef) -> None:
        """Cancel the jobs named ``server.name`` that carry this user and server in their
        allocation, or that were submitted by us and not yet marked (an interrupted launch:
        held, ``Comment=gpuspawner-submitted:...``).

        Raises:
            BackendUnavailable.
        """
        for job, text in await self._our_jobs(node):
            if job.name != server.name or job.state not in HOLDING:
                continue
            if text is not None:
                owner = json.loads(text).get("owner") or {}
                mine = (owner.get("user"), owner.get("server", "")) == (server.user,
                                                                         server.server)
            else:
                mine = job.comment.startswith(SUBMIT_MARKER) and not job.fields.get(
                    "AdminComment", "").startswith(ADMIN_MARKER)
            if mine:
                self.log.info("node %s: cancelling Slurm job %s of %s", node, job.job_id,
                              server.name)
                await self._ask(node, self.client.scancel(job.job_id))

    # -- the whole cluster ---------------------------------------------------------------------
    async def remove_managed(self, found: Managed) -> None:
        """scancel the job. Never raises."""
        try:
            await self.client.scancel(int(found.handle))
        except Exception as e:
            self.log.warning("node %s: scancel %s failed: %s", found.node, found.handle, e)
