"""GPUSpawner with ``backend = "slurm"`` in a real JupyterHub (with configurable-http-proxy)
against the private three-node cluster: a spawn through the REST API runs as a Slurm job of the
user pinned to the ledger's GPU and core, is reached through the proxy, survives a hub restart
(the allocation restored from the job's AdminComment), and is cancelled by a stop. user_options
that try to reach the job (gres, prologue) are refused.

The first test's server is a small stand-in (a Jupyter-like ``/api`` answer that reports what
it sees); the second runs the real jupyterhub-singleuser (JupyterHub 6) as the job user with the
system Python 3.11 and the hub's site-packages (the hub's own interpreter lives under /root,
which the job user cannot enter).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gpuspawner.backends.slurm.commands import JobInfo, SlurmClient, parse_jobs
from gpuspawner.backends.slurm.gres import gres_type
from gpuspawner.backends.slurm.job import ADMIN_MARKER, gpu_positions
from gpuspawner.hub.identity import object_name
from gpuspawner.placement import Allocation
from gpuspawner.testing.slurm_hub import OTHER, USER, SlurmHub, chp, real_singleuser, running
from tests.test_slurm_backend import slurm_conf, topology_nodes  # noqa: F401
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.hub]

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture
def start_hub(slurm_conf: str, tmp_path: Path  # noqa: F811
              ) -> Iterator[Callable[..., SlurmHub]]:
    """Starts a :class:`SlurmHub` (in ``tmp_path``, on the cluster) per call, with SlurmHub's
    keyword arguments; ``singleuser=True``: the real jupyterhub-singleuser
    (:func:`~gpuspawner.testing.slurm_hub.real_singleuser`). Skips without
    configurable-http-proxy, or without what the real server needs. At teardown the users'
    servers, the hubs and their homes are cleaned up (``running``), after the test's own
    ``finally``."""
    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    with ExitStack() as stack:
        def start(singleuser: bool = False, **kwargs: Any) -> SlurmHub:
            if singleuser:
                real = real_singleuser()
                if real is None:
                    pytest.skip("no jupyterhub in the hub's site-packages or no /usr/bin/python3")
                kwargs = {**real, **kwargs}
            return stack.enter_context(running(SlurmHub(tmp_path, slurm_conf, **kwargs)))

        yield start


@pytest.fixture
def hub(start_hub: Callable[..., SlurmHub]) -> SlurmHub:
    return start_hub()


def jobs_of(client: SlurmClient, name: str) -> list[JobInfo]:
    """The RUNNING jobs named ``name``."""
    out = asyncio.run(client.run("scontrol", "show", "job", "-d"))
    return [j for j in parse_jobs(out) if j.name == name and j.state == "RUNNING"]


def stop_and_wait_gone(hub: SlurmHub, client: SlurmClient, job: JobInfo) -> None:
    """Stop gpsuser1's server through the REST API and wait until its Slurm job ``job`` has
    left the queue."""
    assert hub.api("DELETE", f"/users/{USER}/server").status_code in (202, 204)
    hub.wait_stopped(USER)
    wait_until(lambda: job.job_id not in asyncio.run(client.squeue([job.job_id])),
               timeout=30, interval=0.3, message=f"job {job.job_id} gone after stop")


def test_spawn_restart_stop_through_the_hub(hub: SlurmHub, slurm_conf: str) -> None:  # noqa: F811
    """gpsuser1 takes both GPUs of node1 (profile gpu2: no enforce-binding across NUMA
    nodes, the readback still checks the cores); after a hub restart gpsuser2's "fail now"
    spawn (``queue: false``) is refused by the restored ledger at once, not left to wait in
    Slurm's queue."""
    client = SlurmClient(conf=slurm_conf, timeout=30)
    hub.ensure_user(USER)
    hub.ensure_user(OTHER)
    # user_options may name a profile only: Slurm options in them are refused
    r = hub.api("POST", f"/users/{USER}/server",
                {"profile": "gpu2", "gres": "gpu:2", "prologue": "touch /tmp/owned"})
    assert r.status_code == 400, r.text
    r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu2"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER, timeout=90)

    name = f"jupyter-{USER}"
    (job,) = wait_until(lambda: jobs_of(client, name), timeout=10, message=f"job {name}")
    assert job.user == USER and job.node_list == ("node1",)
    alloc = Allocation.from_json(job.fields["AdminComment"][len(ADMIN_MARKER):])
    node1 = topology_nodes()["node1"].node
    pos = gpu_positions(node1)
    assert job.gres_indices("node1") == {gres_type(u): (pos[u],) for u in alloc.gpu_uuids}
    assert len(alloc.gpu_uuids) == 2
    assert job.node_detail("node1").cpu_ids == alloc.cpuset == (0, 1)

    # through the proxy, at the port the job reported
    r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
    assert r.status_code == 200, r.text[:300]
    seen = r.json()
    assert seen["uid"] == pwd.getpwnam(USER).pw_uid
    assert seen["cpus"] == list(alloc.cpuset)
    assert seen["env"]["HOME"] == str(hub.home / USER)

    # a hub restart keeps the job and its allocation (restored from AdminComment)
    hub.stop()
    assert [j.job_id for j in jobs_of(client, name)] == [job.job_id]
    hub.start()
    model = hub.api("GET", f"/users/{USER}").json()
    assert model["servers"][""]["ready"] is True
    r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
    assert r.status_code == 200 and r.json()["uid"] == seen["uid"]
    # "fail now": refused by the restored ledger (a spawn that waits: the queue test below)
    r = hub.api("POST", f"/users/{OTHER}/server", {"profile": "gpu1", "queue": False})
    assert r.status_code == 400, r.text
    assert "no node has 1 free GPU" in r.json()["message"]
    assert not jobs_of(client, f"jupyter-{OTHER}")

    # stop: the job leaves the queue
    stop_and_wait_gone(hub, client, job)


