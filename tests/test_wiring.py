"""``wire_hub`` (issue 43, item 2): one call sets the culler service with its signals, the
scopes, roles and servers' environment, keeping what the site's file set before it. The
running service and the jobs listener are exercised by every real-hub test through
hub_config/jupyterhub_config.py; here the configuration is loaded without an event loop (as
``jupyterhub --help-all`` does), so the service itself is not started."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from jupyterhub.app import JupyterHub
from traitlets.config import Config
from traitlets.config.loader import LazyConfigValue

from gpuspawner.hub.collector import HUB_GC_THRESHOLD, check_gc_threshold
from gpuspawner.hub.wiring import HUB_TEMPLATES, culler_docker_urls, wire_hub
from gpuspawner.usage.home import HomeFigures


@pytest.fixture(autouse=True)
def _keep_gc_threshold():
    """wire_hub sets this process's collector thresholds, as in the hub: put them back."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def _list(value, initial=None):
    """A list (or dict) setting as the hub will see it (one appended to while unset is
    lazy)."""
    initial = [] if initial is None else initial
    return value.get_value(initial) if isinstance(value, LazyConfigValue) else value


def _culler(c: Config) -> dict:
    (svc,) = [s for s in _list(c.JupyterHub.services) if s["name"] == "idle-culler"]
    return svc


def test_the_culler_gets_each_docker_nodes_engine_and_the_gpu_signals(tmp_path: Path) -> None:
    c = Config()
    c.GPUSpawner.nodes = [{"name": "a", "docker_url": ""},
                          {"name": "b", "docker_url": "tcp://gpu-2:2376"}]
    c.DockerBackend.tls_cert_path = "/etc/gpuspawner/docker-tls"
    w = wire_hub(c, listen_ip="198.18.0.1", connect_ip="hub.example.org", state_dir=tmp_path,
                 culler_policies=tmp_path / "p.yaml", culler_port=8123, nvml=True,
                 dcgm_urls=["http://gpu-2:9400/metrics"])
    assert w.service is None and w.culler_url == "http://198.18.0.1:8123"
    cmd = _culler(c)["command"]
    assert cmd[1:3] == ["-m", "idle_culler"]
    pairs = list(zip(cmd, cmd[1:], strict=False))
    assert ("--docker-url", "b=tcp://gpu-2:2376") in pairs
    assert ("--docker-tls-cert-path", "/etc/gpuspawner/docker-tls") in pairs
    assert ("--dcgm-url", "http://gpu-2:9400/metrics") in pairs and "--nvml" in cmd
    assert ("--policies", str(tmp_path / "p.yaml")) in pairs
    assert ("--cull-log", str(tmp_path / "culls.jsonl")) in pairs
    # servers are told the connect address, not the listen address
    assert _list(c.GPUSpawner.environment, {})["GPUSPAWNER_CULLER_URL"] == \
        "http://hub.example.org:8123/services/idle-culler/"
    (role,) = [r for r in _list(c.JupyterHub.load_roles) if r["name"] == "idle-culler"]
    assert "delete:servers" in role["scopes"] and role["services"] == ["idle-culler"]
    assert "admin:users" not in role["scopes"]


def test_what_the_site_set_before_is_kept(tmp_path: Path) -> None:
    c = Config()
    c.JupyterHub.services = [{"name": "site-service", "api_token": "x" * 32}]
    c.GPUSpawner.environment = {"SITE": "1"}
    c.Spawner.server_token_scopes = ["users:activity!user", "read:users:name!user"]
    c.JupyterHub.template_paths = ["/srv/site-templates"]
    c.JupyterHub.template_vars = {"site": "x"}
    wire_hub(c, listen_ip="127.0.0.1", state_dir=tmp_path, culler_port=8124)
    # the home page's own usage: after the site's templates (its home.html wins)
    assert c.JupyterHub.template_paths == ["/srv/site-templates", str(HUB_TEMPLATES)]
    assert c.JupyterHub.template_vars["site"] == "x"
    assert isinstance(c.JupyterHub.template_vars["gpuspawner_usage"], HomeFigures)
    assert [s["name"] for s in _list(c.JupyterHub.services)] == ["site-service", "idle-culler"]
    assert c.GPUSpawner.environment["SITE"] == "1"
    assert "GPUSPAWNER_CULLER_URL" in c.GPUSpawner.environment
    assert c.Spawner.server_token_scopes == ["users:activity!user", "read:users:name!user",
                                             "access:services!service=idle-culler"]


def test_the_home_template_comes_before_jupyterhubs_own(tmp_path: Path) -> None:
    """Without a site's list, gpuspawner's folder goes before JupyterHub's default one (which
    JupyterHub's loader would otherwise find home.html in first)."""
    c = Config()
    wire_hub(c, listen_ip="127.0.0.1", state_dir=tmp_path, culler=False)
    hub = JupyterHub(config=c)
    assert hub.template_paths[0] == str(HUB_TEMPLATES)
    assert hub.template_paths[1:] == JupyterHub().template_paths


def test_without_the_culler_and_on_slurm(tmp_path: Path) -> None:
    c = Config()
    c.GPUSpawner.backend = "slurm"
    c.GPUSpawner.nodes = [{"name": "node1"}]
    assert culler_docker_urls(c) == []
    w = wire_hub(c, listen_ip="127.0.0.1", state_dir=tmp_path, culler=False,
                 internal_ssl=True)
    assert w.culler_url is None and w.service_url_for_servers is None
    assert not any(s.get("name") == "idle-culler" for s in _list(c.JupyterHub.services))
    # JupyterHub's default scopes, nothing more
    assert c.Spawner.server_token_scopes == ["users:activity!user", "access:servers!server"]


def test_the_hub_process_gets_the_collectors_thresholds(tmp_path: Path) -> None:
    """The hub process collects generation 0 every 10,000 allocations instead of 700 (a
    1,000-server hub made no full collection after its start instead of six,
    docs/benchmarks.md); ``gc_threshold=None`` keeps Python's; a bad value stops the
    configuration with the argument named, before anything is set."""
    gc.set_threshold(700, 10, 10)
    wire_hub(Config(), listen_ip="127.0.0.1", state_dir=tmp_path, culler=False)
    assert gc.get_threshold() == HUB_GC_THRESHOLD == (10_000, 10, 10)
    gc.set_threshold(700, 10, 10)
    wire_hub(Config(), listen_ip="127.0.0.1", state_dir=tmp_path, culler=False,
             gc_threshold=None)
    assert gc.get_threshold() == (700, 10, 10)
    wire_hub(Config(), listen_ip="127.0.0.1", state_dir=tmp_path, culler=False,
             gc_threshold=[5000, 20, 10])
    assert gc.get_threshold() == (5000, 20, 10)
    gc.set_threshold(700, 10, 10)
    c = Config()
    for bad, says in (((0, 10, 10), "item 0 (0)"), ((10_000, 10), "not three integers"),
                      ("10000,10,10", "not three integers"), ((10_000, True, 10), "item 1"),
                      ((10_000, 10, 2.5), "item 2 (2.5)")):
        with pytest.raises(ValueError, match=r"wire_hub\(gc_threshold=\.\.\.\)") as e:
            wire_hub(c, listen_ip="127.0.0.1", state_dir=tmp_path, culler=False,
                     gc_threshold=bad)
        assert says in str(e.value), (bad, str(e.value))
        assert gc.get_threshold() == (700, 10, 10)
    assert "services" not in c.JupyterHub  # refused before anything was set
    assert check_gc_threshold((1, 1, 1)) == (1, 1, 1)
