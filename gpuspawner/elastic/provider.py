"""Providers: what starts and stops the machines behind elastic nodes.

A provider has three operations (:class:`Provider`): ``start(category, node)`` returns the new
machine's Docker engine URL and topology (:class:`StartedNode`), ``stop(node, handle)`` stops
one it started, ``state(node, handle)`` says whether it still runs. The hub never calls
``stop`` for a machine the provider did not start: the manager keeps the handle ``start``
returned, and stops only nodes that have one (:mod:`gpuspawner.elastic.manager`).

:class:`CommandProvider` runs the admin's own programs (``c.CommandProvider.start_command`` /
``stop_command`` / ``state_command``), for OpenStack, AWS or a site's power controller
(examples in docs/howto/elastic-nodes.md):

- ``START_COMMAND... CATEGORY`` with ``GPUSPAWNER_NODE=<node name>`` in its environment; exit
  status 0 and, as the last line of its standard output, one JSON object::

      {"docker_url": "unix:///run/n1.sock" | "tcp://n1:2376",
       "topology": {...},            # its topology: `gpuspawner inventory` output as JSON
       "handle": "i-0abc...",        # optional: the provider's id of it (default: the node)
       "host": "n1",                 # optional: the node's address (host networking)
       "network_pool": "198.19.240.0/21"}   # optional: the node's server networks

- ``STOP_COMMAND... HANDLE`` (``GPUSPAWNER_NODE`` set too); exit status 0 = stopped.
- ``STATE_COMMAND... HANDLE`` (optional): prints ``running``, ``stopped`` or ``starting``.

Each program runs at most ``timeout`` seconds (then it and what it started are killed, and
it counts as a failure; a start cut short by a hub shutdown is killed the same way);
its standard error (the last 2,000 characters) goes into the failure's message.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass
from typing import Any

from traitlets import Float, List, Unicode
from traitlets.config import LoggingConfigurable

__all__ = ["CommandProvider", "Provider", "ProviderError", "StartedNode", "provider_class"]


class ProviderError(RuntimeError):
    """A provider could not start or stop a machine (the message says which program and
    why: exit status, time-out, bad output, with the program's standard error).

    Attributes:
        public: what users may be told (waiting requests' notes, the nodes' state reasons):
            without the program's path and output, which may name the site's accounts or
            hosts; defaults to the message.
    """

    def __init__(self, message: str, public: str = "") -> None:
        super().__init__(message)
        self.public = public or message


@dataclass(frozen=True)
class StartedNode:
    """What a provider's ``start`` returns.

    Attributes:
        docker_url: the new machine's Docker engine URL.
        topology: its topology as a mapping (the topology file's format,
            :func:`gpuspawner.inventory.topology.node_from_dict`).
        handle: the provider's id of the machine (what ``stop`` gets).
        host: its address for host networking ("" = keep the node entry's).
        network_pool: its server networks' CIDR blocks ("" = keep the node entry's).
    """

    docker_url: str
    topology: dict[str, Any]
    handle: str
    host: str = ""
    network_pool: str = ""


class Provider(LoggingConfigurable):
    """The interface of a provider (a ``Configurable``: settings as
    ``c.<ClassName>.<trait>``). Subclasses implement the three coroutines."""

    async def start(self, category: str, node: str) -> StartedNode:
        """Start (power on, create) a machine of ``category`` for elastic node ``node``.

        Raises:
            ProviderError: it could not.
        """
        raise NotImplementedError

    async def stop(self, node: str, handle: str) -> None:
        """Stop (power off, terminate) the machine ``handle`` that :meth:`start` returned.

        Raises:
            ProviderError: it could not.
        """
        raise NotImplementedError

    async def state(self, node: str, handle: str) -> str:
        """``"running"``, ``"starting"``, ``"stopped"`` or ``"unknown"`` (the default: the
        provider cannot tell; the hub then asks the node's engine)."""
        return "unknown"


#: what users are told when a start program's output is not what the hub reads
BAD_OUTPUT = "its program's output is not what the hub reads"


def _tail(data: bytes, n: int = 2000) -> str:
    return data.decode("utf-8", "replace").strip()[-n:]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill a program and what it started (its own session: ``start_new_session``), so that
    no child keeps its output open."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class CommandProvider(Provider):
    """The admin's own programs (see the module's docstring)."""

    start_command = List(
        Unicode(),
        help="""The program (and its first arguments) that
        starts a machine: called with the category as its last argument and GPUSPAWNER_NODE
        in its environment; prints a JSON object as its last line (docker_url, topology,
        optional handle, host, network_pool).""",
    ).tag(config=True)
    stop_command = List(
        Unicode(),
        help="""The program that stops a machine: called with the
        handle start_command printed (default: the node's name) as its last argument.""",
    ).tag(config=True)
    state_command = List(
        Unicode(),
        help="""Optional: the program that prints a machine's
        state (running, starting, stopped); called with the handle.""",
    ).tag(config=True)
    timeout = Float(
        600.0,
        help="""Seconds each program may run before it is killed and
        counts as failed.""",
    ).tag(config=True)

    def check_config(self) -> None:
        """At hub start: ``start_command`` and ``stop_command`` are set and name programs
        that exist and can be run.

        Raises:
            ValueError: the setting and the problem.
        """
        for key in ("start_command", "stop_command", "state_command"):
            cmd = getattr(self, key)
            if not cmd:
                if key == "state_command":
                    continue
                raise ValueError(
                    f"c.CommandProvider.{key}: empty; elastic nodes with "
                    "provider 'command' need the program that "
                    f"{key.split('_')[0]}s a machine"
                )
            prog = cmd[0]
            if os.sep in prog and not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
                raise ValueError(f"c.CommandProvider.{key}: {prog} is not an executable file")

    async def _run(self, cmd: list[str], node: str) -> str:
        env = dict(os.environ, GPUSPAWNER_NODE=node)
        what = " ".join(cmd)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            raise ProviderError(f"{what}: cannot run: {e}", "its program could not run") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except asyncio.TimeoutError:
            _kill_group(proc)
            await proc.wait()
            raise ProviderError(
                f"{what}: no answer within {self.timeout:g} s (killed)",
                f"its program gave no answer within {self.timeout:g} s",
            ) from None
        except asyncio.CancelledError:
            _kill_group(proc)
            raise
        if proc.returncode != 0:
            raise ProviderError(
                f"{what}: exit status {proc.returncode}: {_tail(err)}",
                f"its program failed with exit status {proc.returncode}",
            )
        return out.decode("utf-8", "replace")

    async def start(self, category: str, node: str) -> StartedNode:
        """Run ``start_command CATEGORY``; parse the last line of its output.

        Raises:
            ProviderError: the program failed, or its output is not the JSON object
                described in the module's docstring.
        """
        out = await self._run([*self.start_command, category], node)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        what = " ".join(self.start_command)
        try:
            data = json.loads(lines[-1]) if lines else None
        except ValueError as e:
            raise ProviderError(
                f"{what}: the last line of its output is not JSON: {e}", BAD_OUTPUT
            ) from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("docker_url"), str)
            or not data["docker_url"]
            or not isinstance(data.get("topology"), dict)
        ):
            raise ProviderError(
                f"{what}: its last line must be a JSON object with docker_url "
                "(a string) and topology (an object)",
                BAD_OUTPUT,
            )
        for key in ("handle", "host", "network_pool"):
            if key in data and not isinstance(data[key], str):
                raise ProviderError(f"{what}: {key} must be a string", BAD_OUTPUT)
        return StartedNode(
            docker_url=data["docker_url"],
            topology=data["topology"],
            handle=data.get("handle") or node,
            host=data.get("host", ""),
            network_pool=data.get("network_pool", ""),
        )

    async def stop(self, node: str, handle: str) -> None:
        """Run ``stop_command HANDLE``.

        Raises:
            ProviderError: the program failed.
        """
        await self._run([*self.stop_command, handle], node)

    async def state(self, node: str, handle: str) -> str:
        """Run ``state_command HANDLE`` when set (its first word), else ``"unknown"``."""
        if not self.state_command:
            return "unknown"
        try:
            out = await self._run([*self.state_command, handle], node)
        except ProviderError:
            return "unknown"
        word = (out.split() or ["unknown"])[0].lower()
        return word if word in ("running", "starting", "stopped") else "unknown"


#: short names of ``nodes[].provider``
PROVIDERS = {"command": CommandProvider}


def provider_class(name: str) -> type[Provider]:
    """The :class:`Provider` subclass a node's ``provider`` names: ``"command"`` or a dotted
    class path.

    Raises:
        ValueError: unknown name, or the path is not a Provider subclass.
    """
    if name in PROVIDERS:
        return PROVIDERS[name]
    if "." not in name:
        raise ValueError(
            f"unknown provider {name!r}; known: {', '.join(PROVIDERS)} or a dotted class path"
        )
    from importlib import import_module

    mod, _, cls = name.rpartition(".")
    try:
        found = getattr(import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"provider {name!r} cannot be imported: {e}") from None
    if not (isinstance(found, type) and issubclass(found, Provider)):
        raise ValueError(f"provider {name!r} is not a gpuspawner.elastic.Provider subclass")
    return found
