#!/usr/bin/env bash
# `mpiexec -n W hypershard train` under FSDP / HSDP matches the one-process
# run on the same global batch: loss and grad norm of every step, every
# gradient of step 1, every weight after steps 1, 2 and 3 and the logits,
# within 1e-5 relative to each tensor's largest value (fp32). Covers pure FSDP over 2 and 3
# ranks (uneven shards at W=3), HSDP 2x2 with replicate_params, an MoE model
# over 2 ranks, and the log lines that say whether FSDP was wrapped or skipped.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch fsdp
tiny=("${HS_FSDP_TINY[@]}")

# the exported model, the step-1 gradient (before clipping), the weights after
# steps 1 and 2 (from --dump), and the logits step 2 starts from
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }

hs_train_dump one8 1 train.global_batch_size=8
grep -q "fsdp: skipped: world size 1" "$work/one8.txt"
hs_train_dump fsdp2 2 train.global_batch_size=8 fsdp_config.dp_shard_size=2
grep -q "fsdp: wrapped 2 transformer blocks and the root" "$work/fsdp2.txt"
grep -q "shard degree 2, replicate degree 1" "$work/fsdp2.txt"
compare one8 fsdp2
hs_train_dump hsdp 4 train.global_batch_size=8 fsdp_config.dp_shard_size=2 \
    'fsdp_config.replicate_params=[model.norm.weight,model.layers.0.mlp.up_proj.weight]'
grep -q "shard degree 2, replicate degree 2; 2 replicate_params" "$work/hsdp.txt"
compare one8 hsdp
hs_train_dump one12 1 train.global_batch_size=12
hs_train_dump fsdp3 3 train.global_batch_size=12 fsdp_config.dp_shard_size=3
compare one12 fsdp3
# MoE: routed experts as nested units. The load-balancing term is computed
# per data-parallel rank over its own tokens, so parity holds without it.
moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0 train.global_batch_size=8)
hs_train_dump moe1 1 "${moe[@]}"
hs_train_dump moe2 2 "${moe[@]}" fsdp_config.dp_shard_size=2
grep -q "fsdp: wrapped 2 transformer blocks + 2 expert units and the root" "$work/moe2.txt"
compare moe1 moe2
