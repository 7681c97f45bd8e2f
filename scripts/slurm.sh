#!/usr/bin/env bash
# A private four-node Slurm cluster on this host, for the Slurm backend's tests
# (docs: /work/shared/ENVIRONMENT.md "Slurm"; Slurm 22.05 from Debian). Everything lives under
# var/slurm/ (etc/ state/ spool/ log/ run/ dev/ munge/):
#   munged with its own key and socket (var/slurm/munge/), as user munge;
#   slurmctld on 127.0.0.1:17001; `slurmd -N node1` (port 17002), `-N node2` (17003) and
#   `-N node3` (17005), every daemon on loopback only: CommunicationParameters=NoCtldInAddrAny
#   (slurmctld) and NoInAddrAny (slurmd, srun, slurmstepd). Slurm 22.05 then binds the address
#   that this host's name resolves to (getaddrinfo(gethostname()), IPv4; not SlurmctldHost's or
#   NodeAddr's), so that address, a loopback one (127.0.0.1 here, 127.0.1.1 on a stock Debian
#   /etc/hosts), is also SlurmctldHost's and every NodeAddr; a name that resolves elsewhere is
#   an error (the script does not edit /etc/hosts);
#   fake GPU device files dev/nvidia0..5 (`mknod ... c 195 N`: node1 has 0,1, node2 2,3,
#   node3 4,5); node1 and node2 type each GPU by its UUID (exact mode), node3 by its model
#   (model mode); each node has a feature of its own name (Features=node1: what pins a job
#   submitted through slurmrestd v0.0.38 when no per-device GRES type does);
#   gres.conf and each node's Gres= from hub_config/slurm/node*.yaml by `gpuspawner slurm-gres`
#   (one GRES Type per GPU, derived from its UUID);
#   two unprivileged job users, gpsuser1 (uid 2001) and gpsuser2 (uid 2002);
#   Slurm's JWT authentication beside munge (AuthAltTypes=auth/jwt, key var/slurm/jwt/) and
#   slurmrestd (OpenAPI v0.0.38, rest_auth/jwt) on 127.0.0.1:17004, run as its own system user
#   slurmrest (it refuses root): `c.SlurmBackend.submit_via = "rest"` submits through it;
#   PrivateData=jobs,usage,users: a user's squeue/scontrol shows that user's jobs only;
#   node4 (1 core, 1000 MiB, no GPU; port 17006; partition "power" of its own, not the
#   default) under Slurm's power saving (issue 42): State=CLOUD, so it starts powered down
#   (sinfo `idle~`; PrivateData=cloud shows it); Slurm resumes it for a job through
#   ResumeProgram (etc/node-resume -> scripts/slurm-power.sh resume: starts its slurmd) and
#   suspends it SuspendTime (15 s) after it fell idle through SuspendProgram (etc/node-suspend:
#   stops that slurmd); node1-3 are excluded (SuspendExcNodes, SuspendExcParts=debug). Both
#   programs run on this host as SlurmUser (root), from slurmctld; power.log in log/.
# Idempotent: a cluster that is already running is left alone (a configuration this script now
# writes differently takes effect when it next starts the cluster: `--stop`, then run it again).
# Waits until sinfo shows the nodes up (SLURM_WAIT seconds, default 60) and prints the line to
# export SLURM_CONF on stdout.
# `--stop` cancels the cluster's jobs and stops, by the PIDs recorded in var/slurm/run/, the
# daemons this script started, nothing else. `--print-config` prints the slurm.conf it would
# write and exits (no packages, daemons or root needed).
# It never stops what it did not start: a cluster of another checkout, or anything else, on its
# ports is an error that names it (GPUSPAWNER_STOP_OTHER_SLURM=1 stops another checkout's
# cluster with that checkout's own `--stop`).
#   GPUSPAWNER_VAR          where var/ is (scripts/lib.sh): a second, throwaway cluster's files
#   GPUSPAWNER_SLURM_PORTS  first of its six ports (default 17001: slurmctld 17001, node1
#                           17002, node2 17003, slurmrestd 17004, node3 17005, node4 17006); the tests use
#                           the default cluster
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SL="$VAR/slurm"
ETC="$SL/etc" RUN="$SL/run" LOGDIR="$SL/log" DEV="$SL/dev" MUNGE="$SL/munge"
CONF="$ETC/slurm.conf"
NODES=(node1 node2 node3)
POWER_NODES=(node4)  # under Slurm's power saving: started by ResumeProgram, not by this script
BASE="${GPUSPAWNER_SLURM_PORTS:-17001}"
if ! [[ "$BASE" =~ ^[0-9]+$ ]] || [ "$BASE" -lt 1024 ] || [ "$BASE" -gt 65530 ]; then
  die "GPUSPAWNER_SLURM_PORTS=$BASE is no port number 1024..65530"
