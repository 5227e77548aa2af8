#!/usr/bin/env bash
# Checkpoints across pipeline sizes (docs/checkpoint.md): parameters are
# addressed by FQN and global offsets, not by stage, so a checkpoint saved
# at PP 2 (each stage writing its own blocks) verifies, holds every
# tensor, and resumes at PP 1, PP 4, PP 2 x FSDP 2 and interleaved PP 2 x 2
# virtual stages, each continuing the
# uninterrupted PP 2 loss curve within 1e-5; one saved by one process
# resumes at PP 2 the same way.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch pp_resume
tiny=("${HS_TINY[@]}" model.n_layers=4 train.global_batch_size=8 train.micro_batch_size=2
      train.eval_every=0 optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
pp2=(accelerator.pp_size=2)

hs_must_run 2 uninterrupted "${pp2[@]}" train.steps=5 train.out_dir="$work/u"
hs_must_run 2 stopped "${pp2[@]}" train.steps=2 train.out_dir="$work/s" checkpoint.dir="$work/ck"
"$HS_BIN" ckpt verify "$work/ck" > "$work/verify.log" 2>&1 || fail "PP checkpoint does not verify"
"$HS_BIN" ckpt inspect "$work/ck" > "$work/inspect.log" 2>&1 || fail "ckpt inspect failed"
# stage 0 (rank 0) wrote the embedding and blocks 0-1, stage 1 (rank 1) the rest
hs_chunk_in "$work/inspect.log" model.embed_tokens.weight "0:256, 0:32" rank-0.bin
hs_chunk_in "$work/inspect.log" model.layers.1.mlp.down_proj.weight "0:32, 0:64" rank-0.bin
hs_chunk_in "$work/inspect.log" model.layers.2.mlp.down_proj.weight "0:32, 0:64" rank-1.bin
hs_chunk_in "$work/inspect.log" lm_head.weight "0:256, 0:32" rank-1.bin
hs_resume_layouts "$work/ck/step-2" "$work/u" \
    "1 pp1 accelerator.pp_size=1" \
    "4 pp4 accelerator.pp_size=4" \
    "4 pp2_fsdp2 accelerator.pp_size=2 fsdp_config.dp_shard_size=2" \
    "2 il2 accelerator.pp_size=2 accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2"
# saved by one process, resumed at PP 2
hs_must_run 1 one_u train.steps=5 train.out_dir="$work/one_u"
hs_must_run 1 one_s train.steps=2 train.out_dir="$work/one_s" checkpoint.dir="$work/one_ck"
hs_resume_layouts "$work/one_ck/step-2" "$work/one_u" "2 from_one accelerator.pp_size=2"
hs_finish
