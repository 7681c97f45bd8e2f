"""GPUs that something the hub did not start holds (on Slurm: other users' own jobs) are held
in the ledger with the backend's reason and given back once free
(:meth:`gpuspawner.hub.cluster.Cluster.refresh_held_elsewhere`); the Slurm backend reads them
from ``squeue --json`` (:meth:`~gpuspawner.backends.slurm.node_events.NodeEvents.held_elsewhere`).
The real-cluster replay is ``tests/test_slurm_hub.py::
test_gpus_held_by_jobs_the_hub_did_not_submit_are_not_booked``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuspawner.backends.base import Backend, NodeRuntime
from gpuspawner.backends.slurm.backend import SlurmBackend
from gpuspawner.backends.slurm.commands import parse_jobs_json
from gpuspawner.backends.slurm.gres import gres_type
from gpuspawner.backends.slurm.job import ADMIN_MARKER
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.drains import DrainStore
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from tests.factories import make_node

ONE_GPU = Bundle(cores=1, gpus=1, numa_policy="none")


class HeldBackend(Backend):
    """A backend whose nodes' GPUs in ``held`` are taken by something else."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, str] = {}
        self.fail = False

    async def held_elsewhere(self) -> dict[str, str]:
        if self.fail:
            raise RuntimeError("controller down")
        return dict(self.held)


def cluster(tmp_path: Path) -> tuple[Cluster, HeldBackend, list[str]]:
    node = make_node("n1", gpus=2)
    ledger = Ledger([node], policy="first-fit")
    table = {"n1": NodeRuntime("n1", "127.0.0.1", "x", node)}
    backend = HeldBackend()
    backend.bind(table)
    c = Cluster(table, ledger, backend, drain_store=DrainStore(str(tmp_path / "drains.json")))
    c.load_drains()
    return c, backend, [g.uuid for g in node.gpus]


async def test_held_gpus_are_refused_with_the_reason_and_given_back(tmp_path: Path) -> None:
    c, backend, (a, b) = cluster(tmp_path)
    backend.held = {a: "held by Slurm job 41 of bob (not submitted by the hub)",
                    b: "held by Slurm job 42 of bob (not submitted by the hub)"}
    await c.refresh_held_elsewhere()
    with pytest.raises(PlacementRefused) as e:
        c.ledger.reserve(ONE_GPU, Owner("ann"))
    assert "held by Slurm job 41 of bob" in str(e.value)
    assert "held by Slurm job 42 of bob" in str(e.value)
    assert c.drain_records() == {}  # never in the drains file
    backend.held.pop(b)
    await c.refresh_held_elsewhere()
    assert c.ledger.reserve(ONE_GPU, Owner("ann")).gpu_uuids == [b]
    backend.fail = True  # a backend that cannot answer changes nothing
    await c.refresh_held_elsewhere()
    assert a in c.ledger.drained_gpus()


async def test_an_admins_drain_stays_and_an_undrain_is_taken_back(tmp_path: Path) -> None:
    c, backend, (a, b) = cluster(tmp_path)
    c.drain_gpu(a, "fan noise", by="admin")
    backend.held = {a: "held by Slurm job 7 of bob (not submitted by the hub)",
                    b: "held by Slurm job 8 of bob (not submitted by the hub)"}
    await c.refresh_held_elsewhere()
    assert c.ledger.drained_gpus()[a] == "fan noise"
    c.ledger.undrain_gpu(b)  # (an admin's undrain through the ledger) while job 8 holds it
    await c.refresh_held_elsewhere()
    assert "job 8" in c.ledger.drained_gpus()[b]
    backend.held = {}
    await c.refresh_held_elsewhere()
    assert c.ledger.drained_gpus() == {a: "fan noise"}


def squeue_json(*jobs: dict) -> str:
    return json.dumps({"jobs": [dict({"name": "x", "comment": "", "admin_comment": "",
                                      "user_id": 2002, "user_name": "bob"}, **j)
                                for j in jobs]})


async def test_the_slurm_backend_names_jobs_without_our_admin_comment() -> None:
    node = make_node("node1", gpus=2)
    b = SlurmBackend()
    b.bind({"node1": NodeRuntime("node1", "127.0.0.1", "x", node)})
    first, second = node.gpus
    text = squeue_json(
        {"job_id": 41, "job_state": "RUNNING", "nodes": "node1",
         "gres_detail": [f"gpu:{gres_type(first.uuid)}:1(IDX:0)"]},
        {"job_id": 42, "job_state": "RUNNING", "nodes": "node1",  # ours: its AdminComment
         "admin_comment": ADMIN_MARKER + json.dumps({"id": "x", "node": "node1"}),
         "gres_detail": [f"gpu:{gres_type(second.uuid)}:1(IDX:1)"]},
        {"job_id": 43, "job_state": "PENDING", "nodes": "", "gres_detail": []},
        {"job_id": 44, "job_state": "COMPLETED", "nodes": "node1",
         "gres_detail": [f"gpu:{gres_type(second.uuid)}:1(IDX:1)"]})

    class Client:
        async def jobs(self) -> list:
            return parse_jobs_json(text)

    b._client = Client()  # type: ignore[assignment]
    assert await b.held_elsewhere() == {
        first.uuid: "held by Slurm job 41 of bob (not submitted by the hub)"}


async def test_a_waiting_spawn_starts_once_the_other_job_ends(tmp_path: Path) -> None:
    """One GPU held by another job, the other booked by the hub: a spawn waits in the hub's
    queue; when the job ends, the queue's next tick asks again and places it there (no
    release of the hub's own needed). (With every GPU held elsewhere the queue refuses at
    once, naming the jobs: no node could hold it while they run.)"""
    import asyncio

    from gpuspawner.hub.spawn_queue import QueueSettings

    c, backend, (a, b) = cluster(tmp_path)
    c.make_queue(QueueSettings(tick_s=0.05))
    backend.held = {a: "held by Slurm job 41 of bob (not submitted by the hub)"}
    await c.refresh_held_elsewhere()
    assert c.ledger.reserve(ONE_GPU, Owner("carl")).gpu_uuids == [b]
    c.queue.start()
    waiting = asyncio.ensure_future(c.queue.acquire(Owner("ann"), ONE_GPU, wait=True))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    backend.held = {}
    alloc = await asyncio.wait_for(waiting, 5)
    assert alloc.gpu_uuids == [a]