fi
declare -A PORT=([node1]=$((BASE + 1)) [node2]=$((BASE + 2)) [node3]=$((BASE + 4))
                 [node4]=$((BASE + 5)))
CTLD_PORT=$BASE
REST_PORT=$((BASE + 3))
JWT="$SL/jwt"
WAIT="${SLURM_WAIT:-60}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export SLURM_CONF="$CONF"

# pid_alive NAME BINARY: the PID in run/NAME.pid runs BINARY (Debian's slurmctld is an
# alternatives link to slurmctld-wlm: compared after resolving links) with our SLURM_CONF in its
# environment, or for munged our directory in its command line; prints the PID.
pid_alive() {
  local f="$RUN/$1.pid" pid want
  [ -f "$f" ] || return 1
  pid="$(cat "$f")"
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  want="$(readlink -f "$(command -v "$2")")" || return 1
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$want" ] || return 1
  if grep -qxF "SLURM_CONF=$CONF" < <(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) \
      || grep -qF "$MUNGE/" < <(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null); then
    echo "$pid"
    return 0
  fi
  return 1
}

stop_one() {  # NAME BINARY
  local pid i
  if pid="$(pid_alive "$1" "$2")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      sleep 0.2
    done
    if [ -d "/proc/$pid" ]; then
      log "$1 (pid $pid) did not stop within 20 s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$RUN/$1.pid"
}

# ------------------------------------------------------------------ configuration
# loopback_addr: the address Slurm 22.05 binds with NoCtldInAddrAny / NoInAddrAny
# (slurm_setup_addr: getaddrinfo(gethostname()) with AF_INET, AI_ADDRCONFIG | AI_PASSIVE, the
# first answer), which must be a loopback one
loopback_addr() {
  python3 - <<'PYEOF'
import ipaddress, socket, sys
name = socket.gethostname()
try:
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM, 0,
                               socket.AI_ADDRCONFIG | socket.AI_PASSIVE)
except OSError as e:
    sys.exit(f"this host's name {name!r} does not resolve ({e}): Slurm's daemons could not "
             f"bind; add a line '127.0.1.1 {name}' to /etc/hosts")
addr = infos[0][4][0]
if not ipaddress.ip_address(addr).is_loopback:
    sys.exit(f"this host's name {name!r} resolves to {addr}, not a loopback address: with "
             "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny Slurm's daemons would listen "
             f"there, off loopback; add a line '127.0.1.1 {name}' to /etc/hosts (before any "
             "other line for that name)")
print(addr)
PYEOF
}

