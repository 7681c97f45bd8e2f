"""The check of a user's own image on a Docker node (:meth:`DockerBackend.check_image`), run
before anything is booked for the server, so a pull or a broken image never holds a GPU.

1. The image is on the node, or is pulled (``APIClient.pull(stream=True)``: the engine reports
   each layer's ``progressDetail`` ``current``/``total`` in bytes; their sums are shown). With
   a size limit, a pull stops as soon as the layers it has announced (compressed bytes, as the
   registry sends them) pass it, and an image on the node is refused when its ``Size``
   (``docker image inspect``: uncompressed bytes) does.
2. It is for the node's architecture (the image's ``Architecture`` against the engine's
   ``docker info`` ``Architecture``, as Go names it: ``x86_64`` is ``amd64``).
3. ``jupyterhub-singleuser --version`` runs in it and prints a version, in a throwaway
   container as confined as a server and more: the user's uid:gid, no network
   (``network_mode: none``), no devices, every capability dropped, ``no-new-privileges``,
   256 MiB, 128 processes, removed afterwards; at most the time left of the check.

A failed pull is shown to the user as the engine's error class and a short fixed phrase
(:func:`pull_failure`: "no such image or tag", "the registry refused access", ...), never the
engine's own words, which quote the registry's answer (``error parsing HTTP 404 response body:
... "<body>"``): a registry that is some other service would have its answer shown to the user.
The engine's words go to the hub's log.

Everything here blocks (the docker SDK): the backend runs it in a worker thread.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from .base import ImageCheck, ImageRefused

__all__ = ["ENGINE_ARCH", "check_image_blocking", "pull_failure"]

log = logging.getLogger("gpuspawner")

#: ``docker info`` Architecture (uname -m) -> image Architecture (Go's GOARCH)
ENGINE_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
               "s390x": "s390x", "riscv64": "riscv64"}
#: label of the throwaway containers (found and removed if a hub died during a check)
CHECK_LABEL = "gpuspawner.image-check"
_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?(?:[.\w-]*)?)\b")


#: the engine's words -> what the user is told (first match; else the last phrase)
_PULL_PHRASES = (
    (("manifest unknown", "not found", "404"), "the registry has no such image or tag"),
    (("unauthorized", "denied", "authentication required", "401", "403"),
     "the registry refused access to it"),
    (("toomanyrequests", "429"), "the registry's rate limit"),
    (("timeout", "deadline exceeded", "timed out"), "the registry did not answer in time"),
    (("connection refused", "no such host", "dial tcp", "server misbehaving", "unreachable"),
     "the registry cannot be reached from the node"),
)


def pull_failure(image: str, node: str, error_class: str, words: str) -> ImageRefused:
    """The refusal shown to the user for a failed pull: the engine's error class and a fixed
    phrase picked by the engine's ``words``, which are logged (first 1,000 characters) and
    never shown (they may quote the registry's answer)."""
    low = words.lower()
    phrase = next((p for keys, p in _PULL_PHRASES if any(k in low for k in keys)),
                  "the registry's answer was not one the engine could use")
    log.warning("user image %r: the pull on node %s failed: %s: %s", image, node, error_class,
                words[:1000])
    return ImageRefused(f"image {image!r} is not on node {node} and cannot be pulled "
                        f"({error_class}: {phrase})")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _too_large(image: str, size: int, max_bytes: int, what: str) -> ImageRefused:
    return ImageRefused(f"image {image!r} is larger than users' images may be here: {what} "
                        f"{_size(size)}, at most {_size(max_bytes)}")


def _pull(cli: Any, node: str, image: str, deadline: float,
          report: Callable[[str], None], max_bytes: int = 0) -> None:
    """Pull ``image`` on the node, reporting bytes done of bytes known (``"pulling image X:
    12 of 64 MiB"``, the layers' ``progressDetail`` summed) at most once a second, and once
    more when the pull ends (a pull over loopback may end within the first second). Layers
    already on the node count for nothing.

    Raises:
        ImageRefused: the pull failed, passed the deadline, or its layers passed ``max_bytes``
            (0: no limit; the engine cancels the pull when the stream is closed).
    """
    repo, tag = docker.utils.parse_repository_tag(image)
    if "@" in repo:  # parse_repository_tag leaves a digest on the repository
        repo, tag = repo.split("@", 1)[0], tag
    layers: dict[str, tuple[int, int]] = {}
    last = 0.0
    said = ""

    def words() -> str:
        done = sum(c for c, _ in layers.values())
        total = sum(t for _, t in layers.values())
        return f"pulling image {image}: {done / 2**20:.0f} of {total / 2**20:.0f} MiB"

    try:
        for event in cli.pull(repo, tag=tag or "latest", stream=True, decode=True):
            if "error" in event:
                raise pull_failure(image, node, "pull error", str(event["error"]))
            detail = event.get("progressDetail") or {}
            if event.get("id") and detail.get("total"):
                layers[event["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
                announced = sum(t for _, t in layers.values())
                if max_bytes and announced > max_bytes:
                    raise _too_large(image, announced, max_bytes, "its layers are at least")
            now = time.monotonic()
            if now > deadline:
                raise ImageRefused(f"image {image!r}: the pull on node {node} took longer than "
                                   "the image check allows")
            if event.get("status") in ("Download complete", "Pull complete") \
                    and event.get("id") in layers:  # no progressDetail: the layer is whole
                total = layers[event["id"]][1]
                layers[event["id"]] = (total, total)
            if layers and now - last >= 1.0:
                last, said = now, words()
                report(said)
    except (APIError, NotFound) as e:
        status = getattr(e, "status_code", None)
        raise pull_failure(image, node, f"{type(e).__name__}" + (f" {status}" if status else ""),
                           str(getattr(e, "explanation", None) or e)) from None
    if layers and words() != said:
        report(words())


def check_image_blocking(cli: Any, node: str, image: str, uid: int, gid: int,
                         timeout_s: float, report: Callable[[str], None],
                         known: dict[str, ImageCheck], max_bytes: int = 0) -> ImageCheck:
    """Check ``image`` on ``node`` (see the module's docstring).

    Args:
        cli: the node's ``docker.APIClient``.
        uid, gid: the user's ids (the throwaway container runs as them).
        timeout_s: the whole check's time limit, seconds.
        report: called with progress words (from this thread).
        known: earlier results by image digest (``sha256:...``), read and filled: an image
            passes the container check once per digest.
        max_bytes: the largest image allowed (0: any), see the module's docstring.

    Raises:
        ImageRefused: not pullable, too large, another architecture, no working
            ``jupyterhub-singleuser``, or past ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    try:
        info = cli.inspect_image(image)
    except APIError as e:
        if not isinstance(e, (ImageNotFound, NotFound)):  # e.g. the engine's 400 on a name
            log.warning("user image %r: inspect on node %s failed: %s", image, node, e)
            raise ImageRefused(f"image {image!r}: the engine on node {node} refused the name "
                               f"({type(e).__name__} {e.status_code})") from None
        info = None
    if info is None:
        report(f"pulling image {image} on node {node}")
        _pull(cli, node, image, deadline, report, max_bytes)
        try:
            info = cli.inspect_image(image)
        except (ImageNotFound, NotFound):
            raise ImageRefused(f"image {image!r} is not on node {node} after its pull") from None
    size = int(info.get("Size") or 0)
    if max_bytes and size > max_bytes:
        raise _too_large(image, size, max_bytes, "it is")
    digest = str(info.get("Id", ""))
    arch = str(info.get("Architecture", ""))
    engine_arch = str(cli.info().get("Architecture", ""))
    want = ENGINE_ARCH.get(engine_arch, engine_arch)
    if arch and want and arch != want:
        raise ImageRefused(f"image {image!r} is for {arch}; node {node} runs {want}")
    if digest in known:
        return ImageCheck(image, digest, arch, known[digest].jupyterhub_version)
    report(f"checking image {image}: does jupyterhub-singleuser run in it?")
    try:
        cid = cli.create_container(
            image, ["jupyterhub-singleuser", "--version"], user=f"{uid}:{gid}",
            network_disabled=True, labels={CHECK_LABEL: "1"},
            host_config=cli.create_host_config(
                network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                mem_limit=256 * 2**20, memswap_limit=256 * 2**20, pids_limit=128,
                privileged=False))["Id"]
    except APIError as e:
        raise ImageRefused(f"image {image!r}: the engine refused a container of it: "
                           f"{e.explanation or e}") from None
    try:
        try:
            cli.start(cid)
        except APIError as e:  # e.g. no such executable: the OCI runtime says so at start
            raise ImageRefused(f"image {image!r}: jupyterhub-singleuser does not run in it "
                               f"({e.explanation or e})") from None
        left = max(1.0, deadline - time.monotonic())
        try:
            code = cli.wait(cid, timeout=left).get("StatusCode")
        except (ReadTimeout, RequestsConnectionError):
            raise ImageRefused(f"image {image!r}: jupyterhub-singleuser --version did not end "
                               f"within {timeout_s:g} s") from None
        out = cli.logs(cid, stdout=True, stderr=True).decode("utf-8", "replace").strip()
    finally:
        try:
            cli.remove_container(cid, force=True)
        except (APIError, NotFound):
            pass
    last = out.splitlines()[-1] if out else ""
    m = _VERSION.search(last)
    if code != 0 or m is None:
        raise ImageRefused(f"image {image!r}: jupyterhub-singleuser does not run in it (exit "
                           f"{code}: {last[-200:] or 'no output'})")
    result = ImageCheck(image, digest, arch, m.group(1))
    known[digest] = result
    return result
