#!/usr/bin/env bash
# Compressed FSDP communication (docs/fsdp-compression.md).
# fsdp_config.param_gather: FSDP's parameter all-gathers move each shard
# block-quantized (int8, fp8 e4m3) and every rank computes with the same
# dequantized values, while the fp32 masters and the optimizer stay exact.
#   - What the ranks compute with is the format's definition applied to
#     each shard: tests/cli/quant_sim.py rebuilds those weights from the
#     run's initial masters with the standard library, and one process
#     started from them (--init-from) has the FSDP run's step-1 loss, grad
#     norm and every gradient within 1e-5 relative (the FSDP parity
#     tolerance: the same values, the gradients summed over ranks in
#     another order). FSDP 2 int8 and fp8 (blocks of 256 and 32, one not
#     dividing a shard), uneven shards over 3 ranks, HSDP 2x2 with
#     replicate_params (kept exact) and an MoE with sharded experts.
#   - Not bit for bit the exact run (the quantization acts), and within
#     1e-3 of its loss at every step of 3.
#   - A fused unit packs each parameter alone, from what the unfused path
#     packs it from: comm_fusion (zero-copy and copy-in) and offload give
#     the unfused quantized run's bits, fp32 and bf16.
#   - The masters are never quantized: with a learning rate of 1e-30 the
#     weights never move, and the quantized run exports the exact run's
#     weights bit for bit although its losses differ.
#   - fsdp_config.grad_reduce: int8: the reduce-scatter is an all-to-all
#     of each rank's W chunks quantized in blocks, summed in fp32 by their
#     owner. Step 1's loss is the exact run's bit for bit (the forward is
#     untouched) and its reduced gradients are within 1e-2 of the exact
#     ones relative to each tensor's largest value: every chunk is within
#     half a step (amax / 254) of itself and the owner averages W of them,
#     so a value moves by at most max over ranks of |g_r| / 254, at most
#     twice the reduced gradient's largest value at W = 2 where no two
#     ranks cancel (a row one rank alone saw halves: the worst case): 0.8%.
#     FSDP 2 fp32 and bf16, HSDP 2x2 with replicate_params (its all-reduce
#     stays in reduce_dtype), and with param_gather. grad_reduce: int4
#     (nibbles, half a step amax / 14) within 2/14 by the same argument.
#   - A fused unit's quantized reduction packs each parameter's chunks
#     alone and sums each as the unfused path does: comm_fusion (zero-copy
#     and copy-in) gives the unfused bits, int8 and int4, FSDP 2 and HSDP.
#   - A format that is not one, or a block size below 1 (or odd for int4),
#     is a configuration error (exit 2, the key named, nothing written); on
#     an unsharded layout the keys warn that they have no effect.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch compression
tiny=("${HS_FSDP_TINY[@]}")
F2=(fsdp_config.dp_shard_size=2 train.global_batch_size=8)
BF=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)

# grads_within REF RUN TOL [nonzero]: tests/cli/grads_within.py on the runs
grads_within() { python3 "$HS_SRC/tests/cli/grads_within.py" "$work/$1" "$work/$2" "$3" "${4:-}"; }

