"""gpuspawner.singleuser.gpuviews in a real jupyter_server (pytest-jupyter's ``jp_fetch``),
against the
NVML double (values, states, MIG, permission) and against real NVML (``gpu``-marked).

pytest-jupyter's fixtures are imported into this module only (not registered as a plugin) so
its autouse event-loop fixture does not reach the rest of the suite; the tests are plain
functions that drive the server's loop with ``run_until_complete``.
"""

from __future__ import annotations

import json
import time

import pytest
import tornado.httpclient
from pytest_jupyter.jupyter_core import *  # noqa: F403 - fixtures
from pytest_jupyter.jupyter_server import *  # noqa: F403 - fixtures
from pytest_jupyter.pytest_tornasync import http_server, http_server_client  # noqa: F401

from tests.test_gpuviews_nvml import MIG0, UUID0, UUID1

GiB = 1024**3


@pytest.fixture
def nvml_factory() -> str:
    return "tests.test_gpuviews_nvml:metrics_double"


@pytest.fixture
def jp_server_config(nvml_factory):  # noqa: F811 - overrides pytest-jupyter's
    return {"ServerApp": {"jpserver_extensions": {"gpuspawner.singleuser.gpuviews": True},
                          "allow_unauthenticated_access": False},
            "GPUViews": {"nvml": nvml_factory, "interval": 0.2, "standby_after": 5,
                         "culler_url": ""}}


@pytest.fixture
def get(jp_fetch, jp_asyncio_loop, jp_serverapp):  # noqa: F811
    def fetch(path: str, **kw):
        async def fetched():  # jp_fetch needs the running loop when called, not only awaited
            return await jp_fetch("api", "gpuspawner", path, **kw)

        resp = jp_asyncio_loop.run_until_complete(fetched())
        assert resp.code == 200
        return json.loads(resp.body)
    yield fetch
    # jupyter_server has no unload hook for function-based extensions: stop the thread here
    jp_serverapp.web_app.settings["gpuspawner_sampler"].stop()


def test_gpus_and_metrics_values(get):
    doc = get("gpus")
    assert doc["state"] == "ok", doc
    assert [g["uuid"] for g in doc["gpus"]] == [UUID0, UUID1]
    g0 = doc["gpus"][0]
    assert g0 == {"uuid": UUID0, "index": 0, "name": "NVIDIA A100-SXM4-80GB",
                  "memory_total_bytes": 80 * GiB, "pci_bus_id": "00000000:07:00.0",
                  "numa_node": 0, "mig": False, "in_allocation": False}
    assert doc["culler"] is None and doc["allocation"] is None
    m = get("metrics")
    assert m["state"] == "ok" and isinstance(m["timestamp"], float)
    by = {g["uuid"]: g for g in m["gpus"]}
    assert by[UUID0]["utilization_percent"] == 37.0
    assert by[UUID1]["memory_used_bytes"] == 20 * GiB
    assert by[UUID1]["temperature_c"] == 63.0 and by[UUID1]["power_w"] == 250.5
    assert by[UUID0]["processes"] == [{"pid": 4242, "used_memory_bytes": 3 * GiB,
                                       "kernel_id": None}]
    assert m["history"] and set(m["history"][-1]["gpus"]) == {UUID0, UUID1}
    time.sleep(0.5)
    assert len(get("metrics")["history"]) > 1


@pytest.mark.parametrize(("nvml_factory", "state"), [
    ("tests.test_gpuviews_nvml:no_nvml_double", "no_nvml"),
    ("tests.test_gpuviews_nvml:no_gpu_double", "no_gpu"),
    ("tests.test_gpuviews_nvml:permission_double", "permission"),
    ("tests.test_gpuviews_nvml:device_permission_double", "permission"),
    ("tests.test_gpuviews_nvml:error_double", "error")])
def test_states(get, state):
    doc = get("gpus")
    assert doc["state"] == state and doc["gpus"] == [] and doc["message"]
    m = get("metrics")
    assert m["state"] == state and m["gpus"] == []


@pytest.mark.parametrize("nvml_factory", ["tests.test_gpuviews_nvml:mig_double"])
def test_mig(get):
    doc = get("gpus")
    assert doc["state"] == "ok" and [g["mig"] for g in doc["gpus"]] == [True, True]
    assert doc["gpus"][0]["uuid"] == MIG0
    m = get("metrics")
    assert all(g["utilization_percent"] is None for g in m["gpus"])
    assert m["gpus"][0]["memory_used_bytes"] == GiB


