#!/usr/bin/env bash
# Start the local Docker engine (idempotent): install docker.io from Debian when dockerd is
# missing, run dockerd without the default bridge (its 172.17.0.0/16 is a private range),
# without NAT or Docker's iptables rules, with 198.18.0.0/16 as the pool for networks made
# without a subnet (ours always name one), and wait until `docker info` answers.
#
# It never stops, restarts or reconfigures an engine it did not start. It records the engine it
# starts in var/run/dockerd.pid ("PID START-TIME", the start time from /proc/PID/stat so that a
# reused PID is not taken for it) and marks it with GPUSPAWNER_DOCKERD_CHECKOUT=<this checkout>
# in the engine's environment. An engine that already answers:
#   - has what the project needs (nvidia-container-runtime-hook on its PATH, default address
#     pools inside 198.18.0.0/15, --iptables=false, no default bridge): left alone, exit 0;
#   - lacks something and is ours (the record matches a live process, or its marker names this
#     checkout or a checkout that was deleted since, e.g. a scratch clone whose test double of
#     the hook is gone): stopped and started again;
#   - lacks something and is not ours (a site's engine, e.g. run by systemd): left running; the
#     script prints what is missing and the commands that fix it, and exits 1, unless the admin
#     asked for the restart with GPUSPAWNER_RESTART_DOCKER=1 (stops it: all its containers stop).
# Environment (all optional):
#   GPUSPAWNER_RESTART_DOCKER=1  restart an engine that lacks something even if it is not ours
#   GPUSPAWNER_ENGINE_PIDFILE    the engine's pid file (default /var/run/docker.pid; passed as
#                                --pidfile to the engine this script starts)
#   DOCKER_HOST                  the engine's socket (the docker client's own variable; passed
#                                as -H to the engine this script starts)
#   GPUSPAWNER_VAR               where var/ is (the record and var/log/dockerd.log; scripts/lib.sh)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ENGINE_PIDFILE="${GPUSPAWNER_ENGINE_PIDFILE:-/var/run/docker.pid}"
RECORD="$VAR/run/dockerd.pid"
LOGF="$VAR/log/dockerd.log"
POOL="198.18.0.0/16"      # the pool this script gives the engine (btrfs engine: 198.19.0.0/16)
NEEDED_RANGE="198.18.0.0/15"
HOOK=nvidia-container-runtime-hook
RESTART="${GPUSPAWNER_RESTART_DOCKER:-0}"
SELF="$REPO/scripts/dockerd.sh"

# hook_on_path PATH: true when a directory of PATH holds an executable $HOOK (dockerd registers
# its "nvidia" device driver only then)
hook_on_path() {
  local d IFS=:
  for d in $1; do
    [ -n "$d" ] && [ -x "$d/$HOOK" ] && return 0
  done
  return 1
}

proc_list() {  # PID FILE: /proc/PID/FILE, one NUL-separated entry a line (empty if unreadable)
  tr '\0' '\n' <"/proc/$1/$2" 2>/dev/null || true
}

env_var() {  # PID NAME: the value of NAME in the process's environment (empty if unreadable)
  proc_list "$1" environ | awk -v k="$2=" 'index($0, k) == 1 { print substr($0, length(k) + 1); exit }'
}

# engine_pid: the live PID in the engine's pid file, if any
engine_pid() {
  local pid
  pid="$(cat "$ENGINE_PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && echo "$pid"
}

# recorded_pid: the PID of the engine this checkout started, when the record matches a live
# process with the recorded start time
recorded_pid() {
  local pid st
  [ -f "$RECORD" ] || return 1
  read -r pid st <"$RECORD" || true
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && [ -n "$st" ] && [ "$(start_time "$pid")" = "$st" ] \
    && echo "$pid"
}

# checkout_of PID: the checkout whose dockerd.sh started the engine: our marker in its
# environment, or (engines started before the marker existed) the exact command line of the
# earlier script with the test double of the hook first on its PATH
checkout_of() {
  local marker first
  marker="$(env_var "$1" GPUSPAWNER_DOCKERD_CHECKOUT)"
  if [ -n "$marker" ]; then
    echo "$marker"
    return 0
  fi
  first="$(env_var "$1" PATH)"
  first="${first%%:*}"
  if [[ "$first" == */tests/doubles ]] && [ "$(proc_list "$1" cmdline | tr '\n' ' ')" \
      = "dockerd --bridge=none --iptables=false --default-address-pool base=$POOL,size=24 " ]; then
    echo "${first%/tests/doubles}"
    return 0
  fi
  return 1
}

