#!/usr/bin/env bash
# Start the local Docker engine (idempotent): install docker.io from Debian when dockerd is
# missing, run dockerd without the default bridge (its 172.17.0.0/16 is a private range),
# without NAT or Docker's iptables rules, with 198.18.0.0/16 as the pool for networks made
# without a subnet (ours always name one), and wait until `docker info` answers. An engine that
# already answers is left alone.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# hook_on_path PATH: true when a directory of PATH holds an executable
# nvidia-container-runtime-hook (dockerd registers its "nvidia" device driver only then)
hook_on_path() {
  local d IFS=:
  for d in $1; do
    [ -n "$d" ] && [ -x "$d/nvidia-container-runtime-hook" ] && return 0
  done
  return 1
}

if docker info >/dev/null 2>&1; then
  pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  engine_env_path=""
  if [ -n "$pid" ] && [ -r "/proc/$pid/environ" ]; then
    engine_env_path="$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^PATH=//p')"
  fi
  # An engine started by another checkout finds the test double of the hook in that checkout;
  # once that checkout is deleted, GPU containers fail with 'exec: "nvidia-container-runtime-
  # hook": executable file not found'. Such an engine is restarted; any other is left alone.
  if [ -n "$engine_env_path" ] && ! command -v nvidia-container-runtime-hook >/dev/null 2>&1 \
      && ! hook_on_path "$engine_env_path"; then
    log "the running engine (pid $pid) cannot find nvidia-container-runtime-hook on its PATH" \
        "($engine_env_path): restarting it"
    kill "$pid"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null && die "dockerd (pid $pid) did not stop within 30 s"
  else
    log "engine already running ($(docker info --format '{{.ServerVersion}} {{.Driver}}'))"
    exit 0
  fi
fi

if ! command -v dockerd >/dev/null 2>&1; then
  apt_install docker.io
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after installing docker.io"
# docker.io brings its own client; a client elsewhere on PATH (e.g. /usr/local/bin) also works.

if [ -S /var/run/docker.sock ] && ! pgrep -x dockerd >/dev/null 2>&1; then
  rm -f /var/run/docker.sock  # stale socket from a dead engine
fi

if pgrep -x dockerd >/dev/null 2>&1 && [ -f /var/run/docker.pid ]; then
  log "a dockerd is running but not answering yet; waiting for it"
else
  engine_path="$PATH"
  if ! command -v nvidia-container-runtime-hook >/dev/null 2>&1; then
    # no NVIDIA container toolkit: a test double of its hook (tests/doubles/) lets containers
    # with GPU device requests start, with no GPU inside; the real hook, when installed, wins
    engine_path="$REPO/tests/doubles:$PATH"
    log "no nvidia-container-runtime-hook: GPU device requests go to the test double" \
        "tests/doubles/nvidia-container-runtime-hook (containers start without GPUs)"
  fi
  log "starting dockerd (--bridge=none --iptables=false), log: var/log/dockerd.log"
  PATH="$engine_path" setsid dockerd --bridge=none --iptables=false \
    --default-address-pool base=198.18.0.0/16,size=24 \
    >"$VAR/log/dockerd.log" 2>&1 < /dev/null &
fi

if ! wait_for_engine; then
  tail -n 30 "$VAR/log/dockerd.log" >&2 || true
  die "docker engine did not answer 'docker info' within ${ENGINE_TIMEOUT:-60}s (log: $VAR/log/dockerd.log)"
fi
log "engine ready ($(docker info --format '{{.ServerVersion}} {{.Driver}} cgroup v{{.CgroupVersion}}'))"