def test_allocation_mismatch_warns(jp_serverapp, get):
    sampler = jp_serverapp.web_app.settings["gpuspawner_sampler"]
    sampler.allocation = {"id": "a1", "node": "n1", "gpus": [{"uuid": UUID0, "milli": 1000},
                                                            {"uuid": "GPU-gone", "milli": 1000}]}
    doc = get("gpus")
    assert doc["allocation"]["id"] == "a1"
    assert [g["in_allocation"] for g in doc["gpus"]] == [True, False]
    assert any("GPU-gone" in w for w in doc["warnings"])
    assert any(UUID1 in w for w in doc["warnings"])


def test_moved_from_the_environment(get, monkeypatch):
    # no move: null; the spawner's GPUSPAWNER_MOVED: the record; a malformed one: null
    assert get("gpus")["moved"] is None
    monkeypatch.setenv("GPUSPAWNER_MOVED", json.dumps(
        {"from": "n1", "to": "n2", "at": 1764000000.5, "reason": "node n1 is down"}))
    assert get("gpus")["moved"] == {"from": "n1", "to": "n2", "at": 1764000000.5,
                                    "reason": "node n1 is down"}
    monkeypatch.setenv("GPUSPAWNER_MOVED", '{"from": "n1"}')
    assert get("gpus")["moved"] is None


def test_unauthenticated_refused(jp_fetch, jp_asyncio_loop):  # noqa: F811
    async def fetched():
        return await jp_fetch("api", "gpuspawner", "metrics", headers={"Authorization": ""})

    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        jp_asyncio_loop.run_until_complete(fetched())
    assert e.value.code in (401, 403)


def test_kernel_pids_mapped(jp_serverapp, get, jp_asyncio_loop):  # noqa: F811
    """A process NVML reports that is a kernel's own process gets that kernel's id."""
    km = jp_serverapp.kernel_manager
    kid = jp_asyncio_loop.run_until_complete(km.start_kernel())
    try:
        pid = km.get_kernel(kid).provisioner.pid
        sampler = jp_serverapp.web_app.settings["gpuspawner_sampler"]
        sampler._nvml.procs = {0: [(pid, GiB)], 1: [(1, None)]}
        deadline = time.time() + 5
        while time.time() < deadline:
            by = {g["uuid"]: g for g in get("metrics")["gpus"]}
            if by[UUID0]["processes"] and by[UUID0]["processes"][0]["pid"] == pid:
                break
            time.sleep(0.2)
        assert by[UUID0]["processes"] == [{"pid": pid, "used_memory_bytes": GiB,
                                           "kernel_id": kid}]
        assert by[UUID1]["processes"] == [{"pid": 1, "used_memory_bytes": None,
                                           "kernel_id": None}]
    finally:
        jp_asyncio_loop.run_until_complete(km.shutdown_kernel(kid, now=True))


