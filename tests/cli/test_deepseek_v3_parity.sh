#!/usr/bin/env bash
# DeepSeek-V3 (model.arch: deepseek_v3, docs/model.md): multi-head latent
# attention (q_lora_rank 16, kv_lora_rank 16, 8 + 8 query / key dims, value
# heads of 12, YaRN with mscale_all_dim so the softmax scale is folded into
# q) before a dense first block (first_k_dense_replace 1) and DeepSeekMoE
# blocks (8 experts in 4 groups, 2 kept, top 2, a shared expert, sigmoid
# scores, bias_update_speed 0.01, seq_aux_loss_coef 0.01). Every layout
# matches the one-process run on the same global batch within 5e-5
# relative (fp32; each layout sums the same products in another order,
# about 1e-7 here): FSDP 2 (with full and with selective activation
# checkpointing), EP 2, CP 2 (all-gather, ring, all-to-all), CP 4 (all-to-all
# in pairs, then the ring), TP 2 (and with sequence parallel and loss
# parallel), PP 2 (1F1B, and ZB-V on 4 blocks), and on 4 ranks HSDP 2 x 2,
# EP 2 x EDP shard 2, EP 2 x PP 2, and with TP 2 + SP: PP 2 x TP 2, CP 2 x
# TP 2, TP 2 x FSDP 2 and EP 2 x TP 2, for 3 steps: loss and grad norm of every step, step 1's
# gradients, the weights after steps 1 and 2, the logits, the export, the
# sequence-wise term and the expert loads of every step. A checkpoint of
# FSDP 2 at step 2 resumes on one process to one process's 4-step curve.
# Under train.reproducibility: layout, FSDP 2 and PP 2 x FSDP 2 write one
# process's weights bit for bit.
# The latent KV cache (kv_lora_rank + qk_rope_head_dim values a position and
# block) gives the full forward's greedy text. Settings latent
# attention does not take exit 2 naming the key.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch deepseek_v3
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=4 optimizer.eps=1e-3 train.global_batch_size=8
      model.arch=deepseek_v3 model.n_layers=3 model.mla.q_lora_rank=16
      model.mla.kv_lora_rank=16 model.mla.qk_nope_head_dim=8 model.mla.qk_rope_head_dim=8
      model.mla.v_head_dim=12 model.rope_scaling.type=yarn model.rope_scaling.factor=4
      model.rope_scaling.original_max_position_embeddings=4 model.rope_scaling.mscale=1
      model.rope_scaling.mscale_all_dim=1
      model.moe.first_k_dense_replace=1 model.moe.num_experts=8 model.moe.top_k=2
      model.moe.expert_ffn_dim=24 model.moe.shared_expert_ffn_dim=24
      model.moe.score_func=sigmoid model.moe.n_group=4 model.moe.topk_group=2
      model.moe.routed_scaling_factor=2.5 model.moe.aux_loss_coef=0
      model.moe.bias_update_speed=0.01 model.moe.seq_aux_loss_coef=0.01)
compare() { hs_compare_moe_runs "$1" "$2" 5e-5; }

hs_train_dump one2 1
hs_train_dump one4 1 train.micro_batch_size=4
hs_train_dump one8 1 train.micro_batch_size=8
hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2
compare one4 fsdp2
hs_train_dump fsdp2ac 2 fsdp_config.dp_shard_size=2 train.activation_checkpointing=true
compare one4 fsdp2ac
hs_train_dump fsdp2sel 2 fsdp_config.dp_shard_size=2 train.activation_checkpointing=selective
compare one4 fsdp2sel
hs_train_dump ep2 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2
for method in allgather ring alltoall; do
    hs_train_dump "cp2_$method" 2 accelerator.cp_size=2 accelerator.cp_rotate_method=$method
    compare one2 "cp2_$method"
done
hs_train_dump one1 1 train.micro_batch_size=1 train.global_batch_size=2
hs_train_dump cp4 4 accelerator.cp_size=4 accelerator.cp_rotate_method=alltoall_ring \
    accelerator.cp_a2a_size=2 train.micro_batch_size=1 train.global_batch_size=2
compare one1 cp4
# TP: heads split on q_b_proj and kv_b_proj, o_proj row-parallel, the
# down-projections and latent norms whole with their gradients summed
hs_train_dump tp2 2 accelerator.tp_size=2
compare one2 tp2
hs_train_dump tp2sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true \
    accelerator.loss_parallel=true
compare one2 tp2sp
hs_train_dump pp2 2 accelerator.pp_size=2
compare one2 pp2
hs_train_dump one2l4 1 model.n_layers=4
hs_train_dump pp2zbv 2 accelerator.pp_size=2 model.n_layers=4 accelerator.pp_virtual_stages=2 \
    accelerator.pp_schedule=zbv
