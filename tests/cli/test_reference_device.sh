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
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch reference_device
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=8)
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