def reported_port(hub: SlurmHub, user: str, server: str = "") -> int:
    """The port the hub took for the server (its spawner's state in the hub's database)."""
    with sqlite3.connect(hub.state_dir / "jupyterhub.sqlite") as db:
        (state,) = db.execute("SELECT s.state FROM spawners s JOIN users u ON s.user_id = u.id"
                              " WHERE u.name = ? AND s.name = ?", (user, server)).fetchone()
    return int(json.loads(state)["backend"]["port"])


@pytest.mark.parametrize("internal_ssl", [False, True], ids=["http", "internal_ssl"])
def test_real_singleuser_picks_its_reported_port(slurm_conf: str,  # noqa: F811
                                                 start_hub: Callable[..., SlurmHub],
                                                 internal_ssl: bool) -> None:
    """jupyterhub-singleuser takes the port the job script wrote into JUPYTERHUB_SERVICE_URL,
    talks to the hub, and answers through the proxy; the hub's readiness check passes. With
    internal_ssl the server's certificate (naming the node's host) is read by the job user
    from the spawner's copy and the proxy reaches it over mutual TLS."""
    hub = start_hub(singleuser=True, internal_ssl=internal_ssl)
    client = SlurmClient(conf=slurm_conf, timeout=30)
    hub.ensure_user(USER)
    r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER, timeout=120)
    (job,) = jobs_of(client, f"jupyter-{USER}")
    port = reported_port(hub, USER)
    assert "port" not in job.comment  # published nowhere other users read
    model = hub.api("GET", f"/users/{USER}").json()["servers"][""]
    assert model["url"] == f"/user/{USER}/"
    r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
    assert r.status_code == 200 and "version" in r.json(), r.text[:300]
    # the server itself listens on the reported port of the node's address
    if internal_ssl:
        with pytest.raises(OSError):  # plain HTTP is not served there
            urllib.request.urlopen(f"http://127.0.0.1:{port}/user/{USER}/api", timeout=5)
        # what another user's process on the node can try: TLS without the proxy's client
        # certificate is refused in the handshake (the isolation issue's exploit, here
        # where jobs share the node's network)
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with ctx.wrap_socket(raw) as tls:
                    tls.sendall(f"GET /user/{USER}/api HTTP/1.1\r\nHost: x\r\n\r\n"
                                .encode())
                    if not tls.recv(1024):  # TLS 1.3: the refusal comes with the read
                        raise ConnectionResetError("closed without an answer")
    else:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/user/{USER}/api",
                                    timeout=5) as answer:
            assert "version" in answer.read().decode()
    stop_and_wait_gone(hub, client, job)


