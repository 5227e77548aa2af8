#!/usr/bin/env bash
# mix_precision.output_dtype and cast_forward_inputs through `hypershard
# train` (spec 004 §2.2, §5.7; docs/fsdp-policies.md "Unit boundaries"):
# - bf16 params with output_dtype float32 (fp32 hand-over between blocks),
#   with and without cast_forward_inputs (the latter keeps an fp32 residual
#   stream), and fp32 params with output_dtype bfloat16: FSDP W=2 matches the
#   one-process run of the same config (the FSDP engine with groups of size
#   1) in loss, grad norm and exported weights within the bf16 tolerances of
#   tests/mpi/test_fsdp_policy.c; every loss is finite;
# - each knob changes exactly what it names: cast_forward_inputs=false alone
#   gives the bf16 run bit for bit (every input already is in param_dtype);
#   output_dtype=float32 with the input cast leaves the first forward bit
#   for bit (bf16 values widened and narrowed back) while its gradients
#   pass the casts; without the input cast the first loss moves.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -euo pipefail
work=$(mktemp -d /tmp/hs_cli_outdt_XXXXXX)
trap 'rm -rf "$work"' EXIT
tiny=(model.dim=32 model.n_layers=2 model.n_heads=4 model.n_kv_heads=1 model.ffn_dim=40
      train.seq_len=16 train.micro_batch_size=2 train.steps=3 train.eval_every=0
      train.global_batch_size=8 optimizer.eps=1e-6 optimizer.schedule.warmup_steps=0)
mp=fsdp_config.mix_precision
bf16=($mp.param_dtype=bfloat16 $mp.reduce_dtype=float32)
out32=("${bf16[@]}" $mp.output_dtype=float32)
stream32=("${out32[@]}" $mp.cast_forward_inputs=false)
nocast=("${bf16[@]}" $mp.cast_forward_inputs=false)
out16=($mp.output_dtype=bfloat16 $mp.reduce_dtype=float32)

train() { # name ranks args...
    local name=$1 n=$2
    shift 2
    local launch=()
    [ "$n" = 1 ] || launch=("$MPIEXEC" -n "$n")
    "${launch[@]}" "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" \
        > "$work/$name.txt" 2>&1 || { cat "$work/$name.txt"; exit 1; }
}

compare() { # reference run tolerance
    python3 - "$work/$1" "$work/$2" "$3" <<'PY'
import json, math, struct, sys

def metrics(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl")]

def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out

ref, run, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
a, b = metrics(ref), metrics(run)
assert len(a) == len(b) == 3, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert math.isfinite(x["loss"]) and math.isfinite(y["loss"]), (x["loss"], y["loss"])
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel <= tol, f"{run}: step {x['step']} {k} {y[k]} vs {x[k]} (rel {rel:.2e})"
        worst = max(worst, rel)
ta, tb = tensors(ref + "/model.safetensors"), tensors(run + "/model.safetensors")
assert ta.keys() == tb.keys()
for k in ta:
    scale = max(abs(v) for v in ta[k]) or 1.0
    err = max(abs(p - q) for p, q in zip(ta[k], tb[k])) / scale
    assert err <= tol, f"{run}: {k} differs by {err:.2e} relative"
    worst = max(worst, err)
print(f"{run.split('/')[-1]} vs {ref.split('/')[-1]}: worst relative error {worst:.2e} (tol {tol})")
PY
}

first_loss() { # run
    python3 -c "import json; print(repr(json.loads(open('$work/$1/metrics.jsonl').readline())['loss']))"
}

# W=2 against one process, same dtypes
train out32_1 1 "${out32[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/out32_1.txt"
train out32_2 2 fsdp_config.dp_shard_size=2 "${out32[@]}"
compare out32_1 out32_2 1.5e-2
train stream32_1 1 "${stream32[@]}"
train stream32_2 2 fsdp_config.dp_shard_size=2 "${stream32[@]}"
compare stream32_1 stream32_2 1.5e-2
train out16_1 1 "${out16[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/out16_1.txt"
train out16_2 2 fsdp_config.dp_shard_size=2 "${out16[@]}"
compare out16_1 out16_2 2e-2

# each knob changes exactly what it names
train bf16_2 2 fsdp_config.dp_shard_size=2 "${bf16[@]}"
train nocast_2 2 fsdp_config.dp_shard_size=2 "${nocast[@]}"
compare bf16_2 nocast_2 0
cmp "$work/bf16_2/model.safetensors" "$work/nocast_2/model.safetensors"
plain=$(first_loss bf16_2) widened=$(first_loss out32_2) stream=$(first_loss stream32_2)
[ "$widened" = "$plain" ] || { echo "output_dtype=float32 moved the first loss: $widened vs $plain"; exit 1; }
[ "$stream" != "$plain" ] || { echo "an fp32 residual stream left the first loss at $plain"; exit 1; }
if cmp -s "$work/bf16_2/model.safetensors" "$work/out32_2/model.safetensors"; then
    echo "output_dtype=float32 left the gradients untouched"
    exit 1
fi
echo "first loss: bf16 $plain, output_dtype float32 $widened, fp32 stream $stream"
echo ok
