"""TEST DOUBLE of nvidia-ml-py (module ``pynvml``): no GPU, no driver, no NVML library.

:class:`FakeNVML` has the functions, constants and ``NVMLError`` hierarchy of the real binding
that :mod:`gpuspawner.inventory.local` uses, with the same names, argument order and return
shapes (``nvmlDeviceGetMemoryInfo(h).total``, ``nvmlDeviceGetPciInfo(h).busId``, ...), and
answers from a configured list of :class:`FakeGPU`. It is never used outside the tests; the
test ``test_double_matches_real_pynvml`` checks every name it offers against the installed
``pynvml`` so the double cannot drift from the real API unnoticed.

Configurable: the GPUs (UUID, product name, memory, PCI bus id, NUMA node, NVLink remote ends),
pairwise ``nvmlDeviceGetTopologyCommonAncestor`` levels, an error at ``nvmlInit`` or
``nvmlDeviceGetCount``, per-device errors for any function, whether the binding has
``nvmlDeviceGetNumaNodeId`` at all, and ``bytes`` instead of ``str`` returns (older bindings).
Health (:mod:`gpuspawner.inventory.health`): per-device ECC counts, retired pages, pending
retirement and remapped rows (each may be NotSupported), and XID events through event sets:
MIG: a GPU's MIG mode (``nvmlDeviceGetMigMode``; NotSupported when the GPU has none) and its
MIG devices (:class:`FakeMIG`, in slots ``0 .. nvmlDeviceGetMaxMigDeviceCount - 1``; an empty
slot raises NotFound from ``nvmlDeviceGetMigDeviceHandleByIndex``, as the real NVML does), each
answering ``nvmlDeviceGetUUID`` (``MIG-...``), ``nvmlDeviceGetName``, ``nvmlDeviceGetMemoryInfo``,
``nvmlDeviceGetAttributes`` (slice counts, ``memorySizeMB``) and the instance ids.
:meth:`FakeNVML.emit_xid` is the test's "the driver reported XID n on GPU i".
It records calls (``init_calls``, ``shutdown_calls``, ``calls``, ``waits``) for assertions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# constants, same values as pynvml (NVML's nvml.h)
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 18

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeNone = 0x0000000000000000

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the subclass registered for ``code``; the code
    is in ``.value``."""

    _value_class: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int = NVML_ERROR_UNKNOWN) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return f"{type(self).__name__} (code {self.value})"


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    klass = type(name, (NVMLError,), {"__new__": new})
    NVMLError._value_class[code] = klass
    return klass


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument",
                                         NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded",
                                         NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound",
                                         NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound",
                                          NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

GiB = 1024**3


