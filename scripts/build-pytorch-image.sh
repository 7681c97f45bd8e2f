#!/usr/bin/env bash
# Build gpuspawner/pytorch:latest (idempotent, cached): the single-user image plus the CUDA
# build of PyTorch (images/pytorch/requirements.in), for the GPU profiles.
#
# 1. pip download on the host into var/wheelhouse/torch-pyXY (binary wheels for the image's
#    Python, manylinux x86_64; ~3 GB: torch and its nvidia-* CUDA libraries);
# 2. a container of the single-user image, no network, the wheelhouse mounted read-only, runs
#    `pip install --no-index` and is committed (the wheels never become a layer);
# 3. docker build of images/pytorch on top of that (the kernel config, gpuspawner-torch-check).
# The image is labelled with a hash of its inputs (files in images/pytorch, this script, the
# single-user image's id); when the existing image carries the same hash nothing is downloaded or built.
#   FORCE=1   rebuild even when the hash matches
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

PYTORCH_IMAGE="${PYTORCH_IMAGE:-gpuspawner/pytorch:latest}"
LAYER_IMAGE="gpuspawner/pytorch:torch-layer"
CTX="$REPO/images/pytorch"
BUILDER="gpuspawner-pytorch-build-$$"

docker info >/dev/null 2>&1 || die "docker engine not answering; run scripts/dockerd.sh (make engine) first"
docker image inspect "$SINGLEUSER_IMAGE" >/dev/null 2>&1 \
  || die "$SINGLEUSER_IMAGE missing; run scripts/build-images.sh (make images) first"

t0=$SECONDS
BASE_ID="$(docker image inspect -f '{{.Id}}' "$SINGLEUSER_IMAGE")"
INPUTS_HASH="$(
  {
    (cd "$CTX" && find . -type f ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum)
    sha256sum <"$REPO/scripts/build-pytorch-image.sh"
    printf '%s\n' "$BASE_ID"
  } | sha256sum | cut -c1-16
)"
HAVE_HASH="$(docker image inspect -f '{{index .Config.Labels "org.gpuspawner.inputs-hash"}}' "$PYTORCH_IMAGE" 2>/dev/null || true)"
if [ "$HAVE_HASH" = "$INPUTS_HASH" ] && [ -z "${FORCE:-}" ]; then
  log "$PYTORCH_IMAGE is up to date (inputs $INPUTS_HASH); nothing to do ($((SECONDS - t0))s)"
  exit 0
fi

# ---------------------------------------------------------------- wheelhouse
image_python "$SINGLEUSER_IMAGE"
WHEELHOUSE="$VAR/wheelhouse/torch-py$PYTAG"
mkdir -p "$WHEELHOUSE"
REQS="$VAR/wheelhouse/requirements-torch-py$PYTAG.txt"
grep -v '^\s*#' "$CTX/requirements.in" | sed '/^\s*$/d' >"$REQS"
log "pip download for Python $PYVER manylinux x86_64 -> ${WHEELHOUSE#"$REPO"/} ($(tr '\n' ' ' <"$REQS"))"
t=$SECONDS
pip_download_wheels "$WHEELHOUSE" "$REQS" pip-download-torch.log
log "wheelhouse ready: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1) in $((SECONDS - t))s"

# ---------------------------------------------------------------- torch layer
log "pip install in a container of $SINGLEUSER_IMAGE (log: var/log/build-pytorch.log)"
t=$SECONDS
cleanup() { docker rm -f "$BUILDER" >/dev/null 2>&1 || true; }
trap cleanup EXIT
docker run --name "$BUILDER" --network none --user 0:0 \
  -v "$WHEELHOUSE:/wheelhouse:ro" -v "$REQS:/tmp/requirements.txt:ro" "$SINGLEUSER_IMAGE" /bin/sh -euc '
    /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
      --disable-pip-version-check -r /tmp/requirements.txt
    /opt/venv/bin/pip check
  ' >"$VAR/log/build-pytorch.log" 2>&1 \
  || { tail -n 30 "$VAR/log/build-pytorch.log" >&2; die "pip install of torch failed (log: var/log/build-pytorch.log)"; }
docker commit --change 'USER 65534:65534' --change 'CMD ["jupyterhub-singleuser"]' \
  "$BUILDER" "$LAYER_IMAGE" >/dev/null
cleanup
log "torch installed and committed in $((SECONDS - t))s"

# ---------------------------------------------------------------- image
t=$SECONDS
docker build --network none --build-arg BASE_IMAGE="$LAYER_IMAGE" \
  --build-arg INPUTS_HASH="$INPUTS_HASH" -t "$PYTORCH_IMAGE" "$CTX" >>"$VAR/log/build-pytorch.log" 2>&1 \
  || { tail -n 30 "$VAR/log/build-pytorch.log" >&2; die "docker build failed (log: var/log/build-pytorch.log)"; }
docker rmi "$LAYER_IMAGE" >/dev/null 2>&1 || true
docker image prune -f --filter "label=org.opencontainers.image.title=gpuspawner pytorch" >/dev/null 2>&1 || true
log "built $PYTORCH_IMAGE in $((SECONDS - t))s (total $((SECONDS - t0))s, $(docker image inspect -f '{{.Size}}' "$PYTORCH_IMAGE" | awk '{printf "%.1f GB", $1/1e9}'))"
