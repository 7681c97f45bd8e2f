"""GPU health through NVML (gpuspawner.inventory.health) against the NVML test double
(tests/nvml_double.py, whose names and signatures test_inventory checks against nvidia-ml-py):
uncorrected ECC errors, retired and pending pages, remapped rows and XID events make a GPU
unhealthy; NOT_SUPPORTED checks (consumer GPUs) do not; a reading never blocks on events."""

from __future__ import annotations

import json

import pytest

from gpuspawner.inventory.health import (
    NOT_SUPPORTED,
    HealthReader,
    HealthThresholds,
    read_health,
)
from tests import nvml_double as nd
from tests.nvml_double import FakeGPU, FakeNVML


def gpu(i: int, **kw) -> FakeGPU:
    return FakeGPU(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                   pci_bus_id=f"00000000:{7 + i:02X}:00.0", **kw)


def test_a_clean_gpu_is_healthy_and_every_counter_is_read():
    (h,) = read_health(FakeNVML([gpu(0, remapped_rows=(0, 0, 0, 0))]))
    assert h.healthy and h.reasons == []
    assert h.counters == {"ecc_uncorrected_volatile": 0, "retired_pages_dbe": 0,
                          "retired_pages_pending": False, "remapped_rows_uncorrected": 0,
                          "remapped_rows_pending": False, "remapped_rows_failure": False,
                          "xids": []}
    json.dumps(h.to_dict())  # JSON-ready


def test_uncorrected_ecc_errors_make_a_gpu_unhealthy():
    nvml = FakeNVML([gpu(0, ecc_uncorrected=2), gpu(1)])
    bad, good = read_health(nvml)
    assert not bad.healthy and bad.reasons == ["2 uncorrected ECC errors (volatile)"]
    assert bad.counters["ecc_uncorrected_volatile"] == 2
    assert good.healthy
    # read as NVML documents it: uncorrected, volatile
    asked = [a for f, a in nvml.calls if f == "nvmlDeviceGetTotalEccErrors"]
    assert {a[1:] for a in asked} == {(nd.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                       nd.NVML_VOLATILE_ECC)}
    # a threshold above the count: healthy again
    (h, _) = read_health(nvml, HealthThresholds(max_uncorrected_ecc=2))
    assert h.healthy


def test_not_supported_everywhere_is_healthy():
    """A consumer GPU: no ECC, no page retirement, no row remapping, no XID events."""
    consumer = gpu(0, name="NVIDIA GeForce RTX 4090", ecc_uncorrected=None,
                   retired_pages_dbe=None, retired_pending=None, remapped_rows=None,
                   xid_events=False)
    (h,) = read_health(FakeNVML([consumer]))
    assert h.healthy and h.reasons == []
    assert h.counters == {"ecc_uncorrected_volatile": NOT_SUPPORTED,
                          "retired_pages_dbe": NOT_SUPPORTED,
                          "retired_pages_pending": NOT_SUPPORTED,
                          "remapped_rows": NOT_SUPPORTED, "xid_events": NOT_SUPPORTED}


def test_pending_retirement_retired_pages_and_row_remapping():
    nvml = FakeNVML([gpu(0, retired_pending=True, retired_pages_dbe=[0x1000]),
                     gpu(1, retired_pages_dbe=list(range(60))),
                     gpu(2, remapped_rows=(3, 1, 1, 0)),
                     gpu(3, remapped_rows=(0, 5, 0, 1))])
    pending, many, remap, failed = read_health(nvml)
    assert pending.reasons == ["page retirement pending (reset the GPU)"]
    assert pending.counters["retired_pages_dbe"] == 1  # one retired page alone is fine
    assert many.reasons == ["60 pages retired for double-bit ECC errors"]
    assert remap.reasons == ["row remapping pending (reset the GPU)"]
    assert failed.reasons == ["row remapping failed (the board needs service)"]
    asked = {a[1] for f, a in nvml.calls if f == "nvmlDeviceGetRetiredPages"}
    assert asked == {nd.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR}


def test_an_xid_79_event_makes_the_gpu_unhealthy_once():
    nvml = FakeNVML([gpu(0), gpu(1)])
    with HealthReader(nvml) as reader:
        first = reader.read()
        assert all(h.healthy for h in first)  # no event: healthy
        assert nvml.emit_xid(1, 79) == 1
        assert nvml.emit_xid(1, 13) == 1  # an application's error: not the GPU's
        second = reader.read()
        assert second[0].healthy
        assert not second[1].healthy
        assert second[1].reasons == ["xid 79 (GPU fell off the bus)"]
        assert second[1].counters["xids"] == [79, 13]
        third = reader.read()  # the event was consumed by the second reading
        assert all(h.healthy for h in third)
    # registered for critical XID events only; every wait was a 0 ms poll; all freed
    (es,) = nvml.event_sets
    assert es.registered == {0: nd.nvmlEventTypeXidCriticalError,
                             1: nd.nvmlEventTypeXidCriticalError}
    assert nvml.waits and set(nvml.waits) == {0}
    assert es.freed and not nvml.initialized


def test_the_xid_set_is_a_parameter():
    nvml = FakeNVML([gpu(0)])
    with HealthReader(nvml, HealthThresholds(xids=frozenset({13}))) as reader:
        nvml.emit_xid(0, 13)
        nvml.emit_xid(0, 79)
        (h,) = reader.read()
    assert h.reasons == ["xid 13"]


def test_a_lost_gpu_is_unhealthy_and_its_event_still_lands():
    lost = gpu(0, fail={"nvmlDeviceGetTotalEccErrors": nd.NVML_ERROR_GPU_IS_LOST})
    nvml = FakeNVML([lost])
    with HealthReader(nvml) as reader:
        nvml.emit_xid(0, 79)
        lost.fail["nvmlDeviceGetUUID"] = nd.NVML_ERROR_GPU_IS_LOST  # found by its handle
        (h,) = reader.read()
    assert not h.healthy
    assert h.reasons == ["GPU is lost (nvmlDeviceGetTotalEccErrors: NVML_ERROR_GPU_IS_LOST)",
                         "xid 79 (GPU fell off the bus)"]


def test_no_nvml_means_no_gpus():
    assert read_health(FakeNVML([gpu(0)], init_error=nd.NVML_ERROR_LIBRARY_NOT_FOUND)) == []


def test_listen_waits_for_events_with_a_deadline():
    nvml = FakeNVML([gpu(0)])
    out = read_health(nvml, listen_s=0.05)
    assert out[0].healthy
    assert nvml.waits[0] > 0  # the listen asked NVML to wait, the reading did not
    assert nvml.waits[-1] == 0


def test_an_unexpected_nvml_error_is_reported_not_judged(caplog):
    nvml = FakeNVML([gpu(0, fail={"nvmlDeviceGetRetiredPages": nd.NVML_ERROR_UNKNOWN})])
    (h,) = read_health(nvml)
    assert h.healthy
    assert h.counters["retired_pages_dbe"].startswith("error: ")
    assert "nvmlDeviceGetRetiredPages" in caplog.text


@pytest.mark.parametrize("fn", ["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"])
def test_function_not_found_counts_as_not_supported(fn):
    nvml = FakeNVML([gpu(0, remapped_rows=(0, 0, 0, 0),
                         fail={fn: nd.NVML_ERROR_FUNCTION_NOT_FOUND})])
    (h,) = read_health(nvml)
    assert h.healthy
    key = "ecc_uncorrected_volatile" if fn.endswith("EccErrors") else "remapped_rows"
    assert h.counters[key] == NOT_SUPPORTED
