"""Unit tests of the placement module: model, device selection, policies, ledger, refusals."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from gpuspawner.placement import (
    Allocation,
    Bundle,
    GPULink,
    InvalidBundle,
    Ledger,
    Owner,
    PlacementError,
    PlacementRefused,
    QuotaExceeded,
    QuotaTable,
    UnknownAllocation,
    format_cpu_list,
    parse_bytes,
    parse_cpu_list,
)
from gpuspawner.placement.workload import PodType
from tests.factories import GiB, make_node


# -- model -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({"cores": -1}, "cores"),
    ({"gpus": 1, "gpu_milli": 500}, "gpu_milli"),
    ({"gpu_milli": 1000}, "gpu_milli"),
    ({"numa_policy": "sometimes"}, "numa_policy"),
    ({"memory_bytes": 1.5}, "memory_bytes"),
    ({"gpus": True}, "gpus"),
])
def test_bundle_rejects_bad_fields(kwargs, field):
    with pytest.raises(InvalidBundle) as e:
        Bundle(**kwargs)
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")


def test_allocation_json_round_trip():
    ledger = Ledger([make_node()])
    a = ledger.reserve(Bundle(cores=4, memory_bytes=8 * GiB, gpus=1),
                       Owner("alice", "gpu", ("lab",)))
    text = a.to_json()
    assert json.loads(text)["gpus"][0]["uuid"] == a.gpus[0].uuid
    assert Allocation.from_json(text) == a


@pytest.mark.parametrize("text", ["{", "[]", '{"id": "x"}', '{"id":"x","owner":{"user":"a"},'
                                  '"node":"n","cpuset":["z"],"mems":[],"memory_bytes":0}'])
def test_allocation_from_bad_json_is_value_error(text):
    with pytest.raises(ValueError):
        Allocation.from_json(text)


def test_cpu_list_syntax():
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpu_list("") == ()
    with pytest.raises(ValueError):
        parse_cpu_list("5-2")


@pytest.mark.parametrize("text, value", [
    ("4G", 4 * GiB), ("512M", 512 * 1024**2), ("1.5Gi", int(1.5 * GiB)), ("2GB", 2 * 10**9),
    (1024, 1024), ("100", 100), ("64 GiB", 64 * GiB),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["four", "-1", "4X", ""])
def test_parse_bytes_errors(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_gpulink_parse_names():
    assert GPULink.parse("nv4") is GPULink.NVLINK
    assert GPULink.parse("PIX") is GPULink.SINGLE
    assert GPULink.parse("sys") is GPULink.SYSTEM
    with pytest.raises(ValueError, match="unknown GPU link"):
        GPULink.parse("carrier-pigeon")


# -- device selection ------------------------------------------------------------------------
def test_strict_puts_cores_and_memory_on_the_gpus_numa_node():
    node = make_node(gpus=4, numa=2, cores=16)
    ledger = Ledger([node])
    a = ledger.reserve(Bundle(cores=4, memory_bytes=8 * GiB, gpus=2), Owner("u"))
    gpu_numa = {node.gpu(u).numa_node for u in a.gpu_uuids}
    assert len(gpu_numa) == 1
    (n,) = gpu_numa
    assert a.mems == (n,)
    numa_cpus = set(node.numa_nodes[n].cpus)
    assert set(a.cpuset) <= numa_cpus and len(a.cpuset) == 4
    assert dict(a.memory_by_numa) == {n: 8 * GiB}
    assert a.numa_aligned


def test_nvlink_pair_preferred():
    # GPUs 0..3 on one NUMA node; 0-1 and 2-3 NVLinked. After GPU 0 goes, a 2-GPU bundle
    # must get the NVLink pair 2-3, not 1 with 2 or 3.
    node = make_node(gpus=4, numa=1, nvlink_pairs=[(0, 1), (2, 3)])
    ledger = Ledger([node], policy="first-fit")
    first = ledger.reserve(Bundle(cores=1, gpus=1), Owner("a"))
    assert first.gpu_uuids == ["GPU-n1-00"]
    pair = ledger.reserve(Bundle(cores=1, gpus=2), Owner("b"))
    assert sorted(pair.gpu_uuids) == ["GPU-n1-02", "GPU-n1-03"]


def test_cpu_only_bundle_leaves_gpu_local_numa_node_free():
    # all GPUs on NUMA 0; a CPU-only bundle must take NUMA 1's cores
    node = make_node(gpus=2, numa=2, cores=16, gpu_numa=[0, 0])
    ledger = Ledger([node])
    a = ledger.reserve(Bundle(cores=4, memory_bytes=4 * GiB), Owner("cpu"))
    assert set(a.cpuset) <= set(node.numa_nodes[1].cpus)
    assert a.mems == (1,)
    g = ledger.reserve(Bundle(cores=8, memory_bytes=16 * GiB, gpus=2), Owner("gpu"))
    assert set(g.cpuset) == set(node.numa_nodes[0].cpus)


def test_single_gpus_pack_one_numa_node_and_keep_the_other_whole():
    node = make_node(gpus=4, numa=2, cores=16)  # GPUs 0,1 on NUMA 0; 2,3 on NUMA 1
    ledger = Ledger([node], policy="first-fit")
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("a"))
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("b"))
    held = {u for a in ledger.allocations() for u in a.gpu_uuids}
    free_per_numa = [sum(1 for g in node.gpus if g.numa_node == n and g.uuid not in held)
                     for n in (0, 1)]
    assert sorted(free_per_numa) == [0, 2]
    pair = ledger.reserve(Bundle(cores=2, gpus=2), Owner("c"))
    assert pair.numa_aligned and len(pair.mems) == 1


def test_two_gpus_split_across_numa_nodes():
    node = make_node(gpus=4, numa=2, cores=16)
    ledger = Ledger([node], policy="first-fit")
    # book exactly GPU 0 (NUMA 0) and GPU 2 (NUMA 1) through restore
    base = ledger.reserve(Bundle(cores=1, gpus=1), Owner("x"))
    ledger.release(base.id)
    for i, uuid in enumerate(["GPU-n1-00", "GPU-n1-02"]):
        a = Allocation(id=f"held{i}", owner=Owner(f"h{i}"), node="n1",
                       gpus=(base.gpus[0].__class__(uuid),), cpuset=(), mems=(0,),
                       memory_bytes=0, disk_bytes=0, memory_by_numa=((0, 0),))
        assert ledger.restore([a]).ok
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=2, gpus=2, gpu_models=("A100",)), Owner("s"))
    assert e.value.reason == "gpus"
    assert "no node has 2 free A100 on one NUMA node; best: n1 with 1 free" in str(e.value)
    p = ledger.reserve(Bundle(cores=2, gpus=2, numa_policy="prefer"), Owner("p"))
    assert sorted(p.gpu_uuids) == ["GPU-n1-01", "GPU-n1-03"]
    assert not p.numa_aligned
    assert "spilled across NUMA nodes" in p.note and p.note in p.summary()


def test_shares_pack_onto_one_gpu():
    ledger = Ledger([make_node(gpus=2, numa=1, shareable=True)])
    a = ledger.reserve(Bundle(cores=1, gpu_milli=300), Owner("a"))
    b = ledger.reserve(Bundle(cores=1, gpu_milli=500), Owner("b"))
    assert a.gpu_uuids == b.gpu_uuids
    assert b.gpus[0].milli == 500
    c = ledger.reserve(Bundle(cores=1, gpu_milli=300), Owner("c"))  # 200 left on the first
    assert c.gpu_uuids != a.gpu_uuids
    with pytest.raises(PlacementRefused) as e:  # both GPUs are partly used now
        ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("w"))
    assert e.value.reason == "gpus"


def test_share_refused_on_exclusive_gpu():
    ledger = Ledger([make_node(gpus=2, shareable=False)])
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=1, gpu_milli=250), Owner("a"))
    assert e.value.reason == "no_gpu_model"
    assert "shareable" in str(e.value)


def test_unknown_model_refusal_lists_models():
    ledger = Ledger([make_node(model="T4"), make_node("n2", model="V100")])
    with pytest.raises(PlacementRefused, match=r"no node has a H100 \(models here: T4, V100\)"):
        ledger.reserve(Bundle(cores=1, gpus=1, gpu_models=("H100",)), Owner("a"))


def test_cores_refusal_names_best_node():
    ledger = Ledger([make_node(cores=8, numa=1), make_node("n2", cores=4, numa=1)])
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=9, gpus=1), Owner("a"))
    assert e.value.reason == "too_large"
    ledger.reserve(Bundle(cores=6), Owner("b"))
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=7, gpus=1), Owner("c"))
    assert e.value.reason == "cores"
    assert "best: n1 with" in str(e.value) or "best: n2 with" in str(e.value)


def test_model_match_is_case_insensitive_and_restricts():
    ledger = Ledger([make_node("t4", model="T4"), make_node("a100", model="A100")])
    a = ledger.reserve(Bundle(cores=1, gpus=1, gpu_models=("a100",)), Owner("a"))
    assert a.node == "a100"


# -- policies --------------------------------------------------------------------------------
def test_policies_choose_differently():
    def fresh(policy, **kw):
        led = Ledger([make_node("a", gpus=4), make_node("b", gpus=4), make_node("c", gpus=4)],
                     policy=policy, **kw)
        led.reserve(Bundle(cores=1, gpus=1), Owner("seed"), nodes=["b"])
        return led

    assert fresh("first-fit").reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "a"
    assert fresh("best-fit").reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "b"
    assert fresh("pack").reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "b"
    assert fresh("gpu-packing").reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "b"
    assert fresh("spread").reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "a"
    # fgd with pairs in the workload: b's seed GPU left one GPU alone on its NUMA node (a
    # fragment for pairs); filling it lowers F by 500, a new GPU on a would raise it by 500
    pairs = [(PodType(1000, 1000, 2), 0.5), (PodType(1000, 1000, 1), 0.5)]
    assert fresh("fgd", workload=pairs).reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "b"
    # with single GPUs only, every node's F stays 0: the smallest name wins
    ones = [(PodType(1000, 1000, 1), 1.0)]
    assert fresh("fgd", workload=ones).reserve(Bundle(cores=1, gpus=1), Owner("x")).node == "a"
    r1 = [fresh("random", seed=7).reserve(Bundle(cores=1), Owner("x")).node for _ in range(3)]
    r2 = [fresh("random", seed=7).reserve(Bundle(cores=1), Owner("x")).node for _ in range(3)]
    assert r1 == r2


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown placement policy 'best'"):
        Ledger([make_node()], policy="best")


def test_fgd_sends_cpu_only_work_to_cpu_nodes():
    ledger = Ledger([make_node("gpu", gpus=4), make_node("cpu", gpus=0)])
    assert ledger.reserve(Bundle(cores=2), Owner("a")).node == "cpu"


def test_fgd_is_cpu_aware_and_ties_go_by_name():
    # the GPU task type needs 8 cores; 10 CPU-only cores on "a-gpu" would leave 6 and turn its
    # 2 free GPUs into a Q4 fragment (frag.go), so they go to "b-cpu" despite the name order
    work = [(PodType(8000, 1000, 1), 0.9), (PodType(2000), 0.1)]
    ledger = Ledger([make_node("a-gpu", gpus=2, numa=1, cores=16), make_node("b-cpu", gpus=0)],
                    "fgd", workload=work)
    assert ledger.workload == work
    assert ledger.reserve(Bundle(cores=10), Owner("c")).node == "b-cpu"
    # 4 cores leave 12 >= 8 on a-gpu: F does not move on either node, the name decides (the
    # default, fgd-mem-lookahead, looks further: tests/test_placement_default.py)
    assert ledger.reserve(Bundle(cores=4), Owner("d")).node == "a-gpu"
    ledger.set_workload(None)  # back to the online workload of the bundles seen
    assert {t for t, _ in ledger.workload} <= {PodType(10000), PodType(4000)}


def test_paper_baselines_on_the_ledger():
    nodes = [make_node("a", gpus=4, shareable=True), make_node("b", gpus=4, shareable=True)]
    ledger = Ledger(nodes, policy="gpu-clustering")
    assert ledger.reserve(Bundle(cores=1, gpu_milli=300), Owner("s1")).node == "a"
    assert ledger.reserve(Bundle(cores=1, gpus=2), Owner("w1")).node == "b"  # a holds shares
    assert ledger.reserve(Bundle(cores=1, gpu_milli=300), Owner("s2")).node == "a"
    ledger.set_policy("dot-product")
    assert ledger.reserve(Bundle(cores=1, gpus=1), Owner("w2")).node == "b"  # less left


def test_node_restriction():
    ledger = Ledger([make_node("a"), make_node("b")])
    assert ledger.reserve(Bundle(cores=1, gpus=1), Owner("u"), nodes=["b"]).node == "b"
    with pytest.raises(PlacementRefused, match="no node is available"):
        ledger.reserve(Bundle(cores=1), Owner("v"), nodes=[])


# -- ledger ----------------------------------------------------------------------------------
def test_release_and_unknown():
    ledger = Ledger([make_node(gpus=1, numa=1)])
    a = ledger.reserve(Bundle(cores=1, gpus=1), Owner("a"))
    with pytest.raises(PlacementRefused):
        ledger.reserve(Bundle(cores=1, gpus=1), Owner("b"))
    ledger.release(a.id)
    assert ledger.reserve(Bundle(cores=1, gpus=1), Owner("b")).gpu_uuids == a.gpu_uuids
    with pytest.raises(UnknownAllocation, match="no allocation nope"):
        ledger.release("nope")


def test_one_allocation_per_server():
    ledger = Ledger([make_node()])
    ledger.reserve(Bundle(cores=1), Owner("a", "s1"))
    ledger.reserve(Bundle(cores=1), Owner("a", "s2"))
    with pytest.raises(PlacementError, match="already holds"):
        ledger.reserve(Bundle(cores=1), Owner("a", "s1"))


def test_restore_reports_conflicts_instead_of_double_booking():
    node = make_node(gpus=2, numa=1)
    old = Ledger([node])
    a = old.reserve(Bundle(cores=2, gpus=1, memory_bytes=GiB), Owner("alice"))
    # a second, forged allocation on the same GPU and cores
    forged = Allocation.from_dict({**a.to_dict(), "id": "forged",
                                   "owner": {"user": "mallory", "server": ""}})
    new = Ledger([node])
    report = new.restore([a.to_json(), forged, {"id": "bad"},
                          {**a.to_dict(), "id": "ghost", "node": "gone",
                           "owner": {"user": "g"}}])
    assert report.restored == [a.id]
    problems = {c.allocation_id: c.problem for c in report.conflicts}
    assert "held by alice/" in problems["forged"]
    assert "missing field" in problems["?"]
    assert "not in the inventory" in problems["ghost"]
    assert new.snapshot()[0]["gpus"][0]["milli_used"] + \
        new.snapshot()[0]["gpus"][1]["milli_used"] == 1000
    # a new reservation never gets the restored GPU
    b = new.reserve(Bundle(cores=1, gpus=1), Owner("bob"))
    assert b.gpu_uuids != a.gpu_uuids


def test_restore_replace_rebuilds():
    ledger = Ledger([make_node()])
    a = ledger.reserve(Bundle(cores=1, gpus=1), Owner("a"))
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("b"))
    report = ledger.restore([a], replace=True)
    assert report.ok and [x.id for x in ledger.allocations()] == [a.id]


# -- quotas ----------------------------------------------------------------------------------
def test_user_gpu_quota_third_gpu_refused():
    quotas = QuotaTable.from_config(users={"alice": {"gpus": 2}})
    ledger = Ledger([make_node(gpus=4)], quotas=quotas)
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("alice", "a"))
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("alice", "b"))
    with pytest.raises(QuotaExceeded) as e:
        ledger.reserve(Bundle(cores=1, gpus=1), Owner("alice", "c"))
    assert e.value.scope == "user" and e.value.resource == "gpu_milli"
    assert str(e.value) == ("over your quota for GPUs: asked for 1 GPU, 2 GPUs of 2 GPUs in use, "
                            "your quota allows 0 GPUs more")
    assert len(ledger.allocations("alice")) == 2
    # someone else is not limited by alice's quota
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("bob"))


def test_group_quota_is_shared_by_members_and_freed_on_release():
    quotas = QuotaTable.from_config(groups={"students": {"cores": 4, "servers": 2}})
    ledger = Ledger([make_node()], quotas=quotas)
    a = ledger.reserve(Bundle(cores=3), Owner("s1", groups=("students",)))
    with pytest.raises(QuotaExceeded, match="group students's quota"):
        ledger.reserve(Bundle(cores=2), Owner("s2", groups=("students",)))
    ledger.reserve(Bundle(cores=1), Owner("s2", groups=("students",)))
    with pytest.raises(QuotaExceeded) as e:
        ledger.reserve(Bundle(cores=0), Owner("s3", groups=("students",)))
    assert e.value.resource == "servers"
    ledger.release(a.id)
    ledger.reserve(Bundle(cores=3), Owner("s3", groups=("students",)))


def test_refusal_says_what_quota_allows():
    quotas = QuotaTable.from_config(default_user={"gpus": 3})
    ledger = Ledger([make_node(gpus=2)], quotas=quotas)
    ledger.reserve(Bundle(cores=1, gpus=2, numa_policy="prefer"), Owner("u", "x"))
    with pytest.raises(PlacementRefused, match="your quota allows 1 more GPU$"):
        ledger.reserve(Bundle(cores=1, gpus=1), Owner("u", "y"))


@pytest.mark.parametrize("cfg, msg", [
    ({"users": {"a": {"gpus": "two"}}}, "users.a.gpus"),
    ({"groups": {"g": {"memory": "lots"}}}, "groups.g.memory"),
    ({"groups": {"g": {"cpus": 3}}}, "groups.g.cpus: unknown key"),
    ({"users": {"a": {"cores": -1}}}, "users.a.cores: must be >= 0"),
])
def test_quota_config_errors(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        QuotaTable.from_config(**cfg)


# -- concurrency -----------------------------------------------------------------------------
def test_threads_never_overbook():
    ledger = Ledger([make_node(gpus=4, numa=2, cores=16)])
    got: list[Allocation] = []
    errors: list[Exception] = []
    barrier = threading.Barrier(16)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            got.append(ledger.reserve(Bundle(cores=2, gpus=1), Owner(f"u{i}")))
        except PlacementRefused as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 4 and len(errors) == 12
    assert len({u for a in got for u in a.gpu_uuids}) == 4
    assert len({c for a in got for c in a.cpuset}) == 8


async def test_asyncio_tasks_never_overbook():
    ledger = Ledger([make_node(gpus=2, numa=1)])

    async def one(i: int):
        await asyncio.sleep(0)
        return await asyncio.to_thread(ledger.reserve, Bundle(cores=1, gpus=1), Owner(f"u{i}"))

    results = await asyncio.gather(*(one(i) for i in range(10)), return_exceptions=True)
    ok = [r for r in results if isinstance(r, Allocation)]
    assert len(ok) == 2
    assert all(isinstance(r, PlacementRefused) for r in results if r not in ok)


def test_refusal_for_a_bundle_spanning_numa_nodes_says_how_many():
    ledger = Ledger([make_node(gpus=4, numa=2, cores=16)])
    ledger.reserve(Bundle(cores=1, gpus=1), Owner("a"))
    with pytest.raises(PlacementRefused,
                       match="no node has 4 free GPU on 2 NUMA nodes; best: n1 with 3 free"):
        ledger.reserve(Bundle(cores=2, gpus=4), Owner("b"))


def test_fgd_prefers_nodes_where_a_multi_gpu_bundle_fits_one_numa_node():
    # on "a" 6 cores need both NUMA nodes (4 cores each); on "b" one NUMA node holds them.
    # Fragmentation does not move on either node, so the name alone would pick "a".
    ones = [(PodType(1000, 1000, 1), 1.0)]
    nodes = [make_node("a", gpus=4, numa=2, cores=8), make_node("b", gpus=4, numa=2, cores=16)]
    a = Ledger(nodes, workload=ones).reserve(Bundle(cores=6, gpus=2), Owner("u"))
    assert a.node == "b" and len(a.mems) == 1 and a.numa_aligned
    # a single GPU has no such preference: the name decides
    assert Ledger(nodes, workload=ones).reserve(Bundle(cores=6, gpus=1), Owner("u")).node == "a"


def test_fits_now_is_the_ledgers_own_answer():
    """``fits_now`` plans on the live state: booked and drained GPUs, booked cores and down
    nodes count."""
    ledger = Ledger([make_node("a", gpus=2, numa=2, cores=8), make_node("b", gpus=0, cores=4)])
    one = Bundle(cores=1, memory_bytes=GiB, gpus=1)
    assert ledger.fits_now(one) == "a"
    ledger.reserve(one, Owner("u1"))
    assert ledger.fits_now(one) == "a"
    ledger.drain_gpu("GPU-a-01", "test")
    assert ledger.fits_now(one) is None and ledger.fits_now(one, ["b"]) is None
    cpu = Bundle(cores=4, memory_bytes=GiB)
    assert ledger.fits_now(cpu, ["b"]) == "b"
    ledger.set_node_state("b", "down", "test")
    assert ledger.fits_now(cpu, ["b"]) is None
    # node a: 7 of its 8 cores free (u1 holds one)
    assert ledger.fits_now(Bundle(cores=8, memory_bytes=GiB)) is None
    assert ledger.fits_now(Bundle(cores=7, memory_bytes=GiB)) == "a"
