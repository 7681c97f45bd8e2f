"""The Slurm backend's model mode against the private cluster (issue 14: "two GPU modes, both
tested"): node3 types its GPUs by model (``FAKE``, from ``gpuspawner slurm-gres
--model-topology``), a job asks for ``gpu:FAKE:1`` and Slurm picks the device. Here another
job already holds the GPU the ledger planned, so Slurm grants the other GPU with its bound
core: the ledger adopts what Slurm granted (GPU, core, and the memory moves to that core's
NUMA node), the job's AdminComment carries the adopted allocation, and the server answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuspawner.backends.base import NodeRuntime
from gpuspawner.backends.slurm.commands import SlurmClient
from gpuspawner.backends.slurm.job import ADMIN_MARKER, gpu_positions
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Allocation, Bundle, Ledger, Owner
from tests.test_slurm_backend import (  # noqa: F401 (fixtures)
    REPO,
    _try_get,
    make_backend,
    server_spec,
    slurm_conf,
    workdir,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
MiB = 2**20


def test_model_mode_adopts_the_gpu_slurm_picked(slurm_conf: str, workdir: Path) -> None:  # noqa: F811
    node3 = load_topology_file(REPO / "hub_config" / "slurm" / "node3.yaml")
    backend = make_backend(slurm_conf, workdir, gpu_mode="model")
    backend.bind({"node3": NodeRuntime("node3", "127.0.0.1", "test", node3)})
    backend.check_config()  # node3 is known to Slurm, its GPUs typed by model
    ledger = Ledger([node3])
    backend.ledger = ledger
    client = SlurmClient(conf=slurm_conf, timeout=30)
    by_idx = {pos: uuid for uuid, pos in gpu_positions(node3).items()}

    async def scenario() -> None:
        foreign = await client.sbatch(
            "#!/bin/sh\nexec sleep 120\n",
            ["--nodelist=node3", "--gres=gpu:FAKE:1", "--gres-flags=enforce-binding",
             "--cpus-per-task=1", "--mem=64", "--job-name=gps-foreign", "--output=/dev/null"],
            user="gpsuser2")
        state: dict[str, Any] = {}
        try:
            job = await asyncio.to_thread(
                wait_until, lambda: _running(client, foreign), timeout=30,
                message="the foreign job runs")
            (held,) = job.gres_indices("node3")["FAKE"]
            # the ledger plans the very GPU the foreign job holds (it does not know that job)
            filler = ledger.reserve(Bundle(cores=1, gpus=1), Owner("filler"))
            if filler.gpu_uuids == [by_idx[held]]:
                ledger.release(filler.id)
                planned = ledger.reserve(Bundle(cores=1, memory_bytes=256 * MiB, gpus=1),
                                         Owner("gpsuser1"))
            else:
                planned = ledger.reserve(Bundle(cores=1, memory_bytes=256 * MiB, gpus=1),
                                         Owner("gpsuser1"))
                ledger.release(filler.id)
            assert planned.gpu_uuids == [by_idx[held]]
            spec = server_spec(planned, workdir, "gps-model-test")
            ip, port = await backend.launch(spec, state, lambda p, m: None)
            adopted = ledger.get(planned.id)
            assert adopted is not None and adopted.gpu_uuids == [by_idx[1 - held]]
            assert adopted.cpuset != planned.cpuset and len(adopted.cpuset) == 1
            assert adopted.mems != planned.mems  # the memory followed the core
            info = await client.show_job(int(state["job_id"]))
            assert info is not None and info.gres_indices("node3") == {"FAKE": (1 - held,)}
            marked = info.fields["AdminComment"][len(ADMIN_MARKER):]
            assert Allocation.from_json(marked) == adopted
            # launch returns once the job reported its port, which the job script picks before
            # it execs the server: the server may not listen yet (one urlopen here was refused
            # in CI), so wait for its answer like the other Slurm tests
            seen = await asyncio.to_thread(
                wait_until, lambda: _try_get(ip, port), timeout=20, interval=0.2,
                message=f"server at {ip}:{port}")
            assert seen["cpus"] == list(adopted.cpuset)
            await backend.stop(state)
        finally:
            await backend.cleanup(None, state)
            await client.scancel(foreign)

    asyncio.run(scenario())


def _running(client: SlurmClient, job_id: int) -> Any:
    job = asyncio.run(client.show_job(job_id))
    return job if job is not None and job.state == "RUNNING" and job.gres_indices("node3") \
        else None