# owner PID: "this" (the record matches), "project:DIR" (started by dockerd.sh of this checkout
# or of a checkout DIR that no longer exists), "checkout:DIR" (of another checkout that still
# exists: not ours to restart) or "foreign"
owner() {
  local dir
  if [ "$(recorded_pid || true)" = "$1" ]; then
    echo this
  elif dir="$(checkout_of "$1")"; then
    if [ "$dir" = "$REPO" ] || [ ! -e "$dir/scripts/dockerd.sh" ]; then
      echo "project:$dir"
    else
      echo "checkout:$dir"
    fi
  else
    echo foreign
  fi
}

# systemd_unit PID: the systemd service whose main process PID is (from its cgroup, checked
# against the unit's MainPID: a process merely started from inside some service is not one)
systemd_unit() {
  local unit
  unit="$(awk -F/ '$NF ~ /\.service$/ { print $NF; exit }' "/proc/$1/cgroup" 2>/dev/null || true)"
  [ -n "$unit" ] && command -v systemctl >/dev/null 2>&1 \
    && [ "$(systemctl show -p MainPID --value "$unit" 2>/dev/null || true)" = "$1" ] \
    && echo "$unit"
  return 0
}

# cmdline_flag PID NAME: the value of --NAME=V or --NAME V on the engine's command line
cmdline_flag() {
  local prev="" a
  while IFS= read -r a; do
    if [ "$prev" = "--$2" ]; then echo "$a"; return 0; fi
    case "$a" in --"$2"=*) echo "${a#--"$2"=}"; return 0 ;; esac
    prev="$a"
  done < <(proc_list "$1" cmdline)
  return 1
}

# config_value FILE KEY: a top-level key of a daemon.json, as JSON (empty when absent)
config_value() {
  [ -r "$1" ] || return 0
  python3 -c 'import json, sys
try:
    v = json.load(open(sys.argv[1])).get(sys.argv[2])
except (OSError, ValueError, AttributeError):
    v = None
print("" if v is None else json.dumps(v))' "$1" "$2" 2>/dev/null || true
}

MISSING=()   # what the running engine lacks, one line each
UNKNOWN=()   # what could not be checked (no readable /proc entry)
FIX_JSON=()  # daemon.json settings that fix it
NEED_HOOK=0

# check_engine PID: fill MISSING / UNKNOWN for the engine that answers (PID may be empty)
check_engine() {
  local pid="$1" path pools conf ipt
  MISSING=() UNKNOWN=() FIX_JSON=() NEED_HOOK=0
  # 1. the hook: dockerd looks it up on its own PATH
  path=""
  [ -n "$pid" ] && path="$(env_var "$pid" PATH)"
  if [ -n "$path" ]; then
    if ! hook_on_path "$path"; then
      MISSING+=("$HOOK on the engine's PATH ($path): GPU containers fail with 'exec: \"$HOOK\": executable file not found'")
      NEED_HOOK=1
    fi
  elif ! command -v "$HOOK" >/dev/null 2>&1; then
    if [ -n "$pid" ]; then
      UNKNOWN+=("whether the engine finds $HOOK (the environment of pid $pid is not readable)")
    else
      UNKNOWN+=("whether the engine finds $HOOK (no live pid in $ENGINE_PIDFILE)")
    fi
  fi
  # 2. default address pools: every one inside 198.18.0.0/15 (Docker's built-in ones are
  #    private ranges)
  pools="$(docker info --format '{{json .DefaultAddressPools}}' 2>/dev/null || true)"
  if ! python3 -c 'import ipaddress, json, sys
pools = json.loads(sys.argv[1] or "null") or []
need = ipaddress.ip_network(sys.argv[2])
ok = bool(pools) and all(ipaddress.ip_network(p["Base"]).subnet_of(need) for p in pools)
sys.exit(0 if ok else 1)' "$pools" "$NEEDED_RANGE" 2>/dev/null; then
    MISSING+=("default address pools inside $NEEDED_RANGE (has: ${pools:-unknown}; none listed means Docker's built-in private ranges)")
    FIX_JSON+=("\"default-address-pools\": [{\"base\": \"$POOL\", \"size\": 24}]")
  fi
  # 3. no default bridge network (172.17.0.0/16)
  if docker network inspect bridge >/dev/null 2>&1; then
    MISSING+=("--bridge=none (the default bridge network, 172.17.0.0/16 unless set otherwise, exists)")
    FIX_JSON+=("\"bridge\": \"none\"")
  fi
  # 4. --iptables=false: from the command line, else the engine's daemon.json
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ]; then
    ipt="$(cmdline_flag "$pid" iptables || true)"
    if [ -z "$ipt" ]; then
      conf="$(cmdline_flag "$pid" config-file || echo /etc/docker/daemon.json)"
      ipt="$(config_value "$conf" iptables)"
    fi
    if [ "$ipt" != false ]; then
      MISSING+=("--iptables=false (Docker's NAT and forwarding rules; the engine has iptables=${ipt:-true})")
      FIX_JSON+=("\"iptables\": false")
    fi
  else
    UNKNOWN+=("whether the engine runs with --iptables=false (no readable command line)")
  fi
}

