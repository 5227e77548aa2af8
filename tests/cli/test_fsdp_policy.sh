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
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch policy
tiny=("${HS_FSDP_TINY[@]}" train.global_batch_size=8)
combo=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32
       fsdp_config.mix_precision.fp32_main_grad=true optimizer.fp32_main_params=true
       fsdp_config.enable_offload=true fsdp_config.requires_grad_sync=false
       fsdp_config.reshard_after_backward=false)

peak() { # run key: the largest value of `key` over the steps
    python3 -c "import json,sys; print(max(json.loads(l)['$2'] for l in open('$work/$1/metrics.jsonl')))"
}

hs_train one 1 "${combo[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/one.txt"
hs_train fsdp2 2 fsdp_config.dp_shard_size=2 "${combo[@]}"
hs_train hsdp 4 fsdp_config.dp_shard_size=2 "${combo[@]}"
grep -q "shard degree 2, replicate degree 2" "$work/hsdp.txt"
hs_compare_runs one fsdp2 1e-3
hs_compare_runs one hsdp 1e-3
# Muon updates the fp32 main params just the same, on row shards that
# gather each hidden matrix's update for Newton-Schulz
main=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32
      fsdp_config.mix_precision.fp32_main_grad=true optimizer.fp32_main_params=true
      optimizer._target_=muon)
hs_train muon1 1 "${main[@]}"
hs_train muon2 2 fsdp_config.dp_shard_size=2 "${main[@]}"
hs_compare_runs muon1 muon2 1e-3

# offload against the same run without it: same weights bit for bit, the
# device peak lower, host memory in use, H2D/D2H on the copy lane
hs_train on 2 fsdp_config.dp_shard_size=2 fsdp_config.enable_offload=true trace.enabled=true
hs_train off 2 fsdp_config.dp_shard_size=2
hs_compare_runs off on 0
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
