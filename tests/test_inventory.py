"""Local inventory: fake sysfs/procfs trees in tmp_path and the NVML test double; the CLI."""

from __future__ import annotations

import inspect
import itertools
import logging
import shutil
import sys
import types
from pathlib import Path

import pytest

import gpuspawner
from gpuspawner.cli import main
from gpuspawner.inventory.local import (
    gpu_model_alias,
    read_gpus,
    read_local_node,
    read_numa_nodes,
    sysfs_pci_address,
)
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement.model import GPULink, NumaNode

try:
    from tests import nvml_double as nd
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import nvml_double as nd  # type: ignore[no-redef]

FakeGPU, FakeNVML = nd.FakeGPU, nd.FakeNVML
GiB = 1024**3
KiB = 1024


def make_fs(root: Path, numa: dict[int, tuple[str, int]] | None = None, *, online: str = "0-7",
            proc_mem_kb: int = 16 * 1024 * 1024, pci_numa: dict[str, str] | None = None,
            node_dir: bool = True) -> tuple[str, str]:
    """A fake sysfs and procfs under ``root``: ``numa`` maps node id -> (cpulist, MemTotal kB).

    Returns (sysfs_root, proc_root).
    """
    sysfs, proc = root / "sys", root / "proc"
    (sysfs / "devices/system/cpu").mkdir(parents=True)
    (sysfs / "devices/system/cpu/online").write_text(online + "\n")
    if node_dir:
        (sysfs / "devices/system/node").mkdir(parents=True)
        (sysfs / "devices/system/node/possible").write_text("0-1\n")  # a file, not a node
    for nid, (cpus, kb) in (numa or {}).items():
        d = sysfs / f"devices/system/node/node{nid}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(
            f"Node {nid} MemTotal:       {kb} kB\nNode {nid} MemFree:        {kb // 2} kB\n")
    for addr, value in (pci_numa or {}).items():
        d = sysfs / "bus/pci/devices" / addr
        d.mkdir(parents=True)
        (d / "numa_node").write_text(value + "\n")
    proc.mkdir()
    (proc / "meminfo").write_text(f"MemTotal:       {proc_mem_kb} kB\nMemFree:  1 kB\n")
    return str(sysfs), str(proc)


TWO_NUMA = {0: ("0-3", 8 * 1024 * 1024), 1: ("4-7", 4 * 1024 * 1024)}


