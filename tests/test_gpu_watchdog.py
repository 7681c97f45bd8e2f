"""The GPU share watchdog (:mod:`gpuspawner.gpushare.watchdog`) on real containers and
processes, NVML's per-process memory from the test double: each process is attributed to its
container through its real ``/proc/<pid>/cgroup``; the share over its memory is warned, then,
after the grace period, only its kernel gets SIGINT (seen by the kernel itself); the server
(pid 1 of the container) and the other share are untouched."""

from __future__ import annotations

import os
import time

import pytest

from gpuspawner.gpushare.mechanism import Mechanism
from gpuspawner.gpushare.watchdog import (
    Watchdog,
    container_of,
    namespace_pid,
    shares_from_allocations,
)
from gpuspawner.placement.model import Allocation, GPUShare, Owner
from gpuspawner.testing import nvml_double as nd
from gpuspawner.testing.nvml_metrics import MetricsNVML
from tests.test_gpu_share import A100, UUID, GiB  # the same 80 GiB shareable A100

CID = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "line",
    [
        f"12:memory:/docker/{CID}",  # v1, cgroupfs
        f"0::/system.slice/docker-{CID}.scope",  # v2, systemd driver
        f"0::/gpuspawner/jupyter-alice/{CID}",  # a dmem cgroup parent
    ],
)
def test_the_container_id_is_read_from_the_cgroup_path(tmp_path, line):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"1:name=systemd:/init.scope\n{line}\n")
    assert container_of(42, str(tmp_path)) == CID
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    assert container_of(43, str(tmp_path)) is None
    assert container_of(44, str(tmp_path)) is None  # gone


def allocation(user: str, milli: int) -> str:
    return Allocation(
        id=f"a-{user}",
        owner=Owner(user, ""),
        node="n",
        gpus=(GPUShare(UUID, milli),),
        cpuset=(0,),
        mems=(0,),
        memory_bytes=GiB,
        disk_bytes=0,
    ).to_json()


def test_whole_gpus_and_unparsable_labels_are_not_watched():
    shares = shares_from_allocations(
        [
            ("a" * 64, allocation("ann", 250)),
            ("b" * 64, allocation("ben", 1000)),
            ("c" * 64, "{not json"),
        ],
        {UUID: A100},
        Mechanism("watchdog", ""),
    )
    assert list(shares) == ["a" * 64]
    assert shares["a" * 64].limits == {UUID: 20 * GiB} and shares["a" * 64].user == "ann"


# ------------------------------------------------------------------ real containers
docker = pytest.importorskip("docker")
IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")
#: the "kernel": reports SIGINT (KeyboardInterrupt), keeps running like ipykernel does
KERNEL = (
    "import sys, time\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    try:\n"
    "        time.sleep(3600)\n"
    "    except KeyboardInterrupt:\n"
    "        print('interrupted', flush=True)\n"
)