# make_config DIR: slurm.conf, cgroup.conf and gres.conf of the cluster into DIR
make_config() {
  local out="$1" addr n
  addr="$(loopback_addr)" || die "no loopback address for Slurm's daemons (see above)"
  declare -A GRES
  "$PY" -c 'import yaml' 2>/dev/null \
    || die "$PY cannot import yaml (PyYAML): run 'make venv' first (gpuspawner slurm-gres needs it)"
  TOPOLOGIES=("$REPO/hub_config/slurm/node1.yaml" "$REPO/hub_config/slurm/node2.yaml")
  MODEL_TOPOLOGY="$REPO/hub_config/slurm/node3.yaml"
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m gpuspawner.cli slurm-gres \
    --topology "${TOPOLOGIES[0]}" --topology "${TOPOLOGIES[1]}" \
    --model-topology "$MODEL_TOPOLOGY" --dev-dir "$DEV" \
    -o "$out/gres.conf" || die "gpuspawner slurm-gres failed"
  for n in "${NODES[@]}"; do
    GRES[$n]="$(sed -n "s/^# slurm.conf NodeName=$n Gres=//p" "$out/gres.conf")"
    [ -n "${GRES[$n]}" ] || die "gpuspawner slurm-gres printed no Gres= for $n"
  done

  {
    cat <<EOF
# made by scripts/slurm.sh: a private three-node cluster on loopback (see the script's header)
ClusterName=gpuspawner
SlurmctldHost=$(hostname -s)($addr)
SlurmctldPort=$CTLD_PORT
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$MUNGE/munged.sock
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT/jwt_hs256.key
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool/%n
SlurmctldPidFile=$RUN/slurmctld.daemon.pid
SlurmdPidFile=$RUN/slurmd-%n.daemon.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SlurmdTimeout=10
ReturnToService=2
SlurmdParameters=config_overrides
# users see only their own jobs, usage and user records (root and SlurmUser see all, as the hub
# needs): another user's job shows no Comment, AdminComment, StdOut or WorkDir (issue 47)
PrivateData=jobs,usage,users,cloud
EOF
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeHostname=localhost NodeAddr=$addr Port=${PORT[$n]} CPUs=2 Boards=1 SocketsPerBoard=2 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=4000 Gres=${GRES[$n]} Features=$n State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
    # Slurm's power saving (slurm.conf(5), power_save.html), node4 only
    cat <<EOF
SuspendProgram=$ETC/node-suspend
ResumeProgram=$ETC/node-resume
SuspendTime=15
SuspendTimeout=10
ResumeTimeout=60
SuspendExcNodes=$(IFS=,; echo "${NODES[*]}")
SuspendExcParts=debug
EOF
    for n in "${POWER_NODES[@]}"; do
      echo "NodeName=$n NodeHostname=localhost NodeAddr=$addr Port=${PORT[$n]} CPUs=1 Boards=1 SocketsPerBoard=1 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=1000 Features=$n State=CLOUD"
    done
    echo "PartitionName=power Nodes=$(IFS=,; echo "${POWER_NODES[*]}") Default=NO MaxTime=INFINITE State=UP"
  } >"$out/slurm.conf"
  # what slurmctld runs (as SlurmUser) to resume / suspend power-saving nodes: NODELIST as
  # the only argument (scontrol show hostnames expands it)
  for action in resume suspend; do
    printf '#!/bin/sh\n# made by scripts/slurm.sh: Slurm %s program of this cluster\nexec %q %s %q "$@"\n' \
      "$action" "$REPO/scripts/slurm-power.sh" "$action" "$ETC/slurm.conf" >"$out/node-$action"
    chmod 0755 "$out/node-$action"
  done

  cat >"$out/cgroup.conf" <<EOF
# made by scripts/slurm.sh (cgroup v1 on this host)
CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
EOF
}

if [ "${1:-}" = "--print-config" ]; then
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  make_config "$TMP"
  cat "$TMP/slurm.conf"
  exit 0
fi

if [ "${1:-}" = "--stop" ]; then
  if pid_alive slurmctld slurmctld >/dev/null; then
    # every job of this private cluster (SLURM_CONF): their slurmstepd would outlive slurmd
    mapfile -t jobs < <(squeue -h -o %i 2>/dev/null || true)
    [ "${#jobs[@]}" -gt 0 ] && { scancel --full "${jobs[@]}" 2>/dev/null || true; }
    for _ in $(seq 1 75); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_one slurmrestd slurmrestd
  for n in "${NODES[@]}" "${POWER_NODES[@]}"; do stop_one "slurmd-$n" slurmd; done
  stop_one slurmctld slurmctld
  stop_one munged munged
  log "cluster stopped (state kept in $SL/state)"
  exit 0
