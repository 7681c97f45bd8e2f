"""The NVML double extended with the dynamic functions gpuspawner.singleuser.gpuviews samples
(utilisation, temperature, power, processes, MIG), and unit tests of the sampler on it.

``metrics_double`` / ``mig_double`` / ... are also named by ``GPUSPAWNER_NVML_FACTORY`` in the
kernel extension's test (``tests.test_gpuviews_nvml:metrics_double``).
"""

from __future__ import annotations

import json
import time

import pytest

from gpuspawner.singleuser.gpuviews.sampler import Sampler, load_nvml, sparkline
from gpuspawner.testing.nvml_metrics import (  # noqa: F401 (factories named by path)
    MIG0,
    UUID0,
    UUID1,
    GiB,
    MetricsNVML,
    device_permission_double,
    error_double,
    metrics_double,
    mig_double,
    no_gpu_double,
    no_nvml_double,
    permission_double,
)


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
