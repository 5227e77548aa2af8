#!/usr/bin/env bash
# The path a GPU's collectives take without NCCL, on the cpu device: under
# HS_DEVICE_GUARD=staged device memory is closed to the host (the guard) and
# not host visible, so every collective copies its buffers into pinned host
# staging, runs there and copies back (src/comm/stage.c), as several ranks
# on one GPU do. Each layout gives the bits of the plain run: FSDP 2 with
# bf16 mixed precision (all-gather, reduce-scatter), FSDP 2 with offload,
# TP 2 x FSDP 2 with sequence and loss parallel (all-reduce, all-gather of
# rows, the vocab-parallel loss), CP 2 ring (send / recv), EP 2 (all-to-all-v)
# and interleaved PP 2 (the pipeline queues' sends and receives in flight).
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch device_staged
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=8)
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24)

# pair NAME RANKS ARGS...: the plain run and the staged one, the same bits.
pair() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "$name" "$n" "$@"
    HS_DEVICE_GUARD=staged hs_train_dump "${name}_staged" "$n" "$@"
    grep -q "collectives stage it through host memory" "$work/${name}_staged.txt" ||
        fail "$name: the staged run does not say its collectives are staged"
    hs_compare_runs "$name" "${name}_staged" 0 "${HS_DUMP_FILES[@]}" ||
        fail "$name: the staged run's bits differ"
}

pair fsdp2_bf16 2 fsdp_config.dp_shard_size=2 fsdp_config.mix_precision.param_dtype=bfloat16 \
    fsdp_config.mix_precision.reduce_dtype=float32
pair fsdp2_offload 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true
pair tp2_fsdp2 4 accelerator.tp_size=2 accelerator.sequence_parallel=true \
    accelerator.loss_parallel=true fsdp_config.dp_shard_size=2
pair cp2_ring 2 accelerator.cp_size=2 accelerator.cp_rotate_method=ring
pair ep2 2 "${moe[@]}" accelerator.ep_size=2 fsdp_config.dp_shard_size=2
pair pp2 2 model.n_layers=4 accelerator.pp_size=2 accelerator.pp_schedule=interleaved_1f1b \
    accelerator.pp_virtual_stages=2 train.micro_batch_size=1
hs_finish