fi

all_up() {
  pid_alive munged munged >/dev/null && pid_alive slurmctld slurmctld >/dev/null \
    && pid_alive slurmd-node1 slurmd >/dev/null && pid_alive slurmd-node2 slurmd >/dev/null \
    && pid_alive slurmd-node3 slurmd >/dev/null && pid_alive slurmrestd slurmrestd >/dev/null
}

# usable: every node responds (idle, mixed or allocated, no drain/down flag)
nodes_ready() {
  local out
  out="$(sinfo -h -N -o '%N %T' 2>/dev/null)" || return 1
  for n in "${NODES[@]}"; do
    grep -qE "^$n (idle|mixed|allocated)$" <<<"$out" || return 1
  done
}

if all_up && nodes_ready; then
  log "cluster already running ($(sinfo -h -N -o '%N:%T' | tr '\n' ' '))"
  echo "export SLURM_CONF=$CONF"
  exit 0
fi

# Our ports must be free or held by this cluster's own daemons. Nothing else on them is
# stopped: a cluster of another checkout (a scratch clone, a worktree) only when asked with
# GPUSPAWNER_STOP_OTHER_SLURM=1, and then by that checkout's own `--stop` (which stops only
# what it started); anything else is an error that names it.
DAEMONS=(munged slurmctld slurmrestd slurmd-node1 slurmd-node2 slurmd-node3 slurmd-node4)
daemon_bin() { case "$1" in slurmd-*) echo slurmd ;; *) echo "$1" ;; esac; }
ours_pids=" "
for d in "${DAEMONS[@]}"; do
  if p="$(pid_alive "$d" "$(daemon_bin "$d")")"; then ours_pids+="$p "; fi
done
# conf_of PID: the slurm.conf a Slurm daemon was started with (-f CONF)
conf_of() {
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | awk 'prev == "-f" { print; exit } { prev = $0 }'
}
if command -v ss >/dev/null 2>&1; then
  for port in "$CTLD_PORT" "$REST_PORT" "${PORT[@]}"; do
    listening="$(ss -Hltnp "sport = :$port" 2>/dev/null || true)"
    [ -n "$listening" ] || continue
    holders="$(grep -o 'pid=[0-9]*' <<<"$listening" | cut -d= -f2 | sort -u || true)"
    [ -n "$holders" ] \
      || die "port $port is in use by a process this user cannot see; it is not stopped"
    mine=0
    for pid in $holders; do [[ "$ours_pids" == *" $pid "* ]] && mine=1; done
    [ "$mine" = 1 ] && continue
    pid="${holders%%$'\n'*}"
    what="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    other="$(conf_of "$pid" || true)"
    if [ -n "$other" ] && [ "$other" != "$CONF" ] && [[ "$other" == */slurm/etc/slurm.conf ]]; then
      root="${other%/var/slurm/etc/slurm.conf}"
      if [ "$root" != "$other" ] && [ -x "$root/scripts/slurm.sh" ]; then
        stop_cmd=("$root/scripts/slurm.sh" --stop)
      else
        stop_cmd=(env "GPUSPAWNER_VAR=${other%/slurm/etc/slurm.conf}" "$REPO/scripts/slurm.sh" --stop)
      fi
      if [ "${GPUSPAWNER_STOP_OTHER_SLURM:-0}" = 1 ]; then
        log "GPUSPAWNER_STOP_OTHER_SLURM=1: stopping the cluster of $other, which holds port" \
            "$port: ${stop_cmd[*]}"
        "${stop_cmd[@]}" >&2 || die "could not stop the cluster of $other"
        continue
      fi
      die "port $port is held by another test cluster (pid $pid: $what); this script does not" \
          "stop what it did not start. Stop it with: ${stop_cmd[*]}  (or run this script" \
          "with GPUSPAWNER_STOP_OTHER_SLURM=1 to do that), or give this cluster other ports" \
          "with GPUSPAWNER_SLURM_PORTS"
    fi
    die "port $port is held by pid $pid ($what), not by this cluster's daemons; it is not" \
        "stopped: stop it yourself, or give this cluster other ports with GPUSPAWNER_SLURM_PORTS"
  done
