"""The set-up scripts stop, restart or delete only what they started themselves.

``scripts/dockerd.sh`` runs against a stand-in engine: a small Python program named ``dockerd``
that writes its PID to the pid file it is given and waits, and a stand-in ``docker`` client that
answers ``docker info`` for it (the pools and the default bridge from the stand-in's own command
line). Both live in the test's folder, first on the script's PATH; the script's pid files, log
and socket (``GPUSPAWNER_VAR``, ``GPUSPAWNER_ENGINE_PIDFILE``, ``DOCKER_HOST``) are there too, so
the machine's real engine (/var/run/docker.pid) is never looked at, let alone stopped.
``btrfs-engine.sh --stop`` and ``slurm.sh --stop`` run against pid files of a folder of their own
that name a process they did not start; ``slurm.sh --print-config`` shows the loopback-only
configuration. Only the isolation-rule test touches the host (root, iptables; marked docker).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
HOOK = "nvidia-container-runtime-hook"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
GOOD_FLAGS = ("--bridge=none", "--iptables=false",
              "--default-address-pool", "base=198.18.0.0/16,size=24")

#: stand-in for dockerd: its PID into --pidfile (removed again on SIGTERM, as dockerd does),
#: then it waits, at most 300 s
FAKE_DOCKERD = r'''#!/usr/bin/env python3
import os, signal, sys, time
args = sys.argv[1:]
pidfile = args[args.index("--pidfile") + 1] if "--pidfile" in args else None
def bye(*_):
    if pidfile:
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
if pidfile:
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
time.sleep(300)
'''

#: stand-in for the docker client: answers while the process in GPUSPAWNER_ENGINE_PIDFILE lives,
#: with what that process's command line says
FAKE_DOCKER = r'''#!/usr/bin/env python3
import json, os, sys
def engine_argv():
    try:
        pid = int(open(os.environ["GPUSPAWNER_ENGINE_PIDFILE"]).read())
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            return None
        return open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    except (OSError, ValueError, KeyError):
        return None
argv, args = engine_argv(), sys.argv[1:]
if argv is None:
    sys.exit("Cannot connect to the Docker daemon (stand-in: no engine)")
if args[:1] == ["info"]:
    fmt = args[2] if args[1:2] == ["--format"] else ""
    if "DefaultAddressPools" in fmt:
        pools = []
        for i, a in enumerate(argv[:-1]):
            if a == "--default-address-pool":
                kv = dict(p.split("=", 1) for p in argv[i + 1].split(","))
                pools.append({"Base": kv["base"], "Size": int(kv["size"])})
        print(json.dumps(pools or None))
    else:
        print("stand-in")
    sys.exit(0)
if args[:3] == ["network", "inspect", "bridge"]:
    sys.exit(1 if "--bridge=none" in argv else 0)
sys.exit(f"stand-in docker: unexpected {args}")
'''


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)


class Stand:
    """The test's folder: stand-in programs, the engine's pid file, var/; kills, at the end,
    every stand-in engine still running (by PID, only processes running its own dockerd)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, text in (("dockerd", FAKE_DOCKERD), ("docker", FAKE_DOCKER)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.pidfile = root / "docker.pid"
        self.var = root / "var"
        self.record = self.var / "run" / "dockerd.pid"
        self.daemon_json = root / "daemon.json"
        self.daemon_json.write_text("{}")
        self.seen: set[int] = set()

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{SYSTEM_PATH}", "HOME": str(self.root),
                "GPUSPAWNER_VAR": str(self.var), "GPUSPAWNER_ENGINE_PIDFILE": str(self.pidfile),
                "DOCKER_HOST": f"unix://{self.root}/docker.sock", "ENGINE_TIMEOUT": "20",
                **extra}

    def engine_pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return None
        if alive(pid):
            self.seen.add(pid)
            return pid
        return None

    def start_engine(self, *flags: str, path: str = SYSTEM_PATH, **env: str) -> int:
        """A stand-in engine that this test starts (not the script): detached, so that once
        stopped it is reaped by init and not left a zombie of the test."""
        subprocess.run(["sh", "-c", 'setsid "$@" >/dev/null 2>&1 </dev/null &', "sh",
                        str(self.bin / "dockerd"), "--pidfile", str(self.pidfile),
                        "--config-file", str(self.daemon_json), *flags],
                       env={"PATH": path, **env}, check=True, timeout=10)
        return wait_until(self.engine_pid, timeout=10, message="the stand-in engine's pid file")

    def run(self, script: str = "dockerd.sh", *args: str, **extra: str
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPTS / script), *args], env=self.env(**extra),
                              capture_output=True, text=True, timeout=120)

    def cleanup(self) -> None:
        self.engine_pid()
        for pid in self.seen:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            except OSError:
                continue
            if str(self.bin / "dockerd") in cmdline and alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    s = Stand(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


# --------------------------------------------------------------------------- scripts/dockerd.sh
@pytest.fixture
def no_hook() -> None:
    if shutil.which(HOOK, path=SYSTEM_PATH):
        pytest.skip(f"{HOOK} is installed in {SYSTEM_PATH}: no engine here can lack it")


@pytest.mark.usefixtures("no_hook")
def test_a_foreign_engine_without_the_hook_is_left_running(stand: Stand) -> None:
    pid = stand.start_engine(*GOOD_FLAGS)
    proc = stand.run()
    assert proc.returncode != 0, proc.stderr
    assert alive(pid) and stand.engine_pid() == pid
    err = proc.stderr
    assert f"{HOOK} on the engine's PATH" in err, err
    assert f"GPUSPAWNER_RESTART_DOCKER=1 {SCRIPTS / 'dockerd.sh'}" in err, err
    assert "leaves it running" in err
    assert not stand.record.exists()


def test_a_foreign_engine_names_every_missing_setting(stand: Stand) -> None:
    # the hook is on its PATH; bridge, NAT and pools are Docker's defaults
    pid = stand.start_engine(path=f"{REPO / 'tests' / 'doubles'}:{SYSTEM_PATH}")
    proc = stand.run()
    assert proc.returncode != 0 and alive(pid), proc.stderr
    err = proc.stderr
    for missing in ("--bridge=none", "--iptables=false", "inside 198.18.0.0/15",
                    '"bridge": "none"', '"iptables": false', '"default-address-pools"',
                    "GPUSPAWNER_RESTART_DOCKER=1"):
        assert missing in err, (missing, err)
    assert f"{HOOK} on the engine's PATH" not in err


def test_an_engine_with_what_the_project_needs_is_left_alone(stand: Stand) -> None:
    pid = stand.start_engine(*GOOD_FLAGS, path=f"{REPO / 'tests' / 'doubles'}:{SYSTEM_PATH}")
    proc = stand.run()
    assert proc.returncode == 0, proc.stderr
    assert "left alone" in proc.stderr and alive(pid)


@pytest.mark.usefixtures("no_hook")
def test_a_reused_pid_in_the_record_is_not_ours(stand: Stand) -> None:
    pid = stand.start_engine(*GOOD_FLAGS)
    stand.record.parent.mkdir(parents=True, exist_ok=True)
    stand.record.write_text(f"{pid} 1\n")  # the PID, but another process's start time
    proc = stand.run()
    assert proc.returncode != 0 and alive(pid), proc.stderr
    assert "GPUSPAWNER_RESTART_DOCKER=1" in proc.stderr


def assert_restarted(stand: Stand, old: int, proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: not alive(old), timeout=10, message=f"old engine {old} gone")
    new = stand.engine_pid()
    assert new is not None and new != old, proc.stderr
    env = environ(new)
    assert env["PATH"].split(":")[0] == str(REPO / "tests" / "doubles")  # the hook's double
    assert env["GPUSPAWNER_DOCKERD_CHECKOUT"] == str(REPO)
    assert stand.record.read_text().split() == [str(new), start_time(new)]
    args = Path(f"/proc/{new}/cmdline").read_bytes().decode().split("\0")
    assert "--iptables=false" in args and "base=198.18.0.0/16,size=24" in args
    assert ["-H", f"unix://{stand.root}/docker.sock"] == args[args.index("-H"):][:2]


@pytest.mark.usefixtures("no_hook")
def test_a_foreign_engine_is_restarted_only_when_asked(stand: Stand) -> None:
    old = stand.start_engine(*GOOD_FLAGS)
    proc = stand.run(GPUSPAWNER_RESTART_DOCKER="1")
    assert "GPUSPAWNER_RESTART_DOCKER=1: stopping the running engine" in proc.stderr
    assert_restarted(stand, old, proc)


@pytest.mark.usefixtures("no_hook")
def test_our_own_engine_without_the_hook_is_restarted(stand: Stand) -> None:
    old = stand.start_engine(*GOOD_FLAGS)
    stand.record.parent.mkdir(parents=True, exist_ok=True)
    stand.record.write_text(f"{old} {start_time(old)}\n")
    assert_restarted(stand, old, stand.run())


@pytest.mark.usefixtures("no_hook")
def test_an_engine_of_a_deleted_checkout_is_restarted(stand: Stand) -> None:
    # started by dockerd.sh of a scratch clone that is gone, with its test double of the hook
    gone = stand.root / "deleted-clone"
    old = stand.start_engine(*GOOD_FLAGS, path=f"{gone}/tests/doubles:{SYSTEM_PATH}",
                             GPUSPAWNER_DOCKERD_CHECKOUT=str(gone))
    proc = stand.run()
    assert "a checkout that no longer exists" in proc.stderr
    assert_restarted(stand, old, proc)


# ------------------------------------------------------------- btrfs-engine.sh and slurm.sh
@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process none of the scripts started (its pid goes into their pid files)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={"SLURM_CONF": str(tmp_path / "var/slurm/etc/slurm.conf")})
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_btrfs_engine_stop_leaves_a_process_it_did_not_start(
        stand: Stand, foreign: subprocess.Popen[bytes]) -> None:
    pidfile = stand.var / "run" / "docker-btrfs.pid"
    pidfile.parent.mkdir(parents=True)
    pidfile.write_text(f"{foreign.pid}\n")
    proc = stand.run("btrfs-engine.sh", "--stop")
    assert proc.returncode == 0, proc.stderr
    assert foreign.poll() is None and alive(foreign.pid)
    assert "nothing stopped" in proc.stderr


