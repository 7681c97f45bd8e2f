"""A server's private key is never readable by another account, not even for a moment
(gpuspawner.hub.certs.create_pair): certipy writes a new key file with the process's umask
(0644 under 022) in a folder it makes 0755 and only then makes it 0600, and a file opened in
that moment stays readable through its descriptor. With the key of a user's server (its
certificate names that server alone), another account could answer as that server to the
hub's readiness check and to the proxy (docs/security.md)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuspawner.hub import certs

OTHER = "gpsuser2"

#: the other account: opens PATH whenever it can until the file STOP exists (at most 120 s),
#: then prints "KEY" if a descriptor it got shows a private key (read after the writer closed
#: the file)
GRABBER = r"""
import os, sys, time
path, stop = sys.argv[1], sys.argv[2]
end = time.monotonic() + 120
fds = []
tries = 0
while len(fds) < 200:
    tries += 1
    if tries % 500 == 0 and (os.path.exists(stop) or time.monotonic() > end):
        break
    try:
        fds.append(os.open(path, os.O_RDONLY))
    except OSError:
        continue
time.sleep(0.2)
print("KEY" if any(b"PRIVATE KEY" in os.pread(fd, 8192, 0) for fd in fds) else
      f"none ({len(fds)} opened)", flush=True)
"""


def test_another_account_never_reads_a_servers_key_while_it_is_made() -> None:
    """gpsuser2 tries to open the key file of server jupyter-victim without pause while the
    hub makes that server's key pair 40 times (as 40 spawns do: each stop removes the
    pair); it never gets a descriptor that shows the key."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the hub makes keys as root; the other account runs by runuser)")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        pytest.skip(f"no account {OTHER} (make slurm makes it)")
    from certipy import Certipy

    store = Path(tempfile.mkdtemp(prefix="gps-keys-", dir="/tmp"))
    store.chmod(0o755)  # users traverse it: their servers' copies live below it
    grabber = None
    try:
        Certipy(store_dir=str(store)).create_ca("notebooks-ca")
        name = "jupyter-victim"
        key = store / f"server-{name}" / f"server-{name}.key"
        stop = store / "stop"
        grabber = subprocess.Popen(
            ["runuser", "-u", OTHER, "--", "/usr/bin/python3", "-c", GRABBER, str(key), str(stop)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(40):
            pair = certs.create_pair(str(store), name, ["IP:127.0.0.1"], "")
            assert pair["keyfile"] == str(key)
            assert os.stat(key).st_mode & 0o077 == 0
            certs.remove(str(store), name, "")
        stop.touch()  # it stops trying and reports what it holds
        out, _ = grabber.communicate(timeout=30)
        assert "KEY" not in out, f"{OTHER} read the server's private key: {out}"
    finally:
        if grabber is not None and grabber.poll() is None:
            os.killpg(grabber.pid, signal.SIGKILL)
            grabber.wait()
        shutil.rmtree(store, ignore_errors=True)


#: the other account: opens every path of argv[2:] whenever it can until the file argv[1]
#: exists (at most 120 s), then prints the paths whose descriptor showed a private key
GRAB_MANY = r"""
import os, sys, time
stop, paths = sys.argv[1], sys.argv[2:]
end = time.monotonic() + 120
held = {}
tries = 0
while True:
    tries += 1
    if tries % 50 == 0 and (os.path.exists(stop) or time.monotonic() > end):
        break
    for p in paths:
        if p not in held:
            try:
                held[p] = os.open(p, os.O_RDONLY)
            except OSError:
                pass
time.sleep(0.2)
print("KEYS", [p for p, fd in held.items() if b"PRIVATE KEY" in os.pread(fd, 8192, 0)],
      flush=True)
"""


def test_another_account_never_reads_the_hubs_ca_keys_at_first_start(tmp_path: Path) -> None:
    """A real JupyterHub (internal_ssl, its configurable-http-proxy) starts for the first time
    with ``internal_certs_location`` in a folder users traverse; its configuration calls
    :func:`gpuspawner.hub.certs.private_keys_at_hub_start` (as ``check_hub_config`` does).
    gpsuser2 tries to open the key files of the CAs, ``hub-internal`` and the proxy's without
    pause while the hub makes them: none is ever readable to it (without the call it read
    ``services-ca.key`` and ``hub-internal.key`` in 4 of 4 starts). The same holds for the
    key of a hub-managed service, which JupyterHub's ``Spawner.create_certs`` makes later,
    when it starts the service."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the other account runs by runuser)")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        pytest.skip(f"no account {OTHER} (make slurm makes it)")
    from gpuspawner.testing.hubrunner import HubProcess, free_port
    from gpuspawner.testing.slurm_hub import chp

    if chp() is None:
        pytest.skip("configurable-http-proxy is not installed (make venv installs it)")
    top = Path(tempfile.mkdtemp(prefix="gps-cakeys-", dir="/tmp"))
    top.chmod(0o755)
    location = top / "internal-ssl"
    names = [
        "hub-ca",
        "proxy-api-ca",
        "proxy-client-ca",
        "notebooks-ca",
        "services-ca",
        "hub-internal",
        "proxy-api",
        "proxy-client",
        "user-service",  # the hub-managed service below: "user-" + (its user or "service")
    ]
    keys = [str(location / n / f"{n}.key") for n in names]
    stop = top / "stop"
    url = f"http://127.0.0.1:{free_port()}"
    hub = HubProcess(tmp_path, url, f"{url}/hub/api", "")
    hub.config.write_text(f"""
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = {url!r}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "https://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{chp()!r}]
c.JupyterHub.internal_ssl = True
c.JupyterHub.internal_certs_location = {str(location)!r}
c.JupyterHub.db_url = "sqlite:///{tmp_path}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp_path}/cookie_secret"
c.JupyterHub.pid_file = "{tmp_path}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{tmp_path}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = [{{"name": "keeper", "command": [{sys.executable!r}, "-c",
                          "import time; time.sleep(600)"]}}]
from gpuspawner.hub.certs import private_keys_at_hub_start
private_keys_at_hub_start()
""")
    grabber = subprocess.Popen(
        ["runuser", "-u", OTHER, "--", "/usr/bin/python3", "-c", GRAB_MANY, str(stop), *keys],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        hub.start()
        assert all(Path(k).stat().st_size > 0 for k in keys)
        stop.touch()
        out, _ = grabber.communicate(timeout=30)
        assert out.startswith("KEYS"), out
        assert out.strip() == "KEYS []", f"{OTHER} read the hub's keys: {out}"
    finally:
        if grabber.poll() is None:
            os.killpg(grabber.pid, signal.SIGKILL)
            grabber.wait()
        hub.stop()
        shutil.rmtree(top, ignore_errors=True)