def test_spawn_through_the_hub_submitted_via_slurmrestd(
        slurm_conf: str, start_hub: Callable[..., SlurmHub]) -> None:  # noqa: F811
    """``c.SlurmBackend.submit_via = "rest"`` in a real hub: a 1-GPU spawn through the hub's
    REST API is submitted to slurmrestd (127.0.0.1:17004, the hub makes a root token with
    ``scontrol token``), runs as the user on node1 with the allocated GPU's per-device type
    and IDX, answers through the proxy, and the stop empties the queue."""
    client = SlurmClient(conf=slurm_conf, timeout=30)
    hub = start_hub(extra="""
c.SlurmBackend.submit_via = "rest"
c.SlurmBackend.rest_url = "http://127.0.0.1:17004"
c.SlurmBackend.rest_token = ""
""")
    hub.ensure_user(USER)
    r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER, timeout=90)
    assert f"submitted through slurmrestd as {USER}" in hub.tail(400)
    (job,) = jobs_of(client, f"jupyter-{USER}")
    assert job.user == USER and job.node_list == ("node1",)
    alloc = Allocation.from_json(job.fields["AdminComment"][len(ADMIN_MARKER):])
    pos = gpu_positions(topology_nodes()["node1"].node)
    (uuid_,) = alloc.gpu_uuids
    assert job.gres_indices("node1") == {gres_type(uuid_): (pos[uuid_],)}
    assert job.node_detail("node1").cpu_ids == alloc.cpuset
    r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
    assert r.status_code == 200 and r.json()["uid"] == pwd.getpwnam(USER).pw_uid
    stop_and_wait_gone(hub, client, job)


def test_spawn_waits_in_the_queue_and_starts_on_the_freed_gpu(
        slurm_conf: str, start_hub: Callable[..., SlurmHub]) -> None:  # noqa: F811
    """The wait queue on the Slurm backend (docs/queue.md): gpsuser1's two named servers of
    the 1-GPU profile (restricted to node1, queue on by default) take node1's two GPUs; a third
    spawn waits in the hub (pending, no Slurm job; progress "waiting: position 1 of 1", counting
    node1's GPUs only) instead of a 400 or a job pending in Slurm's queue; when one of the two
    stops, the waiting spawn starts as a Slurm job on node1 with the GRES of the GPU that was
    freed."""
    client = SlurmClient(conf=slurm_conf, timeout=30)
    hub = start_hub(extra="""
c.JupyterHub.allow_named_servers = True
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
""")
    servers = ("a", "b", "w")
    pos = gpu_positions(topology_nodes()["node1"].node)

    def job_of(server: str) -> JobInfo:
        name = object_name(USER, server)
        (job,) = wait_until(lambda: jobs_of(client, name), timeout=10, message=f"job {name}")
        return job

    hub.ensure_user(USER)
    for s in servers[:2]:
        r = hub.api("POST", f"/users/{USER}/servers/{s}", {"profile": "gpu1"})
        assert r.status_code in (201, 202), r.text
    held = {}
    for s in servers[:2]:
        hub.wait_ready(USER, s, timeout=90)
        job = job_of(s)
        assert job.node_list == ("node1",)
        held[s] = job.gres_indices("node1")
    assert sorted(held.values(), key=str) == sorted(
        ({gres_type(u): (i,)} for u, i in pos.items()), key=str)

    r = hub.api("POST", f"/users/{USER}/servers/w", {"profile": "gpu1"})
    assert r.status_code == 202, r.text
    msgs = hub.progress(USER, "w", until="waiting: position 1 of 1")
    assert any("waiting: position 1 of 1 for " in m and "0 of 2 GPUs free now" in m
               for m in msgs), msgs
    assert hub.server(USER, "w")["pending"] == "spawn"
    assert not jobs_of(client, object_name(USER, "w"))  # it waits in the hub, not Slurm

    stopped = job_of("a")
    assert hub.api("DELETE", f"/users/{USER}/servers/a").status_code in (202, 204)
    hub.wait_ready(USER, "w", timeout=90)
    assert stopped.job_id not in asyncio.run(client.squeue([stopped.job_id]))
    job = job_of("w")
    assert job.user == USER and job.node_list == ("node1",)
    assert job.gres_indices("node1") == held["a"]  # the GPU that was freed
    alloc = Allocation.from_json(job.fields["AdminComment"][len(ADMIN_MARKER):])
    (uuid_,) = alloc.gpu_uuids
    assert held["a"] == {gres_type(uuid_): (pos[uuid_],)}
    assert "wait queue: tick failed" not in hub.tail(400)
