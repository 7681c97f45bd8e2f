"""The gpuspawner service in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the
real Docker engine; marked ``docker``): scopes, usage and quota, metrics, schemathesis against
``api/openapi.json`` and the admin page in Debian's Chromium.

GPUs without a GPU: node ``dgx`` is described by ``tests/data/topologies/dgx-a100.yaml``
(8 A100). A container asking Docker for GPUs cannot *start* here (no NVIDIA runtime), but the
ledger learns what containers hold from their ``gpuspawner.allocation`` labels when the hub
starts (``Cluster.ensure_restored``: running and *created* containers count). So before the hub
starts, :func:`hold` creates (does not start) labelled containers that hold GPUs, exactly as
GPU servers left running across a hub restart would; the hub then really holds those GPUs for
those users, and everything after that (quota refusal, API, map, metrics) runs unmodified.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")

from gpuspawner.inventory.topology import load_topology_file  # noqa: E402
from gpuspawner.placement import Allocation, GPUShare, Owner  # noqa: E402
from tests.hubrunner import REPO, Hub  # noqa: E402
from tests.test_hub_e2e import _engine  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]
IMAGE = "gpuspawner/singleuser:latest"
DGX = REPO / "tests" / "data" / "topologies" / "dgx-a100.yaml"
SVC = "/services/gpuspawner/"
SCREENSHOTS = REPO / "var" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

#: gives the hubrunner's admin service token what these tests need besides admin:users
EXTRA_ADMIN_SCOPES = """
for _r in c.JupyterHub.load_roles:
    if _r.get("name") == "gpuspawner-admin":
        _r["scopes"] = list(_r["scopes"]) + ["tokens", "read:metrics", "admin:auth_state",
                                             "access:services"]
