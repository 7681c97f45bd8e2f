#!/usr/bin/env bash
# Host firewall rule that isolates user servers from each other (docs/security.md):
#   iptables -I FORWARD -s POOL -d POOL -j DROP
# Each server has its own bridge network from POOL (default 198.18.0.0/15); the host forwards
# between bridges (ip_forward=1, bridge-nf-call-iptables=1), and Docker's own isolation rules
# are off with --iptables=false, so without this rule one user's container reaches another's
# server. Host <-> container traffic is not forwarded and keeps working (the hub API, the proxy).
# Idempotent; `--stop` removes exactly the rule this script adds, nothing else.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

POOL="${GPUSPAWNER_NETWORK_POOL:-198.18.0.0/15}"
RULE=(FORWARD -s "$POOL" -d "$POOL" -m comment --comment gpuspawner-isolation -j DROP)

command -v iptables >/dev/null 2>&1 || apt_install iptables
if [ "${1:-}" = "--stop" ]; then
  while iptables -C "${RULE[@]}" 2>/dev/null; do iptables -D "${RULE[@]}"; done
  log "removed the isolation rule for $POOL"
  exit 0
fi
if iptables -C "${RULE[@]}" 2>/dev/null; then
  log "isolation rule for $POOL already present"
else
  iptables -I "${RULE[@]}"
  log "added: iptables -I ${RULE[*]}"
fi