RACE_PYTHON = r"""#!/usr/bin/python3
import os, socket, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
r = subprocess.run(["/usr/bin/python3", *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
out = r.stdout
if (os.path.exists(os.path.join(here, "armed")) and sys.argv[1:2] == ["-c"]
        and "getsockname" in sys.argv[2] and out.strip().isdigit()):
    port = int(out)
    drop = os.path.join(here, f"port-{os.getpid()}")
    with open(drop, "w") as f:
        f.write(str(port))
    os.chmod(drop, 0o644)  # (the job's umask is 077)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.02)
sys.stdout.write(out)
sys.exit(r.returncode)
"""

#: the attacker (run as the other user): binds every port dropped in FOLDER first, answers
#: TLS with its own server's certificate like a Jupyter server, and logs each request it gets
ATTACKER = r"""
import glob, os, socket, ssl, sys, threading, time
folder, cert, key, log = sys.argv[1:5]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
def serve(sock):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()
def answer(conn):
    try:
        with ctx.wrap_socket(conn, server_side=True) as tls:
            head = tls.recv(65536).decode(errors="replace")
            with open(log, "a") as f:
                f.write(head.split("\r\n", 1)[0] + " cookie=" + str("cookie:" in head.lower())
                        + "\n")
            body = b'{"version": "attacker"}'
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    except (OSError, ssl.SSLError):
        pass
seen = set()
while True:
    for path in glob.glob(os.path.join(folder, "port-*")):
        if path in seen:
            continue
        seen.add(path)
        port = int(open(path).read())
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen(16)
        with open(log, "a") as f:
            f.write(f"bound {port}\n")
        threading.Thread(target=serve, args=(s,), daemon=True).start()
    time.sleep(0.005)
"""


