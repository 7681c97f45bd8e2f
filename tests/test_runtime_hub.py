"""The hub's one runtime (nodes, ledger, backend, queue, drains), made once at hub start from
the configuration the hub finally runs with, after every file is loaded; spawners and the
service get that object from the hub application (gpuspawner.hub.runtime)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.hubrunner import Hub
from tests.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]
#: the tests' admin token may use the gpuspawner service's admin view
SERVICE_ACCESS = ('c.JupyterHub.load_roles.append({"name": "rt-service", "services": '
                  '["gpuspawner-admin"], "scopes": ["access:services", '
                  '"custom:gpuspawner:admin"]})\n')
CHECK = "from gpuspawner.hub.config_check import check_hub_config\ncheck_hub_config(c)\n"


def admin_hub(tmp: Path, extra: str) -> Hub:
    """A hub whose config is an admin's: the shipped file through ``load_subconfig``, then
    ``extra``, and no call of gpuspawner's check at the end."""
    h = Hub(tmp, [{"name": "local", "topology": "auto"}], PROFILES, extra_config=extra)
    h.config.write_text(h.config.read_text().replace(CHECK, ""))
    h.env["GPUSPAWNER_CULLER"] = "off"
    return h


def run_until_exit(h: Hub, timeout: float = 60) -> tuple[int, str]:
    """Start the hub expecting it to stop by itself; (exit code, its log)."""
    with open(h.log_path, "ab") as log:
        proc = subprocess.run([sys.executable, "-m", "jupyterhub", "-f", str(h.config)],
                              cwd=h.state_dir, env=h.env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, h.log_path.read_text(errors="replace")


@pytest.mark.parametrize("extra, named", [
    ('c.GPUSpawner.placement_policy = "no-such-policy"\n',
     "GPUSpawner.placement_policy: unknown policy 'no-such-policy'"),
    ('c.GPUSpawner.profiles = [{"slug": "x", "cpu": 1, "memory": "1G", '
     '"profile_options": {"cpu_limit": {}}}]\n', "profile_options.cpu_limit: unknown field"),
    ("c.GPUSpawner.quotas = {'users': {'ann': {'gpus': -1}}}\n", "GPUSpawner.quotas.users.ann"),
])
def test_a_bad_setting_after_load_subconfig_stops_the_hub_naming_it(tmp_path, extra, named):
    code, log = run_until_exit(admin_hub(tmp_path, extra))
    assert code != 0, log[-2000:]
    assert named in log, log[-2000:]
    assert "JupyterHub is now running" not in log


def test_services_appended_after_load_subconfig_reach_the_hub(tmp_path):
    token = "b" * 40
    h = admin_hub(tmp_path, f'c.JupyterHub.services.append({{"name": "bar", '
                            f'"api_token": "{token}"}})\n'
                            'c.JupyterHub.load_roles.append({"name": "bar", "services": '
                            '["bar"], "scopes": ["list:users"]})\n')
    h.start()
    try:
        r = h.api("GET", "/user", token=token)
        assert r.status_code == 200 and r.json()["name"] == "bar", r.text
        assert h.api("GET", "/users", token=token).status_code == 200  # its role arrived
        # and gpuspawner's own service, appended by the shipped file, is there too
        r = requests.get(f"{h.url}/services/gpuspawner/api/openapi.json", timeout=10,
                         headers={"Authorization": f"token {h.token}"})
        assert r.status_code in (200, 403), r.text  # it answers: it exists
    finally:
        h.stop()


def test_the_service_and_the_spawners_share_the_runtime_made_at_start(tmp_path, engine_client):
    """The runtime is built once at start; a service call before any spawn answers from it,
    and the first spawn books in the same ledger."""
    h = admin_hub(tmp_path, SERVICE_ACCESS)
    h.start()
    try:
        log = h.log_path.read_text(errors="replace")
        assert log.count("gpuspawner runtime ready") == 1, log[-3000:]
        r = requests.get(f"{h.url}/services/gpuspawner/api/nodes", timeout=10,
                         headers={"Authorization": f"token {h.token}"})
        assert r.status_code == 200, r.text
        h.ensure_user("rt-ann")
        assert h.api("POST", "/users/rt-ann/server", {"profile": "cpu"}).status_code in (201,
                                                                                          202)
        h.wait_ready("rt-ann")
        allocs = wait_until(lambda: requests.get(
            f"{h.url}/services/gpuspawner/api/allocations", timeout=10,
            headers={"Authorization": f"token {h.token}"}).json(), 30, 0.3, "allocations")
        assert len(allocs) == 1 and "rt-ann" in json.dumps(allocs)
        assert "differ from the hub's" not in h.log_path.read_text(errors="replace")
        h.api("DELETE", "/users/rt-ann/server")
        h.wait_stopped("rt-ann")
    finally:
        h.stop()
        for c in engine_client.containers(all=True,
                                          filters={"label": "gpuspawner.user=rt-ann"}):
            engine_client.remove_container(c["Id"], force=True)


@pytest.fixture(scope="module")
def engine_client():
    docker = pytest.importorskip("docker")
    return docker.APIClient(version="auto")
