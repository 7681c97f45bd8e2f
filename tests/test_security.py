"""Users are untrusted code: each exploit found against gpuspawner, replayed against a real
JupyterHub, configurable-http-proxy and Docker engine (marked ``docker``). See
docs/security.md for the threat model; every test here failed on the host-network design
(``network_mode=host``, a "free" host port per server) and passes with one network namespace
per server.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import requests

docker = pytest.importorskip("docker")

from gpuspawner.hub.identity import object_name  # noqa: E402
from gpuspawner.hub.proxy import route_host  # noqa: E402
from tests.hubrunner import Hub, own  # noqa: E402
from tests.test_hub_e2e import (  # noqa: E402
    MiB,
    _engine,
    containers_of,
    remove_managed,
    topology,
)
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
HUB_IP = "198.18.0.1"  # gateway of the hub network made by hub_config

#: per user-name prefix, a command that replaces the single-user server (pre_spawn_hook)
EXTRA_CONFIG = r'''
c.GPUSpawner.poll_interval = 2
# below slow_spawn_timeout: failures answer the POST; both with room for a loaded machine
# (make test runs modules in parallel on two cores: a server took more than 8 s to answer)
c.GPUSpawner.http_timeout = 40
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 50}

def _hostile_cmd(spawner):
    name = spawner.user.name
    if name.startswith("crash"):
        spawner.cmd = ["sh", "-c", "echo boom: no such kernel >&2; exit 3"]
    elif name.startswith("impostor"):
        # a listener on the right port that is not a Jupyter server
        spawner.cmd = ["python3", "-m", "http.server", "8888"]
        spawner.http_timeout = 8  # it answers at once, never as a server: no need to wait 40
    elif name.startswith("slow"):
        spawner.cmd = ["sh", "-c", "sleep 3; exec jupyterhub-singleuser"]

c.GPUSpawner.pre_spawn_hook = _hostile_cmd
'''


def run_py(engine, cid: str, code: str, user: str | None = None) -> str:
    """Run Python ``code`` in container ``cid`` as its user (or ``user``); stdout+stderr."""
    kwargs = {"user": user} if user else {}
    ex = engine.exec_create(cid, ["python3", "-c", code], **kwargs)
    return engine.exec_start(ex).decode(errors="replace").strip()


def try_connect(engine, cid: str, host: str, port: int) -> str:
    """'open' when a TCP connection from inside ``cid`` to host:port succeeds, else the
    error's name."""
    return run_py(engine, cid, (
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        f"    s.connect(({host!r}, {port})); print('open')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"))


def container_ip(engine, cid: str) -> str:
    nets = engine.inspect_container(cid)["NetworkSettings"]["Networks"]
    (net,) = nets.values()
    return net["IPAddress"]


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sechub")
    nodes = [
        {"name": "local", "topology": "auto"},
        {"name": "tiny", "topology": topology(tmp, "tiny", 300 * MiB)},
        {"name": "dead", "topology": topology(tmp, "dead", 1024 * MiB),
         "docker_url": f"unix://{tmp}/no-engine-here.sock"},
    ]
    profiles = [
        {"slug": "cpu", "cpu": 0, "memory": "256M", "nodes": ["local"], "default": True},
        {"slug": "tiny", "cpu": 0, "memory": "256M", "nodes": ["tiny"]},
        {"slug": "dead", "cpu": 0, "memory": "256M", "nodes": ["dead"]},
    ]
    h = Hub(tmp, nodes, profiles, extra_config=EXTRA_CONFIG)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    yield h
    h.stop()
    remove_managed(engine)


def spawn_ready(hub, user: str, profile: str = "cpu", server: str = "") -> dict:
    hub.ensure_user(user)
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    r = hub.api("POST", path, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, server)
    (c,) = containers_of(hub_engine(), user)
    return c


def hub_engine():
    return docker.APIClient(version="auto")


def stop(hub, user: str, server: str = "") -> None:
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    hub.api("DELETE", path)
    hub.wait_stopped(user, server)


