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

# pip_download_wheels DEST REQUIREMENTS LOGNAME: binary wheels of REQUIREMENTS (a file) for
# CPython $PYVER/$PYTAG (image_python) on manylinux x86_64 into DEST, by the host's pip (and
# its CA configuration); pip's output in var/log/LOGNAME. pip does not expand a PEP 600
# manylinux tag to older ones, so every tag up to bookworm's glibc (2.36, GLIBC_MINOR) is listed.
pip_download_wheels() {
  local dest=$1 reqs=$2 logfile="$VAR/log/$3" minor
  local platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
                   --platform manylinux1_x86_64)
  for minor in $(seq 5 "${GLIBC_MINOR:-36}"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
    "${platforms[@]}" --python-version "$PYVER" --implementation cp --abi "cp$PYTAG" \
    -d "$dest" -r "$reqs" >"$logfile" 2>&1 \
    || { tail -n 20 "$logfile" >&2; die "pip download failed (log: var/log/$3)"; }
}
