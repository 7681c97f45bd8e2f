"""MIG instances as a device kind: the model, the device level, the policies,
the ledger's bookings, JSON round trip and restore, quotas; topology files, NVML inventory
(through the NVML test double), the Docker and Slurm backends, the form and progress words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuspawner.placement import (
    GPU,
    Allocation,
    Bundle,
    Ledger,
    Node,
    NumaNode,
    Owner,
    PlacementRefused,
    QuotaExceeded,
    QuotaTable,
)
from gpuspawner.placement.model import (
    InvalidBundle,
    MigInstance,
    mig_milli,
    mig_slices,
)
from gpuspawner.placement.policies import POLICIES
from tests.factories import GiB, make_node


def mig_layout(gpu: str, profiles: list[str]) -> tuple[MigInstance, ...]:
    """MIG instances ``MIG-<gpu>-<i>`` of the given profiles on one GPU."""
    return tuple(MigInstance(f"MIG-{gpu}-{i}", p, int(p.split(".")[1][:-2]) * GiB, index=i)
                 for i, p in enumerate(profiles))


def mig_node(name: str = "m1", layouts: list[list[str]] | None = None, *, plain: int = 0,
             numa: int = 2, cores: int = 16) -> Node:
    """A node whose first GPUs are MIG-enabled with ``layouts`` and then ``plain`` whole GPUs."""
    layouts = layouts if layouts is not None else [["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]]
    base = make_node(name, gpus=len(layouts) + plain, numa=numa, cores=cores)
    gpus = []
    for i, g in enumerate(base.gpus):
        if i < len(layouts):
            g = replace(g, mig=mig_layout(g.uuid, layouts[i]))
        gpus.append(g)
    return replace(base, gpus=tuple(gpus))


# -- model -------------------------------------------------------------------------------------

def test_profile_names_and_milli():
    assert [mig_slices(p) for p in ("1g.5gb", "1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb",
                                    "7g.80gb", "1g.10gb+me")] == [1, 1, 2, 3, 4, 7, 1]
    assert [mig_milli(s) for s in (1, 2, 3, 4, 7)] == [143, 286, 429, 571, 1000]
    with pytest.raises(ValueError, match="not a MIG profile"):
        mig_slices("A100")


def test_instance_knows_its_parent_and_slices():
    g = GPU("GPU-a", mig=(MigInstance("MIG-x", "3G.40GB"),))
    assert g.mig_enabled and g.mig[0].gpu == "GPU-a"
    assert g.mig[0].profile == "3g.40gb" and g.mig[0].slices == 3 and g.mig[0].milli == 429
    assert GPU("GPU-b", mig_mode=True).mig_enabled and not GPU("GPU-c").mig_enabled


def test_bundle_mig_validation():
    b = Bundle(cores=2, mig="1g.10gb", mig_count=2)
    assert b.mig_units == 2 and b.total_gpu_milli == 286
    assert "2 x MIG 1g.10gb" in b.describe()
    assert Bundle(cores=1).mig_units == 0
    with pytest.raises(InvalidBundle) as e:
        Bundle(gpus=1, mig="1g.10gb")
    assert e.value.field == "mig"
    with pytest.raises(InvalidBundle) as e:
        Bundle(mig="big")
    assert e.value.field == "mig"
    with pytest.raises(InvalidBundle) as e:
        Bundle(mig="1g.10gb", mig_count=0)
    assert e.value.field == "mig_count"


# -- device level and policies ------------------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_a_mig_bundle_on_an_instance(policy):
    ledger = Ledger([make_node("a", gpus=2), mig_node("b")], policy=policy, seed=1)
    a = ledger.reserve(Bundle(cores=2, mig="2g.20gb"), Owner("u"))
    assert a.node == "b" and a.gpus == ()
    assert [(m.uuid, m.gpu, m.profile, m.slices) for m in a.mig] == [
        ("MIG-GPU-b-00-1", "GPU-b-00", "2g.20gb", 2)]
    assert a.device_ids == ["MIG-GPU-b-00-1"]
    assert a.total_gpu_milli == 286


def test_mig_gpu_is_never_allocated_whole_or_shared():
    node = mig_node("b", plain=1)
    ledger = Ledger([node])
    whole = ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("u1"))
    assert whole.gpu_uuids == ["GPU-b-01"]
    with pytest.raises(PlacementRefused):
        ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("u2"))
    shared = Ledger([replace(node, gpus=tuple(replace(g, shareable=True) for g in node.gpus))])
    shared.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("u1"))
    with pytest.raises(PlacementRefused):
        shared.reserve(Bundle(cores=1, gpu_milli=100, numa_policy="none"), Owner("u2"))
    # its instances are still there
    assert ledger.reserve(Bundle(cores=1, mig="3g.40gb", numa_policy="none"), Owner("u3")).mig


def test_instances_one_per_unit_until_none_left():
    ledger = Ledger([mig_node("b")])
    got = ledger.reserve(Bundle(cores=1, mig="1g.10gb", mig_count=2), Owner("u1"))
    assert sorted(got.mig_uuids) == ["MIG-GPU-b-00-2", "MIG-GPU-b-00-3"]
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u2"))
    assert "no node has 1 free MIG 1g.10gb instance" in str(e.value)
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=1, mig="7g.80gb"), Owner("u2"))
    assert e.value.reason == "no_gpu_model" and "MIG profiles here" in str(e.value)
    ledger.release(got.id)
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u2")).mig


def test_device_level_packs_instances_on_the_fuller_gpu():
    # GPU 0: two 1g free of 7 slices' layout; GPU 1: one 1g.10gb + 3g + 3g (more free slices)
    node = mig_node("b", [["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
                          ["1g.10gb", "3g.40gb", "3g.40gb"]], numa=1)
    ledger = Ledger([node])
    ledger.reserve(Bundle(cores=1, mig="3g.40gb"), Owner("u0"))  # GPU 0's 3g: GPU 0 fuller
    got = ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u1"))
    assert got.mig[0].gpu == "GPU-b-00"


def test_fgd_prefers_the_node_with_fewest_free_mig_slices_then_name():
    a = mig_node("a", [["1g.10gb"] * 7])
    b = mig_node("b", [["1g.10gb", "3g.40gb"]])
    ledger = Ledger([a, b])
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u1")).node == "b"  # 3 vs 6 left
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u2")).node == "a"  # b has none
    twins = Ledger([mig_node("y"), mig_node("x")])
    assert twins.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u")).node == "x"  # tie: name


def test_gpu_models_filter_the_parent():
    ledger = Ledger([mig_node("b")])
    with pytest.raises(PlacementRefused):
        ledger.reserve(Bundle(cores=1, mig="1g.10gb", gpu_models=("H100",)), Owner("u"))
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb", gpu_models=("a100",)), Owner("u")).mig


def test_strict_numa_keeps_cores_with_the_instance():
    node = mig_node("b", [["1g.10gb"], ["1g.10gb"]], numa=2, cores=16)  # GPU 1 on NUMA 1
    ledger = Ledger([node])
    ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u0"))
    got = ledger.reserve(Bundle(cores=4, mig="1g.10gb"), Owner("u1"))
    assert got.mig[0].gpu == "GPU-b-01" and got.mems == (1,) and got.numa_aligned
    assert all(c >= 8 for c in got.cpuset)


def test_capacity_questions_answer_for_mig():
    ledger = Ledger([mig_node("b")])
    b = Bundle(cores=1, mig="1g.10gb", mig_count=2)
    assert ledger.fits_now(b) == "b"
    assert ledger.capacity_refusal(b) is None
    assert ledger.nodes_that_could_take(b) == {"b"}
    assert ledger.capacity_refusal(Bundle(cores=1, mig="1g.10gb", mig_count=3)) is not None
    assert ledger.closest_node(b, ["b"]) == "b"


# -- bookings: JSON, restore, quotas ------------------------------------------------------------

def test_allocation_json_round_trip_and_restore():
    ledger = Ledger([mig_node("b")])
    a = ledger.reserve(Bundle(cores=2, mig="1g.10gb", mig_count=2), Owner("u", "s", ("g",)))
    d = a.to_dict()
    assert d["mig"] == [{"uuid": m.uuid, "gpu": "GPU-b-00", "profile": "1g.10gb", "slices": 1}
                        for m in a.mig]
    assert Allocation.from_json(a.to_json()) == a
    assert "mig" not in replace(a, mig=()).to_dict()  # non-MIG labels unchanged

    fresh = Ledger([mig_node("b")])
    report = fresh.restore([a.to_json()])
    assert report.restored == [a.id]
    with pytest.raises(PlacementRefused):
        fresh.reserve(Bundle(cores=1, mig="1g.10gb", mig_count=1), Owner("v"))
    again = fresh.restore([replace(a, id="other", owner=Owner("w"))])
    assert again.conflicts and "already held" in again.conflicts[0].problem
    assert "u/s" in again.conflicts[0].problem
    wrong = replace(a, id="x", owner=Owner("z"), mig=(replace(a.mig[0], profile="3g.40gb"),))
    assert "is a 1g.10gb" in fresh.restore([wrong]).conflicts[0].problem


def test_quota_counts_mig_slices_in_milli_gpu():
    quotas = QuotaTable.from_config(users={"alice": {"gpu_milli": 500}})
    ledger = Ledger([mig_node("b")], quotas=quotas)
    ledger.reserve(Bundle(cores=1, mig="3g.40gb"), Owner("alice"))  # 429
    assert ledger.usage("alice").gpu_milli == 429
    with pytest.raises(QuotaExceeded):
        ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("alice", "two"))  # +143 > 500


def test_non_mig_nodes_are_unchanged_by_the_mig_fields():
    plain = Node("p", (NumaNode(0, (0, 1), GiB),), (GPU("GPU-p"),))
    ledger = Ledger([plain])
    a = ledger.reserve(Bundle(cores=1, gpus=1), Owner("u"))
    assert a.mig == () and "mig" not in a.to_dict() and a.device_ids == ["GPU-p"]


# -- profiles ------------------------------------------------------------------------------------

def test_a_profile_may_ask_for_mig_instances():
    from gpuspawner.hub.profiles import load_profiles

    [p, q] = load_profiles([{"slug": "mig", "cpu": 2, "mig": "1g.10gb"},
                            {"slug": "mig2", "mig": "3g.40gb", "mig_count": 2,
                             "gpu_models": "A100"}])
    assert p.bundle.mig == "1g.10gb" and p.bundle.mig_count == 1 and p.queue
    assert q.bundle.mig_units == 2 and q.bundle.total_gpu_milli == 858


@pytest.mark.parametrize("entry, message", [
    ({"slug": "x", "mig": "1g.10gb", "gpus": 1}, "profiles[0] (x).mig: MIG instances and gpus"),
    ({"slug": "x", "mig": "1g.10gb", "gpus": 0.5}, "profiles[0] (x).mig: MIG instances and"),
    ({"slug": "x", "mig": "1g.10gb", "gpu_milli": 100}, "profiles[0] (x).mig: MIG"),
    ({"slug": "x", "mig_count": 2}, "profiles[0] (x).mig_count: only with mig"),
    ({"slug": "x", "mig": "A100"}, "profiles[0] (x).mig: 'A100' does not match"),
    ({"slug": "x", "mig": "1g.10gb", "mig_count": 0}, "profiles[0] (x).mig_count: 0 is less"),
])
def test_profile_mig_refusals_name_the_field(entry, message):
    from gpuspawner.hub.profiles import ProfileConfigError, load_profiles

    with pytest.raises(ProfileConfigError) as e:
        load_profiles([entry])
    assert str(e.value).startswith(message), str(e.value)


# -- topology files ------------------------------------------------------------------------------

TOPOLOGIES = __import__("pathlib").Path(__file__).parent / "data" / "topologies"


def test_a_topology_file_declares_a_mig_layout_and_round_trips():
    import yaml

    from gpuspawner.inventory.topology import dump_topology, load_topology_file, node_from_dict

    node = load_topology_file(TOPOLOGIES / "mig-a100.yaml")
    mig_gpu, whole = node.gpus
    assert mig_gpu.mig_enabled and not whole.mig_enabled
    assert [(m.profile, m.slices, m.memory_bytes // GiB, m.gpu) for m in mig_gpu.mig] == [
        ("3g.40gb", 3, 40, mig_gpu.uuid), ("1g.10gb", 1, 10, mig_gpu.uuid)]
    assert mig_gpu.mig[1].files[0] == "/dev/nvidia0"
    again = node_from_dict(yaml.safe_load(dump_topology(node)))
    assert again == node and again.gpus[0].mig[1].files == mig_gpu.mig[1].files
    ledger = Ledger([node])
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u")).mig_uuids == [
        "MIG-aaaaaaaa-0000-0000-0000-000000000002"]
    assert ledger.reserve(Bundle(cores=1, gpus=1), Owner("v")).gpu_uuids == [whole.uuid]


def test_mig_on_with_no_instances_is_not_a_whole_gpu():
    from gpuspawner.inventory.topology import node_from_dict

    node = node_from_dict({"name": "n", "numa_nodes": [{"id": 0, "cpus": "0-1", "memory": "1G"}],
                           "gpus": [{"uuid": "GPU-a", "mig": []}]})
    assert node.gpus[0].mig_enabled and node.gpus[0].mig == ()
    with pytest.raises(PlacementRefused):
        Ledger([node]).reserve(Bundle(cores=1, gpus=1), Owner("u"))


@pytest.mark.parametrize("mig, field, text", [
    ([{"uuid": "GPU-x", "profile": "1g.10gb"}], "gpus[0].mig[0].uuid", "MIG-..."),
    ([{"uuid": "MIG-x", "profile": "big"}], "gpus[0].mig[0].profile", "not a MIG profile"),
    ([{"uuid": "MIG-x", "profile": "1g.10gb"}, {"uuid": "MIG-x", "profile": "1g.10gb"}],
     "gpus[0].mig[1].uuid", "duplicate MIG UUID"),
    ([{"uuid": "MIG-x", "profile": "7g.80gb"}, {"uuid": "MIG-y", "profile": "4g.40gb"}],
     "gpus[0].mig", "11 compute slices"),
    ([{"uuid": "MIG-x", "profile": "1g.10gb", "files": ["dev/nvidia0"]}],
     "gpus[0].mig[0].files", "absolute"),
    ([{"uuid": "MIG-x", "profile": "1g.10gb", "colour": "red"}], "gpus[0].mig[0]", "colour"),
    ("1g.10gb", "gpus[0].mig", "must be a list"),
])
def test_topology_mig_errors_name_the_field(mig, field, text):
    from gpuspawner.inventory.topology import TopologyError, node_from_dict

    with pytest.raises(TopologyError) as e:
        node_from_dict({"name": "n", "numa_nodes": [{"id": 0, "cpus": "0-1", "memory": "1G"}],
                        "gpus": [{"uuid": "GPU-a", "mig": mig}]}, "t.yaml")
    assert field in str(e.value) and text in str(e.value), str(e.value)


# -- NVML inventory (through the NVML test double; the real-GPU test is marked gpu) --------------

def _mig_nvml():
    from tests.nvml_double import NVML_DEVICE_MIG_ENABLE, FakeGPU, FakeMIG, FakeNVML

    mig_gpu = FakeGPU("GPU-00000000-aaaa-bbbb-cccc-000000000000", mig_mode=NVML_DEVICE_MIG_ENABLE,
                      mig=[FakeMIG("MIG-11111111-aaaa-bbbb-cccc-000000000000", "3g.40gb",
                                   40192 * 1024**2, gpu_instance_id=2),
                           None,  # an empty slot: NotFound
                           FakeMIG("MIG-22222222-aaaa-bbbb-cccc-000000000000", "1g.10gb",
                                   gpu_instance_id=9),
                           FakeMIG("MIG-33333333-aaaa-bbbb-cccc-000000000000", "2g.20gb",
                                   19968 * 1024**2, name="MIG device")])  # name without profile
    off = FakeGPU("GPU-11111111-aaaa-bbbb-cccc-000000000000", pci_bus_id="00000000:0F:00.0",
                  mig_mode=0)  # MIG-capable, mode off: a whole GPU
    t4 = FakeGPU("GPU-22222222-aaaa-bbbb-cccc-000000000000", name="Tesla T4",
                 pci_bus_id="00000000:47:00.0")  # no MIG at all: NotSupported
    return FakeNVML([mig_gpu, off, t4])


def test_nvml_inventory_reads_mig_instances():
    from gpuspawner.inventory.local import read_gpus

    nvml = _mig_nvml()
    mig_gpu, off, t4 = read_gpus(nvml, numa_ids=[0])
    assert mig_gpu.mig_enabled and not off.mig_enabled and not t4.mig_enabled
    assert [(m.uuid[:12], m.profile, m.slices, m.memory_bytes >> 20, m.index, m.gpu)
            for m in mig_gpu.mig] == [
        ("MIG-11111111", "3g.40gb", 3, 40192, 0, mig_gpu.uuid),
        ("MIG-22222222", "1g.10gb", 1, 9856, 2, mig_gpu.uuid),
        ("MIG-33333333", "2g.20gb", 2, 19968, 3, mig_gpu.uuid),  # from the attributes
    ]
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)
    node = Node("n", (NumaNode(0, (0, 1, 2, 3), 8 * GiB),), (mig_gpu, off, t4))
    ledger = Ledger([node])
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u")).mig_uuids == [
        "MIG-22222222-aaaa-bbbb-cccc-000000000000"]
    assert ledger.reserve(Bundle(cores=1, gpus=2), Owner("v")).gpu_uuids == [off.uuid, t4.uuid]


def test_nvml_mig_errors_skip_one_instance_and_bytes_bindings_work():
    from gpuspawner.inventory.local import read_gpus
    from tests.nvml_double import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN

    nvml = _mig_nvml()
    nvml.return_bytes = True
    nvml.gpus[0].mig[0].fail["nvmlDeviceGetAttributes"] = NVML_ERROR_UNKNOWN
    mig_gpu, _off, _t4 = read_gpus(nvml, numa_ids=[0])
    assert [m.profile for m in mig_gpu.mig] == ["1g.10gb", "2g.20gb"]
    nvml.gpus[0].fail["nvmlDeviceGetMigMode"] = NVML_ERROR_GPU_IS_LOST
    assert not read_gpus(nvml, numa_ids=[0])[0].mig_enabled  # logged, taken as off


def test_nvml_inventory_dumps_the_mig_layout_as_a_topology_file():
    import yaml

    from gpuspawner.inventory.local import read_gpus
    from gpuspawner.inventory.topology import dump_topology, node_from_dict

    node = Node("n", (NumaNode(0, (0, 1), GiB),), read_gpus(_mig_nvml(), numa_ids=[0]))
    assert node_from_dict(yaml.safe_load(dump_topology(node))) == node


@pytest.mark.gpu
def test_real_nvml_mig():
    """On a real GPU: every MIG device NVML lists is read, with a MIG- UUID and a profile."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"nvmlInit() failed: {e}")
    try:
        expected: dict[str, list[str]] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            try:
                on = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                on = False
            expected[uuid] = []
            if on:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except pynvml.NVMLError:
                        continue
                    u = pynvml.nvmlDeviceGetUUID(m)
                    expected[uuid].append(u.decode() if isinstance(u, bytes) else u)
    finally:
        pynvml.nvmlShutdown()
    from gpuspawner.inventory.local import read_gpus

    gpus = read_gpus()
    assert {g.uuid: [m.uuid for m in g.mig] for g in gpus} == expected
    for g in gpus:
        for m in g.mig:
            assert m.uuid.startswith("MIG-") and m.slices >= 1 and m.memory_bytes > 0
            assert mig_slices(m.profile) >= 1