def a100(i: int, **kw: object) -> FakeGPU:
    bus = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"][i]
    defaults: dict[str, object] = {
        "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
        "pci_bus_id": f"00000000:{bus}:00.0", "numa_node": 0 if i < 4 else 1,
    }
    defaults.update(kw)
    return FakeGPU(**defaults)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(("name", "alias"), [
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA H100 PCIe", "H100"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100"),
    ("Tesla V100S-PCIE-32GB", "V100S"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090 Ti"),
    ("Quadro RTX 8000", "RTX 8000"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA", "NVIDIA"),
])
def test_gpu_model_alias(name: str, alias: str) -> None:
    assert gpu_model_alias(name) == alias


@pytest.mark.parametrize(("bus", "addr"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    ("0000:3b:00.0", "0000:3b:00.0"),
    ("00000001:AF:1F.7", "0001:af:1f.7"),
    ("3B:00.0", "0000:3b:00.0"),
])
def test_sysfs_pci_address(bus: str, addr: str) -> None:
    assert sysfs_pci_address(bus) == addr


@pytest.mark.parametrize("bad", ["", "3B", "0000:3B:00", "zz:00.0", "0:1:2:3.0"])
def test_sysfs_pci_address_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        sysfs_pci_address(bad)


# --------------------------------------------------------------------------- NUMA


def test_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    assert read_numa_nodes(sysfs, proc) == (
        NumaNode(0, (0, 1, 2, 3), 8 * GiB),
        NumaNode(1, (4, 5, 6, 7), 4 * GiB),
    )


def test_offline_cpus_and_memory_only_nodes_are_left_out(tmp_path: Path) -> None:
    numa = {0: ("0-3", 1024), 1: ("4-7", 2048), 2: ("", 999999), 10: ("8-9", 4096)}
    sysfs, proc = make_fs(tmp_path, numa, online="0-2,4-9")
    nodes = read_numa_nodes(sysfs, proc)
    assert [n.id for n in nodes] == [0, 1, 10]  # numeric order, node2 has no CPUs
    assert nodes[0].cpus == (0, 1, 2)  # CPU 3 offline
    assert nodes[2].memory_bytes == 4096 * KiB


@pytest.mark.parametrize("node_dir", [False, True])
def test_no_numa_falls_back_to_one_node(tmp_path: Path, node_dir: bool) -> None:
    sysfs, proc = make_fs(tmp_path, None, online="0-5,8", proc_mem_kb=1000,
                          node_dir=node_dir)
    assert read_numa_nodes(sysfs, proc) == (NumaNode(0, (0, 1, 2, 3, 4, 5, 8), 1000 * KiB),)


def test_malformed_meminfo_is_an_error(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, {0: ("0-1", 1)})
    Path(sysfs, "devices/system/node/node0/meminfo").write_text("garbage\n")
    with pytest.raises(ValueError, match="MemTotal"):
        read_numa_nodes(sysfs, proc)


# --------------------------------------------------------------------------- GPUs


def test_double_matches_real_pynvml() -> None:
    """Every name the double offers exists in nvidia-ml-py with the same parameters/values."""
    pynvml = pytest.importorskip("pynvml")
    fake = FakeNVML()
    for fn in FakeNVML.FUNCTIONS:
        real = getattr(pynvml, fn)
        assert callable(real), fn
        real_params = list(inspect.signature(real).parameters)
        fake_params = list(inspect.signature(getattr(fake, fn)).parameters)
        assert fake_params == real_params, fn
    for name in dir(nd):
        value = getattr(nd, name)
        if name.startswith(("NVML_ERROR_", "NVML_TOPOLOGY_", "NVML_FEATURE_", "NVML_SUCCESS",
                            "NVML_MEMORY_ERROR_TYPE_", "NVML_VOLATILE_ECC",
                            "NVML_AGGREGATE_ECC", "NVML_PAGE_RETIREMENT_CAUSE_",
                            "NVML_DEVICE_MIG_",
                            "nvmlEventType")):
            assert getattr(pynvml, name) == value, name
        if name.startswith("NVMLError_"):
            real_cls = getattr(pynvml, name)
            assert issubclass(real_cls, pynvml.NVMLError)
            assert real_cls(0).value == value(0).value, name
    assert isinstance(nd.NVMLError(nd.NVML_ERROR_GPU_IS_LOST), nd.NVMLError_GpuIsLost)


def test_two_gpus_direct_nvlink(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    g0 = a100(0, nvlinks=["00000000:0F:00.0", None, "00000000:0F:00.0"])
    g1 = a100(1, name="NVIDIA A100 80GB PCIe", memory_total=81920 * 1024**2,
              nvlinks=["00000000:07:00.0"])
    nvml = FakeNVML([g0, g1])
    node = read_local_node("n1", sysfs_root=sysfs, proc_root=proc, disk_path=str(tmp_path),
                           nvml=nvml)
    assert node.name == "n1"
    assert [g.uuid for g in node.gpus] == [g0.uuid, g1.uuid]
    a, b = node.gpus
    assert (a.index, b.index) == (0, 1)
    assert a.model == b.model == "A100"
    assert b.memory_bytes == 80 * GiB
    assert a.pci_bus_id == "00000000:07:00.0"
    assert a.numa_node == 0 and a.shareable is False
    assert a.link_to(b.uuid) is GPULink.NVLINK and b.link_to(a.uuid) is GPULink.NVLINK
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)
    assert node.disk_bytes == shutil.disk_usage(tmp_path).total
    assert node.numa_nodes == read_numa_nodes(sysfs, proc)


def test_nvswitch_and_pcie_levels(tmp_path: Path) -> None:
    """Four GPUs on NVSwitches (common non-GPU remote ends), a fifth without NVLink: that one
    gets the PCIe levels of nvmlDeviceGetTopologyCommonAncestor."""
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    switches = ["00000000:C8:00.0", "00000000:C9:00.0"]
    gpus = [a100(i, nvlinks=list(switches)) for i in range(4)]
    gpus.append(a100(4, name="Tesla T4", nvlinks=[]))
    nvml = FakeNVML(gpus, topology={(0, 4): nd.NVML_TOPOLOGY_SINGLE,
                                    (1, 4): nd.NVML_TOPOLOGY_HOSTBRIDGE})
    node = read_local_node("n", sysfs_root=sysfs, proc_root=proc, disk_path=str(tmp_path),
                           nvml=nvml)
    g = node.gpus
    for x, y in itertools.permutations(g[:4], 2):
        assert x.link_to(y.uuid) is GPULink.NVLINK
    assert g[4].model == "T4" and g[4].numa_node == 1
    assert g[0].link_to(g[4].uuid) is GPULink.SINGLE
    assert g[4].link_to(g[1].uuid) is GPULink.HOSTBRIDGE
    assert g[4].link_to(g[2].uuid) is GPULink.SYSTEM  # NUMA 0 vs 1, the double's default


def test_pcie_pair_without_nvlink_is_not_nvlink(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0), a100(1)], topology={(0, 1): nd.NVML_TOPOLOGY_MULTIPLE})
    gpus = read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    assert gpus[0].link_to(gpus[1].uuid) is GPULink.MULTIPLE


