"""``scripts/registry.sh`` (``make registry``): the project's registry on loopback starts, is left
alone when it already runs, stops; and the script never stops or takes over what it did not
start. Each test runs the script against a var/ folder of its own (``GPUSPAWNER_VAR``) and a free
loopback port (``GPUSPAWNER_REGISTRY_PORT``), never the checkout's running registry."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "registry.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run(var: Path, port: int, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "GPUSPAWNER_VAR": str(var), "GPUSPAWNER_REGISTRY_PORT": str(port), **extra}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def foreign() -> Iterator[subprocess.Popen[bytes]]:
    """A process the script did not start."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def test_stop_leaves_a_process_it_did_not_start(tmp_path, foreign) -> None:
    # even with the right PID and start time in the record: its command line names no config
    # of this script's var/
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "registry.pid").write_text(f"{foreign.pid} {start_time(foreign.pid)}\n")
    proc = run(tmp_path, free_port(), "--stop")
    assert proc.returncode == 0, proc.stderr
    assert "nothing stopped" in proc.stderr
    assert foreign.poll() is None and alive(foreign.pid)


def test_a_port_held_by_another_process_is_left_alone(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run(tmp_path, port)
        assert proc.returncode == 1, proc.stderr
        assert f"127.0.0.1:{port} is taken by a process this script did not start" in proc.stderr
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # still ours, still listening
    assert not (tmp_path / "run" / "registry.pid").exists()


@pytest.mark.skipif(shutil.which("docker-registry") is None,
                    reason="needs Debian's docker-registry (make registry installs it)")
def test_start_again_and_stop(tmp_path) -> None:
    port = free_port()
    first = run(tmp_path, port)
    try:
        assert first.returncode == 0, first.stderr
        pid = int((tmp_path / "run" / "registry.pid").read_text().split()[0])
        assert (tmp_path / "run" / "registry.addr").read_text().strip() == f"127.0.0.1:{port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=5) as r:
            assert r.status == 200
            assert r.headers["Docker-Distribution-Api-Version"] == "registry/2.0"
        # loopback only, storage in this var/
        conf = (tmp_path / "registry" / "config.yml").read_text()
        assert f"addr: 127.0.0.1:{port}" in conf
        assert f"rootdirectory: {tmp_path}/registry/storage" in conf
        again = run(tmp_path, port)
        assert again.returncode == 0 and "already running" in again.stderr, again.stderr
        assert int((tmp_path / "run" / "registry.pid").read_text().split()[0]) == pid
        stop = run(tmp_path, port, "--stop")
        assert stop.returncode == 0, stop.stderr
        wait_until(lambda: not alive(pid), timeout=10, message="the registry stopped")
        assert not (tmp_path / "run" / "registry.addr").exists()
    finally:
        try:  # whatever failed above: never leave a registry of this test running
            pid = int((tmp_path / "run" / "registry.pid").read_text().split()[0])
            if alive(pid) and str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass


def recorded(var: Path) -> int:
    return int((var / "run" / "registry.pid").read_text().split()[0])


@pytest.mark.skipif(shutil.which("docker-registry") is None,
                    reason="needs Debian's docker-registry (make registry installs it)")
def test_another_checkouts_registry_is_stopped_only_when_asked(tmp_path) -> None:
    """A CI clone beside a developer's checkout: the other registry on the port is named and
    left running; with GPUSPAWNER_STOP_OTHER_REGISTRY=1 (.ci/run) it is stopped by --stop for
    its own var/, and this one starts."""
    port, a, b = free_port(), tmp_path / "a", tmp_path / "b"
    first = run(a, port)
    try:
        assert first.returncode == 0, first.stderr
        pid_a = recorded(a)
        refused = run(b, port)
        assert refused.returncode == 1, refused.stderr
        assert f"held by the registry of another checkout ({a})" in refused.stderr
        assert "GPUSPAWNER_STOP_OTHER_REGISTRY=1" in refused.stderr and alive(pid_a)
        took = run(b, port, GPUSPAWNER_STOP_OTHER_REGISTRY="1")
        assert took.returncode == 0, took.stderr
        wait_until(lambda: not alive(pid_a), timeout=10, message="a's registry stopped")
        assert f"registry ready on http://127.0.0.1:{port}" in took.stderr
        assert not (a / "run" / "registry.pid").exists()
        assert str(b) in Path(f"/proc/{recorded(b)}/cmdline").read_text()
    finally:
        for var in (a, b):
            run(var, port, "--stop")
