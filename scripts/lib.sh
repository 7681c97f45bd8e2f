# shellcheck shell=bash
# Shared helpers for the project's scripts. Source it; it sets REPO, VAR and helpers.
# GPUSPAWNER_VAR moves var/ (pid files, logs, state) elsewhere: the set-up scripts' tests run
# them against a folder of their own, never the checkout's running engines and cluster.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="${GPUSPAWNER_VAR:-$REPO/var}"
mkdir -p "$VAR/log" "$VAR/run"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# alive PID: the process exists and is no zombie
alive() {
  local st
  st="$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null)" || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# start_time PID: field 22 of /proc/PID/stat (clock ticks after boot), after the "(comm)";
# with the PID it names one process, so a reused PID is not taken for a recorded one
start_time() {
  sed -n 's/^.*) //p' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}

# apt-get update only when a package is missing, and at most once an hour across the scripts
# (a failed install after a skipped update updates and retries once).
_APT_UPDATED=0
[ -n "$(find "$VAR/run/apt-updated" -mmin -60 2>/dev/null)" ] && _APT_UPDATED=1
_apt_update() {
  log "apt-get update"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$VAR/log/apt-update.log" 2>&1 \
    || die "apt-get update failed (see $VAR/log/apt-update.log)"
  _APT_UPDATED=2
  touch "$VAR/run/apt-updated"
}
apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by other means"
  [ "$_APT_UPDATED" -eq 0 ] && _apt_update
  log "apt-get install ${missing[*]}"
  until DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >"$VAR/log/apt-install.log" 2>&1; do
    [ "$_APT_UPDATED" -eq 2 ] \
      && die "apt-get install ${missing[*]} failed (see $VAR/log/apt-install.log)"
    _apt_update
  done
}

# wait_for_engine HOST_ARGS... : poll `docker [HOST_ARGS] info` up to ENGINE_TIMEOUT seconds.
wait_for_engine() {
  local timeout="${ENGINE_TIMEOUT:-60}" i=0
  while ! docker "$@" info >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -ge $((timeout * 2)) ] && return 1
    sleep 0.5
  done
}

SINGLEUSER_IMAGE="${SINGLEUSER_IMAGE:-gpuspawner/singleuser:latest}"

# image_python IMAGE: the version of IMAGE's python3 (run without network) in PYVER ("3.11")
# and PYTAG ("311").
image_python() {
  read -r PYVER PYTAG < <(docker run --rm --network none --entrypoint python3 "$1" \
    -c 'import sys; v=sys.version_info; print(f"{v.major}.{v.minor}", f"{v.major}{v.minor}")') \
    || die "cannot run python3 in $1"
}

# image_label IMAGE LABEL: the image's LABEL (an empty line when the image or the label is
# missing): the fingerprints the build scripts compare before building again
image_label() {
  docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

# pip_download_wheels DEST REQUIREMENTS LOGNAME: binary wheels of REQUIREMENTS (a file) for
# CPython $PYVER/$PYTAG (image_python) on manylinux x86_64 into DEST, by the host's pip (and
# its CA configuration); pip's output in var/log/LOGNAME. pip does not expand a PEP 600
# manylinux tag to older ones, so every tag up to bookworm's glibc (2.36, GLIBC_MINOR) is listed.
# Logs how many wheels DEST holds and how long the download took.
pip_download_wheels() {
  local dest=$1 reqs=$2 logfile="$VAR/log/$3" minor t=$SECONDS
  local platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
                   --platform manylinux1_x86_64)
  for minor in $(seq 5 "${GLIBC_MINOR:-36}"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
    "${platforms[@]}" --python-version "$PYVER" --implementation cp --abi "cp$PYTAG" \
    -d "$dest" -r "$reqs" >"$logfile" 2>&1 \
    || { tail -n 20 "$logfile" >&2; die "pip download failed (log: var/log/$3)"; }
  log "wheelhouse ready: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $((SECONDS - t))s"
}

# ---------------------------------------------------------------- the images' project stage
# The single-user image and the PyTorch image are built in stages: the third-party packages
# (gpuspawner/singleuser:deps, images/singleuser/Dockerfile.deps; the PyTorch image's torch
# layer on it), fingerprinted by their requirements and the image below only, then the project
# stage (images/singleuser/Dockerfile): the gpuspawner wheel with `pip install --no-deps`. A
# change to the project's code rebuilds the project stage alone.
DEPS_IMAGE="${DEPS_IMAGE:-gpuspawner/singleuser:deps}"
PROJECT_STAGE_SRC="$REPO/images/singleuser"

# project_hash: 16 hex digits over what of the checkout goes into the images (pyproject.toml,
# gpuspawner/ and jupyter-config/ as git lists them, the prebuilt lab extension from
# scripts/build-labextension.sh), in PROJECT_HASH.
project_hash() {
  PROJECT_HASH="$(
    cd "$REPO" && {
      git ls-files -z -- pyproject.toml gpuspawner jupyter-config 2>/dev/null \
        | xargs -0 sha256sum 2>/dev/null
      [ -d gpuspawner/labextension_static ] \
        && find gpuspawner/labextension_static -type f | LC_ALL=C sort | xargs sha256sum
    } | sha256sum | cut -c1-16
  )"
}

