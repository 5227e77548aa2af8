#!/usr/bin/env bash
# Context parallelism through `hypershard train` matches the one-process run
# on the same global batch: loss and grad norm of every step, every gradient
# of step 1, every weight after steps 1, 2 and 3, the logits step 2 starts
# from and the exported model, within 1e-5 relative to each tensor's largest
# value (fp32). Each layout runs with both rotate methods (allgather, ring):
# CP 2; CP 4 (ring passes three blocks); CP 2 x FSDP 2 (dp 2, derived
# replicate 2); CP 2 x TP 2 (with sequence parallel); CP 2 x TP 2 x FSDP 2
# on 8 ranks; CP 2 with activation checkpointing; MoE with CP 2; no-sync
# accumulation and bf16 (5e-3, below); a CP checkpoint resumed at FSDP 4 and CP 4. The shard
# degree is unchanged by CP: the checkpoint of CP 2 x FSDP 2 holds the same
# chunks as that of FSDP 2 without CP. (optimizer.eps=1e-3 as in the TP
# tests: CP sums attention's dK/dV in another order.)
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch cp
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }

hs_train_dump one 1
moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0)
hs_train_dump moe1 1 "${moe[@]}"
for how in allgather ring; do
    cp=(accelerator.cp_rotate_method=$how)
    hs_train_dump cp2_$how 2 "${cp[@]}" accelerator.cp_size=2
    grep -q "engine fsdp+cp on 2 rank(s)" "$work/cp2_$how.txt"
    compare one cp2_$how
    hs_train_dump cp4_$how 4 "${cp[@]}" accelerator.cp_size=4
    compare one cp4_$how
    hs_train_dump cp2_fsdp2_$how 4 "${cp[@]}" accelerator.cp_size=2 fsdp_config.dp_shard_size=2
    grep -q "shard degree 2, replicate degree 2" "$work/cp2_fsdp2_$how.txt"
    compare one cp2_fsdp2_$how
    hs_train_dump cp2_tp2_$how 4 "${cp[@]}" accelerator.cp_size=2 accelerator.tp_size=2 \
        accelerator.sequence_parallel=true
    compare one cp2_tp2_$how
    hs_train_dump cp2_tp2_fsdp2_$how 8 "${cp[@]}" accelerator.cp_size=2 accelerator.tp_size=2 \
        fsdp_config.dp_shard_size=2
    grep -q "engine fsdp+tp+cp on 8 rank(s)" "$work/cp2_tp2_fsdp2_$how.txt"
    compare one cp2_tp2_fsdp2_$how
    hs_train_dump cp2_ckpt_$how 2 "${cp[@]}" accelerator.cp_size=2 train.activation_checkpointing=true
    compare one cp2_ckpt_$how
    hs_train_dump moe_cp2_$how 2 "${cp[@]}" "${moe[@]}" accelerator.cp_size=2
    compare moe1 moe_cp2_$how
done

# with the FSDP policies: no-sync accumulation; bf16 params within 5e-3:
# CP computes a query row's attention in other GEMM shapes (a chunk of rows
# against the keys up to it), which changes fp32 results at ~3e-7 and so
# can flip a bf16 rounding of the attention output by one ulp (3.9e-3
# relative); after 3 steps the weights differ by 1.0e-3 (data parallelism
# alone, same per-sequence shapes: 7e-8)
hs_train_dump cp2_nosync 4 accelerator.cp_size=2 fsdp_config.dp_shard_size=2 \
    accelerator.cp_rotate_method=ring fsdp_config.requires_grad_sync=false
compare one cp2_nosync
bf16=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)
hs_train bf1 1 "${bf16[@]}"
hs_train bf_cp2 2 "${bf16[@]}" accelerator.cp_size=2 accelerator.cp_rotate_method=ring
hs_compare_runs bf1 bf_cp2 5e-3

# a checkpoint saved at CP 2 x FSDP 2 (CP holds no parameter state) resumes
# at FSDP 4 and at CP 4 on the uninterrupted curve (a constant schedule, so
# the stopped run's steps have the uninterrupted run's learning rates)
tiny+=(optimizer.schedule.decay=constant)
hs_train u 4 accelerator.cp_size=2 fsdp_config.dp_shard_size=2 train.steps=5
hs_train s 4 accelerator.cp_size=2 fsdp_config.dp_shard_size=2 train.steps=2 \
    checkpoint.dir="$work/ck_s"
hs_train r_fsdp4 4 fsdp_config.dp_shard_size=4 train.steps=5 checkpoint.resume="$work/ck_s/step-2"
hs_train r_cp4 4 accelerator.cp_size=4 train.steps=5 checkpoint.resume="$work/ck_s/step-2"
close_curve "$work/u/metrics.jsonl" "$work/r_fsdp4/metrics.jsonl" 3 5
close_curve "$work/u/metrics.jsonl" "$work/r_cp4/metrics.jsonl" 3 5
[ "$failures" -eq 0 ] || die "a resumed curve left the uninterrupted one"

# the trace: CP collectives on the cp group with their bytes (allgather:
# all-gathers of K/V and reduce-scatters of dK/dV, 2 + 2 per block and
# micro-batch; ring: sends of the blocks)
for how in allgather ring; do
    hs_train tr_$how 2 accelerator.cp_size=2 accelerator.cp_rotate_method=$how \
        trace.enabled=true train.steps=1
    python3 - "$work/tr_$how/trace/trace.json" "$how" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
cp = [e for e in ev if e.get("cat") == "comm" and e["args"]["group"] == "cp" and e["pid"] == 0]
names = {e["name"] for e in cp}
want = {"all_gather", "reduce_scatter"} if sys.argv[2] == "allgather" else {"send", "recv"}
assert want <= names, (sys.argv[2], names)
assert all(e["args"]["bytes"] > 0 for e in cp if e["name"] in want), cp[:3]
# 2 blocks x 4 micro-batches per step (batch 8 / (2 x dp 1 x micro 2)), one step
n = sum(e["name"] == ("all_gather" if sys.argv[2] == "allgather" else "send") for e in cp)
per = 2 * 2 * 4 if sys.argv[2] == "allgather" else 2 * 3 * 4
assert n >= per, (sys.argv[2], n, per)
print(f"{sys.argv[2]}: {len(cp)} collectives on cp, {sorted(names)}")
PY
done

# CP never enlarges the shard degree: the same chunks as FSDP 2 without CP
hs_train fsdp2_ck 2 fsdp_config.dp_shard_size=2 train.steps=1 checkpoint.dir="$work/ck_fsdp2"
hs_train cp2_ck 4 accelerator.cp_size=2 fsdp_config.dp_shard_size=2 train.steps=1 \
    checkpoint.dir="$work/ck_cp2"
chunks() {
    python3 - "$1/step-1/metadata.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for t in sorted(m["tensors"], key=lambda t: t["name"]):
    print(t["name"], sorted((c["offsets"], c["sizes"]) for c in t["chunks"]))
PY
}
diff <(chunks "$work/ck_fsdp2") <(chunks "$work/ck_cp2") ||
    die "CP 2 x FSDP 2 shards differ from FSDP 2"
echo ok
