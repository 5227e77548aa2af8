#!/usr/bin/env bash
# The secondary shard, hpZ (fsdp_config.secondary_shard_size,
# docs/fsdp-compression.md): after a unit's forward each rank keeps its
# piece of the gathered parameters cut in secondary_shard_size, and the
# backward gathers those pieces among the secondary_shard_size consecutive
# shard ranks (one node's) instead of the whole shard group.
#   - Bit for bit the run without it: the pieces are the forward's
#     gathered bits and the masters do not change before the backward, so
#     the backward's parameters are the same whichever group gathers them.
#     FSDP 4 with pieces over 2 ranks, fp32 and bf16, with int8 gathers
#     (the pieces hold the dequantized values), with recomputation
#     (activation checkpointing), with 2 micro-batches a step, an MoE whose
#     experts are sharded too, PP 2 x FSDP 4 under 1F1B (a forward's
#     pieces kept across the other micro-batches' backwards), and fused
#     units (zero-copy, copy-in with int8 gathers in bf16, and under PP).
#   - The trace: every block's forward gathers on fsdp_shard, its backward
#     on fsdp_shard_secondary, as many of each.
#   - A degree that does not divide the shard degree, or equals it or 1,
#     and reshard_after_forward false are configuration errors (exit 2,
#     the key and the fix named, nothing written).
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch secondary
tiny=("${HS_FSDP_TINY[@]}")
F4=(fsdp_config.dp_shard_size=4 train.global_batch_size=8)
H=(fsdp_config.secondary_shard_size=2)
BF=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)

# same NAME RANKS ARGS...: NAME without and NAME.hpz with the secondary
# shard, dumped; the second must be the first bit for bit.
same() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "$name" "$n" "$@"
    hs_train_dump "$name.hpz" "$n" "$@" "${H[@]}" trace.enabled=true
    grep -q "stays sharded over 2 of the 4 shard ranks" "$work/$name.hpz.txt"
    hs_compare_runs "$name" "$name.hpz" 0 "${HS_DUMP_FILES[@]}"
}
same fp32 4 "${F4[@]}"
same bf16 4 "${F4[@]}" "${BF[@]}"
same int8 4 "${F4[@]}" fsdp_config.param_gather=int8 fsdp_config.grad_reduce=int8
same recompute 4 "${F4[@]}" train.activation_checkpointing=true
same accum 4 fsdp_config.dp_shard_size=4 train.global_batch_size=16
same moe 4 "${F4[@]}" model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 \
    model.moe.expert_ffn_dim=24 model.moe.aux_loss_coef=0
same pp 8 "${F4[@]}" accelerator.pp_size=2 accelerator.pp_schedule=1f1b \
    train.global_batch_size=16
same fused 4 "${F4[@]}" fsdp_config.comm_fusion=true
same copy_in 4 "${F4[@]}" "${BF[@]}" fsdp_config.comm_fusion=true \
    fsdp_config.comm_fusion_zero_copy=false fsdp_config.param_gather=int8
same fused_pp 8 "${F4[@]}" accelerator.pp_size=2 accelerator.pp_schedule=1f1b \
    train.global_batch_size=16 fsdp_config.comm_fusion=true

# the trace: a block's backward gathers on the secondary group, its forward
# on the shard group, step for step
python3 - "$work/fp32.hpz/trace/trace.json" <<'PY'
import collections, json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
steps = [e for e in ev if e.get("name") == "step" and e.get("ph") == "X" and e.get("pid") == 0]
assert len(steps) == 3, len(steps)
for s in steps:
    t0, t1 = s["ts"], s["ts"] + s["dur"]
    n = collections.Counter(e["args"]["group"] for e in ev
                            if e.get("pid") == 0 and e.get("ph") == "X" and e.get("name") == "all_gather"
                            and t0 <= e["ts"] <= t1 and "group" in e.get("args", {}))
    sec, full = n["fsdp_shard_secondary"], n["fsdp_shard"]
    # the root's parameters stay gathered from forward to backward
    assert 0 < sec < full, n
print("all-gathers per step: fsdp_shard %d, fsdp_shard_secondary %d" % (full, sec))
PY

bad() { hs_refused 4 "${@: -1}" "${F4[@]}" "${@:1:$#-1}"; } # KEY=VALUE... MESSAGE
bad fsdp_config.secondary_shard_size=3 "fsdp_config.secondary_shard_size = 3 must divide the \
shard degree (fsdp_config.dp_shard_size = 4) and lie strictly between 1 and it; use 2"
bad fsdp_config.secondary_shard_size=4 "fsdp_config.secondary_shard_size = 4 must divide"
bad fsdp_config.secondary_shard_size=1 "fsdp_config.secondary_shard_size = 1 must divide"
bad fsdp_config.secondary_shard_size=0 \
    "fsdp_config.secondary_shard_size: 0 is out of range: it must be >= 1, or null"
bad "${H[@]}" fsdp_config.reshard_after_forward=false "set reshard_after_forward: true"
echo ok