# -- Slurm: GRES types for MIG instances, gres.conf, the job's --gres and read-back -------------

MIG_A = "MIG-aaaaaaaa-0000-0000-0000-000000000001"  # 3g.40gb, no device files in the topology
MIG_B = "MIG-aaaaaaaa-0000-0000-0000-000000000002"  # 1g.10gb, with device files
WHOLE = "GPU-66666666-2222-3333-4444-555555555555"


def _slurm_node():
    from gpuspawner.inventory.topology import load_topology_file

    return load_topology_file(TOPOLOGIES / "mig-a100.yaml")


def test_gres_devices_put_mig_instances_in_place_of_their_gpu():
    from gpuspawner.backends.slurm.gres import gres_devices
    from gpuspawner.backends.slurm.job import gpu_positions

    node = _slurm_node()
    assert [u for u, _g, _m in gres_devices(node)] == [MIG_A, MIG_B, WHOLE]
    assert gpu_positions(node) == {MIG_A: 0, MIG_B: 1, WHOLE: 2}


def test_gres_conf_and_node_gres_for_a_mig_layout():
    from gpuspawner.backends.slurm.gres import GresError, gres_conf, gres_type, node_gres

    node = _slurm_node()
    caps = "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31"
    lines = gres_conf(node, {MIG_A: caps, WHOLE: "/dev/nvidia1"})
    assert lines == [
        f"NodeName=mig1 Name=gpu Type={gres_type(MIG_A)} MultipleFiles={caps} Cores=0-7",
        f"NodeName=mig1 Name=gpu Type={gres_type(MIG_B)} MultipleFiles=/dev/nvidia0,"
        "/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 Cores=0-7",
        f"NodeName=mig1 Name=gpu Type={gres_type(WHOLE)} File=/dev/nvidia1 Cores=0-7",
    ]
    assert gres_type(MIG_A) == MIG_A.lower()
    assert node_gres(node) == (f"gpu:{gres_type(MIG_A)}:1,gpu:{gres_type(MIG_B)}:1,"
                               f"gpu:{gres_type(WHOLE)}:1")
    # model mode: the MIG profile is the type (Slurm's own MIG names, AutoDetect=nvml)
    model = gres_conf(node, {MIG_A: caps, WHOLE: "/dev/nvidia1"}, mode="model")
    assert [ln.split()[2] for ln in model] == ["Type=3g.40gb", "Type=1g.10gb", "Type=A100"]
    assert node_gres(node, mode="model") == "gpu:3g.40gb:1,gpu:1g.10gb:1,gpu:A100:1"
    with pytest.raises(GresError, match=f"MIG instance {MIG_A} has no device files"):
        gres_conf(node, {WHOLE: "/dev/nvidia1"})


