#!/usr/bin/env bash
# train.reproducibility: layout makes every data-parallel layout of one
# global batch give one process's bits: 20 steps from the same init and
# data, every loss and gradient norm equal to the last of 17 digits and
# model.safetensors byte for byte, for one process (two threads, and four
# micro-batches on one thread), FSDP 2, FSDP 4 over two micro-batches,
# FSDP 8, HSDP 2 x 2 over two micro-batches and FSDP 2 with activation
# checkpointing, in fp32 and in bf16 compute with fp32 reduction; Qwen3
# (q/k norms) with tied embeddings at FSDP 4; pipelines (a 4-block model):
# PP 2 x FSDP 2 under 1F1B, PP 2 interleaved over 2 virtual stages, PP 4
# under GPipe, PP 2 x HSDP 2 x 2 on 8 ranks, and in bf16 PP 2 x FSDP 2 with
# selective activation checkpointing and PP 2 x FSDP 4 under GPipe on 8
# ranks; ZB-H1 at PP 2 x FSDP 2 with full checkpointing (fp32) and with
# selective checkpointing (bf16); ZB-V at PP 2 x FSDP 2 (fp32) and at PP 2
# with selective checkpointing (bf16); MoE (8 experts in groups, a shared
# expert, the correction bias and the sequence-wise loss) in one process
# over 4 micro-batches, at FSDP 2 (also with checkpointing), HSDP 2 x 2 and
# PP 2 x FSDP 2, and in bf16 at FSDP 4, its default mode's FSDP 2 the
# control. A run saved at FSDP 4 and resumed in one process and at
# HSDP 2 x 2, and one saved at PP 2 x FSDP 2 and resumed in one process,
# continue bit for bit. The negative control: the default mode's FSDP 4 is
# not bitwise one process's, so the comparison can fail; so are one
# process's runs with a sequence tree's leaves swapped or a weight
# gradient's product split over K (a test hook), and the comparison names
# the first loss or gradient norm that differs. What layout does not cover
# yet is refused (exit 2) by name.
# HS_MPI_RANKS: 8
# HS_TEST_TIERS: avx2
# HS_TEST_TIMEOUT: 400
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch layout
tiny=(model.dim=32 model.n_layers=2 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=64
      train.seq_len=32 train.global_batch_size=8 train.steps=20 train.eval_every=0
      optimizer.schedule.warmup_steps=0 train.reproducibility=layout)
bf16=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)

# run NAME RANKS ARGS...: one training run into $work/NAME.
run() {
    local name=$1 n=$2
    shift 2
    hs_run "$n" "$name" "$@" train.out_dir="$work/$name"
    [ "$rc" -eq 0 ] || fail "$name: exit $rc: $(tail -5 "$work/$name.log")"
}

