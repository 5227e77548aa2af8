#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, confined to a scratch directory,
# for tests/cli/test_slurm.sh and for trying the sbatch script of
# docs/launch.md ("Under Slurm") by hand.
#
#   scripts/slurm-test-cluster.sh start DIR [CPUS]   # CPUS: slots of the node (default 8)
#   scripts/slurm-test-cluster.sh stop DIR
#   export SLURM_CONF=DIR/slurm.conf                 # then sbatch, srun, squeue ...
#
# start installs Debian's slurm-wlm and munge when they are missing (apt-get,
# as root), makes a munge key, starts munged on a socket in DIR, writes
# DIR/slurm.conf (this host by its `hostname`, address 127.0.0.1, two free
# local ports, state, spool, logs and pid files under DIR, no cgroups:
# proctrack/linuxproc, task/none, accounting none) and starts slurmctld and
# slurmd as root; it returns once the node is idle. The node has CPUS slots
# whatever the machine has (SlurmdParameters=config_overrides), so a 4-task
# job fits a 2-core machine. Nothing in /etc is read or written but the
# packages' own files; every daemon listens on 127.0.0.1 only in effect
# (the node's address) and its pid is kept in DIR. KillWait is 2 s: a step
# whose rank was killed holds its other ranks in a collective, and they are
# ended that much sooner.
# stop cancels the cluster's jobs, ends the job steps' processes, slurmd,
# slurmctld and munged (by the pids in DIR, nothing else) and leaves DIR.
# Both are idempotent: start on a running cluster and stop on a stopped one
# do nothing. Exit status 0 on success; 1 when the packages cannot be
# installed or a daemon does not start (the reason on stderr, with the tail
# of its log).
set -uo pipefail

