"""Submitting through slurmrestd (``c.SlurmBackend.submit_via = "rest"``).

Pure: sbatch options -> v0.0.38 job properties (what pins the node, what is refused), the
``--time`` conversion, the settings check, and the client against a loopback stand-in of
slurmrestd (headers, a 401 renews the token once, Slurm's errors become SlurmError).

Against the private cluster of scripts/slurm.sh (marker ``slurm``; slurmrestd on
127.0.0.1:17004 with JWT): a 1-GPU server submitted through slurmrestd, with sbatch made to
fail, runs as gpsuser1 on node1 holding the allocated GPU's IDX and core, answers, and is
cancelled by stop; a CPU-only server is pinned to node2 by its node feature; model mode
without a node constraint is refused before anything is submitted.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from gpuspawner.backends.base import LaunchRefused
from gpuspawner.backends.slurm.backend import SlurmBackend, SlurmConfigError
from gpuspawner.backends.slurm.commands import SlurmClient, SlurmError
from gpuspawner.backends.slurm.gres import gres_type
from gpuspawner.backends.slurm.job import ADMIN_MARKER, gpu_positions, plan_job
from gpuspawner.backends.slurm.rest import SlurmRestClient, job_properties, minutes
from gpuspawner.placement import Bundle, Ledger, Owner
from tests.test_slurm_backend import (  # noqa: F401 (fixtures)
    JOB_USER,
    MiB,
    _try_get,
    client,
    make_backend,
    run,
    server_spec,
    slurm_conf,
    topology_nodes,
    workdir,
)
from tests.waiting import wait_until

REST_URL = "http://127.0.0.1:17004"
ENV = {"PATH": "/usr/bin:/bin", "SLURM_CONF": "/x/slurm.conf"}


def _spec(gpus: int, node: str, mode: str = "exact") -> tuple[Any, Any]:
    nodes = topology_nodes()
    ledger = Ledger([rt.node for rt in nodes.values()])
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=256 * MiB, gpus=gpus),
                           Owner(JOB_USER), nodes=[node])
    spec = server_spec(alloc, Path("/tmp"), "gps-rest-unit")
    return spec, nodes[node].node


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize("text,want", [("90", 90), ("1:30", 2), ("8:00:00", 480),
                                       ("1-0", 1440), ("1-2:30", 1590), ("0:0:1", 1),
                                       ("2-00:00:30", 2881)])
def test_minutes_follows_sbatch_time_forms(text: str, want: int) -> None:
    assert minutes(text) == want


def test_minutes_refuses_other_text() -> None:
    with pytest.raises(ValueError, match="not an sbatch --time"):
        minutes("8h")


def test_exact_gpu_job_is_pinned_by_its_per_device_gres() -> None:
    spec, node = _spec(1, "node1")
    plan = plan_job(spec, node, time_limit="1:00:00", extra=["--account=jhub"])
    job = job_properties(plan.options, ENV, node="node1")
    (uuid_,) = spec.allocation.gpu_uuids
    assert job["gres"] == f"gpu:{gres_type(uuid_)}:1"
    assert job["gres_flags"] == "enforce-binding"
    assert (job["hold"], job["requeue"], job["nodes"], job["tasks"]) == (True, False, [1, 1], 1)
    assert (job["cpus_per_task"], job["memory_per_node"], job["time_limit"]) == (1, 256, 60)
    assert job["environment"] == ENV and job["account"] == "jhub"
    assert job["comment"].startswith("gpuspawner-submitted:")
    assert "constraints" not in job
    json.dumps(job)


def test_cpu_only_job_needs_a_node_constraint() -> None:
    spec, node = _spec(0, "node2")
    plan = plan_job(spec, node)
    with pytest.raises(ValueError, match="cannot name node node2.*rest_node_constraint"):
        job_properties(plan.options, ENV, node="node2")
    assert job_properties(plan.options, ENV, node="node2",
                          node_constraint="node2")["constraints"] == "node2"


def test_model_mode_gres_does_not_pin_the_node() -> None:
    spec, node = _spec(1, "node1")
    plan = plan_job(spec, node, mode="model")
    with pytest.raises(ValueError, match="cannot name node node1"):
        job_properties(plan.options, ENV, node="node1")


def test_an_option_without_a_property_is_refused() -> None:
    spec, node = _spec(1, "node1")
    plan = plan_job(spec, node, extra=["--exclude-me=1"])
    with pytest.raises(ValueError, match="--exclude-me=1.*no job property"):
        job_properties(plan.options, ENV, node="node1")


def test_check_config_wants_a_url_and_passable_options(tmp_path: Path) -> None:
    with pytest.raises(SlurmConfigError, match="SlurmBackend.rest_url"):
        SlurmBackend(submit_via="rest", python="/usr/bin/python3").check_config()
    b = SlurmBackend(submit_via="rest", rest_url=REST_URL, python="/usr/bin/python3",
                     extra_sbatch_options=["--qos=x", "--constraint=fast"])
    with pytest.raises(SlurmConfigError, match="'--constraint=fast' has no slurmrestd"):
        b.check_config()
    with pytest.raises(SlurmConfigError, match="rest_node_constraint"):
        SlurmBackend(submit_via="rest", rest_url=REST_URL, python="/usr/bin/python3",
                     rest_node_constraint="{nodename}").check_config()


class _FakeRest:
    """slurmrestd's job/submit on a loopback port: the first request gets 401, later ones
    the answer set in ``reply``; every request's headers and body are kept."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.reply: tuple[int, dict[str, Any]] = (200, {"job_id": 42, "errors": [
            {"error_code": 2042, "error": "Job is in held state, pending scheduler release"}]})
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)  # tornado accepts in a loop until EAGAIN
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        fake = self

        class Submit(RequestHandler):
            def post(self) -> None:
                fake.seen.append((dict(self.request.headers), json.loads(self.request.body)))
                code, body = (401, {}) if len(fake.seen) == 1 else fake.reply
                self.set_status(code)
                self.finish(body)

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            server = HTTPServer(Application([(r"/slurm/v0.0.38/job/submit", Submit)]))
            server.add_sockets([sock])
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def fake_rest() -> Iterator[_FakeRest]:
    f = _FakeRest()
    yield f
    f.close()


