"""Node states and drained GPUs in the ledger (gpuspawner.placement.Ledger): a down or drained
node and a drained GPU get no new placements, what already runs keeps its devices, and restore
after a restart still books a server that runs on a drained GPU."""

from __future__ import annotations

import pytest

from gpuspawner.placement import (
    GPU_MILLI,
    Bundle,
    Ledger,
    Owner,
    PlacementError,
    PlacementRefused,
    UnknownAllocation,
)
from tests.factories import GiB, make_node

ONE_GPU = Bundle(cores=1, gpus=1, numa_policy="none")


def test_drained_gpu_is_never_chosen_and_comes_back():
    ledger = Ledger([make_node(gpus=2)])
    bad = "GPU-n1-00"
    assert ledger.drain_gpu(bad, "xid 79") == "n1"
    got = ledger.reserve(ONE_GPU, Owner("a"))
    assert got.gpu_uuids == ["GPU-n1-01"]
    with pytest.raises(PlacementRefused):
        ledger.reserve(ONE_GPU, Owner("b"))  # the only other GPU is drained
    assert ledger.drained_gpus() == {bad: "xid 79"}
    assert ledger.gpu_milli_allocated() == GPU_MILLI  # the hold is not an allocation
    view = {g["uuid"]: g for g in ledger.snapshot()[0]["gpus"]}
    assert view[bad]["drained"] == "xid 79" and view[bad]["milli_used"] == 0
    ledger.undrain_gpu(bad)
    assert ledger.reserve(ONE_GPU, Owner("b")).gpu_uuids == [bad]


def test_shares_on_a_drained_gpu_keep_running_and_what_they_free_stays_held():
    ledger = Ledger([make_node(gpus=1, numa=1, shareable=True)])
    a = ledger.reserve(Bundle(cores=1, gpu_milli=400), Owner("a"))
    ledger.drain_gpu(a.gpu_uuids[0], "ecc")
    with pytest.raises(PlacementRefused):
        ledger.reserve(Bundle(cores=1, gpu_milli=100), Owner("b"))
    assert ledger.get(a.id) is not None  # still booked
    ledger.release(a.id)
    with pytest.raises(PlacementRefused):  # given back, but held: the GPU is drained
        ledger.reserve(Bundle(cores=1, gpu_milli=100), Owner("b"))
    ledger.undrain_gpu(a.gpu_uuids[0])
    assert ledger.reserve(Bundle(cores=1, gpus=1), Owner("b")).gpu_uuids == a.gpu_uuids


def test_restore_books_a_server_that_runs_on_a_drained_gpu():
    ledger = Ledger([make_node(gpus=1, numa=1)])
    a = ledger.reserve(ONE_GPU, Owner("a"))
    text = a.to_json()
    fresh = Ledger([make_node(gpus=1, numa=1)])  # after a hub restart
    fresh.drain_gpu(a.gpu_uuids[0], "retired pages")
    report = fresh.restore([text])
    assert report.restored == [a.id] and not report.conflicts
    fresh.release(a.id)
    with pytest.raises(PlacementRefused):
        fresh.reserve(ONE_GPU, Owner("b"))  # still drained after the release


