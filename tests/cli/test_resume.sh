#!/usr/bin/env bash
# Trainer checkpoints at one world size (docs/checkpoint.md, "Resume"): a run
# stopped at step k and resumed continues bit for bit like the run that never
# stopped (metrics.jsonl strings and the final weights' bytes), for FSDP
# AdamW, one-process Muon and bf16 params with fp32 main params; a save killed
# in the middle leaves the previous checkpoint resumable; save_every and
# keep_last; an incompatible model or optimizer is a clear error before
# anything is written; `hypershard export --ckpt` consolidates a checkpoint.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch resume

# Constant LR after warm-up: a run of 3 steps is the first 3 steps of a run
# of 6, so stopping early is a real stop, not a different schedule.
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.eval_every=0
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
fsdp2=(fsdp_config.dp_shard_size=2)
mixed=(fsdp_config.mix_precision.param_dtype=bfloat16 optimizer.fp32_main_params=true
       fsdp_config.mix_precision.fp32_main_grad=true fsdp_config.mix_precision.reduce_dtype=float32)

latest_is() { # DIR STEP
    local got
    got=$(cat "$1/latest" 2>/dev/null)
    [ "$got" = "step-$2" ] || fail "$1/latest is '$got', want step-$2"
}

test_fsdp_stopped_at_3_resumed_matches_uninterrupted_bitwise() {
    hs_must_run 2 uninterrupted "${fsdp2[@]}" train.steps=6 train.out_dir="$work/u"
    hs_must_run 2 stopped "${fsdp2[@]}" train.steps=3 train.out_dir="$work/s" \
        checkpoint.dir="$work/ck"
    latest_is "$work/ck" 3
    # The resumed run's save at step 6 is killed half-way through rank 1's
    # data file: step-3 must stay the latest, verified and resumable.
    HS_CKPT_TEST_KILL_AFTER_BYTES=100 hs_run 2 killed "${fsdp2[@]}" train.steps=6 \
        train.out_dir="$work/s" checkpoint.dir="$work/ck" checkpoint.resume=auto
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "killed save: exit $rc"
    grep -q "exiting after 100 bytes" "$work/killed.log" || fail "the kill hook did not fire"
    latest_is "$work/ck" 3
    [ ! -e "$work/ck/step-6" ] || fail "the killed save published step-6"
    "$HS_BIN" ckpt verify "$work/ck" > /dev/null 2>&1 || fail "step-3 does not verify after the kill"
    hs_must_run 2 resumed "${fsdp2[@]}" train.steps=6 train.out_dir="$work/s" \
        checkpoint.dir="$work/ck" checkpoint.resume=auto
    grep -q "resumed from $work/ck/step-3: step 3 of 6" "$work/resumed.log" \
        || fail "no 'resumed from' line: $(cat "$work/resumed.log")"
    grep -q "^step 3/6" "$work/resumed.log" && fail "the resumed run trained step 3 again"
    # metrics.jsonl: steps 1-3 from the stopped run, 4-6 from the resumed
    # one (the killed run's lines are gone), bit for bit the uninterrupted curve.
    same_curve "$work/u/metrics.jsonl" "$work/s/metrics.jsonl" 1 6
    cmp -s "$work/u/model.safetensors" "$work/s/model.safetensors" \
        || fail "final weights of the resumed run differ from the uninterrupted run's"
    latest_is "$work/ck" 6
}

test_muon_one_process_resume_by_path_with_save_every_and_keep_last() {
    local muon=(optimizer._target_=muon optimizer.schedule.decay=cosine)
    hs_must_run 1 muon_u "${muon[@]}" train.steps=6 train.out_dir="$work/mu" \
        checkpoint.dir="$work/mck" checkpoint.save_every=2 checkpoint.keep_last=2
    local dirs
    dirs=$(cd "$work/mck" && ls -d step-* | tr '\n' ' ')
    [ "$dirs" = "step-4 step-6 " ] || fail "keep_last=2 with save_every=2 of 6 steps left '$dirs'"
    # a prune renames a step out of the way before deleting it: a process
    # killed while deleting leaves a hidden .pruned-step-N (planted here,
    # half deleted), never a torn step-N, and the next prune finishes it
    [ -z "$(cd "$work/mck" && ls -A | grep '^\.pruned-')" ] || fail "a prune left a .pruned- directory"
    mkdir -p "$work/mck2/.pruned-step-2" && echo torn > "$work/mck2/.pruned-step-2/rank-0.bin"
    "$HS_BIN" ckpt inspect "$work/mck/step-4" | grep -q "momentum_buffer" \
        || fail "no Muon momentum_buffer in the checkpoint"
    hs_must_run 1 muon_r "${muon[@]}" train.steps=6 train.out_dir="$work/mr" \
        checkpoint.dir="$work/mck2" checkpoint.resume="$work/mck/step-4"
    same_curve "$work/mu/metrics.jsonl" "$work/mr/metrics.jsonl" 5 6
    [ ! -e "$work/mck2/.pruned-step-2" ] || fail "the next save left a half-deleted .pruned-step-2"
    cmp -s "$work/mu/model.safetensors" "$work/mr/model.safetensors" \
        || fail "Muon: final weights of the resumed run differ"
}