usage() { echo "usage: $0 start|stop DIR [CPUS]" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$2
cpus=${3:-8}
err() { echo "slurm-test-cluster: $*" >&2; exit 1; }

alive() { # PIDFILE: the process it names runs
    local p
    p=$(cat "$1" 2> /dev/null) && [ -n "$p" ] && kill -0 "$p" 2> /dev/null
}

install_packages() {
    command -v slurmctld > /dev/null && command -v slurmd > /dev/null &&
        command -v sbatch > /dev/null && command -v munged > /dev/null && return 0
    [ "$(id -u)" -eq 0 ] || err "slurm-wlm and munge are not installed, and only root can install them"
    command -v apt-get > /dev/null || err "slurm-wlm and munge are not installed, and there is no apt-get"
    echo "slurm-test-cluster: installing slurm-wlm and munge" >&2
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge; } \
        > "$dir/apt.log" 2>&1 || err "apt-get could not install slurm-wlm and munge: $(tail -3 "$dir/apt.log")"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
wait_for() {
    local n=$(($1 * 10))
    shift 2 # WHAT: for the reader
    for _ in $(seq "$n"); do
        "$@" > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

start() {
    [ "$(id -u)" -eq 0 ] || err "the daemons run as root here (SlurmUser=root); run as root"
    mkdir -p "$dir" || err "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    export SLURM_CONF=$dir/slurm.conf
    if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" && alive "$dir/munged.pid"; then
        return 0 # already running
    fi
    # a partly started cluster: stop what there is, then start afresh
    stop
    install_packages
    local host
    host=$(hostname -s 2> /dev/null || hostname)
    [ -n "$host" ] || err "no host name"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" || err "cannot create $dir/state, spool, log"
    chmod 700 "$dir"

    # munge: its own key, socket, pid, seed and log in $dir
    if [ ! -s "$dir/munge.key" ]; then
        if command -v mungekey > /dev/null; then
            mungekey -c -k "$dir/munge.key" 2> "$dir/log/mungekey.log" || err "mungekey failed: $(cat "$dir/log/mungekey.log")"
        else
            dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2> /dev/null
        fi
    fi
    chmod 400 "$dir/munge.key"
    munged -f --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
        --seed-file="$dir/munged.seed" --log-file="$dir/log/munged.log" \
        > "$dir/log/munged.out" 2>&1 || err "munged did not start: $(tail -3 "$dir/log/munged.out" "$dir/log/munged.log")"
    wait_for 10 munged test -S "$dir/munge.sock" || err "munged made no socket: $(tail -3 "$dir/log/munged.log")"

    local cport dport
    if ! cport=$(free_port) || ! dport=$(free_port); then err "no free local port (python3 needed)"; fi
    [ "$cport" != "$dport" ] || dport=$((cport + 1))
    : > "$dir/plugstack.conf"
    # srun --mpi=pmix: the PMIx plugin's directories in $dir, not /tmp
    mkdir -p "$dir/pmix"
    echo "PMIxCliTmpDirBase=$dir/pmix" > "$dir/mpi.conf"
    cat > "$SLURM_CONF" <<EOF
# one-node test cluster (scripts/slurm-test-cluster.sh)
ClusterName=hstest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$cport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=2
MinJobAge=300
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    # -D: in the foreground, in the background here, so the pid is known
    # from the start (the daemons write their pid files too).
    setsid slurmctld -D -i -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 < /dev/null &
    echo $! > "$dir/slurmctld.pid"
    wait_for 20 slurmctld scontrol ping ||
        err "slurmctld does not answer: $(tail -5 "$dir/log/slurmctld.out" "$dir/log/slurmctld.log")"
    setsid slurmd -D -f "$SLURM_CONF" -N "$host" > "$dir/log/slurmd.out" 2>&1 < /dev/null &
    echo $! > "$dir/slurmd.pid"
    idle() { sinfo -h -n "$host" -o %t | grep -qx idle; }
    wait_for 30 slurmd idle ||
        err "node $host is not idle: $(sinfo -h -o '%t %E' 2>&1; tail -5 "$dir/log/slurmd.out" "$dir/log/slurmd.log")"
    echo "slurm-test-cluster: node $host ($cpus CPUs) up; export SLURM_CONF=$SLURM_CONF" >&2
}

# stop_pids PIDFILE...: SIGTERM to the processes the PIDFILEs name, all at
# once (each takes a second or two to end), then SIGKILL to those left
# after 10 s
stop_pids() {
    local f p pids=()
    for f in "$@"; do
        p=$(cat "$f" 2> /dev/null) && [ -n "$p" ] && kill -TERM "$p" 2> /dev/null && pids+=("$p")
    done
    for _ in $(seq 100); do
        local left=0
        for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && left=1; done
        [ "$left" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null; done
    rm -f "$@"
}

# The job steps' slurmstepd processes of this cluster: they carry its
# SLURM_CONF in their environment.
stepds() {
    local p
    for p in $(pgrep -x slurmstepd 2> /dev/null); do
        tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf" && echo "$p"
    done
}

# kill_tree PID: SIGKILL to PID and every process below it
kill_tree() {
    local c
    kill -STOP "$1" 2> /dev/null
    for c in $(ps -o pid= --ppid "$1" 2> /dev/null); do kill_tree "$c"; done
    kill -KILL "$1" 2> /dev/null
}

stop() {
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    export SLURM_CONF=$dir/slurm.conf
    if alive "$dir/slurmctld.pid" && [ -e "$SLURM_CONF" ]; then
        scancel --full --quiet --partition=test 2> /dev/null
        for _ in $(seq 100); do
            [ -z "$(squeue -h -t R,CG,S 2> /dev/null)" ] && [ -z "$(stepds)" ] && break
            sleep 0.1
        done
    fi
    stop_pids "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"
    # a step slurmd could not end: its slurmstepd and everything under it
    local p
    for p in $(stepds); do kill_tree "$p"; done
    rm -f "$dir/munge.sock" "$dir/munge.sock.lock"
}

case $cmd in
start) start ;;
stop) stop ;;
*) usage ;;
esac