# was a hole (issue 47, item 1): the job published its port in its Comment before its server
# bound it; another user bound it first with its own server's certificate (every server
# certificate named the node's address), the hub's readiness was a TCP connect, and the proxy
# routed the victim's /user/... (with the victim's cookies) to the attacker
def test_another_user_who_binds_the_port_first_never_gets_the_route(
        slurm_conf: str, start_hub: Callable[..., SlurmHub]) -> None:  # noqa: F811
    """internal_ssl, the real jupyterhub-singleuser. gpsuser2 binds the port gpsuser1's job
    picked before gpsuser1's server can (the job's Python hands it over and waits), and
    answers TLS with a certificate of the hub's CA for its own server, like a Jupyter server.
    The hub never sends it a request: the victim's server cannot bind, so it never reports a
    port, and the spawn fails cleanly (nothing held, no job left). A report with a valid token
    that is not the spawn's is refused. Disarmed, the victim's next spawn is ready and the
    proxy reaches the victim's own server."""
    import subprocess

    from gpuspawner.hub import certs

    race = Path(tempfile.mkdtemp(prefix="gps-race-", dir="/tmp"))
    race.chmod(0o1777)
    python = race / "python"
    python.write_text(RACE_PYTHON)
    python.chmod(0o755)
    (race / "armed").touch()
    hub = start_hub(singleuser=True, internal_ssl=True,
                    extra=f"c.SlurmBackend.python = {str(python)!r}\n"
                          "c.SlurmBackend.port_timeout = 20\n")
    client = SlurmClient(conf=slurm_conf, timeout=30)
    attacker = None
    try:
        hub.ensure_user(USER)
        hub.ensure_user(OTHER)
        # the attacker's own server certificate, as the hub makes it for the attacker's server
        other = pwd.getpwnam(OTHER)
        pair = certs.create_pair(str(hub.home / "internal-ssl"), object_name(OTHER, ""),
                                 ["IP:127.0.0.1"], "")
        mine = certs.copy_for_server({k: pair[k] for k in ("keyfile", "certfile")},
                                     str(race / "attacker-certs"), other.pw_uid, other.pw_gid,
                                     str(race / "attacker-certs"))
        log = race / "attacker.log"
        log.touch()
        log.chmod(0o666)
        attacker = subprocess.Popen(
            ["runuser", "-u", OTHER, "--", "/usr/bin/python3", "-c", ATTACKER, str(race),
             mine["certfile"], mine["keyfile"], str(log)], start_new_session=True)

        r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1"})
        # 500: the spawn failed within the request (the victim's server could not bind)
        assert r.status_code in (201, 202, 500), r.text
        if r.status_code == 500:
            assert "port" in r.json()["message"], r.text
        bound = wait_until(lambda: "bound" in log.read_text(), timeout=60, interval=0.1,
                           message="the attacker bound the victim's port")
        assert bound
        port = int(log.read_text().split("bound ", 1)[1].split()[0])
        def settled() -> dict | None:
            s = hub.server(USER)
            if s is None or s.get("ready"):
                return s or {"gone": True}
            return None

        end = wait_until(settled, timeout=90, interval=0.2, message="the spawn settled")
        if end.get("ready"):  # (before the fix) the route is the attacker's: use it
            hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
        requests_seen = [line for line in log.read_text().splitlines()
                         if not line.startswith("bound ")]
        assert requests_seen == [], f"the hub routed {USER}'s server to the attacker: " \
            f"{requests_seen}\n{hub.tail(80)}"
        assert end.get("gone"), end
        wait_until(lambda: not jobs_of(client, f"jupyter-{USER}"), timeout=30, interval=0.3,
                   message="no job of the failed spawn left")
        # another valid token (the admin service's) reports nothing; no token is refused
        r = hub.api("POST", "/gpuspawner/port", {"port": port})
        assert r.status_code == 404, r.text
        r = hub.session.post(f"{hub.api_url}/gpuspawner/port", json={"port": port}, timeout=10)
        assert r.status_code == 403, r.text

        # disarmed: the victim's next spawn binds its own port, and the proxy reaches it
        (race / "armed").unlink()
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER, timeout=120)
        r = hub.session.get(f"{hub.url}/user/{USER}/api", timeout=10)
        assert r.status_code == 200 and r.json()["version"] != "attacker", r.text[:300]
        assert reported_port(hub, USER) != port
        assert hub.api("DELETE", f"/users/{USER}/server").status_code in (202, 204)
        hub.wait_stopped(USER)
    finally:
        if attacker is not None:
            os.killpg(attacker.pid, signal.SIGKILL)
            attacker.wait()
        shutil.rmtree(race, ignore_errors=True)