fi

# ------------------------------------------------------------------ packages and users
# slurm-wlm-jwt-plugin: auth_jwt.so for AuthAltTypes=auth/jwt (slurmctld exits without it)
apt_install slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin runc
for b in munged mungekey slurmctld slurmd sbatch sinfo scontrol; do
  command -v "$b" >/dev/null || die "$b missing after installing the Slurm packages"
done

command -v slurmrestd >/dev/null || die "slurmrestd missing after installing the Slurm packages"
if ! id -u slurmrest >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --shell /usr/sbin/nologin slurmrest
  log "created system user slurmrest (slurmrestd refuses to run as root)"
fi

for spec in gpsuser1:2001 gpsuser2:2002; do
  u="${spec%%:*}" uid="${spec##*:}"
  if id -u "$u" >/dev/null 2>&1; then
    [ "$(id -u "$u")" = "$uid" ] || die "user $u exists with uid $(id -u "$u"), expected $uid"
  else
    getent passwd "$uid" >/dev/null && die "uid $uid is taken by $(getent passwd "$uid" | cut -d: -f1)"
    useradd --uid "$uid" --user-group --create-home --shell /bin/bash "$u"
    log "created job user $u (uid $uid)"
  fi
done

# ------------------------------------------------------------------ directories and devices
mkdir -p "$ETC" "$SL/state" "$SL/spool" "$LOGDIR" "$RUN" "$DEV" "$MUNGE"
chmod 0755 "$SL" "$DEV"
chown munge:munge "$MUNGE"
chmod 0755 "$MUNGE"  # job users reach the socket through it

minor=0
for n in "${NODES[@]}"; do
  for _ in 0 1; do
    f="$DEV/nvidia$minor"
    if [ ! -c "$f" ] || [ "$(stat -c '%t:%T' "$f")" != "c3:$(printf '%x' "$minor")" ]; then
      rm -f "$f"
      mknod "$f" c 195 "$minor"
    fi
    chmod 0666 "$f"  # file modes allow everyone: only Slurm's device cgroup may refuse
    minor=$((minor + 1))
  done
done

# Slurm's JWT key (jwt.html: 0600, readable by SlurmUser only; slurmrestd needs no key, it
# passes each request's token on to slurmctld)
mkdir -p "$JWT"
chmod 0700 "$JWT"
if [ ! -s "$JWT/jwt_hs256.key" ]; then
  ( umask 077; dd if=/dev/urandom of="$JWT/jwt_hs256.key" bs=32 count=1 status=none )
  log "made JWT key $JWT/jwt_hs256.key"
fi

if [ ! -s "$MUNGE/munge.key" ]; then
  setpriv --reuid=munge --regid=munge --init-groups mungekey --create --keyfile="$MUNGE/munge.key"
  log "made munge key $MUNGE/munge.key"
fi

# ------------------------------------------------------------------ configuration files
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
make_config "$TMP"
changed=()
for f in slurm.conf cgroup.conf gres.conf node-resume node-suspend; do
  cmp -s "$TMP/$f" "$ETC/$f" || changed+=("$f")
done
if [ "${#changed[@]}" -gt 0 ] && [ -f "$ETC/slurm.conf" ] && { pid_alive slurmctld slurmctld >/dev/null \
    || pid_alive slurmd-node1 slurmd >/dev/null || pid_alive slurmd-node2 slurmd >/dev/null \
    || pid_alive slurmd-node3 slurmd >/dev/null || pid_alive slurmrestd slurmrestd >/dev/null; }; then
  # daemons of this cluster run: the ones missing start with the configuration the running ones
  # have; the new one applies when the cluster next starts (not restarted behind others' tests)
  log "WARNING: ${changed[*]} in $ETC differ from what this script writes now, and daemons of" \
      "the cluster run with them: kept; they change when the cluster next starts" \
      "(scripts/slurm.sh --stop, then scripts/slurm.sh)"
