#!/usr/bin/env bash
# `accelerator.device: reference` trains: the model and the optimizer run
# on the reference kernels (plain C, fp64, one thread) and match the cpu
# device on the same config within 1e-5 (fp32) — loss and grad norm of
# every step, step-1 gradients, weights after steps 1 and 2, the logits and
# the export — in one process, FSDP 2, TP 2 x FSDP 2, PP 2, EP 2 (MoE) and
# CP 2; and each reference run differs from its cpu run somewhere, so the
# reference kernels did run.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch reference_device
# Adam's eps is 1e-4 here, not HS_FSDP_TINY's 1e-6. Its first update,
# lr g / (|g| + eps) per element, turns a gradient difference dg into a
# weight difference of up to lr dg / (4 eps) (at |g| = eps); against the
# tensors' largest values that is lr max|g| / (4 eps max|w|) times the
# gradients' relative difference: with lr 3e-3, max|g| ~ 0.07 and max|w|
# ~ 0.06 in o_proj, 875x at eps 1e-6 and 8.75x at 1e-4. The cpu device
# sums its fp32 GEMMs in another order than the reference's fp64 ones, by
# about 1e-8 of max|g| (2e-9 absolute in o_proj); at the AVX2 tier one
# element of layer 1's o_proj with |g| = 4.3e-7 < eps turned that into
# 1.4e-5 of its weights, over 1e-5, with every gradient within 2.5e-6. At
# eps 1e-4 the weights stay within 8.75 x the gradients' difference, so
# one tolerance, 1e-5, holds for gradients, weights and logits on every
# tier, and the gradients are still checked at it directly.
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=8 optimizer.eps=1e-4)
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)

# pair NAME RANKS ARGS...: the run on cpu and on reference agree within 1e-5
# and are not the same bits.
pair() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "${name}_cpu" "$n" "$@"
    hs_train_dump "${name}_ref" "$n" "$@" accelerator.device=reference
    hs_compare_runs "${name}_cpu" "${name}_ref" 1e-5 "${files[@]}" ||
        fail "$name: reference and cpu differ"
    if hs_compare_runs "${name}_cpu" "${name}_ref" 0 "${files[@]}" > /dev/null 2>&1; then
        fail "$name: the reference run has the cpu run's bits: its kernels did not run"
    fi
}

pair one 1
pair fsdp2 2 fsdp_config.dp_shard_size=2
pair tp2_fsdp2 4 accelerator.tp_size=2 fsdp_config.dp_shard_size=2
pair pp2 2 accelerator.pp_size=2
pair ep2 2 "${moe[@]}" accelerator.ep_size=2 fsdp_config.dp_shard_size=2
pair cp2 2 accelerator.cp_size=2
hs_finish
