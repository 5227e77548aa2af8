#!/usr/bin/env bash
# `mpiexec -n W hypershard train` with prefetch and comm fusion trains
# bitwise like the run without them: metrics.jsonl (loss, grad norm) of
# every step, the step-1 gradients, the weights after steps 1 and 2 and the
# exported model are byte-identical. Covers prefetch 2, fusion with copy-in,
# fusion with zero-copy (null and true) over 2 ranks (uneven vocabulary
# shards) and HSDP 2x2 with fusion, prefetch and replicate_params, and the
# log line that says which path runs; fusion with bf16 compute and fp32 main
# params, with a bf16 reduce dtype, and with CPU offload; MoE over 4 ranks
# with checkpointing, fusion and prefetch 2.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch overlap
tiny=(model.dim=32 model.n_layers=3 model.n_heads=4 model.n_kv_heads=1 model.ffn_dim=40
      model.vocab_size=259 train.seq_len=16 train.micro_batch_size=2 train.steps=3
      train.eval_every=0 train.global_batch_size=8 optimizer.schedule.warmup_steps=0)

same() { # reference run: byte-identical results
    local ref=$work/$1 run=$work/$2
    python3 - "$ref" "$run" <<'PY'
import json, sys
ref, run = sys.argv[1], sys.argv[2]
keys = ("loss", "grad_norm")
a = [json.loads(l) for l in open(ref + "/metrics.jsonl")]
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    for k in keys:
        assert x[k] == y[k], f"{run}: step {x['step']} {k} {y[k]!r} vs {x[k]!r}"
PY
    for f in model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors \
             dump/weights-step2.safetensors; do
        cmp -s "$ref/$f" "$run/$f" || { echo "$2: $f differs from $1"; exit 1; }
    done
    echo "$2: identical to $1"
}

none=(fsdp_config.forward_prefetch_depth=0 fsdp_config.backward_prefetch_depth=0)
hs_train_dump plain 2 fsdp_config.dp_shard_size=2 "${none[@]}"
grep -q "fsdp: prefetch depth forward 0, backward 0; comm_fusion off" "$work/plain.txt"
hs_train_dump prefetch 2 fsdp_config.dp_shard_size=2 fsdp_config.forward_prefetch_depth=2 \
    fsdp_config.backward_prefetch_depth=2
same plain prefetch
hs_train_dump copyin 2 fsdp_config.dp_shard_size=2 fsdp_config.comm_fusion=true \
    fsdp_config.comm_fusion_zero_copy=false "${none[@]}"
grep -q "comm_fusion on, copy-in" "$work/copyin.txt"
same plain copyin
hs_train_dump zerocopy 2 fsdp_config.dp_shard_size=2 fsdp_config.comm_fusion=true
grep -q "fsdp: prefetch depth forward 1, backward 1; comm_fusion on, zero-copy" "$work/zerocopy.txt"
same plain zerocopy
hs_train_dump zerocopy_true 2 fsdp_config.dp_shard_size=2 fsdp_config.comm_fusion=true \
    fsdp_config.comm_fusion_zero_copy=true "${none[@]}"
same plain zerocopy_true
rep='fsdp_config.replicate_params=[model.norm.weight,model.layers.0.mlp.up_proj.weight]'
hs_train_dump hsdp 4 fsdp_config.dp_shard_size=2 "$rep" "${none[@]}"
hs_train_dump hsdp_fused 4 fsdp_config.dp_shard_size=2 "$rep" fsdp_config.comm_fusion=true \
    fsdp_config.forward_prefetch_depth=2
same hsdp hsdp_fused
# Fusion under the precision and placement policies: bf16 compute with fp32
# main params (zero-copy over the bf16 model shards), bf16 reduce-scatter,
# and offload (copy-in from the host pool).
bf16=(fsdp_config.dp_shard_size=2 fsdp_config.mix_precision.param_dtype=bfloat16)
main=(optimizer.fp32_main_params=true fsdp_config.mix_precision.fp32_main_grad=true
      fsdp_config.mix_precision.reduce_dtype=float32)
hs_train_dump main_plain 2 "${bf16[@]}" "${main[@]}" "${none[@]}"
hs_train_dump main_fused 2 "${bf16[@]}" "${main[@]}" fsdp_config.comm_fusion=true
same main_plain main_fused
hs_train_dump rs16_plain 2 "${bf16[@]}" fsdp_config.mix_precision.reduce_dtype=bfloat16 "${none[@]}"
hs_train_dump rs16_fused 2 "${bf16[@]}" fsdp_config.mix_precision.reduce_dtype=bfloat16 \
    fsdp_config.comm_fusion=true "${none[@]}"
same rs16_plain rs16_fused
hs_train_dump offload_fused 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true \
    fsdp_config.comm_fusion=true fsdp_config.backward_prefetch_depth=2
grep -q "comm_fusion on, copy-in" "$work/offload_fused.txt"
hs_train_dump offload_plain 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true \
    "${none[@]}"
same offload_plain offload_fused
# MoE over 4 ranks: nested expert units in the prefetch order, expert
# tensors of 3 rows (zero-row shards inside a fused unit), recompute.
moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     train.activation_checkpointing=true fsdp_config.dp_shard_size=4)
hs_train_dump moe_plain 4 "${moe[@]}" "${none[@]}"
hs_train_dump moe_fused 4 "${moe[@]}" fsdp_config.comm_fusion=true \
    fsdp_config.forward_prefetch_depth=2 \
    fsdp_config.backward_prefetch_depth=2
same moe_plain moe_fused
