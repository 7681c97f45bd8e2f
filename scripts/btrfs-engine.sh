#!/usr/bin/env bash
# A second Docker engine whose storage is btrfs on a loop file with quotas enabled, so that
# per-container disk limits (storage_opt={"size": "50M"}) are enforced; overlay2 on ext4 cannot.
# Own --data-root / --exec-root / --pidfile / socket; no bridge, no iptables. Its networks
# come from 198.19.0.0/16 (the main engine's from 198.18.0.0/16): two engines on one host must
# never hand out the same subnet (nodes on it set network_pool, see docs/security.md).
# Loads the single-user image from the default engine. Idempotent. Prints the socket URL last.
# It stops only the engine it started: the PID in var/run/docker-btrfs.pid counts only while
# that process is a dockerd with this --pidfile on its command line (a reused PID is left alone).
#   --stop     stop this engine and unmount its file system (the loop file is kept); when the
#              engine does not stop, the mount and the socket stay as they are
#   BTRFS_SIZE size of the sparse loop file (default 8G)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

BT="$VAR/btrfs"
IMG="$BT/docker-btrfs.img"
MNT="$BT/mnt"
SOCK="$VAR/run/docker-btrfs.sock"
HOST="unix://$SOCK"
PIDFILE="$VAR/run/docker-btrfs.pid"
# exec-root holds containerd's sockets: keep it short (unix socket paths are limited to 108 bytes)
# (of var/ when GPUSPAWNER_VAR moves it: a second engine must not share the first one's)
EXEC_ROOT="/run/gpuspawner-btrfs-$(printf '%s' "${GPUSPAWNER_VAR:+$VAR}${GPUSPAWNER_VAR:-$REPO}" | sha256sum | cut -c1-8)"
DAEMON_JSON="$VAR/run/docker-btrfs.json"

# running_pid: the PID in PIDFILE when that process is the engine this script starts (its
# command line has --pidfile PIDFILE); a reused PID is someone else's
running_pid() {
  local pid args
  [ -f "$PIDFILE" ] && pid="$(cat "$PIDFILE")" && [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" \
    && args="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)" \
    && grep -qxF -- "$PIDFILE" <<<"$args" && echo "$pid"
}

if [ "${1:-}" = "--stop" ]; then
  if pid="$(running_pid)"; then
    log "stopping btrfs engine (pid $pid)"
    kill "$pid"
    for _ in $(seq 1 60); do alive "$pid" || break; sleep 0.5; done
    alive "$pid" && die "btrfs engine (pid $pid) did not stop within 30 s; its mount and socket stay"
  elif [ -f "$PIDFILE" ]; then
    log "$PIDFILE names no engine of this script (pid $(cat "$PIDFILE")): nothing stopped"
  fi
  if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT" || umount -l "$MNT"; fi
  rm -f "$SOCK"
  exit 0
fi

if ! docker -H "$HOST" info >/dev/null 2>&1; then
  if ! command -v mkfs.btrfs >/dev/null 2>&1 || ! command -v btrfs >/dev/null 2>&1; then
    apt_install btrfs-progs
  fi
  command -v dockerd >/dev/null 2>&1 || die "dockerd missing; run scripts/dockerd.sh first"
  mkdir -p "$MNT"
  if ! mountpoint -q "$MNT"; then
    if [ ! -f "$IMG" ]; then
      log "creating ${BTRFS_SIZE:-8G} btrfs loop file var/btrfs/docker-btrfs.img"
      truncate -s "${BTRFS_SIZE:-8G}" "$IMG"
      mkfs.btrfs -q -f "$IMG" >/dev/null
    fi
    mount -o loop "$IMG" "$MNT" || die "cannot mount $IMG (loop devices unavailable?)"
  fi
  btrfs quota enable "$MNT"
  mkdir -p "$MNT/docker" "$EXEC_ROOT"
  echo '{}' >"$DAEMON_JSON"   # do not inherit /etc/docker/daemon.json
  if pid="$(running_pid)"; then
    log "btrfs engine (pid $pid) is starting; waiting for it"
  else
    rm -f "$SOCK"
    log "starting btrfs engine on $HOST (log: var/log/dockerd-btrfs.log)"
    setsid dockerd --config-file "$DAEMON_JSON" \
      --data-root "$MNT/docker" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" -H "$HOST" \
      --bridge=none --iptables=false --storage-driver btrfs \
      --default-address-pool base=198.19.0.0/16,size=24 \
      >"$VAR/log/dockerd-btrfs.log" 2>&1 </dev/null &
  fi
  if ! wait_for_engine -H "$HOST"; then
    tail -n 30 "$VAR/log/dockerd-btrfs.log" >&2 || true
    die "btrfs engine did not answer within ${ENGINE_TIMEOUT:-60}s (log: var/log/dockerd-btrfs.log)"
  fi
fi
driver="$(docker -H "$HOST" info --format '{{.Driver}}')"
[ "$driver" = "btrfs" ] || die "engine on $HOST uses storage driver '$driver', not btrfs"

# Same single-user image as the default engine (skipped when the ids already match).
src_id="$(docker image inspect -f '{{.Id}}' "$SINGLEUSER_IMAGE" 2>/dev/null || true)"
if [ -z "$src_id" ]; then
  log "WARNING: $SINGLEUSER_IMAGE not in the default engine (make images); nothing loaded"
elif [ "$(docker -H "$HOST" image inspect -f '{{.Id}}' "$SINGLEUSER_IMAGE" 2>/dev/null || true)" != "$src_id" ]; then
  log "loading $SINGLEUSER_IMAGE into the btrfs engine"
  docker save "$SINGLEUSER_IMAGE" | docker -H "$HOST" load -q >/dev/null
fi
log "btrfs engine ready (quota enabled on var/btrfs/mnt)"
echo "$HOST"