def test_cli_slurm_gres_for_a_mig_layout(capsys, tmp_path):
    from gpuspawner.cli import main

    topo = tmp_path / "mig.yaml"
    topo.write_text((TOPOLOGIES / "mig-a100.yaml").read_text().replace(
        "profile: 3g.40gb, memory: 40G}",
        "profile: 3g.40gb, memory: 40G, files: [/dev/nvidia0, /dev/nvidia-caps/nvidia-cap30]}"))
    assert main(["slurm-gres", "--topology", str(topo), "--dev-dir", "/dev"]) == 0
    out = capsys.readouterr().out.splitlines()
    body = [ln for ln in out if ln.startswith("NodeName=")]
    assert body[0].startswith(f"NodeName=mig1 Name=gpu Type={MIG_A.lower()} MultipleFiles="
                              "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap30")
    assert body[2] == f"NodeName=mig1 Name=gpu Type={WHOLE.lower()} File=/dev/nvidia1 Cores=0-7"
    assert any(ln.startswith("# slurm.conf NodeName=mig1 Gres=gpu:mig-aaaaaaaa") for ln in out)
    assert main(["slurm-gres", "--model-topology", str(topo), "--dev-dir", "/dev"]) == 0
    assert "# slurm.conf NodeName=mig1 Gres=gpu:3g.40gb:1,gpu:1g.10gb:1,gpu:A100:1" in (
        capsys.readouterr().out)
    assert main(["slurm-gres", "--topology", str(TOPOLOGIES / "mig-a100.yaml"),
                 "--dev-dir", "/dev"]) == 1
    assert "has no device files" in capsys.readouterr().err


