"""The Docker engine and the single-user image, for real (marked ``docker``).

Needs the engine from ``scripts/dockerd.sh`` (``make engine``) and the image from
``scripts/build-images.sh`` (``make images``); skips with the reason when either is missing.
Containers use host networking only; the one server started here listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.hubrunner import free_port

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")
BTRFS_HOST = f"unix://{REPO / 'var' / 'run' / 'docker-btrfs.sock'}"
UID_GID = "12345:12345"
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?\S*$", re.MULTILINE)


def docker(*args: str, host: str | None = None, timeout: float = 120, check: bool = True):
    cmd = ["docker"] + (["-H", host] if host else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def engine_info(host: str | None = None) -> dict | None:
    if shutil.which("docker") is None:
        return None
    try:
        proc = docker("info", "--format", "{{json .}}", host=host, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout)
    # `docker info` exits 0 with ServerErrors when the client cannot reach the daemon
    return None if info.get("ServerErrors") or not info.get("ID") else info


@pytest.fixture(scope="module")
def info() -> dict:
    found = engine_info()
    if found is None:
        pytest.skip("no Docker engine answers `docker info`; start one with `make engine`")
    return found


@pytest.fixture(scope="module")
def image(info) -> str:
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        pytest.skip(f"image {IMAGE} missing; build it with `make images`")
    return IMAGE


def run(image: str, *cmd: str, opts: tuple[str, ...] = (), host: str | None = None):
    name = f"gpuspawner-test-{uuid.uuid4().hex[:10]}"
    try:
        return docker(
            "run", "--rm", "--name", name, "--network", "host", *opts, image, *cmd, host=host
        )
    finally:
        docker("rm", "-f", name, host=host, check=False)




# --------------------------------------------------------------------------- engine


def test_engine_has_no_default_bridge(info):
    names = docker("network", "ls", "--format", "{{.Name}}").stdout.split()
    assert "bridge" not in names, (
        "the engine created the default bridge network (172.17.0.0/16); "
        "start dockerd with --bridge=none --iptables=false (scripts/dockerd.sh)"
    )
    assert "host" in names
    assert info["CgroupDriver"] in {"cgroupfs", "systemd"}


# --------------------------------------------------------------------------- image


def test_singleuser_version_as_arbitrary_uid(image):
    opts = ("--user", UID_GID, "-e", "HOME=/tmp")
    out = run(image, "jupyterhub-singleuser", "--version", opts=opts).stdout.strip()
    assert VERSION_RE.search(out), out
    try:
        import jupyterhub
    except ImportError:
        pass
    else:  # the image pins the hub's own version
        assert out.splitlines()[-1] == jupyterhub.__version__
    lab = run(image, "jupyter", "lab", "--version", opts=opts).stdout.strip()
    assert VERSION_RE.search(lab), lab
    assert lab.split(".")[0] == "4", lab


def test_image_has_no_fixed_user_and_a_venv_on_path(image):
    cfg = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert cfg["User"] in {"", "65534:65534"}
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PATH"].startswith("/opt/venv/bin")
    assert env["JUPYTER_RUNTIME_DIR"].startswith("/tmp")
    assert "org.gpuspawner.inputs-hash" in (cfg.get("Labels") or {})
    out = run(
        image,
        "sh",
        "-c",
        "id -u; id -g; command -v jupyterhub-singleuser",
        opts=("--user", UID_GID),
    ).stdout.split()
    assert out == ["12345", "12345", "/opt/venv/bin/jupyterhub-singleuser"]


def test_server_runs_as_arbitrary_uid_with_mounted_home(image, tmp_path):
    """JupyterLab starts as uid 12345 with HOME on a bind mount and answers on loopback."""
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 12345, 12345)
    port = free_port()
    name = f"gpuspawner-test-{uuid.uuid4().hex[:10]}"
    docker(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--user",
        UID_GID,
        "-e",
        f"HOME={home}",
        "-v",
        f"{home}:{home}",
        image,
        "jupyter",
        "lab",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--no-browser",
        "--ServerApp.port_retries=0",
    )
    try:
        deadline = time.monotonic() + 60
        body = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2) as r:
                    body = json.load(r)
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
                if state != "true":
                    break
                time.sleep(0.5)
        logs = docker("logs", name, check=False)
        assert body is not None, f"server did not answer:\n{logs.stdout}\n{logs.stderr}"
        assert "version" in body
        # user files land in the mounted home, owned by the user; runtime files do not
        created = {p.name for p in home.iterdir()}
        assert "jupyter-runtime" not in created
        for p in home.rglob("*"):
            assert p.stat().st_uid == 12345, p
    finally:
        docker("rm", "-f", name, check=False)


def test_cpuset_and_memory_limits_enforced(image):
    script = (
        "nproc; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
        "|| cat /sys/fs/cgroup/memory.max"
    )
    out = run(
        image,
        "sh",
        "-c",
        script,
        opts=("--cpuset-cpus", "0", "--memory", "256m", "--user", UID_GID),
    ).stdout.split()
    assert out == ["1", str(256 * 1024 * 1024)]


# --------------------------------------------------------------------------- btrfs engine


def test_btrfs_engine_enforces_disk_quota(image):
    """Only with `make btrfs-engine`: storage_opt size limits a container's writable layer."""
    info = engine_info(BTRFS_HOST)
    if info is None:
        pytest.skip(f"no btrfs engine at {BTRFS_HOST}; start it with `make btrfs-engine`")
    assert info["Driver"] == "btrfs"
    if docker("image", "inspect", image, host=BTRFS_HOST, check=False).returncode != 0:
        pytest.skip(f"{image} not loaded into the btrfs engine; rerun `make btrfs-engine`")
    # the btrfs qgroup counts the image's own bytes too: allow image + 64 MiB, write 128 MiB
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image, host=BTRFS_HOST).stdout)
    limit_mb = size // (1024 * 1024) + 64
    script = (
        "dd if=/dev/zero of=/tmp/fill bs=1M count=128 2>&1; echo rc=$?; "
        "ls -l /tmp/fill | awk '{print \"bytes=\" $5}'"
    )
    out = run(
        image,
        "sh",
        "-c",
        script,
        host=BTRFS_HOST,
        opts=("--storage-opt", f"size={limit_mb}M", "--user", UID_GID),
    ).stdout
    assert "rc=1" in out, out
    assert "Disk quota exceeded" in out or "No space left" in out, out
    written = int(re.search(r"bytes=(\d+)", out).group(1))
    assert written < 128 * 1024 * 1024