def test_btrfs_engine_stop_stops_its_own_engine(stand: Stand) -> None:
    pidfile = stand.var / "run" / "docker-btrfs.pid"
    pidfile.parent.mkdir(parents=True)
    subprocess.run(["sh", "-c", 'setsid "$@" >/dev/null 2>&1 </dev/null &', "sh",
                    str(stand.bin / "dockerd"), "--pidfile", str(pidfile)],
                   env={"PATH": SYSTEM_PATH}, check=True, timeout=10)
    pid = wait_until(lambda: pidfile.exists() and int(pidfile.read_text()), timeout=10,
                     message="stand-in btrfs engine")
    stand.seen.add(pid)
    proc = stand.run("btrfs-engine.sh", "--stop")
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: not alive(pid), timeout=10, message="the btrfs stand-in stopped")


def test_slurm_stop_leaves_a_process_it_did_not_start(
        stand: Stand, foreign: subprocess.Popen[bytes]) -> None:
    run = stand.var / "slurm" / "run"
    run.mkdir(parents=True)
    for name in ("munged", "slurmctld", "slurmrestd", "slurmd-node1", "slurmd-node2",
                 "slurmd-node3"):
        (run / f"{name}.pid").write_text(f"{foreign.pid}\n")
    proc = stand.run("slurm.sh", "--stop")
    assert proc.returncode == 0, proc.stderr
    assert foreign.poll() is None and alive(foreign.pid)
    assert "stopped slurm" not in proc.stderr and "stopped munged" not in proc.stderr