def test_slurm_job_asks_for_the_booked_instance_and_reads_it_back():
    from gpuspawner.backends.slurm.commands import parse_job
    from gpuspawner.backends.slurm.gres import gres_type
    from gpuspawner.backends.slurm.job import admin_comment, check_readback, plan_job
    from gpuspawner.backends.spec import launch_spec

    node = _slurm_node()
    alloc = Ledger([node]).reserve(Bundle(cores=1, memory_bytes=300 << 20, mig="1g.10gb"),
                                   Owner("ann"))

    def spec(a):
        return launch_spec(name="jupyter-ann", user="ann", server="", allocation=a, image="x",
                           cmd=["/opt/jh/bin/jupyterhub-singleuser"], env={}, uid=2001,
                           gid=2001, port=8888)

    plan = plan_job(spec(alloc), node)
    assert plan.gres == f"gpu:{gres_type(MIG_B)}:1" and plan.binding
    assert f"--gres=gpu:{gres_type(MIG_B)}:1" in plan.options
    with pytest.raises(ValueError, match="gpu_mode 'exact'"):
        plan_job(spec(alloc), node, mode="model")
    def job(idx: int):
        return parse_job(f"""JobId=7 JobName=jupyter-ann
   UserId=ann(2001) GroupId=ann(2001) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=mig1
     Nodes=mig1 CPU_IDs={alloc.cpuset_str()} Mem=300 GRES=gpu:{gres_type(MIG_B)}:1(IDX:{idx})
   Comment=gpuspawner-port=40001
   AdminComment={admin_comment(alloc)}
""")

    assert check_readback(job(1), alloc, node, 300) == []  # IDX 1: the second MIG device
    assert "(IDX:0)" in "; ".join(check_readback(job(0), alloc, node, 300))