def test_image_has_the_gpu_views_enabled(image):
    """The single-user image ships the server extension, the prebuilt lab extension and the
    kernel extension of this project, enabled (issue 5)."""
    out = run(image, "sh", "-c",
              "jupyter server extension list 2>&1; jupyter labextension list 2>&1; "
              "python -c 'import gpuspawner.kernel, gpuspawner.singleuser.gpuviews; "
              "print(\"imports-ok\")'",
              opts=("--user", UID_GID, "-e", "HOME=/tmp")).stdout
    assert re.search(r"gpuspawner\.singleuser\.gpuviews\s+\S*enabled", out), out
    assert re.search(r"gpuspawner-labextension v[\d.]+\s+\S*enabled", out), out
    assert "imports-ok" in out


def test_image_turns_the_news_pop_up_off(image):
    """JupyterLab's overrides.json in the image's app settings folder (JupyterLab docs,
    "Overriding default settings"): no news pop-up, no update check (issue 16). The folder is
    the one JupyterLab itself reports, not a path assumed here."""
    out = run(image, "python", "-c",
              "import json, pathlib; from jupyterlab.commands import get_app_dir; "
              "p = pathlib.Path(get_app_dir()) / 'settings' / 'overrides.json'; "
              "print(json.dumps(json.loads(p.read_text())))",
              opts=("--user", UID_GID, "-e", "HOME=/tmp")).stdout
    notes = json.loads(out.strip().splitlines()[-1])["@jupyterlab/apputils-extension:notification"]
    assert notes == {"fetchNews": "false", "checkForUpdates": False}


# --------------------------------------------------------------------------- build stages

DEPS_IMAGE = os.environ.get("GPUSPAWNER_DEPS_IMAGE", "gpuspawner/singleuser:deps")
# what the project stage adds on top of its deps stage: the project's wheel installed (a few
# MB) and two config files; the 125 third-party wheels (~430 MB) belong below it
PROJECT_STAGE_MAX_BYTES = 50 * 1024 * 1024


def image_config(image: str, host: str | None = None) -> dict:
    return json.loads(docker("image", "inspect", image, host=host).stdout)[0]


def assert_stage_below(lower: str, upper: str) -> None:
    """``upper`` is ``lower`` plus a project-sized top (scripts/lib.sh build_project_stage):
    ``lower``'s layers are the first of ``upper``'s and the rest weigh less than
    PROJECT_STAGE_MAX_BYTES; so a change to the project's code rebuilds only that top."""
    low, up = image_config(lower), image_config(upper)
    low_layers, up_layers = low["RootFS"]["Layers"], up["RootFS"]["Layers"]
    assert up_layers[: len(low_layers)] == low_layers, (
        f"{upper} is not built on {lower} (scripts/build-images.sh builds it in stages)")
    assert len(up_layers) > len(low_layers)
    assert 0 < up["Size"] - low["Size"] < PROJECT_STAGE_MAX_BYTES, (up["Size"], low["Size"])


def test_singleuser_image_is_the_project_wheel_on_the_deps_stage(image):
    """gpuspawner/singleuser:latest is the deps stage (every third-party package, fingerprinted
    by the requirements and the base image only) plus the project's wheel: the deps stage has
    no gpuspawner and its own fingerprint label; the project stage passes `pip check`."""
    if docker("image", "inspect", DEPS_IMAGE, check=False).returncode != 0:
        raise AssertionError(f"{image} exists but its deps stage {DEPS_IMAGE} does not; "
                             "rebuild with `make images`")
    labels = image_config(DEPS_IMAGE)["Config"].get("Labels") or {}
    assert re.fullmatch(r"[0-9a-f]{16}", labels.get("org.gpuspawner.deps-hash", "")), labels
    assert_stage_below(DEPS_IMAGE, image)
    opts = ("--user", UID_GID, "-e", "HOME=/tmp")
    probe = ("import importlib.util as u; "
             "print(u.find_spec('gpuspawner') is not None, u.find_spec('jupyterlab') is not None)")
    deps = run(DEPS_IMAGE, "/opt/venv/bin/python", "-c", probe, opts=opts).stdout.split()
    assert deps == ["False", "True"], deps
    top = run(image, "sh", "-c", f"python -c \"{probe}\" && pip check", opts=opts).stdout
    assert top.split()[:2] == ["True", "True"], top
    assert "No broken requirements found." in top, top