def proxy_routes(hub) -> dict:
    port = hub.env["GPUSPAWNER_PROXY_API_PORT"]
    r = requests.get(f"http://127.0.0.1:{port}/api/routes", timeout=10, headers={
        "Authorization": f"token {hub.env['CONFIGPROXY_AUTH_TOKEN']}"})
    r.raise_for_status()
    return {k.rstrip("/"): v for k, v in r.json().items()}


# -- 1. hub impersonation -------------------------------------------------------------------
def test_user_cannot_take_the_hub_ports_across_a_hub_restart(hub, engine):
    """Exploit: on the host network a user's process bound the hub's ports while the hub
    restarted, kept it from starting and answered other servers as the hub. Now the user's
    process binds only inside its own namespace: the hub restarts and serves the others."""
    mal = spawn_ready(hub, "mallet")
    api_port = int(hub.env["GPUSPAWNER_HUB_API_PORT"])
    hub.stop()
    # the hub's address is not the container's: binding it is impossible
    out = run_py(engine, mal["Id"], (
        "import socket\n"
        "s = socket.socket()\n"
        "try:\n"
        f"    s.bind(({HUB_IP!r}, {api_port})); print('bound')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"))
    assert out == "refused 99", out  # EADDRNOTAVAIL
    # binding every address only takes the ports in the user's own namespace
    listener = (
        "import socket, time\n"
        "socks = []\n"
        f"for port in ({api_port}, {hub.port}):\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('0.0.0.0', port)); s.listen(); socks.append(s)\n"
        "time.sleep(120)\n")
    ex = engine.exec_create(mal["Id"], ["python3", "-c", listener])
    engine.exec_start(ex, detach=True)
    hub.start()  # would fail with "address already in use" on the host network
    r = requests.get(f"http://{HUB_IP}:{api_port}/hub/api/", timeout=10)
    assert r.status_code == 200 and "version" in r.json()
    # another user's server reaches the real hub: it spawns and answers through the proxy
    victim = spawn_ready(hub, "victor")
    env = dict(e.split("=", 1) for e in engine.inspect_container(victim["Id"])["Config"]["Env"])
    assert env["JUPYTERHUB_API_URL"] == f"http://{HUB_IP}:{api_port}/hub/api"
    stop(hub, "victor")
    stop(hub, "mallet")


def test_user_cannot_reach_the_proxy_api_or_hub_loopback_services(hub, engine):
    mal = spawn_ready(hub, "mallory")
    proxy_api = int(hub.env["GPUSPAWNER_PROXY_API_PORT"])
    for host, port in (("127.0.0.1", proxy_api), (HUB_IP, proxy_api), (HUB_IP, hub.port),
                       ("127.0.0.1", hub.port)):
        assert try_connect(engine, mal["Id"], host, port) != "open", (host, port)
    stop(hub, "mallory")


# -- 2. port race / reaching a neighbour -------------------------------------------------------
def test_second_user_cannot_reach_first_users_server(hub, engine):
    """Exploit: on the host network every server listened on a host port, so any user could
    connect to (or pre-bind) another's. Now each server is alone on its network."""
    alice = spawn_ready(hub, "alice")
    bob = spawn_ready(hub, "bob")
    alice_ip, bob_ip = container_ip(engine, alice["Id"]), container_ip(engine, bob["Id"])
    assert alice_ip != bob_ip
    # the host (hub, proxy) reaches both; bob reaches neither alice's server nor her gateway
    # services, only the hub
    assert requests.get(f"http://{alice_ip}:8888/user/alice/api", timeout=5).status_code == 200
    assert try_connect(engine, bob["Id"], alice_ip, 8888) != "open"
    assert try_connect(engine, bob["Id"], HUB_IP, int(hub.env["GPUSPAWNER_HUB_API_PORT"])) \
        == "open"
    # the proxy routes each user to the IP of that user's own container, port 8888
    routes = proxy_routes(hub)
    assert routes["/user/alice"]["target"] == f"http://{alice_ip}:8888"
    assert routes["/user/bob"]["target"] == f"http://{bob_ip}:8888"
    stop(hub, "alice")
    stop(hub, "bob")


