"""SlurmBackend: each server a Slurm batch job pinned to its allocation (issue 14).

Configured as ``c.SlurmBackend.*`` with ``c.GPUSpawner.backend = "slurm"`` (docs/slurm.md).
The hub runs the Slurm commands (:class:`~gpuspawner.backends.slurm.commands.SlurmClient`)
as root: ``sbatch --uid/--gid`` submits as the user (sbatch(1): "user root only").

Launch (:meth:`SlurmBackend.launch`): ``sbatch --hold`` with the options of
:func:`~gpuspawner.backends.slurm.job.plan_job` and the script of
:func:`~gpuspawner.backends.slurm.job.job_script`; ``scontrol update AdminComment=`` with the
allocation; ``scontrol release``; wait (``submit_timeout``) for RUNNING; read back
``scontrol show job -d``: node, ``CPU_IDs`` and GRES ``IDX`` must be the allocation's (exact
mode), else the job is cancelled and :class:`LaunchFailed` raised; wait (``port_timeout``) for
the port the job reports in its ``Comment``; return (the node's ``host``, that port).

Per-server ``state`` keys: ``node``, ``job_id``, ``submitted`` (seconds since the epoch),
``started`` (True once RUNNING was seen), ``output`` (the job's output file pattern),
``port``, and ``picked`` (what Slurm granted, :func:`~.job.picked`: in model mode the devices
the ledger should adopt).

The hub's environment never reaches a job: the commands run with ``PATH`` and ``SLURM_CONF``
only (sbatch exports the submitting environment to the job), and the job script sets the
server's environment from the spec.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, default, validate

from ...placement import Allocation, Node, PlacementError
from ..base import (
    Backend,
    BackendUnavailable,
    LaunchFailed,
    LaunchRefused,
    Managed,
    Progress,
    ServerRef,
)
from ..spec import LaunchSpec
from .commands import JobInfo, SlurmClient, SlurmError, parse_jobs, parse_nodes
from .gres import gres_type
from .job import (
    ADMIN_MARKER,
    SUBMIT_MARKER,
    admin_comment,
    allocation_of,
    check_extra_options,
    check_readback,
    job_script,
    picked,
    plan_job,
    reported_port,
)
from .rest import REST_EXTRA_KEYS, SlurmRestClient, job_properties

#: words in a Slurm command's stderr that mean the controller did not answer
_DOWN = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
         "Zero Bytes were transmitted", "Communication connection failure",
         "Could not establish a configuration source", "Unable to process configuration")
#: sbatch refusals that mean "cannot run on this node as configured" (HTTP 400, not 500)
_REFUSED = ("Requested node configuration is not available", "Invalid generic resource",
            "Requested partition configuration not available", "Invalid node name",
            "Memory required by task is not available", "More processors requested")
#: job states a server of ours may be in while it holds (or is about to hold) its allocation
_HOLDING = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED"})


class SlurmConfigError(TraitError, ValueError):
    """A wrong ``c.SlurmBackend.*`` setting found at start (the message names it). A
    TraitError, so the hub's configuration check reports it under the backend's own name, not
    under ``GPUSpawner.nodes``."""


def controller_down(e: SlurmError) -> bool:
    """Whether a failed command means the controller (or the commands) cannot be reached, as
    opposed to a refusal: it timed out or did not start, or printed one of :data:`_DOWN`."""
    return e.returncode is None or any(w in e.stderr for w in _DOWN)


class _Client(SlurmClient):
    """A :class:`SlurmClient` whose commands see only ``PATH`` and ``SLURM_CONF``: sbatch
    copies its environment into the job (``--export=ALL``), and the hub's (proxy token,
    cookie secret, database URL) must not reach a user's job."""

    def _env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
               "LANG": "C.UTF-8"}
        conf = self.conf or os.environ.get("SLURM_CONF", "")
        if conf:
            env["SLURM_CONF"] = conf
        return env