@dataclass
class FakeMIG:
    """One simulated MIG device (a GPU instance with one compute instance).

    Attributes:
        uuid: what ``nvmlDeviceGetUUID`` returns for its handle (``MIG-...``).
        profile: NVIDIA's profile name; ``nvmlDeviceGetName`` answers
            ``"<parent name> MIG <profile>"`` (as ``nvidia-smi -L`` shows MIG devices).
        memory_total: bytes (``nvmlDeviceGetMemoryInfo(h).total``).
        slices: ``gpuInstanceSliceCount`` of ``nvmlDeviceGetAttributes`` (0: from the profile).
        gpu_instance_id / compute_instance_id: ``nvmlDeviceGetGpuInstanceId`` /
            ``nvmlDeviceGetComputeInstanceId``.
        name: overrides the ``nvmlDeviceGetName`` answer when not empty.
        fail: function name -> NVML error code, as :attr:`FakeGPU.fail`.
    """

    uuid: str
    profile: str = "1g.10gb"
    memory_total: int = 9856 * 1024**2
    slices: int = 0
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    name: str = ""
    fail: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeGPU:
    """One simulated device.

    Attributes:
        uuid: what ``nvmlDeviceGetUUID`` returns.
        name: product name (``nvmlDeviceGetName``).
        memory_total: bytes (``nvmlDeviceGetMemoryInfo(h).total``).
        pci_bus_id: NVML form, ``"00000000:3B:00.0"``.
        numa_node: ``nvmlDeviceGetNumaNodeId`` answer; None makes it raise NotSupported.
        nvlinks: remote PCI bus id per NVLink index; None marks an inactive link; an empty
            list means no NVLink at all (``nvmlDeviceGetNvLinkState`` raises NotSupported).
        fail: function name -> NVML error code raised when that function is called for this
            device, e.g. ``{"nvmlDeviceGetUUID": NVML_ERROR_GPU_IS_LOST}``.
        ecc_uncorrected: volatile uncorrected ECC count (``nvmlDeviceGetTotalEccErrors`` with
            UNCORRECTED, VOLATILE); None: ECC off or absent (NotSupported, as on GeForce).
        ecc_corrected: volatile corrected (single-bit) count.
        retired_pages_dbe / retired_pages_sbe: page addresses ``nvmlDeviceGetRetiredPages``
            returns per cause; None: NotSupported (consumer GPUs, Ampere and later).
        retired_pending: ``nvmlDeviceGetRetiredPagesPendingStatus`` (True = ENABLED); None:
            NotSupported.
        remapped_rows: ``nvmlDeviceGetRemappedRows`` ``(corrected, uncorrected, pending,
            failure)``; None: NotSupported (before Ampere).
        xid_events: ``nvmlDeviceRegisterEvents`` accepts ``nvmlEventTypeXidCriticalError``
            (False: NotSupported).
        mig_mode: current MIG mode (``NVML_DEVICE_MIG_ENABLE``/``DISABLE``); None: the GPU has
            no MIG (NotSupported, as on a T4 or V100).
        mig: the MIG device slots; None marks an empty slot.
        max_mig: ``nvmlDeviceGetMaxMigDeviceCount`` (7 on A100/H100).
    """

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 * GiB
    pci_bus_id: str = "00000000:07:00.0"
    numa_node: int | None = 0
    nvlinks: list[str | None] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    ecc_uncorrected: int | None = 0
    ecc_corrected: int | None = 0
    retired_pages_dbe: list[int] | None = field(default_factory=list)
    retired_pages_sbe: list[int] | None = field(default_factory=list)
    retired_pending: bool | None = False
    remapped_rows: tuple[int, int, int, int] | None = None
    xid_events: bool = True
    mig_mode: int | None = None
    mig: list[FakeMIG | None] = field(default_factory=list)
    max_mig: int = 7


@dataclass
class _EventSet:
    """Stands in for pynvml's ``c_nvmlEventSet_t``: registered (device index, event mask)
    pairs and the events waiting, oldest first."""

    registered: dict[int, int] = field(default_factory=dict)
    queue: list[Any] = field(default_factory=list)
    freed: bool = False


@dataclass
class _Handle:
    """Stands in for pynvml's ``c_nvmlDevice_t`` handle; ``mig`` is the MIG slot of a MIG
    device handle (None for a GPU's)."""

    index: int
    mig: int | None = None


