#!/usr/bin/env bash
# A metrics or trace file that stops taking writes (here a full disk:
# the file is a link to /dev/full) costs the run nothing else: rank 0 says
# so once, naming the file and the reason, and the run trains to its last
# step, saves its checkpoint and its weights, and exits 0. The final
# weights are not such a file: when they cannot be written the run fails
# naming them.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch metrics_errors
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.eval_every=0
      train.steps=3 fsdp_config.dp_shard_size=2)

# metrics.jsonl on a full disk
mkdir -p "$work/full"
ln -s /dev/full "$work/full/metrics.jsonl"
hs_run 2 full train.out_dir="$work/full" checkpoint.dir="$work/full_ck"
[ "$rc" -eq 0 ] || fail "a full metrics.jsonl ended the run: exit $rc: $(tail -3 "$work/full.log")"
n=$(grep -c "warning: cannot write $work/full/metrics.jsonl at step 1: No space left on device" \
    "$work/full.log")
[ "$n" -eq 1 ] || fail "the metrics failure was said $n times, want once: $(cat "$work/full.log")"
grep -q "it keeps the steps before, and the run goes on without it" "$work/full.log" ||
    fail "the warning does not say that the run goes on"
grep -q "step 3/3" "$work/full.log" || fail "the run did not train to its last step"
[ -d "$work/full_ck/step-3" ] || fail "no checkpoint after a metrics failure"
[ -s "$work/full/model.safetensors" ] || fail "no weights after a metrics failure"

# the trace on a full disk: written beside its place and renamed
mkdir -p "$work/trace"
ln -s /dev/full "$work/trace/trace.json.tmp"
hs_run 2 trace trace.enabled=true trace.dir="$work/trace" train.out_dir="$work/trace_out"
[ "$rc" -eq 0 ] || fail "a full trace file ended the run: exit $rc: $(tail -3 "$work/trace.log")"
n=$(grep -c "warning: trace: cannot write trace $work/trace/trace.json: No space left on device" \
    "$work/trace.log")
[ "$n" -eq 1 ] || fail "the trace failure was said $n times, want once: $(cat "$work/trace.log")"
[ ! -e "$work/trace/trace.json" ] || fail "a trace that could not be written is there"
[ -s "$work/trace_out/model.safetensors" ] || fail "no weights after a trace failure"
grep -q "done: 3 steps" "$work/trace.log" || fail "the run did not finish"

# the final weights on a full disk are an error, after the metrics
mkdir -p "$work/weights"
ln -s /dev/full "$work/weights/model.safetensors.tmp"
hs_run 2 weights train.out_dir="$work/weights"
[ "$rc" -ne 0 ] || fail "weights that could not be written exited 0"
grep -q "$work/weights/model.safetensors" "$work/weights.log" ||
    fail "the weights' failure does not name the file: $(tail -3 "$work/weights.log")"
[ "$(wc -l < "$work/weights/metrics.jsonl")" -eq 3 ] || fail "metrics.jsonl lacks steps"
hs_finish
