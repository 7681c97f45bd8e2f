#!/usr/bin/env bash
# Start the local Docker engine (idempotent): install docker.io from Debian when dockerd is
# missing, run dockerd without the default bridge (its 172.17.0.0/16 is a private range),
# without NAT or Docker's iptables rules, with 198.18.0.0/16 as the pool for networks made
# without a subnet (ours always name one), and wait until `docker info` answers. An engine that
# already answers is left alone.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

if docker info >/dev/null 2>&1; then
  log "engine already running ($(docker info --format '{{.ServerVersion}} {{.Driver}}'))"
  exit 0
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
