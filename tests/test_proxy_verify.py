"""The proxy's route accepts only its own server's certificate (gpuspawner.hub.proxy and its
node preload proxy_verify.js): route hosts, and a real node making TLS requests as
configurable-http-proxy does (an https.Agent, the browser's Host header) to servers with
certificates of one CA."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuspawner.hub import certs
from gpuspawner.hub.proxy import PRELOAD, address_of, hub_target, node_options, route_host

NODE = shutil.which("node")


def label(name: str) -> str:
    return certs.server_dns_name(name).split(".", 1)[0]


def test_route_hosts_carry_the_servers_label_and_address() -> None:
    lab = label("jupyter-alice")
    assert route_host("jupyter-alice", "127.0.0.1") == f"{lab}.127.0.0.1.server.gpuspawner.internal"
    assert (
        route_host("jupyter-alice", "Node1.Cluster.")
        == f"{lab}.node1.cluster.server.gpuspawner.internal"
    )
    six = route_host("jupyter-alice", "fd00::5")
    assert six == f"{lab}.ip6-fd000000000000000000000000000005.server.gpuspawner.internal"
    assert address_of(six) == (lab, "fd00::5")
    assert address_of(route_host("jupyter-alice", "198.18.0.7")) == (lab, "198.18.0.7")
    assert address_of("127.0.0.1") is None
    assert address_of("nothex.127.0.0.1.server.gpuspawner.internal") is None
    # the hub's view of a target is the address it wrote; other targets are left alone
    assert hub_target(f"https://{six}:8888") == "https://[fd00::5]:8888"
    assert (
        hub_target(f"https://{lab}.10.1.2.3.server.gpuspawner.internal:1") == "https://10.1.2.3:1"
    )
    assert hub_target("http://127.0.0.1:8081") == "http://127.0.0.1:8081"
    for bad in ("a b", "x_y.example", "-x", "a" * 250):
        with pytest.raises(ValueError):
            route_host("jupyter-alice", bad)
    assert route_host("jupyter-alice", "a") != route_host("jupyter-bob", "a")
    assert node_options(None) == f"--require {json.dumps(PRELOAD)}"
    assert (
        node_options("--max-old-space-size=512")
        == f"--max-old-space-size=512 --require {json.dumps(PRELOAD)}"
    )
    assert node_options(node_options(None)) == node_options(None)


@pytest.fixture
def ca(tmp_path: Path) -> Iterator[Path]:
    from certipy import Certipy

    Certipy(store_dir=str(tmp_path)).create_ca("notebooks-ca")
    yield tmp_path


def tls_server(ca: Path, name: str) -> tuple[int, list[str]]:
    """A TLS server on 127.0.0.1 with server ``name``'s certificate (which, like every server
    certificate, names 127.0.0.1 and localhost too); it answers ``name`` and logs each
    request line it gets."""
    pair = certs.create_pair(str(ca), name, ["IP:127.0.0.1"], "")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pair["certfile"], pair["keyfile"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    seen: list[str] = []

    def serve() -> None:
        while True:
            conn, _ = sock.accept()
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    seen.append(tls.recv(65536).decode().split("\r\n", 1)[0])
                    body = name.encode()
                    tls.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: "
                        + str(len(body)).encode()
                        + b"\r\n\r\n"
                        + body
                    )
            except (OSError, ssl.SSLError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1], seen


#: node as configurable-http-proxy asks a server: https.request through an https.Agent with
#: the CA, the request's Host header passed on (argv: url, host header, CA file)
REQUEST = r"""
const https = require("https"), fs = require("fs");
const [url, host, ca] = process.argv.slice(1);
const agent = new https.Agent({keepAlive: true});
const u = new URL(url);
const req = https.request({hostname: u.hostname, port: u.port, path: "/user/x/api", agent,
                           ca: fs.readFileSync(ca), headers: {host}}, (res) => {
  let body = "";
  res.on("data", (d) => body += d);
  res.on("end", () => { console.log("OK " + body); process.exit(0); });
});
req.on("error", (e) => { console.log("ERR " + e.code); process.exit(0); });
req.end();
"""


def node_get(url: str, host: str, ca: Path, preload: bool = True) -> str:
    env = {"PATH": "/usr/bin:/bin"}
    if preload:
        env["NODE_OPTIONS"] = node_options(None)
    out = subprocess.run(
        [NODE, "-e", REQUEST, url, host, str(ca / "notebooks-ca" / "notebooks-ca.crt")],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_proxy_takes_only_the_routes_own_certificate(ca: Path) -> None:
    """A route to server alice's name on 127.0.0.1:PORT: alice's server is reached; bob's
    server (same CA, same address in its certificate) on that port is refused, whatever Host
    header the browser sent (``localhost`` is in every server certificate) and never gets the
    request. Without the preload the name resolves nowhere: the request fails, it never
    reaches a server. A target that is an address is left to node's own check."""
    alice_port, alice_seen = tls_server(ca, "jupyter-alice")
    bob_port, bob_seen = tls_server(ca, "jupyter-bob")
    to_alice = f"https://{route_host('jupyter-alice', '127.0.0.1')}"
    for host in ("127.0.0.1:8000", "localhost:8000", "hub.example.org"):
        assert node_get(f"{to_alice}:{alice_port}", host, ca) == "OK jupyter-alice"
        assert node_get(f"{to_alice}:{bob_port}", host, ca) == "ERR ERR_TLS_CERT_ALTNAME_INVALID", (
            host
        )
    assert bob_seen == []
    assert len(alice_seen) == 3
    assert (
        node_get(f"{to_alice}:{alice_port}", "127.0.0.1:8000", ca, preload=False) == "ERR ENOTFOUND"
    )
    # an address as target: node's check against the address (what the route was before)
    assert node_get(f"https://127.0.0.1:{bob_port}", "127.0.0.1:8000", ca) == "OK jupyter-bob"