def test_down_and_drained_nodes_take_nothing_new():
    ledger = Ledger([make_node("n1", gpus=1), make_node("n2", gpus=1)], policy="first-fit")
    ledger.set_node_state("n1", "down", "not responding")
    assert ledger.reserve(ONE_GPU, Owner("a")).node == "n2"
    ledger.set_node_state("n2", "drain", "admin")
    with pytest.raises(PlacementRefused) as e:
        ledger.reserve(Bundle(cores=1), Owner("b"))
    assert "node n1 is down (not responding)" in str(e.value)
    assert "node n2 is drain (admin)" in str(e.value)
    assert ledger.node_state("n1") == ("down", "not responding")
    assert [n["state"] for n in ledger.snapshot()] == ["down", "drain"]
    ledger.set_node_state("n1", "up")
    assert ledger.reserve(ONE_GPU, Owner("b")).node == "n1"
    with pytest.raises(ValueError, match="node state"):
        ledger.set_node_state("n1", "sleepy")
    with pytest.raises(KeyError):
        ledger.drain_gpu("GPU-nowhere", "x")


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "spread", "random"])
def test_every_policy_respects_node_state(policy):
    ledger = Ledger([make_node(f"n{i}", gpus=2) for i in range(4)], policy=policy, seed=1)
    for i in range(3):
        ledger.set_node_state(f"n{i}", "down")
    for user in "ab":
        assert ledger.reserve(ONE_GPU, Owner(user)).node == "n3"
    with pytest.raises(PlacementRefused):  # n3 is full; the others have free GPUs but are down
        ledger.reserve(ONE_GPU, Owner("c"))


def test_adopt_takes_the_granted_cores_and_gpus_or_changes_nothing():
    """What Slurm granted replaces what the ledger planned (same counts, models, NUMA)."""
    ledger = Ledger([make_node(gpus=2, numa=1, cores=4)])
    a = ledger.reserve(Bundle(cores=2, gpus=1), Owner("a"))
    other = ledger.reserve(Bundle(cores=1), Owner("b"))
    free_cores = sorted(set(range(4)) - set(a.cpuset) - set(other.cpuset))
    granted = (a.cpuset[0], free_cores[0])
    spare = next(u for u in ("GPU-n1-00", "GPU-n1-01") if u not in a.gpu_uuids)
    got = ledger.adopt(a.id, cpuset=granted, gpus=[spare])
    assert got.id == a.id and got.cpuset == tuple(sorted(granted)) and got.gpu_uuids == [spare]
    assert ledger.get(a.id) == got
    # what it held before is free again: another user gets that GPU
    assert ledger.reserve(Bundle(cores=0, gpus=1), Owner("c")).gpu_uuids == a.gpu_uuids
    with pytest.raises(PlacementError, match="held"):  # b's core
        ledger.adopt(a.id, cpuset=(other.cpuset[0], got.cpuset[0]))
    with pytest.raises(PlacementError, match="3 cores granted"):
        ledger.adopt(a.id, cpuset=(0, 1, 2))
    assert ledger.get(a.id) == got  # refused: nothing changed
    with pytest.raises(UnknownAllocation):
        ledger.adopt("nope", cpuset=())


def test_adopt_moves_the_memory_with_cores_on_another_numa_node():
    """Slurm granted a GPU and its bound core on the other NUMA node: the memory booking
    follows, and the planned NUMA node is whole again."""
    ledger = Ledger([make_node(gpus=2, numa=2, cores=4, memory_gib=8)])
    a = ledger.reserve(Bundle(cores=1, memory_bytes=GiB, gpus=1), Owner("a"))
    numa = a.mems[0]
    st_free = {n["id"]: n["memory_free_bytes"] for n in ledger.snapshot()[0]["numa_nodes"]}
    other_core = next(c for c in range(4) if (c >= 2) != (a.cpuset[0] >= 2))
    other_gpu = next(u for u in ("GPU-n1-00", "GPU-n1-01") if u not in a.gpu_uuids)
    got = ledger.adopt(a.id, cpuset=[other_core], gpus=[other_gpu])
    assert got.mems == (1 - numa,) and got.memory_by_numa == ((1 - numa, GiB),)
    after = {n["id"]: n["memory_free_bytes"] for n in ledger.snapshot()[0]["numa_nodes"]}
    assert after[numa] == st_free[numa] + GiB and after[1 - numa] == st_free[1 - numa] - GiB
    ledger.release(a.id)
    assert ledger.snapshot() == Ledger([make_node(gpus=2, numa=2, cores=4,
                                                  memory_gib=8)]).snapshot()
