"""The server state GPUSpawner stores and the culler reads (gpuspawner/server_state.py): the
spawner writes and reads it through ``ServerState``; the culler's GPU and network readers
read the same shape (issue 24, item 3). No engine, no hub: the network reader gets a stand-in
docker client; the real-container test is tests/test_culler_network_hub.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuspawner.placement import Allocation, GPUShare, Owner
from gpuspawner.server_state import DOCKER, SLURM, ServerState
from idle_culler.core import gpu_uuids
from idle_culler.netstats import NetworkMeter, docker_reader

GPU_A = "GPU-0a0a0a0a-0000-1111-2222-333333333333"
GPU_B = "GPU-0b0b0b0b-0000-1111-2222-333333333333"
ALLOC = Allocation("a1b2", Owner("cn-ss", "", ("students",)), "node-1",
                   (GPUShare(GPU_A), GPUShare(GPU_B, 250)), (0, 1), (0,), 1 << 30, 0,
                   ((0, 1 << 30),))
#: what DockerBackend.prepare + launch leave (per-server network)
DOCKER_BACKEND = {"node": "node-1", "container_id": "c0ffee" * 10 + "abcd",
                  "ip": "198.18.4.2",
                  "network": {"name": "gpuspawner-cn-ss-a1b2", "subnet": "198.18.4.0/29"}}
#: what SlurmBackend.launch leaves
SLURM_BACKEND = {"node": "node-1", "output": "/tmp/x", "submitted": 1.0, "started": True,
                 "job_id": 4242, "picked": {"node": "node-1", "cpu_ids": [0, 1],
                                            "gpu_uuids": [GPU_A]}, "port": 41000}


def stored(backend: dict[str, Any]) -> dict[str, Any]:
    return ServerState(ALLOC.to_dict(), backend, "/srv/certs/x").to_state()


def test_the_view_of_a_docker_server() -> None:
    v = ServerState.from_state(stored(DOCKER_BACKEND))
    assert (v.backend_kind, v.node, v.container_id, v.ip, v.network_name) == (
        DOCKER, "node-1", DOCKER_BACKEND["container_id"], "198.18.4.2",
        "gpuspawner-cn-ss-a1b2")
    assert v.gpu_uuids == [GPU_A, GPU_B] and v.allocation_id == "a1b2"
    assert v.slurm_job_id == "" and v.certs_dir == "/srv/certs/x"
    assert Allocation.from_dict(v.allocation) == ALLOC  # the allocation survives unchanged


def test_the_view_of_a_slurm_server() -> None:
    v = ServerState.from_state(stored(SLURM_BACKEND))
    assert (v.backend_kind, v.node, v.slurm_job_id, v.container_id, v.ip) == (
        SLURM, "node-1", "4242", "", "")


@pytest.mark.parametrize("state", [
    None, {}, {"object_id": "abc", "object_name": "jupyter-x"},  # DockerSpawner's
    {"allocation": "not a dict", "backend": ["x"], "certs_dir": 3},
    {"allocation": {"gpus": [{"uuid": 7}, "GPU-x", {"milli": 1000}, {"uuid": ""}]}},
])
def test_foreign_or_malformed_states_read_as_empty(state: Any) -> None:
    v = ServerState.from_state(state)
    assert (v.backend_kind, v.node, v.container_id, v.gpu_uuids, v.slurm_job_id) == (
        "", "", "", [], "")
    assert set(v.to_state()) <= {"allocation"}  # (a foreign allocation dict is kept as is)


def test_to_state_stores_only_what_exists_and_round_trips() -> None:
    assert ServerState().to_state() == {}
    assert ServerState(backend={"node": "n"}).to_state() == {"backend": {"node": "n"}}
    full = stored(DOCKER_BACKEND)
    assert set(full) == {"allocation", "backend", "certs_dir"}
    assert ServerState.from_state(full).to_state() == full


class _User:
    name, escaped_name, groups, url, base_url, settings = "cn-ss", "cn-ss", [], "/", "/", {}


def test_gpuspawner_writes_and_reads_the_state_through_the_view() -> None:
    from jupyterhub.objects import Hub

    from gpuspawner.hub.spawner import GPUSpawner

    sp = GPUSpawner(user=_User(), hub=Hub(), oauth_client_id="c", api_token="t")
    sp.allocation, sp.backend_state, sp.certs_dir = ALLOC, dict(DOCKER_BACKEND), "/srv/c"
    state = sp.get_state()
    v = ServerState.from_state(state)
    assert v.container_id == DOCKER_BACKEND["container_id"] and v.gpu_uuids == [GPU_A, GPU_B]
    again = GPUSpawner(user=_User(), hub=Hub(), oauth_client_id="c", api_token="t")
    again.load_state(state)
    assert (again.allocation, again.backend_state, again.certs_dir) == (
        ALLOC, DOCKER_BACKEND, "/srv/c")
    sp.clear_state()
    sp.allocation = None
    assert ServerState.from_state(sp.get_state()) == ServerState()


def test_the_culler_reads_gpus_through_the_view() -> None:
    assert gpu_uuids({"state": stored(DOCKER_BACKEND)}) == [GPU_A, GPU_B]
    assert gpu_uuids({"state": stored(SLURM_BACKEND)}) == [GPU_A, GPU_B]
    assert gpu_uuids({}) == [] and gpu_uuids({"state": None}) == []


class _API:
    api_version = "1.41"

    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls
        self.rx = 1000

    def stats(self, cid: str, stream: bool = True, one_shot: bool | None = None) -> dict:
        self.calls.append((cid, one_shot))
        self.rx += 5000
        return {"networks": {"eth0": {"rx_bytes": self.rx, "tx_bytes": 500}}}


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Stand-in docker clients, by URL ("" = from_env); what each was asked."""
    import docker

    made: dict[str, Any] = {"calls": []}

    def client(url: str) -> Any:
        c = type("Client", (), {})()
        c.api = made.setdefault(url, _API(made["calls"]))
        return c

    monkeypatch.setattr(docker, "from_env", lambda **kw: client(""))
    monkeypatch.setattr(docker, "DockerClient", lambda base_url, **kw: client(base_url))
    return made