else
  for f in "${changed[@]}"; do
    cp "$TMP/$f" "$ETC/$f"
    case "$f" in node-*) chmod 0755 "$ETC/$f" ;; *) chmod 0644 "$ETC/$f" ;; esac
  done
fi

# ------------------------------------------------------------------ daemons
start() {  # NAME LOGFILE COMMAND...
  local name="$1" logf="$2"
  shift 2
  # every descriptor above 2 is closed first: munged and slurmrestd keep what they inherit,
  # and under `flock /tmp/gpuspawner-e2e.lock make slurm` that would hold the shared lock for
  # as long as the cluster runs
  ( for fd in /proc/"$BASHPID"/fd/*; do
      fd="${fd##*/}"
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done
    exec setsid "$@" ) >"$logf" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  log "started $name (pid $!): $*"
}

wait_for() {  # SECONDS DESCRIPTION COMMAND...: poll COMMAND until it succeeds or time is up
  local deadline=$((SECONDS + $1)) what="$2"
  shift 2
  log "waiting (at most $((deadline - SECONDS)) s) for $what"
  until "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

if ! pid_alive munged munged >/dev/null; then
  rm -f "$MUNGE/munged.sock" "$MUNGE/munged.sock.lock"
  start munged "$LOGDIR/munged.out" setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --socket="$MUNGE/munged.sock" --key-file="$MUNGE/munge.key" \
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed"
  wait_for 10 "munge socket" test -S "$MUNGE/munged.sock" || {
    tail -n 20 "$LOGDIR/munged.out" "$MUNGE/munged.log" >&2 2>/dev/null || true
    die "munged did not make its socket $MUNGE/munged.sock within 10 s"
  }
fi

if ! pid_alive slurmctld slurmctld >/dev/null; then
  start slurmctld "$LOGDIR/slurmctld.out" slurmctld -D -i -f "$CONF"
  wait_for 20 "slurmctld (scontrol ping)" scontrol ping >/dev/null 2>&1 || {
    tail -n 20 "$LOGDIR/slurmctld.out" "$LOGDIR/slurmctld.log" >&2 2>/dev/null || true
    die "slurmctld did not answer 'scontrol ping' within 20 s"
  }
fi

for n in "${NODES[@]}"; do
  mkdir -p "$SL/spool/$n"
  if ! pid_alive "slurmd-$n" slurmd >/dev/null; then
    start "slurmd-$n" "$LOGDIR/slurmd-$n.out" slurmd -D -N "$n" -f "$CONF"
  fi
done

# slurmrestd(8): as its own user, JWT only, the OpenAPI plugin Debian's 22.05 ships newest
rest_up() { curl -s -o /dev/null "http://127.0.0.1:$REST_PORT/openapi/v3"; }
if ! pid_alive slurmrestd slurmrestd >/dev/null; then
  start slurmrestd "$LOGDIR/slurmrestd.out" env SLURM_JWT=daemon SLURM_CONF="$CONF" \
    setpriv --reuid=slurmrest --regid=slurmrest --init-groups \
    slurmrestd -f "$CONF" -a rest_auth/jwt -s openapi/v0.0.38 "127.0.0.1:$REST_PORT"
  wait_for 20 "slurmrestd on 127.0.0.1:$REST_PORT" rest_up || {
    tail -n 20 "$LOGDIR/slurmrestd.out" >&2 2>/dev/null || true
    die "slurmrestd did not answer on 127.0.0.1:$REST_PORT within 20 s"
  }
fi

if ! wait_for "$WAIT" "every node up in sinfo" nodes_ready; then
  sinfo -N -o '%N %T %E' >&2 || true
  for n in "${NODES[@]}"; do tail -n 10 "$LOGDIR/slurmd-$n.log" >&2 2>/dev/null || true; done
  die "nodes not up within $WAIT s (logs: $LOGDIR)"
fi
log "cluster up: $(sinfo -h -N -o '%N:%T' | tr '\n' ' ')(logs: $LOGDIR)"
echo "export SLURM_CONF=$CONF"