SQUATTER = r"""
import socket, ssl, sys, threading, time
port, cert, key, log = int(sys.argv[1]), *sys.argv[2:5]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
def answer(conn):
    try:
        with ctx.wrap_socket(conn, server_side=True) as tls:
            head = tls.recv(65536).decode(errors="replace")
            with open(log, "a") as f:
                f.write(head.split("\r\n", 1)[0] + " cookie=" + str("cookie:" in head.lower())
                        + "\n")
            body = b'{"version": "attacker"}'
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    except (OSError, ssl.SSLError):
        pass
while True:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        s.close()
        time.sleep(0.001)
s.listen(16)
with open(log, "a") as f:
    f.write(f"bound {port}\n")
while True:
    conn, _ = s.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""


def proxy_routes(hub: SlurmHub) -> dict:
    """The proxy's own routes (its API over mutual TLS with internal_ssl: the hub's client
    certificate), keyed without the trailing slash."""
    import requests

    conf = hub.config.read_text()
    api = conf.split("c.ConfigurableHTTPProxy.api_url = \"", 1)[1].split('"', 1)[0]
    token = conf.split("c.ConfigurableHTTPProxy.auth_token = '", 1)[1].split("'", 1)[0]
    ssl_dir = hub.home / "internal-ssl"
    r = requests.get(f"{api}/api/routes", timeout=10, headers={"Authorization": f"token {token}"},
                     verify=str(ssl_dir / "proxy-api-ca" / "proxy-api-ca.crt"),
                     cert=(str(ssl_dir / "hub-internal" / "hub-internal.crt"),
                           str(ssl_dir / "hub-internal" / "hub-internal.key")))
    r.raise_for_status()
    return {k.rstrip("/"): v for k, v in r.json().items()}


# was a hole (issue 47, item 1, what was left): after a server exited, until the hub's next
# poll the proxy's route still pointed at its address and port, and configurable-http-proxy
# accepted any certificate of the hub's CA naming that address (every server certificate of
# the node does): another user who bound the freed port got the victim's requests and cookies
def test_another_user_who_binds_the_port_after_the_server_exits_never_gets_the_route(
        start_hub: Callable[..., SlurmHub]) -> None:
    """internal_ssl, the real jupyterhub-singleuser, the hub's poll at 30 s (JupyterHub's
    default). gpsuser1's server is ready and reached through the proxy; then its process is
    killed and gpsuser2, waiting on that port, binds it within milliseconds and answers TLS
    with a certificate of the hub's CA for its own server. While the route still stands, the
    victim's logged-in requests to ``/user/gpsuser1/api`` through the proxy never reach it:
    the proxy refuses the certificate (503), and the route's target names the victim's server
    (``<label>.127.0.0.1.server.gpuspawner.internal``)."""
    import subprocess

    import psutil

    from gpuspawner.hub import certs

    race = Path(tempfile.mkdtemp(prefix="gps-squat-", dir="/tmp"))
    race.chmod(0o1777)
    hub = start_hub(singleuser=True, internal_ssl=True, extra="c.GPUSpawner.poll_interval = 30\n")
    attacker = None
    try:
        hub.ensure_user(USER)
        hub.ensure_user(OTHER)
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER, timeout=120)
        victim = hub.login(USER)
        r = victim.get(f"{hub.url}/user/{USER}/api", timeout=10)
        assert r.status_code == 200 and r.json()["version"] != "attacker", r.text[:300]
        port = reported_port(hub, USER)

        # the attacker's own server certificate, as the hub makes it for the attacker's server
        other = pwd.getpwnam(OTHER)
        pair = certs.create_pair(str(hub.home / "internal-ssl"), object_name(OTHER, ""),
                                 ["IP:127.0.0.1"], "")
        mine = certs.copy_for_server({k: pair[k] for k in ("keyfile", "certfile")},
                                     str(race / "attacker-certs"), other.pw_uid, other.pw_gid,
                                     str(race / "attacker-certs"))
        log = race / "attacker.log"
        log.touch()
        log.chmod(0o666)
        attacker = subprocess.Popen(
            ["runuser", "-u", OTHER, "--", "/usr/bin/python3", "-c", SQUATTER, str(port),
             mine["certfile"], mine["keyfile"], str(log)], start_new_session=True)
        # the victim's server: the process of gpsuser1 listening on the port
        uid = pwd.getpwnam(USER).pw_uid
        (pid,) = {c.pid for c in psutil.net_connections("tcp")
                  if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
                  and psutil.Process(c.pid).uids().real == uid}
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: "bound" in log.read_text(), timeout=20, interval=0.01,
                   message="the attacker bound the victim's freed port")

        answers = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            r = victim.get(f"{hub.url}/user/{USER}/api", timeout=10, allow_redirects=False)
            answers.append((r.status_code, r.text[:80]))
            assert f"/user/{USER}" in proxy_routes(hub), "the route went before the check ended"
            time.sleep(0.2)
        seen = [line for line in log.read_text().splitlines() if not line.startswith("bound ")]
        assert seen == [], f"the proxy sent {USER}'s requests to the attacker: {seen}"
        assert all(code == 503 for code, _ in answers), answers
        target = proxy_routes(hub)[f"/user/{USER}"]["target"]
        label = certs.server_dns_name(object_name(USER, "")).split(".", 1)[0]
        assert target == f"https://{label}.127.0.0.1.server.gpuspawner.internal:{port}", target
    finally:
        if attacker is not None:
            os.killpg(attacker.pid, signal.SIGKILL)
            attacker.wait()
        shutil.rmtree(race, ignore_errors=True)


# was a hole (issue 47, item 4): jobs the hub did not submit were invisible to its booking;
# a user's own jobs on node1's GPUs made another user's spawn pend in Slurm, then fail (500)
def test_gpus_held_by_jobs_the_hub_did_not_submit_are_not_booked(
        slurm_conf: str, start_hub: Callable[..., SlurmHub]) -> None:  # noqa: F811
    """gpsuser2 runs two jobs of its own (``sbatch -w node1 --gres=gpu:<type>:1``, as
    itself) on node1's two GPUs. gpsuser1's 1-GPU spawn on node1 (``queue: false``) is refused
    at once (400) naming the jobs that hold the GPUs, and nothing is submitted; once those
    jobs end, the same spawn runs."""
    import subprocess

    from gpuspawner.backends.slurm.gres import gres_type as type_of

    env = {"PATH": os.environ["PATH"], "SLURM_CONF": slurm_conf}
    client = SlurmClient(conf=slurm_conf, timeout=30)
    hub = start_hub()
    theirs: list[str] = []
    try:
        hub.ensure_user(USER)
        for gpu in topology_nodes()["node1"].node.gpus:
            out = subprocess.run(
                ["runuser", "-u", OTHER, "--", "sbatch", "--parsable", "-w", "node1",
                 f"--gres=gpu:{type_of(gpu.uuid)}:1", "--mem=64", "--cpus-per-task=1",
                 "--output=/dev/null", "--chdir=/tmp",
                 "--wrap=sleep 300"], capture_output=True, text=True, timeout=30, env=env)
            assert out.returncode == 0, out.stderr
            theirs.append(out.stdout.strip().split(";")[0])
        wait_until(lambda: all(asyncio.run(client.squeue([int(j) for j in theirs])).get(int(j))
                               == "RUNNING" for j in theirs),
                   timeout=30, interval=0.3, message=f"{OTHER}'s jobs {theirs} running")

        r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1", "queue": False})
        assert r.status_code == 400, r.text
        message = r.json()["message"]
        for job_id in theirs:
            assert f"held by Slurm job {job_id} of {OTHER}" in message, message
        assert not jobs_of(client, f"jupyter-{USER}")
        assert hub.server(USER) is None or not hub.server(USER).get("ready")

        for job_id in theirs:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30, env=env)
        wait_until(lambda: not asyncio.run(client.squeue([int(j) for j in theirs])),
                   timeout=30, interval=0.3, message=f"{OTHER}'s jobs gone")
        r = hub.api("POST", f"/users/{USER}/server", {"profile": "gpu1", "queue": False})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER, timeout=90)
        assert hub.api("DELETE", f"/users/{USER}/server").status_code in (202, 204)
        hub.wait_stopped(USER)
    finally:
        for job_id in theirs:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30, env=env)
