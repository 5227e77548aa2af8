#!/usr/bin/env bash
# Checkpoints cross the compute seam (docs/checkpoint.md, "Device memory"):
# under HS_DEVICE_GUARD=1 the host cannot touch device memory, and a run
# saved at step 2 and resumed to step 4 still continues bit for bit like the
# run that never stopped (loss, grad norm and lr of every step, and the
# final weights' bytes). On one process, on 2 ranks with FSDP 2, with bf16
# params and fp32 main params, and with offload (whose shards and optimizer
# state are host memory and are saved as such). A guarded save writes the
# same data files as an unguarded one.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ckpt_guard
export HS_DEVICE_GUARD=1

# Constant LR after warm-up, so a run of 2 steps is the first 2 of a run of 4.
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.eval_every=0
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
fsdp2=(fsdp_config.dp_shard_size=2)
mixed=(fsdp_config.mix_precision.param_dtype=bfloat16 optimizer.fp32_main_params=true
       fsdp_config.mix_precision.fp32_main_grad=true fsdp_config.mix_precision.reduce_dtype=float32)

# stop_and_resume NAME RANKS ARGS...: NAME_u trains 4 steps; NAME_s trains
# 2, saving into $work/NAME_ck, and is resumed from there to step 4; both
# under the guard, and the resumed curve and weights are the uninterrupted ones.
stop_and_resume() {
    local name=$1 n=$2
    shift 2
    hs_must_run "$n" "${name}_u" "$@" train.steps=4 train.out_dir="$work/${name}_u"
    hs_must_run "$n" "${name}_s" "$@" train.steps=2 train.out_dir="$work/${name}_s" \
        checkpoint.dir="$work/${name}_ck"
    [ -f "$work/${name}_ck/step-2/metadata.json" ] \
        || { fail "$name: no step-2 saved: $(grep -m1 "cannot" "$work/${name}_s.log")"; return; }
    hs_must_run "$n" "${name}_r" "$@" train.steps=4 train.out_dir="$work/${name}_s" \
        checkpoint.dir="$work/${name}_ck" checkpoint.resume="$work/${name}_ck/step-2"
    grep -q "resumed from $work/${name}_ck/step-2: step 2 of 4" "$work/${name}_r.log" \
        || fail "$name: no 'resumed from' line: $(tail -3 "$work/${name}_r.log")"
    same_curve "$work/${name}_u/metrics.jsonl" "$work/${name}_s/metrics.jsonl" 1 4
    cmp -s "$work/${name}_u/model.safetensors" "$work/${name}_s/model.safetensors" \
        || fail "$name: final weights of the resumed run differ from the uninterrupted run's"
    [ -f "$work/${name}_ck/step-4/metadata.json" ] || fail "$name: the resumed run saved no step-4"
}

test_one_process_guarded_save_and_resume_match_uninterrupted() {
    stop_and_resume one 1
}

test_fsdp2_guarded_save_and_resume_match_uninterrupted() {
    stop_and_resume fsdp 2 "${fsdp2[@]}"
}

test_bf16_with_fp32_main_params_guarded_resume_matches_and_files_equal_unguarded() {
    stop_and_resume mixed 2 "${fsdp2[@]}" "${mixed[@]}"
    HS_DEVICE_GUARD=0 hs_must_run 2 plain "${fsdp2[@]}" "${mixed[@]}" train.steps=2 \
        train.out_dir="$work/plain" checkpoint.dir="$work/plain_ck"
    local r
    for r in 0 1; do
        cmp -s "$work/plain_ck/step-2/rank-$r.bin" "$work/mixed_ck/step-2/rank-$r.bin" \
            || fail "rank-$r.bin of the guarded save differs from the unguarded one's"
    done
}

test_offloaded_shards_guarded_resume_matches_uninterrupted() {
    stop_and_resume offload 2 "${fsdp2[@]}" fsdp_config.enable_offload=true
}

test_one_process_guarded_save_and_resume_match_uninterrupted
test_fsdp2_guarded_save_and_resume_match_uninterrupted
test_bf16_with_fp32_main_params_guarded_resume_matches_and_files_equal_unguarded
test_offloaded_shards_guarded_resume_matches_uninterrupted
hs_finish
