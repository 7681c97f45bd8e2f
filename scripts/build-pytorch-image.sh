#!/usr/bin/env bash
# Build gpuspawner/pytorch:latest (idempotent, cached): the single-user image plus the CUDA
# build of PyTorch (images/pytorch/requirements.in), for the GPU profiles. In stages, on the
# single-user image's deps stage (gpuspawner/singleuser:deps, scripts/build-images.sh):
#
# 1. the torch layer, gpuspawner/pytorch:torch-layer, kept between builds. pip download on the
#    host into var/wheelhouse/torch-pyXY (binary wheels for the image's Python, manylinux
#    x86_64; ~3 GB: torch and its nvidia-* CUDA libraries); a container of the deps image, no
#    network, the wheelhouse mounted read-only, runs `pip install --no-index` + `pip check` and
#    is committed (the wheels never become a layer). Labelled with a hash of the deps image's
#    id and images/pytorch/requirements.in: when the existing layer carries the same hash
#    nothing is downloaded or installed, so a change to the project's code never reinstalls
#    torch.
# 2. the project stage on the torch layer (build_project_stage in scripts/lib.sh: the project's
#    wheel with `pip install --no-deps`, as in gpuspawner/singleuser:latest);
# 3. docker build of images/pytorch on top of that (the kernel config, gpuspawner-torch-check).
# The image is labelled with a hash of its inputs (files in images/pytorch, this script, the
# project stage's inputs on the torch layer's id); when the existing image carries the same
# hash nothing is built.
#   FORCE=1   rebuild the torch layer and the image even when the hashes match
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

PYTORCH_IMAGE="${PYTORCH_IMAGE:-gpuspawner/pytorch:latest}"
LAYER_IMAGE="${PYTORCH_LAYER_IMAGE:-gpuspawner/pytorch:torch-layer}"
STAGE_IMAGE="gpuspawner/pytorch:project-stage"
CTX="$REPO/images/pytorch"
BUILDER="gpuspawner-pytorch-build-$$"

docker info >/dev/null 2>&1 || die "docker engine not answering; run scripts/dockerd.sh (make engine) first"
docker image inspect "$DEPS_IMAGE" >/dev/null 2>&1 \
  || die "$DEPS_IMAGE missing; run scripts/build-images.sh (make images) first"

t0=$SECONDS
# ---------------------------------------------------------------- torch layer
DEPS_ID="$(docker image inspect -f '{{.Id}}' "$DEPS_IMAGE")"
TORCH_HASH="$(
  { echo "torch-layer v1"; sha256sum <"$CTX/requirements.in"; printf '%s\n' "$DEPS_ID"; } \
    | sha256sum | cut -c1-16
)"
HAVE_TORCH="$(image_label "$LAYER_IMAGE" org.gpuspawner.torch-hash)"
if [ "$HAVE_TORCH" = "$TORCH_HASH" ] && [ -z "${FORCE:-}" ]; then
  log "$LAYER_IMAGE is up to date (torch $TORCH_HASH)"
else
  image_python "$DEPS_IMAGE"
  WHEELHOUSE="$VAR/wheelhouse/torch-py$PYTAG"
  mkdir -p "$WHEELHOUSE"
  REQS="$VAR/wheelhouse/requirements-torch-py$PYTAG.txt"
  grep -v '^\s*#' "$CTX/requirements.in" | sed '/^\s*$/d' >"$REQS"
  log "pip download for Python $PYVER manylinux x86_64 -> ${WHEELHOUSE#"$REPO"/} ($(tr '\n' ' ' <"$REQS"))"
  pip_download_wheels "$WHEELHOUSE" "$REQS" pip-download-torch.log

  log "pip install in a container of $DEPS_IMAGE (log: var/log/build-pytorch-layer.log)"
  t=$SECONDS
  cleanup() { docker rm -f "$BUILDER" >/dev/null 2>&1 || true; }
  trap cleanup EXIT
  docker run --name "$BUILDER" --network none --user 0:0 \
    -v "$WHEELHOUSE:/wheelhouse:ro" -v "$REQS:/tmp/requirements.txt:ro" "$DEPS_IMAGE" /bin/sh -euc '
      /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
        --disable-pip-version-check -r /tmp/requirements.txt
      /opt/venv/bin/pip check
    ' >"$VAR/log/build-pytorch-layer.log" 2>&1 \
    || { tail -n 30 "$VAR/log/build-pytorch-layer.log" >&2; die "pip install of torch failed (log: var/log/build-pytorch-layer.log)"; }
  docker commit --change 'CMD ["/bin/sh"]' \
    --change 'LABEL org.opencontainers.image.title="gpuspawner pytorch deps"' \
    --change "LABEL org.gpuspawner.torch-hash=$TORCH_HASH" \
    "$BUILDER" "$LAYER_IMAGE" >/dev/null
  cleanup
  trap - EXIT
  log "torch installed and committed as $LAYER_IMAGE in $((SECONDS - t))s"
fi
LAYER_ID="$(docker image inspect -f '{{.Id}}' "$LAYER_IMAGE")"

# ---------------------------------------------------------------- image
project_hash
INPUTS_HASH="$(
  {
    (cd "$CTX" && find . -type f ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum)
    sha256sum <"$REPO/scripts/build-pytorch-image.sh"
    project_stage_hash "$LAYER_ID"
  } | sha256sum | cut -c1-16
)"
HAVE_HASH="$(image_label "$PYTORCH_IMAGE" org.gpuspawner.inputs-hash)"
if [ "$HAVE_HASH" = "$INPUTS_HASH" ] && [ -z "${FORCE:-}" ]; then
  log "$PYTORCH_IMAGE is up to date (inputs $INPUTS_HASH); nothing to do ($((SECONDS - t0))s)"
  exit 0
fi

t=$SECONDS
: >"$VAR/log/build-pytorch.log"
build_project_stage "$LAYER_IMAGE" "$STAGE_IMAGE" "$INPUTS_HASH" build-pytorch.log
docker build --network none --build-arg BASE_IMAGE="$STAGE_IMAGE" \
  --build-arg INPUTS_HASH="$INPUTS_HASH" -t "$PYTORCH_IMAGE" "$CTX" >>"$VAR/log/build-pytorch.log" 2>&1 \
  || { tail -n 30 "$VAR/log/build-pytorch.log" >&2; die "docker build failed (log: var/log/build-pytorch.log)"; }
# the project stage stays as the image's parent, untagged
docker rmi "$STAGE_IMAGE" >/dev/null 2>&1 || true
docker image prune -f --filter "label=org.opencontainers.image.title=gpuspawner pytorch" >/dev/null 2>&1 || true
docker image prune -f --filter "label=org.opencontainers.image.title=gpuspawner pytorch deps" >/dev/null 2>&1 || true
log "built $PYTORCH_IMAGE in $((SECONDS - t))s (total $((SECONDS - t0))s, $(docker image inspect -f '{{.Size}}' "$PYTORCH_IMAGE" | awk '{printf "%.1f GB", $1/1e9}'))"
