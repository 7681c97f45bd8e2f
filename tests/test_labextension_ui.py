"""The lab extension (labextension/) in a real ``jupyter lab`` from the venv, in Debian's
Chromium driven by playwright-core (labextension/ui-tests/screenshot.mjs): the status bar item
is there, clicking it opens the side panel, and the panel shows data or a clear state.

- without the server extension (gpuspawner.singleuser.gpuviews disabled): the item says
  "GPU: unavailable" and the panel explains that the server extension did not answer (404);
- with the server extension: whatever it reports here (on a machine without NVML the
  "NVML unavailable" state); the screenshot is var/screenshots/labextension-panel.png, copied to
  docs/labextension-panel.png when that is missing or GPUSPAWNER_UPDATE_DOCS=1;
- with sample data answered in the browser (page.route): GPU cards with charts, the process
  table, the allocation warning and the cull warning.

Skips with a reason when the extension is not built (scripts/build-labextension.sh), its
node_modules (playwright-core) are missing, or /usr/bin/chromium is missing (make test-tools).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.hubrunner import free_port

REPO = Path(__file__).resolve().parents[1]
EXT = REPO / "labextension"
BUILT = REPO / "gpuspawner" / "labextension_static"
SCRIPT = EXT / "ui-tests" / "screenshot.mjs"
SCREENSHOTS = REPO / "var" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
JUPYTER = Path(sys.executable).parent / "jupyter"


def _skip_reasons() -> list[str]:
    reasons = []
    if not (BUILT / "package.json").exists():
        reasons.append("the lab extension is not built (scripts/build-labextension.sh)")
    if not (EXT / "node_modules" / "playwright-core").exists():
        reasons.append("labextension/node_modules has no playwright-core "
                       "(scripts/build-labextension.sh --deps)")
    if not shutil.which("node"):
        reasons.append("node is not installed (scripts/install-chp.sh --node-only)")
    if not os.access(CHROMIUM, os.X_OK):
        reasons.append(f"{CHROMIUM} is missing (make test-tools)")
    if importlib.util.find_spec("jupyterlab") is None or not JUPYTER.exists():
        reasons.append("jupyterlab is not installed in the venv (make venv)")
    return reasons


pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(bool(_skip_reasons()), reason="; ".join(_skip_reasons()))]




class Lab:
    """``jupyter lab`` on 127.0.0.1 with a token, in its own Jupyter dirs, with the built
    extension first on the labextensions path (JUPYTER_DATA_DIR/labextensions/
    gpuspawner-labextension links to gpuspawner/labextension_static)."""

    def __init__(self, tmp: Path, server_extension: bool, env_extra: dict | None = None):
        self.tmp = tmp
        self.port = free_port()
        self.token = secrets.token_hex(16)
        for d in ("config", "data", "runtime", "root"):
            (tmp / d).mkdir()
        # JUPYTER_DATA_DIR comes first on the labextensions path, before the venv's
        # share/jupyter (where an editable install may hold an older copy): the first wins
        labext = tmp / "data" / "labextensions"
        labext.mkdir()
        (labext / "gpuspawner-labextension").symlink_to(BUILT, target_is_directory=True)
        env = dict(os.environ, **(env_extra or {}))
        env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
                   JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_PLATFORM_DIRS="1",
                   # jupyter_core puts the venv's dirs before the user's inside a venv
                   # unless told not to
                   JUPYTER_PREFER_ENV_PATH="0")
        # the user config dir wins over the venv's etc/jupyter/jupyter_server_config.d
        (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps({
            "ServerApp": {"jpserver_extensions": {
                "gpuspawner.singleuser.gpuviews": server_extension}},
            "LabApp": {"news_url": None,
                       "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
        }))
        self.log = (tmp / "lab.log").open("wb")
        self.proc = subprocess.Popen(
            [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             "--port-retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={tmp / 'root'}", "--allow-root"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {self.logtext()[-3000:]}")
            try:
                r = requests.get(self.base + "api/status", params={"token": self.token}, timeout=2)
                if r.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer: {self.logtext()[-3000:]}")
            time.sleep(0.3)

    @property
    def url(self) -> str:
        return f"{self.base}lab?token={self.token}"

    def fresh_workspace_url(self) -> str:
        """The lab URL of a workspace no page has used yet: JupyterLab keeps each workspace's
        layout on the server and restores it, so a panel an earlier test opened in the same lab
        would be open from the start (its polling then runs on the open panel's schedule)."""
        return f"{self.base}lab/workspaces/t{secrets.token_hex(4)}?token={self.token}"

    def logtext(self) -> str:
        self.log.flush()
        return (self.tmp / "lab.log").read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture(scope="module")
def lab_plain(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("lab-plain"), server_extension=False)
    yield lab
    lab.stop()


def shoot(lab: Lab, name: str, *flags: str) -> tuple[dict, Path]:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out = SCREENSHOTS / name
    out.unlink(missing_ok=True)
    p = subprocess.run(["node", str(SCRIPT), lab.fresh_workspace_url(), str(out), *flags], cwd=EXT,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, (f"screenshot.mjs failed:\n{p.stderr[-4000:]}\n"
                               f"lab log:\n{lab.logtext()[-3000:]}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.stat().st_size > 10_000
    assert result["pageErrors"] == []
    return result, out


def test_extension_is_listed(lab_plain):
    r = requests.get(lab_plain.base + "lab/api/extensions",
                     params={"token": lab_plain.token}, timeout=10)
    assert r.status_code == 200
    names = {e["name"]: e for e in r.json()}
    assert "gpuspawner-labextension" in names
    assert names["gpuspawner-labextension"]["enabled"]
    # the page loads this build (not an older copy elsewhere on the labextensions path)
    built = json.loads((BUILT / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    page = requests.get(lab_plain.url, timeout=10).text
    assert built in page


def test_panel_without_server_extension_shows_the_error(lab_plain):
    result, _ = shoot(lab_plain, "labextension-panel-no-server-extension.png")
    assert result["status"] == "GPU: unavailable"
    assert result["statusLevel"] == "error"
    assert result["panelState"] == "unreachable"
    assert "GPU data unavailable" in result["panelText"]
    assert "HTTP 404" in result["panelText"]
    assert "not installed or not enabled" in result["panelText"]


def test_panel_with_sample_data(lab_plain):
    result, _ = shoot(lab_plain, "labextension-panel-sample.png", "--sample")
    assert result["status"] == "2 GPUs 79% · 36.2/80.0 GiB"
    assert result["statusLevel"] == "warn"
    assert result["panelState"] == "ok"
    assert result["gpuCards"] == 2
    assert result["chartPaths"] == 4
    assert result["processRows"] == 3
    assert "will be stopped by the idle culler in 1" in result["cull"]
    assert "idle for 46 min" in result["cull"]
    assert len(result["warnings"]) == 1
    assert "NVIDIA A100-SXM4-40GB" in result["panelText"]
    assert "PCI 00000000:07:00.0" in result["panelText"]
    # polling: every 5 s with only the status item, at once and then every 2 s with the panel
    print("metrics requests, ms from opening the panel:", result["metricsRequests"])
    # and every 5 s again once the panel is closed
    times, closed = result["metricsRequests"], result["closedAt"]
    print("panel closed at", closed)

    def gaps(ts: list[int]) -> list[int]:
        return [b - a for a, b in zip(ts, ts[1:], strict=False)]

    before = [t for t in times if t < 0]
    opened = [t for t in times if 0 <= t < closed]
    after = [t for t in times if t >= closed]
    assert gaps(before) and all(4500 <= g <= 6500 for g in gaps(before)), times
    assert opened and opened[0] < 1000, times
    assert len(gaps(opened)) >= 3 and all(1500 <= g <= 3000 for g in gaps(opened)), times
    # the first tick after closing may still come on the 2 s schedule
    assert len(after) >= 2 and all(4500 <= g <= 6500 for g in gaps(after)[1:]), times
    assert gaps(after)[-1] >= 4500, times


class _FakeUsageService:
    """The gpuspawner service's two usage answers (api/usage, api/usage/budgets) on a
    loopback port, in a thread; records the Authorization headers it was sent."""

    def __init__(self) -> None:
        import http.server
        import threading

        tokens = self.tokens = []
        report = {"from": "2026-11-01T00:00:00+00:00", "rows": [],
                  "totals": {"gpu_hours": 12.5, "core_hours": 40.0}}
        budgets = {"user": "me", "budgets": [
            {"name": "default", "unit": "gpu_hours", "used": 12.5, "limit": 15.0,
             "percent": 83.3, "renews_at": "2026-12-01T00:00:00+00:00", "warning": True,
             "exceeded": False}]}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                tokens.append(self.headers.get("Authorization"))
                path = self.path.split("?")[0]
                doc = {"/svc/api/usage": report, "/svc/api/usage/budgets": budgets}.get(path)
                body = json.dumps(doc if doc is not None else {"gpu_share_notices": []})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/svc/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_panel_with_the_server_extension(tmp_path):
    spec = importlib.util.find_spec("gpuspawner.singleuser.gpuviews")
    if spec is None:
        pytest.skip("gpuspawner.singleuser.gpuviews (the server extension) is not there yet")
    # the server started with a quarter of an 80 GB GPU under the watchdog (the environment
    # gpuspawner.gpushare.mechanism.share_limits gives it): the panel says what that gives
    share_env = {"GPUSPAWNER_GPU_MEMORY_LIMIT": str(20 * 2**30),
                 "GPUSPAWNER_GPU_MEMORY_FRACTION": "0.250",
                 "GPUSPAWNER_GPU_SHARE_MECHANISM": "watchdog"}
    # and a gpuspawner service (a stand-in on loopback) that reports the user's own usage
    service = _FakeUsageService()
    share_env.update(GPUSPAWNER_SERVICE_URL=service.url, JUPYTERHUB_API_TOKEN="tok")
    lab = Lab(tmp_path, server_extension=True, env_extra=share_env)
    try:
        r = requests.get(lab.base + "api/gpuspawner/gpus", params={"token": lab.token},
                         timeout=10)
        if r.status_code == 404:
            pytest.skip("gpuspawner.singleuser.gpuviews does not serve api/gpuspawner/gpus yet")
        assert r.status_code == 200, r.text
        served = r.json()
        result, shot = shoot(lab, "labextension-panel.png")
    finally:
        lab.stop()
        service.stop()
    assert result["panelState"] == served["state"]
    assert "This month: 12.5 GPU-hours, 40.0 core-hours" in result["panelText"]
    assert "Budget default: 12.5 of 15.0 GPU-hours (83 %), renews 2026-12-01" in \
        result["panelText"]
    assert service.tokens and set(service.tokens) == {"token tok"}
    assert served["share"]["text"].startswith("1/4 of a GPU: 20 GiB of GPU memory")
    assert f"Your GPU share: {served['share']['text']}" in result["panelText"]
    expected_status = {
        "no_nvml": "GPU: NVML unavailable", "no_gpu": "GPU: no GPU",
        "permission": "GPU: no permission", "error": "GPU: error",
    }
    if served["state"] in expected_status:
        assert result["status"] == expected_status[served["state"]]
    else:
        assert result["status"].startswith(("GPU ", "GPU:", f"{len(served['gpus'])} GPUs"))
        assert result["gpuCards"] >= 1
    # docs/ keeps a committed copy; refresh it on request, not on every run
    docs = REPO / "docs" / "labextension-panel.png"
    if not docs.exists() or os.environ.get("GPUSPAWNER_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, docs)
