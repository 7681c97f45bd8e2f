#!/usr/bin/env bash
# slurm-power.sh resume|suspend SLURM_CONF NODELIST: Slurm's ResumeProgram / SuspendProgram of
# the private test cluster (scripts/slurm.sh writes etc/node-resume and etc/node-suspend,
# which call this with the cluster's slurm.conf). slurmctld runs them on this host as its
# SlurmUser (root here), with the Slurm hostlist of the nodes to power up or down
# (power_save.html): a node "powered up" is its own `slurmd -D -N NODE` started here, its PID
# in var/slurm/run/slurmd-NODE.pid (so that `scripts/slurm.sh --stop` stops it too); "powered
# down" is that slurmd stopped. Each action is logged to var/slurm/log/power.log.
# Only the nodes of that cluster's POWER_NODES are touched (others are refused), and only the
# slurmd whose PID file names a slurmd started with this slurm.conf is stopped.
set -euo pipefail
[ "$#" -eq 3 ] || { echo "usage: $0 resume|suspend SLURM_CONF NODELIST" >&2; exit 2; }
action="$1" conf="$2" hosts="$3"
case "$action" in resume|suspend) ;; *) echo "$0: unknown action $action" >&2; exit 2 ;; esac
[ -f "$conf" ] || { echo "$0: no such slurm.conf $conf" >&2; exit 2; }
export SLURM_CONF="$conf"
# slurmctld runs this with a bare environment (no PATH)
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
SL="$(dirname "$(dirname "$conf")")"
RUN="$SL/run" LOGDIR="$SL/log"
POWER_NODES=" node4 "

say() { echo "$(date -u +%FT%TZ) $action $*" >>"$LOGDIR/power.log"; }

# our_slurmd NODE: prints the PID of NODE's slurmd started with this slurm.conf
our_slurmd() {
  local f="$RUN/slurmd-$1.pid" pid
  [ -f "$f" ] || return 1
  pid="$(cat "$f")"
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$(command -v slurmd)")" ] \
    || return 1
  grep -qxF "SLURM_CONF=$conf" < <(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || return 1
  echo "$pid"
}

stop_slurmd() {  # PID: TERM, up to 10 s, then KILL
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do
    [ -d "/proc/$1" ] || return 0
    sleep 0.2
  done
  kill -KILL "$1" 2>/dev/null || true
}

for n in $(scontrol show hostnames "$hosts"); do
  if [[ "$POWER_NODES" != *" $n "* ]]; then
    say "$n: refused (not a power-saving node of this cluster)"
    continue
  fi
  if [ "$action" = resume ]; then
    if pid="$(our_slurmd "$n")"; then
      # one left from an earlier start booted before this resume was asked: slurmctld would
      # not take its registration; a fresh one
      say "$n: stopping the slurmd that still runs (pid $pid)"
      stop_slurmd "$pid"
    fi
    mkdir -p "$SL/spool/$n"
    # its own session (slurmctld's script runner kills the program's process group when it
    # times out), no descriptor of slurmctld's kept open, and in a time namespace whose boot
    # time is now: slurmctld takes a resumed node's registration only when the node booted
    # after the resume was asked (its boot time = now - uptime; else "Still waiting for boot
    # of node" until ResumeTimeout marks it down), and this "node" is a process, not a machine.
    # slurmd's uptime is sysinfo(2)'s, rounded up to whole seconds: started 2 s after the
    # request with an uptime below 1 s, its boot time is never before the request
    sleep 2
    up="$(cut -d. -f1 /proc/uptime)"
    ( for fd in /proc/"$BASHPID"/fd/*; do
        fd="${fd##*/}"
        [ "$fd" -gt 2 ] && eval "exec $fd>&-"
      done
      exec setsid unshare --time --boottime="-$up" slurmd -D -N "$n" -f "$conf" ) \
      >"$LOGDIR/slurmd-$n.out" 2>&1 </dev/null &
    echo $! >"$RUN/slurmd-$n.pid"
    say "$n: started slurmd (pid $!)"
  else
    if pid="$(our_slurmd "$n")"; then
      stop_slurmd "$pid"
      say "$n: stopped slurmd (pid $pid)"
    else
      say "$n: no slurmd of this cluster runs"
    fi
    rm -f "$RUN/slurmd-$n.pid"
  fi
done