# sim NAME RANKS SHARD BLOCK FORMAT KEEP ARGS...: a one-step quantized run
# on RANKS and a one-process run from quant_sim.py's weights (KEEP: the
# comma-separated replicate_params) agree within 1e-5.
sim() {
    local name=$1 n=$2 shard=$3 block=$4 fmt=$5 keep=$6
    shift 6
    hs_train "$name" "$n" train.steps=1 fsdp_config.param_gather="$fmt" \
        fsdp_config.param_gather_block="$block" "$@" --dump "$work/$name/dump"
    grep -q "parameters gathered in $fmt in blocks of $block" "$work/$name.txt"
    python3 "$HS_SRC/tests/cli/quant_sim.py" "$work/$name/dump/weights-step0.safetensors" \
        "$work/$name.init" "$shard" "$block" "$fmt" ${keep//,/ }
    local one=()
    for a in "$@"; do [[ $a == fsdp_config.* || $a == accelerator.* ]] || one+=("$a"); done
    hs_train "$name.one" 1 train.steps=1 "${one[@]}" --init-from "$work/$name.init" \
        --dump "$work/$name.one/dump"
    python3 - "$work/$name" "$work/$name.one" <<'PY'
import json, sys
run, one = sys.argv[1:]
x, y = (json.loads(open(d + "/metrics.jsonl").readline()) for d in (one, run))
for k in ("loss", "grad_norm"):
    rel = abs(x[k] - y[k]) / abs(x[k])
    assert rel < 1e-5, f"{run}: step-1 {k} {y[k]}, the simulated weights' {x[k]}"
PY
    grads_within "$name.one" "$name" 1e-5
}

sim int8 2 2 256 int8 "" "${F2[@]}"
sim fp8 2 2 32 fp8_e4m3 "" "${F2[@]}"
sim uneven3 3 3 24 int8 "" fsdp_config.dp_shard_size=3 train.global_batch_size=12
rep=model.norm.weight,model.layers.0.mlp.up_proj.weight
sim hsdp 4 2 256 int8 "$rep" "${F2[@]}" "fsdp_config.replicate_params=[$rep]"
sim moe 2 2 64 fp8_e4m3 "" "${F2[@]}" model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 \
    model.moe.expert_ffn_dim=24 model.moe.aux_loss_coef=0

# Not bit for bit: the two runs' step losses differ somewhere, by < 1e-3.
near() {
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert a != b, f"the quantized run has the exact run's losses {a}: nothing was quantized"
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst < 1e-3, (a, b)
print(f"  losses differ by up to {worst:.2e} relative")
PY
}
hs_train_dump exact 2 "${F2[@]}"
hs_train_dump q 2 "${F2[@]}" fsdp_config.param_gather=int8
near exact q

# fused (zero-copy, copy-in) and offloaded: the unfused quantized bits
hs_train_dump q_fused 2 "${F2[@]}" fsdp_config.param_gather=int8 fsdp_config.comm_fusion=true
hs_compare_runs q q_fused 0 "${HS_DUMP_FILES[@]}"
hs_train_dump q_copy_in 2 "${F2[@]}" fsdp_config.param_gather=int8 fsdp_config.comm_fusion=true \
    fsdp_config.comm_fusion_zero_copy=false
hs_compare_runs q q_copy_in 0 "${HS_DUMP_FILES[@]}"
hs_train_dump q_offload 2 "${F2[@]}" fsdp_config.param_gather=int8 fsdp_config.enable_offload=true
hs_compare_runs q q_offload 0 "${HS_DUMP_FILES[@]}"
hs_train_dump bf16_q 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8
hs_train_dump bf16_q_fused 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8 \
    fsdp_config.comm_fusion=true
hs_compare_runs bf16_q bf16_q_fused 0 "${HS_DUMP_FILES[@]}"
hs_train_dump bf16_q_copy_in 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8 \
    fsdp_config.comm_fusion=true fsdp_config.comm_fusion_zero_copy=false
hs_compare_runs bf16_q bf16_q_copy_in 0 "${HS_DUMP_FILES[@]}"

# grad_reduce: step 1's loss bit for bit, its gradients within 1e-2
step1() { # REF RUN [TOL]
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = (json.loads(open(p).readline())["loss"] for p in sys.argv[1:])
assert a == b, f"step 1's loss {b} is not the exact run's {a}: the forward changed"
PY
    grads_within "$1" "$2" "${3:-1e-2}" nonzero
}
hs_train_dump rq 2 "${F2[@]}" fsdp_config.grad_reduce=int8
grep -q "gradients reduce-scattered in int8 in blocks of 256" "$work/rq.txt"
step1 exact rq
near exact rq
hs_train_dump bf16 2 "${F2[@]}" "${BF[@]}"
hs_train_dump rq_bf16 2 "${F2[@]}" "${BF[@]}" fsdp_config.grad_reduce=int8 \
    fsdp_config.grad_reduce_block=64
step1 bf16 rq_bf16
hs_train_dump hsdp_exact 4 "${F2[@]}" "fsdp_config.replicate_params=[$rep]"
hs_train_dump hsdp_rq 4 "${F2[@]}" "fsdp_config.replicate_params=[$rep]" fsdp_config.grad_reduce=int8
step1 hsdp_exact hsdp_rq
# int4: half a step is amax / 14, so the same bound is 2/14 = 0.143
hs_train_dump rq4 2 "${F2[@]}" fsdp_config.grad_reduce=int4 fsdp_config.grad_reduce_block=64
grep -q "gradients reduce-scattered in int4 in blocks of 64" "$work/rq4.txt"
step1 exact rq4 0.143
# unset, int4's blocks hold 32 values (int8's 256, above): the curve's
hs_train rq4_default 2 "${F2[@]}" fsdp_config.grad_reduce=int4 train.steps=1
grep -q "gradients reduce-scattered in int4 in blocks of 32" "$work/rq4_default.txt" ||
    fail "int4's default block: $(grep 'reduce-scattered' "$work/rq4_default.txt")"
# fused units pack each parameter's chunks alone: the unfused bits
hs_train_dump rq_fused 2 "${F2[@]}" fsdp_config.grad_reduce=int8 fsdp_config.comm_fusion=true
hs_compare_runs rq rq_fused 0 "${HS_DUMP_FILES[@]}"
hs_train_dump rq4_copy_in 2 "${F2[@]}" fsdp_config.grad_reduce=int4 fsdp_config.grad_reduce_block=64 \
    fsdp_config.comm_fusion=true fsdp_config.comm_fusion_zero_copy=false
hs_compare_runs rq4 rq4_copy_in 0 "${HS_DUMP_FILES[@]}"
hs_train_dump hsdp_rq_fused 4 "${F2[@]}" "fsdp_config.replicate_params=[$rep]" \
    fsdp_config.grad_reduce=int8 fsdp_config.comm_fusion=true
hs_compare_runs hsdp_rq hsdp_rq_fused 0 "${HS_DUMP_FILES[@]}"
hs_train_dump both 2 "${F2[@]}" fsdp_config.param_gather=int8 fsdp_config.grad_reduce=int8
near exact both

# the masters: exported as the exact run's when nothing moves them
still=(optimizer.lr=1e-30 optimizer.weight_decay=0)
hs_train still 2 "${F2[@]}" "${still[@]}"
hs_train still_q 2 "${F2[@]}" "${still[@]}" fsdp_config.param_gather=int8
cmp "$work/still/model.safetensors" "$work/still_q/model.safetensors"
near still still_q

# a bad format: exit 2, the key and the choices named, nothing written
bad() { hs_refused 1 "${@: -1}" "${F2[@]}" "${@:1:$#-1}"; } # KEY=VALUE... MESSAGE
bad fsdp_config.param_gather=int4 \
    "fsdp_config.param_gather = int4 is not a wire format; use int8, fp8_e4m3 or null"
bad fsdp_config.grad_reduce=fp8_e4m3 \
    "fsdp_config.grad_reduce = fp8_e4m3 is not a wire format for gradients; use int8, int4 or null"
bad fsdp_config.grad_reduce=int4 fsdp_config.grad_reduce_block=33 \
    "fsdp_config.grad_reduce_block = 33 with grad_reduce = int4: two values share a byte"
bad fsdp_config.param_gather=int8 fsdp_config.param_gather_block=0 \
    "fsdp_config.param_gather_block = 0 is out of range: it must be >= 1"
bad fsdp_config.grad_reduce=int8 fsdp_config.grad_reduce_block=-3 \
    "fsdp_config.grad_reduce_block: -3 is out of range: it must be >= 1, or null"

hs_train unsharded 2 train.global_batch_size=8 fsdp_config.param_gather=int8 \
    fsdp_config.grad_reduce=int8
grep -q "fsdp_config.param_gather = int8 has no effect" "$work/unsharded.txt"
grep -q "fsdp_config.grad_reduce = int8 has no effect" "$work/unsharded.txt"
echo "PASS"