"""


def engine_or_skip() -> docker.APIClient:
    """The Docker engine with the single-user image and the proxy, or skip (one check for
    every hub test: tests.test_hub_e2e._engine)."""
    return _engine()


def hold(engine: docker.APIClient, node: str, user: str, server: str, gpu_indexes: list[int],
         cpus: list[int], memory: int = 2**30) -> str:
    """Create (not start) a GPUSpawner-labelled container holding these GPUs of the DGX
    topology, cores and memory on NUMA node 0; returns its id. See the module docstring."""
    topo = load_topology_file(str(DGX))
    gpus = [g for g in topo.gpus if g.index in gpu_indexes]
    alloc = Allocation(id=Allocation.new_id(), owner=Owner(user, server), node=node,
                       gpus=tuple(GPUShare(g.uuid) for g in gpus), cpuset=tuple(cpus),
                       mems=(0,), memory_bytes=memory, disk_bytes=0,
                       memory_by_numa=((0, memory),), created=time.time())
    c = engine.create_container(IMAGE, command=["true"], labels={
        "gpuspawner.managed": "1", "gpuspawner.allocation": alloc.to_json(),
        "gpuspawner.user": user, "gpuspawner.server": server, "gpuspawner.test": "held"})
    return c["Id"]


def register_owners(hub: Hub, owners: list[tuple[str, str]]) -> None:
    """Make the held containers' users and named servers exist in the hub (as they would for
    servers left running across a restart); a held container whose owner the hub does not
    know is removed and released (tests/test_security.py)."""
    for user, server in owners:
        hub.ensure_user(user)
        if server:
            r = hub.api("PUT", f"/users/{user}/servers/{server}", {})
            assert r.status_code in (201, 409), r.text


def remove_held(engine: docker.APIClient) -> None:
    for c in engine.containers(all=True, filters={"label": "gpuspawner.test=held"}):
        engine.remove_container(c["Id"], force=True)


def stop_all(hub: Hub, engine: docker.APIClient) -> None:
    for user in hub.api("GET", "/users").json():
        for server in (user.get("servers") or {}):
            path = f"/users/{user['name']}/servers/{server}" if server else \
                f"/users/{user['name']}/server"
            hub.api("DELETE", path)
    for user in hub.api("GET", "/users").json():
        for server in (user.get("servers") or {}):
            hub.wait_stopped(user["name"], server)
    hub.stop()
    remove_held(engine)
    for c in engine.containers(all=True, filters={"label": "gpuspawner.managed=1"}):
        if c["Labels"].get("gpuspawner.user", "").startswith("svc"):
            engine.remove_container(c["Id"], force=True)


@pytest.fixture(scope="module")
def engine():
    return engine_or_skip()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("svchub")
    remove_held(engine)
    hold(engine, "dgx", "svcgpu", "g1", [0], [0, 1, 2, 3])
    hold(engine, "dgx", "svcgpu", "g2", [1], [4, 5, 6, 7])
    hold(engine, "dgx", "svcother", "", [5], [64, 65])
    nodes = [{"name": "local", "topology": "auto"}, {"name": "dgx", "topology": str(DGX)}]
    profiles = [
        {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "256M",
         "nodes": ["local"], "default": True},
        {"slug": "a100", "display_name": "1 x A100", "cpu": 2, "memory": "1G", "gpus": 1,
         "gpu_models": ["A100"]},
    ]
    h = Hub(tmp, nodes, profiles, extra_config=EXTRA_ADMIN_SCOPES +
            "c.GPUSpawner.quotas = {'default_user': {'gpus': 2, 'servers': 3}}\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    register_owners(h, [("svcgpu", "g1"), ("svcgpu", "g2"), ("svcother", "")])
    # one real running server, so the map also shows a container that runs here
    h.ensure_user("svccpu")
    r = h.api("POST", "/users/svccpu/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    h.wait_ready("svccpu")
    yield h
    stop_all(h, engine)


def user_token(hub: Hub, name: str) -> str:
    hub.ensure_user(name)
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "service test"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def svc(hub: Hub, path: str, token: str | None, **kw) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.get(f"{hub.url}{SVC}{path}", headers=headers, timeout=30,
                        allow_redirects=False, **kw)


# -- REST API and scopes ----------------------------------------------------------------------
def test_users_see_only_their_own(hub):
    tok = user_token(hub, "svcother")
    r = svc(hub, "api/allocations", tok)
    assert r.status_code == 200, r.text
    assert [a["owner"]["user"] for a in r.json()] == ["svcother"]
    r = svc(hub, "api/allocations?user=svcgpu", tok)
    assert r.status_code == 403 and "may not read the allocations" in r.json()["message"]
    r = svc(hub, "api/users/svcgpu/usage", tok)
    assert r.status_code == 403
    r = svc(hub, "api/users/svcother/usage", tok)
    assert r.status_code == 200 and r.json()["usage"]["gpu_milli"] == 1000
    # the node view names no one else
    holders = {h["user"] for n in svc(hub, "api/nodes", tok).json() for g in n["gpus"]
               for h in g["holders"]}
    assert holders == {"svcother", "(another user)"}
    # the map is for admins
    assert svc(hub, "admin", tok).status_code == 403
    assert svc(hub, "metrics", tok).status_code == 403


def test_no_token_is_refused_and_openapi_is_public(hub):
    r = svc(hub, "api/allocations", None)
    assert r.status_code == 401, r.text
    r = svc(hub, "api/openapi.json", None)
    assert r.status_code == 200 and r.json()["openapi"].startswith("3.0")
    r = svc(hub, "api/nodes", "not-a-token")
    assert r.status_code == 401


def test_configuration_schemas_are_public_through_the_proxy(hub):
    from gpuspawner.schemas import SCHEMA_NAMES, load_schema

    r = svc(hub, "api/schemas", None)
    assert r.status_code == 200, r.text
    assert [s["name"] for s in r.json()] == list(SCHEMA_NAMES)
    for item in r.json():
        r = requests.get(f"{hub.url}{item['url']}", timeout=30)
        assert r.status_code == 200 and r.json() == load_schema(item["name"])
    r = svc(hub, "api/schemas/nope", None)
    assert r.status_code == 404 and r.json()["status"] == 404


def test_admin_sees_everything(hub):
    r = svc(hub, "api/allocations", hub.token)
    assert r.status_code == 200, r.text
    owners = sorted(a["owner"]["user"] for a in r.json())
    assert owners == ["svccpu", "svcgpu", "svcgpu", "svcother"]
    nodes = {n["name"]: n for n in svc(hub, "api/nodes", hub.token).json()}
    assert nodes["dgx"]["summary"]["gpus_total"] == 8
    assert nodes["dgx"]["summary"]["gpus_free"] == 5
    assert nodes["local"]["summary"]["cores_total"] - nodes["local"]["summary"][
        "cores_free"] == 1
    r = svc(hub, "api/users/svcgpu/usage", hub.token)
    assert r.json()["usage"]["gpu_milli"] == 2000 and r.json()["quota"]["gpu_milli"] == 2000


# -- quota: the third GPU ---------------------------------------------------------------------
QUOTA_MESSAGE = "over your quota for GPUs: asked for 1 GPU, 2 GPUs of 2 GPUs in use"


def test_third_gpu_refused_through_rest(hub):
    hub.ensure_user("svcgpu")
    r = hub.api("POST", "/users/svcgpu/servers/third", {"profile": "a100"})
    assert r.status_code == 400, r.text
    assert QUOTA_MESSAGE in r.json()["message"]
    assert "your quota allows 0 GPUs more" in r.json()["message"]
    # counted as a placement refusal by reason
    m = svc(hub, "metrics", hub.token).text
    assert re.search(r'gpuspawner_placement_refusals_total\{reason="quota_gpu_milli"\} [1-9]',
                     m), m
    # and nothing was booked
    assert svc(hub, "api/users/svcgpu/usage", hub.token).json()["usage"]["gpu_milli"] == 2000


def test_third_gpu_refused_through_the_form(hub):
    s = hub.login("svcgpu")
    html = s.get(f"{hub.url}/hub/spawn/svcgpu", timeout=30).text
    assert "you use 2 of your 2 GPUs" in html
    assert 'data-profile="a100" data-available="false"' in html
    assert "over your quota" in html
    # a form post of the GPU profile anyway (a stale form, a script): refused, with the reason
    r = s.post(f"{hub.url}/hub/spawn/svcgpu", data={"profile": "a100",
                                                    "_xsrf": s.cookies.get("_xsrf")},
               timeout=60)
    assert QUOTA_MESSAGE in r.text, r.text[-1500:]
    model = hub.api("GET", "/users/svcgpu").json()
    assert not model["servers"], model


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_follow_the_ledger(hub):
    r = svc(hub, "metrics", hub.token)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    text = r.text
    assert 'gpuspawner_gpus{model="A100",node="dgx"} 8.0' in text
    assert 'gpuspawner_gpus_allocated{model="A100",node="dgx"} 3.0' in text
    assert 'gpuspawner_gpus_free{model="A100",node="dgx"} 5.0' in text
    assert re.search(r"^gpuspawner_users_holding [1-9]", text, re.M), text
    assert "gpuspawner_gpus_total" not in text and 'user="' not in text
    # the CPU server's spawn was timed from request to ready
    assert re.search(r'gpuspawner_spawn_ready_seconds_count\{gpus="0"\} [1-9]', text), text


# -- schemathesis ------------------------------------------------------------------------------
@pytest.mark.parametrize("who", ["admin", "user"])
def test_schemathesis_finds_no_server_errors(hub, who, tmp_path):
    token = hub.token if who == "admin" else user_token(hub, "svcother")
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe, "schemathesis is in the test extra"
    args = [exe, "run", f"{hub.url}{SVC}api/openapi.json", "--url", f"{hub.url}{SVC.rstrip('/')}",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                        "response_schema_conformance",
            "-H", f"Authorization: token {token}", "--max-examples", "25", "--seed", "6",
            "--workers", "1", "--request-timeout", "30", "--max-time", "20",
            "--phases", "examples,coverage,fuzzing", "--generation-database", "none"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    if r.returncode and CPYTHON_AST_BUG in r.stdout + r.stderr:
        # CPython 3.11.7's ast.parse can raise this SystemError spuriously when an exception
        # interrupts AST construction (python/cpython#106905, fixed in later releases);
        # hypothesis hit it while describing a lambda, before any request was judged. The
        # run is repeated once; any other failure, or this one twice, fails the test.
        r = subprocess.run(args, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


CPYTHON_AST_BUG = "AST constructor recursion depth mismatch"


# -- the admin page in Chromium ----------------------------------------------------------------
def test_admin_page_in_chromium_matches_the_api(hub):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("Debian's chromium is missing: run scripts/ldap.sh (make test does)")
    api_nodes = {n["name"]: n for n in svc(hub, "api/nodes", hub.token).json()}
    api_allocs = svc(hub, "api/allocations", hub.token).json()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "service-admin-map.png"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            # the hub's login form, then the service (hub OAuth redirects, no confirm page)
            page.goto(f"{hub.url}/hub/login")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", "gpuspawner")
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
            page.goto(f"{hub.url}{SVC}admin")
            page.wait_for_selector("[data-testid=map]")
            assert page.url.endswith(f"{SVC}admin")
            page.screenshot(path=str(shot), full_page=True)
            cells = page.eval_on_selector_all("[data-gpu]", """els => els.map(e => ({
                uuid: e.dataset.gpu, milli: +e.dataset.milliUsed,
                owners: e.dataset.owners ? e.dataset.owners.split(',') : [],
                node: e.closest('[data-node]').dataset.node}))""")
            numa = page.eval_on_selector_all("[data-numa]", """els => els.map(e => ({
                node: e.closest('[data-node]').dataset.node, id: +e.dataset.numa,
                total: +e.dataset.coresTotal, used: +e.dataset.coresUsed}))""")
            rows = page.eval_on_selector_all("[data-allocation]",
                                             "els => els.map(e => e.dataset.allocation)")
            busy_colour = page.eval_on_selector(".gpu.busy", "e => getComputedStyle(e)."
                                                             "backgroundColor")
        finally:
            browser.close()
    # one cell per GPU, each showing the API's use and holders
    expected = {g["uuid"]: (n["name"], g["milli_used"], sorted(h["user"] for h in g["holders"]))
                for n in api_nodes.values() for g in n["gpus"]}
    got = {c["uuid"]: (c["node"], c["milli"], sorted(c["owners"])) for c in cells}
    assert got == expected
    assert sum(1 for c in cells if c["owners"]) == 3
    # one cell per NUMA node with the API's core counts
    expected_numa = {(n["name"], nn["id"]): (len(nn["cpus"]), len(nn["cpus"]) -
                                             len(nn["cpus_free"]))
                     for n in api_nodes.values() for nn in n["numa_nodes"]}
    assert {(c["node"], c["id"]): (c["total"], c["used"]) for c in numa} == expected_numa
    assert sorted(rows) == sorted(a["id"] for a in api_allocs)
    assert busy_colour not in ("rgb(238, 238, 238)", "rgba(0, 0, 0, 0)")
    assert shot.stat().st_size > 10_000
    # docs/ keeps a committed copy; refresh it on request, not on every run
    docs = REPO / "docs" / "service-admin-map.png"
    if not docs.exists() or os.environ.get("GPUSPAWNER_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, docs)


def test_admin_page_redirects_to_hub_login(hub):
    r = svc(hub, "admin", None)
    assert r.status_code == 302
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]
    assert json.dumps(r.headers.get("Set-Cookie", "")).count("state") >= 1
