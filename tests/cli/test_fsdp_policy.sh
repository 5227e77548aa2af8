#!/usr/bin/env bash
# The FSDP policies through `hypershard train` (spec 004 §2.2, §2.3, §5.7–5.9):
# - bf16 params + fp32 reduce + fp32 main grads/params + CPU offload +
#   2 micro-batches without grad sync, on FSDP W=2 and HSDP 2x2 (and with
#   Muon on FSDP W=2), match the
#   one-process run of the same config (same dtypes: one process runs the
#   FSDP engine with groups of size 1) in loss, grad norm and exported
#   weights within 1e-3 relative (see docs/fsdp-policies.md);
# - offload: H2D and D2H spans on the trace's copy lane, a lower device peak
#   than the same run without offload, host bytes in use, and the same
#   weights bit for bit;
# - the invalid fp32 main-grad combinations of spec §4.1 rules 8 and 9 fail
#   before training, naming the keys.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
set -euo pipefail
work=$(mktemp -d /tmp/hs_cli_policy_XXXXXX)
trap 'rm -rf "$work"' EXIT
tiny=(model.dim=32 model.n_layers=2 model.n_heads=4 model.n_kv_heads=1 model.ffn_dim=40
      train.seq_len=16 train.micro_batch_size=2 train.steps=3 train.eval_every=0
      train.global_batch_size=8 optimizer.eps=1e-6 optimizer.schedule.warmup_steps=0)
combo=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32
       fsdp_config.mix_precision.fp32_main_grad=true optimizer.fp32_main_params=true
       fsdp_config.enable_offload=true fsdp_config.requires_grad_sync=false
       fsdp_config.reshard_after_backward=false)

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
import json, struct, sys

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

peak() { # run key: the largest value of `key` over the steps
    python3 -c "import json,sys; print(max(json.loads(l)['$2'] for l in open('$work/$1/metrics.jsonl')))"
}

train one 1 "${combo[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/one.txt"
train fsdp2 2 fsdp_config.dp_shard_size=2 "${combo[@]}"
train hsdp 4 fsdp_config.dp_shard_size=2 "${combo[@]}"
grep -q "shard degree 2, replicate degree 2" "$work/hsdp.txt"
compare one fsdp2 1e-3
compare one hsdp 1e-3
# Muon updates the fp32 main params just the same, on row shards that
# gather each hidden matrix's update for Newton-Schulz
main=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32
      fsdp_config.mix_precision.fp32_main_grad=true optimizer.fp32_main_params=true
      optimizer._target_=muon)
train muon1 1 "${main[@]}"
train muon2 2 fsdp_config.dp_shard_size=2 "${main[@]}"
compare muon1 muon2 1e-3

# offload against the same run without it: same weights bit for bit, the
# device peak lower, host memory in use, H2D/D2H on the copy lane
train on 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true trace.enabled=true
train off 2 fsdp_config.dp_shard_size=2
compare off on 0
cmp "$work/on/model.safetensors" "$work/off/model.safetensors"
on_dev=$(peak on peak_device_bytes) off_dev=$(peak off peak_device_bytes)
[ "$on_dev" -lt "$off_dev" ] || { echo "offload device peak $on_dev not below $off_dev"; exit 1; }
[ "$(peak on peak_host_bytes)" -gt 0 ] || { echo "offload run used no host memory"; exit 1; }
[ "$(peak off peak_host_bytes)" -eq 0 ] || { echo "run without offload used host memory"; exit 1; }
python3 - "$work/on/trace/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
copies = {}
for e in ev:
    if e.get("ph") == "X" and e.get("cat") == "copy":
        copies[e["name"]] = copies.get(e["name"], 0) + 1
assert copies.get("H2D", 0) > 0 and copies.get("D2H", 0) > 0, copies
print("offload trace copies:", copies)
PY
echo "offload device peak $on_dev B vs $off_dev B without"

# spec §4.1 rules 8 and 9: never silently corrected
fails() { # expected-text args...
    local want=$1
    shift
    if "$HS_BIN" train "${tiny[@]}" train.out_dir="$work/bad" "$@" > "$work/bad.txt" 2>&1; then
        echo "accepted: $*"
        exit 1
    fi
    grep -qF "$want" "$work/bad.txt" || { cat "$work/bad.txt"; exit 1; }
}
fails "optimizer.fp32_main_params" fsdp_config.mix_precision.fp32_main_grad=true \
    fsdp_config.mix_precision.reduce_dtype=float32
fails "fsdp_config.mix_precision.fp32_main_grad" optimizer.fp32_main_params=true
fails "reduce_dtype" fsdp_config.mix_precision.fp32_main_grad=true \
    optimizer.fp32_main_params=true fsdp_config.mix_precision.reduce_dtype=bfloat16
echo ok
