#!/usr/bin/env bash
# The cuda backend trains as the cpu device does (fp32, TF32 off):
# - one GPU against accelerator.device: cpu on the same config: loss and
#   grad norm of 20 steps within 1e-4, and the 3-step dumps (gradients,
#   weights, logits, the export) within 1e-4;
# - 2 and 4 ranks on one GPU (collectives staged through host memory, or
#   NCCL where each rank has a GPU of its own) against one GPU rank within
#   1e-5: FSDP 2, TP 2, PP 2 and TP 2 x FSDP 2;
# - a checkpoint saved on the GPU resumes on the cpu device and one saved
#   on the cpu resumes on the GPU, each on the uninterrupted run's curve
#   within 1e-4.
# Skips (exit 77) in a build without the cuda backend or on a machine
# without an NVIDIA GPU; tests/gpu/run.sh runs it on one.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 600
set -euo pipefail
source "$HS_SRC/tests/cli/lib.sh"
hs_scratch cuda_parity
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=8)
cuda=(accelerator.device=cuda)

rc=0
"$HS_BIN" train "${tiny[@]}" "${cuda[@]}" train.steps=1 train.out_dir="$work/probe" \
    > "$work/probe.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
    grep -q "has no CUDA backend" "$work/probe.log" && hs_skip "this build has no cuda backend"
    grep -q "no CUDA device is visible" "$work/probe.log" && hs_skip "no CUDA device: $(grep -o 'no CUDA device.*' "$work/probe.log" | head -1)"
    cat "$work/probe.log"
    die "one step on cuda failed (exit $rc)"
fi

# curve A B TOL: the loss and grad norm of every step run B logged within
# TOL of run A's at that step (relative).
curve() {
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" <<'PY' || fail "curves differ: $1 $2"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
assert b, sys.argv[2] + " logged no step"
tol, worst = float(sys.argv[3]), 0.0
for y in b:
    x = a[y["step"]]
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel < tol, f"step {x['step']} {k}: {y[k]} vs {x[k]} (rel {rel:.2e})"
        worst = max(worst, rel)
print(f"{sys.argv[2].split('/')[-2]} vs {sys.argv[1].split('/')[-2]}: {len(b)} steps, "
      f"worst relative error {worst:.2e} (tol {tol})")
PY
}

# One GPU against the cpu device.
hs_train cpu20 1 train.steps=20
hs_train gpu20 1 train.steps=20 "${cuda[@]}"
curve cpu20 gpu20 1e-4
hs_train_dump cpu 1
hs_train_dump gpu 1 "${cuda[@]}"
hs_compare_runs cpu gpu 1e-4 "${HS_DUMP_FILES[@]}" || fail "one GPU and the cpu device differ"
if hs_compare_runs cpu gpu 0 "${HS_DUMP_FILES[@]}" > /dev/null 2>&1; then
    fail "the GPU run has the cpu run's bits: its kernels did not run"
fi

# Ranks sharing the GPU against one GPU rank.
layout() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "$name" "$n" "${cuda[@]}" "$@"
    hs_compare_runs gpu "$name" 1e-5 "${HS_DUMP_FILES[@]}" || fail "$name differs from one GPU rank"
}
layout fsdp2 2 fsdp_config.dp_shard_size=2
layout tp2 2 accelerator.tp_size=2
layout pp2 2 accelerator.pp_size=2
layout fsdp4 4 fsdp_config.dp_shard_size=4
layout tp2_fsdp2 4 accelerator.tp_size=2 fsdp_config.dp_shard_size=2

# Checkpoints cross between the devices.
ck=(optimizer.schedule.decay=constant checkpoint.save_every=3)
hs_train whole 1 "${cuda[@]}" "${ck[@]}" train.steps=6
hs_train g2c_a 1 "${cuda[@]}" "${ck[@]}" train.steps=3 checkpoint.dir="$work/ck_g"
hs_train g2c_b 1 "${ck[@]}" train.steps=6 checkpoint.dir="$work/ck_g" checkpoint.resume=auto
curve whole g2c_b 1e-4
hs_train c2g_a 1 "${ck[@]}" train.steps=3 checkpoint.dir="$work/ck_c"
hs_train c2g_b 1 "${cuda[@]}" "${ck[@]}" train.steps=6 checkpoint.dir="$work/ck_c" \
    checkpoint.resume=auto
curve whole c2g_b 1e-4
hs_finish