@pytest.fixture
def containers():
    try:
        cli = docker.APIClient(version="auto")
        cli.inspect_image(IMAGE)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"needs a Docker engine and {IMAGE}: {e}")
    made: list[str] = []

    def start(user: str) -> tuple[str, int, int]:
        """A container whose pid 1 (the "server", sh) runs the kernel as a child; returns
        (container id, host pid of the server, host pid of the kernel)."""
        cid = cli.create_container(
            IMAGE,
            command=["sh", "-c", f'python3 -c "{KERNEL}"; echo done'],
            labels={"gpuspawner.test": "watchdog", "gpuspawner.user": user},
            host_config=cli.create_host_config(network_mode="none"),
        )["Id"]
        made.append(cid)
        cli.start(cid)
        deadline = time.monotonic() + 30
        while b"ready" not in cli.logs(cid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert b"ready" in cli.logs(cid)
        top = cli.top(cid, ps_args="-o pid,ppid,args")
        rows = [dict(zip(top["Titles"], r, strict=True)) for r in top["Processes"]]
        server = next(int(r["PID"]) for r in rows if r["COMMAND"].startswith("sh"))
        kernel = next(int(r["PID"]) for r in rows if r["COMMAND"].startswith("python3"))
        return cid, server, kernel

    yield cli, start
    for cid in made:
        cli.remove_container(cid, force=True)


@pytest.mark.docker
def test_only_the_kernel_over_its_share_is_interrupted(containers):
    cli, start = containers
    over_cid, over_server, over_kernel = start("ann")
    ok_cid, ok_server, ok_kernel = start("ben")
    assert container_of(over_kernel) == over_cid and container_of(ok_kernel) == ok_cid
    assert namespace_pid(over_server) == 1 and namespace_pid(over_kernel) != 1
    # NVML's answer: ann's kernel 30 GiB and her server 1 GiB (over her 20 GiB share), ben's
    # kernel 12 GiB (within his); a process of no container at all with 40 GiB
    nvml = MetricsNVML(
        [nd.FakeGPU(UUID)],
        procs={
            0: [
                (over_kernel, 30 * GiB),
                (over_server, 1 * GiB),
                (ok_kernel, 12 * GiB),
                (os.getpid(), 40 * GiB),
            ]
        },
    )
    nvml.nvmlInit()
    shares = shares_from_allocations(
        [(over_cid, allocation("ann", 250)), (ok_cid, allocation("ben", 250))],
        {UUID: A100},
        Mechanism("watchdog", ""),
    )
    counted: list[str] = []
    notices: list[str] = []
    dog = Watchdog(
        nvml,
        grace_s=10,
        count=counted.append,
        notify=lambda a: notices.append(f"{a.kind} {a.share.user}"),
    )
    first = dog.check(shares, now=100.0)
    assert [(a.kind, a.share.user, a.used_bytes) for a in first] == [("warn", "ann", 31 * GiB)]
    # what ann reads in her Lab GPU panel (the service's gpu_share_notices): over, and when
    (note,) = dog.notices["ann"]
    assert (note.server, note.used_bytes, note.limit_bytes, note.interrupted) == \
        ("", 31 * GiB, 20 * GiB, ())
    assert 9 <= note.interrupt_at - time.time() <= 10.5 and set(dog.notices) == {"ann"}
    assert note.message().startswith("Your kernels use 31.0 GiB of GPU memory, over your share "
                                     "of 20.0 GiB: the kernel using the most is interrupted at ")
    assert dog.check(shares, now=105.0) == []  # within the grace: nothing more
    assert 4 <= dog.notices["ann"][0].interrupt_at - time.time() <= 5.5
    assert b"interrupted" not in cli.logs(over_cid)
    (act,) = dog.check(shares, now=110.0)
    assert act.kind == "interrupt" and act.share.user == "ann" and act.pids == (over_kernel,)
    assert dog.notices["ann"][0].interrupted == (over_kernel,)
    assert "was interrupted" in dog.notices["ann"][0].to_dict()["message"]
    deadline = time.monotonic() + 10
    while b"interrupted" not in cli.logs(over_cid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert b"interrupted" in cli.logs(over_cid)  # the kernel got SIGINT ...
    for cid in (over_cid, ok_cid):  # ... and every server (pid 1) and kernel still runs
        assert cli.inspect_container(cid)["State"]["Running"]
        assert b"done" not in cli.logs(cid)
    assert b"interrupted" not in cli.logs(ok_cid)  # the other share is untouched
    assert os.path.exists(f"/proc/{ok_kernel}") and os.path.exists(f"/proc/{over_kernel}")
    assert counted == ["warn", "interrupt"] and notices == ["warn ann", "interrupt ann"]
    # back under its share (the kernel freed memory): forgotten, a later excess warns anew
    nvml.procs = {0: [(over_kernel, 5 * GiB), (ok_kernel, 12 * GiB)]}
    assert dog.check(shares, now=111.0) == [] and not dog.over_since and dog.notices == {}


def test_the_interrupt_is_counted_in_the_metrics(tmp_path):
    from gpuspawner.hub.metrics import GPU_SHARE_ACTIONS, REGISTRY, gpu_share_action

    before = (
        REGISTRY.get_sample_value("gpuspawner_gpu_share_actions_total", {"action": "warn"}) or 0
    )
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(f"0::/docker/{CID}\n")
    nvml = MetricsNVML([nd.FakeGPU(UUID)], procs={0: [(7, 25 * GiB)]})
    nvml.nvmlInit()
    shares = shares_from_allocations(
        [(CID, allocation("ann", 250))], {UUID: A100}, Mechanism("watchdog", "")
    )
    sent: list[tuple[int, int]] = []
    dog = Watchdog(
        nvml,
        grace_s=0,
        proc_root=str(tmp_path),
        count=gpu_share_action,
        kill=lambda pid, sig: sent.append((pid, sig)),
    )  # as the hub makes it
    kinds = [a.kind for a in dog.check(shares, now=0.0)]
    assert kinds == ["warn", "interrupt"] and sent == [(7, 2)]
    assert (
        REGISTRY.get_sample_value("gpuspawner_gpu_share_actions_total", {"action": "warn"})
        == before + 1
    )
    assert GPU_SHARE_ACTIONS is not None