# same REF RUN: every step's loss and grad_norm (all 17 digits) equal, and
# model.safetensors byte-identical; prints the first difference.
same() {
    python3 - "$work/$1" "$work/$2" <<'PY' || { fail "$2 differs from $1"; return; }
import json, sys
def rows(d):
    return {r["step"]: (repr(r["loss"]), repr(r["grad_norm"]))
            for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert a.keys() == b.keys() and len(a) > 0, (sorted(a), sorted(b))
for s in sorted(a):
    assert a[s] == b[s], f"step {s}: loss, grad_norm {a[s]} vs {b[s]}"
wa = open(sys.argv[1] + "/model.safetensors", "rb").read()
wb = open(sys.argv[2] + "/model.safetensors", "rb").read()
assert wa == wb, "model.safetensors differs"
PY
    echo "  $2 = $1: $(grep -c '"loss"' "$work/$2/metrics.jsonl") steps, losses, grad norms, weights"
}

run one 1 train.threads=2 train.micro_batch_size=8
run one_acc4 1 train.threads=1 train.micro_batch_size=2
run fsdp2 2 train.threads=1 train.micro_batch_size=4 fsdp_config.dp_shard_size=2
run fsdp4_acc2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=4
run fsdp8 8 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=8
run hsdp22_acc2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=2
run fsdp2_ac 2 train.threads=1 train.micro_batch_size=4 fsdp_config.dp_shard_size=2 \
    train.activation_checkpointing=true
for r in one_acc4 fsdp2 fsdp4_acc2 fsdp8 hsdp22_acc2 fsdp2_ac; do same one "$r"; done

run one_bf16 1 train.threads=2 train.micro_batch_size=8 "${bf16[@]}"
run fsdp4_bf16 4 train.threads=1 train.micro_batch_size=2 fsdp_config.dp_shard_size=4 "${bf16[@]}"
run hsdp22_bf16_acc2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=2 \
    "${bf16[@]}"
for r in fsdp4_bf16 hsdp22_bf16_acc2; do same one_bf16 "$r"; done

qwen=(model.arch=qwen3 model.tie_embeddings=true)
run qwen_one 1 train.threads=2 train.micro_batch_size=8 "${qwen[@]}"
run qwen_fsdp4_acc2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=4 \
    "${qwen[@]}"
same qwen_one qwen_fsdp4_acc2

deep=(model.n_layers=4)
run one4 1 train.threads=2 train.micro_batch_size=8 "${deep[@]}"
run pp2_fsdp2 4 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    fsdp_config.dp_shard_size=2 "${deep[@]}"
run pp2_interleaved 2 train.threads=1 train.micro_batch_size=2 accelerator.pp_size=2 \
    accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2 "${deep[@]}"
run pp4_gpipe 4 train.threads=1 train.micro_batch_size=2 accelerator.pp_size=4 \
    accelerator.pp_schedule=gpipe "${deep[@]}"
run pp2_hsdp22 8 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    fsdp_config.dp_shard_size=2 "${deep[@]}"
run zb1p_fsdp2_ac 4 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    accelerator.pp_schedule=zb1p fsdp_config.dp_shard_size=2 train.activation_checkpointing=true \
    "${deep[@]}"
zbv=(accelerator.pp_size=2 accelerator.pp_schedule=zbv accelerator.pp_virtual_stages=2)
run zbv_fsdp2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=2 "${zbv[@]}" \
    "${deep[@]}"
for r in pp2_fsdp2 pp2_interleaved pp4_gpipe pp2_hsdp22 zb1p_fsdp2_ac zbv_fsdp2; do
    same one4 "$r"
done
run one4_bf16 1 train.threads=2 train.micro_batch_size=8 "${deep[@]}" "${bf16[@]}"
run pp2_fsdp2_bf16_sel 4 train.threads=1 train.micro_batch_size=2 accelerator.pp_size=2 \
    fsdp_config.dp_shard_size=2 train.activation_checkpointing=selective "${deep[@]}" "${bf16[@]}"
run pp2_fsdp4_bf16_gpipe 8 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    accelerator.pp_schedule=gpipe fsdp_config.dp_shard_size=4 "${deep[@]}" "${bf16[@]}"
run zb1p_fsdp2_bf16_sel 4 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    accelerator.pp_schedule=zb1p fsdp_config.dp_shard_size=2 \
    train.activation_checkpointing=selective "${deep[@]}" "${bf16[@]}"
run zbv_bf16_sel 2 train.threads=1 train.micro_batch_size=2 "${zbv[@]}" \
    train.activation_checkpointing=selective "${deep[@]}" "${bf16[@]}"
for r in pp2_fsdp2_bf16_sel pp2_fsdp4_bf16_gpipe zb1p_fsdp2_bf16_sel zbv_bf16_sel; do
    same one4_bf16 "$r"
done

# Resume across layouts: a constant learning rate, so that a run of 6
# steps is the first 6 of a run of 12.
const=(optimizer.schedule.decay=constant)
run whole 1 train.threads=2 train.micro_batch_size=8 train.steps=12 "${const[@]}"
run part 4 train.threads=1 train.micro_batch_size=2 fsdp_config.dp_shard_size=4 train.steps=6 \
    "${const[@]}" checkpoint.dir="$work/ck" checkpoint.save_every=6
for to in "resumed_one 1 train.threads=2 train.micro_batch_size=4" \
          "resumed_hsdp 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=2"; do
    read -r name n args <<< "$to"
    # shellcheck disable=SC2086
    run "$name" "$n" $args train.steps=12 "${const[@]}" checkpoint.resume="$work/ck/step-6"
    same_curve "$work/whole/metrics.jsonl" "$work/$name/metrics.jsonl" 7 12
    cmp -s "$work/whole/model.safetensors" "$work/$name/model.safetensors" ||
        fail "$name: model.safetensors differs from the uninterrupted run's"
    echo "  $name: steps 7-12 and the weights equal the uninterrupted run's"
done

# ... and from a pipeline: saved at PP 2 x FSDP 2, resumed in one process.
run whole4 1 train.threads=2 train.micro_batch_size=8 train.steps=12 "${deep[@]}" "${const[@]}"
run part_pp 4 train.threads=1 train.micro_batch_size=1 accelerator.pp_size=2 \
    fsdp_config.dp_shard_size=2 train.steps=6 "${deep[@]}" "${const[@]}" \
    checkpoint.dir="$work/ck_pp" checkpoint.save_every=6
run resumed_from_pp 1 train.threads=2 train.micro_batch_size=8 train.steps=12 "${deep[@]}" \
    "${const[@]}" checkpoint.resume="$work/ck_pp/step-6"
same_curve "$work/whole4/metrics.jsonl" "$work/resumed_from_pp/metrics.jsonl" 7 12
cmp -s "$work/whole4/model.safetensors" "$work/resumed_from_pp/model.safetensors" ||
    fail "resumed_from_pp: model.safetensors differs from the uninterrupted run's"
echo "  resumed_from_pp: steps 7-12 and the weights equal the uninterrupted run's"

# The negative control: without the mode, FSDP 4 rounds its own way.
run default_fsdp4 4 train.threads=1 train.micro_batch_size=2 fsdp_config.dp_shard_size=4 \
    train.reproducibility=none
cmp -s "$work/one/model.safetensors" "$work/default_fsdp4/model.safetensors" &&
    fail "the default mode's FSDP 4 gave one process's bits: the check cannot tell"
echo "  default mode: FSDP 4's weights differ from one process's, as expected"

# Mutation checks: one deliberate break of the one order (HS_CANON_TEST_MUTATE,
# a test hook of model/canonical.c) in one process: parts 1 and 2 of every
# sequence tree swapped, or each weight-gradient part's product split over
# K. The comparison must fail, and says where first.
differs() {
    python3 - "$work/$1" "$work/$2" <<'PY' || fail "$2 gave $1's bits: the comparison cannot see it"
import json, sys
def rows(d):
    return {r["step"]: r for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
name = sys.argv[2].rsplit("/", 1)[1]
for s in sorted(a):
    for k in ("loss", "grad_norm"):
        if repr(a[s][k]) != repr(b[s][k]):
            print(f"  {name}: first differs at step {s}, {k}: {a[s][k]!r} vs {b[s][k]!r}")
            sys.exit(0)
sys.exit(open(sys.argv[1] + "/model.safetensors", "rb").read() ==
         open(sys.argv[2] + "/model.safetensors", "rb").read())
PY
}
# MoE (8 experts in 4 groups, top 2, a shared expert) balanced by the
# correction bias and the sequence-wise loss, without the per-micro-batch
# aux loss: each expert's weight gradient is a tree over its rows of each
# sequence, the router's and the shared expert's over the token rows
moe=(model.arch=moe model.moe.num_experts=8 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.shared_expert_ffn_dim=16 model.moe.score_func=sigmoid model.moe.n_group=4
     model.moe.topk_group=2 model.moe.aux_loss_coef=0 model.moe.bias_update_speed=0.01
     model.moe.seq_aux_loss_coef=0.01)
run moe_one 1 train.threads=2 train.micro_batch_size=8 "${moe[@]}"
run moe_acc4 1 train.threads=1 train.micro_batch_size=2 "${moe[@]}"
run moe_fsdp2 2 train.threads=1 train.micro_batch_size=4 fsdp_config.dp_shard_size=2 "${moe[@]}"
run moe_hsdp22_acc2 4 train.threads=1 train.micro_batch_size=1 fsdp_config.dp_shard_size=2 \
    "${moe[@]}"
run moe_fsdp2_ac 2 train.threads=1 train.micro_batch_size=4 fsdp_config.dp_shard_size=2 \
    train.activation_checkpointing=true "${moe[@]}"
for r in moe_acc4 moe_fsdp2 moe_hsdp22_acc2 moe_fsdp2_ac; do same moe_one "$r"; done
run moe_one_bf16 1 train.threads=2 train.micro_batch_size=8 "${moe[@]}" "${bf16[@]}"
run moe_fsdp4_bf16 4 train.threads=1 train.micro_batch_size=2 fsdp_config.dp_shard_size=4 \
    "${moe[@]}" "${bf16[@]}"
same moe_one_bf16 moe_fsdp4_bf16
run moe_one_l4 1 train.threads=2 train.micro_batch_size=8 model.n_layers=4 "${moe[@]}"
run moe_pp2_fsdp2 4 train.threads=1 train.micro_batch_size=2 model.n_layers=4 \
    accelerator.pp_size=2 fsdp_config.dp_shard_size=2 "${moe[@]}"
same moe_one_l4 moe_pp2_fsdp2
run moe_fsdp2_none 2 train.threads=1 train.micro_batch_size=4 fsdp_config.dp_shard_size=2 \
    "${moe[@]}" train.reproducibility=none
if cmp -s "$work/moe_one/model.safetensors" "$work/moe_fsdp2_none/model.safetensors"; then
    fail "MoE: the default mode's FSDP 2 matched one process bit for bit (no control)"
else
    echo "  MoE default mode: FSDP 2's weights differ from one process's, as expected"
fi

for mutation in swap_leaves wgrad_k; do
    HS_CANON_TEST_MUTATE=$mutation run "mutated_$mutation" 1 train.threads=2 train.micro_batch_size=8
    differs one "mutated_$mutation"
done

hs_refused 2 "covers FSDP, HSDP, pipelines and micro-batches" accelerator.tp_size=2
hs_refused 1 "model.moe.aux_loss_coef = 0.01 with train.reproducibility = layout" \
    model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
hs_refused 1 "set fsdp_config.mix_precision.reduce_dtype: float32" \
    fsdp_config.mix_precision.param_dtype=bfloat16
hs_refused 1 "must be a power of two" train.micro_batch_size=3 train.global_batch_size=6
hs_refused 1 "train.reproducibility: expected one of none | run | layout, got 'bits'" \
    train.reproducibility=bits
HS_CANON_TEST_MUTATE=bogus hs_refused 1 "HS_CANON_TEST_MUTATE=bogus: expected swap_leaves or wgrad_k"
echo "  refused: TP, MoE's per-micro-batch aux loss, a 16-bit reduction, a batch that is no"
echo "  power of two, an unknown mode, an unknown mutation"

hs_finish