# stop_engine PID UNIT: stop it (through systemd when it runs there) and wait for it
stop_engine() {
  local pid="$1" unit="$2"
  if [ -n "$unit" ]; then
    log "systemctl stop $unit (and docker.socket, which would start it again)"
    systemctl stop docker.socket 2>/dev/null || true
    systemctl stop "$unit" || die "systemctl stop $unit failed"
  else
    kill "$pid" 2>/dev/null || true
  fi
  for _ in $(seq 1 60); do
    alive "$pid" || break
    sleep 0.5
  done
  alive "$pid" && die "dockerd (pid $pid) did not stop within 30 s"
  if [ "$(recorded_pid || true)" = "" ]; then rm -f "$RECORD"; fi
  return 0
}

# refuse PID WHO UNIT: print what the engine lacks and how to fix it; exit 1
refuse() {
  local pid="$1" who="$2" unit="$3" m engine_path="" json=""
  log "ERROR: the running Docker engine (pid ${pid:-unknown}; $who) lacks what gpuspawner needs:"
  for m in "${MISSING[@]}"; do log "  - $m"; done
  log "This script did not start that engine and leaves it running. To fix it, either:"
  if [ "${#FIX_JSON[@]}" -gt 0 ]; then
    for m in "${FIX_JSON[@]}"; do json+="${json:+, }$m"; done
    log "  * give it the settings, e.g. in its daemon.json (/etc/docker/daemon.json; not also as"
    log "    command-line flags): { $json }"
  fi
  if [ "$NEED_HOOK" = 1 ]; then
    [ -n "$pid" ] && engine_path="$(env_var "$pid" PATH)"
    log "  * install the NVIDIA container toolkit (nvidia-container-toolkit) where the engine's"
    log "    PATH finds $HOOK, or on a machine without GPUs put the test double on its PATH"
    if [ -n "$unit" ]; then
      log "    (systemctl edit $unit, then under [Service]:"
      log "    Environment=PATH=$REPO/tests/doubles:${engine_path:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin})"
    else
      log "    (its environment: PATH=$REPO/tests/doubles:${engine_path:-\$PATH})"
    fi
  fi
  if [ -n "$unit" ]; then
    log "    and restart it yourself: systemctl restart $unit"
  elif [ "${#FIX_JSON[@]}" -gt 0 ] || [ "$NEED_HOOK" = 1 ]; then
    log "    and restart it yourself"
  fi
  log "  * or let this script stop it (every container of that engine stops) and start the"
  log "    project's own engine:  GPUSPAWNER_RESTART_DOCKER=1 $SELF"
  [ -n "$pid" ] || log "    (with GPUSPAWNER_ENGINE_PIDFILE=<its pid file>: $ENGINE_PIDFILE names no live process)"
  exit 1
}

engine_info() { docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null || echo '?'; }

