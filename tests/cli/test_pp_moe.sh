#!/usr/bin/env bash
# Pipeline parallelism with a Mixtral-style MoE (4 experts, top 2, shared
# expert, aux_loss_coef 0.01) against one process on the same global
# batch, fp32, within 1e-5 (loss and grad norm of every step, step-1
# gradients, weights after steps 1-2, logits, the export). The load-balancing
# term pools the router statistics of every layer of a micro-batch: they
# travel forward with the activations and the routers' aux gradient comes
# back with the gradients, so the aux loss and the per-expert row counts in
# metrics.jsonl equal the one-process run's. The statistics are those of a
# global micro-batch (micro_batch_size x dp sequences), so each layout is
# compared with the one process whose micro-batch is that size. Layouts:
# PP 2 with 1f1b, gpipe and interleaved 1F1B (2 virtual stages: the
# statistics go round the ring of chunks); PP 4 (8 micro-batches); PP 2 x
# FSDP 2; PP 2 x EP 2 (the experts over each stage's EP group), also
# interleaved; PP 2 x TP 2 with sequence parallel; PP 2 x EP 2 x TP 2
# (W = 8).
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 240
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch pp_moe
tiny=("${HS_FSDP_TINY[@]}" model.n_layers=4 model.n_kv_heads=2 optimizer.eps=1e-3
      train.global_batch_size=8 model.arch=moe model.moe.num_experts=4 model.moe.top_k=2
      model.moe.expert_ffn_dim=24 model.moe.aux_loss_coef=0.01 model.moe.shared_expert_ffn_dim=16)
files=("${HS_DUMP_FILES[@]}")
compare() { hs_compare_moe_runs "$1" "$2" 1e-5; }
pp2=(accelerator.pp_size=2)

hs_train_dump one 1
hs_train_dump one1 1 train.micro_batch_size=1
hs_train_dump one4 1 train.micro_batch_size=4
hs_train_dump pp2 2 "${pp2[@]}"
compare one pp2
hs_train_dump pp2_gpipe 2 "${pp2[@]}" accelerator.pp_schedule=gpipe
compare one pp2_gpipe
il=(accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2)
hs_train_dump il2 2 "${pp2[@]}" "${il[@]}"
compare one il2
hs_train_dump pp4 4 accelerator.pp_size=4 train.micro_batch_size=1
compare one1 pp4
hs_train_dump pp2_fsdp2 4 "${pp2[@]}" fsdp_config.dp_shard_size=2
compare one4 pp2_fsdp2
hs_train_dump pp2_ep2 4 "${pp2[@]}" accelerator.ep_size=2 fsdp_config.dp_shard_size=2 \
    fsdp_config.edp_shard_size=1
compare one4 pp2_ep2
hs_train_dump il2_ep2 4 "${pp2[@]}" "${il[@]}" accelerator.ep_size=2 fsdp_config.dp_shard_size=2 \
    fsdp_config.edp_shard_size=1
compare one4 il2_ep2
hs_train_dump pp2_tp2_sp 4 "${pp2[@]}" accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one pp2_tp2_sp
hs_train_dump pp2_ep2_tp2 8 "${pp2[@]}" accelerator.ep_size=2 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true fsdp_config.dp_shard_size=2
compare one4 pp2_ep2_tp2
hs_finish