def test_the_network_reader_finds_gpuspawners_container_on_its_node(engines) -> None:
    read = docker_reader({"node-1": "tcp://node-1:2376", "local": ""})
    assert read("cn-ss/", stored(DOCKER_BACKEND)) == 6000 + 500
    assert engines["calls"] == [(DOCKER_BACKEND["container_id"], True)]  # one-shot stats
    assert "tcp://node-1:2376" in engines and "" not in engines
    meter = NetworkMeter(read)
    assert meter.observe("cn-ss/", stored(DOCKER_BACKEND), 100.0) is None  # first reading
    assert meter.observe("cn-ss/", stored(DOCKER_BACKEND), 101.0) == 5000.0  # bytes/s


def test_the_network_reader_has_no_signal_for_a_slurm_job(engines) -> None:
    """A job shares its node's network namespace: no per-server counter, and no engine is
    asked, even where the node has one listed."""
    read = docker_reader({"node-1": ""})
    assert read("cn-ss/", stored(SLURM_BACKEND)) is None
    assert NetworkMeter(read).observe("cn-ss/", stored(SLURM_BACKEND), 1.0) is None
    assert engines["calls"] == [] and "" not in engines


def test_the_network_reader_without_a_container_or_a_listed_node(engines) -> None:
    read = docker_reader({"node-1": ""})
    prepared = {k: v for k, v in DOCKER_BACKEND.items() if k != "container_id"}
    assert read("k", stored(prepared)) is None  # network made, container not yet
    assert read("k", stored({**DOCKER_BACKEND, "node": "node-2"})) is None  # not listed
    assert read("k", {"object_id": "abc"}) is None  # DockerSpawner's, node "" not listed
    assert engines["calls"] == []
    assert docker_reader({"": ""})("k", {"object_id": "abc"}) == 6500  # ... listed


def test_the_meter_reads_a_batch_of_servers_at_once() -> None:
    """An engine answers a stats call at its next sampling tick (up to 1 s): the culler reads
    a batch concurrently, then observes each server from that reading. Five readers that
    each wait for the other four only pass together."""
    import asyncio
    import threading

    barrier = threading.Barrier(5, timeout=10)
    reads: list[str] = []

    def reader(key: str, state: dict[str, Any]) -> int:
        barrier.wait()
        reads.append(key)
        return 1000 * int(key[-1])

    meter = NetworkMeter(reader, concurrency=5)
    keys = [f"u{i}/" + str(i) for i in range(1, 6)]
    asyncio.run(meter.prefetch([(k, {}) for k in keys]))
    assert sorted(reads) == sorted(keys)
    assert [meter.observe(k, {}, 1.0) for k in keys] == [None] * 5  # first readings, no rate
    assert len(reads) == 5  # observe used the batch's readings, not the reader again


def test_engines_over_tcp_are_reached_with_the_hubs_tls_files(tmp_path, monkeypatch) -> None:
    import docker

    from idle_culler.netstats import engine_client

    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("")
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(docker, "DockerClient", lambda **kw: made.append(kw) or kw)
    engine_client("tcp://node-2:2376", str(tmp_path))
    engine_client("unix:///run/other.sock", str(tmp_path))
    engine_client("tcp://node-3:2376")
    tls = made[0]["tls"]
    assert tls.verify is True and tls.ca_cert == str(tmp_path / "ca.pem")
    assert tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert made[1]["tls"] is False and made[2]["tls"] is False
