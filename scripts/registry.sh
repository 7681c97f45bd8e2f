#!/usr/bin/env bash
# A private OCI image registry on loopback for the users'-own-images tests and benchmark
# (idempotent): Debian's docker-registry (the CNCF distribution registry, 2.8) serving
# http://127.0.0.1:PORT/v2/ with its blobs under var/registry/storage. Docker engines treat
# registries on 127.0.0.0/8 as insecure by default, so `docker push 127.0.0.1:PORT/x:1` and
# pulls of it work without TLS or daemon settings.
#
#   scripts/registry.sh            install (apt, once) and start it, or leave the one it started
#                                  running when it already answers on that port
#   scripts/registry.sh --stop     stop the registry this script started (its blobs stay)
#   scripts/registry.sh --restart  --stop, then start
#
# It stops only the process it recorded in var/run/registry.pid ("PID START-TIME", the start
# time from /proc/PID/stat so that a reused PID is not taken for it, and the process's command
# line must name var/registry/config.yml). A port held by anything else is left alone: the
# script names it and exits 1. A registry of another checkout (its command line names another
# .../registry/config.yml) is stopped only with GPUSPAWNER_STOP_OTHER_REGISTRY=1 (.ci/run sets
# it), and then by this script's --stop for that checkout's var/, which stops only what that
# var/ recorded. Debian's package ships a service of its own (all addresses, port
# 5000): this script keeps the package's postinst from starting it (a policy-rc.d for the
# install, only where the machine has none) and never starts, stops or uses that one.
# The address in use is written to var/run/registry.addr ("127.0.0.1:PORT") for the tests.
# Environment (all optional):
#   GPUSPAWNER_REGISTRY_PORT  the loopback port (default 17010)
#   GPUSPAWNER_STOP_OTHER_REGISTRY=1  stop another checkout's registry on that port (above)
#   GPUSPAWNER_VAR            where var/ is (scripts/lib.sh)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PORT="${GPUSPAWNER_REGISTRY_PORT:-17010}"
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] \
  || die "GPUSPAWNER_REGISTRY_PORT=$PORT is not a port number"
ADDR="127.0.0.1:$PORT"
DIR="$VAR/registry"
CONF="$DIR/config.yml"
RECORD="$VAR/run/registry.pid"
ADDR_FILE="$VAR/run/registry.addr"
LOGF="$VAR/log/registry.log"
BIN=docker-registry

# recorded_pid: the registry this script started: the record's PID is alive, has the recorded
# start time and runs with our config file
recorded_pid() {
  local pid st
  [ -f "$RECORD" ] || return 1
  read -r pid st <"$RECORD" || true
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && [ -n "$st" ] \
    && [ "$(start_time "$pid")" = "$st" ] \
    && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$CONF" \
    && echo "$pid"
}

# answers: GET /v2/ on our address is the registry's API (200 and its version header)
answers() {
  curl -fsS --max-time 2 -o /dev/null -D - "http://$ADDR/v2/" 2>/dev/null \
    | grep -qi '^docker-distribution-api-version: registry/2.0'
}

# port_taken: something accepts connections on 127.0.0.1:PORT
port_taken() {
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

stop_ours() {
  local pid
  if pid="$(recorded_pid)"; then
    log "stopping the registry (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do alive "$pid" || break; sleep 0.25; done
    alive "$pid" && die "registry (pid $pid) did not stop within 10 s"
    log "stopped the registry (its blobs stay in $DIR/storage)"
  elif [ -f "$RECORD" ]; then
    log "$RECORD names no registry of this script ($(cat "$RECORD")): nothing stopped"
  fi
  rm -f "$RECORD" "$ADDR_FILE"
}

# install the package without letting its postinst start the packaged service (all addresses,
# port 5000): a policy-rc.d that refuses, for the install only, where the machine has none
install_registry() {
  local policy=/usr/sbin/policy-rc.d placed=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/registry.sh: no service starts during this install\nexit 101\n' \
      >"$policy"
    chmod 755 "$policy"
    placed=1
  fi
  # shellcheck disable=SC2064  # expand now: remove exactly what was placed
  [ "$placed" = 1 ] && trap "rm -f '$policy'" EXIT
  apt_install docker-registry
  if [ "$placed" = 1 ]; then rm -f "$policy"; trap - EXIT; fi
  # the packaged service would start at the next boot on systemd machines: it is not ours to
  # run, and it listens on every address
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable docker-registry.service >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  --stop) stop_ours; exit 0 ;;
  --restart) stop_ours ;;
  "") ;;
  *) die "usage: $0 [--stop|--restart]" ;;
