"""Idle culler against a real JupyterHub + configurable-http-proxy (no Docker): servers are
the real jupyterhub-singleuser with a fake GPU allocation in their state
(tests/culler_hub.py). Timeouts are seconds; where a test needs a server to be "idle for a
while" without waiting, the culler's clock is moved forward (as jupyterhub-idle-culler's own
tests do), GPU samples use real time.

Every culler here runs with ``global: {exempt: true}`` plus entries for its own users, so
tests sharing the hub never cull each other's servers; the hub-managed culler service does the
same with its own users."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from tornado import httpclient, web

from idle_culler.app import IdleCuller
from idle_culler.core import Culler, Decision
from idle_culler.gpu import GPUHistory, NVMLSampler, PrometheusSource
from idle_culler.hub import HubClient
from idle_culler.metrics import Metrics
from idle_culler.policies import PolicySet
from tests.culler_hub import CHP, CullerHub, fake_gpu_uuid, free_port
from tests.nvml_double import FakeGPU
from tests.test_culler_units import UtilNVML

pytestmark = [pytest.mark.hub, pytest.mark.skipif(
    not CHP.exists(), reason="configurable-http-proxy not installed (make chp)")]

CULLER_TOKEN = "culler-" + "0123456789abcdef" * 2
SCOPES = ["list:users", "read:users:activity", "read:users:groups", "read:servers",
          "delete:servers", "admin:server_state"]
SERVICE_USERS = ("wendy", "xavier")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CullerHub]:
    d = tmp_path_factory.mktemp("culler-hub")
    policies = d / "service_policies.yaml"
    policies.write_text("# the shipped policies (tracked, with comments): never written\n"
                        + yaml.safe_dump({
                            "global": {"exempt": True},
                            "users": {"wendy": {"exempt": False, "idle_timeout": 2,
                                                "warning": 3}}}))
    overrides = d / "state" / "culler_policy_overrides.yaml"
    svc_port = free_port()
    extra = f"""
import sys
c.JupyterHub.services.append({{"name": "culler", "api_token": {CULLER_TOKEN!r}}})
c.JupyterHub.load_roles.append({{"name": "culler", "services": ["culler"],
                                 "scopes": {SCOPES!r}}})
c.JupyterHub.services.append({{
    "name": "idle-culler", "url": "http://127.0.0.1:{svc_port}", "oauth_no_confirm": True,
    "command": [sys.executable, "-m", "idle_culler", "--policies", {str(policies)!r},
                "--overrides", {str(overrides)!r},
                "--cull-log", {str(d / "culls.jsonl")!r}, "--cull-every", "0.5",
                "--backoff", "0.1"],
    "cwd": {str(Path(__file__).resolve().parents[1])!r},
}})
c.JupyterHub.load_roles.append({{"name": "idle-culler", "services": ["idle-culler"],
                                 "scopes": {SCOPES!r}}})
c.JupyterHub.extra_user_scopes = {{"access:services!service=idle-culler"}}
# the single-user servers load JupyterHub's extension only: Lab (which runs `yarn config` at
# start), LSP, the scheduler and the shim cost about 2.5 CPU-seconds a start and no test here
# uses them (about 16 servers start on a shared 2-core machine)
c.Spawner.args.append("--ServerApp.jpserver_extensions=" + repr({{
    "jupyterhub": True, "jupyterlab": False, "jupyter_lsp": False,
    "jupyter_scheduler": False, "notebook_shim": False}}))
