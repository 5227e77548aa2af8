#!/usr/bin/env bash
# The sbatch script of docs/launch.md ("Under Slurm"), scripts/slurm/train.sbatch,
# on a real one-node Slurm cluster (scripts/slurm-test-cluster.sh: Debian's
# slurm-wlm and munge, daemons in the scratch directory, stopped on exit):
#
# - srun with PMIx (MPIEXEC=srun, the script's default): a 4-rank FSDP job;
#   one rank is killed (kill -9) at a random step, the launcher names the
#   task srun reports and restarts the step from its newest checkpoint; at a
#   later random step the batch shell gets SIGTERM (what --signal=B:TERM@120
#   sends before the time limit), the ranks save a checkpoint and exit 3, the
#   job requeues itself, and the requeued job continues from that checkpoint
#   to the end;
# - Open MPI's mpiexec in the allocation (MPIEXEC=mpiexec): a rank killed at
#   a random step, restarted by the launcher; then SIGTERM to the batch
#   shell, passed to the launcher and by mpiexec to the ranks, and the
#   requeued job finishes.
#
# Each job's final metrics.jsonl holds every step once, with the loss, grad
# norm and learning rate of an uninterrupted 4-rank run outside Slurm, bit
# for bit (the same strings). docs/launch.md shows that script. Skips
# (exit 77) where Slurm cannot be installed or started (not root, no apt,
# a daemon that does not come up).
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_signal_grace
hs_scratch slurm

# docs/launch.md shows the script the test runs: its lines but the comments
python3 - "$HS_SRC/scripts/slurm/train.sbatch" "$HS_SRC/docs/launch.md" <<'PY' || die "docs/launch.md's sbatch script is not scripts/slurm/train.sbatch"
import re, sys
def code(lines):
    return [re.sub(r"\s+#.*$", "", l) for l in lines
            if l.strip() and (l.startswith("#SBATCH") or not l.lstrip().startswith("#"))]
doc = open(sys.argv[2]).read()
a = doc.index("#SBATCH --requeue")
sys.exit(code(open(sys.argv[1]).read().splitlines()) != code(doc[a:doc.index("```", a)].splitlines()))
PY

[ "$(id -u)" -eq 0 ] || hs_skip "the test cluster's daemons run as root"
cluster=$HS_SRC/scripts/slurm-test-cluster.sh
trap '"$cluster" stop "$work/cluster" > /dev/null 2>&1; rm -rf "$work"' EXIT
"$cluster" start "$work/cluster" 8 > "$work/cluster.log" 2>&1 ||
    hs_skip "no Slurm cluster here: $(tail -4 "$work/cluster.log")"
export SLURM_CONF=$work/cluster/slurm.conf HYPERSHARD=$HS_BIN
srun --mpi=list 2>&1 | grep -qw pmix || hs_skip "this Slurm has no PMIx plugin (srun --mpi=list)"
host=$(hostname -s 2> /dev/null || hostname)

# A constant learning rate after warm-up, as tests/cli/test_launch.sh.
tiny=("${HS_TINY[@]}" train.micro_batch_size=2 train.eval_every=0 fsdp_config.dp_shard_size=4
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
steps=500
env -u SLURM_CONF "$MPIEXEC" -n 4 "$HS_BIN" train "${tiny[@]}" train.steps=$steps \
    train.out_dir="$work/u" > "$work/u.log" 2>&1 || die "uninterrupted run: $(tail -5 "$work/u.log")"

# submit NAME MPIEXEC: the sbatch script on 4 tasks; job id in $job
submit() {
    job=$(MPIEXEC=$2 sbatch --parsable -J "hs_$1" -n 4 -o "$work/$1.log" \
        "$HS_SRC/scripts/slurm/train.sbatch" "${tiny[@]}" train.steps=$steps \
        train.out_dir="$work/$1" checkpoint.dir="$work/ck_$1" checkpoint.save_every=4) ||
        die "$1: sbatch failed"
}
state() { scontrol show job "$job" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
last_step() { tail -1 "$work/$1/metrics.jsonl" 2> /dev/null | grep -o '"step":[0-9]*' | grep -o '[0-9]*$'; }
until_step() { # NAME S: wait until NAME's metrics.jsonl reaches step S
    for _ in $(seq 1200); do
        [ "$(last_step "$1")" -ge "$2" ] 2> /dev/null && return 0
        case $(state) in
        RUNNING | PENDING | CONFIGURING | "") ;; # "": scontrol did not answer this time
        *) die "$1: job $(state) before step $2: $(tail -5 "$work/$1.log")" ;;
        esac
        sleep 0.05
    done
    die "$1 never reached step $2"
}
kill_rank() { # NAME: kill -9 one of NAME's 4 ranks, chosen at random
    local pids
    mapfile -t pids < <(pgrep -f "^$HS_BIN train .*train.out_dir=$work/$1 ")
    [ "${#pids[@]}" -eq 4 ] || die "$1: ${#pids[@]} ranks running, want 4"
    kill -9 "${pids[RANDOM % 4]}"
}
# stop_and_requeue NAME: SIGTERM to the batch shell, as --signal=B:TERM sends
# it; the job requeues itself. Slurm holds a requeued job for about two
# minutes (BeginTime); the test lets it start once the old run is gone: no
# process of it, the node idle again, and a second more, since slurmd
# refuses a batch launch whose credential is from the second it revoked the
# job's credentials in (the run ended at once, exit 1). Released before the
# old step had ended, srun failed to start its step on the old step's PMIx
# socket and exited 0.
stop_and_requeue() {
    scancel --batch --signal=TERM "$job" || die "$1: scancel failed"
    until_log "$1" "hypershard launch: .*stopped by a signal"
    for _ in $(seq 600); do
        [ "$(state)" = PENDING ] && ! pgrep -f "^$HS_BIN (launch|train) .*train.out_dir=$work/$1 " > /dev/null &&
            ! pgrep -f "^slurmstepd: \[$job\." > /dev/null && [ "$(sinfo -h -n "$host" -o %T)" = idle ] && break
        sleep 0.05
    done
    [ "$(state)" = PENDING ] || die "$1: not requeued (state $(state)): $(tail -5 "$work/$1.log")"
    [ "$(sinfo -h -n "$host" -o %T)" = idle ] || die "$1: node $host not idle: $(sinfo -h -n "$host" -o %T)"
    sleep 1.5
    scontrol update jobid="$job" StartTime=now || die "$1: cannot release the requeued job"
}
# stopped_at NAME PATTERN: the step number at the end of PATTERN (grep -o) in the job's output
stopped_at() { grep -o -- "$2" "$work/$1.log" | head -1 | grep -o '[0-9]*$'; }
until_done() { # NAME: wait until the job has ended; it must have completed
    for _ in $(seq 1200); do
        case $(state) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
        sleep 0.05
    done
    [ "$(state)" = COMPLETED ] || die "$1: job $(state): $(tail -8 "$work/$1.log")"
    scontrol show job "$job" | grep -q "Restarts=1 " || fail "$1: the job was not requeued once"
}

