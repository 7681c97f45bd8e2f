#!/usr/bin/env bash
# Build gpuspawner/singleuser:latest (idempotent, cached), in two stages.
#
# Base image: $BASE_IMAGE when set; else quay.io/jupyter/base-notebook when a registry answers
# (pull with a ~20 s timeout); else local/debian-python:bookworm, made here by debootstrap
# (cached: made once). The Python packages come from a wheelhouse downloaded on the host
# (var/wheelhouse/pyXY, binary wheels for the base's Python on manylinux x86_64) and are installed
# in the build with `pip install --no-index`: no network, no CA needed inside the build.
#
# 1. gpuspawner/singleuser:deps (images/singleuser/Dockerfile.deps): every third-party package,
#    labelled with a hash of Dockerfile.deps, the requirement list (requirements.in, the pinned
#    jupyterhub version, the project's own dependencies from pyproject.toml) and the base
#    image's id; when the existing deps image carries the same hash it is kept, and nothing is
#    downloaded.
# 2. gpuspawner/singleuser:latest (images/singleuser/Dockerfile, build_project_stage in
#    scripts/lib.sh): the project's wheel on the deps image with `pip install --no-deps` and
#    `pip check`, labelled with a hash of the stage's files, the project's sources and the deps
#    image's id; when the existing image carries the same hash nothing is built. A change to
#    the project's code rebuilds this stage alone (seconds), not the 125 wheels below it.
#   FORCE=1   rebuild both stages even when the hashes match
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

CTX_SRC="$REPO/images/singleuser"
LOCAL_BASE="local/debian-python:bookworm"
REGISTRY_BASE="quay.io/jupyter/base-notebook:latest"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv,python3-pip,tini,procps,ca-certificates"
PY="$REPO/.venv/bin/python"

docker info >/dev/null 2>&1 || die "docker engine not answering; run scripts/dockerd.sh (make engine) first"

t0=$SECONDS
# ---------------------------------------------------------------- base image
make_local_base() {
  # cache key: the package list; a base made with another list is rebuilt
  local want have
  want="$(printf 'v2 %s %s' "$BASE_PACKAGES" "$DEBIAN_MIRROR" | sha256sum | cut -c1-16)"
  have="$(image_label "$LOCAL_BASE" org.gpuspawner.base-hash)"
  if [ "$have" = "$want" ]; then
    log "base $LOCAL_BASE exists (cached)"
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
  local rootfs
  rootfs="$(mktemp -d /tmp/gpuspawner-rootfs.XXXXXX)"
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  log "debootstrap bookworm -> $rootfs (log: var/log/debootstrap.log)"
  local t=$SECONDS
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$DEBIAN_MIRROR" \
    >"$VAR/log/debootstrap.log" 2>&1 \
    || { tail -n 20 "$VAR/log/debootstrap.log" >&2; die "debootstrap failed"; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
  # mktemp -d made the root 0700; the image's / must be 0755 (btrfs keeps the layer's mode,
  # and a non-root uid could not even stat /bin/sh)
  chmod 0755 "$rootfs"
  log "debootstrap done in $((SECONDS - t))s; importing as $LOCAL_BASE"
  tar -C "$rootfs" -c . | docker import \
    --change "LABEL org.gpuspawner.base-hash=$want" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
}

if [ -n "${BASE_IMAGE:-}" ]; then
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || timeout 300 docker pull -q "$BASE_IMAGE" >/dev/null \
    || die "BASE_IMAGE=$BASE_IMAGE is neither local nor pullable"
elif docker image inspect "$REGISTRY_BASE" >/dev/null 2>&1; then
  BASE_IMAGE="$REGISTRY_BASE"
elif timeout "${PULL_TIMEOUT:-20}" docker pull -q "$REGISTRY_BASE" >/dev/null 2>&1; then
  BASE_IMAGE="$REGISTRY_BASE"
else
  log "no registry reachable; using a local debootstrap base"
  make_local_base
  BASE_IMAGE="$LOCAL_BASE"
fi
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
log "base image: $BASE_IMAGE (${BASE_ID:7:12})"

