#!/usr/bin/env bash
# The Slurm stage: Debian's Slurm (slurm-wlm) and munge, a throw-away cluster on this machine, the
# example batch scripts submitted with `sbatch --wait`, and their output checked.
#
#   bash ci/slurm.sh           install the packages, then for a 1-node cluster and a 2-node one (two
#                              slurmd's on the loopback): start it, run the checks below, stop it
#   bash ci/slurm.sh install   only install the packages
#
# The checks, on each cluster: `srun` without an MPI plugin is refused by mpisync's launch check (a
# world of one while Slurm started two tasks); examples/slurm_train.sbatch trains fresh, then again
# from its checkpoint (staged with `mpisync stage-checkpoint`); examples/slurm_ddp.sbatch trains with
# DDP on the mpisync backend. ci/slurm_check.py reads the jobs' output: every rank in one world of
# N, the same digests on every rank, the resumed state equal to the saved one.
#
# Exit status: 0 passed, 1 failed, 77 skipped (not root, no apt-get, or the packages cannot be
# installed: the reason is printed). Everything lives in one fresh folder: config, munge key and
# socket, state, logs, job output. The daemons are started by hand and stopped by pid (with a sweep of
# /proc for the job steps they leave), on success, failure or interrupt; every wait is bounded,
# every srun and sbatch by `timeout --kill-after` and a job `--time`.
# Settings: VENV (default .venv: what the jobs activate), SLURM_CI_JOB_SECONDS (per job, 300),
# SLURM_CI_STEPS (training steps per job, 10).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/sbin:/sbin # slurmd, slurmctld and munged live in /usr/sbin

readonly SKIP=77
VENV=${VENV:-.venv}
JOB_SECONDS=${SLURM_CI_JOB_SECONDS:-300}
STEPS=${SLURM_CI_STEPS:-10}
PACKAGES=(slurmctld slurmd slurm-client munge)
COMMANDS=(slurmctld slurmd slurmstepd srun sbatch scontrol sinfo squeue scancel munged munge unmunge)
DIR="" # the cluster's folder, made by start_cluster

say() { printf 'slurm: %s\n' "$*"; }
have_slurm() {
  local c
  for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null 2>&1 || return 1; done
}

# -- install: Debian's packages without their recommends (8 packages instead of 42) -------------------
install() {
  if have_slurm; then
    say "installed: $(slurmd -V), $(munged -V 2>&1 | awk '{print $1; exit}')"
    return 0
  fi
  [[ $EUID -eq 0 ]] || { say "SKIP: Slurm is not installed and this is not root (apt-get needs root)"; exit $SKIP; }
  command -v apt-get >/dev/null || { say "SKIP: Slurm is not installed and there is no apt-get here"; exit $SKIP; }
  local started=$SECONDS rc=0 policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then # keep the packages' scripts from starting system daemons
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -q >/dev/null 2>&1 || say "apt-get update failed; installing with the lists there are"
  timeout 900 apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=120 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${PACKAGES[@]}" >/dev/null 2>&1 || rc=$?
  ((policy)) && rm -f /usr/sbin/policy-rc.d
  if ((rc)) || ! have_slurm; then
    say "SKIP: apt-get install ${PACKAGES[*]} failed (status $rc): no Slurm here"
    exit $SKIP
  fi
  say "installed in $((SECONDS - started)) s: $(slurmd -V)"
}

