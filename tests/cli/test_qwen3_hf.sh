#!/usr/bin/env bash
# Qwen3 against Hugging Face transformers without torch: a random
# Qwen3ForCausalLM written by transformers (tests/data/qwen3_hf, made with
# its logits and loss by tests/reference/make_qwen3_reference.py) is
# imported by `hypershard import`, re-exported bit for bit with a Qwen3
# config.json, and `hypershard train --init-from` computes transformers'
# loss, logits and every parameter's gradient (q_norm and k_norm among
# them) on the 4 sequences of tests/data/parity_tokens.hstk within 1e-4
# (relative to |loss| and to each tensor's largest magnitude). Negative
# controls: RoPE base 1e4 instead of 1e6, and arch llama (no q_norm /
# k_norm), must not pass.
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch qwen3_hf
data=$HS_SRC/tests/data
hf=$data/qwen3_hf

run_logged "$work/import.txt" "$HS_BIN" import "$hf" --out "$work/export"
grep -q "matches $hf/config.json: qwen3 model, 25 parameters" "$work/import.txt" ||
    die "import: $(tail -2 "$work/import.txt")"
python3 - "$hf" "$work/export" <<'PY'
import json, struct, sys

def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items()}

src, out = sys.argv[1], sys.argv[2]
a, b = tensors(src + "/model.safetensors"), tensors(out + "/model.safetensors")
assert a.keys() == b.keys(), set(a) ^ set(b)
for k in a:
    assert a[k] == b[k], f"{k} differs after import and export"
assert a["model.layers.0.self_attn.q_norm.weight"][1] == [16]
cfg = json.load(open(out + "/config.json"))
want = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16,
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False}
for k, v in want.items():
    assert cfg[k] == v, (k, cfg.get(k), v)
print(f"  import + export: {len(a)} tensors bit for bit, config.json Qwen3ForCausalLM")
PY

# train NAME ARGS...: one step from the imported weights, dumped.
train() {
    local name=$1
    shift
    run_logged "$work/$name.txt" "$HS_BIN" train "$data/parity_qwen3.yaml" \
        "data.path=$data/parity_tokens.hstk" --init-from "$hf" "train.out_dir=$work/$name" \
        --dump "$work/$name/dump" "$@"
}
# check NAME: the run's loss and dumped logits against transformers'.
check() {
    python3 - "$data/ref_qwen3_hf.safetensors" "$work/$1" <<'PY'
import json, struct, sys

def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    out = {}
    for k, v in head.items():
        assert v["dtype"] == "F32", (path, k)
        a, b = v["data_offsets"]
        out[k] = (v["shape"], struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b]))
    return out, meta

ref, _ = tensors(sys.argv[1])
run = sys.argv[2]
loss = json.loads(open(run + "/metrics.jsonl").readline())["loss"]
want = ref["loss"][1][0]
loss_err = abs(loss - want) / abs(want)
dumped, meta = tensors(run + "/dump/logits-step1.safetensors")
seq = int(meta["sequence"])
(S, T, V), logits = ref["logits"]
want_l = logits[seq * T * V:(seq + 1) * T * V]
ours = dumped["logits"][1]
assert len(ours) == len(want_l), (len(ours), len(want_l))
err = max(abs(p - q) for p, q in zip(ours, want_l)) / max(abs(q) for q in want_l)
grads, _ = tensors(run + "/dump/grads-step1.safetensors")
names = {k[len("grad."):] for k in ref if k.startswith("grad.")}
assert names == set(grads), names ^ set(grads)
worst, where = 0.0, ""
for k in sorted(names):
    g, w = grads[k], ref["grad." + k]
    assert g[0] == w[0], (k, g[0], w[0])
    e = max(abs(p - q) for p, q in zip(g[1], w[1])) / max(abs(q) for q in w[1])
    if e >= worst:
        worst, where = e, k
print(f"  {run.split('/')[-1]}: loss {loss:.6f} vs transformers {want:.6f} (rel {loss_err:.1e}), "
      f"logits of sequence {seq} max rel {err:.1e}, {len(names)} gradients max rel {worst:.1e} "
      f"({where})")
sys.exit(0 if max(loss_err, err, worst) < 1e-4 else 1)
PY
}

train hf
check hf || die "hypershard's Qwen3 differs from transformers'"
train rope model.rope_theta=10000.0
if check rope; then die "a RoPE base of 1e4 passed the comparison"; fi
# without q_norm / k_norm the import itself may refuse the extra tensors
rc=0
"$HS_BIN" train "$data/parity_qwen3.yaml" "data.path=$data/parity_tokens.hstk" --init-from "$hf" \
    model.arch=llama "train.out_dir=$work/llama" --dump "$work/llama/dump" \
    > "$work/llama.txt" 2>&1 || rc=$?
if [ "$rc" = 0 ] && check llama; then die "arch llama passed the comparison"; fi
echo ok
