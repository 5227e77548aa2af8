#!/usr/bin/env bash
# `hypershard train` on a tiny config: 3 steps write 3 metrics lines with
# every required key and a finite loss, plus config.yaml and the weights;
# config errors exit 2 and leave no out_dir behind.
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch train
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.log_every=1)

run_logged "$work/out.txt" "$HS_BIN" train "${tiny[@]}" train.steps=3 train.eval_every=2 \
    train.out_dir="$work/run"
grep -q "step 3/3" "$work/out.txt"
grep -q "sample (greedy)" "$work/out.txt"
for f in config.yaml metrics.jsonl model.safetensors config.json; do
    [ -s "$work/run/$f" ] || { echo "missing $f"; exit 1; }
done
python3 - "$work/run/metrics.jsonl" <<'PY'
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 3, f"{len(lines)} metrics lines, want 3"
keys = ["step", "loss", "grad_norm", "lr", "tokens", "step_time_s", "tokens_per_s", "mfu",
        "peak_device_bytes", "peak_host_bytes"]
for i, line in enumerate(lines, 1):
    m = json.loads(line)
    for k in keys:
        assert k in m, f"line {i} lacks {k}: {line}"
    assert m["step"] == i
    assert math.isfinite(m["loss"]) and 0 < m["loss"] < 10, m["loss"]
    assert m["tokens"] == 4 * 16
    assert m["peak_device_bytes"] > 0
assert "val_loss" in json.loads(lines[1]) and "val_loss" in json.loads(lines[2])
assert "val_loss" not in json.loads(lines[0])
PY
grep -q "micro_batches_per_step: 2" "$work/run/config.yaml"

# Tracing: one merged Chrome trace with per-block compute spans, the
# optimizer and memory counters, under trace.dir when it is set.
run_logged "$work/trace.txt" "$HS_BIN" train "${tiny[@]}" train.steps=2 trace.enabled=true \
    trace.dir="$work/tr" train.out_dir="$work/traced"
python3 - "$work/tr/trace.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = {e.get("name") for e in (d["traceEvents"] if isinstance(d, dict) else d)}
for n in ["forward model.layers.0", "backward model.layers.1", "forward root", "optimizer",
          "device_bytes"]:
    assert n in names, f"trace lacks {n}"
PY

# The other sources: a text file, and an HSTK token file written as
# docs/data.md shows (vocab 300 > 256, so not bytes).
run_logged "$work/text.txt" "$HS_BIN" train "${tiny[@]}" train.steps=2 data.source=text \
    data.path="$HS_SRC/docs/data.md" train.out_dir="$work/text"
python3 - "$work/data.hstk" <<'PY'
import struct, sys
ids = [(i * 7919) % 300 for i in range(5000)]
open(sys.argv[1], "wb").write(b"HSTK" + struct.pack("<IQ", 1, len(ids))
                              + struct.pack(f"<{len(ids)}H", *ids))
PY
run_logged "$work/tok.txt" "$HS_BIN" train "${tiny[@]}" train.steps=2 model.vocab_size=300 \
    data.source=tokens data.path="$work/data.hstk" train.out_dir="$work/tok"
[ "$(wc -l < "$work/tok/metrics.jsonl")" -eq 2 ]
head -c 20 "$work/data.hstk" > "$work/short.hstk"
expect_config_error_any() { # NAME NEEDLE ARGS...: any non-zero exit, nothing on disk
    local name=$1 needle=$2; shift 2
    if "$HS_BIN" train "${tiny[@]}" train.out_dir="$work/$name" "$@" > "$work/err.txt" 2>&1; then
        echo "$name: succeeded"; exit 1
    fi
    grep -q "$needle" "$work/err.txt" || { echo "$name: no '$needle' in:"; cat "$work/err.txt"; exit 1; }
    [ ! -e "$work/$name" ] || { echo "$name: out_dir was created"; exit 1; }
}
expect_config_error_any short_tokens "short.hstk" model.vocab_size=300 data.source=tokens \
    data.path="$work/short.hstk"
expect_config_error_any big_token "position" model.vocab_size=299 data.source=tokens \
    data.path="$work/data.hstk"

# train.threads: two threads per rank (threaded kernels, attention's heads
# split over the threads) train as one does, within fp32 rounding, and in
# bf16 within its own; the start-up line names the count.
thr=(model.dim=64 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=128 train.seq_len=32
     train.global_batch_size=4 train.micro_batch_size=4 train.steps=3 train.eval_every=0)
for dt in fp32 bf16; do
    extra=()
    [ "$dt" = bf16 ] && extra=(fsdp_config.mix_precision.param_dtype=bfloat16)
    for n in 1 2; do
        run_logged "$work/thr$dt$n.txt" "$HS_BIN" train "${HS_TINY[@]}" "${thr[@]}" "${extra[@]}" \
            train.threads=$n train.out_dir="$work/thr$dt$n"
    done
    grep -q "| 2 thread(s) per rank" "$work/thr${dt}2.txt" || { echo "no thread count"; exit 1; }
    python3 - "$work/thr${dt}1/metrics.jsonl" "$work/thr${dt}2/metrics.jsonl" "$dt" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
tol = 1e-5 if sys.argv[3] == "fp32" else 1e-2
assert len(a) == len(b) == 3, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= tol * abs(x), f"{sys.argv[3]}: 1 thread {a}, 2 threads {b}"
PY
done

# Config errors: exit 2, the message names the key, nothing on disk.
expect_config_error() {
    local name=$1 needle=$2; shift 2
    set +e
    "$HS_BIN" train "${tiny[@]}" train.steps=3 train.out_dir="$work/$name" "$@" > "$work/err.txt" 2>&1
    local rc=$?
    set -e
    [ "$rc" -eq 2 ] || { echo "$name: exit $rc, want 2"; cat "$work/err.txt"; exit 1; }
    grep -q "$needle" "$work/err.txt" || { echo "$name: no '$needle' in:"; cat "$work/err.txt"; exit 1; }
    [ ! -e "$work/$name" ] || { echo "$name: out_dir was created"; exit 1; }
}
expect_config_error bad_key "train.stepz" train.stepz=3
expect_config_error bad_batch "global_batch_size" train.global_batch_size=5
expect_config_error no_text_path "data.path" data.source=text
expect_config_error small_vocab "model.vocab_size" model.vocab_size=100
echo "ok"