def test_culler_status_from_service(jp_serverapp, get, jp_asyncio_loop):  # noqa: F811
    """The culler's api/status, asked with the server's token; a dead URL gives null."""
    from tornado import web

    from gpuspawner.singleuser.gpuviews.handlers import CullerStatus

    seen = {}

    class Status(web.RequestHandler):
        def get(self):
            seen["auth"] = self.request.headers.get("Authorization")
            self.write({"servers": [{"user": "alice", "server": "", "decision": "keep"},
                                    {"user": "bob", "server": ""}], "last_pass": 12.5})

    app = web.Application([(r"/services/idle-culler/api/status", Status)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    try:
        env = {"JUPYTERHUB_API_TOKEN": "tok", "JUPYTERHUB_USER": "alice",
               "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/",
               "JUPYTERHUB_API_URL": f"http://127.0.0.1:{port}/hub/api"}
        jp_serverapp.web_app.settings["gpuspawner_culler"] = CullerStatus(env=env)
        doc = get("gpus")
        assert doc["culler"] == {"server": {"user": "alice", "server": "",
                                            "decision": "keep"}, "last_pass": 12.5}
        assert seen["auth"] == "token tok"
        env["JUPYTERHUB_API_URL"] = "http://127.0.0.1:9/hub/api"
        jp_serverapp.web_app.settings["gpuspawner_culler"] = CullerStatus(env=env)
        assert get("gpus")["culler"] is None
    finally:
        server.stop()


@pytest.mark.gpu
@pytest.mark.parametrize("nvml_factory", [""])
def test_real_nvml(get):
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"nvmlInit() failed: {e}")
    n = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    doc = get("gpus")
    assert doc["state"] == ("ok" if n else "no_gpu"), doc
    m = get("metrics")
    for g in m["gpus"]:
        assert g["memory_total_bytes"] > 0 and g["memory_used_bytes"] >= 0
        assert all(isinstance(p["pid"], int) for p in g["processes"])


def test_share_notices_from_the_gpuspawner_service(jp_serverapp, get):  # noqa: F811
    """The hub's watchdog notices of this server (the gpuspawner service's
    api/users/<user>/usage, asked with the server's token) join the panel's warnings; another
    server's notice and a dead URL give none."""
    from tornado import web

    from gpuspawner.singleuser.gpuviews.handlers import ShareNotices

    seen = {}
    mine = "Your kernels use 31.0 GiB of GPU memory, over your share of 20.0 GiB: ..."

    class Usage(web.RequestHandler):
        def get(self, user):
            seen["auth"], seen["user"] = self.request.headers.get("Authorization"), user
            self.write({"user": user, "gpu_share_notices": [
                {"server": "", "message": mine}, {"server": "other", "message": "not mine"}]})

    app = web.Application([(r"/services/gpuspawner/api/users/([^/]+)/usage", Usage)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    try:
        env = {"JUPYTERHUB_API_TOKEN": "tok", "JUPYTERHUB_USER": "alice",
               "GPUSPAWNER_SERVICE_URL": f"http://127.0.0.1:{port}/services/gpuspawner/"}
        jp_serverapp.web_app.settings["gpuspawner_share_notices"] = ShareNotices(env=env)
        warnings = get("gpus")["warnings"]
        assert mine in warnings and "not mine" not in warnings
        assert seen == {"auth": "token tok", "user": "alice"}
        env["GPUSPAWNER_SERVICE_URL"] = "http://127.0.0.1:9/services/gpuspawner/"
        jp_serverapp.web_app.settings["gpuspawner_share_notices"] = ShareNotices(env=env)
        assert mine not in get("gpus")["warnings"]
    finally:
        server.stop()


def test_own_usage_and_budgets_from_the_gpuspawner_service(jp_serverapp, get):  # noqa: F811
    """The user's GPU-hours and core-hours this month (api/usage?group_by=user, own rows) and
    budgets (api/usage/budgets), asked with the server's token, reach the panel's document;
    no service gives null."""
    from tornado import web

    from gpuspawner.singleuser.gpuviews.handlers import OwnUsage

    seen: list[tuple[str, str | None]] = []

    class Report(web.RequestHandler):
        def get(self):
            seen.append((self.request.uri, self.request.headers.get("Authorization")))
            self.write({"from": "2026-11-01T00:00:00+00:00", "group_by": ["user"],
                        "rows": [], "totals": {"gpu_hours": 12.5, "core_hours": 40.0}})

    class Budgets(web.RequestHandler):
        def get(self):
            seen.append((self.request.uri, self.request.headers.get("Authorization")))
            self.write({"user": "alice", "budgets": [
                {"name": "default", "unit": "gpu_hours", "used": 12.5, "limit": 15.0,
                 "percent": 83.3, "renews_at": "2026-12-01T00:00:00+00:00",
                 "warning": True, "exceeded": False, "kind": "default"}]})

    app = web.Application([(r"/services/gpuspawner/api/usage", Report),
                           (r"/services/gpuspawner/api/usage/budgets", Budgets)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    try:
        env = {"JUPYTERHUB_API_TOKEN": "tok",
               "GPUSPAWNER_SERVICE_URL": f"http://127.0.0.1:{port}/services/gpuspawner/"}
        jp_serverapp.web_app.settings["gpuspawner_own_usage"] = OwnUsage(env=env)
        usage = get("gpus")["usage"]
        assert usage == {"from": "2026-11-01T00:00:00+00:00", "gpu_hours": 12.5,
                         "core_hours": 40.0, "budgets": [
                             {"name": "default", "unit": "gpu_hours", "used": 12.5,
                              "limit": 15.0, "percent": 83.3,
                              "renews_at": "2026-12-01T00:00:00+00:00", "warning": True,
                              "exceeded": False}]}
        assert seen == [("/services/gpuspawner/api/usage?group_by=user", "token tok"),
                        ("/services/gpuspawner/api/usage/budgets", "token tok")]
        env["GPUSPAWNER_SERVICE_URL"] = "http://127.0.0.1:9/services/gpuspawner/"
        jp_serverapp.web_app.settings["gpuspawner_own_usage"] = OwnUsage(env=env)
        assert get("gpus")["usage"] is None
    finally:
        server.stop()
