#!/usr/bin/env bash
# Tensor parallelism composed with FSDP/HSDP through `hypershard train`
# matches the one-process run on the same global batch: loss and grad norm
# of every step, every gradient of step 1, every weight after steps 1, 2
# and 3, the logits step 2 starts from and the exported model, within 1e-5
# relative to each tensor's largest value (fp32). Layouts: TP 2 alone; TP 2
# x FSDP 2; TP 2 x HSDP 2x2; TP 2 x FSDP 2 with sequence_parallel and
# loss_parallel; loss_parallel alone; sequence parallel with no-sync
# accumulation, activation checkpointing, comm fusion and CPU offload; tied
# embeddings; TP + replicate_params; TP-local dims
# that FSDP shards unevenly (ffn 170 -> 85 rows per TP rank over 2 FSDP
# ranks) and with zero-length shards (ffn 10 -> 5 rows over 4 FSDP ranks:
# 2/2/1/0); Muon orthogonalising each TP-split matrix whole (column- and
# row-parallel, over uneven FSDP shards); an MoE model (the MoE layer
# replicated over TP); bf16
# param_dtype within the 1e-3 the FSDP policy tests use; and a tp_size that
# does not divide the model stops train with exit 2 before writing.
#
# Adam divides each gradient element by |g| + eps; TP sums the row-parallel
# GEMMs in another order, so gradients differ from one process at ~5e-7,
# and near |g| ~ eps that is amplified in the update. optimizer.eps=1e-3
# keeps the update a smooth function of the gradient for this tiny model,
# so weights compare at the gradients' tolerance.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tp
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }
tp2=(accelerator.tp_size=2)

hs_train_dump one 1
hs_train_dump tp2 2 "${tp2[@]}"
grep -q "engine fsdp+tp on 2 rank(s)" "$work/tp2.txt"
compare one tp2
hs_train_dump tp2_lp 2 "${tp2[@]}" accelerator.loss_parallel=true
compare one tp2_lp
hs_train_dump tp2_fsdp2 4 "${tp2[@]}" fsdp_config.dp_shard_size=2
grep -q "shard degree 2, replicate degree 1" "$work/tp2_fsdp2.txt"
compare one tp2_fsdp2
hs_train_dump tp2_hsdp 8 "${tp2[@]}" fsdp_config.dp_shard_size=2
grep -q "shard degree 2, replicate degree 2" "$work/tp2_hsdp.txt"
compare one tp2_hsdp
hs_train_dump tp2_sp 4 "${tp2[@]}" fsdp_config.dp_shard_size=2 \
    accelerator.sequence_parallel=true accelerator.loss_parallel=true
compare one tp2_sp
# sequence parallel with the FSDP policies: no-sync accumulation over the 2
# micro-batches, activation checkpointing (the recompute re-runs the TP
# regions), communication fusion, CPU offload
sp=("${tp2[@]}" fsdp_config.dp_shard_size=2 accelerator.sequence_parallel=true)
hs_train_dump tp2_sp_nosync 4 "${sp[@]}" fsdp_config.requires_grad_sync=false
compare one tp2_sp_nosync
hs_train_dump tp2_sp_ckpt 4 "${sp[@]}" train.activation_checkpointing=true
compare one tp2_sp_ckpt
hs_train_dump tp2_sp_fused 4 "${sp[@]}" fsdp_config.comm_fusion=true
compare one tp2_sp_fused
hs_train_dump tp2_sp_offload 4 "${sp[@]}" fsdp_config.enable_offload=true
compare one tp2_sp_offload
# tied embedding and lm_head: one vocab-parallel tensor
hs_train_dump tied1 1 model.tie_embeddings=true
hs_train_dump tp2_tied 4 "${tp2[@]}" fsdp_config.dp_shard_size=2 model.tie_embeddings=true \
    accelerator.loss_parallel=true
compare tied1 tp2_tied
# a TP-Replicate norm and a TP-sharded matrix as replicate_params
rp='fsdp_config.replicate_params=[model.norm.weight,model.layers.0.mlp.up_proj.weight]'
hs_train_dump tp2_rp 4 "${tp2[@]}" fsdp_config.dp_shard_size=2 "$rp"
grep -q "2 replicate_params" "$work/tp2_rp.txt"
compare one tp2_rp

hs_train_dump one170 1 model.ffn_dim=170
hs_train_dump tp2_fsdp2_uneven 4 "${tp2[@]}" fsdp_config.dp_shard_size=2 model.ffn_dim=170
compare one170 tp2_fsdp2_uneven
hs_train_dump one10 1 model.ffn_dim=10
hs_train_dump tp2_fsdp4_zero 8 "${tp2[@]}" fsdp_config.dp_shard_size=4 model.ffn_dim=10
grep -q "shard degree 4, replicate degree 1" "$work/tp2_fsdp4_zero.txt"
compare one10 tp2_fsdp4_zero

hs_train_dump muon170 1 model.ffn_dim=170 optimizer._target_=muon
hs_train_dump muon_tp2_fsdp2 4 "${tp2[@]}" fsdp_config.dp_shard_size=2 model.ffn_dim=170 \
    optimizer._target_=muon
compare muon170 muon_tp2_fsdp2

moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0)
hs_train_dump moe1 1 "${moe[@]}"
hs_train_dump moe_tp2 4 "${moe[@]}" "${tp2[@]}" fsdp_config.dp_shard_size=2
compare moe1 moe_tp2

bf16=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)
hs_train bf1 1 "${bf16[@]}"
hs_train bf_tp2 4 "${bf16[@]}" "${tp2[@]}" fsdp_config.dp_shard_size=2
hs_compare_runs bf1 bf_tp2 1e-3

# bad input: a tp_size that does not divide the kv heads or the vocabulary
# stops `train` on every rank with exit 2 before anything is written
rc=0
"$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" "${tp2[@]}" model.n_kv_heads=1 model.vocab_size=255 \
    train.out_dir="$work/bad" > "$work/bad.txt" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$work/bad.txt"; die "a bad tp_size exited $rc, not 2"; }
grep -q "model.n_kv_heads = 1 is not divisible by accelerator.tp_size = 2" "$work/bad.txt" ||
    die "no kv-heads error: $(cat "$work/bad.txt")"
grep -q "model.vocab_size = 255 is not divisible by accelerator.tp_size = 2" "$work/bad.txt" ||
    die "no vocabulary error: $(cat "$work/bad.txt")"
[ ! -e "$work/bad" ] || die "a refused run left $work/bad behind"
echo ok
