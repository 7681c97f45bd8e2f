"""The NVML double extended with the dynamic functions gpuspawner.singleuser.gpuviews samples
(utilisation, temperature, power, processes, MIG), and unit tests of the sampler on it.

``metrics_double`` / ``mig_double`` / ... are also named by ``GPUSPAWNER_NVML_FACTORY`` in the
kernel extension's test (``tests.test_gpuviews_nvml:metrics_double``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpuspawner.singleuser.gpuviews.sampler import Sampler, load_nvml, sparkline
from tests import nvml_double as nd

GiB = nd.GiB
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0 = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"


class MetricsNVML(nd.FakeNVML):
    """FakeNVML plus utilisation, temperature, power, processes and MIG, with the same names and
    return shapes as pynvml (checked in :func:`test_extended_double_matches_pynvml`)."""

    EXTRA = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
             "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses",
             "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
             "nvmlDeviceGetMigDeviceHandleByIndex")

    def __init__(self, gpus=(), *, util=None, used=None, temp=None, power_mw=None,
                 procs=None, mig=None, **kw: Any) -> None:
        super().__init__(gpus, **kw)
        self.util = util or {}          # index -> percent
        self.used = used or {}          # index -> bytes
        self.temp = temp or {}          # index -> C
        self.power_mw = power_mw or {}  # index -> mW
        self.procs = procs or {}        # index -> [(pid, bytes|None)]
        self.mig = mig or {}            # index -> [FakeGPU of each MIG instance]

    def _dev(self, fn: str, h: Any) -> nd.FakeGPU:
        if isinstance(h, _MigHandle):
            return self.mig[h.parent][h.index]
        return self._device(fn, h)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        g = self._dev("nvmlDeviceGetMemoryInfo", handle)
        if "nvmlDeviceGetMemoryInfo" in g.fail:
            raise nd.NVMLError(g.fail["nvmlDeviceGetMemoryInfo"])
        key = handle.index if not isinstance(handle, _MigHandle) else (handle.parent,
                                                                       handle.index)
        used = self.used.get(key, 0)
        return nd._Struct(total=g.memory_total, free=g.memory_total - used, used=used)

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        return self._s(self._dev("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return self._s(self._dev("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        if isinstance(handle, _MigHandle):
            raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        if isinstance(handle, _MigHandle):
            raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetNumaNodeId(handle)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        if isinstance(handle, _MigHandle) or handle.index in self.mig:
            raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)
        self._device("nvmlDeviceGetUtilizationRates", handle)
        return nd._Struct(gpu=self.util.get(handle.index, 0), memory=0)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if isinstance(handle, _MigHandle):
            raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)
        self._device("nvmlDeviceGetTemperature", handle)
        return self.temp.get(handle.index, 40)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        if isinstance(handle, _MigHandle):
            raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)
        self._device("nvmlDeviceGetPowerUsage", handle)
        return self.power_mw.get(handle.index, 60000)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if isinstance(handle, _MigHandle):
            return []
        self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return [nd._Struct(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF,
                           computeInstanceId=0xFFFFFFFF)
                for pid, mem in self.procs.get(handle.index, [])]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._device("nvmlDeviceGetMigMode", handle)
        if handle.index in self.mig:
            return [1, 1]
        raise nd.NVMLError(nd.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._device("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if handle.index in self.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        self._device("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        if not 0 <= index < len(self.mig.get(handle.index, [])):
            raise nd.NVMLError(nd.NVML_ERROR_NOT_FOUND)
        return _MigHandle(handle.index, index)


class _MigHandle:
    def __init__(self, parent: int, index: int) -> None:
        self.parent, self.index = parent, index


# ---------------------------------------------------------------- factories (by import path)
def metrics_double() -> MetricsNVML:
    """Two A100s: 37 % / 80 % busy, 10 / 20 GiB used, one process on GPU 0."""
    return MetricsNVML(
        [nd.FakeGPU(UUID0, pci_bus_id="00000000:07:00.0", numa_node=0),
         nd.FakeGPU(UUID1, pci_bus_id="00000000:87:00.0", numa_node=1)],
        util={0: 37, 1: 80}, used={0: 10 * GiB, 1: 20 * GiB}, temp={0: 51, 1: 63},
        power_mw={0: 123000, 1: 250500}, procs={0: [(4242, 3 * GiB)]})


def mig_double() -> MetricsNVML:
    """One A100 in MIG mode with two 1g.10gb instances."""
    return MetricsNVML(
        [nd.FakeGPU(UUID0, pci_bus_id="00000000:07:00.0", numa_node=0)],
        mig={0: [nd.FakeGPU(MIG0, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                            memory_total=10 * GiB),
                 nd.FakeGPU("MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb",
                            name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", memory_total=10 * GiB)]},
        used={(0, 0): 1 * GiB})


def no_nvml_double() -> MetricsNVML:
    return MetricsNVML(init_error=nd.NVML_ERROR_LIBRARY_NOT_FOUND)


def no_gpu_double() -> MetricsNVML:
    return MetricsNVML([])


def permission_double() -> MetricsNVML:
    return MetricsNVML([nd.FakeGPU(UUID0)], count_error=nd.NVML_ERROR_NO_PERMISSION)


def device_permission_double() -> MetricsNVML:
    return MetricsNVML([nd.FakeGPU(UUID0, fail={"nvmlDeviceGetUUID":
                                                nd.NVML_ERROR_NO_PERMISSION})])


def error_double() -> MetricsNVML:
    return MetricsNVML([nd.FakeGPU(UUID0)], count_error=nd.NVML_ERROR_UNKNOWN)


# ---------------------------------------------------------------- tests
def test_extended_double_matches_pynvml() -> None:
    import inspect

    import pynvml
    for name in MetricsNVML.EXTRA:
        real = getattr(pynvml, name)
        ours = getattr(MetricsNVML, name)
        nreal = len(inspect.signature(real).parameters)
        nours = len(inspect.signature(ours).parameters) - 1  # self
        assert nreal == nours, (name, nreal, nours)


def test_sample_values() -> None:
    s = Sampler(metrics_double(), allocation={"gpus": [{"uuid": UUID0, "milli": 1000}]})
    snap = s.sample_once()
    assert snap["state"] == "ok"
    g0, g1 = snap["gpus"]
    assert g0["utilization_percent"] == 37.0 and g1["utilization_percent"] == 80.0
    assert g0["memory_used_bytes"] == 10 * GiB and g0["memory_total_bytes"] == 80 * GiB
    assert g0["temperature_c"] == 51.0 and g1["power_w"] == 250.5
    assert g0["processes"] == [{"pid": 4242, "used_memory_bytes": 3 * GiB, "kernel_id": None}]
    view = s.gpus_view()
    assert [g["in_allocation"] for g in view["gpus"]] == [True, False]
    assert any("outside" in w and UUID1 in w for w in view["warnings"])
    assert view["gpus"][1]["numa_node"] == 1
    assert view["gpus"][1]["pci_bus_id"] == "00000000:87:00.0"


def test_static_data_cached_and_history_bounded() -> None:
    nv = metrics_double()
    s = Sampler(nv, interval=1.0, history_seconds=3.0, allocation=None)
    for _ in range(5):
        s.sample_once()
    assert sum(1 for c in nv.calls if c[0] == "nvmlDeviceGetName") == 2  # once per GPU
    assert len(s.metrics_view()["history"]) == 3


def test_pid_resolver_maps_kernels() -> None:
    s = Sampler(metrics_double(), pid_resolver=lambda pids: {4242: "k-1"} if 4242 in pids
                else {}, allocation=None)
    snap = s.sample_once()
    assert snap["gpus"][0]["processes"][0]["kernel_id"] == "k-1"


@pytest.mark.parametrize(("factory", "state"), [
    (no_nvml_double, "no_nvml"), (no_gpu_double, "no_gpu"), (permission_double, "permission"),
    (device_permission_double, "permission"), (error_double, "error")])
def test_states(factory, state) -> None:
    s = Sampler(factory(), allocation=None)
    s.sample_once()
    m = s.metrics_view()
    assert m["state"] == state and m["gpus"] == [] and m["message"]
    assert s.gpus_view()["state"] == state


def test_mig_utilisation_null() -> None:
    s = Sampler(mig_double(), allocation={"gpus": [{"uuid": MIG0, "milli": 1000}]})
    snap = s.sample_once()
    assert [g["uuid"] for g in snap["gpus"]][0] == MIG0
    assert all(g["utilization_percent"] is None for g in snap["gpus"])
    assert snap["gpus"][0]["memory_used_bytes"] == GiB
    view = s.gpus_view()
    assert view["gpus"][0]["mig"] is True and view["gpus"][0]["in_allocation"] is True
    assert view["gpus"][0]["pci_bus_id"] == "00000000:07:00.0"  # from the parent


def test_allocation_missing_uuid_warns(monkeypatch) -> None:
    monkeypatch.setenv("GPUSPAWNER_ALLOCATION", json.dumps(
        {"id": "a1", "gpus": [{"uuid": "GPU-gone", "milli": 500}]}))
    s = Sampler(metrics_double())
    s.sample_once()
    w = s.gpus_view()["warnings"]
    assert any("does not see" in x and "GPU-gone" in x for x in w)


def test_thread_standby_and_wake() -> None:
    s = Sampler(metrics_double(), interval=0.05, standby_after=0.3, allocation=None).start()
    try:
        assert s.samples == 0  # nobody looked yet: standby from the start
        assert s.wait_fresh(timeout=2)
        time.sleep(0.6)
        n = s.samples
        time.sleep(0.3)
        assert s.samples == n  # standby
        s.touch()
        assert s.wait_fresh(max_age=0.2, timeout=2)
        assert s.samples > n
    finally:
        s.stop()


def test_load_nvml_factory() -> None:
    nv = load_nvml("tests.test_gpuviews_nvml:metrics_double")
    assert isinstance(nv, MetricsNVML)


def test_sparkline() -> None:
    assert sparkline([0, 50, 100, None]) == "▁▅█ "
