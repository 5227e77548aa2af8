#!/usr/bin/env bash
# Checkpoints across tensor-parallel sizes (docs/checkpoint.md): a checkpoint
# saved at TP 2 x FSDP 2 stores each rank's box of the global tensors (TP
# Shard(0) then FSDP rows: the strided layout; row-parallel weights split on
# dim 1), every TP-replicated chunk once, and tiles every tensor; it
# resumes at TP 1 x FSDP 4, at TP 2 x FSDP 1 and on one process, each
# continuing the uninterrupted TP 2 x FSDP 2 loss curve within 1e-5; loaded
# by one process and saved again, it gives the same global tensors bit for
# bit. `ckpt inspect` shows the column-split chunks.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tp_resume
tiny=("${HS_TINY[@]}" model.n_heads=4 model.n_kv_heads=2 train.global_batch_size=8
      train.micro_batch_size=1 train.eval_every=0 optimizer.schedule.decay=constant
      optimizer.schedule.warmup_steps=2)
tp2=(accelerator.tp_size=2 fsdp_config.dp_shard_size=2)

hs_must_run 4 uninterrupted "${tp2[@]}" train.steps=5 train.out_dir="$work/u"
hs_must_run 4 stopped "${tp2[@]}" train.steps=2 train.out_dir="$work/s" checkpoint.dir="$work/ck"
"$HS_BIN" ckpt verify "$work/ck" > "$work/verify.log" 2>&1 || fail "TP checkpoint does not verify"
"$HS_BIN" ckpt inspect "$work/ck" > "$work/inspect.log" 2>&1 || fail "ckpt inspect failed"
# ranks are (dp, tp) with tp fastest: rank 2 is TP rank 0, FSDP rank 1, so
# it holds embedding rows 64:128 of TP rank 0's 0:128 (the strided shard);
# o_proj [32, 32] is row-parallel: rank 1 (TP 1, FSDP 0) holds rows 0:16
# of columns 16:32
hs_chunk_in "$work/inspect.log" model.embed_tokens.weight "64:128, 0:32" rank-2.bin
hs_chunk_in "$work/inspect.log" model.layers.0.self_attn.o_proj.weight "0:16, 16:32" rank-1.bin
hs_resume_layouts "$work/ck/step-2" "$work/u" \
    "4 tp1_fsdp4 accelerator.tp_size=1 fsdp_config.dp_shard_size=4" \
    "2 tp2_fsdp1 accelerator.tp_size=2 fsdp_config.dp_shard_size=1" \
    "1 one accelerator.tp_size=1"
# load at step 2 on one process, train nothing, save: the same tensors
hs_must_run 1 reload train.steps=2 train.out_dir="$work/re" checkpoint.dir="$work/re_ck" \
    checkpoint.resume="$work/ck/step-2"
same_global "$work/ck/step-2" "$work/re_ck/step-2"
hs_finish