# ---------------------------------------------------------------- stage 1: deps
[ -x "$PY" ] || die ".venv missing; run 'make venv' first (jupyterhub is pinned to the hub's version)"
JUPYTERHUB_VERSION="${JUPYTERHUB_VERSION:-$("$PY" -c 'import jupyterhub; print(jupyterhub.__version__)' 2>/dev/null)}" \
  || die "jupyterhub is not installed in .venv; run 'make venv'"
REQS="$(grep -v '^\s*#' "$CTX_SRC/requirements.in" | sed '/^\s*$/d'; echo "jupyterhub==$JUPYTERHUB_VERSION"
        project_dependencies)"
DEPS_HASH="$(
  { sha256sum <"$CTX_SRC/Dockerfile.deps"; printf '%s\n' "$REQS" "$BASE_ID"; } | sha256sum | cut -c1-16
)"
HAVE_DEPS="$(image_label "$DEPS_IMAGE" org.gpuspawner.deps-hash)"
if [ "$HAVE_DEPS" = "$DEPS_HASH" ] && [ -z "${FORCE:-}" ]; then
  log "$DEPS_IMAGE is up to date (deps $DEPS_HASH)"
else
  # The base image's Python decides which wheels to fetch.
  image_python "$BASE_IMAGE"
  WHEELHOUSE="$VAR/wheelhouse/py$PYTAG"
  mkdir -p "$WHEELHOUSE"
  printf '%s\n' "$REQS" >"$VAR/wheelhouse/requirements-py$PYTAG.txt"
  log "pip download for Python $PYVER manylinux x86_64 -> var/wheelhouse/py$PYTAG (jupyterhub==$JUPYTERHUB_VERSION)"
  pip_download_wheels "$WHEELHOUSE" "$VAR/wheelhouse/requirements-py$PYTAG.txt" pip-download.log

  CTX="$VAR/build/singleuser-deps"
  rm -rf "$CTX"
  mkdir -p "$CTX"
  cp "$CTX_SRC/Dockerfile.deps" "$CTX/Dockerfile"
  cp "$VAR/wheelhouse/requirements-py$PYTAG.txt" "$CTX/requirements.txt"
  cp -a "$WHEELHOUSE" "$CTX/wheelhouse"
  log "docker build $DEPS_IMAGE (log: var/log/build-singleuser-deps.log)"
  t=$SECONDS
  docker build --network none \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg DEPS_HASH="$DEPS_HASH" \
    -t "$DEPS_IMAGE" "$CTX" >"$VAR/log/build-singleuser-deps.log" 2>&1 \
    || { tail -n 30 "$VAR/log/build-singleuser-deps.log" >&2; die "docker build failed (log: var/log/build-singleuser-deps.log)"; }
  rm -rf "$CTX"
  log "built $DEPS_IMAGE in $((SECONDS - t))s"
fi
DEPS_ID="$(docker image inspect -f '{{.Id}}' "$DEPS_IMAGE")"

# ---------------------------------------------------------------- stage 2: the project
# The project itself (server extension gpuspawner.singleuser.gpuviews, the prebuilt JupyterLab
# extension from scripts/build-labextension.sh, %load_ext gpuspawner.kernel): its sources and
# the built extension are part of the inputs.
project_hash
INPUTS_HASH="$(project_stage_hash "$DEPS_ID")"
HAVE_HASH="$(image_label "$SINGLEUSER_IMAGE" org.gpuspawner.inputs-hash)"
if [ "$HAVE_HASH" = "$INPUTS_HASH" ] && [ -z "${FORCE:-}" ]; then
  log "$SINGLEUSER_IMAGE is up to date (inputs $INPUTS_HASH); nothing to do ($((SECONDS - t0))s)"
  exit 0
fi
: >"$VAR/log/build-singleuser.log"
build_project_stage "$DEPS_IMAGE" "$SINGLEUSER_IMAGE" "$INPUTS_HASH" build-singleuser.log
log "$SINGLEUSER_IMAGE ready (total $((SECONDS - t0))s)"
docker image prune -f --filter "label=org.opencontainers.image.title=gpuspawner single-user" >/dev/null 2>&1 || true
docker image prune -f --filter "label=org.opencontainers.image.title=gpuspawner single-user deps" >/dev/null 2>&1 || true