test_bf16_params_with_fp32_main_params_resume_bitwise() {
    hs_must_run 2 mixed_u "${fsdp2[@]}" "${mixed[@]}" train.steps=4 train.out_dir="$work/xu"
    hs_must_run 2 mixed_s "${fsdp2[@]}" "${mixed[@]}" train.steps=2 train.out_dir="$work/xs" \
        checkpoint.dir="$work/xck"
    local listing
    listing=$("$HS_BIN" ckpt inspect "$work/xck")
    grep -Eq "^  main\.model\.norm\.weight +float32" <<<"$listing" || fail "no fp32 main.model.norm.weight"
    grep -Eq "^  model\.norm\.weight +bfloat16" <<<"$listing" || fail "no bf16 model.norm.weight"
    hs_must_run 2 mixed_r "${fsdp2[@]}" "${mixed[@]}" train.steps=4 train.out_dir="$work/xs" \
        checkpoint.dir="$work/xck" checkpoint.resume=auto
    same_curve "$work/xu/metrics.jsonl" "$work/xs/metrics.jsonl" 1 4
    cmp -s "$work/xu/model.safetensors" "$work/xs/model.safetensors" \
        || fail "mixed precision: final weights of the resumed run differ"
}

test_incompatible_model_or_optimizer_is_a_clear_error() {
    hs_run 1 bad_dim model.dim=48 train.steps=6 train.out_dir="$work/bad" \
        checkpoint.resume="$work/ck/step-3"
    [ "$rc" -eq 2 ] || fail "model.dim changed: exit $rc, want 2"
    grep -q "model.dim: checkpoint 32, this run 48" "$work/bad_dim.log" \
        || fail "model.dim change not named: $(cat "$work/bad_dim.log")"
    hs_run 1 bad_opt optimizer._target_=muon train.steps=6 train.out_dir="$work/bad" \
        checkpoint.resume="$work/ck/step-3"
    [ "$rc" -eq 2 ] || fail "optimizer changed: exit $rc, want 2"
    grep -q "optimizer._target_: checkpoint adamw, this run muon" "$work/bad_opt.log" \
        || fail "optimizer change not named: $(cat "$work/bad_opt.log")"
    hs_run 1 bad_steps train.steps=4 train.out_dir="$work/bad" checkpoint.resume="$work/ck/step-6"
    [ "$rc" -eq 2 ] || fail "resume past train.steps: exit $rc, want 2"
    grep -q "holds step 6, beyond train.steps = 4" "$work/bad_steps.log" \
        || fail "step past train.steps not explained: $(cat "$work/bad_steps.log")"
    cp -r "$work/ck/step-6" "$work/neg_step"
    python3 - "$work/neg_step/metadata.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["state"]["step"] = m["state"]["data_position"] = -3
json.dump(m, open(sys.argv[1], "w"))
PY
    hs_run 1 neg_step train.steps=6 train.out_dir="$work/bad" checkpoint.resume="$work/neg_step"
    [ "$rc" -ne 0 ] || fail "a negative checkpoint step resumed"
    grep -q "step -3 is negative; the checkpoint is damaged" "$work/neg_step.log" \
        || fail "negative step not explained: $(cat "$work/neg_step.log")"
    hs_run 1 bad_path train.steps=6 train.out_dir="$work/bad" checkpoint.resume="$work/nowhere"
    [ "$rc" -eq 2 ] || fail "missing resume path: exit $rc, want 2"
    grep -q "checkpoint.resume = $work/nowhere" "$work/bad_path.log" || fail "bad path not named"
    [ ! -e "$work/bad" ] || fail "a rejected resume created train.out_dir"
}

test_resume_auto_on_an_empty_dir_starts_fresh() {
    hs_must_run 1 fresh train.steps=1 train.out_dir="$work/f" checkpoint.dir="$work/fck" \
        checkpoint.resume=auto
    grep -q "no checkpoint in $work/fck yet; starting fresh" "$work/fresh.log" || fail "no fresh-start line"
    latest_is "$work/fck" 1
}

test_export_ckpt_equals_the_runs_own_export() {
    "$HS_BIN" export --safetensors "$work/ex" --ckpt "$work/ck" > "$work/export.log" 2>&1 \
        || fail "export --ckpt: $(cat "$work/export.log")"
    cmp -s "$work/ex/model.safetensors" "$work/s/model.safetensors" \
        || fail "export --ckpt of step-6 differs from the run's model.safetensors"
    "$HS_BIN" export --safetensors "$work/ex2" --ckpt "$work/ck" --run "$work/s" > /dev/null 2>&1
    [ $? -eq 2 ] || fail "--ckpt with --run must be a usage error"
}

test_fsdp_stopped_at_3_resumed_matches_uninterrupted_bitwise
test_muon_one_process_resume_by_path_with_save_every_and_keep_last
test_bf16_params_with_fp32_main_params_resume_bitwise
test_incompatible_model_or_optimizer_is_a_clear_error
test_resume_auto_on_an_empty_dir_starts_fresh
test_export_ckpt_equals_the_runs_own_export
hs_finish
