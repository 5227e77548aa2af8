#!/usr/bin/env bash
# SIGTERM / SIGINT stop a run gracefully (docs/training.md, "Stopping"):
# the current step finishes, a checkpoint of it is saved, the run says so
# and exits 3; `checkpoint.resume: auto` then continues from it. Tested on
# one process, under mpiexec with the signal sent to every rank (as Slurm
# does on preemption) and to one rank only (every rank stops after the same
# step); a second signal ends the run at once (exit 128 + 15).
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_signal_grace
hs_scratch stop
# long enough to be signalled mid-run: each step takes tens of milliseconds
tiny=(model.dim=128 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=256
      train.seq_len=128 train.micro_batch_size=4 train.eval_every=0 train.log_every=1
      train.steps=100000 optimizer.schedule.warmup_steps=0)

# start NAME RANKS ARGS...: run in the background; pid in $bg
start() {
    local name=$1 n=$2
    shift 2
    local launch=()
    [ "$n" = 1 ] || launch=("$MPIEXEC" -n "$n")
    "${launch[@]}" "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" \
        > "$work/$name.log" 2>&1 &
    bg=$!
}
# until_steps NAME K: wait until NAME has logged K steps
until_steps() {
    for _ in $(seq 600); do
        [ -f "$work/$1/metrics.jsonl" ] && [ "$(wc -l < "$work/$1/metrics.jsonl")" -ge "$2" ] && return 0
        sleep 0.05
    done
    fail "$1 never reached step $2"
}
ranks_of() { pgrep -f "^$HS_BIN train .*train.out_dir=$work/$1\$"; }
# finished NAME WANT_RC: wait for the run, check its exit code and the stop
finished() {
    wait "$bg"
    local rc=$?
    [ "$rc" -eq "$2" ] || fail "$1: exit $rc, want $2: $(tail -5 "$work/$1.log")"
}
saved_step() { # NAME CKPT: the step the stop message names, and that it is in CKPT
    local step
    step=$(grep -o "stopped by Terminated after step [0-9]*" "$work/$1.log" | grep -o "[0-9]*$" | head -1)
    [ -n "$step" ] || { fail "$1: no stop message: $(tail -5 "$work/$1.log")"; return; }
    [ -d "$2/step-$step" ] || fail "$1: no checkpoint step-$step in $2"
    "$HS_BIN" ckpt verify "$2/step-$step" > /dev/null 2>&1 || fail "$1: step-$step does not verify"
    [ "$(wc -l < "$work/$1/metrics.jsonl")" -eq "$step" ] || fail "$1: metrics.jsonl is not $step lines"
    echo "$1: stopped after step $step, checkpoint verified"
}

# one process
start one 1 checkpoint.dir="$work/ck_one"
until_steps one 2
kill -TERM "$bg"
finished one 3
saved_step one "$work/ck_one"
grep -q "saved the checkpoint $work/ck_one/step-" "$work/one.log" || fail "one: the save is not named"
# resume: continues past the saved step
hs_must_run 1 resumed train.steps=$(( $(wc -l < "$work/one/metrics.jsonl") + 1 )) \
    checkpoint.dir="$work/ck_one" checkpoint.resume=auto train.out_dir="$work/one"
grep -q "resumed from $work/ck_one/step-" "$work/resumed.log" || fail "no resume after the stop"

# two ranks, every rank signalled
start all 2 fsdp_config.dp_shard_size=2 checkpoint.dir="$work/ck_all"
until_steps all 2
kill -TERM $(ranks_of all)
finished all 3
saved_step all "$work/ck_all"

# two ranks, one rank signalled: the other stops after the same step
start r1 2 fsdp_config.dp_shard_size=2 checkpoint.dir="$work/ck_r1"
until_steps r1 2
kill -TERM "$(ranks_of r1 | tail -1)"
finished r1 3
saved_step r1 "$work/ck_r1"

# a second signal: at once
start twice 1 checkpoint.dir="$work/ck_twice" model.dim=256 train.seq_len=256
until_steps twice 1
kill -TERM "$bg"; sleep 0.01; kill -TERM "$bg"
finished twice 143
grep -q "second signal: ending the run now" "$work/twice.log" || fail "second signal not announced"
hs_finish