# kill_then_requeue NAME LAUNCHER: submit, kill a rank at a random step,
# wait for the launcher's restart, then SIGTERM the batch shell at a later
# random step and wait for the requeued job to finish; s1 and s2 are the
# two steps.
kill_then_requeue() {
    submit "$1" "$2"
    s1=$((5 + RANDOM % 30))
    until_step "$1" "$s1"
    kill_rank "$1"
    until_log "$1" "restart 1 of 3"
    s2=$(($(last_step "$1") + 3 + RANDOM % 20))
    until_step "$1" "$s2"
    stop_and_requeue "$1"
    until_done "$1"
    echo "$1: killed a rank at step >= $s1, SIGTERM to the batch shell at step >= $s2"
}

test_srun_kill_then_requeue() {
    local s1 s2
    kill_then_requeue srun srun
    # srun's own exit status varies with the order its tasks end in (137 for
    # the SIGKILL, or 1, a peer's that saw the rank die), and tasks that end
    # alike are named as a range ("tasks 1-2"): the task is what the line
    # must name
    grep -Eq "restart 1 of 3: srun: error: $host: tasks? [0-3](-[0-3])?: Killed \(exit (137|1)\)" \
        "$work/srun.log" ||
        fail "srun: the restart does not name the killed task: $(grep 'launch:' "$work/srun.log")"
    # the ranks stopped after their step with a checkpoint, and told srun's output
    grep -q "stopped by Terminated after step [0-9]* of $steps; saved the checkpoint $work/ck_srun/step-" \
        "$work/srun.log" || fail "srun: the ranks did not stop with a checkpoint"
    [ "$(stopped_at srun "stopped by Terminated after step [0-9]*")" -ge "$s2" ] 2> /dev/null ||
        fail "srun: the stop's checkpoint is older than step $s2"
    [ "$(grep -c "resumed from $work/ck_srun/step-[1-9]" "$work/srun.log")" -eq 2 ] ||
        fail "srun: not two resumes from a checkpoint (the restart and the requeued job)"
    grep -q "done on 4 ranks after 0 restarts" "$work/srun.log" || fail "srun: the requeued job did not finish"
    same_curve "$work/u/metrics.jsonl" "$work/srun/metrics.jsonl" 1 $steps
}

test_mpiexec_kill_then_requeue() {
    local s1 s2
    kill_then_requeue mpiexec "$MPIEXEC"
    grep -q "restart 1 of 3: mpiexec noticed that process rank [0-3] .*signal 9" "$work/mpiexec.log" ||
        fail "mpiexec: the restart does not name the killed rank: $(grep 'launch:' "$work/mpiexec.log")"
    # the launcher passed the signal on and names the stop's checkpoint
    # (mpiexec does not pass on the ranks' last lines as it stops)
    grep -q "Terminated received: passing it on to the job (no restart)" "$work/mpiexec.log" ||
        fail "mpiexec: the launcher did not pass the signal on"
    [ "$(stopped_at mpiexec "stopped by a signal; the newest checkpoint is step [0-9]*")" -ge "$s2" ] 2> /dev/null ||
        fail "mpiexec: no stop with a checkpoint from step $s2 on"
    [ "$(grep -c "resumed from $work/ck_mpiexec/step-[1-9]" "$work/mpiexec.log")" -eq 2 ] ||
        fail "mpiexec: not two resumes from a checkpoint"
    grep -q "done on 4 ranks after 0 restarts" "$work/mpiexec.log" || fail "mpiexec: the requeued job did not finish"
    same_curve "$work/u/metrics.jsonl" "$work/mpiexec/metrics.jsonl" 1 $steps
}

test_srun_kill_then_requeue
test_mpiexec_kill_then_requeue
hs_finish
