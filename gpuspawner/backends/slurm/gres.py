"""GPUs as Slurm generic resources (GRES), one GRES *Type* per GPU ("exact" mode).

Slurm schedules GPUs by name and type (``--gres=gpu:TYPE:COUNT``, sbatch(1)); it has no way to
ask for one device by UUID. Giving every GPU a Type of its own, derived from its UUID, lets a job
name the very device the placement module chose: ``--gres=gpu:<gres_type(uuid)>:1`` can only be
satisfied by that GPU, and hence only on its node. ``Cores=`` in gres.conf binds the GPU to the
cores of its NUMA node, so ``--gres-flags=enforce-binding`` gives the job exactly those cores.

Everything here is pure: topology in, configuration text out.

MIG: a MIG-enabled GPU has no line of its own; each of its MIG instances is a GRES device of
name ``gpu`` (Slurm treats MIG devices as GPUs, Slurm's gres.html "MIG Management"), in
:func:`gres_devices` order. Exact mode gives each instance its own Type from its ``MIG-`` UUID,
as for GPUs; model mode gives it its profile name (``gpu:1g.10gb:2``), the name the MIG
devices go by in Slurm's own MIG configuration (``AutoDetect=nvml``, whose detected types
contain the profile name and are matched by it). A MIG device needs several device files
(the parent's ``/dev/nvidiaN`` and its ``/dev/nvidia-caps/nvidia-capN`` files), written as
gres.conf ``MultipleFiles=``; they come from the topology file's ``mig[].files``.

Rules for a Type name (Slurm 22.05 ``src/common/gres.c``, gres.conf(5), slurm.conf(5)):

* ``,`` separates GRES entries and ``:`` separates name, type and count in both the job request
  (``_get_next_gres``) and the node's ``Gres=`` value (``_get_gres_cnt``), so neither may appear;
  ``(`` starts the socket binding suffix of a node's ``Gres=`` (``gpu:t:1(S:0)``), ``=`` and white
  space separate ``key=value`` pairs of the configuration files and ``#`` starts a comment.
* A type that parses as a number (``_is_valid_number``: digits with an optional ``k/m/g/t/p``
  suffix) is taken as the count in ``gpu:TYPE``; a type that starts with a letter never is.
* ``no_consume`` is a reserved word in a node's ``Gres=`` value.
* Types are compared case-insensitively (``xstrcasecmp`` in ``_match_type`` /
  ``gres_node_config_load``) but identified by a 32-bit sum of their bytes (``gres_build_id``):
  two different types with the same sum count as one type for scheduling. :func:`check_types`
  refuses such a set.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping

from ...placement import GPU, MigInstance, Node
from ...placement.model import format_cpu_list

__all__ = [
    "GresError",
    "check_types",
    "gres_conf",
    "gres_devices",
    "gres_type",
    "node_gres",
    "slurm_gres_id",
]

#: characters kept as they are in a Type (lower-case letters, digits, ``-``); everything else is
#: written as ``_`` followed by the two hex digits of each of its UTF-8 bytes, so the mapping is
#: one-to-one (``_`` itself becomes ``_5f``).
_KEPT = frozenset(string.ascii_lowercase + string.digits + "-")


class GresError(ValueError):
    """A GPU or a set of GPUs that cannot be written as Slurm GRES: a UUID that gives no valid
    Type, a GPU without a device file, or two GPUs whose Types Slurm would not tell apart."""


def gres_type(uuid: str) -> str:
    """The Slurm GRES Type naming exactly the GPU with this UUID.

    The UUID is lower-cased (NVML UUIDs are lower-case hex, ``GPU-xxxxxxxx-xxxx-...``; Slurm
    compares types case-insensitively anyway) and every character other than ``a-z``, ``0-9``
    and ``-`` is escaped as ``_XX`` per UTF-8 byte, e.g. ``GPU-5a0c...`` -> ``gpu-5a0c...`` and
    the old MIG form ``MIG-GPU-x/1/0`` -> ``mig-gpu-x_2f1_2f0``.

    Args:
        uuid: the GPU's UUID as NVML reports it (``nvmlDeviceGetUUID``); surrounding white space
            is ignored.

    Returns:
        A Type that is valid in gres.conf, in a node's ``Gres=`` value and in
        ``sbatch --gres=gpu:TYPE:1`` (see the module docstring for the rules); two UUIDs give the
        same Type only when they differ in letter case alone.

    Raises:
        GresError: the UUID is empty or does not start with an ASCII letter (a type starting
            with a digit may be read as a count by Slurm; NVML UUIDs start with ``GPU-`` or
            ``MIG-``).
    """
    text = uuid.strip().lower()
    if not text or text[0] not in string.ascii_lowercase:
        raise GresError(f"GPU UUID {uuid!r} must start with a letter (NVML: GPU-... or MIG-...)")
    out: list[str] = []
    for ch in text:
        if ch in _KEPT:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def slurm_gres_id(name: str) -> int:
    """Slurm's 32-bit identifier of a GRES name or type (``gres_build_id`` in Slurm's
    ``src/common/gres.c``): the sum of each byte shifted left by 0, 8, 16, 24, 0, ... bits,
    modulo 2**32. Slurm matches a job's type to a node's types by this number.

    Args:
        name: the type (ASCII, as :func:`gres_type` makes it).

    Returns:
        The identifier, 0 <= id < 2**32.
    """
    ident = 0
    shift = 0
    for b in name.encode("utf-8"):
        if b >= 0x80:  # a C char is signed on x86: bytes >= 0x80 are negative
            b -= 0x100
        ident = (ident + (b << shift)) % 2**32
        shift = (shift + 8) % 32
    return ident


def check_types(uuids: Iterable[str]) -> dict[str, str]:
    """The Type of every GPU of a cluster, checked to be distinct as Slurm sees them.

    Args:
        uuids: the UUIDs of all GPUs that share one slurm.conf (every node: a job's type is
            matched on all nodes).

    Returns:
        ``{uuid: type}`` in the order given.

    Raises:
        GresError: a UUID gives no Type (:func:`gres_type`), a UUID is listed twice, or two
            GPUs get types that Slurm would confuse: equal ignoring case, or equal
            :func:`slurm_gres_id`.
    """
    types: dict[str, str] = {}
    by_id: dict[int, str] = {}
    by_type: dict[str, str] = {}
    for uuid in uuids:
        if uuid in types:
            raise GresError(f"GPU {uuid} is listed twice")
        t = gres_type(uuid)
        if t in by_type:
            raise GresError(f"GPUs {by_type[t]} and {uuid} differ only in letter case: Slurm "
                            f"compares GRES types case-insensitively")
        ident = slurm_gres_id(t)
        if ident in by_id:
            raise GresError(f"GPUs {by_id[ident]} and {uuid} get GRES types with the same Slurm "
                            f"id {ident} (gres_build_id): Slurm would treat them as one type")
        types[uuid] = t
        by_type[t] = uuid
        by_id[ident] = uuid
    return types


def _sorted_gpus(node: Node) -> tuple[GPU, ...]:
    return tuple(sorted(node.gpus, key=lambda g: g.index))


Device = tuple[str, GPU, "MigInstance | None"]


def gres_devices(node: Node) -> tuple[Device, ...]:
    """The node's GRES devices in gres.conf order, as ``(uuid, gpu, mig instance or None)``:
    the GPUs by ``index``, a MIG-enabled GPU replaced by its MIG instances by their index
    (Slurm's ``IDX`` of a device is its position here)."""
    out: list[Device] = []
    for g in _sorted_gpus(node):
        if g.mig_enabled:
            out.extend((m.uuid, g, m) for m in sorted(g.mig, key=lambda m: (m.index, m.uuid)))
        else:
            out.append((g.uuid, g, None))
    return tuple(out)


#: a GPU model usable as a GRES Type (model mode: ``gpu:<model>:N``)
_MODEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
#: a MIG profile as a GRES Type (``1g.10gb``: not a number for Slurm's ``_is_valid_number``)
_PROFILE = re.compile(r"^[0-9]g\.[0-9]+gb(\+[a-z]+)?$")


def _types(node: Node, devices: Iterable[Device], mode: str) -> dict[str, str]:
    """GRES Type per device UUID: its own (exact) or its model / MIG profile (model)."""
    devices = list(devices)
    if mode == "exact":
        return check_types(u for u, _g, _m in devices)
    if mode != "model":
        raise GresError(f"mode must be exact or model, got {mode!r}")
    out: dict[str, str] = {}
    for uuid, g, m in devices:
        if m is not None:
            if not _PROFILE.match(m.profile):
                raise GresError(f"node {node.name}: MIG instance {uuid}: profile "
                                f"{m.profile!r} is no valid GRES Type")
            out[uuid] = m.profile
            continue
        if not _MODEL.match(g.model or ""):
            raise GresError(f"node {node.name}: GPU {g.uuid}: model {g.model!r} is no valid "
                            "GRES Type (a letter, then letters, digits, _ . -)")
        out[uuid] = g.model
    return out


def gres_conf(node: Node, device_files: Mapping[str, str], mode: str = "exact") -> list[str]:
    """The gres.conf lines of one node: one ``Name=gpu`` line per GPU, each with its own Type.

    Line format (gres.conf(5)): ``NodeName=N Name=gpu Type=T File=PATH Cores=LIST``, GPUs in
    the order of their ``index``. ``Cores=`` is the CPU list of the GPU's NUMA node from the
    topology (gres.conf(5) "Cores": Slurm's logical core indexes, core 0 being the first core of
    the first socket); this equals Slurm's numbering when the node has one thread per core and
    its CPUs are numbered socket by socket, as on the private cluster of ``scripts/slurm.sh``
    (2 sockets x 1 core, one NUMA node each). A GPU whose NUMA node is unknown gets no
    ``Cores=`` (any core may use it). The file that uses these lines must also say
    ``AutoDetect=off``, else slurmd replaces the types with detected model names.

    Args:
        node: the node (``gpuspawner.placement.Node``), e.g. from a topology file.
        device_files: absolute path of the device file (``/dev/nvidiaN``) of each GPU, by UUID.

    Returns:
        The lines, without newlines; empty for a node without GPUs.

    ``mode`` "model" writes the GPU's model as its Type instead (the site's own types, e.g.
    ``a100``: a job asks for a count of a model and Slurm picks the devices; the Slurm backend's
    ``gpu_mode = "model"``).

    A MIG instance (module docstring) gets ``MultipleFiles=`` with its device files: the
    instance's ``files`` (topology ``mig[].files``), else ``device_files[its MIG- UUID]``
    (comma-separated paths).

    Raises:
        GresError: a GPU has no device file, a path is not absolute or holds white space, or
            the types clash (:func:`check_types`), or a model is no valid Type; a MIG instance
            without device files.
    """
    devices = gres_devices(node)
    types = _types(node, devices, mode)
    numa = {n.id: n for n in node.numa_nodes}
    lines = []
    for uuid, g, m in devices:
        if m is not None:
            paths = list(m.files) or [p for p in (device_files.get(uuid) or "").split(",") if p]
            if not paths:
                raise GresError(f"node {node.name}: MIG instance {uuid} has no device files: "
                                "list them in the topology file's mig[].files (the GPU's "
                                "/dev/nvidiaN and the instance's /dev/nvidia-caps/nvidia-capN, "
                                "see /proc/driver/nvidia-caps/mig-minors), or let slurmd find "
                                "them (AutoDetect=nvml, docs/mig.md)")
            for path in paths:
                if not path.startswith("/") or any(c.isspace() for c in path):
                    raise GresError(f"node {node.name}: device file {path!r} must be an "
                                    "absolute path without white space (gres.conf "
                                    "MultipleFiles=)")
            line = (f"NodeName={node.name} Name=gpu Type={types[uuid]} "
                    f"MultipleFiles={','.join(paths)}")
        else:
            path = device_files.get(g.uuid)
            if not path:
                raise GresError(f"node {node.name}: GPU {g.uuid} has no device file")
            if not path.startswith("/") or any(c.isspace() for c in path):
                raise GresError(f"node {node.name}: device file {path!r} must be an absolute "
                                f"path without white space (gres.conf File=)")
            line = f"NodeName={node.name} Name=gpu Type={types[g.uuid]} File={path}"
        if g.numa_node is not None and g.numa_node in numa and numa[g.numa_node].cpus:
            line += f" Cores={format_cpu_list(numa[g.numa_node].cpus)}"
        lines.append(line)
    return lines


def node_gres(node: Node, mode: str = "exact") -> str:
    """The ``Gres=`` value of the node's ``NodeName=`` line in slurm.conf: one
    ``gpu:TYPE:1`` per GPU (slurm.conf(5) "Gres": ``name[:type]:count``, comma separated), in
    the order of their ``index``, e.g. ``gpu:gpu-5a0c...:1,gpu:gpu-c4e2...:1``.

    Args:
        node: the node.

    Returns:
        The value, ``""`` for a node without GPUs (write no ``Gres=`` then).

    Raises:
        GresError: the types clash (:func:`check_types`).
    """
    devices = gres_devices(node)
    if mode == "model":  # one count per model or MIG profile, e.g. gpu:a100:4,gpu:1g.10gb:2
        counts: dict[str, int] = {}
        for t in _types(node, devices, mode).values():
            counts[t] = counts.get(t, 0) + 1
        return ",".join(f"gpu:{t}:{n}" for t, n in counts.items())
    types = check_types(u for u, _g, _m in devices)
    return ",".join(f"gpu:{types[u]}:1" for u, _g, _m in devices)