# ------------------------------------------------------------------ an engine already there
if ! docker info >/dev/null 2>&1 && pid="$(engine_pid)"; then
  # a live engine that does not answer yet (starting): wait for it, whoever started it
  log "a dockerd (pid $pid) is running but not answering yet; waiting for it"
  # shellcheck disable=SC2119  # the default engine: no -H arguments
  if ! wait_for_engine; then
    [ "$(owner "$pid")" = this ] && { tail -n 30 "$LOGF" >&2 || true; }
    die "dockerd (pid $pid) did not answer 'docker info' within ${ENGINE_TIMEOUT:-60}s; it is left as it is"
  fi
fi

if docker info >/dev/null 2>&1; then
  pid="$(engine_pid || true)"
  check_engine "$pid"
  for m in "${UNKNOWN[@]}"; do log "WARNING: could not check $m"; done
  if [ "${#MISSING[@]}" -eq 0 ]; then
    log "engine already running ($(engine_info)), with what the project needs; left alone"
    exit 0
  fi
  who=foreign unit=""
  if [ -n "$pid" ]; then
    who="$(owner "$pid")"
    unit="$(systemd_unit "$pid")"
  fi
  case "$who" in
    this) desc="started by this script" ;;
    project:*) desc="started by scripts/dockerd.sh of ${who#project:}, a checkout that no longer exists" ;;
    checkout:*) desc="started by ${who#checkout:}/scripts/dockerd.sh, another checkout" ;;
    *) desc="not started by this script${unit:+; systemd unit $unit}" ;;
  esac
  [ "$who" = "project:$REPO" ] && desc="started by this checkout's scripts/dockerd.sh"
  if [ -z "$pid" ]; then
    desc="no live pid in $ENGINE_PIDFILE, so not one this script started"
  fi
  if [ "$who" = this ] || [[ "$who" == project:* ]]; then
    log "the running engine (pid $pid, $desc) lacks:"
    for m in "${MISSING[@]}"; do log "  - $m"; done
    log "restarting it"
    stop_engine "$pid" "$unit"
  elif [ "$RESTART" = 1 ] && [ -n "$pid" ]; then
    log "GPUSPAWNER_RESTART_DOCKER=1: stopping the running engine (pid $pid, $desc), which lacks:"
    for m in "${MISSING[@]}"; do log "  - $m"; done
    stop_engine "$pid" "$unit"
  else
    refuse "$pid" "$desc" "$unit"
  fi
fi

# ------------------------------------------------------------------ start our own
if ! command -v dockerd >/dev/null 2>&1; then
  apt_install docker.io
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after installing docker.io"
# docker.io brings its own client; a client elsewhere on PATH (e.g. /usr/local/bin) also works.

if pid="$(engine_pid)"; then
  die "a process (pid $pid) holds $ENGINE_PIDFILE but no engine answers; it is not stopped" \
      "by this script: stop it yourself, or remove a stale $ENGINE_PIDFILE"
fi
rm -f "$RECORD"

engine_path="$PATH"
if ! command -v "$HOOK" >/dev/null 2>&1; then
  # no NVIDIA container toolkit: a test double of its hook (tests/doubles/) lets containers
  # with GPU device requests start, with no GPU inside; the real hook, when installed, wins
  engine_path="$REPO/tests/doubles:$PATH"
  log "no $HOOK: GPU device requests go to the test double" \
      "tests/doubles/$HOOK (containers start without GPUs)"
fi
host_args=()
[ -n "${DOCKER_HOST:-}" ] && host_args=(-H "$DOCKER_HOST")
log "starting dockerd (--bridge=none --iptables=false), log: $LOGF"
GPUSPAWNER_DOCKERD_CHECKOUT="$REPO" PATH="$engine_path" setsid dockerd \
  --pidfile "$ENGINE_PIDFILE" "${host_args[@]}" --bridge=none --iptables=false \
  --default-address-pool "base=$POOL,size=24" \
  >"$LOGF" 2>&1 </dev/null &
started=$!

# shellcheck disable=SC2119
if ! wait_for_engine; then
  tail -n 30 "$LOGF" >&2 || true
  die "docker engine did not answer 'docker info' within ${ENGINE_TIMEOUT:-60}s (log: $LOGF)"
fi
pid="$(engine_pid || echo "$started")"
echo "$pid $(start_time "$pid")" >"$RECORD"
log "engine ready (pid $pid, recorded in $RECORD;" \
    "$(docker info --format '{{.ServerVersion}} {{.Driver}} cgroup v{{.CgroupVersion}}' 2>/dev/null || echo '?'))"
