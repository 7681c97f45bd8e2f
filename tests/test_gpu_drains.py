"""Drained GPUs in the hub's cluster (gpuspawner.hub.cluster.Cluster, gpuspawner.hub.drains):
a health reading of this host (through the NVML double) drains an unhealthy GPU, off the event
loop and at most every ``health_interval_s``; drains, an admin's and the check's, are kept in
the drains file and applied to a new cluster after a "restart"; the file is checked at start."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from gpuspawner.backends.base import Backend, NodeRuntime
from gpuspawner.hub import cluster as cluster_mod
from gpuspawner.hub.cluster import HEALTH, Cluster, GPUHealthSettings, get_cluster
from gpuspawner.hub.config_check import HubConfigError, check_spawner_settings
from gpuspawner.hub.drains import DrainFileError, DrainStore, default_drains_file
from gpuspawner.inventory.health import HealthReader
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from tests.factories import make_node
from tests.nvml_double import FakeGPU, FakeNVML

TOPO = Path(__file__).parent / "data" / "topologies"
ONE_GPU = Bundle(cores=1, gpus=1, numa_policy="none")


def local_cluster(tmp_path: Path, nvml: FakeNVML | None = None, interval: float = 60.0
                  ) -> Cluster:
    """A cluster whose node ``local`` is read from this host (topology auto) with 2 GPUs,
    the NVML double answering for them, and a drains file in ``tmp_path``."""
    node = make_node("local", gpus=2)
    ledger = Ledger([node], policy="first-fit")
    table = {"local": NodeRuntime("local", "127.0.0.1", "auto", node)}
    backend = Backend()
    backend.bind(table)
    c = Cluster(table, ledger, backend, drain_store=DrainStore(str(tmp_path / "drains.json")),
                health_interval_s=interval)
    if nvml is not None:
        c.health_reader = HealthReader(nvml).read
    c.load_drains()
    return c


def fake_gpus(node_name: str = "local", n: int = 2) -> list[FakeGPU]:
    return [FakeGPU(uuid=f"GPU-{node_name}-{i:02d}", pci_bus_id=f"00000000:{i + 1:02X}:00.0")
            for i in range(n)]


async def test_an_xid_79_drains_the_gpu_off_the_loop_with_the_reason(tmp_path):
    nvml = FakeNVML(fake_gpus())
    threads: list[str] = []
    c = local_cluster(tmp_path, nvml)
    reader = c.health_reader
    assert reader is not None

    def traced() -> list:
        threads.append(threading.current_thread().name)
        return reader()

    c.health_reader = traced
    assert await c.refresh_gpu_health() != []  # first reading: all healthy
    assert c.ledger.drained_gpus() == {}
    nvml.emit_xid(1, 79)
    assert await c.refresh_gpu_health() == []  # within the interval: not read again
    c.health_interval_s = 0.01
    await asyncio.sleep(0.02)  # let the (short) interval pass on the loop's clock
    readings = await c.refresh_gpu_health()
    assert [h.healthy for h in readings] == [True, False]
    assert c.ledger.drained_gpus() == {"GPU-local-01": "xid 79 (GPU fell off the bus)"}
    assert threads and threading.main_thread().name not in threads  # NVML off the loop
    # the placement excludes it: the other GPU is taken, then nothing is left
    assert c.ledger.reserve(ONE_GPU, Owner("a")).gpu_uuids == ["GPU-local-00"]
    with pytest.raises(PlacementRefused, match=r"drained: GPU GPU-local-01 on local "
                                               r"\(xid 79 \(GPU fell off the bus\)\)"):
        c.ledger.reserve(ONE_GPU, Owner("b"))
    # kept in the file, by the health check
    saved = json.loads((tmp_path / "drains.json").read_text())
    assert saved["drains"]["GPU-local-01"]["by"] == HEALTH
    assert saved["drains"]["GPU-local-01"]["node"] == "local"


async def test_healthy_again_stays_drained_until_an_admin_undrains(tmp_path):
    gpus = fake_gpus()
    gpus[0].retired_pending = True
    nvml = FakeNVML(gpus)
    c = local_cluster(tmp_path, nvml, interval=0)
    await c.refresh_gpu_health(force=True)
    assert c.ledger.drained_gpus() == {"GPU-local-00": "page retirement pending (reset the GPU)"}
    # the admin undrains while the condition persists: acknowledged, not drained again
    assert c.undrain_gpu("GPU-local-00").by == HEALTH
    await c.refresh_gpu_health(force=True)
    assert c.ledger.drained_gpus() == {}
    # a new reason drains it again
    gpus[0].ecc_uncorrected = 3
    await c.refresh_gpu_health(force=True)
    assert c.ledger.drained_gpus() == {"GPU-local-00": "3 uncorrected ECC errors (volatile); "
                                                       "page retirement pending (reset the GPU)"}


async def test_an_admin_drain_is_kept_when_the_check_finds_the_gpu_unhealthy(tmp_path):
    gpus = fake_gpus()
    nvml = FakeNVML(gpus)
    c = local_cluster(tmp_path, nvml)
    c.drain_gpu("GPU-local-00", "fan noise", by="admin")
    gpus[0].ecc_uncorrected = 1
    await c.refresh_gpu_health(force=True)
    assert c.ledger.drained_gpus() == {"GPU-local-00": "fan noise"}
    assert c.drain_records()["GPU-local-00"].by == "admin"


async def test_refresh_health_drives_the_gpu_check(tmp_path):
    nvml = FakeNVML(fake_gpus())
    nvml.gpus[1].ecc_uncorrected = 1
    c = local_cluster(tmp_path, nvml)
    await c.refresh_health()
    assert "GPU-local-01" in c.ledger.drained_gpus()


def test_gpus_of_other_nodes_are_not_drained_by_this_hosts_reading(tmp_path):
    from gpuspawner.inventory.health import GPUHealth

    c = local_cluster(tmp_path)
    c.nodes["local"].topology = "/etc/gpuspawner/local.yaml"  # not read from this host
    assert c.apply_health([GPUHealth("GPU-local-00", 0, False, ["xid 79"])]) == []
    assert c.ledger.drained_gpus() == {}


def test_drains_survive_a_restart_and_restore_still_books_what_runs(tmp_path):
    c = local_cluster(tmp_path)
    running = c.ledger.reserve(ONE_GPU, Owner("a"))
    c.drain_gpu(running.gpu_uuids[0], "fan noise", by="admin")
    c.drain_gpu("GPU-local-01", "xid 48 (double-bit ECC error)", by=HEALTH)
    # a new hub process: a new cluster from the same file, then the restore
    fresh = local_cluster(tmp_path)
    assert fresh.ledger.drained_gpus() == {running.gpu_uuids[0]: "fan noise",
                                           "GPU-local-01": "xid 48 (double-bit ECC error)"}
    assert {u: r.by for u, r in fresh.drain_records().items()} == {
        running.gpu_uuids[0]: "admin", "GPU-local-01": HEALTH}
    report = fresh.ledger.restore([running.to_json()])
    assert report.restored == [running.id] and not report.conflicts
    with pytest.raises(PlacementRefused):
        fresh.ledger.reserve(ONE_GPU, Owner("b"))
    fresh.undrain_gpu("GPU-local-01")
    again = local_cluster(tmp_path)
    assert again.ledger.drained_gpus() == {running.gpu_uuids[0]: "fan noise"}
    with pytest.raises(KeyError):
        again.undrain_gpu("GPU-nowhere")


def test_a_drained_gpu_missing_from_the_inventory_is_kept(tmp_path, caplog):
    store = DrainStore(str(tmp_path / "drains.json"))
    (tmp_path / "drains.json").write_text(json.dumps({"version": 1, "drains": {
        "GPU-gone": {"node": "old", "reason": "x", "by": "admin", "since": 1.0}}}))
    c = local_cluster(tmp_path)
    assert c.ledger.drained_gpus() == {}
    assert "GPU-gone" in caplog.text
    c.drain_gpu("GPU-local-00", "y", by="admin")
    assert set(store.load().drains) == {"GPU-gone", "GPU-local-00"}


@pytest.mark.parametrize("content, field", [
    ("{", "Expecting"),
    ("[]", "(top): must be an object"),
    ('{"version": 2}', "version: must be 1"),
    ('{"version": 1, "drains": {"GPU-1": {"node": "n", "reason": "", "by": "a", '
     '"since": 1}}}', "drains.GPU-1.reason: must be a non-empty string"),
    ('{"version": 1, "drains": {"GPU-1": {"node": "n", "reason": "r", "by": "a", '
     '"since": "now"}}}', "drains.GPU-1.since: must be a number"),
    ('{"version": 1, "extra": 1}', "extra: unknown field"),
])
def test_a_bad_drains_file_is_named_with_its_field(tmp_path, content, field):
    path = tmp_path / "drains.json"
    path.write_text(content)
    with pytest.raises(DrainFileError) as e:
        DrainStore(str(path)).check()
    assert str(e.value).startswith(f"{path}: ") and field in str(e.value)


def test_the_drains_file_is_checked_when_the_hub_starts(tmp_path):
    cluster_mod.reset_clusters()
    try:
        nodes = [{"name": "dgx", "topology": str(TOPO / "dgx-a100.yaml")}]
        with pytest.raises(HubConfigError, match=r"GPUSpawner.gpu_drains_file: .*folder .* "
                                                 "does not exist"):
            check_spawner_settings({"nodes": nodes,
                                    "gpu_drains_file": str(tmp_path / "no" / "d.json")})
        cluster_mod.reset_clusters()
        with pytest.raises(HubConfigError, match="GPUSpawner.gpu_health_interval: must be"):
            check_spawner_settings({"nodes": nodes, "gpu_health_interval": -1})
        # a good file is applied to the cluster the hub gets
        path = tmp_path / "d.json"
        uuid = "GPU-6513270e-269e-0d37-f2a7-4de452e6b438"  # GPU 0 of dgx-a100.yaml
        path.write_text(json.dumps({"version": 1, "drains": {uuid: {
            "node": "dgx", "reason": "bad fan", "by": "admin", "since": 1.0}}}))
        cluster_mod.reset_clusters()
        dgx = get_cluster(nodes, "fgd", {}, None, "docker", None,
                          health=GPUHealthSettings(drains_file=str(path)))
        assert dgx.ledger.drained_gpus() == {uuid: "bad fan"}
        assert dgx.drain_records()[uuid].by == "admin"
        assert dgx.health_reader is None  # no node is read from this host
    finally:
        cluster_mod.reset_clusters()


def test_default_drains_file_is_beside_the_hub_database(tmp_path, monkeypatch):
    assert default_drains_file(f"sqlite:///{tmp_path}/jupyterhub.sqlite") == str(
        tmp_path / "gpuspawner-drains.json")
    monkeypatch.chdir(tmp_path)
    assert default_drains_file("postgresql://db/hub") == str(tmp_path / "gpuspawner-drains.json")
    assert default_drains_file("sqlite:///:memory:") == str(tmp_path / "gpuspawner-drains.json")


async def test_a_slow_reading_does_not_hold_the_caller_and_is_applied_when_it_ends(tmp_path):
    from gpuspawner.inventory.health import GPUHealth

    release = threading.Event()
    calls = []

    def slow() -> list[GPUHealth]:
        calls.append(1)
        release.wait(30)  # a hanging NVML call, until the test lets it go
        return [GPUHealth("GPU-local-00", 0, False, ["xid 79 (GPU fell off the bus)"])]

    c = local_cluster(tmp_path, interval=0.001)
    c.health_reader, c.health_wait_s = slow, 0.05
    assert await c.refresh_gpu_health() == []  # did not end in time: the caller goes on
    assert await c.refresh_gpu_health(force=True) == []  # no second reading meanwhile
    assert len(calls) == 1 and c.ledger.drained_gpus() == {}
    release.set()
    await asyncio.wait_for(c._gpu_health_task, 10)  # the task ends on this loop
    assert c.ledger.drained_gpus() == {"GPU-local-00": "xid 79 (GPU fell off the bus)"}
