#!/usr/bin/env bash
# A pipeline stage that stops (SIGSTOP: a frozen process, a debugger, a
# suspended node) in the middle of a PP 4 `hypershard train` run ends the
# job: every rank exits non-zero within comm.timeout_s + 2 s of the stop,
# with one message naming the pipeline send or recv that waited (op, peer,
# group, send/recv number) and the stopped rank (at the end of the chain of
# stages waiting on each other, or after it). Stopped: rank 2 under gpipe, rank 3 (the
# last stage) under 1f1b. The sends and receives between stages are in
# flight on their queues while the threads go on, so this pins that the
# watchdog times them as it times a running collective.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch pp_stall
# Steps take milliseconds: the stop lands mid-run, and a step never comes
# near the timeout on a loaded machine. 16 micro-batches a step keep the
# stages among their hand-overs most of the time, rather than in the
# collectives that close a step.
timeout_s=4
tiny=("${HS_TINY[@]}" model.n_layers=4 accelerator.pp_size=4 train.micro_batch_size=1
      train.global_batch_size=16 train.steps=100000 train.eval_every=0 train.log_every=1
      "comm.timeout_s=$timeout_s")
# The limit: timeout + 2 s, plus 0.5 s because the operation that hangs
# may begin after the stop (a peer first finishes the work in hand: a step
# here is well under 0.1 s) and the two timestamps are the shell's, on two
# cores that the four ranks keep busy.
limit=$(awk -v t=$timeout_s 'BEGIN { print t + 2 + 0.5 }')

stopped="" running=""
# shellcheck disable=SC2154 # work is lib.sh's
cleanup() { # nothing stays stopped or running, however the test ends
    [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null && kill -KILL "$stopped" 2>/dev/null
    [ -n "$running" ] && kill "$running" 2>/dev/null && wait "$running"
    rm -rf "$work"
}
trap cleanup EXIT

# rank_pid NAME RANK: the process of world rank RANK of run NAME.
rank_pid() {
    local p
    for p in $(pgrep -f "^$HS_BIN train .*train.out_dir=$work/$1\$"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return
        fi
    done
}

# stall NAME RANK ARGS...: starts the run, stops RANK after 20 steps and
# waits for the job to end (60 s guard); sets rc, late (seconds from the
# stop to the end) and log.
stall() {
    local name=$1 rank=$2 t0 pid=""
    shift 2
    log="$work/$name.log"
    timeout 60 "$MPIEXEC" -n 4 "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" \
        > "$log" 2>&1 &
    running=$!
    for _ in $(seq 1200); do
        [ -f "$work/$name/metrics.jsonl" ] && [ "$(wc -l < "$work/$name/metrics.jsonl")" -ge 20 ] && break
        sleep 0.05
    done
    pid=$(rank_pid "$name" "$rank")
    [ -n "$pid" ] || die "$name: no process of rank $rank: $(tail -5 "$log")"
    kill -STOP "$pid"
    stopped=$pid
    t0=$(date +%s.%N)
    wait "$running"
    rc=$?
    running=""
    late=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    kill -CONT "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    stopped=""
}

# stage_stall_ends_the_job SCHEDULE RANK: a stop can land while the other
# stages wait in a collective at the end of a step (reported as such, and
# checked alike); up to 4 tries until one lands among the hand-overs.
stage_stall_ends_the_job() {
    local sched=$1 rank=$2 try name msg p2p
    for try in 1 2 3 4; do
        name="${sched}_r${rank}_$try"
        stall "$name" "$rank" accelerator.pp_schedule="$sched"
        echo "$name: exit $rc, ended $late s after the stop (comm.timeout_s $timeout_s)"
        [ "$rc" -ne 124 ] || { fail "$name: still running 60 s after the stop"; return; }
        [ "$rc" -ne 0 ] || { fail "$name: exit 0 with a stopped stage"; return; }
        awk -v l="$late" -v m="$limit" 'BEGIN { exit !(l <= m) }' ||
            fail "$name: ended $late s after the stop (want <= $limit s)"
        [ "$(grep -c 'comm timeout' "$log")" -eq 1 ] || fail "$name: want exactly one timeout message"
        grep -q "^  world rank $rank: did not answer the watchdog (stopped" "$log" ||
            fail "$name: the stopped rank $rank is not named: $(grep -A4 'comm timeout' "$log")"
        msg=$(grep -o "comm timeout: [a-z_]* .* did not finish" "$log")
        p2p="^comm timeout: (send to|recv from) world rank [0-3] on group"
        p2p+=" 'pp_(forward|backward)' \(send/recv number [0-9]+\)"
        if grep -qE "$p2p" <<<"$msg"; then
            echo "$name: $msg"
            return
        fi
        # a stop in a collective: the stopped rank may have arrived before it
        # stopped, and a peer held up behind it is then the one missing; the
        # stopped rank is still named above (it does not answer)
        echo "$name: the stop landed in a collective ($msg); again"
    done
    fail "$sched: no stop of rank $rank landed among the pipeline hand-overs in 4 tries"
}

stage_stall_ends_the_job gpipe 2
stage_stall_ends_the_job 1f1b 3
hs_finish