def test_gpu_numa_from_sysfs_when_nvml_lacks_it(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA, pci_numa={"0000:07:00.0": "1",
                                                         "0000:0f:00.0": "0"})
    nvml = FakeNVML([a100(0, numa_node=0), a100(1, numa_node=1)], has_numa_node_id=False)
    assert not hasattr(nvml, "nvmlDeviceGetNumaNodeId")
    gpus = read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    assert [g.numa_node for g in gpus] == [1, 0]  # sysfs wins, not the double's numa_node


def test_gpu_numa_from_sysfs_when_nvml_not_supported(tmp_path: Path) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA, pci_numa={"0000:07:00.0": "1"})
    gpus = read_gpus(FakeNVML([a100(0, numa_node=None)]), sysfs_root=sysfs, numa_ids=[0, 1])
    assert gpus[0].numa_node == 1


@pytest.mark.parametrize(("numa_ids", "sysfs_value", "expected"), [
    ([0, 1], "-1", None),  # unknown on a two-socket host
    ([0], "-1", 0),  # the only NUMA node
    ([5], "-1", 5),
    ([0, 1], "3", None),  # not one of the host's NUMA nodes with CPUs
    ([0, 1], "junk", None),
])
def test_gpu_numa_minus_one_rule(tmp_path: Path, numa_ids: list[int], sysfs_value: str,
                                 expected: int | None, caplog: pytest.LogCaptureFixture) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA, pci_numa={"0000:07:00.0": sysfs_value})
    nvml = FakeNVML([a100(0)], has_numa_node_id=False)
    with caplog.at_level(logging.WARNING):
        gpus = read_gpus(nvml, sysfs_root=sysfs, numa_ids=numa_ids)
    assert gpus[0].numa_node == expected
    if expected is None:
        assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_bytes_returns_are_decoded(tmp_path: Path) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0, nvlinks=["00000000:0F:00.0"]), a100(1)], return_bytes=True)
    nvml.nvmlInit()
    assert isinstance(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0)), bytes)
    nvml.nvmlShutdown()
    gpus = read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    assert gpus[0].uuid == "GPU-00000000-aaaa-bbbb-cccc-000000000000"
    assert isinstance(gpus[0].uuid, str) and isinstance(gpus[0].pci_bus_id, str)
    assert gpus[0].model == "A100"
    assert gpus[0].link_to(gpus[1].uuid) is GPULink.NVLINK


@pytest.mark.parametrize("code", [nd.NVML_ERROR_LIBRARY_NOT_FOUND, nd.NVML_ERROR_DRIVER_NOT_LOADED,
                                  nd.NVML_ERROR_NO_PERMISSION])
def test_no_nvml_means_zero_gpus(tmp_path: Path, code: int,
                                 caplog: pytest.LogCaptureFixture) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0)], init_error=code)
    with caplog.at_level(logging.INFO, logger="gpuspawner.inventory.local"):
        node = read_local_node("cpu", sysfs_root=sysfs, proc_root=proc,
                               disk_path=str(tmp_path), nvml=nvml)
    assert node.gpus == ()
    assert node.cpu_count == 8
    assert nvml.init_calls == 1 and nvml.shutdown_calls == 0
    infos = [r for r in caplog.records if r.name == "gpuspawner.inventory.local"]
    assert infos and all(r.levelno == logging.INFO for r in infos)


