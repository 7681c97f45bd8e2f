"""``make gpu-check``: what this project claims about GPUs, checked on this host's real GPU,
printed as one table (check, expected, seen, ok).

Exit status: 0 every row ok; 1 a mismatch; 2 no GPU here (``nvidia-ml-py`` not importable,
``nvmlInit`` failing with NVML's own error text, or NVML seeing no GPU), printed in one line.

Checks (``--checks``, comma separated; default all), each against an independent reading:

* ``inventory``: :func:`~gpuspawner.inventory.local.read_gpus` (NVML) against ``nvidia-smi
  --query-gpu=index,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits`` (memory in
  MiB): count, UUIDs, memory, PCI bus ids.
* ``health``: :func:`~gpuspawner.inventory.health.read_health` reads the volatile uncorrected
  ECC count (or "not supported") and registers for XID events; the ECC count equals
  ``nvidia-smi --query-gpu=ecc.errors.uncorrected.volatile.total``.
* ``mig``: every MIG instance NVML lists (``read_gpus``) is a ``MIG-`` UUID of ``nvidia-smi
  -L``, and none is missing; "MIG off" when no GPU has it.
* ``container``: a container of the PyTorch image (``--image``) with the first GPU requested by
  UUID (docker ``device_requests``, driver nvidia, as the Docker backend asks) sees one CUDA
  device, with that UUID (``torch.cuda.get_device_properties(0).uuid``), and a 2048x2048 fp32
  matmul on it matches the CPU's within a relative error of 1e-3.
* ``load``: while a container runs matmuls, the Lab panel's utilisation
  (:class:`gpuspawner.singleuser.gpuviews.sampler.Sampler`) is within 5 points of
  ``nvidia-smi --query-gpu=utilization.gpu`` and its used memory within 2 % of the GPU of
  ``memory.used``; the culler's GPU signal (:class:`idle_culler.gpu.NVMLSampler`) reads busy
  (>= 5 %, the culler's documented threshold example) then, after the load ends, idle.
* ``shares``: two half-GPU shares on the first GPU, for each mechanism this node has
  (:func:`~gpuspawner.gpushare.mechanism.detect_mechanism`; the watchdog always): one allocates
  75 % of the GPU's memory, the other 40 % and runs a matmul. MPS under the admin's daemon
  (``/tmp/nvidia-mps``) where there is one, else under a daemon in a container of its own,
  as ``mps-daemon`` runs it (:mod:`gpuspawner.gpushare.mps`). dmem and MPS: the first fails
  with CUDA out-of-memory, the second succeeds. Watchdog (grace 5 s): the first kernel gets
  SIGINT (KeyboardInterrupt) within 30 s, the second is untouched and still running.

At most about 8 minutes on one GPU (each container wait is bounded). Nothing here runs on a
host without a GPU beyond the NVML probe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from idle_culler.gpu import GPUHistory, NVMLSampler

from ..backends.docker import GPU_CAPABILITIES
from ..inventory.health import read_health
from ..inventory.local import read_gpus
from ..placement.model import Allocation, GPUShare, Owner
from ..singleuser.gpuviews.sampler import Sampler
from .mechanism import (
    Mechanism,
    detect_mechanism,
    prepare_dmem_cgroup,
    remove_dmem_cgroup,
    share_limits,
)
from .mps import (
    DAEMON_COMMAND,
    QUIT_COMMAND,
    READY_COMMAND,
    MpsDaemon,
    client_host_config,
    daemon_for,
)
from .watchdog import Watchdog, shares_from_allocations

__all__ = [
    "CHECKS",
    "Context",
    "NoGPU",
    "Row",
    "exit_status",
    "main",
    "probe",
    "render",
    "run_checks",
]

MiB = 1024**2
DEFAULT_IMAGE = os.environ.get("GPUSPAWNER_PYTORCH_IMAGE", "gpuspawner/pytorch:latest")
CHECK_LABEL = "gpuspawner.gpu-check"


class NoGPU(Exception):
    """No GPU on this host; the message is the one line ``gpu-check`` prints."""


@dataclass(frozen=True)
class Row:
    """One line of the table: what was checked, the expected and the seen value, and whether
    they agree."""

    check: str
    expected: str
    seen: str
    ok: bool


@dataclass
class Context:
    """What the checks use.

    Attributes:
        nvml: the ``pynvml`` module (or the test double), initialised.
        smi: runs ``nvidia-smi`` with the given arguments, returns its stdout.
        engine: a ``docker.APIClient`` (None: the container checks report it missing).
        image: the PyTorch image. grace_s: the watchdog's grace in the share check.
    """

    nvml: Any
    smi: Callable[[Sequence[str]], str]
    engine: Any = None
    image: str = DEFAULT_IMAGE
    grace_s: float = 5.0
    gpus: list[Any] = field(default_factory=list)


def probe(nvml: Any | None = None) -> Any:
    """NVML, initialised, on a host with at least one GPU.

    Raises:
        NoGPU: nvidia-ml-py missing, ``nvmlInit`` failing (NVML's error text), or 0 GPUs.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError as e:
            raise NoGPU(f"no GPU: nvidia-ml-py is not importable ({e})") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NoGPU(f"no GPU: nvmlInit failed: {e}") from None
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as e:
        nvml.nvmlShutdown()
        raise NoGPU(f"no GPU: nvmlDeviceGetCount failed: {e}") from None
    if count == 0:
        nvml.nvmlShutdown()
        raise NoGPU("no GPU: NVML works but sees 0 GPUs")
    return nvml


def smi_runner(args: Sequence[str]) -> str:
    """``nvidia-smi args`` (30 s at most); its stdout.

    Raises:
        subprocess.CalledProcessError / FileNotFoundError / TimeoutExpired.
    """
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


# --------------------------------------------------------------------------- NVML-only checks
def check_inventory(ctx: Context) -> list[Row]:
    """NVML's inventory against nvidia-smi's (module docstring)."""

    gpus = list(read_gpus(ctx.nvml))
    ctx.gpus = gpus
    smi = _csv(
        ctx.smi(["--query-gpu=index,uuid,memory.total,pci.bus_id", "--format=csv,noheader,nounits"])
    )
    rows = [Row("inventory: GPU count", str(len(smi)), str(len(gpus)), len(smi) == len(gpus))]
    by_index = {int(r[0]): r for r in smi if len(r) >= 4 and r[0].isdigit()}
    for g in gpus:
        r = by_index.get(g.index)
        if r is None:
            rows.append(Row(f"inventory: GPU {g.index}", "listed by nvidia-smi", "missing", False))
            continue
        rows.append(Row(f"inventory: GPU {g.index} UUID", r[1], g.uuid, r[1] == g.uuid))
        mib = g.memory_bytes // MiB
        rows.append(
            Row(
                f"inventory: GPU {g.index} memory (MiB)",
                r[2],
                str(mib),
                r[2].isdigit() and abs(int(r[2]) - mib) <= 1,
            )
        )
        rows.append(
            Row(
                f"inventory: GPU {g.index} PCI bus id",
                r[3].upper(),
                g.pci_bus_id.upper(),
                r[3].upper() == g.pci_bus_id.upper(),
            )
        )
    return rows


def check_health(ctx: Context) -> list[Row]:
    """ECC and XID readings (module docstring)."""

    readings = read_health(ctx.nvml)
    smi = {
        int(r[0]): r[1]
        for r in _csv(
            ctx.smi(
                [
                    "--query-gpu=index,ecc.errors.uncorrected.volatile.total",
                    "--format=csv,noheader,nounits",
                ]
            )
        )
        if r and r[0].isdigit()
    }
    rows = []
    for h in readings:
        ecc = h.counters.get("ecc_uncorrected_volatile")
        theirs = smi.get(h.index, "")
        expected = theirs if theirs.isdigit() else "not supported"
        seen = str(ecc) if ecc is not None else "not read"
        rows.append(
            Row(
                f"health: GPU {h.index} uncorrected ECC (volatile)",
                expected,
                seen,
                seen == expected,
            )
        )
        xid = (
            "registered" if "xids" in h.counters else str(h.counters.get("xid_events", "not read"))
        )
        rows.append(
            Row(
                f"health: GPU {h.index} XID events",
                "registered or not supported",
                xid,
                xid in ("registered", "not supported"),
            )
        )
    return rows


def check_mig(ctx: Context) -> list[Row]:
    """NVML's MIG instances against ``nvidia-smi -L`` (module docstring)."""

    gpus = ctx.gpus or list(read_gpus(ctx.nvml))
    on = [g for g in gpus if g.mig_mode]
    if not on:
        return [Row("mig: MIG mode", "off on every GPU, or instances listed", "off", True)]
    listed = ctx.smi(["-L"])
    smi_uuids = sorted(
        {
            w.strip("()").rstrip(")")
            for line in listed.splitlines()
            for w in line.replace(":", " ").split()
            if w.startswith("MIG-")
        }
    )
    ours = sorted(m.uuid for g in on for m in g.mig)
    return [
        Row(
            f"mig: instances on GPU(s) {', '.join(str(g.index) for g in on)}",
            " ".join(smi_uuids) or "none",
            " ".join(ours) or "none",
            smi_uuids == ours,
        )
    ]


# --------------------------------------------------------------------------- container checks
PROBE_SCRIPT = r"""
import json, torch
out = {"count": torch.cuda.device_count()}
if out["count"]:
    p = torch.cuda.get_device_properties(0)
    out["uuid"] = str(getattr(p, "uuid", ""))
    a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
    c = (a @ b).cpu(); ref = a.cpu() @ b.cpu()
    out["err"] = float((c - ref).abs().max() / ref.abs().max())
print(json.dumps(out))
"""

LOAD_SCRIPT = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda"); end = time.time() + SECONDS
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize(); print("done")
"""

#: a share's kernel: allocate FRACTION of the GPU's memory, report, hold it until interrupted
SHARE_SCRIPT = r"""
import sys, time, torch
total = torch.cuda.get_device_properties(0).total_memory
try:
    x = torch.empty(int(total * FRACTION), dtype=torch.uint8, device="cuda")
    if MATMUL:
        a = torch.randn(1024, 1024, device="cuda"); (a @ a).sum().item()
    print("allocated", flush=True)
except torch.OutOfMemoryError:
    print("oom", flush=True); sys.exit(3)
try:
    time.sleep(HOLD)
    print("held", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True); sys.exit(4)
"""


def _gpu_host_config(ctx: Context, uuid: str, **extra: Any) -> Any:

    from docker.types import DeviceRequest  # docker: only where containers are made

    return ctx.engine.create_host_config(
        device_requests=[
            DeviceRequest(driver="nvidia", device_ids=[uuid], capabilities=GPU_CAPABILITIES)
        ],
        **extra,
    )


def _start(
    ctx: Context, uuid: str, cmd: list[str], env: dict[str, str] | None = None, **host: Any
) -> str:
    cid = ctx.engine.create_container(
        ctx.image,
        command=cmd,
        environment=env or {},
        labels={CHECK_LABEL: "1"},
        host_config=_gpu_host_config(ctx, uuid, **host),
    )["Id"]
    ctx.engine.start(cid)
    return cid


def _finish(ctx: Context, cid: str, timeout: float) -> tuple[int | None, str]:
    try:
        code = ctx.engine.wait(cid, timeout=timeout).get("StatusCode")
    except Exception:  # noqa: BLE001 - a timeout: the output so far
        code = None
    out = ctx.engine.logs(cid).decode(errors="replace")
    ctx.engine.remove_container(cid, force=True)
    return code, out


def _need_image(ctx: Context, what: str) -> list[Row]:
    if ctx.engine is None:
        return [Row(what, "a Docker engine", "none answers", False)]
    try:
        ctx.engine.inspect_image(ctx.image)
    except Exception:  # noqa: BLE001
        return [Row(what, f"image {ctx.image}", "missing (make pytorch-image)", False)]
    return []


def check_container(ctx: Context) -> list[Row]:
    """A 1-GPU container sees exactly its GPU and multiplies on it (module docstring)."""
    missing = _need_image(ctx, "container: PyTorch image")
    if missing:
        return missing
    uuid = ctx.gpus[0].uuid
    cid = _start(ctx, uuid, ["python3", "-c", PROBE_SCRIPT])
    code, out = _finish(ctx, cid, 180)
    try:
        seen = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [
            Row(
                "container: 1-GPU server runs torch",
                "exit 0 and a JSON line",
                f"exit {code}: {out[-200:]!r}",
                False,
            )
        ]
    inside = seen.get("uuid", "")
    inside = inside if inside.startswith("GPU-") else f"GPU-{inside}"
    err = seen.get("err")
    return [
        Row(
            "container: CUDA devices in a 1-GPU server",
            "1",
            str(seen.get("count")),
            seen.get("count") == 1,
        ),
        Row("container: its GPU by UUID", uuid, inside, inside == uuid),
        Row(
            "container: 2048^2 matmul on the GPU (rel. error)",
            "< 1e-3",
            f"{err:.1e}" if err is not None else "not run",
            err is not None and err < 1e-3,
        ),
    ]


def _wait_for(cond: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def check_load(ctx: Context) -> list[Row]:
    """The panel and the culler's signal against nvidia-smi under load (module docstring)."""
    missing = _need_image(ctx, "load: PyTorch image")
    if missing:
        return missing

    g = ctx.gpus[0]

    def smi_now() -> tuple[int, int]:
        util, used = _csv(
            ctx.smi(
                [
                    f"--id={g.index}",
                    "--query-gpu=utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                ]
            )
        )[0][:2]
        return int(util), int(used)

    panel = Sampler(ctx.nvml, allocation=None)
    history = GPUHistory()
    culler = NVMLSampler(history, nvml=ctx.nvml, uuids=lambda: [g.uuid])
    cid = _start(ctx, g.uuid, ["python3", "-c", LOAD_SCRIPT.replace("SECONDS", "40")])
    rows: list[Row] = []
    try:
        if not _wait_for(lambda: smi_now()[0] >= 50, 90):
            rows.append(
                Row(
                    "load: GPU busy under matmuls (nvidia-smi)",
                    ">= 50 %",
                    f"{smi_now()[0]} %",
                    False,
                )
            )
        best: tuple[float, float, float, int, int] | None = None
        for _ in range(5):  # the closest of five paired readings (NVML averages over ~1 s)
            snap = panel.sample_once()
            theirs_u, theirs_m = smi_now()
            mine = next((x for x in snap.get("gpus", []) if x["uuid"] == g.uuid), {})
            mu = float(mine.get("utilization_percent") or -100)
            mm = float(mine.get("memory_used_bytes") or 0) / MiB
            if best is None or abs(mu - theirs_u) < abs(best[0] - best[3]):
                best = (mu, mm, 0.0, theirs_u, theirs_m)
            culler.sample_once()
            time.sleep(1)
        assert best is not None
        mu, mm, _, tu, tm = best
        rows.append(
            Row(
                "load: panel utilisation vs nvidia-smi (points)",
                f"{tu} +- 5",
                f"{mu:.0f}",
                abs(mu - tu) <= 5,
            )
        )
        tol = 0.02 * g.memory_bytes / MiB
        rows.append(
            Row(
                "load: panel memory used vs nvidia-smi (MiB)",
                f"{tm} +- {tol:.0f}",
                f"{mm:.0f}",
                abs(mm - tm) <= tol,
            )
        )
        busy = history.mean([g.uuid], 60).mean
        rows.append(
            Row(
                "load: culler GPU signal, busy server",
                "busy (>= 5 %)",
                f"{busy:.0f} %" if busy is not None else "no samples",
                busy is not None and busy >= 5,
            )
        )
    finally:
        _finish(ctx, cid, 60)
    _wait_for(lambda: smi_now()[0] == 0, 30)
    idle_history = GPUHistory()
    idle = NVMLSampler(idle_history, nvml=ctx.nvml, uuids=lambda: [g.uuid])
    for _ in range(3):
        idle.sample_once()
        time.sleep(1)
    mean = idle_history.mean([g.uuid], 60).mean
    rows.append(
        Row(
            "load: culler GPU signal, idle server",
            "idle (< 5 %)",
            f"{mean:.0f} %" if mean is not None else "no samples",
            mean is not None and mean < 5,
        )
    )
    return rows


def _share_script(fraction: float, matmul: bool, hold: float) -> str:
    return (
        SHARE_SCRIPT.replace("FRACTION", repr(fraction))
        .replace("MATMUL", repr(matmul))
        .replace("HOLD", repr(hold))
    )


def start_mps_daemon(ctx: Context, uuid: str, command: Sequence[str] = DAEMON_COMMAND,
                     timeout: float = 20.0) -> tuple[MpsDaemon, str]:
    """Start the MPS control daemon of GPU ``uuid`` as the Docker backend does under
    ``mps-daemon`` (:func:`~gpuspawner.gpushare.mps.daemon_for`, the image ``ctx.image``,
    labelled :data:`CHECK_LABEL`) and wait for its control pipe.

    Returns:
        the daemon and its container id (stop it with :func:`stop_mps_daemon`).
    Raises:
        RuntimeError: the daemon exited, or made no control pipe in ``timeout`` seconds (the
            container is removed).
    """
    d = daemon_for("gpu-check", uuid, ctx.image, command, labels={CHECK_LABEL: "1"})
    for v in (d.pipe_volume, d.log_volume):
        ctx.engine.create_volume(v, labels=dict(d.labels))
    cid = ctx.engine.create_container(
        host_config=ctx.engine.create_host_config(**d.host_kwargs()), **d.create_kwargs())["Id"]
    ctx.engine.start(cid)

    def ready() -> bool:
        if not ctx.engine.inspect_container(cid)["State"]["Running"]:
            raise RuntimeError("the MPS daemon exited: " + ctx.engine.logs(cid, tail=5).decode(
                errors="replace").strip())
        ex = ctx.engine.exec_create(cid, list(READY_COMMAND))
        ctx.engine.exec_start(ex)
        return ctx.engine.exec_inspect(ex).get("ExitCode") == 0

    try:
        if not _wait_for(ready, timeout, 0.2):
            raise RuntimeError(f"the MPS daemon made no control pipe in {timeout:g} s")
    except Exception:
        stop_mps_daemon(ctx, d, cid)
        raise
    return d, cid


def stop_mps_daemon(ctx: Context, daemon: MpsDaemon, cid: str) -> None:
    """``quit`` to the daemon, then its container and both volumes removed (never raises)."""
    for step in (
        lambda: ctx.engine.exec_start(ctx.engine.exec_create(cid, list(QUIT_COMMAND))),
        lambda: ctx.engine.remove_container(cid, force=True),
        lambda: ctx.engine.remove_volume(daemon.pipe_volume, force=True),
        lambda: ctx.engine.remove_volume(daemon.log_volume, force=True),
    ):
        try:
            step()
        except Exception:  # noqa: BLE001 - gone already
            pass


def _shares_with(ctx: Context, mech: Any) -> list[Row]:
    """Two half shares of GPU 0 under one mechanism (under ``mps-daemon``, with the GPU's
    daemon started first and stopped after)."""

    g = ctx.gpus[0]
    daemon = start_mps_daemon(ctx, g.uuid) if getattr(mech, "mps_daemon", False) else None
    try:
        return _shares_under(ctx, mech, g, daemon[0] if daemon else None)
    finally:
        if daemon is not None:
            stop_mps_daemon(ctx, *daemon)


def _shares_under(ctx: Context, mech: Any, g: Any, daemon: MpsDaemon | None) -> list[Row]:
    gpus = {g.uuid: g}
    made: list[tuple[str, str]] = []
    outcome: dict[str, tuple[int | None, str]] = {}
    watched: list[tuple[str, str]] = []
    for who, fraction, matmul in (("over", 0.75, False), ("within", 0.40, True)):
        alloc = Allocation(
            id=Allocation.new_id(),
            owner=Owner(who, ""),
            node="local",
            gpus=(GPUShare(g.uuid, 500),),
            cpuset=(),
            mems=(),
            memory_bytes=0,
            disk_bytes=0,
        )
        lim = share_limits(alloc, gpus, mech, f"gpu-check-{who}")
        host: dict[str, Any] = {}
        if lim.cgroup_parent:
            prepare_dmem_cgroup(lim)
            host["cgroup_parent"] = lim.cgroup_parent
        if lim.mps_pipe_directory:
            host.update(
                ipc_mode="host",
                binds={lim.mps_pipe_directory: {"bind": lim.mps_pipe_directory, "mode": "rw"}},
            )
        if lim.mps_daemon_gpu and daemon is not None:
            host = client_host_config(host, daemon)
        hold = 60 if mech.name == "watchdog" else 5
        script = _share_script(fraction, matmul, hold)
        # sh stays pid 1 (the "server"); python is its child (the kernel)
        cid = ctx.engine.create_container(
            ctx.image,
            command=["sh", "-c", f"python3 -c '{script}'; echo exit $?"],
            environment=dict(lim.env),
            labels={
                CHECK_LABEL: "1",
                "gpuspawner.allocation": alloc.to_json(),
                "gpuspawner.user": who,
            },
            host_config=_gpu_host_config(ctx, g.uuid, **host),
        )["Id"]
        ctx.engine.start(cid)
        made.append((cid, lim.cgroup_parent))
        watched.append((cid, alloc.to_json()))
    try:
        if mech.name == "watchdog":
            dog = Watchdog(ctx.nvml, grace_s=ctx.grace_s, count=lambda kind: None)
            shares = shares_from_allocations(watched, gpus, mech)
            interrupted: set[str] = set()

            def tick() -> bool:
                for a in dog.check(shares):
                    if a.kind == "interrupt" and a.pids:
                        interrupted.add(a.share.user)
                return "over" in interrupted

            _wait_for(tick, 30 + ctx.grace_s, 1.0)
            states = {cid: ctx.engine.inspect_container(cid)["State"]["Running"] for cid, _ in made}
            for (cid, _), who in zip(made, ("over", "within"), strict=True):
                outcome[who] = _finish(ctx, cid, 90 if who == "within" else 10)
            over_ok = "interrupted" in outcome["over"][1]
            within_ok = (
                ("held" in outcome["within"][1] or states[made[1][0]])
                and "within" not in interrupted
                and "allocated" in outcome["within"][1]
            )
        else:
            for (cid, _), who in zip(made, ("over", "within"), strict=True):
                outcome[who] = _finish(ctx, cid, 120)
            over_ok = "oom" in outcome["over"][1]
            within_ok = "held" in outcome["within"][1]
    finally:
        for cid, parent in made:
            try:
                ctx.engine.remove_container(cid, force=True)
            except Exception:  # noqa: BLE001 - already removed
                pass
            remove_dmem_cgroup(parent)
    expect_over = "interrupted (SIGINT)" if mech.name == "watchdog" else "CUDA out of memory"
    name = "mps-daemon" if daemon is not None else mech.name
    last = {
        w: (o[1].strip().splitlines() or ["no output"])[
            -2 if len(o[1].strip().splitlines()) > 1 else -1
        ]
        for w, o in outcome.items()
    }
    return [
        Row(
            f"shares ({name}): share allocating 75 % of the GPU",
            expect_over,
            last.get("over", "?"),
            over_ok,
        ),
        Row(
            f"shares ({name}): the other half share, 40 % + matmul",
            "unaffected",
            last.get("within", "?"),
            within_ok,
        ),
    ]


def check_shares(ctx: Context) -> list[Row]:
    """Two shares on one GPU, per mechanism this node has (module docstring)."""
    missing = _need_image(ctx, "shares: PyTorch image")
    if missing:
        return missing

    mechs = [detect_mechanism("auto", ctx.gpus[:1])]
    if os.path.isdir("/tmp/nvidia-mps"):
        mechs.append(detect_mechanism("mps", ctx.gpus[:1]))
    else:  # gpuspawner's own daemon (two on one GPU would contend)
        mechs.append(detect_mechanism("mps-daemon", ctx.gpus[:1]))
    if mechs[0].name != "watchdog":
        mechs.append(Mechanism("watchdog", "always"))
    rows = []
    for m in mechs:
        try:
            rows += _shares_with(ctx, m)
        except Exception as e:  # noqa: BLE001 - a row, not a traceback
            name = "mps-daemon" if m.mps_daemon else m.name
            rows.append(Row(f"shares ({name})", "two shares run", f"error: {e}", False))
    return rows


CHECKS: dict[str, Callable[[Context], list[Row]]] = {
    "inventory": check_inventory,
    "health": check_health,
    "mig": check_mig,
    "container": check_container,
    "load": check_load,
    "shares": check_shares,
}


def run_checks(ctx: Context, names: Sequence[str]) -> list[Row]:
    """The rows of the named checks, in order; a check that raises is one failed row."""
    rows: list[Row] = []
    for name in names:
        try:
            # read_gpus and read_health end their own NVML session: NVML counts sessions
            # (nvmlInit/nvmlShutdown pairs), a stand-in may not; one more keeps it open
            ctx.nvml.nvmlInit()
            rows += CHECKS[name](ctx)
        except Exception as e:  # noqa: BLE001
            rows.append(Row(f"{name}", "runs", f"error: {type(e).__name__}: {e}", False))
    return rows


def render(rows: Sequence[Row]) -> str:
    """The table: a header and one line per row, columns padded (long cells are cut at 60
    characters)."""
    head = ("check", "expected", "seen", "ok")
    cells = [head] + [(r.check, r.expected, r.seen, "ok" if r.ok else "MISMATCH") for r in rows]
    cells = [tuple(c if len(c) <= 60 else c[:57] + "..." for c in line) for line in cells]
    widths = [max(len(line[i]) for line in cells) for i in range(4)]
    out = [
        " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def exit_status(rows: Sequence[Row]) -> int:
    """0 when every row is ok (and there is one), else 1."""
    return 0 if rows and all(r.ok for r in rows) else 1


def main(
    argv: Sequence[str] | None = None,
    *,
    nvml: Any = None,
    smi: Callable[[Sequence[str]], str] | None = None,
    engine: Any = None,
) -> int:
    """The command (``python -m gpuspawner.gpushare.check``); returns the exit status."""
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help=f"comma separated, of {', '.join(CHECKS)} (default: all)",
    )
    p.add_argument("--image", default=DEFAULT_IMAGE, help="the PyTorch image")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.checks.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s): {', '.join(unknown)}")
    try:
        nv = probe(nvml)
    except NoGPU as e:
        print(e)
        return 2
    if engine is None and any(n in names for n in ("container", "load", "shares")):
        try:
            import docker

            engine = docker.APIClient(version="auto", timeout=200)
        except Exception:  # noqa: BLE001 - rows say the engine is missing
            engine = None
    ctx = Context(nvml=nv, smi=smi or smi_runner, engine=engine, image=args.image)
    started = time.monotonic()
    try:
        if "inventory" not in names:  # the GPUs the other checks use
            ctx.gpus = list(read_gpus(nv))
        rows = run_checks(ctx, names)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    print(render(rows))
    print(f"{sum(r.ok for r in rows)}/{len(rows)} ok in {time.monotonic() - started:.0f} s")
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