def test_a_listener_that_is_not_the_server_is_not_ready(hub, engine):
    """Exploit: the hub took any answer below 500 on the port as "ready". A container that
    answers on 8888 but is not a Jupyter server for this user never becomes ready."""
    hub.ensure_user("impostor")
    r = hub.api("POST", "/users/impostor/server", {"profile": "tiny"})
    if r.status_code == 202:  # a loaded machine passed slow_spawn_timeout: read the log
        wait_until(lambda: hub.server("impostor") is None, 30, 0.3, "the failed spawn ends")
        message = hub.tail(400)
    else:
        assert r.status_code == 500, r.text
        message = r.json()["message"]
    assert "did not answer within 8 s" in message and "HTTP 404" in message, message
    assert hub.server("impostor") is None
    assert containers_of(engine, "impostor") == []
    # the one slot of node tiny is free again
    spawn_ready(hub, "tess", "tiny")
    stop(hub, "tess")


# -- 3. leak after a hub crash ----------------------------------------------------------------
def test_spawn_interrupted_by_kill_9_can_be_spawned_again(hub, engine):
    """Exploit: ``kill -9`` of the hub mid-spawn left the allocation booked (restored from the
    container label) but not in the spawner's state: "already holds allocation" forever."""
    hub.ensure_user("carol")
    r = hub.api("POST", "/users/carol/server", {"profile": "tiny"})
    assert r.status_code in (201, 202), r.text
    wait_until(lambda: containers_of(engine, "carol"), 30, 0.05, "a container for carol")
    os.killpg(hub.proc.pid, signal.SIGKILL)
    hub.proc.wait(10)
    hub.start()
    r = hub.api("POST", "/users/carol/server", {"profile": "tiny"})
    if r.status_code == 400 and "already running" in r.text:
        pass  # the first spawn had finished before the kill: still one server
    else:
        assert r.status_code in (201, 202), r.text
    hub.wait_ready("carol")
    assert len(containers_of(engine, "carol")) == 1
    # node tiny holds exactly one booking: another tiny spawn is refused for capacity
    hub.ensure_user("dave")
    r = hub.api("POST", "/users/dave/server", {"profile": "tiny"})
    assert r.status_code == 400 and "free memory" in r.text, r.text
    stop(hub, "carol")
    spawn_ready(hub, "dave", "tiny")
    stop(hub, "dave")


# -- 4. bad input: 400 with the field, never a 500, never stored ------------------------------
@pytest.mark.parametrize("body, message", [
    ({"profile": None}, "profile: must be a string"),
    ({"profile": ["cpu"]}, "profile: must be a string"),
    ({"profile": "cpu", "x" * 20: 1}, "unknown option"),
    ({"profile": "cpu", "blob": "x" * 2**20}, "user_options: 1048"),
    ({"user_options": {"profile": {"$ne": 1}}}, "profile: must be a string"),
])
def test_bad_user_options_are_400_and_not_stored(hub, engine, body, message):
    hub.ensure_user("ursula")
    for path in ("/users/ursula/server", "/users/ursula/servers/named"):
        r = hub.api("POST", path, body)
        assert r.status_code == 400, r.text
        assert message in r.json()["message"], r.text
        model = hub.api("GET", "/users/ursula").json()
        stored = [s.get("user_options") for s in (model.get("servers") or {}).values()]
        assert all(not s for s in stored), stored
    # PUT (create a named server without starting it) stores nothing either
    r = hub.api("PUT", "/users/ursula/servers/later", {"user_options": body.get(
        "user_options", body)})
    assert r.status_code == 400, r.text
    r = hub.api("GET", "/users/ursula/servers/later")
    assert r.status_code == 404 or not r.json().get("user_options"), r.text
    hub.api("DELETE", "/users/ursula/servers/later", {"remove": True})
    assert containers_of(engine, "ursula") == []