def test_client_sends_the_user_and_renews_the_token_after_401(fake_rest: _FakeRest) -> None:
    asked: list[bool] = []

    async def token(renew: bool) -> str:
        asked.append(renew)
        return "new" if renew else "old"

    c = SlurmRestClient(fake_rest.url, token, timeout=5)
    assert run(c.submit("#!/bin/bash\n", {"name": "x"}, "gpsuser1")) == 42
    assert asked == [False, True]
    (h1, _), (h2, body) = fake_rest.seen
    assert (h1["X-Slurm-User-Token"], h2["X-Slurm-User-Token"]) == ("old", "new")
    assert h2["X-Slurm-User-Name"] == "gpsuser1"
    assert body == {"script": "#!/bin/bash\n", "job": {"name": "x"}}


def test_client_turns_slurm_errors_into_slurm_error(fake_rest: _FakeRest) -> None:
    fake_rest.reply = (500, {"errors": [{"error_code": 2014,
                                         "error": "Requested node configuration is not "
                                                  "available"}]})

    async def token(renew: bool) -> str:
        return "t"

    c = SlurmRestClient(fake_rest.url, token, timeout=5)
    with pytest.raises(SlurmError, match="Requested node configuration") as e:
        run(c.submit("#!/bin/bash\n", {}, "gpsuser1"))
    assert e.value.returncode == 500


def test_unreachable_slurmrestd_counts_as_controller_down() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def token(renew: bool) -> str:
        return "t"

    with pytest.raises(SlurmError) as e:
        run(SlurmRestClient(f"http://127.0.0.1:{port}", token, timeout=5).submit("", {}, "u"))
    assert e.value.returncode is None


# --------------------------------------------------------------------------- the cluster