class _Struct:
    """Stands in for pynvml's ctypes structures: attributes only."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class FakeNVML:
    """An object that can be passed wherever the ``pynvml`` module is expected.

    Args:
        gpus: the devices, in NVML index order.
        topology: ``{(i, j): level}`` for ``nvmlDeviceGetTopologyCommonAncestor`` by index (either
            order); unlisted pairs answer NODE when both GPUs have the same ``numa_node``,
            else SYSTEM.
        init_error: NVML error code raised by ``nvmlInit`` (e.g. NVML_ERROR_LIBRARY_NOT_FOUND).
        count_error: NVML error code raised by ``nvmlDeviceGetCount``.
        has_numa_node_id: False hides ``nvmlDeviceGetNumaNodeId`` (bindings before it existed).
        return_bytes: return ``bytes`` from the string functions and ``busId`` (older bindings).
    """

    # constants and errors as attributes, like the module
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FEATURE_DISABLED = NVML_FEATURE_DISABLED
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = \
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = \
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeNone = nvmlEventTypeNone
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    NVML_TOPOLOGY_INTERNAL = NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = NVML_TOPOLOGY_SYSTEM
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown

    #: the pynvml functions this double implements (checked against the real module in tests)
    FUNCTIONS = (
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPciInfo", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
        "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait",
        "nvmlEventSetFree", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetAttributes",
        "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    )

    def __init__(self, gpus: list[FakeGPU] | tuple[FakeGPU, ...] = (), *,
                 topology: dict[tuple[int, int], int] | None = None,
                 init_error: int | None = None, count_error: int | None = None,
                 has_numa_node_id: bool = True, return_bytes: bool = False) -> None:
        self.gpus = list(gpus)
        self.topology = {frozenset(k): v for k, v in (topology or {}).items()}
        self.init_error = init_error
        self.count_error = count_error
        self.has_numa_node_id = has_numa_node_id
        self.return_bytes = return_bytes
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.event_sets: list[_EventSet] = []
        #: the ``timeoutms`` of every ``nvmlEventSetWait`` call, in order
        self.waits: list[int] = []

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetNumaNodeId" and not object.__getattribute__(
                self, "has_numa_node_id"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # ----------------------------------------------------------------- helpers
    def _s(self, text: str) -> str | bytes:
        return text.encode() if self.return_bytes else text

    def _device(self, fn: str, handle: Any, *args: Any) -> Any:
        """The FakeGPU (or, for a MIG device handle, the FakeMIG) a handle names."""
        self.calls.append((fn, (handle, *args)))
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if handle.mig is not None:
            mig = gpu.mig[handle.mig] if handle.mig < len(gpu.mig) else None
            if mig is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if fn in mig.fail:
                raise NVMLError(mig.fail[fn])
            return mig
        if fn in gpu.fail:
            raise NVMLError(gpu.fail[fn])
        return gpu

    def _gpu(self, fn: str, device: Any) -> FakeGPU:
        """The FakeGPU of a GPU handle; a MIG device handle is an invalid argument here."""
        g = self._device(fn, device)
        if not isinstance(g, FakeGPU):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g

    def _mig(self, fn: str, device: Any) -> FakeMIG:
        """The FakeMIG of a MIG device handle; a GPU handle is an invalid argument here."""
        m = self._device(fn, device)
        if not isinstance(m, FakeMIG):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return m

    # ----------------------------------------------------------------- API
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(index)
        self._device("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str | bytes:
        return self._s(self._device("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        d = self._device("nvmlDeviceGetName", handle)
        if isinstance(d, FakeMIG):
            return self._s(d.name or f"{self.gpus[handle.index].name} MIG {d.profile}")
        return self._s(d.name)

    # MIG (NVML API reference, "Multi Instance GPU Management")
    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        g = self._gpu("nvmlDeviceGetMigMode", device)
        if g.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [g.mig_mode, g.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        g = self._gpu("nvmlDeviceGetMaxMigDeviceCount", device)
        if g.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        g = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if g.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < g.max_mig:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if g.mig_mode != NVML_DEVICE_MIG_ENABLE or index >= len(g.mig) or g.mig[index] is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(device.index, index)

    def nvmlDeviceGetAttributes(self, device: _Handle) -> _Struct:
        m = self._mig("nvmlDeviceGetAttributes", device)
        slices = m.slices or int(m.profile.split("g.")[0])
        return _Struct(multiprocessorCount=14 * slices, sharedCopyEngineCount=slices,
                       sharedDecoderCount=0, sharedEncoderCount=0, sharedJpegCount=0,
                       sharedOfaCount=0, gpuInstanceSliceCount=slices,
                       computeInstanceSliceCount=slices,
                       memorySizeMB=m.memory_total // 1024**2)

    def nvmlDeviceGetGpuInstanceId(self, device: _Handle) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: _Handle) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", device).compute_instance_id

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Struct:
        g = self._device("nvmlDeviceGetMemoryInfo", handle)
        return _Struct(total=g.memory_total, free=g.memory_total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Struct:
        g = self._device("nvmlDeviceGetPciInfo", handle)
        return self._pci(g.pci_bus_id)

    def _pci(self, bus_id: str) -> _Struct:
        dom, bus, devfn = bus_id.split(":")
        dev = devfn.split(".")[0]
        return _Struct(busId=self._s(bus_id), busIdLegacy=self._s(bus_id[4:]),
                       domain=int(dom, 16), bus=int(bus, 16), device=int(dev, 16),
                       pciDeviceId=0x20B210DE, pciSubSystemId=0)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        g = self._device("nvmlDeviceGetNumaNodeId", handle)
        if g.numa_node is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.numa_node

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        a = self._device("nvmlDeviceGetTopologyCommonAncestor", device1, device2)
        b = self._device("nvmlDeviceGetTopologyCommonAncestor", device2, device1)
        if device1.index == device2.index:
            return NVML_TOPOLOGY_INTERNAL
        key = frozenset((device1.index, device2.index))
        if key in self.topology:
            return self.topology[key]
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return NVML_TOPOLOGY_NODE
        return NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        g = self._device("nvmlDeviceGetNvLinkState", device, link)
        if not g.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(g.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_ENABLED if g.nvlinks[link] else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: _Handle, link: int) -> _Struct:
        g = self._device("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if not g.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(g.nvlinks) or g.nvlinks[link] is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._pci(g.nvlinks[link] or "")

    # ----------------------------------------------------------------- health
    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int,
                                    counterType: int) -> int:
        g = self._device("nvmlDeviceGetTotalEccErrors", handle, errorType, counterType)
        if counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC) or errorType not in (
                NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        value = g.ecc_uncorrected if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED \
            else g.ecc_corrected
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetRetiredPages(self, device: _Handle, sourceFilter: int) -> list[int]:
        g = self._device("nvmlDeviceGetRetiredPages", device, sourceFilter)
        pages = {NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: g.retired_pages_dbe,
                 NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
                     g.retired_pages_sbe}
        if sourceFilter not in pages:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if pages[sourceFilter] is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return list(pages[sourceFilter] or [])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: _Handle) -> int:
        g = self._device("nvmlDeviceGetRetiredPagesPendingStatus", device)
        if g.retired_pending is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if g.retired_pending else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        g = self._device("nvmlDeviceGetRemappedRows", device)
        if g.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.remapped_rows

    def nvmlEventSetCreate(self) -> _EventSet:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        es = _EventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int,
                                 eventSet: _EventSet) -> None:
        g = self._device("nvmlDeviceRegisterEvents", handle, eventTypes, eventSet)
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & nvmlEventTypeXidCriticalError and not g.xid_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        eventSet.registered[handle.index] = eventSet.registered.get(handle.index, 0) | \
            eventTypes

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _Struct:
        """The oldest waiting event (``device``, ``eventType``, ``eventData``,
        ``gpuInstanceId``, ``computeInstanceId``), or NVMLError_Timeout at once when none
        waits (the double never sleeps; ``waits`` records the timeout asked for)."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.waits.append(timeoutms)
        if not eventSet.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return eventSet.queue.pop(0)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        eventSet.freed = True

    def emit_xid(self, index: int, xid: int) -> int:
        """Test control: the driver reports XID ``xid`` on GPU ``index``; every live event set
        that registered that GPU for ``nvmlEventTypeXidCriticalError`` gets the event (as
        NVML delivers it: ``eventData`` is the XID). Returns how many sets got it."""
        n = 0
        for es in self.event_sets:
            if not es.freed and es.registered.get(index, 0) & nvmlEventTypeXidCriticalError:
                es.queue.append(_Struct(device=_Handle(index),
                                        eventType=nvmlEventTypeXidCriticalError,
                                        eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                        computeInstanceId=0xFFFFFFFF))
                n += 1
        return n
