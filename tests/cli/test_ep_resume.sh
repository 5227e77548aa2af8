#!/usr/bin/env bash
# Checkpoints across expert-parallel sizes (docs/checkpoint.md): a MoE
# checkpoint saved at EP 2 x EDP shard 2 (4 ranks) stores each rank's box
# of the global expert tensors (its EP rank's experts, then its EDP rows),
# tiles every tensor, and resumes at EP 4, at EP 2 with HSDP on the experts
# (EDP shard 1 x replicate 2), at EP 1 (FSDP 2) and on one process, each
# continuing the uninterrupted loss curve within 1e-5 (each with the same
# global micro-batch of 4 sequences: the aux loss is over it); loaded by one
# process and saved again it gives the same global tensors bit for bit.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ep_resume
tiny=("${HS_TINY[@]}" model.n_heads=4 model.n_kv_heads=2 train.global_batch_size=8
      train.micro_batch_size=1 train.eval_every=0 optimizer.schedule.decay=constant
      optimizer.schedule.warmup_steps=2 model.arch=moe model.moe.num_experts=4
      model.moe.top_k=2 model.moe.expert_ffn_dim=24 model.moe.aux_loss_coef=0.01)
ep2=(accelerator.ep_size=2 fsdp_config.dp_shard_size=4 fsdp_config.edp_shard_size=2)

hs_must_run 4 uninterrupted "${ep2[@]}" train.steps=5 train.out_dir="$work/u"
hs_must_run 4 stopped "${ep2[@]}" train.steps=2 train.out_dir="$work/s" checkpoint.dir="$work/ck"
"$HS_BIN" ckpt verify "$work/ck" > "$work/verify.log" 2>&1 || fail "EP checkpoint does not verify"
"$HS_BIN" ckpt inspect "$work/ck" > "$work/inspect.log" 2>&1 || fail "ckpt inspect failed"
# rank r is EP rank r % 2 (experts 2*(r%2) : 2*(r%2)+2) and EDP shard r / 2
# (one of those two experts)
w1=model.layers.0.block_sparse_moe.experts.w1.weight
hs_chunk_in "$work/inspect.log" "$w1" "0:1, 0:24, 0:32" rank-0.bin
hs_chunk_in "$work/inspect.log" "$w1" "2:3, 0:24, 0:32" rank-1.bin
hs_chunk_in "$work/inspect.log" "$w1" "1:2, 0:24, 0:32" rank-2.bin
hs_chunk_in "$work/inspect.log" "$w1" "3:4, 0:24, 0:32" rank-3.bin
hs_resume_layouts "$work/ck/step-2" "$work/u" \
    "4 ep4 accelerator.ep_size=4 fsdp_config.dp_shard_size=2" \
    "4 ep2_hsdp accelerator.ep_size=2 fsdp_config.dp_shard_size=2" \
    "2 ep1 fsdp_config.dp_shard_size=2 train.micro_batch_size=2" \
    "1 one train.micro_batch_size=4"
hs_must_run 1 reload train.steps=2 train.out_dir="$work/re" checkpoint.dir="$work/re_ck" \
    checkpoint.resume="$work/ck/step-2"
same_global "$work/ck/step-2" "$work/re_ck/step-2"
hs_finish