"""
    h = CullerHub(d, extra_config=extra)
    h.policies_file = policies  # type: ignore[attr-defined]
    h.policies_bytes = policies.read_bytes()  # type: ignore[attr-defined]
    h.overrides_file = overrides  # type: ignore[attr-defined]
    h.start()
    try:
        # the servers of most tests start together, at once (a single-user server takes a few
        # CPU-seconds to import jupyter_server); each test then waits for its own
        for user, groups in PRESPAWN.items():
            h.ensure_user(user, groups)
            h.spawn(user, "")
        yield h
    finally:
        h.stop()


#: users whose default server is started when the hub starts (name -> groups)
PRESPAWN: dict[str, tuple[str, ...]] = {
    "gpu-prometheus": (), "gpu-nvml": (), "gbob": ("long-jobs",), "gcarol": ("long-jobs",),
    "gdave": ("short",), "erin": (), "frank": (), "dora": (), "dina": (), "hidle": (),
    "hbusy": (), "hstuck": (), "xavier": (), "cli-user": (),
}


def start_servers(hub: CullerHub, specs: list[tuple[str, str, tuple[str, ...]]]) -> None:
    """Create the users (with groups), start their servers in parallel unless already
    started or starting, and wait until all are ready."""
    for user, _, groups in specs:
        hub.ensure_user(user, groups)
    for user, server, _ in specs:
        if hub.server(user, server) is None:
            hub.spawn(user, server)
    for user, server, _ in specs:
        hub.wait_ready(user, server)


def make_culler(hub: CullerHub, policy: dict[str, Any], url: str | None = None,
                **kw: Any) -> Culler:
    client = HubClient(url or hub.api_url, CULLER_TOKEN, backoff=kw.pop("backoff", 0.1),
                       retries=kw.pop("retries", 4))
    return Culler(client, PolicySet({"global": {"exempt": True}, **policy}), **kw)


def mine(ds: list[Decision], users: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    return {d.key: (d.action, d.reason) for d in ds if d.user in users}


def decision(ds: list[Decision], user: str, c: Culler) -> Decision:
    for d in ds:
        if d.user == user:
            return d
    raise AssertionError(f"no decision for {user}: {c.last_pass}")


def shift(seconds: float):  # noqa: ANN201
    return lambda: time.time() + seconds


# ------------------------------------------------------------------ GPU
class DCGM(web.RequestHandler):
    values: dict[str, float] = {}

    def get(self) -> None:
        lines = [f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="{u}",Hostname="local"}} {v:g}'
                 for i, (u, v) in enumerate(type(self).values.items())]
        self.finish("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "\n".join(lines) + "\n")


async def feed(source: Any, seconds: float, every: float = 0.1) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r = source.scrape_once() if isinstance(source, PrometheusSource) else \
            source.sample_once()
        if asyncio.iscoroutine(r):
            await r
        await asyncio.sleep(every)


@pytest.mark.parametrize("source_kind", ["prometheus", "nvml"])
async def test_gpu_busy_kept_gpu_idle_culled(hub: CullerHub, source_kind: str) -> None:
    user = f"gpu-{source_kind}"
    start_servers(hub, [(user, "", ())])
    gpu = fake_gpu_uuid(user, "")
    history = GPUHistory()
    # the idle timeout (4 s) is well beyond the GPU window (1 s) plus two passes: under a
    # loaded CI machine, a 2 s timeout made "idle" fall due before "gpu_idle" in the second pass
    policy = {"users": {user: {"exempt": False, "idle_timeout": 4, "gpu_idle_threshold": 5,
                               "gpu_window": 1.0}}}
    c = make_culler(hub, policy, history=history)
    if source_kind == "prometheus":
        DCGM.values = {gpu: 60.0, "GPU-someone-else": 0.0}
        port = free_port()
        srv = web.Application([("/metrics", DCGM)]).listen(port, "127.0.0.1")
        source: Any = PrometheusSource(history, [f"http://127.0.0.1:{port}/metrics"])

        def set_util(v: float) -> None:
            DCGM.values[gpu] = v
    else:
        nv = UtilNVML([FakeGPU(gpu), FakeGPU("GPU-someone-else")])
        nv.nvmlInit()
        source = NVMLSampler(history, nvml=nv, uuids=lambda: [gpu, "GPU-not-on-this-node"])
        srv = None

        def set_util(v: float) -> None:
            nv.util[gpu] = v
    try:
        set_util(60)
        # busy GPU, no hub activity for longer than the idle timeout (4 s): kept
        await feed(source, 4.2)
        d = decision(await c.run_pass(), user, c)
        assert (d.action, d.reason) == ("keep", "active"), d.to_json()
        assert d.figures["hub_inactive_s"] >= 4.2 and d.figures["gpu_mean_percent"] == 60
        assert hub.server(user) is not None
        # GPU idle for the whole window: culled, reason gpu_idle
        set_util(1)
        await feed(source, 1.2)
        d = decision(await c.run_pass(), user, c)
        assert (d.action, d.reason) == ("cull", "gpu_idle"), d.to_json()
        assert d.figures["gpu_mean_percent"] == 1
        hub.wait_stopped(user)
    finally:
        if srv is not None:
            srv.stop()


# ------------------------------------------------------------------ policies
async def test_group_timeout_and_user_override(hub: CullerHub) -> None:
    users = ("gbob", "gcarol", "gdave")
    start_servers(hub, [("gbob", "", ("long-jobs",)), ("gcarol", "", ("long-jobs",)),
                        ("gdave", "", ("short",))])
    policy = {
        "global": {"exempt": True, "idle_timeout": 5},
        "groups": {"long-jobs": {"idle_timeout": 1000}, "short": {"idle_timeout": 3}},
        "users": {"gbob": {"exempt": False}, "gdave": {"exempt": False},
                  "gcarol": {"exempt": False, "idle_timeout": 4}},
    }
    c = make_culler(hub, policy)
    c.clock = shift(8)
    ds = await c.run_pass()
    assert mine(ds, users) == {"gbob/": ("keep", "active"), "gcarol/": ("cull", "idle"),
                               "gdave/": ("cull", "idle")}
    by = {d.user: d for d in ds}
    assert by["gbob"].policy["idle_timeout"] == {"value": 1000, "source": "group:long-jobs"}
    assert by["gcarol"].policy["idle_timeout"] == {"value": 4, "source": "user:gcarol"}
    assert by["gdave"].policy["idle_timeout"] == {"value": 3, "source": "group:short"}
    hub.wait_stopped("gcarol")
    hub.wait_stopped("gdave")
    assert hub.server("gbob") is not None
    hub.api("DELETE", "/users/gbob/server")


async def test_max_age_and_grace(hub: CullerHub, tmp_path: Path) -> None:
    users = ("erin", "frank")
    start_servers(hub, [("erin", "", ()), ("frank", "", ())])
    hub.activity("erin")
    policy = {"users": {"erin": {"exempt": False, "idle_timeout": 1000, "max_age": 5},
                        "frank": {"exempt": False, "idle_timeout": 1, "grace_period": 300}}}
    log_file = tmp_path / "culls.jsonl"
    metrics = Metrics()
    c = make_culler(hub, policy, cull_log=log_file, metrics=metrics)
    c.clock = shift(8)
    ds = await c.run_pass()
    assert mine(ds, users) == {"erin/": ("cull", "max_age"), "frank/": ("keep", "active")}
    hub.wait_stopped("erin")
    assert hub.server("frank") is not None
    lines = [json.loads(x) for x in log_file.read_text().splitlines()]
    assert len(lines) == 1
    rec = lines[0]
    assert (rec["user"], rec["server"], rec["reason"]) == ("erin", "", "max_age")
    assert rec["policy_source"]["max_age"] == "user:erin" and rec["figures"]["age_s"] >= 8
    assert rec["dry_run"] is False and rec["hub_status"] in (202, 204)
    text = metrics.render().decode()
    assert 'idle_culler_culls_total{dry_run="false",reason="max_age"} 1.0' in text
    # once past the grace period the idle timeout applies
    c.clock = shift(400)
    ds = await c.run_pass()
    assert mine(ds, users) == {"frank/": ("cull", "idle")}
    hub.wait_stopped("frank")


async def test_dry_run_lists_the_same_decisions(hub: CullerHub, tmp_path: Path) -> None:
    users = ("dora", "dina")
    start_servers(hub, [("dora", "", ()), ("dina", "", ())])
    hub.activity("dina")
    policy = {"users": {u: {"exempt": False, "idle_timeout": 3} for u in users}}
    now = time.time() + 2.5  # dina: active 2.5 s ago, the others longer
    dry = make_culler(hub, policy, dry_run=True, cull_log=tmp_path / "dry.jsonl",
                      clock=lambda: now)
    real = make_culler(hub, policy, cull_log=tmp_path / "real.jsonl", clock=lambda: now)
    d1 = mine(await dry.run_pass(), users)
    for u in users:
        assert hub.server(u) is not None  # nothing culled
    assert d1 == {"dora/": ("cull", "idle"), "dina/": ("keep", "active")}
    d2 = mine(await real.run_pass(), users)
    assert d1 == d2
    hub.wait_stopped("dora")
    dry_log = [json.loads(x) for x in (tmp_path / "dry.jsonl").read_text().splitlines()]
    real_log = [json.loads(x) for x in (tmp_path / "real.jsonl").read_text().splitlines()]
    assert all(r["dry_run"] and r["hub_status"] is None for r in dry_log)
    assert sorted(r["user"] for r in dry_log) == sorted(r["user"] for r in real_log)
    hub.api("DELETE", "/users/dina/server")


# ------------------------------------------------------------------ hub API errors
class FaultyProxy(web.RequestHandler):
    """Forwards to the hub API; answers 500 while ``failing`` says so (per method and path)."""

    target = ""
    failing: Any = staticmethod(lambda method, path: False)
    counts: dict[str, int] = {}

    async def _any(self) -> None:
        key = f"{self.request.method} {self.request.path}"
        FaultyProxy.counts[key] = FaultyProxy.counts.get(key, 0) + 1
        if type(self).failing(self.request.method, self.request.path):
            self.set_status(500)
            self.finish({"status": 500, "message": "injected"})
            return
        body = self.request.body if self.request.method in ("POST", "PATCH", "PUT",
                                                               "DELETE") else None
        r = await httpclient.AsyncHTTPClient().fetch(
            self.target + self.request.uri, method=self.request.method,
            headers=self.request.headers, body=body or (None if body is None else b""),
            raise_error=False, allow_nonstandard_methods=True, follow_redirects=False)
        self.set_status(r.code)
        if "Content-Type" in r.headers:
            self.set_header("Content-Type", r.headers["Content-Type"])
        self.finish(None if r.code in (204, 304) else (r.body or b""))

    get = post = delete = _any


async def test_hub_errors_recover_and_cull_nothing_wrong(hub: CullerHub) -> None:
    users = ("hidle", "hbusy", "hstuck")
    start_servers(hub, [("hidle", "", ()), ("hbusy", "", ()), ("hstuck", "", ())])
    hub.activity("hbusy")
    port = free_port()
    FaultyProxy.target = f"http://127.0.0.1:{hub.hub_api_port}"
    FaultyProxy.counts = {}
    t_fail_until = time.monotonic() + 0.6
    # listing fails for 1 s; stopping hstuck's server always fails
    FaultyProxy.failing = staticmethod(
        lambda m, p: (m == "GET" and time.monotonic() < t_fail_until)
        or (m == "DELETE" and "hstuck" in p))
    srv = web.Application([(r"/.*", FaultyProxy)]).listen(port, "127.0.0.1")
    try:
        policy = {"users": {u: {"exempt": False, "idle_timeout": 3} for u in users}}
        now = time.time() + 2.5
        c = make_culler(hub, policy, url=f"http://127.0.0.1:{port}/hub/api",
                        metrics=Metrics(), clock=lambda: now, retries=5, backoff=0.1)
        ds = mine(await c.run_pass(), users)
        assert c.hub.retried >= 2 and FaultyProxy.counts["DELETE /hub/api/users/hstuck/server"] == 6
        assert ds["hidle/"] == ("cull", "idle") and ds["hbusy/"] == ("keep", "active")
        assert ds["hstuck/"][0] == "error"  # failed user: reported, the pass went on
        assert c.last_pass["complete"] and c.last_pass["errors"] == 1
        hub.wait_stopped("hidle")
        assert hub.server("hbusy") is not None and hub.server("hstuck") is not None
        # a hub down for longer than the retries: the pass is aborted, nothing culled
        t_fail_until = time.monotonic() + 60
        c2 = make_culler(hub, policy, url=f"http://127.0.0.1:{port}/hub/api",
                         clock=lambda: now, retries=2, backoff=0.05)
        ds = await c2.run_pass()
        assert ds == [] and not c2.last_pass["complete"]
        # ... and the next pass, once the hub is back, works
        t_fail_until = 0
        FaultyProxy.failing = staticmethod(lambda m, p: False)
        ds = mine(await c2.run_pass(), users)
        assert ds == {"hbusy/": ("keep", "active"), "hstuck/": ("cull", "idle")}
        hub.wait_stopped("hstuck")
    finally:
        srv.stop()
        hub.api("DELETE", "/users/hbusy/server")


# ------------------------------------------------------------------ the service
def service_get(hub: CullerHub, path: str, token: str) -> requests.Response:
    return requests.get(f"{hub.url}/services/idle-culler/{path}",
                        headers={"Authorization": f"token {token}"}, timeout=10,
                        allow_redirects=False)


def test_service_warns_owner_only_then_culls(hub: CullerHub) -> None:
    start_servers(hub, [("wendy", "", ()), ("xavier", "", ())])
    hub.ensure_user("admin")
    wendy, xavier, admin = (hub.user_token(u) for u in ("wendy", "xavier", "admin"))
    # the service culls wendy after 2 s idle, warning 3 s before: the mark comes first
    deadline = time.monotonic() + 20
    warned: dict[str, Any] | None = None
    while time.monotonic() < deadline and warned is None:
        r = service_get(hub, "api/status", wendy)
        assert r.status_code == 200, r.text
        for s in r.json()["servers"]:
            if s["user"] == "wendy" and s["action"] == "warn":
                warned = s
        time.sleep(0.2)
    assert warned is not None, hub.tail()
    assert warned["message"].startswith("will be culled at ") and "because no activity" in \
        warned["message"] and warned["reason"] == "idle"
    assert hub.server("wendy") is not None
    # other users see only their own servers
    other = service_get(hub, "api/status", xavier).json()
    assert {s["user"] for s in other["servers"]} <= {"xavier"}
    assert all(s["user"] == "xavier" for s in other["servers"])
    assert service_get(hub, "api/policies", xavier).status_code == 403
    assert service_get(hub, "api/status", "not-a-token").status_code in (302, 403)
    # an admin sees everyone
    every = service_get(hub, "api/status", admin).json()
    assert {"wendy", "xavier"} <= {s["user"] for s in every["servers"]}
    # a deadline, not a wait: idle_timeout is 2 s and the culler runs every 0.5 s, but a
    # stop on a loaded CI machine has taken longer than 15 s (the wendy/xavier pair is exempt
    # by the global policy, so a policy that is not applied never culls, however long)
    hub.wait_stopped("wendy", timeout=60)
    assert hub.server("xavier") is not None
    log_lines = [json.loads(x) for x in
                 (hub.state_dir / "culls.jsonl").read_text().splitlines()]
    assert [(r["user"], r["reason"]) for r in log_lines] == [("wendy", "idle")]
    # wendy's status shows the cull afterwards
    mine_ = service_get(hub, "api/status", wendy).json()
    assert [r["reason"] for r in mine_["recent_culls"]] == ["idle"]
    assert "recent_culls" in other and other["recent_culls"] == []
    metrics = service_get(hub, "metrics", admin)
    assert 'idle_culler_culls_total{dry_run="false",reason="idle"} 1.0' in metrics.text
    assert service_get(hub, "metrics", xavier).status_code == 403


def test_service_policy_changes_at_run_time(hub: CullerHub) -> None:
    start_servers(hub, [("xavier", "", ())])
    admin, xavier = hub.user_token("admin"), hub.user_token("xavier")
    url = f"{hub.url}/services/idle-culler/api/policies/users/xavier"
    entry = {"exempt": False, "idle_timeout": 1}
    r = requests.put(url, json=entry, headers={"Authorization": f"token {xavier}"},
                     timeout=10)
    assert r.status_code == 403
    # a token of an admin that holds only what a server's token holds (the culler's
    # access): the model says its owner is an admin, and that once let any code in an
    # admin's server (which reads the token from its environment) cull everyone
    r = hub.api("POST", "/users/admin/tokens", {
        "note": "as a server token", "scopes": ["access:services!service=idle-culler"]})
    assert r.status_code in (200, 201), r.text
    narrow = r.json()["token"]
    r = requests.put(url, json=entry, headers={"Authorization": f"token {narrow}"},
                     timeout=10)
    assert r.status_code == 403, r.text
    r = requests.put(url, json={"idle_timeout": "soon"},
                     headers={"Authorization": f"token {admin}"}, timeout=10)
    assert r.status_code == 400 and "users.xavier.idle_timeout" in r.json()["message"]
    r = requests.put(url, json=entry, headers={"Authorization": f"token {admin}"}, timeout=10)
    assert r.status_code == 200, r.text
    # the change is in the overrides file (0600), the shipped file's bytes are unchanged
    shipped: Path = hub.policies_file  # type: ignore[attr-defined]
    overrides: Path = hub.overrides_file  # type: ignore[attr-defined]
    assert shipped.read_bytes() == hub.policies_bytes  # type: ignore[attr-defined]
    assert overrides.stat().st_mode & 0o777 == 0o600
    on_disk = yaml.safe_load(overrides.read_text())
    assert on_disk["users"]["xavier"] == {"exempt": False, "idle_timeout": 1.0}
    assert "wendy" not in on_disk.get("users", {})  # only what differs from the shipped file
    # a restarted culler (the service's command line, built afresh) applies it
    restarted = IdleCuller()
    restarted.initialize(["--policies", str(shipped), "--overrides", str(overrides)])
    pol = restarted.build().policies.resolve("xavier")
    assert (pol.idle_timeout, pol.sources["idle_timeout"]) == (1.0, "user:xavier")
    assert restarted.policies.resolve("wendy").idle_timeout == 2  # the shipped entries too
    mine_ = service_get(hub, "api/policy", xavier).json()
    assert mine_["policy"]["idle_timeout"] == {"value": 1.0, "source": "user:xavier"}
    hub.wait_stopped("xavier", timeout=60)  # exempt globally: only the new policy culls it


def test_service_page_through_hub_oauth(hub: CullerHub) -> None:
    """A browser: log in to the hub, open the service, follow the OAuth redirects."""
    s = requests.Session()
    r = s.get(f"{hub.url}/hub/login", timeout=10)
    xsrf = s.cookies.get("_xsrf", "")
    r = s.post(f"{hub.url}/hub/login", data={"username": "xavier", "password": "x",
                                               "_xsrf": xsrf}, timeout=10)
    assert r.status_code == 200, r.text
    r = s.get(f"{hub.url}/services/idle-culler/", timeout=10)
    # the page for people (HTML in the hub's look), which reads the JSON API with the cookie
    assert r.status_code == 200 and r.url.endswith("/services/idle-culler/"), r.url
    assert r.headers["Content-Type"].startswith("text/html")
    assert 'data-prefix="/services/idle-culler/"' in r.text and "Your servers." in r.text
    assert '<link rel="stylesheet" href="/hub/static/css/style.min.css">' in r.text
    r = s.get(f"{hub.url}/services/idle-culler/api/status", timeout=10)
    assert all(x["user"] == "xavier" for x in r.json()["servers"])


def browser_login(hub: CullerHub, user: str) -> tuple[requests.Session, str]:
    """A browser session: logged in to the hub as ``user``, the service's OAuth cookie set
    by opening its page; returns it and the page's XSRF token (its ``xsrf-token`` meta)."""
    import re

    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=10)
    r = s.post(f"{hub.url}/hub/login", data={"username": user, "password": "x",
                                               "_xsrf": s.cookies.get("_xsrf", "")},
               timeout=10)
    assert r.status_code == 200, r.text
    r = s.get(f"{hub.url}/services/idle-culler/", timeout=10)
    assert r.status_code == 200 and r.url.endswith("/services/idle-culler/"), r.url
    m = re.search(r'<meta name="xsrf-token" content="([^"]+)">', r.text)
    assert m, r.text[:500]
    return s, m.group(1)