@pytest.mark.parametrize("name", ["n" * 300, "Ünïcødé-ñame-" + "ß" * 120, "a.b@c+d_e"])
def test_user_names_of_any_length_and_alphabet_spawn(hub, engine, name):
    hub.ensure_user(name)
    quoted = requests.utils.quote(name, safe="")
    r = hub.api("POST", f"/users/{quoted}/server", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(quoted)
    (c,) = containers_of(engine, name)
    home = Path(hub.env["GPUSPAWNER_STATE_DIR"]).parent / "home"
    dirs = [p.name for p in home.iterdir()]
    assert all(len(d.encode()) <= 48 for d in dirs), dirs
    hub.api("DELETE", f"/users/{quoted}/server")
    hub.wait_stopped(quoted)


def test_named_server_limit_is_honoured(hub):
    hub.ensure_user("nina")
    for i in range(5):
        r = hub.api("PUT", f"/users/nina/servers/s{i}", {})
        assert r.status_code == 201, r.text
    r = hub.api("PUT", "/users/nina/servers/s5", {})
    assert r.status_code == 400 and "maximum" in r.text.lower(), r.text
    for i in range(5):
        hub.api("DELETE", f"/users/nina/servers/s{i}", {"remove": True})


# -- 5. engine trouble --------------------------------------------------------------------------
def test_engine_down_is_503_with_node_and_holds_nothing(hub):
    hub.ensure_user("edna")
    for _ in range(2):  # the second would be "already holds allocation" if the first leaked
        r = hub.api("POST", "/users/edna/server", {"profile": "dead"})
        assert r.status_code == 503, r.text
        # the first try finds the engine down; then the node is marked down and refused
        assert "node dead" in r.json()["message"], r.text
        assert "Docker engine unavailable" in r.json()["message"], r.text
    usage = hub.api("GET", "/users/edna").json()
    assert not usage.get("servers"), usage


def test_container_that_exits_at_once_is_reported_fast_and_freed(hub, engine):
    hub.ensure_user("crash1")
    t0 = time.monotonic()
    r = hub.api("POST", "/users/crash1/server", {"profile": "tiny"})
    elapsed = time.monotonic() - t0
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "exited during start with code 3" in message, message
    assert "boom: no such kernel" in message, message
    assert elapsed < 10, elapsed  # not the whole http_timeout
    assert containers_of(engine, "crash1") == []
    spawn_ready(hub, "tom", "tiny")  # node tiny's one slot was freed at once
    stop(hub, "tom")


def test_stop_during_spawn_cancels_cleanly(hub, engine):
    import threading

    hub.ensure_user("slowpoke")
    answer: dict[str, requests.Response] = {}
    t = threading.Thread(target=lambda: answer.setdefault("post", hub.api(
        "POST", "/users/slowpoke/server", {"profile": "tiny"})))
    t.start()
    wait_until(lambda: containers_of(engine, "slowpoke"), 20, 0.05, "a container for slowpoke")
    r = hub.api("DELETE", "/users/slowpoke/server")
    assert r.status_code in (202, 204), r.text
    t.join(60)
    assert answer["post"].status_code != 500 or "Traceback" not in answer["post"].text
    hub.wait_stopped("slowpoke", timeout=60)
    wait_until(lambda: containers_of(engine, "slowpoke") == [], 20, 0.2,
               "slowpoke's container removed")
    assert engine.networks(filters={"label": "gpuspawner.user=slowpoke"}) == []
    spawn_ready(hub, "tom", "tiny")  # nothing of the cancelled spawn is held
    stop(hub, "tom")


def test_allocations_reported_by_the_service_match_running_servers(hub, engine):
    """After all of the above, nothing is booked that does not run."""
    r = hub.api("GET", "/users")
    running = {u["name"] for u in r.json() for s in (u.get("servers") or {}).values()
               if s.get("ready")}
    labelled = {c["Labels"]["gpuspawner.user"] for c in
                own(engine.containers(filters={"label": "gpuspawner.managed=1"}))}
    assert labelled == running
    leftovers = [n["Name"] for n in own(engine.networks(filters={"label": "gpuspawner.user"}))]
    assert len(leftovers) == len(running), leftovers


# -- hub trust: internal_ssl end to end --------------------------------------------------------
def test_internal_ssl_end_to_end(engine, tmp_path):
    """With internal_ssl, hub, proxy and server authenticate each other: the server's
    certificate names its own IP (the hub verifies it), its key is readable by the user only,
    and a neighbour without a client certificate is refused by the server."""
    import subprocess

    nodes = [{"name": "local", "topology": "auto"}]
    profiles = [{"slug": "cpu", "cpu": 0, "memory": "256M", "default": True}]
    h = Hub(tmp_path, nodes, profiles, extra_config="c.GPUSpawner.poll_interval = 2\n")
    h.env.update({"GPUSPAWNER_INTERNAL_SSL": "1", "GPUSPAWNER_CULLER_EVERY": "2"})
    h.start()
    try:
        alice = spawn_ready(h, "alice")
        bob = spawn_ready(h, "bob")
        # the idle culler (a hub-managed service) reaches the TLS hub API with its own
        # client certificate: a complete pass over alice's server, no error
        session = h.login("alice")

        def culler_pass() -> dict | None:
            r = session.get(f"{h.url}/services/idle-culler/api/status", timeout=20)
            last = r.json().get("last_pass") or {} if r.status_code == 200 else {}
            return last if last.get("complete") and last.get("servers") else None

        last = wait_until(culler_pass, 60, 1, "a complete culler pass")
        assert last["errors"] == 0, last
        ip = container_ip(engine, alice["Id"])
        # the route names alice's server: the proxy takes only its certificate at that address
        # (gpuspawner.hub.proxy; any server certificate on the network names its own IP)
        target = f"https://{route_host(object_name('alice', ''), ip)}:8888"
        assert proxy_routes_tls(h)["/user/alice"]["target"] == target
        # through the proxy, the server answers (the proxy presented its client certificate)
        r = h.api("GET", "/users/alice")
        assert r.json()["servers"][""]["ready"] is True
        env = dict(e.split("=", 1) for e in
                   engine.inspect_container(alice["Id"])["Config"]["Env"])
        assert env["JUPYTERHUB_API_URL"].startswith(f"https://{HUB_IP}:")
        cert = env["JUPYTERHUB_SSL_CERTFILE"]
        assert cert.startswith("/etc/gpuspawner/certs/")
        text = run_py(engine, alice["Id"], f"print(open({cert!r}).read())")
        san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"],
                             input=text, capture_output=True, text=True).stdout
        assert f"IP Address:{ip}" in san, san
        # the key: the user's own, read-only mount
        perms = run_py(engine, alice["Id"], (
            "import os\n"
            f"st = os.stat({env['JUPYTERHUB_SSL_KEYFILE']!r})\n"
            "print(oct(st.st_mode & 0o777), st.st_uid == os.getuid())\n"))
        assert perms == "0o400 True", perms
        # the host without a client certificate: the TLS handshake is refused
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(f"https://{ip}:8888/user/alice/api", verify=False, timeout=5)
        # plain http to the TLS server fails too
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://{ip}:8888/user/alice/api", timeout=5)
        assert try_connect(engine, bob["Id"], ip, 8888) != "open"
        stop(h, "alice")
        stop(h, "bob")
    finally:
        h.stop()
        remove_managed(engine)


