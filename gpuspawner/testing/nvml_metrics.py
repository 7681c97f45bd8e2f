"""The NVML double (:mod:`.nvml_double`) extended with the dynamic functions
``gpuspawner.singleuser.gpuviews`` samples (utilisation, temperature, power, processes, MIG),
and factories of ready doubles named by import path in ``GPUSPAWNER_NVML_FACTORY``
(``gpuspawner.testing.nvml_metrics:metrics_double``; the old name
``tests.test_gpuviews_nvml:metrics_double`` still works). ``tests/test_gpuviews_nvml.py``
checks the double against pynvml's signatures.
"""

from __future__ import annotations

from typing import Any

from . import nvml_double as nd

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