def test_pynvml_not_importable_means_zero_gpus(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    node = read_local_node("n", sysfs_root=sysfs, proc_root=proc, disk_path=str(tmp_path))
    assert node.gpus == ()


def test_real_pynvml_without_driver_means_zero_gpus(tmp_path: Path) -> None:
    """On a machine without NVML (like CI), the real binding must give zero GPUs, no error."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here; covered by the gpu-marked test")
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    node = read_local_node("n", sysfs_root=sysfs, proc_root=proc, disk_path=str(tmp_path))
    assert node.gpus == ()


def test_count_error_gives_zero_gpus_and_shuts_down(tmp_path: Path) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0)], count_error=nd.NVML_ERROR_UNKNOWN)
    assert read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1]) == ()
    assert nvml.shutdown_calls == 1 and not nvml.initialized


@pytest.mark.parametrize("fn", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
                                "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                                "nvmlDeviceGetPciInfo"])
def test_device_error_skips_only_that_device(tmp_path: Path, fn: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA)
    gpus = [a100(0), a100(1, fail={fn: nd.NVML_ERROR_GPU_IS_LOST}), a100(2)]
    nvml = FakeNVML(gpus)
    with caplog.at_level(logging.WARNING):
        got = read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    assert [g.uuid for g in got] == [gpus[0].uuid, gpus[2].uuid]
    assert [g.index for g in got] == [0, 2]
    assert gpus[1].uuid not in got[0].links
    assert any("GPU 1" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    assert nvml.shutdown_calls == 1


def test_optional_queries_failing_do_not_skip_the_device(tmp_path: Path) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA, pci_numa={"0000:07:00.0": "1"})
    fail = {"nvmlDeviceGetNvLinkState": nd.NVML_ERROR_UNKNOWN,
            "nvmlDeviceGetNumaNodeId": nd.NVML_ERROR_FUNCTION_NOT_FOUND,
            "nvmlDeviceGetTopologyCommonAncestor": nd.NVML_ERROR_NOT_SUPPORTED}
    nvml = FakeNVML([a100(0, fail=fail, nvlinks=["00000000:0F:00.0"]), a100(1, numa_node=1)])
    got = read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    assert len(got) == 2
    assert got[0].numa_node == 1  # from sysfs
    assert got[0].link_to(got[1].uuid) is GPULink.NODE  # fallback: same NUMA node 1


def test_nvlink_scan_stops_early_without_nvlink(tmp_path: Path) -> None:
    sysfs, _ = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0)])
    read_gpus(nvml, sysfs_root=sysfs, numa_ids=[0, 1])
    states = [c for c in nvml.calls if c[0] == "nvmlDeviceGetNvLinkState"]
    assert len(states) == 1


@pytest.mark.gpu
def test_real_nvml(tmp_path: Path) -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"nvmlInit() failed: {e}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(count)]
    finally:
        pynvml.nvmlShutdown()
    node = read_local_node("real", disk_path=str(tmp_path))
    assert [g.uuid for g in node.gpus] == [u.decode() if isinstance(u, bytes) else u
                                           for u in uuids]
    for g in node.gpus:
        assert g.memory_bytes > 0 and g.model and g.pci_bus_id
        for o in node.gpus:
            if o is not g:
                assert g.link_to(o.uuid) in GPULink
    out = tmp_path / "real.yaml"
    from gpuspawner.inventory.topology import dump_topology
    out.write_text(dump_topology(node))
    back = load_topology_file(out)
    assert back == node


# --------------------------------------------------------------------------- CLI


def test_cli_inventory_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    nvml = FakeNVML([a100(0, nvlinks=["00000000:0F:00.0"]), a100(1), a100(5, name="Tesla T4")])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    rc = main(["inventory", "--name", "node-7", "--sysfs-root", sysfs, "--proc-root", proc,
               "--disk-path", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    path = tmp_path / "node-7.yaml"
    path.write_text(out)
    back = load_topology_file(path)
    direct = read_local_node("node-7", sysfs_root=sysfs, proc_root=proc,
                             disk_path=str(tmp_path), nvml=FakeNVML(nvml.gpus))
    assert back == direct
    assert back.name == "node-7" and len(back.gpus) == 3
    g = back.gpus
    assert g[0].link_to(g[1].uuid) is GPULink.NVLINK
    assert g[0].link_to(g[2].uuid) is GPULink.SYSTEM
    assert g[1].link_to(g[0].uuid) is GPULink.NVLINK
    assert g[2].model == "T4"


def test_cli_inventory_output_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, proc = make_fs(tmp_path, TWO_NUMA)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(init_error=nd.NVML_ERROR_DRIVER_NOT_LOADED))
    out = tmp_path / "o.yaml"
    assert main(["inventory", "--name", "cpu", "--sysfs-root", sysfs, "--proc-root", proc,
                 "--disk-path", str(tmp_path), "-o", str(out)]) == 0
    node = load_topology_file(out)
    assert node.gpus == () and node.cpu_count == 8


def test_cli_inventory_unreadable_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "--sysfs-root", str(tmp_path / "none"),
                 "--proc-root", str(tmp_path / "none")]) == 1
    assert "cannot read this host" in capsys.readouterr().err


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["inventory", "--bogus"]) == 2
    assert main(["nope"]) == 2


def test_cli_simulate_delegates(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("gpuspawner.simulate")
    seen: list[int] = []

    def add_arguments(parser: object) -> None:
        parser.add_argument("--steps", type=int, default=1)  # type: ignore[attr-defined]

    def run(args: object) -> int:
        seen.append(args.steps)  # type: ignore[attr-defined]
        return 7

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setattr(gpuspawner.cli, "simulate", fake)  # (imported at the CLI's top)
    assert main(["simulate", "--steps", "3"]) == 7
    assert seen == [3]
    assert main(["simulate", "--unknown"]) == 2
