"""A node's Docker engine over the network: mutual TLS with ``c.DockerBackend.tls_cert_path``
(ca.pem, cert.pem, key.pem, the Docker CLI's layout), plain TCP to another host refused at
start. The engine here is a loopback stand-in that, like ``dockerd --tlsverify``, accepts only
clients with a certificate of its CA and answers ``GET /version``."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from traitlets import TraitError

from gpuspawner.backends.docker_backend import DockerBackend, engine_down, plain_remote_engine
from gpuspawner.hub.cluster import parse_node_config

TOPOLOGY = str(Path(__file__).parent / "data" / "topologies" / "t4-pcie.yaml")


def _pem(obj) -> bytes:
    if isinstance(obj, ec.EllipticCurvePrivateKey):
        return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    return obj.public_bytes(serialization.Encoding.PEM)


def _cert(name: str, key, issuer_name, issuer_key, *, ca: bool = False, ip: str | None = None,
          client: bool = False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(issuer_name).public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
    if client:
        b = b.add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _ca(folder: Path, name: str) -> tuple:
    """A CA in ``folder`` (ca.pem) and a client certificate it signed (cert.pem, key.pem)."""
    folder.mkdir(parents=True)
    key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert(name, key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key,
               ca=True)
    ckey = ec.generate_private_key(ec.SECP256R1())
    (folder / "ca.pem").write_bytes(_pem(ca))
    (folder / "cert.pem").write_bytes(_pem(_cert("hub", ckey, ca.subject, key, client=True)))
    (folder / "key.pem").write_bytes(_pem(ckey))
    return ca, key


@pytest.fixture
def engine(tmp_path):
    """A stand-in engine on 127.0.0.1 with --tlsverify's rule: a server certificate of the
    site's CA, clients only with a certificate of that CA. Yields (port, hub's cert folder)."""
    ca, ca_key = _ca(tmp_path / "hub-certs", "site CA")
    skey = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "server.pem").write_bytes(
        _pem(_cert("engine", skey, ca.subject, ca_key, ip="127.0.0.1")) + _pem(skey))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.pem")
    ctx.load_verify_locations(tmp_path / "hub-certs" / "ca.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"ApiVersion": "1.41", "Version": "stand-in"}).encode()
            self.send_response(200 if self.path.endswith("/version") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], tmp_path / "hub-certs"
    httpd.shutdown()
    httpd.server_close()


def _backend(url: str, **traits) -> DockerBackend:
    backend = DockerBackend(**traits)
    backend.bind({rt.name: rt for rt in parse_node_config(
        [{"name": "gpu-2", "docker_url": url, "topology": TOPOLOGY}])})
    return backend


def test_the_hub_reaches_an_engine_over_mutual_tls(engine):
    port, certs = engine
    backend = _backend(f"tcp://127.0.0.1:{port}", tls_cert_path=str(certs))
    backend.check_config()
    assert backend.client("gpu-2").version()["Version"] == "stand-in"
    assert backend.client("gpu-2").base_url.startswith("https://")


def test_a_hub_without_the_sites_certificate_is_refused(engine, tmp_path):
    """Another CA's client certificate (and an engine certificate the hub's CA did not sign)
    fail the handshake: the engine counts as unavailable, nothing is sent in clear."""
    port, _ = engine
    _ca(tmp_path / "other", "other CA")
    backend = _backend(f"tcp://127.0.0.1:{port}", tls_cert_path=str(tmp_path / "other"))
    with pytest.raises(Exception) as e:
        backend.client("gpu-2")
    assert engine_down(e.value), repr(e.value)


def test_plain_tcp_to_another_host_stops_the_hub():
    backend = _backend("tcp://198.18.7.2:2375")
    with pytest.raises(ValueError, match=r"^nodes\[0\] \(gpu-2\)\.docker_url: tcp://198.18.7.2"
                                         r":2375 is plain TCP: .*c\.DockerBackend\.tls_cert_path"):
        backend.check_config()
    _backend("tcp://127.0.0.1:2375").check_config()  # a loopback tunnel is the admin's
    assert [plain_remote_engine(u) for u in (
        "tcp://node-2:2376", "http://node-2:2375", "https://node-2:2376", "unix:///run/d.sock",
        "ssh://node-2", "", "tcp://localhost:2375")] == [True, True, False, False, False, False,
                                                         False]


def test_a_missing_certificate_file_is_named(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(TraitError, match=r"^DockerBackend.tls_cert_path: .*/cert.pem: missing"):
        DockerBackend(tls_cert_path=str(tmp_path))