def test_service_xsrf_not_skipped_for_a_bogus_authorization_header(hub: CullerHub) -> None:
    """A cross-site replay: an admin's login cookie plus ``Authorization: token bogus`` and
    no XSRF token is refused like the cookie alone; only a valid token exempts a request
    from the XSRF check; the cookie with the page's XSRF token works."""
    hub.ensure_user("admin")
    admin = hub.user_token("admin")
    session, xsrf = browser_login(hub, "admin")
    base = f"{hub.url}/services/idle-culler/api/policies"
    url = f"{base}/users/xsrf-target"
    entry = {"exempt": True}

    def users() -> dict[str, Any]:
        r = requests.get(base, headers={"Authorization": f"token {admin}"}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["users"]

    r = requests.put(f"{base}/users/xsrf-keep", json=entry,
                     headers={"Authorization": f"token {admin}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert session.put(url, json=entry, timeout=10).status_code == 403  # cookie, no XSRF
    for bogus in ("token bogus", "token ", "Bearer nonsense", "Basic YWRtaW46eA=="):
        r = session.put(url, json=entry, headers={"Authorization": bogus}, timeout=10)
        assert r.status_code == 403, (bogus, r.status_code, r.text)
        r = session.delete(f"{base}/users/xsrf-keep", headers={"Authorization": bogus},
                           timeout=10)
        assert r.status_code == 403, (bogus, r.status_code, r.text)
    assert "xsrf-target" not in users() and "xsrf-keep" in users()
    # the cookie with the page's XSRF token (what the page's own fetch() sends): accepted
    r = session.put(url, json=entry, headers={"X-XSRFToken": xsrf}, timeout=10)
    assert r.status_code == 200, r.text
    assert users()["xsrf-target"] == {"exempt": True}
    # a valid token and no cookie: exempt from the XSRF check
    r = requests.put(f"{base}/users/xsrf-token-only", json=entry,
                     headers={"Authorization": f"token {admin}"}, timeout=10)
    assert r.status_code == 200, r.text
    for name in ("xsrf-target", "xsrf-token-only", "xsrf-keep"):
        r = requests.delete(f"{base}/users/{name}", headers={"Authorization": f"token {admin}"},
                            timeout=10)
        assert r.status_code == 200, r.text
    assert not {"xsrf-target", "xsrf-token-only", "xsrf-keep"} & set(users())


def test_cli_once_dry_run(hub: CullerHub, tmp_path: Path) -> None:
    """``python -m idle_culler --once --dry-run``: one pass, reports, culls nothing."""
    import os
    import subprocess
    import sys

    start_servers(hub, [("cli-user", "", ())])
    pol = tmp_path / "p.yaml"
    pol.write_text(yaml.safe_dump({"global": {"exempt": True},
                                   "users": {"cli-user": {"exempt": False}}}))
    log_file = tmp_path / "culls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env["JUPYTERHUB_API_TOKEN"] = CULLER_TOKEN
    r = subprocess.run(
        [sys.executable, "-m", "idle_culler", "--once", "--dry-run", "--url", hub.api_url,
         "--policies", str(pol), "--timeout", "0.5", "--cull-log", str(log_file)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
        env=env)
    assert r.returncode == 0, r.stderr
    assert "would cull cli-user/: idle" in r.stderr
    rec = [json.loads(x) for x in log_file.read_text().splitlines()]
    assert [(x["user"], x["reason"], x["dry_run"]) for x in rec] == [("cli-user", "idle", True)]
    assert rec[0]["policy_source"]["idle_timeout"] == "cli"
    assert hub.server("cli-user") is not None