def _no_sbatch(backend: SlurmBackend) -> None:
    """Make the CLI submit fail, so a launch that works went through slurmrestd."""

    async def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("sbatch was used")

    backend.client.sbatch = refuse  # type: ignore[method-assign]


@pytest.mark.slurm
def test_gpu_server_submitted_through_slurmrestd_runs_on_its_gpu(
        slurm_conf: str, workdir: Path, client: SlurmClient) -> None:  # noqa: F811
    backend = make_backend(slurm_conf, workdir, submit_via="rest", rest_url=REST_URL)
    backend.check_config()
    _no_sbatch(backend)
    nodes = topology_nodes()
    ledger = Ledger([rt.node for rt in nodes.values()])
    bundle = Bundle(cores=1, memory_bytes=256 * MiB, gpus=1)
    ledger.reserve(bundle, Owner("filler"), nodes=["node1"])  # the server gets the 2nd GPU
    alloc = ledger.reserve(bundle, Owner(JOB_USER), nodes=["node1"])
    spec = server_spec(alloc, workdir, f"gps-rest-{uuid.uuid4().hex[:6]}")
    state: dict[str, Any] = {}
    try:
        ip, port = run(backend.launch(spec, state, lambda p, m: None))
        job = run(client.show_job(int(state["job_id"])))
        assert job is not None and job.state == "RUNNING"
        assert (job.user, job.name, job.node_list) == (JOB_USER, spec.name, ("node1",))
        (uuid_,) = alloc.gpu_uuids
        idx = gpu_positions(nodes["node1"].node)[uuid_]
        assert idx == 1
        assert job.gres_indices("node1") == {gres_type(uuid_): (idx,)}
        assert job.node_detail("node1").cpu_ids == alloc.cpuset
        assert job.node_detail("node1").memory_mb == 256
        assert job.fields["AdminComment"] == ADMIN_MARKER + alloc.to_json()
        seen = wait_until(lambda: _try_get(ip, port), timeout=20, interval=0.2,
                          message=f"server at {ip}:{port}")
        assert seen["cpus"] == list(alloc.cpuset)
        assert seen["env"]["JUPYTERHUB_SERVICE_URL"].startswith(f"http://127.0.0.1:{port}/")
        assert run(backend.poll(state)) is None
        run(backend.stop(state))
        assert int(state["job_id"]) not in run(client.squeue([int(state["job_id"])]))
    finally:
        run(backend.cleanup(alloc, state))


@pytest.mark.slurm
def test_cpu_only_server_is_pinned_by_its_node_feature(
        slurm_conf: str, workdir: Path, client: SlurmClient) -> None:  # noqa: F811
    backend = make_backend(slurm_conf, workdir, submit_via="rest", rest_url=REST_URL,
                           rest_node_constraint="{node}")
    _no_sbatch(backend)
    ledger = Ledger([rt.node for rt in topology_nodes().values()])
    alloc = ledger.reserve(Bundle(cores=1, memory_bytes=128 * MiB, gpus=0), Owner(JOB_USER),
                           nodes=["node2"])
    spec = server_spec(alloc, workdir, f"gps-rest-{uuid.uuid4().hex[:6]}")
    state: dict[str, Any] = {}
    try:
        run(backend.launch(spec, state, lambda p, m: None))
        job = run(client.show_job(int(state["job_id"])))
        assert job is not None and job.node_list == ("node2",)
        assert job.fields.get("Features") == "node2"
        assert job.gres_indices("node2") == {}
    finally:
        run(backend.cleanup(alloc, state))


@pytest.mark.slurm
def test_model_mode_without_a_node_constraint_is_refused_before_submit(
        slurm_conf: str, workdir: Path) -> None:  # noqa: F811
    backend = make_backend(slurm_conf, workdir, submit_via="rest", rest_url=REST_URL,
                           gpu_mode="model")
    _no_sbatch(backend)
    spec, _ = _spec(1, "node1")
    state: dict[str, Any] = {}
    with pytest.raises(LaunchRefused, match="cannot name node node1"):
        run(backend.launch(spec, state, lambda p, m: None))
    assert "job_id" not in state