# -- what people see: the spawn form's cards, the queue's words, the metrics' milli-GPU ---------

def test_form_cards_and_queue_words_for_a_mig_profile():
    from gpuspawner.hub.form import profile_cards, resources_line
    from gpuspawner.hub.profiles import load_profiles
    from gpuspawner.placement.queue import QueueEntry, WaitQueue

    node = mig_node("b", [["1g.10gb", "1g.10gb", "3g.40gb"]], plain=1)
    ledger = Ledger([node])
    small, big, none = load_profiles([
        {"slug": "small", "mig": "1g.10gb", "queue": False},
        {"slug": "big", "mig": "3g.40gb", "mig_count": 2},
        {"slug": "none", "mig": "7g.80gb"}])
    assert resources_line(small.bundle, ledger.nodes) == "1 x MIG 1g.10gb · 1 core"
    ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("x"))
    cards = {c["slug"]: c for c in profile_cards([small, big, none], ledger, "u", [])}
    assert cards["small"]["availability"] == "1 of 2 MIG 1g.10gb free now"
    assert cards["small"]["free"] and cards["small"]["available"]
    assert cards["big"]["never"] and cards["big"]["reason"] == "larger than any node of this hub"
    assert cards["none"]["reason"] == "no MIG 7g.80gb instance on this hub"
    assert ledger.free_gpus() == (1, 1)  # the whole GPU only: MIG GPUs are not whole GPUs
    entry = QueueEntry(id="e", owner=Owner("u"), bundle=small.bundle)
    assert WaitQueue(ledger).gpus_wanted(entry) == "1 x MIG 1g.10gb"


