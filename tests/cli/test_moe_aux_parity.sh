#!/usr/bin/env bash
# The MoE load-balancing loss over the global micro-batch (docs/moe.md):
# with aux_loss_coef 0.01 (not 0), FSDP 2, HSDP 2x2, TP 2 x FSDP 2 and CP 2
# match the one-process run whose micro-batch holds the same sequences (dp x
# micro_batch_size; CP ranks share their sequences): loss and grad norm of
# every step, step-1 gradients, weights after steps 1-3, logits and the
# export, within 5e-5 relative (fp32).
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch moe_aux
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8
      model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
      model.moe.aux_loss_coef=0.01)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 5e-5 "${files[@]}"; }
hs_train_dump one2 1 train.micro_batch_size=2
hs_train_dump one4 1 train.micro_batch_size=4
hs_train_dump one8 1 train.micro_batch_size=8
hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2
compare one4 fsdp2
hs_train_dump hsdp 4 fsdp_config.dp_shard_size=2
compare one8 hsdp
hs_train_dump tp2_fsdp2 4 accelerator.tp_size=2 fsdp_config.dp_shard_size=2
compare one4 tp2_fsdp2
hs_train_dump cp2 2 accelerator.cp_size=2 accelerator.cp_rotate_method=ring
compare one2 cp2
# the aux term is really there: the same run without it differs
hs_train_dump fsdp2_noaux 2 fsdp_config.dp_shard_size=2 model.moe.aux_loss_coef=0
if hs_compare_runs fsdp2 fsdp2_noaux 1e-5 dump/grads-step1.safetensors > /dev/null 2>&1; then
    die "aux_loss_coef 0.01 left the gradients unchanged"
fi
echo ok