esac

if pid="$(recorded_pid)"; then
  if answers; then
    echo "$ADDR" >"$ADDR_FILE"
    log "registry already running on http://$ADDR (pid $pid); left alone"
    exit 0
  fi
  log "the registry this script started (pid $pid) does not answer on $ADDR: restarting it"
  stop_ours
fi

# other_var: the var/ of another checkout's registry holding our port (its config file is
# VAR/registry/config.yml), printed; fails when the holder is anything else
other_var() {
  local pid conf
  command -v ss >/dev/null 2>&1 || return 1
  pid="$(ss -Hltnp "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)"
  [ -n "$pid" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE "(^|/)$BIN$" || return 1
  conf="$(tr '\0' '\n' <"/proc/$pid/cmdline" | grep -m1 '/registry/config\.yml$')" || return 1
  [ "$conf" != "$CONF" ] || return 1
  echo "${conf%/registry/config.yml}"
}

if port_taken; then
  if other="$(other_var)"; then
    stop_cmd=(env "GPUSPAWNER_VAR=$other" "GPUSPAWNER_REGISTRY_PORT=$PORT" "$REPO/scripts/registry.sh" --stop)
    if [ "${GPUSPAWNER_STOP_OTHER_REGISTRY:-0}" = 1 ]; then
      log "GPUSPAWNER_STOP_OTHER_REGISTRY=1: stopping the registry of $other on $ADDR"
      "${stop_cmd[@]}" >&2 || die "could not stop the registry of $other"
      for _ in $(seq 1 40); do port_taken || break; sleep 0.25; done
    else
      die "127.0.0.1:$PORT is held by the registry of another checkout ($other); this script" \
          "does not stop what it did not start. Stop it with: ${stop_cmd[*]}  (or run this" \
          "script with GPUSPAWNER_STOP_OTHER_REGISTRY=1 to do that), or choose another port" \
          "with GPUSPAWNER_REGISTRY_PORT"
    fi
  fi
  if port_taken; then
    die "127.0.0.1:$PORT is taken by a process this script did not start (left alone);" \
        "choose another port with GPUSPAWNER_REGISTRY_PORT"
  fi
fi

command -v "$BIN" >/dev/null 2>&1 || install_registry
command -v "$BIN" >/dev/null 2>&1 || die "$BIN still missing after installing docker-registry"

mkdir -p "$DIR/storage"
cat >"$CONF" <<EOF
# written by scripts/registry.sh: loopback only, blobs in var/registry/storage
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $DIR/storage
  delete:
    enabled: true
http:
  addr: $ADDR
EOF

if [ -d "$DIR/storage/docker" ]; then
  # blobs of manifests deleted since (the tests delete theirs): freed before it serves, the
  # only time garbage collection is safe
  "$BIN" garbage-collect --delete-untagged "$CONF" >>"$VAR/log/registry-gc.log" 2>&1 \
    || log "WARNING: garbage collection failed (see $VAR/log/registry-gc.log); starting anyway"
fi
log "starting $BIN on http://$ADDR (storage $DIR/storage, log $LOGF)"
setsid "$BIN" serve "$CONF" >"$LOGF" 2>&1 </dev/null &
started=$!
echo "$started $(start_time "$started")" >"$RECORD"
for _ in $(seq 1 120); do
  answers && break
  alive "$started" || break
  sleep 0.25
done
if ! answers; then
  tail -n 20 "$LOGF" >&2 || true
  stop_ours
  die "the registry did not answer on http://$ADDR/v2/ within 30 s (log: $LOGF)"
fi
echo "$ADDR" >"$ADDR_FILE"
log "registry ready on http://$ADDR (pid $started, recorded in $RECORD; $("$BIN" --version 2>/dev/null | head -1 || echo '?'))"
