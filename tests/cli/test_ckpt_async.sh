#!/usr/bin/env bash
# checkpoint.async (docs/checkpoint.md, "Asynchronous save"): a background
# save writes the bytes a synchronous save of the same step writes, even
# while training changes the weights under a write held in flight; a rank
# killed (kill hook in the writer thread) during a background write leaves
# the previous checkpoint intact, and resume: auto from it continues the
# uninterrupted run's loss curve bit for bit to the same final weights;
# SIGTERM with a write in flight publishes it, saves the stop step and
# exits 3; a background write that fails on one rank stops the run with
# that rank named, publishes nothing and still writes the weights; the
# plan counts the staging memory the run measures.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_signal_grace
hs_scratch ckpt_async

# Constant LR after warm-up: a run's first k steps are any longer run's.
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.eval_every=0
      train.log_every=1 optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2
      fsdp_config.dp_shard_size=2)

latest_is() { # DIR STEP
    local got
    got=$(cat "$1/latest" 2>/dev/null)
    [ "$got" = "step-$2" ] || fail "$1/latest is '$got', want step-$2"
}

# same_step_dir A B: every file of step directory A equals B's byte for
# byte, except what legitimately differs: metadata.json's created_unix (a
# wall-clock time) and config.yaml's checkpoint.async line.
same_step_dir() {
    local f
    [ "$(ls "$1")" = "$(ls "$2")" ] || { fail "$1 and $2 hold different files"; return; }
    for f in "$1"/rank-*.bin; do
        cmp -s "$f" "$2/$(basename "$f")" || fail "$(basename "$f") differs between $1 and $2"
    done
    python3 - "$1" "$2" <<'PY' || fail "metadata.json or config.yaml differ: $1 $2"
import json, sys
a, b = sys.argv[1:]
ma, mb = (json.load(open(d + "/metadata.json")) for d in (a, b))
ma.pop("created_unix"), mb.pop("created_unix")
assert ma == mb, "metadata.json differs beyond created_unix"
ca, cb = ([l for l in open(d + "/config.yaml") if not l.strip().startswith("async:")] for d in (a, b))
assert ca == cb, "config.yaml differs beyond checkpoint.async"
PY
}

test_async_files_equal_sync_files_while_training_moves_on() {
    # The step-2 write waits 300 ms before its first byte while steps 3-4
    # update the weights: the snapshot, not the live buffers, is written.
    HS_CKPT_TEST_WRITE_DELAY_MS=300 hs_must_run 2 async train.steps=4 \
        checkpoint.save_every=2 checkpoint.dir="$work/ck" train.out_dir="$work/out"
    grep -q "step-2 snapshot of" "$work/async.log" || fail "no background save in the async run"
    mv "$work/ck" "$work/ck_async"
    mv "$work/out/metrics.jsonl" "$work/out_async_metrics.jsonl"
    rm -rf "$work/out"
    hs_must_run 2 sync train.steps=4 checkpoint.save_every=2 checkpoint.async=false \
        checkpoint.dir="$work/ck" train.out_dir="$work/out"
    grep -q "snapshot of" "$work/sync.log" && fail "the synchronous run saved in the background"
    mv "$work/ck" "$work/ck_sync"
    same_step_dir "$work/ck_async/step-2" "$work/ck_sync/step-2"
    same_step_dir "$work/ck_async/step-4" "$work/ck_sync/step-4"
    latest_is "$work/ck_async" 4
}

# The staging buffer is host memory for the whole run, reserved at start-up
# from the plan's estimate and never grown by a save here: every step of
# the async run measures the plan's ckpt_staging in peak_host_bytes (no
# offload: nothing else is host), and the plan of a synchronous run has none.
test_plan_counts_the_staging_the_run_holds() {
    local args=("${tiny[@]}" train.steps=4 checkpoint.save_every=2 checkpoint.dir="$work/ck")
    "$HS_BIN" plan --world 2 --json "${args[@]}" > "$work/plan_async.json" 2> /dev/null
    "$HS_BIN" plan --world 2 --json "${args[@]}" checkpoint.async=false \
        > "$work/plan_sync.json" 2> /dev/null
    python3 - "$work" <<'PY' || fail "the plan's ckpt_staging is not the measured staging"
import json, sys
w = sys.argv[1]
staging = lambda f: max(r["host"]["ckpt_staging"] for r in json.load(open(f"{w}/{f}"))["ranks"])
got = {json.loads(l)["peak_host_bytes"] for l in open(f"{w}/out_async_metrics.jsonl")}
planned = staging("plan_async.json")
print(f"staging: planned {planned}, measured {got}")
assert got == {planned} and planned > 0 and staging("plan_sync.json") == 0
PY
}

