"""``POST``/``DELETE api/gpus/{uuid}/drain`` on the service's own Tornado application without a
hub (as tests/test_service_unit.py), with the service's real ``HubOAuth`` asking a stand-in hub
API (``GET /hub/api/user`` answering per token, loopback) who is calling: admins drain and
undrain (kept in the drains file), others get 403, an unknown UUID 404, a body without a string
reason 400; ``api/nodes`` shows the drain to everyone and who drained it to admins only; the
admin map shows it. Every answer is checked against the OpenAPI document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpuspawner.backends.base import Backend
from gpuspawner.hub.cluster import Cluster
from gpuspawner.hub.drains import DrainStore
from gpuspawner.hub.service.app import GPUService
from gpuspawner.hub.service_base import ADMIN_SCOPE
from gpuspawner.inventory.topology import load_topology_file
from gpuspawner.placement import Bundle, Ledger, Owner, PlacementRefused
from tests.test_service_unit import _validate

TOPO = Path(__file__).parent / "data" / "topologies"
ACCESS = "access:services!service=gpuspawner"
#: token -> the hub's model of its owner, with the token's scopes. An admin's own token holds
#: the service's admin scope (the role the service's configure() gives admin_users); an
#: admin's server token holds only what server_token_scopes grants
MODELS = {
    "admin-token": {"kind": "user", "name": "root", "admin": True, "groups": [],
                    "scopes": [ACCESS, ADMIN_SCOPE]},
    "admin-server-token": {"kind": "user", "name": "root", "admin": True, "groups": [],
                           "scopes": [ACCESS]},
    "user-token": {"kind": "user", "name": "ann", "admin": False, "groups": [],
                   "scopes": [ACCESS]},
}


class FakeHubUser(web.RequestHandler):
    """``GET /hub/api/user``: the model of the token's owner (what JupyterHub answers), from
    ``models`` (token -> model; :data:`MODELS` unless the route gives others)."""

    def initialize(self, models: dict[str, dict] | None = None) -> None:
        self.models = MODELS if models is None else models

    def get(self) -> None:
        token = self.request.headers.get("Authorization", "").removeprefix("token ")
        model = self.models.get(token)
        if model is None:
            raise web.HTTPError(403)
        self.finish(model)


@pytest.fixture
def cluster(tmp_path) -> Cluster:
    dgx = load_topology_file(str(TOPO / "dgx-a100.yaml"))
    ledger = Ledger([dgx], policy="first-fit")
    c = Cluster({dgx.name: None}, ledger, Backend(),  # type: ignore[dict-item]
                drain_store=DrainStore(str(tmp_path / "drains.json")))
    c.load_drains()
    return c


def _serve(app: web.Application) -> tuple[HTTPServer, int]:
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


@pytest.fixture
async def url(cluster):
    hub, hub_port = _serve(web.Application([(r"/hub/api/user", FakeHubUser)]))
    service = GPUService("gpuspawner", "t" * 64,
                         hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                         cluster_provider=lambda: cluster,
                         user_lookup=lambda name: (name == "root", []))
    server, port = _serve(service.make_app())
    yield f"http://127.0.0.1:{port}{service.prefix}"
    for s in (server, hub):
        s.stop()
        await s.close_all_connections()


async def call(url: str, method: str, token: str | None, body: Any = None,
               raw: bytes | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"token {token}"} if token else {}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                        else None)
    if method == "POST" and data is None:
        data = b""
    r = await AsyncHTTPClient().fetch(url, method=method, headers=headers, body=data,
                                      raise_error=False, allow_nonstandard_methods=True)
    assert r.headers["Content-Type"].startswith("application/json"), r.body
    return r.code, json.loads(r.body)


def gpu0(cluster: Cluster) -> str:
    return cluster.ledger.nodes[0].gpus[0].uuid


async def test_an_admin_drains_and_undrains_a_gpu(url, cluster, tmp_path):
    uuid = gpu0(cluster)
    code, body = await call(f"{url}api/gpus/{uuid}/drain", "POST", "admin-token",
                            {"reason": "fan noise"})
    assert code == 200, body
    _validate(body, "GPUDrain")
    assert body["drained"] == "fan noise" and body["drained_by"] == "root"
    assert body["node"] == cluster.ledger.nodes[0].name
    assert cluster.ledger.drained_gpus() == {uuid: "fan noise"}
    saved = json.loads((tmp_path / "drains.json").read_text())
    assert saved["drains"][uuid]["by"] == "root"
    # the placement excludes it: 7 of 8 can be taken, the 8th is refused naming the drain
    for i in range(7):
        got = cluster.ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"),
                                     Owner(f"u{i}"))
        assert uuid not in got.gpu_uuids
    with pytest.raises(PlacementRefused, match=f"drained: GPU {uuid} .*fan noise"):
        cluster.ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"), Owner("u8"))
    # admins see who; users see that it is drained, and why, but not who
    code, nodes = await call(f"{url}api/nodes", "GET", "admin-token")
    _validate(nodes, "Node", array=True)
    g = next(g for n in nodes for g in n["gpus"] if g["uuid"] == uuid)
    assert g["drained"] == "fan noise" and g["drained_by"] == "root"
    assert nodes[0]["summary"]["gpus_free"] == 0
    code, nodes = await call(f"{url}api/nodes", "GET", "user-token")
    assert code == 200
    _validate(nodes, "Node", array=True)
    g = next(g for n in nodes for g in n["gpus"] if g["uuid"] == uuid)
    assert g["drained"] == "fan noise"
    assert "drained_by" not in g and "drained_since" not in g
    assert all(n["state"] == "up" for n in nodes)
    # undrain
    code, body = await call(f"{url}api/gpus/{uuid}/drain", "DELETE", "admin-token")
    assert code == 200, body
    _validate(body, "GPUDrain")
    assert body["drained"] is None and body["drained_by"] is None
    assert cluster.ledger.drained_gpus() == {}
    assert json.loads((tmp_path / "drains.json").read_text())["drains"] == {}
    assert uuid in cluster.ledger.reserve(Bundle(cores=1, gpus=1, numa_policy="none"),
                                          Owner("u8")).gpu_uuids


async def test_only_admins_drain(url, cluster):
    uuid = gpu0(cluster)
    code, body = await call(f"{url}api/gpus/{uuid}/drain", "POST", "user-token",
                            {"reason": "mine"})
    assert code == 403 and "for hub admins" in body["message"]
    _validate(body, "Error")
    cluster.drain_gpu(uuid, "bad", by="root")
    code, _ = await call(f"{url}api/gpus/{uuid}/drain", "DELETE", "user-token")
    assert code == 403
    assert cluster.ledger.drained_gpus() == {uuid: "bad"}  # unchanged
    code, _ = await call(f"{url}api/gpus/{uuid}/drain", "POST", None, {"reason": "x"})
    assert code == 401
    # an admin's token without the admin scope (a server's token: any code in the admin's
    # server reads it) is no admin: the model's "admin" is the owner's
    for method in ("POST", "DELETE"):
        code, body = await call(f"{url}api/gpus/{uuid}/drain", method, "admin-server-token",
                                {"reason": "x"} if method == "POST" else None)
        assert code == 403 and "for hub admins" in body["message"], (method, body)
    assert cluster.ledger.drained_gpus() == {uuid: "bad"}


@pytest.mark.parametrize("method", ["POST", "DELETE"])
async def test_an_unknown_gpu_is_404(url, cluster, method):
    code, body = await call(f"{url}api/gpus/GPU-nowhere/drain", method, "admin-token",
                            {"reason": "x"} if method == "POST" else None)
    assert code == 404 and "no node has GPU 'GPU-nowhere'" in body["message"]
    _validate(body, "Error")
    assert cluster.ledger.drained_gpus() == {}


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b"{}", b'{"reason": 5}',
                                 b'{"reason": "   "}', b'{"why": "x"}'])
async def test_a_body_without_a_string_reason_is_400(url, cluster, raw):
    code, body = await call(f"{url}api/gpus/{gpu0(cluster)}/drain", "POST", "admin-token",
                            raw=raw)
    assert code == 400 and '"reason"' in body["message"]
    _validate(body, "Error")
    assert cluster.ledger.drained_gpus() == {}


async def test_bad_json_is_400_through_the_body_helper(url, cluster):
    """JSON nested deeper than the parser goes was an HTTP 500 (an uncaught RecursionError in
    the handler's own json.loads, issue 46); the body is now read by the service's one body
    helper, as the jobs API's: 400 naming the body, 413 past the drain's limit, nothing
    drained."""
    code, body = await call(f"{url}api/gpus/{gpu0(cluster)}/drain", "POST", "admin-token",
                            raw=b"[" * 50_000)
    assert code == 400 and body["message"].startswith("body: nested too deeply; "), body
    assert '"reason"' in body["message"]
    _validate(body, "Error")
    from gpuspawner.hub.service.app import DRAIN_BODY_MAX_BYTES

    big = json.dumps({"reason": "x" * DRAIN_BODY_MAX_BYTES}).encode()
    code, body = await call(f"{url}api/gpus/{gpu0(cluster)}/drain", "POST", "admin-token",
                            raw=big)
    assert code == 413 and body["message"].startswith(f"body: {len(big)} bytes"), body
    _validate(body, "Error")
    assert cluster.ledger.drained_gpus() == {}


def test_the_admin_map_shows_drained_gpus_and_node_state(cluster):
    from gpuspawner.hub.service.views import map_view, page_templates

    uuid = gpu0(cluster)
    cluster.drain_gpu(uuid, "xid 79 (GPU fell off the bus)", by="health")
    cluster.ledger.set_node_state(cluster.ledger.nodes[0].name, "drain", "maintenance")
    view = map_view(cluster)
    html = page_templates().get_template("admin.html.j2").render(
        view=view, user={"name": "root"}, prefix="/services/gpuspawner/", hub_prefix="/hub/")
    assert html.count('class="gpu drained"') == 1
    assert (f'data-gpu="{uuid}" data-milli-used="0" data-owners="" '
            'data-drained="xid 79 (GPU fell off the bus)" data-drained-by="health"') in html
    assert "drained: xid 79 (GPU fell off the bus)" in html
    assert 'data-state="drain"' in html and "drain: maintenance" in html
    assert view["drained"] == 1 and "1 drained" in html


# -- the CLI: gpuspawner drain-gpu / undrain-gpu against the same service --------------------
async def run_cli(*argv: str) -> tuple[int, str, str]:
    """``gpuspawner ARGV`` in a worker thread (its HTTP call is blocking; the service answers
    on this loop); (exit status, stdout, stderr)."""
    import asyncio
    import contextlib
    import io

    from gpuspawner.cli import main

    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()


def hub_of(url: str) -> str:
    return url.split("/services/")[0]


async def test_cli_drains_and_undrains_through_the_service(url, cluster, monkeypatch):
    uuid = gpu0(cluster)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "admin-token")
    code, out, err = await run_cli("drain-gpu", uuid, "--reason", "bad fan",
                                   "--hub-url", hub_of(url))
    assert code == 0, err
    assert json.loads(out)["drained"] == "bad fan" and json.loads(out)["drained_by"] == "root"
    assert cluster.ledger.drained_gpus() == {uuid: "bad fan"}
    code, out, err = await run_cli("undrain-gpu", uuid, "--hub-url", hub_of(url))
    assert code == 0, err
    assert json.loads(out)["drained"] is None and cluster.ledger.drained_gpus() == {}


async def test_cli_errors_are_clear(url, cluster, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    uuid = gpu0(cluster)
    code, _, err = await run_cli("drain-gpu", uuid, "--reason", "x", "--hub-url", hub_of(url))
    assert code == 1 and "no token" in err
    code, _, err = await run_cli("drain-gpu", uuid, "--reason", "x", "--hub-url", hub_of(url),
                                 "--token", "user-token")
    assert code == 1 and "HTTP 403" in err and "hub admin's token" in err
    code, _, err = await run_cli("undrain-gpu", "GPU-nowhere", "--hub-url", hub_of(url),
                                 "--token", "admin-token")
    assert code == 1 and "HTTP 404" in err and "no node has GPU 'GPU-nowhere'" in err
    assert cluster.ledger.drained_gpus() == {}
    code, _, err = await run_cli("drain-gpu", uuid, "--hub-url", hub_of(url))
    assert code == 2  # --reason is required


def test_cli_health_prints_json_from_nvml(monkeypatch, capsys):
    import sys

    from tests.nvml_double import FakeGPU, FakeNVML

    nvml = FakeNVML([FakeGPU(uuid="GPU-a", ecc_uncorrected=1),
                     FakeGPU(uuid="GPU-b", pci_bus_id="00000000:08:00.0")])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    from gpuspawner.cli import main

    assert main(["health", "--name", "n7"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "n7" and doc["healthy"] is False
    assert [(g["uuid"], g["healthy"], g["reasons"]) for g in doc["gpus"]] == [
        ("GPU-a", False, ["1 uncorrected ECC error (volatile)"]), ("GPU-b", True, [])]
    assert main(["health", "--exit-code"]) == 3
    capsys.readouterr()
    assert main(["health", "--exit-code", "--max-uncorrected-ecc", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["healthy"] is True
    assert main(["health", "--gpu", "GPU-b", "--exit-code"]) == 0
    assert [g["uuid"] for g in json.loads(capsys.readouterr().out)["gpus"]] == ["GPU-b"]


def test_metrics_count_a_drained_gpu_as_drained_not_free(cluster):
    from prometheus_client import CollectorRegistry

    from gpuspawner.hub import metrics
    from tests.test_service_unit import _samples

    reg = CollectorRegistry()
    reg.register(metrics.ClusterCollector(lambda: [cluster]))
    key = (("model", "A100"), ("node", cluster.ledger.nodes[0].name))
    assert _samples(reg)[("gpuspawner_gpus_free", key)] == 8
    assert _samples(reg)[("gpuspawner_gpus_drained", key)] == 0
    cluster.drain_gpu(gpu0(cluster), "bad fan", by="root")
    s = _samples(reg)
    assert s[("gpuspawner_gpus_free", key)] == 7 and s[("gpuspawner_gpus_drained", key)] == 1
    assert s[("gpuspawner_gpus", key)] == 8
