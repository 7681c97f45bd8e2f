"""The project's private image registry (``scripts/registry.sh``, ``make registry``: Debian's
docker-registry on 127.0.0.1) and a user's own image in it, for the real-pull tests and
benchmarks/user_image.py.

A "user's image" here is the single-user image plus one layer of random bytes of its own, built
under the registry's name, pushed, and removed from the engine again: pulling it back transfers
that layer for real (the base layers are on the engine already, as a user's image built on a
site's common base would find them), and it runs ``jupyterhub-singleuser`` like ours.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hubrunner import REPO

__all__ = ["PushedImage", "describe", "drop_pushed_image", "pulled_from", "push_user_image",
           "registry_address"]

#: written by scripts/registry.sh while its registry runs ("127.0.0.1:PORT")
ADDRESS_FILE = REPO / "var" / "run" / "registry.addr"
#: where the random layer lands in the image (writable by the base image's user)
LAYER_PATH = "/tmp/gpuspawner-user-layer.bin"
_MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json, "
                   "application/vnd.oci.image.manifest.v1+json")


def registry_address(address_file: Path = ADDRESS_FILE) -> str | None:
    """``"127.0.0.1:PORT"`` of the running project registry ($GPUSPAWNER_REGISTRY, else the
    file ``scripts/registry.sh`` writes), or None when none answers ``GET /v2/`` with the
    registry API's version header within 3 s. Only loopback addresses are taken."""
    address = os.environ.get("GPUSPAWNER_REGISTRY", "").strip()
    if not address:
        try:
            address = address_file.read_text().strip()
        except OSError:
            return None
    if not address.startswith("127."):
        return None
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=3) as r:
            ok = r.headers.get("Docker-Distribution-Api-Version") == "registry/2.0"
    except (OSError, urllib.error.URLError):
        return None
    return address if ok else None


@dataclass(frozen=True)
class PushedImage:
    """A user's image in the registry: ``reference`` (``127.0.0.1:PORT/name:tag``), the
    manifest ``digest`` the push reported, and ``layer_bytes`` (the size of its own layer's
    file; the pull transfers about that much)."""

    reference: str
    digest: str
    layer_bytes: int


def push_user_image(client: Any, address: str, base: str, name: str = "gpuspawner/user-image",
                    layer_mib: int = 64) -> PushedImage:
    """Build ``base`` + a layer of ``layer_mib`` MiB of random bytes as
    ``address/name:<random tag>`` (no network in the build), push it to the registry at
    ``address`` and remove it from the engine (only that image: the base stays).

    Args:
        client: a ``docker.APIClient`` of the engine.
        address: the registry, ``127.0.0.1:PORT``.
        base: a local image (the single-user image).
        layer_mib: 1..1024.

    Raises:
        RuntimeError: the build or the push reported an error (its words).
        ValueError: ``layer_mib`` out of range.
    """
    if not 1 <= layer_mib <= 1024:
        raise ValueError(f"layer_mib must be 1..1024, got {layer_mib}")
    reference = f"{address}/{name}:{secrets.token_hex(4)}"
    dockerfile = (f"FROM {base}\n"
                  f"RUN head -c {layer_mib * 2**20} /dev/urandom > {LAYER_PATH}\n")
    for event in client.build(fileobj=io.BytesIO(dockerfile.encode()), tag=reference, rm=True,
                              nocache=True, network_mode="none", decode=True):
        if "error" in event:
            raise RuntimeError(f"building {reference}: {event['error']}")
    repo, tag = reference.rsplit(":", 1)
    digest = ""
    try:
        for event in client.push(repo, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise RuntimeError(f"pushing {reference}: {event['error']}")
            digest = (event.get("aux") or {}).get("Digest", digest)
    finally:
        client.remove_image(reference, force=True)
    if not digest:
        raise RuntimeError(f"pushing {reference}: the engine reported no digest")
    return PushedImage(reference, digest, layer_mib * 2**20)


def drop_pushed_image(client: Any, image: PushedImage) -> None:
    """Remove ``image`` from the engine (if pulled) and its manifest from the registry (its
    blobs go at the registry's next garbage collection, which ``scripts/registry.sh`` runs
    before it starts the registry). Errors are ignored: this is clean-up."""
    try:
        client.remove_image(image.reference, force=True)
    except Exception:  # noqa: BLE001 - clean-up: already gone is fine
        pass
    address, rest = image.reference.split("/", 1)
    repo = rest.rsplit(":", 1)[0]
    req = urllib.request.Request(f"http://{address}/v2/{repo}/manifests/{image.digest}",
                                 method="DELETE", headers={"Accept": _MANIFEST_TYPES})
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except (OSError, urllib.error.URLError):
        pass


def pulled_from(client: Any, image: PushedImage) -> bool:
    """The engine has ``image`` and records it as pulled from the registry by its digest
    (``RepoDigests`` holds ``address/name@digest``)."""
    try:
        info = client.inspect_image(image.reference)
    except Exception:  # noqa: BLE001 - absent
        return False
    repo = image.reference.rsplit(":", 1)[0]
    return f"{repo}@{image.digest}" in (info.get("RepoDigests") or [])


def describe(image: PushedImage) -> str:
    """One line for logs and benchmark output."""
    return json.dumps({"reference": image.reference, "digest": image.digest,
                       "layer_MiB": image.layer_bytes // 2**20})
