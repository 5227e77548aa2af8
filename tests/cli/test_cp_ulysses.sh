#!/usr/bin/env bash
# All-to-all (Ulysses) context parallelism and its hybrid with the ring,
# through `hypershard train`, match the one-process run on the same global
# batch within 1e-5 (fp32; loss and grad norm of 3 steps, step-1 gradients,
# weights after steps 1-3, logits, export; hs_compare_runs): alltoall at
# CP 2 (the 2 kv heads split), at CP 4 (each kv head replicated to two
# ranks, their dK/dV summed back), at CP 2 x TP 2 with sequence parallel
# (one kv head per TP rank, replicated), at CP 2 x FSDP 2 and with MoE at
# CP 2 x EP 2; alltoall_ring at CP 4 with cp_a2a_size 2 (all-to-all inside
# the pairs, ring across them); bf16 params at CP 2 within 5e-3. The
# trace shows the all-to-alls on the cp group (the hybrid's on its a2a
# group, its ring steps on cp), and a size that does not split the heads is
# a config error (exit 2) before any rank allocates. (optimizer.eps=1e-3 as in test_cp_parity.sh.)
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch cp_ulysses
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }
a2a=(accelerator.cp_rotate_method=alltoall)
hybrid=(accelerator.cp_rotate_method=alltoall_ring accelerator.cp_a2a_size=2)

hs_train_dump one 1
hs_train_dump cp2 2 "${a2a[@]}" accelerator.cp_size=2
grep -q "engine fsdp+cp on 2 rank(s)" "$work/cp2.txt"
compare one cp2
hs_train_dump cp4 4 "${a2a[@]}" accelerator.cp_size=4
compare one cp4
hs_train_dump cp2_tp2 4 "${a2a[@]}" accelerator.cp_size=2 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true
compare one cp2_tp2
hs_train_dump cp2_fsdp2 4 "${a2a[@]}" accelerator.cp_size=2 fsdp_config.dp_shard_size=2
grep -q "shard degree 2, replicate degree 2" "$work/cp2_fsdp2.txt"
compare one cp2_fsdp2
hs_train_dump hybrid4 4 "${hybrid[@]}" accelerator.cp_size=4
compare one hybrid4

moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0)
hs_train_dump moe1 1 "${moe[@]}"
hs_train_dump moe_cp2_ep2 2 "${a2a[@]}" "${moe[@]}" accelerator.cp_size=2 accelerator.ep_size=2
grep -q "engine fsdp+cp+ep on 2 rank(s)" "$work/moe_cp2_ep2.txt"
compare moe1 moe_cp2_ep2

# bf16 params within 5e-3, as the ring in test_cp_parity.sh (other GEMM
# shapes move fp32 results by ~3e-7, which can flip a bf16 rounding)
bf16=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)
hs_train bf1 1 "${bf16[@]}"
hs_train bf_cp2 2 "${bf16[@]}" "${a2a[@]}" accelerator.cp_size=2
hs_compare_runs bf1 bf_cp2 5e-3

# the trace: per block and micro-batch, 4 all-to-alls in forward and 8 in
# backward (q, k, v, output, dO over; dQ, dK, dV back); 2 blocks x 4
# micro-batches in the one step (the closing sample's forwards add theirs)
for run in "a2a 2 cp ${a2a[*]} accelerator.cp_size=2" \
           "hybrid 4 cp.a2a2 ${hybrid[*]} accelerator.cp_size=4"; do
    read -r name n group args <<<"$run"
    # shellcheck disable=SC2086 # the layout's overrides, one word each
    hs_train tr_$name "$n" $args trace.enabled=true train.steps=1
    python3 - "$work/tr_$name/trace/trace.json" "$group" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
group = sys.argv[2]
comm = [e for e in ev if e.get("cat") == "comm" and e["pid"] == 0]
a2a = [e for e in comm if e["name"] == "all_to_all"]
assert a2a and all(e["args"]["group"] == group for e in a2a), {e["args"]["group"] for e in a2a}
assert all(e["args"]["bytes"] > 0 for e in a2a), a2a[:3]
assert len(a2a) >= 12 * 2 * 4 and len(a2a) % 4 == 0, len(a2a)
ring = [e for e in comm if e["name"] in ("send", "recv") and e["args"]["group"] == "cp"]
if group != "cp":  # the hybrid's ring across its two groups
    assert ring, sorted({(e["name"], e["args"]["group"]) for e in comm})
print(f"{group}: {len(a2a)} all_to_all, {len(ring)} ring sends/recvs on cp")
PY
done

# heads that do not split over the all-to-all: exit 2, the keys and the
# valid sizes named, before any rank allocates
rc=0
"$MPIEXEC" -n 4 "$HS_BIN" train "${tiny[@]}" accelerator.cp_size=4 \
    accelerator.cp_rotate_method=alltoall_ring train.out_dir="$work/bad" >"$work/bad.txt" 2>&1 ||
    rc=$?
[ "$rc" = 2 ] || { cat "$work/bad.txt"; die "alltoall_ring without cp_a2a_size: exit $rc, want 2"; }
grep -q "needs accelerator.cp_a2a_size.*valid accelerator.cp_a2a_size: 1, 2, 4" "$work/bad.txt" ||
    { cat "$work/bad.txt"; die "the error does not name the key and the valid sizes"; }
echo ok
