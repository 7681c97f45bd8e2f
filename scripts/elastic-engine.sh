#!/usr/bin/env bash
# A Docker engine in a network namespace of its own, as a node that comes and goes: the engine
# behind an elastic node for the command provider's test programs (tests/doubles/elastic/) and
# the example in docs/howto/elastic-nodes.md. It stands for a machine that is powered on or
# created in a cloud: its containers live in the namespace, reached from this host through a
# veth pair and a route to its network pool, as a node on another machine is through the
# site's network.
#   elastic-engine.sh start NAME   start the engine (idempotent); prints its socket URL last
#   elastic-engine.sh stop NAME    stop the engine this script started as NAME, remove its
#                                  namespace, link and route (its data root is kept, so the
#                                  next start is a boot, not an install)
# Environment:
#   ELASTIC_POOL  the node's server networks (default 198.19.240.0/21; must not overlap the
#                 other engines' pools: the main engine takes from 198.18.0.0/16, the btrfs
#                 engine from 198.19.0.0/16 upwards)
#   ELASTIC_LINK  the /30 of the veth pair (default 198.19.239.252/30): .1 here, .2 in the
#                 namespace
# Its state: var/elastic/NAME (data root), var/run/elastic-NAME.{sock,pid},
# var/log/dockerd-elastic-NAME.log. It stops only the engine whose PID file it wrote and whose
# command line names that PID file (a reused PID is left alone).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

CMD="${1:-}"
NAME="${2:-}"
[[ "$CMD" =~ ^(start|stop)$ ]] && [[ "$NAME" =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] \
  || die "usage: $0 start|stop NAME (NAME: lower-case letters, digits, '-')"
POOL="${ELASTIC_POOL:-198.19.240.0/21}"
LINK="${ELASTIC_LINK:-198.19.239.252/30}"
ID="$(printf '%s' "$VAR/$NAME" | sha256sum | cut -c1-8)"
NS="gpuspawner-el-$ID"
VH="gse${ID}h"   # veth ends (15 characters at most)
VN="gse${ID}n"
DATA="$VAR/elastic/$NAME"
SOCK="$VAR/run/elastic-$NAME.sock"
HOST="unix://$SOCK"
PIDFILE="$VAR/run/elastic-$NAME.pid"
LOGF="$VAR/log/dockerd-elastic-$NAME.log"
EXEC_ROOT="/run/gpuspawner-el-$ID"  # containerd's sockets: short paths

base="${LINK%/*}"
prefix="${base%.*}"
last="${base##*.}"
HERE_IP="$prefix.$((last + 1))"
NS_IP="$prefix.$((last + 2))"

running_pid() {
  local pid args
  [ -f "$PIDFILE" ] && pid="$(cat "$PIDFILE")" && [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" \
    && args="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)" \
    && grep -qxF -- "$PIDFILE" <<<"$args" && echo "$pid"
}

if [ "$CMD" = stop ]; then
  if pid="$(running_pid)"; then
    log "stopping elastic engine $NAME (pid $pid)"
    kill "$pid"
    for _ in $(seq 1 60); do alive "$pid" || break; sleep 0.5; done
    alive "$pid" && die "elastic engine $NAME (pid $pid) did not stop within 30 s"
  fi
  ip route del "$POOL" via "$NS_IP" 2>/dev/null || true
  ip link del "$VH" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  rm -f "$SOCK"
  exit 0
fi

command -v dockerd >/dev/null 2>&1 || die "dockerd missing; run scripts/dockerd.sh first"
if ! ip netns list | grep -qw "^$NS"; then
  ip netns add "$NS"
fi
if ! ip link show "$VH" >/dev/null 2>&1; then
  ip link add "$VH" type veth peer name "$VN"
  ip link set "$VN" netns "$NS"
  ip addr add "$HERE_IP/30" dev "$VH"
  ip link set "$VH" up
  ip netns exec "$NS" ip addr add "$NS_IP/30" dev "$VN"
  ip netns exec "$NS" ip link set "$VN" up
  ip netns exec "$NS" ip link set lo up
  ip netns exec "$NS" ip route add default via "$HERE_IP"
  ip netns exec "$NS" sysctl -qw net.ipv4.ip_forward=1
fi
ip route replace "$POOL" via "$NS_IP" dev "$VH"

if ! docker -H "$HOST" info >/dev/null 2>&1; then
  mkdir -p "$DATA/docker" "$EXEC_ROOT"
  echo '{}' >"$DATA/daemon.json"   # do not inherit /etc/docker/daemon.json
  if ! running_pid >/dev/null; then
    rm -f "$SOCK"
    log "starting elastic engine $NAME on $HOST in netns $NS (log: $LOGF)"
    # the test double of the GPU hook on its PATH, as scripts/dockerd.sh's engine has
    # nsenter --net, not ip netns exec: that also remounts /sys, hiding the cgroups dockerd needs
    PATH="$REPO/tests/doubles:$PATH" setsid nsenter --net="/var/run/netns/$NS" dockerd \
      --config-file "$DATA/daemon.json" \
      --data-root "$DATA/docker" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" -H "$HOST" \
      --bridge=none --iptables=false --ip-masq=false \
      --default-address-pool "base=$POOL,size=28" \
      >"$LOGF" 2>&1 </dev/null &
  fi
  if ! wait_for_engine -H "$HOST"; then
    tail -n 30 "$LOGF" >&2 || true
    die "elastic engine $NAME did not answer within ${ENGINE_TIMEOUT:-60}s (log: $LOGF)"
  fi
fi

# the single-user image, once (kept in the data root for the next boot)
src_id="$(docker image inspect -f '{{.Id}}' "$SINGLEUSER_IMAGE" 2>/dev/null || true)"
if [ -n "$src_id" ] && \
   [ "$(docker -H "$HOST" image inspect -f '{{.Id}}' "$SINGLEUSER_IMAGE" 2>/dev/null || true)" != "$src_id" ]; then
  log "loading $SINGLEUSER_IMAGE into elastic engine $NAME"
  docker save "$SINGLEUSER_IMAGE" | docker -H "$HOST" load -q >/dev/null
fi
echo "$HOST"
