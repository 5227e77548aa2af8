#!/usr/bin/env bash
# `hypershard train` under mpiexec: a config error is printed once and every
# rank exits 2 with nothing on disk; a config warning is printed once; a
# 2-rank run logs the global-batch mean
# loss, equal to the single-process run's on the same global batches.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -euo pipefail
work=$(mktemp -d /tmp/hs_cli_train_mpi_XXXXXX)
trap 'rm -rf "$work"' EXIT
tiny=(model.dim=32 model.n_layers=2 model.n_heads=2 model.n_kv_heads=1 model.ffn_dim=64
      train.seq_len=16 train.global_batch_size=8 train.micro_batch_size=2 train.steps=4
      train.eval_every=2)

set +e
"$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" train.stepz=3 train.out_dir="$work/bad" > "$work/bad.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "exit $rc, want 2"; cat "$work/bad.txt"; exit 1; }
[ "$(grep -c 'unknown key train.stepz' "$work/bad.txt")" -eq 1 ] || { cat "$work/bad.txt"; exit 1; }
[ ! -e "$work/bad" ]

"$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" train.steps=1 fsdp_config.edp_shard_size=2 \
    train.out_dir="$work/warn" > "$work/warn.txt" 2>&1 || { cat "$work/warn.txt"; exit 1; }
[ "$(grep -c 'fsdp_config.edp_shard_size = 2 has no effect' "$work/warn.txt")" -eq 1 ] \
    || { echo "a config warning must be printed once"; cat "$work/warn.txt"; exit 1; }

"$HS_BIN" train "${tiny[@]}" train.out_dir="$work/one" > "$work/one.txt" 2>&1 || { cat "$work/one.txt"; exit 1; }
"$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" train.out_dir="$work/two" > "$work/two.txt" 2>&1 \
    || { cat "$work/two.txt"; exit 1; }
[ "$(grep -c '^step 4/4' "$work/two.txt")" -eq 1 ] || { echo "rank 0 alone must log"; cat "$work/two.txt"; exit 1; }
python3 - "$work/one/metrics.jsonl" "$work/two/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"] == 8 * 16
    for k in ("loss", "grad_norm") + (("val_loss",) if "val_loss" in x else ()):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel < 1e-5, f"step {x['step']} {k}: 1 rank {x[k]} vs 2 ranks {y[k]} (rel {rel:.1e})"
    assert y["peak_device_bytes"] > 0
print("ok")
PY