def test_gpu_milli_allocated_counts_booked_instances():
    ledger = Ledger([mig_node("b", [["1g.10gb", "3g.40gb"]], plain=1)])
    assert ledger.gpu_milli_allocated() == 0
    ledger.reserve(Bundle(cores=1, mig="3g.40gb"), Owner("u"))
    ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("v"))
    assert ledger.gpu_milli_allocated() == 429 + 1000
    assert ledger.gpu_milli_capacity() == 2000


def test_a_drained_mig_gpu_offers_none_of_its_instances():
    ledger = Ledger([mig_node("b", [["1g.10gb", "1g.10gb"], ["1g.10gb"]], numa=1)])
    running = ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("u"))
    assert running.mig[0].gpu == "GPU-b-01"  # best fit: the GPU with fewer free slices
    assert ledger.drain_gpu("GPU-b-00", "XID 79") == "b"
    with pytest.raises(PlacementRefused):  # GPU 0's two free instances are drained
        ledger.reserve(Bundle(cores=1, mig="1g.10gb"), Owner("v"))
    assert ledger.free_gpus(mig="1g.10gb") == (0, 3)
    ledger.release(running.id)
    assert ledger.free_gpus(mig="1g.10gb") == (1, 3)
    assert ledger.capacity_refusal(Bundle(cores=1, mig="1g.10gb", mig_count=2)) is not None
    with pytest.raises(KeyError, match="MIG instance; drain its GPU GPU-b-01"):
        ledger.drain_gpu(running.mig[0].uuid, "x")
    ledger.undrain_gpu("GPU-b-00")
    assert ledger.free_gpus(mig="1g.10gb") == (3, 3)
    assert ledger.reserve(Bundle(cores=1, mig="1g.10gb", mig_count=2), Owner("w")).mig


def test_progress_names_the_mig_instances():
    from gpuspawner.hub.progress import placement_message

    node = mig_node("b", [["1g.10gb", "1g.10gb"]], numa=1)
    a = Ledger([node]).reserve(Bundle(cores=2, memory_bytes=GiB, mig="1g.10gb", mig_count=2),
                               Owner("u"))
    assert placement_message(a, node) == "2 x MIG 1g.10gb (A100 GPU 0), 2 cores, 1 GiB memory"
    assert placement_message(a).startswith("2 x MIG 1g.10gb, 2 cores")
