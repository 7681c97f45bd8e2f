"""internal_ssl files of one server: a key pair signed by the hub's notebooks CA that names the
server's own address and a name of this server alone (:func:`server_dns_name`), copied to a
folder only the server's user can read.

JupyterHub's ``Spawner.create_certs`` names files ``user-<name>`` only, which fails for long
names and lets two named servers of one user overwrite each other's certificate; DockerSpawner's
``move_certs`` stages them with an extra container and a volume it leaves behind. Here files are
named after the escaped, capped object name and copied on the host (blocking functions: call
them in a worker thread).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from .runtime import loading_hub

#: the DNS zone of the servers' own names (never resolved: only named in certificates)
SERVER_ZONE = "server.gpuspawner.internal"


def server_dns_name(name: str) -> str:
    """The DNS name that the certificate of server ``name`` (its object name) alone carries:
    ``<32 hex digits of SHA-256(name)>.server.gpuspawner.internal``. Object names differ for
    distinct (user, server) pairs (:mod:`gpuspawner.hub.identity`), so no other server's
    certificate names it; the readiness check verifies the server's certificate against it
    (:func:`gpuspawner.hub.readiness.server_tls`). A label of 32 characters fits DNS's 63."""
    return f"{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}." \
        f"{SERVER_ZONE}"


def create_pair(certs_location: str, name: str, alt_names: Sequence[str], cafile: str
                ) -> dict[str, str]:
    """Sign a key pair ``server-<name>`` with the ``notebooks-ca`` of ``certs_location``,
    valid for ``DNS:localhost``, ``IP:127.0.0.1``, ``alt_names`` and the server's own name
    (:func:`server_dns_name`, which no other server's certificate carries) (certipy, as
    JupyterHub).

    Returns:
        {"keyfile", "certfile", "cafile"}: paths on the hub's host.
    """
    from certipy import Certipy, CertNotFoundError

    names = ["DNS:localhost", "IP:127.0.0.1", *alt_names, f"DNS:{server_dns_name(name)}"]
    store = Certipy(store_dir=certs_location)
    cn = f"server-{name}"
    try:
        key = store.store.get_record(cn)["files"]["key"]
    except CertNotFoundError:
        key = os.path.join(certs_location, cn, f"{cn}.key")  # certipy's own path for it
    _private_file(key)
    pair = store.create_signed_pair(cn, "notebooks-ca", alt_names=names, overwrite=True)
    return {"keyfile": pair["files"]["key"], "certfile": pair["files"]["cert"], "cafile": cafile}


def _private_file(path: str) -> None:
    """Make ``path`` an empty-or-kept regular file 0600 (its folder 0700 when new) before
    certipy writes the key into it: certipy opens a new file with the process's umask (0644
    under 022) in a folder it makes 0755 and makes it 0600 only after writing, and another
    account that opened it in that moment kept a descriptor to the key
    (``tests/test_certs_key_window.py``). An existing file is truncated by certipy and keeps
    its mode.

    Raises:
        OSError: it cannot be made (or is a link: ``O_NOFOLLOW``).
    """
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def private_keys_at_hub_start(app: Any = None) -> bool:
    """Have JupyterHub make its internal_ssl keys (the CAs', ``hub-internal``'s, the
    proxy's; ``init_internal_ssl``, at the first start) under umask 077: certipy writes each
    new key file with the process's umask (0644 under 022) and makes it 0600 only after
    writing, and ``internal_certs_location`` must be traversable by users (their servers'
    copies are below it), so another account could keep a descriptor to the notebooks CA's
    key and sign a certificate for any server. ``app``: the JupyterHub application (default:
    the one loading its configuration files, :func:`gpuspawner.hub.runtime.loading_hub`);
    :func:`gpuspawner.hub.config_check.check_hub_config` calls this.

    Returns:
        True when the application's ``init_internal_ssl`` is wrapped (once), else False.
    """
    app = app if app is not None else loading_hub()
    init = getattr(app, "init_internal_ssl", None)
    if init is None or getattr(app, _KEYS_GUARDED, False):
        return False
    setattr(app, _KEYS_GUARDED, True)

    def init_internal_ssl_with_private_keys() -> Any:
        old = os.umask(0o077)  # at start, in the main thread, before any server or service
        try:
            result = init()
        finally:
            os.umask(old)
        if getattr(app, "internal_ssl", False):
            for key in service_key_files(app.internal_certs_location, app.services):
                _private_file(key)
        return result

    app.init_internal_ssl = init_internal_ssl_with_private_keys
    return True


_KEYS_GUARDED = "_gpuspawner_private_keys"


def service_key_files(certs_location: str, services: Sequence[Mapping[str, Any]]) -> list[str]:
    """The key files JupyterHub's ``Spawner.create_certs`` writes for the hub-managed
    services of ``services`` (``c.JupyterHub.services`` entries with a ``command``) when it
    starts them, after ``init_internal_ssl``: certipy's pair ``user-<user>`` (``user-service``
    for a service without ``user``), ``<certs_location>/<pair>/<pair>.key``, or the path
    certipy's store already records for it. :func:`private_keys_at_hub_start` makes each
    one an empty 0600 file first, so that certipy writes the key into a file no other
    account can open (without it, gpsuser2 read ``user-service.key`` in 2 of 2 first starts:
    ``tests/test_certs_key_window.py``).

    Returns:
        absolute paths, one per pair name, in the order of ``services``.
    """
    from certipy import Certipy, CertNotFoundError

    store = Certipy(store_dir=certs_location)
    paths: list[str] = []
    for spec in services:
        if not spec.get("command"):
            continue
        cn = f"user-{spec.get('user') or 'service'}"
        try:
            key = store.store.get_record(cn)["files"]["key"]
        except CertNotFoundError:
            key = os.path.join(certs_location, cn, f"{cn}.key")
        if key not in paths:
            paths.append(key)
    return paths


def server_folder(certs_location: str, name: str) -> str:
    """The host folder of server ``name``'s copies."""
    return os.path.join(certs_location, "gpuspawner-servers", name)


def copy_for_server(paths: Mapping[str, str], folder: str, uid: int, gid: int, seen_at: str
                    ) -> dict[str, str]:
    """Copy ``paths`` into a fresh ``folder`` (mode 0500, files 0400, owned by uid:gid).

    Returns:
        the same keys with the paths as the server sees them under ``seen_at`` (the folder's
        mount point, or the folder itself).
    """
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, mode=0o700)
    out = {}
    for key, src in paths.items():
        name = os.path.basename(src)
        dst = os.path.join(folder, name)
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o400)
        os.chown(dst, uid, gid)
        out[key] = f"{seen_at}/{name}"
    os.chmod(folder, 0o500)
    os.chown(folder, uid, gid)
    return out


def remove(certs_location: str, name: str, folder: str) -> None:
    """Remove the server's copy ``folder`` and its key pair. Never raises."""
    for path in (folder, os.path.join(certs_location, f"server-{name}")):
        if path:
            shutil.rmtree(path, ignore_errors=True)
