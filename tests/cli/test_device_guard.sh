#!/usr/bin/env bash
# Nothing above the device reads or writes device memory on the host, in
# any layout: under HS_DEVICE_GUARD=1 (src/device/guard.c) device memory is
# closed to the host outside the device's own calls and every kernel's
# device arguments are checked, so one host access aborts the run. Each
# layout trains (with the per-step dumps, the logits of an evaluation and
# the export) under the guard and gives the same bits as without it: one
# process, FSDP 2 with bf16 mixed precision (fp32 accumulation across
# no-sync micro-batches; bf16 reduction; fp32 main parameters and
# gradients), FSDP 2 with CPU offload, TP 2
# (sequence parallel, loss parallel) x FSDP 2, CP 2 with ring attention,
# EP 2 (MoE), PP 2 (interleaved 1F1B); then `generate` on the first run's
# weights under the guard prints what it prints without.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 400
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch device_guard
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=8)
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.shared_expert_ffn_dim=16)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)

guarded() {
    export HS_DEVICE_GUARD=1
    "$@"
    unset HS_DEVICE_GUARD
}

# pair NAME RANKS ARGS...: the run without and with the guard, the same bits.
pair() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "$name" "$n" "$@"
    guarded hs_train_dump "${name}_guarded" "$n" "$@"
    grep -q "device guard: the cpu device's memory is closed" "$work/${name}_guarded.txt" ||
        fail "$name: the guarded run does not say the guard is on"
    hs_compare_runs "$name" "${name}_guarded" 0 "${files[@]}" ||
        fail "$name: the guarded run's bits differ"
    cmp -s <(grep -o '"loss":[^,]*' "$work/$name/metrics.jsonl") \
        <(grep -o '"loss":[^,]*' "$work/${name}_guarded/metrics.jsonl") ||
        fail "$name: the guarded run's losses differ"
}

pair one 1
pair fsdp2_bf16 2 fsdp_config.dp_shard_size=2 fsdp_config.mix_precision.param_dtype=bfloat16 \
    fsdp_config.mix_precision.reduce_dtype=float32 fsdp_config.requires_grad_sync=false
pair fsdp2_bf16_reduce 2 fsdp_config.dp_shard_size=2 \
    fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=bfloat16
pair fsdp2_bf16_main 2 fsdp_config.dp_shard_size=2 fsdp_config.mix_precision.param_dtype=bfloat16 \
    fsdp_config.mix_precision.reduce_dtype=float32 optimizer.fp32_main_params=true \
    fsdp_config.mix_precision.fp32_main_grad=true
pair fsdp2_offload 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true
pair tp2_fsdp2 4 accelerator.tp_size=2 accelerator.sequence_parallel=true \
    accelerator.loss_parallel=true fsdp_config.dp_shard_size=2
pair cp2_ring 2 accelerator.cp_size=2 accelerator.cp_rotate_method=ring
pair ep2 2 "${moe[@]}" accelerator.ep_size=2 fsdp_config.dp_shard_size=2
pair pp2 2 model.n_layers=4 accelerator.pp_size=2 accelerator.pp_schedule=interleaved_1f1b \
    accelerator.pp_virtual_stages=2 train.micro_batch_size=1

"$HS_BIN" generate --run "$work/one" --prompt "ab" --max-new-tokens 8 > "$work/gen.txt" \
    2> "$work/gen.err" || fail "generate failed: $(cat "$work/gen.err")"
guarded "$HS_BIN" generate --run "$work/one" --prompt "ab" --max-new-tokens 8 \
    > "$work/gen_guarded.txt" 2> "$work/gen_guarded.err" ||
    fail "generate under the guard failed: $(cat "$work/gen_guarded.err")"
grep -q "device guard: the cpu device" "$work/gen_guarded.err" || fail "generate: the guard is not on"
cmp -s "$work/gen.txt" "$work/gen_guarded.txt" || fail "generate prints otherwise under the guard"
hs_finish