class SlurmBackend(Backend):
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
        library only) to pick a free port. Default: the hub's own interpreter.""",
    ).tag(config=True)

    @default("python")
    def _default_python(self) -> str:
        return sys.executable

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
        "/tmp/gpuspawner-%x-%j.out",
        help="""sbatch --output pattern (%x job name, %j job id) on the node. The hub reads
        its last lines when a server dies during start: put it on a file system the hub
        shares (it is read as the hub's user).""",
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
        30.0, help="Seconds a running job may take to report its port.",
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

    @validate("submit_timeout", "port_timeout", "stop_timeout", "command_timeout")
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

    @property
    def client(self) -> SlurmClient:
        """The Slurm command client (made on first use from the traits)."""
        if self._client is None:
            self._client = _Client(conf=self.slurm_conf or None, timeout=self.command_timeout,
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

    async def _rest_jwt(self, renew: bool = False) -> str:
        """``rest_token``, or one made by ``scontrol token`` and kept until half its life
        (``renew``: make a new one; a given ``rest_token`` is returned as it is).

        Raises:
            SlurmError: scontrol token failed or printed no ``SLURM_JWT=``.
        """
        if self.rest_token:
            return self.rest_token
        token, renew_at = self._token
        if token and not renew and time.monotonic() < renew_at:
            return token
        out = await self.client.run("scontrol", "token", f"username={self.rest_token_user}",
                                    f"lifespan={self.rest_token_lifespan}")
        token = out.strip().partition("SLURM_JWT=")[2].split()[0] if "SLURM_JWT=" in out else ""
        if not token:
            raise SlurmError(["scontrol", "token"], 0, "printed no SLURM_JWT=")
        self._token = (token, time.monotonic() + self.rest_token_lifespan / 2)
        return token

    def _rest_job(self, plan: Any, alloc: Allocation) -> dict[str, Any]:
        """The v0.0.38 job properties of ``plan`` (:func:`~.rest.job_properties`).

        Raises:
            ValueError: the job cannot be expressed (see job_properties).
        """
        constraint = (self.rest_node_constraint.format(node=alloc.node)
                      if self.rest_node_constraint else "")
        return job_properties(plan.options, self.client._env(), node=alloc.node,
                              node_constraint=constraint)

    async def _submit(self, script: str, plan: Any, spec: LaunchSpec) -> int:
        """Submit the job by ``submit_via``; its id.

        Raises:
            SlurmError: sbatch or slurmrestd refused it or could not be reached.
            LaunchRefused: REST: the uid has no name on the hub host, or its primary group is
                not the spec's gid (v0.0.38 has no --gid).
        """
        if self.submit_via == "cli":
            return await self.client.sbatch(script, plan.options, user=str(spec.uid),
                                            group=str(spec.gid))
        try:
            pw = pwd.getpwuid(spec.uid)
        except KeyError:
            raise LaunchRefused(f"uid {spec.uid} has no user name on the hub host "
                                "(slurmrestd takes a name)") from None
        if pw.pw_gid != spec.gid:
            raise LaunchRefused(f"gid {spec.gid} is not the primary group of {pw.pw_name} "
                                f"({pw.pw_gid}); slurmrestd v0.0.38 cannot set a job's group")
        job_id = await self.rest.submit(script, self._rest_job(plan, spec.allocation),
                                        pw.pw_name)
        self.log.info("node %s: Slurm job %s submitted through slurmrestd as %s",
                      spec.allocation.node, job_id, pw.pw_name)
        return job_id

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
        for trait in ("server_command", "python"):
            if not getattr(self, trait).startswith("/"):
                raise SlurmConfigError(f"SlurmBackend.{trait}: must be an absolute path, got "
                                       f"{getattr(self, trait)!r}")
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
                                  env=_Client(self.slurm_conf or None)._env(), check=False)
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
        """The spec with a bare ``jupyterhub-singleuser`` replaced by ``server_command``."""
        if spec.cmd and spec.cmd[0] == "jupyterhub-singleuser":
            return replace(spec, cmd=(self.server_command, *spec.cmd[1:]))
        return spec

    # -- one server -------------------------------------------------------------------------
    async def prepare(self, server: ServerRef, alloc: Allocation, state: dict[str, Any]
                      ) -> dict[str, Any]:
        """Nothing to make before the job; records the node."""
        return dict(state, node=alloc.node)

    async def launch(self, spec: LaunchSpec, state: dict[str, Any], progress: Progress
                     ) -> tuple[str, int]:
        """Submit the server's job (held), mark it with the allocation, release it, wait
        until it runs on exactly the allocation, then until it reports its port.

        Returns:
            (the node's ``host``, the port the job reported).

        Raises:
            LaunchRefused: the node is not configured, the allocation cannot be a Slurm job
                (a GPU share, no core), or sbatch says the node cannot satisfy it.
            LaunchFailed: sbatch refused the job; the job did not run in ``submit_timeout``
                or ended; Slurm granted other devices than the allocation (exact mode: the
                job is cancelled); no port in ``port_timeout``.
            BackendUnavailable: the controller does not answer, or the node cannot take jobs
                now (drained, down, not responding: ``scontrol show node``), so that the
                spawner marks it suspect instead of leaving a job waiting in the queue.
        """
        alloc = spec.allocation
        node = self._node(alloc.node)
        spec = self._command(spec)
        try:
            plan = plan_job(spec, node, mode=self.gpu_mode, partition=self.partition,
                            time_limit=self.time_limit, output=self.output,
                            extra=self.extra_sbatch_options)
            script = job_script(spec, python=self.python, scontrol=self._cmd("scontrol"),
                                prologue=self.job_prologue, listen=self.listen_address)
            if self.submit_via == "rest":
                self._rest_job(plan, alloc)  # refuse what v0.0.38 cannot express, up front
        except ValueError as e:
            raise LaunchRefused(f"node {alloc.node}: {e}") from None
        # the home is checked and made by the job on its node (job.home_lines), never here
        for info in await self._ask(alloc.node, self.client.show_nodes(alloc.node)):
            if not info.usable:
                # a drained or dead node would keep the job PENDING until submit_timeout
                raise BackendUnavailable(
                    alloc.node, f"node state {'+'.join([info.state, *sorted(info.flags)])}"
                    + (f" ({info.reason})" if info.reason else ""), "slurmd")
        state.update(node=alloc.node, output=self.output, submitted=time.time(), started=False)
        try:
            job_id = await self._submit(script, plan, spec)
        except SlurmError as e:
            if controller_down(e):
                raise BackendUnavailable(alloc.node, e, "Slurm controller") from None
            cls = LaunchRefused if any(w in e.stderr for w in _REFUSED) else LaunchFailed
            how = "sbatch" if self.submit_via == "cli" else "slurmrestd"
            raise cls(f"node {alloc.node}: {how} refused the job: {e.stderr}") from None
        state["job_id"] = job_id
        progress(35, f"submitted Slurm job {job_id} ({plan.gres or 'no GPU'}, "
                 f"{len(alloc.cpuset)} CPUs, {plan.memory_mb} MiB)")
        await self._ask(alloc.node, self.client.run(
            "scontrol", "update", f"JobId={job_id}", f"AdminComment={admin_comment(alloc)}"))
        await self._ask(alloc.node, self.client.run("scontrol", "release", str(job_id)))
        job = await self._wait_running(job_id, alloc.node, progress)
        state["started"] = True
        problems = check_readback(job, alloc, node, plan.memory_mb, self.gpu_mode)
        state["picked"] = granted = picked(job, node)
        # model mode: Slurm picked the devices, so the allocation must name them even when the
        # counts agree; exact mode: only the cores can differ (sbatch cannot name core ids)
        differs = sorted(granted["cpu_ids"]) != sorted(alloc.cpuset) or (
            self.gpu_mode == "model" and sorted(granted["gpu_uuids"]) != sorted(alloc.gpu_uuids))
        if (problems or differs) and self.ledger is not None:
            alloc, problems = await self._adopt(job, alloc, node, granted, plan.memory_mb,
                                                problems)
        if problems:
            await self._cancel(job_id, alloc.node)
            raise LaunchFailed(f"Slurm job {job_id} does not hold allocation {alloc.id}: "
                               f"{'; '.join(problems)}; the job was cancelled")
        progress(50, f"Slurm job {job_id} runs on {alloc.node}, waiting for its port")
        port = await self._wait_port(job_id, alloc.node)
        state["port"] = port
        return self.nodes[alloc.node].host, port

    async def _adopt(self, job: JobInfo, alloc: Allocation, node: Node,
                     granted: Mapping[str, Any], memory_mb: int, problems: list[str]
                     ) -> tuple[Allocation, list[str]]:
        """Slurm cannot be told core ids (and picks GPUs in model mode): when it granted other
        cores (or, in model mode, GPUs) on the right node, the ledger adopts them if they are
        free there (:meth:`~gpuspawner.placement.Ledger.adopt`) and the job's AdminComment
        is marked again. Returns the allocation and what still differs."""
        assert self.ledger is not None
        if granted.get("node") != alloc.node or len(granted["cpu_ids"]) != len(alloc.cpuset):
            return alloc, problems
        gpus = granted["gpu_uuids"] if self.gpu_mode == "model" else None
        try:
            adopted = self.ledger.adopt(alloc.id, cpuset=granted["cpu_ids"], gpus=gpus)
        except PlacementError as e:
            return alloc, [*problems, f"the ledger cannot adopt what Slurm granted: {e}"]
        left = check_readback(job, adopted, node, memory_mb, self.gpu_mode)
        if left:
            return alloc, problems
        self.log.info("allocation %s adopted Slurm's cores %s (planned %s)", alloc.id,
                      adopted.cpuset_str(), alloc.cpuset_str())
        await self._ask(alloc.node, self.client.run(
            "scontrol", "update", f"JobId={job.job_id}",
            f"AdminComment={admin_comment(adopted)}"))
        return adopted, []

    async def _wait_running(self, job_id: int, node: str, progress: Progress) -> JobInfo:
        """Poll ``scontrol show job -d`` until the job is RUNNING with its detail lines, at
        most ``submit_timeout`` seconds (every 0.2 s, backing off to 1 s).

        Raises:
            LaunchFailed: it ended first, or it still waits at the deadline (then it is
                cancelled; the message gives Slurm's Reason).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.submit_timeout
        delay, said = 0.2, ""
        while True:
            job = await self._ask(node, self.client.show_job(job_id))
            if job is None:
                raise LaunchFailed(f"Slurm job {job_id} vanished before it ran")
            if job.state == "RUNNING" and job.details:
                return job
            if job.state not in _HOLDING:
                raise LaunchFailed(await self._ended(job, state_output=None))
            if job.reason and job.reason != said and job.reason != "None":
                said = job.reason
                progress(40, f"Slurm job {job_id} {job.state.lower()}: {job.reason}")
            if loop.time() >= deadline:
                await self._cancel(job_id, node)
                raise LaunchFailed(f"Slurm job {job_id} was not running after "
                                   f"{self.submit_timeout:g} s ({job.state}, Reason="
                                   f"{job.reason}); the job was cancelled")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    async def _wait_port(self, job_id: int, node: str) -> int:
        """Wait (``port_timeout``) for the job's ``Comment=gpuspawner-port=N``.

        Raises:
            LaunchFailed: the job ended first (with its report) or the deadline passed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.port_timeout
        delay = 0.1
        while True:
            job = await self._ask(node, self.client.show_job(job_id))
            if job is None:
                raise LaunchFailed(f"Slurm job {job_id} vanished before it reported its port")
            port = reported_port(job)
            if port is not None:
                return port
            if job.state != "RUNNING":
                raise LaunchFailed(await self._ended(job, state_output=None))
            if loop.time() >= deadline:
                raise LaunchFailed(f"Slurm job {job_id} reported no port within "
                                   f"{self.port_timeout:g} s (Comment={job.comment!r})")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def _ended(self, job: JobInfo, state_output: str | None) -> str:
        """Why a job is not running: state, exit code, reason and the output's last 8 lines.
        """
        text = (f"Slurm job {job.job_id} {job.state} (ExitCode={job.fields.get('ExitCode', '?')}"
                f", Reason={job.reason or 'None'})")
        path = job.fields.get("StdOut", "") or (state_output or "")
        path = path.replace("%j", str(job.job_id)).replace("%x", job.name)
        gid = _GROUP.match(job.fields.get("GroupId", ""))
        lines = await asyncio.to_thread(
            _tail, path, 8, job.uid, int(gid.group(1)) if gid else None,
        ) if path.startswith("/") else ""
        return f"{text}; last lines of {path}:\n{lines}" if lines else text

    async def _cancel(self, job_id: int, node: str) -> None:
        try:
            await self.client.scancel(job_id)
        except SlurmError as e:
            self.log.warning("node %s: scancel %s failed: %s", node, job_id, e)

    async def exit_report(self, state: Mapping[str, Any]) -> str | None:
        """None while the job runs (or waits right after submit); else its state, exit code
        and the last 8 lines of its output file (when the hub can read it)."""
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return None
        job = await self._ask(node, self.client.show_job(int(job_id)))
        if job is None:
            return f"Slurm job {job_id} is no longer known to Slurm"
        if job.state == "RUNNING" or (job.state in _HOLDING and self._fresh(state)):
            return None
        return await self._ended(job, state.get("output"))

    def _fresh(self, state: Mapping[str, Any]) -> bool:
        """Submitted less than ``submit_timeout`` ago and never seen running."""
        return (not state.get("started")
                and time.time() - float(state.get("submitted") or 0) < self.submit_timeout)

    async def poll(self, state: Mapping[str, Any]) -> int | None:
        """None while the job runs on a responding node; else an exit status: 0 when Slurm
        no longer knows the job, the job's exit code (at least 1 unless COMPLETED) when it
        ended, 1 when it waits (PENDING, except right after submit: :meth:`_fresh`).

        Raises:
            BackendUnavailable: the controller does not answer, or the job's node is DOWN or
                NOT_RESPONDING (its processes may outlive a dead slurmd: the spawner marks the
                node suspect, and the next placement there sweeps it).
        """
        job_id, node = state.get("job_id"), state.get("node", "")
        if not job_id:
            return 0
        job = await self._ask(node, self.client.show_job(int(job_id)))
        if job is None:
            return 0
        if job.state == "RUNNING":
            infos = await self._cached_nodes(node)
            for n in job.node_list or (node,):
                info = infos.get(n)
                if info is not None and (not info.responding or info.state == "DOWN"):
                    raise BackendUnavailable(
                        n, f"node state {'+'.join([info.state, *sorted(info.flags)])}",
                        "slurmd")
            return None
        if job.state in _HOLDING:
            return None if self._fresh(state) else 1
        code = job.fields.get("ExitCode", "0:0").split(":")[0]
        status = int(code) if code.isdigit() else 1
        return status if job.state == "COMPLETED" else max(status, 1)

    async def _cached_nodes(self, node: str) -> dict[str, Any]:
        """Every node's :class:`~.commands.NodeInfo` by name, from one ``scontrol show
        node`` shared by all polls for ``node_state_max_age`` seconds (concurrent polls wait
        for the same call).

        Raises:
            BackendUnavailable: the controller does not answer (for ``node``).
        """
        loop = asyncio.get_running_loop()
        if self._nodes_lock is None or self._nodes_lock[0] is not loop:
            self._nodes_lock = (loop, asyncio.Lock())
        async with self._nodes_lock[1]:
            now = time.monotonic()
            if self._nodes_cache is None or now - self._nodes_cache[0] > self.node_state_max_age:
                infos = await self._ask(node, self.client.show_nodes())
                self._nodes_cache = (time.monotonic(), {i.name: i for i in infos})
            return self._nodes_cache[1]

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
        """scancel the job ``state`` names, if any. Never raises."""
        job_id = state.get("job_id")
        if job_id:
            try:
                await self.client.scancel(int(job_id))
            except Exception as e:
                self.log.warning("node %s: scancel %s failed: %s", state.get("node", "?"),
                                 job_id, e)

    async def _our_jobs(self, node: str) -> list[tuple[JobInfo, str | None]]:
        """Every job Slurm knows, with the allocation JSON of ours (None for others).

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        out = await self._ask(node, self.client.run("scontrol", "show", "job", "-d"))
        return [(j, allocation_of(j)) for j in parse_jobs(out)]

    async def remove_server(self, node: str, server: ServerRef) -> None:
        """Cancel the jobs named ``server.name`` that carry this user and server in their
        allocation, or that were submitted by us and not yet marked (an interrupted launch:
        held, ``Comment=gpuspawner-submitted:...``).

        Raises:
            BackendUnavailable.
        """
        for job, text in await self._our_jobs(node):
            if job.name != server.name or job.state not in _HOLDING:
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
    async def node_states(self) -> dict[str, tuple[str, str]]:
        """Slurm's view of each bound node (``scontrol show node``; slurm.conf(5) node
        states): DOWN, NOT_RESPONDING (``*``), FAIL or a reboot -> "down"; DRAIN/DRAINING ->
        "drain"; else "up". The reason is Slurm's ``Reason``. A controller that does not answer
        makes every node "down" (no job could start)."""
        try:
            infos = {n.name: n for n in await self.client.show_nodes()}
        except Exception as e:
            return {name: ("down", f"Slurm controller unavailable: {e}") for name in self.nodes}
        out: dict[str, tuple[str, str]] = {}
        for name in self.nodes:
            info = infos.get(name)
            if info is None:
                out[name] = ("down", "Slurm does not know this node")
            elif info.drained and info.responding and info.state != "DOWN":
                out[name] = ("drain", f"Slurm: drained: {info.reason or 'no reason given'}")
            elif not info.usable:
                flags = "+".join(sorted(info.flags))
                out[name] = ("down", f"Slurm: {info.state}{'+' + flags if flags else ''}"
                                     f"{': ' + info.reason if info.reason else ''}")
            else:
                out[name] = ("up", "")
        return out

    async def list_managed(self) -> list[Managed]:
        """Every job of ours (AdminComment ``gpuspawner:`` + allocation JSON) that is
        PENDING, CONFIGURING, RUNNING or SUSPENDED, as Managed(allocation's node, JSON, job
        id). A controller that does not answer is logged: nothing is found."""
        try:
            jobs = await self._our_jobs("*")
        except BackendUnavailable as e:
            self.log.warning("cannot list Slurm jobs to restore allocations: %s", e)
            return []
        out = []
        for job, text in jobs:
            if text is None or job.state not in _HOLDING:
                continue
            out.append(Managed(str(json.loads(text).get("node", "")), text, str(job.job_id)))
        return out

    async def remove_managed(self, found: Managed) -> None:
        """scancel the job. Never raises."""
        try:
            await self.client.scancel(int(found.handle))
        except Exception as e:
            self.log.warning("node %s: scancel %s failed: %s", found.node, found.handle, e)

    async def sweep(self, node: str, booked: Callable[[str], bool],
                    owner_booked: Callable[[str, str], bool]) -> list[str]:
        """Cancel our jobs on ``node`` (by allocation) whose allocation id is not booked.

        Raises:
            BackendUnavailable: the controller does not answer.
        """
        removed = []
        for job, text in await self._our_jobs(node):
            if text is None or job.state not in _HOLDING:
                continue
            data = json.loads(text)
            if data.get("node") != node or booked(str(data.get("id"))):
                continue
            self.log.warning("node %s: cancelling Slurm job %s, allocation %s not booked",
                             node, job.job_id, data.get("id"))
            await self._ask(node, self.client.scancel(job.job_id))
            removed.append(str(job.job_id))
        return removed


#: the gid of ``GroupId=name(gid)``
_GROUP = re.compile(r".*\((\d+)\)$")


def _tail(path: str, lines: int, uid: int | None = None, gid: int | None = None) -> str:
    """The last ``lines`` lines of the job's output file, read with the job user's rights
    ("" when it cannot be read; blocking). The file and its folders belong to the job's user,
    who could put a link to any file in their place: a hub running as root reads it in a
    ``tail`` running as ``uid:gid`` (no supplementary groups), never itself; otherwise it opens
    it without following a link (``O_NOFOLLOW``) and only when it is a regular file of
    ``uid``."""
    if uid is not None and uid != 0 and os.geteuid() == 0:
        try:
            out = subprocess.run(["tail", "-c", "16384", "--", path], capture_output=True,
                                 timeout=10, user=uid, group=gid if gid is not None else uid,
                                 extra_groups=[], stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return ""
        data = out.stdout.decode("utf-8", "replace") if out.returncode == 0 else ""
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
                return ""
            f.seek(max(0, st.st_size - 16384))
            data = f.read(16384).decode("utf-8", "replace")
    return "\n".join(data.strip().splitlines()[-lines:])