# -- daemons: started by hand, found again by their pid files -----------------------------------------
alive() { # a running process (a zombie waiting for PID 1 to reap it is not)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}
pid_of() { # PIDFILE PROGRAM: the pid, if that process is alive and is PROGRAM
  local pid
  [[ -s $1 ]] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [[ -n $pid ]] && alive "$pid" && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$2"* ]] && echo "$pid"
}
wait_for() { # SECONDS WHAT COMMAND...: poll until COMMAND succeeds
  local limit=$1 end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || { say "timed out after $limit s waiting for $what"; return 1; }
    sleep 0.2
  done
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
nodes_idle() { [[ $(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$') -eq $1 ]]; }
dump_logs() {
  local f
  for f in "$DIR"/log/*.log; do
    [[ -f $f ]] && { echo "----- last lines of $f"; tail -n 20 "$f"; }
  done
}

write_conf() { # NODES CPUS CTLD_PORT SLURMD_PORT
  local i
  cat >"$DIR/slurm.conf" <<EOF
ClusterName=mpisync-ci
# "localhost" is this host for slurmctld, whatever its name; nodes are named node1, node2
SlurmctldHost=localhost
SlurmctldPort=$3
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
PlugStackConfig=$DIR/plugstack.conf
TmpFS=$DIR/tmp
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Slurm's default: srun starts no MPI plugin unless asked (--mpi=pmi2), as on many clusters
MpiDefault=none
# a node may declare more CPUs than the machine has
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
# with MinJobAge=5, sbatch --wait polls every 2 s (it backs off to 32 s with the default 300)
MinJobAge=5
Waittime=0
PartitionName=ci Nodes=ALL Default=YES MaxTime=30 State=UP
EOF
  for ((i = 1; i <= $1; i++)); do
    echo "NodeName=node$i NodeHostname=node$i NodeAddr=127.0.0.$i Port=$(($4 + i - 1)) CPUs=$2 State=UNKNOWN" >>"$DIR/slurm.conf"
  done
  : >"$DIR/plugstack.conf"
}

start_cluster() { # NODES: munged, slurmctld, one slurmd per node; wait until every node is idle
  local nodes=$1 base i key
  DIR=$(mktemp -d "${TMPDIR:-/tmp}/mpisync-slurm.XXXXXX")
  mkdir -p "$DIR"/{state,spool,run,log,tmp,jobs,munge/key}
  chmod 755 "$DIR" "$DIR/munge" # munged: every folder above its socket searchable by all
  chmod 700 "$DIR/munge/key"
  chmod 1777 "$DIR/tmp"
  for base in $(seq 16817 100 19817); do # three free ports: slurmctld, then one per slurmd
    port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)) && break
  done
  key=$DIR/munge/key/munge.key
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none && chmod 600 "$key"
  munged --key-file="$key" --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/key/seed"
  wait_for 10 munged pid_of "$DIR/run/munged.pid" munged
  write_conf "$nodes" "$(($(nproc) > 4 ? $(nproc) : 4))" "$base" $((base + 1))
  export SLURM_CONF=$DIR/slurm.conf # the clients, and the jobs they start, read this
  slurmctld -f "$SLURM_CONF" -i
  wait_for 30 slurmctld bash -c 'scontrol ping | grep -q "is UP"'
  for ((i = 1; i <= nodes; i++)); do
    mkdir -p "$DIR/spool/node$i"
    slurmd -f "$SLURM_CONF" -N "node$i" # -N: which NodeName line this slurmd is
  done
  wait_for 60 "$nodes idle node(s)" nodes_idle "$nodes"
  say "cluster up in $DIR: $(sinfo -h -N -o '%N %T, %c CPUs' | paste -sd ';' -)"
}

stop_pids() { # SIGNAL PID...: signal each, wait at most 10 s, then SIGKILL what is left
  local signal=$1 pid end
  shift
  (($#)) || return 0
  kill -"$signal" "$@" 2>/dev/null || true
  end=$((SECONDS + 10))
  for pid in "$@"; do
    while alive "$pid" && ((SECONDS < end)); do sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

leftovers() { # pids of this cluster's job steps: slurmstepd's with a file open in $DIR, and tasks
  local p exe
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" ]] && continue
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    if [[ ${exe##*/} == slurmstepd* ]]; then
      ls -l "/proc/$p/fd" 2>/dev/null | grep -qF -- "$DIR/" && echo "$p"
    elif grep -qzxF "SLURM_CONF=$DIR/slurm.conf" "/proc/$p/environ" 2>/dev/null \
      && grep -qz '^SLURM_JOB_ID=' "/proc/$p/environ" 2>/dev/null; then
      echo "$p"
    fi
  done
}

stop_cluster() {
  [[ -n $DIR && -d $DIR ]] || return 0
  local pids=() f pid
  if pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    timeout 10 scancel --partition=ci 2>/dev/null || true
    wait_for 15 "the jobs to end" bash -c '[[ -z $(squeue -h -o %i 2>/dev/null) ]]' || true
  fi
  for f in "$DIR"/run/slurmd-*.pid; do pid=$(pid_of "$f" slurmd) && pids+=("$pid"); done
  stop_pids TERM "${pids[@]}"
  # steps left without their slurmd: slurmstepd ignores SIGTERM
  mapfile -t pids < <(leftovers)
  stop_pids KILL "${pids[@]}"
  pids=()
  pid=$(pid_of "$DIR/run/slurmctld.pid" slurmctld) && pids+=("$pid")
  pid=$(pid_of "$DIR/run/munged.pid" munged) && pids+=("$pid")
  stop_pids TERM "${pids[@]}"
  rm -rf "$DIR"
  DIR=""
}

# -- jobs -----------------------------------------------------------------------------------------------
bounded() { timeout --kill-after=10 "$JOB_SECONDS" "$@"; }

submit() { # NAME NODES SCRIPT [sbatch options...]: sbatch --wait, bounded; print the job's output
  local name=$1 nodes=$2 script=$3 out=$DIR/jobs/$1.out rc=0
  shift 3
  say "\$ sbatch --wait --nodes=$nodes --ntasks-per-node=2 $* $script"
  bounded sbatch --wait --job-name="$name" --output="$out" --nodes="$nodes" --ntasks-per-node=2 \
    --cpus-per-task=1 --time=5 "$@" "$script" >/dev/null || rc=$?
  ((rc == 124 || rc == 137)) && timeout 10 scancel --name="$name" 2>/dev/null # sbatch --wait ends, the job does not
  sed "s/^/  $name | /" "$out" 2>/dev/null || echo "  $name | (no output)"
  ((rc == 0)) || say "job $name: sbatch exited with status $rc"
  return $rc
}

check_srun_without_mpi() { # a step of two tasks without an MPI plugin: refused, not two lone models
  local out rc=0
  out=$(bounded srun --mpi=none -N1 -n2 --time=2 "$VENV/bin/python" -c \
    'import numpy, mpisync; print(mpisync.sync_params({"w": numpy.zeros(4)}).transport)' 2>&1) || rc=$?
  # (grep -o: the two tasks' lines may share a line of srun's output)
  if ((rc != 0)) && [[ $(grep -o "srun without an MPI plugin started it as one of 2 processes" <<<"$out" | wc -l) == 2 ]]; then
    say "PASS srun --mpi=none -n2: both tasks refused: $(grep -m1 -o 'srun without.*pmi2 \.\.\.`' <<<"$out")"
  else
    say "FAIL srun --mpi=none -n2 (status $rc), expected the launch check's error on both tasks:"
    echo "$out"
    return 1
  fi
}

run_checks() { # NODES
  local nodes=$1 ranks=$(($1 * 2)) work=$DIR/jobs/train
  # MPISYNC_LOG=warning: the jobs' logs hold their results, not a line per sync
  export VENV CKPT=$work/shared/latest.npz LOCAL_DIR=$work/local STEPS MPISYNC_TIMEOUT=120 \
    MPISYNC_LOG=warning
  check_srun_without_mpi
  submit "train-fresh-$nodes" "$nodes" examples/slurm_train.sbatch
  submit "train-resumed-$nodes" "$nodes" examples/slurm_train.sbatch
  submit "ddp-$nodes" "$nodes" examples/slurm_ddp.sbatch
  "$VENV/bin/python" ci/slurm_check.py train --ranks "$ranks" \
    "$DIR/jobs/train-fresh-$nodes.out" "$DIR/jobs/train-resumed-$nodes.out"
  "$VENV/bin/python" ci/slurm_check.py ddp --ranks "$ranks" "$DIR/jobs/ddp-$nodes.out"
}

main() {
  local started=$SECONDS nodes t0
  install
  [[ ${1:-} == install ]] && return 0
  [[ $EUID -eq 0 ]] || { say "SKIP: the daemons run as root (SlurmUser=root), and this is not root"; exit $SKIP; }
  [[ -x $VENV/bin/python ]] || { say "FAIL: no $VENV/bin/python (ci/setup.sh makes .venv; VENV= names another)"; exit 1; }
  trap 'rc=$?; trap - EXIT; ((rc)) && [[ -n $DIR ]] && dump_logs; stop_cluster; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  for nodes in 1 2; do
    t0=$SECONDS
    say "== $nodes node(s), 2 tasks per node"
    start_cluster "$nodes"
    run_checks "$nodes"
    stop_cluster
    say "$nodes node(s): passed in $((SECONDS - t0)) s"
  done
  say "all passed in $((SECONDS - started)) s"
}

main "$@"
