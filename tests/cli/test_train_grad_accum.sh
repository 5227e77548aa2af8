#!/usr/bin/env bash
# Gradient accumulation computes the global-batch mean: one micro-batch of 8
# and four micro-batches of 2 give the same loss curve (fp32, 1e-5 relative).
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch accum
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.steps=6 train.eval_every=0)
run_logged "$work/m1.txt" "$HS_BIN" train "${tiny[@]}" train.micro_batch_size=8 train.out_dir="$work/m1"
run_logged "$work/m4.txt" "$HS_BIN" train "${tiny[@]}" train.micro_batch_size=2 train.out_dir="$work/m4"
grep -q "4 micro-batch" "$work/m4.txt"
python3 - "$work/m1/metrics.jsonl" "$work/m4/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 6
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel < 1e-5, f"step {x['step']} {k}: M=1 {x[k]} vs M=4 {y[k]} (rel {rel:.2e})"
assert a[-1]["loss"] < a[0]["loss"], "the loss did not fall"
print("max rel loss diff", max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)))
PY