def hostname_address() -> str | None:
    """What Slurm binds with NoCtldInAddrAny/NoInAddrAny (getaddrinfo of the host's name)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET,
                                   socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG | socket.AI_PASSIVE)
    except OSError:
        return None
    return str(infos[0][4][0])


def test_slurm_config_keeps_every_daemon_on_loopback(stand: Stand) -> None:
    pytest.importorskip("yaml")
    proc = stand.run("slurm.sh", "--print-config", PYTHON=sys.executable,
                     GPUSPAWNER_SLURM_PORTS="17101")
    addr = hostname_address()
    if addr is None or not ipaddress.ip_address(addr).is_loopback:
        assert proc.returncode != 0 and "/etc/hosts" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in lines
    assert f"SlurmctldHost={socket.gethostname().split('.')[0]}({addr})" in lines
    assert "SlurmctldPort=17101" in lines
    nodes = [ln for ln in lines if ln.startswith("NodeName=")]
    # node1-3, and node4 under Slurm's power saving (State=CLOUD, docs/howto/elastic-nodes.md)
    assert len(nodes) == 4 and all(f" NodeAddr={addr} " in ln for ln in nodes), nodes
    assert [ln.split(" Port=")[1].split()[0] for ln in nodes] == ["17102", "17103", "17105",
                                                                   "17106"]
    assert nodes[3].startswith("NodeName=node4 ") and nodes[3].endswith(" State=CLOUD")
    assert str(stand.var / "slurm") in proc.stdout and str(REPO / "var") not in proc.stdout


# ------------------------------------------------------------------------------ network.sh
@pytest.mark.docker
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iptables"),
                    reason="needs root and iptables (make engine)")
@pytest.mark.exclusive  # adds a rule to the FORWARD chain another test compares whole
def test_network_stop_leaves_a_lookalike_rule_it_did_not_add() -> None:
    pool = "198.19.253.0/24"  # a pool no other test uses
    lookalike = ["FORWARD", "-s", pool, "-d", pool, "-j", "DROP"]  # no gpuspawner comment
    env = {**os.environ, "GPUSPAWNER_NETWORK_POOL": pool}
    subprocess.run(["iptables", "-I", *lookalike], check=True, timeout=30)
    try:
        for args in ([], ["--stop"]):
            subprocess.run([str(SCRIPTS / "network.sh"), *args], check=True, timeout=60,
                           env=env, capture_output=True)
        assert subprocess.run(["iptables", "-C", *lookalike], timeout=30).returncode == 0
    finally:
        while subprocess.run(["iptables", "-C", *lookalike], timeout=30,
                             capture_output=True).returncode == 0:
            subprocess.run(["iptables", "-D", *lookalike], check=True, timeout=30)