test_kill_during_background_write_then_resume_matches_uninterrupted() {
    hs_must_run 2 uninterrupted train.steps=12 checkpoint.save_every=4 \
        checkpoint.dir="$work/ck_u" train.out_dir="$work/u"
    # Rank 1's writer thread exits after 100 bytes of step-8's file, 200 ms
    # into the write, while the training thread goes on past step 8.
    HS_CKPT_TEST_KILL_STEP=8 HS_CKPT_TEST_KILL_AFTER_BYTES=100 HS_CKPT_TEST_WRITE_DELAY_MS=200 \
        hs_run 2 killed train.steps=400 checkpoint.save_every=4 checkpoint.dir="$work/ck_k" \
        train.out_dir="$work/k"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "killed run: exit $rc"
    grep -q "exiting after 100 bytes of .*/.tmp-step-8/rank-1.bin" "$work/killed.log" \
        || fail "the kill hook did not fire in step-8's write: $(tail -3 "$work/killed.log")"
    local trained
    trained=$(wc -l < "$work/k/metrics.jsonl")
    [ "$trained" -gt 8 ] || fail "training did not go on during the background write ($trained steps)"
    latest_is "$work/ck_k" 4
    [ ! -e "$work/ck_k/step-8" ] || fail "the killed save published step-8"
    [ "$(stat -c %s "$work/ck_k/.tmp-step-8/rank-1.bin" 2>/dev/null)" = 100 ] \
        || fail "rank-1.bin of the killed write is not 100 bytes"
    "$HS_BIN" ckpt verify "$work/ck_k" > /dev/null 2>&1 || fail "step-4 does not verify after the kill"
    hs_must_run 2 resumed train.steps=12 checkpoint.save_every=4 checkpoint.dir="$work/ck_k" \
        checkpoint.resume=auto train.out_dir="$work/k"
    grep -q "resumed from $work/ck_k/step-4: step 4 of 12" "$work/resumed.log" \
        || fail "no resume from step-4: $(grep -m1 resumed "$work/resumed.log")"
    same_curve "$work/u/metrics.jsonl" "$work/k/metrics.jsonl" 1 12
    cmp -s "$work/u/model.safetensors" "$work/k/model.safetensors" \
        || fail "final weights of the resumed run differ from the uninterrupted run's"
    local f
    for f in "$work"/ck_u/step-12/rank-*.bin; do
        cmp -s "$f" "$work/ck_k/step-12/$(basename "$f")" \
            || fail "step-12 $(basename "$f") of the resumed run differs from the uninterrupted run's"
    done
    [ ! -e "$work/ck_k/.tmp-step-8" ] || fail "the killed write's directory was not cleared"
}

# start NAME ARGS...: a long async run in the background, pid in $bg
start() {
    local name=$1
    shift
    "$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" train.steps=100000 checkpoint.save_every=3 \
        "$@" train.out_dir="$work/$name" > "$work/$name.log" 2>&1 &
    bg=$!
}
ranks_of() { pgrep -f "^$HS_BIN train .*train.out_dir=$work/$1\$"; }
# finished: wait for the run in the background (killed after 90 s); its exit code in rc
finished() {
    timeout 90 tail --pid="$bg" -f /dev/null || kill -9 "$bg"
    wait "$bg"
    rc=$?
}
# in_flight DIR STEP: wait until a save after STEP is being written in DIR
in_flight() {
    for _ in $(seq 400); do
        for d in "$1"/.tmp-step-*; do
            [ -d "$d" ] && [ "${d##*-}" -gt "$2" ] && { echo "${d##*-}"; return 0; }
        done
        sleep 0.025
    done
    return 1
}

test_sigterm_with_a_write_in_flight_saves_and_exits_3() {
    HS_CKPT_TEST_WRITE_DELAY_MS=1500 start term checkpoint.dir="$work/ck_t" checkpoint.keep_last=10
    local n
    n=$(in_flight "$work/ck_t" 0) || { fail "no background write seen"; kill -9 "$bg"; return; }
    kill -TERM $(ranks_of term)
    finished
    local stop
    [ "$rc" -eq 3 ] || fail "SIGTERM run: exit $rc, want 3: $(tail -3 "$work/term.log")"
    stop=$(grep -o "stopped by Terminated after step [0-9]*" "$work/term.log" | grep -o "[0-9]*$")
    [ -n "$stop" ] || { fail "no stop message: $(tail -3 "$work/term.log")"; return; }
    grep -q "checkpoint: saved $work/ck_t/step-$n " "$work/term.log" \
        || fail "the write in flight (step-$n) was not published"
    latest_is "$work/ck_t" "$stop"
    "$HS_BIN" ckpt verify "$work/ck_t/step-$stop" > /dev/null 2>&1 || fail "step-$stop does not verify"
    [ "$stop" = "$n" ] || "$HS_BIN" ckpt verify "$work/ck_t/step-$n" > /dev/null 2>&1 \
        || fail "step-$n does not verify"
    ls -d "$work/ck_t"/.tmp-step-* > /dev/null 2>&1 && fail "a temporary directory is left"
    echo "SIGTERM during step-$n's write: stopped after step $stop, both published"
}

test_failed_background_write_names_the_rank_and_publishes_nothing() {
    HS_CKPT_TEST_WRITE_DELAY_MS=800 start bad checkpoint.dir="$work/ck_b"
    local n
    n=$(in_flight "$work/ck_b" 3) || { fail "no background write seen"; kill -9 "$bg"; return; }
    # rank 1's data file exists before its write: its O_EXCL create fails
    touch "$work/ck_b/.tmp-step-$n/rank-1.bin"
    finished
    [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ] || fail "failed write: exit $rc"
    grep -q "writing data failed on rank 1: cannot create .*rank-1.bin" "$work/bad.log" \
        || fail "the failing rank is not named: $(grep -m2 -i "checkpoint" "$work/bad.log")"
    [ ! -e "$work/ck_b/step-$n" ] || fail "the failed save published step-$n"
    latest_is "$work/ck_b" $((n - 3))
    [ -s "$work/bad/model.safetensors" ] || fail "the weights were not written after the failed save"
}

test_async_files_equal_sync_files_while_training_moves_on
test_plan_counts_the_staging_the_run_holds
test_kill_during_background_write_then_resume_matches_uninterrupted
test_sigterm_with_a_write_in_flight_saves_and_exits_3
test_failed_background_write_names_the_rank_and_publishes_nothing
hs_finish