def proxy_routes_tls(hub) -> dict:
    """The proxy's routes when its API speaks TLS (internal_ssl): client cert of the hub."""
    state = Path(hub.env["GPUSPAWNER_STATE_DIR"]) / "internal-ssl"
    port = hub.env["GPUSPAWNER_PROXY_API_PORT"]
    r = requests.get(f"https://127.0.0.1:{port}/api/routes", timeout=10,
                     headers={"Authorization": f"token {hub.env['CONFIGPROXY_AUTH_TOKEN']}"},
                     verify=str(state / "proxy-api-ca" / "proxy-api-ca.crt"),
                     cert=(str(state / "hub-internal" / "hub-internal.crt"),
                           str(state / "hub-internal" / "hub-internal.key")))
    r.raise_for_status()
    return {k.rstrip("/"): v for k, v in r.json().items()}


# -- engine unreachable, deleted owners ---------------------------------------------------------
class EngineRelay:
    """A unix socket that relays to the real engine's socket: closing it makes a node's
    engine unreachable for the hub while its containers keep running (a test double of a
    network partition between hub and node)."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        import socket
        import threading

        self.path, self.target = path, target
        self.conns: list = []
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(64)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.socket(socket.AF_UNIX)
            b.connect(self.target)
            self.conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        import socket

        self.server.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self.path.unlink(missing_ok=True)


def test_unreachable_engine_stops_the_server_and_sweeps_after(engine, tmp_path):
    """Engine unreachable: the server is shown stopped (poll reports its exit) and its
    allocation released; when the engine answers again, the next placement on the node first
    removes the container that outlived the outage, so devices are never held twice."""
    sock = tmp_path / "relay.sock"
    relay = EngineRelay(sock)
    nodes = [{"name": "relay", "topology": topology(tmp_path, "relay", 300 * MiB),
              "docker_url": f"unix://{sock}"}]
    profiles = [{"slug": "one", "cpu": 0, "memory": "256M", "default": True}]
    h = Hub(tmp_path, nodes, profiles, extra_config="c.GPUSpawner.poll_interval = 1\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    try:
        old = spawn_ready(h, "ray", "one")
        relay.close()
        h.wait_stopped("ray", timeout=60)
        assert engine.inspect_container(old["Id"])["State"]["Running"]  # outlived the outage
        relay = EngineRelay(sock)
        # the hub sees the node answer again at its next check of a down node (every 2 s);
        # until then a spawn there is a 503 naming the node as down
        h.ensure_user("rex")

        def placed() -> bool:
            r = h.api("POST", "/users/rex/server", {"profile": "one"})
            if r.status_code == 503 and "node relay is down" in r.text:
                return False
            assert r.status_code in (201, 202), r.text
            return True

        wait_until(placed, 30, 0.5, "a spawn placed on node relay once it answers again")
        h.wait_ready("rex")  # the allocation of ray was released
        (new,) = containers_of(engine, "rex")
        assert new["Id"] != old["Id"]
        with pytest.raises(docker.errors.NotFound):
            engine.inspect_container(old["Id"])  # swept before rex's container started
        stop(h, "rex")
    finally:
        h.stop()
        relay.close()
        remove_managed(engine)


def test_restored_allocation_of_a_deleted_user_is_released(engine, tmp_path):
    import sqlite3

    nodes = [{"name": "tiny", "topology": topology(tmp_path, "tiny", 300 * MiB)}]
    profiles = [{"slug": "tiny", "cpu": 0, "memory": "256M", "default": True}]
    h = Hub(tmp_path, nodes, profiles, extra_config="c.GPUSpawner.poll_interval = 2\n")
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    try:
        gone = spawn_ready(h, "gone", "tiny")
        h.stop()  # the server keeps running (cleanup_servers = False) ...
        db = sqlite3.connect(Path(h.env["GPUSPAWNER_STATE_DIR"]) / "jupyterhub.sqlite")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("DELETE FROM users WHERE name = 'gone'")  # ... but its owner is deleted
        db.commit()
        db.close()
        h.start()
        spawn_ready(h, "next", "tiny")  # node tiny's one slot was given back
        with pytest.raises(docker.errors.NotFound):
            engine.inspect_container(gone["Id"])
        stop(h, "next")
    finally:
        h.stop()
        remove_managed(engine)