# project_dependencies: the project's own requirements ([project] dependencies of
# pyproject.toml, one a line), read by .venv's Python; the deps stage installs them so that the
# project stage's `pip install --no-deps` + `pip check` passes.
project_dependencies() {
  "$REPO/.venv/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$REPO/pyproject.toml" || die "cannot read the dependencies of pyproject.toml"
}

# project_stage_hash FROM_ID: the fingerprint (16 hex digits) of the project stage on the image
# FROM_ID (an image id): the stage's files in images/singleuser (Dockerfile.deps and
# requirements.in are the deps stage's, covered by FROM_ID), PROJECT_HASH (project_hash) and
# FROM_ID. Printed.
project_stage_hash() {
  {
    (cd "$PROJECT_STAGE_SRC" && find . -type f ! -name '*.pyc' ! -name Dockerfile.deps \
       ! -name requirements.in | LC_ALL=C sort | xargs sha256sum)
    printf '%s\n' "$PROJECT_HASH" "$1"
  } | sha256sum | cut -c1-16
}

# project_wheel: the gpuspawner wheel of this checkout (server extension, lab extension, kernel
# extension), built by .venv's pip once per PROJECT_HASH into var/build/project-wheel/HASH/
# (build-images.sh and build-pytorch-image.sh share it; older ones are removed); its path in
# PROJECT_WHEEL. Dies when the build fails (log: var/log/project-wheel.log).
project_wheel() {
  [ -n "${PROJECT_HASH:-}" ] || project_hash
  local dir="$VAR/build/project-wheel/$PROJECT_HASH"
  PROJECT_WHEEL="$(find "$dir" -maxdepth 1 -name 'gpuspawner-*.whl' 2>/dev/null | head -n 1 || true)"
  [ -n "$PROJECT_WHEEL" ] && return 0
  rm -rf "$VAR/build/project-wheel"
  mkdir -p "$dir.tmp"
  local t=$SECONDS
  log "building the gpuspawner wheel (server extension, lab extension, kernel extension)"
  "$REPO/.venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$dir.tmp" \
    "$REPO" >"$VAR/log/project-wheel.log" 2>&1 \
    || { tail -n 20 "$VAR/log/project-wheel.log" >&2; die "building the project wheel failed"; }
  mv "$dir.tmp" "$dir"
  PROJECT_WHEEL="$(find "$dir" -maxdepth 1 -name 'gpuspawner-*.whl' | head -n 1 || true)"
  [ -n "$PROJECT_WHEEL" ] || die "pip wheel made no gpuspawner wheel (log: var/log/project-wheel.log)"
  log "built ${PROJECT_WHEEL##*/} in $((SECONDS - t))s"
}

# build_project_stage FROM TAG INPUTS_HASH LOGNAME: docker build of images/singleuser/Dockerfile
# on FROM (an image whose /opt/venv holds every third-party package the project needs), no
# network: the project's wheel (project_wheel) with `pip install --no-index --no-deps`, then
# `pip check`; tagged TAG, labelled org.gpuspawner.inputs-hash=INPUTS_HASH (project_stage_hash).
# The build's output goes to var/log/LOGNAME (appended); dies when the build fails.
build_project_stage() {
  local from=$1 tag=$2 hash=$3 logfile="$VAR/log/$4" ctx t=$SECONDS
  project_wheel
  mkdir -p "$VAR/build"
  ctx="$(mktemp -d "$VAR/build/project-stage.XXXXXX")"
  cp -a "$PROJECT_STAGE_SRC"/. "$ctx"/
  rm -f "$ctx/Dockerfile.deps" "$ctx/requirements.in"
  mkdir "$ctx/wheel"
  cp "$PROJECT_WHEEL" "$ctx/wheel/"
  log "docker build $tag: the project's wheel on $from (log: var/log/$4)"
  docker build --network none --build-arg DEPS_IMAGE="$from" --build-arg INPUTS_HASH="$hash" \
    -t "$tag" "$ctx" >>"$logfile" 2>&1 \
    || { rm -rf "$ctx"; tail -n 30 "$logfile" >&2; die "docker build of $tag failed (log: var/log/$4)"; }
  rm -rf "$ctx"
  log "built $tag (project stage) in $((SECONDS - t))s"
}