compare one2l4 pp2zbv
hs_train_dump hsdp 4 fsdp_config.dp_shard_size=2
compare one8 hsdp
hs_train_dump ep2e2 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 fsdp_config.edp_shard_size=2
compare one8 ep2e2
hs_train_dump ep2pp2 4 accelerator.ep_size=2 accelerator.pp_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2pp2
sp=(accelerator.tp_size=2 accelerator.sequence_parallel=true)
hs_train_dump pp2tp2 4 accelerator.pp_size=2 "${sp[@]}"
compare one2 pp2tp2
hs_train_dump cp2tp2 4 accelerator.cp_size=2 "${sp[@]}"
compare one2 cp2tp2
hs_train_dump tp2fsdp2 4 fsdp_config.dp_shard_size=2 "${sp[@]}"
compare one4 tp2fsdp2
hs_train_dump ep2tp2 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=2 "${sp[@]}"
compare one4 ep2tp2

# resume across layouts: FSDP 2's step-2 checkpoint on one process
flat=(optimizer.schedule.decay=constant)
hs_train one4_4 1 train.micro_batch_size=4 train.steps=4 "${flat[@]}"
hs_train fsdp2_2 2 fsdp_config.dp_shard_size=2 train.steps=2 checkpoint.dir="$work/ck" "${flat[@]}"
hs_train resumed 1 train.micro_batch_size=4 train.steps=4 checkpoint.resume="$work/ck/step-2" \
    checkpoint.dir="$work/ck1" "${flat[@]}"
close_curve "$work/one4_4/metrics.jsonl" "$work/resumed/metrics.jsonl" 3 4

# train.reproducibility: layout: FSDP 2 and PP 2 x FSDP 2 write one
# process's bits (5 steps, no EP: an expert's rows would come from ranks
# whose sequence indices it does not have)
lay=(train.reproducibility=layout train.steps=5 model.moe.seq_aux_loss_coef=0)
hs_train lay1 1 train.micro_batch_size=8 "${lay[@]}"
hs_train lay_fsdp2 2 fsdp_config.dp_shard_size=2 train.micro_batch_size=4 "${lay[@]}"
hs_train lay_pp2 4 accelerator.pp_size=2 fsdp_config.dp_shard_size=2 "${lay[@]}"
for run in lay_fsdp2 lay_pp2; do
    cmp -s "$work/lay1/model.safetensors" "$work/$run/model.safetensors" ||
        fail "layout mode: $run's weights differ from one process's"
done

# the latent KV cache against the full forward: its text, and its bytes,
# (kv_lora_rank + qk_rope_head_dim) x 4 a position and block plus one
# block's expanded keys and values (2 x 16 positions x 4 heads x 16)
gen() {
    "$HS_BIN" generate --run "$work/one4" --prompt "This bird" --max-new-tokens 24 "$@" \
        2> "$work/gen_err.txt"
}
cached=$(gen) || die "generate: $(tail -2 "$work/gen_err.txt")"
whole=$(gen --no-kv-cache) || die "generate --no-kv-cache: $(tail -2 "$work/gen_err.txt")"
[ "$cached" = "$whole" ] || die "the KV cache's text differs: '$cached' against '$whole'"
gen > /dev/null
grep -q "a KV cache of 12800 bytes (0.01 MiB) on each rank, for up to 16 positions (288 bytes a position)" \
    "$work/gen_err.txt" || die "the latent cache's size: $(grep 'KV cache' "$work/gen_err.txt")"

hs_expect_exit 2 softmax "model.moe.score_func = softmax with model.arch = deepseek_v3" \
    train "${tiny[@]}" model.moe.score_func=softmax
hs_expect_exit 2 vdim "model.mla.v_head_dim = 20 exceeds qk_nope_head_dim + qk_rope_head_dim = 16" \
    train "${tiny[@]}" model.mla.v_head_dim=20
hs_expect_exit 2 rope "model.mla.qk_rope_head_dim = 7 must be even" \
    train "${tiny[@]}" model.mla.qk_rope_head_dim=7
hs_expect_exit 2 kvh "model.n_kv_heads = 2 with model.arch = deepseek_v3" \
    train "${tiny[@]}" model.n_kv_heads=2
hs_expect_exit 2 shared "model.moe.shared_expert_ffn_dim = 20 with model.arch = deepseek_v3" \
    train "${tiny[@]}" model.moe.shared_expert_ffn_dim=20
hs_expect_exit 2 dense_k "model.moe.first_k_dense_replace = 1 with model.arch = moe" \
    train "${tiny[@]}" model.arch=moe
hs_finish
