#!/usr/bin/env bash
# Export after a 3-step run writes Hugging Face safetensors + config.json that
# plain json + struct can parse; import checks them against the config; a
# run started --init-from the export with a vanishing lr saves bitwise the same
# weights. The MoE model's stacked experts leave as per-expert tensors and
# come back stacked.
# HS_TEST_TIMEOUT: 180
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch export
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.eval_every=0)
moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=48)

run() { run_logged "$work/log.txt" "$@"; }

check_hf() { # DIR ARCH: parse with json + struct only, as any reader could
python3 - "$1" "$2" <<'PY'
import json, struct, sys
d, arch = sys.argv[1], sys.argv[2]
raw = open(f"{d}/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
assert n % 8 == 0
assert header.pop("__metadata__") == {"format": "pt"}
data = raw[8 + n:]
end = 0
for name, t in header.items():
    b, e = t["data_offsets"]
    count = 1
    for s in t["shape"]:
        count *= s
    assert t["dtype"] == "F32" and e - b == 4 * count, name
    vals = struct.unpack(f"<{count}f", data[b:e])
    assert all(v == v for v in vals), f"{name} has NaN"
    end = max(end, e)
assert end == len(data), "data region has trailing bytes"
cfg = json.load(open(f"{d}/config.json"))
for k in ["architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
          "rope_theta", "tie_word_embeddings", "max_position_embeddings", "torch_dtype"]:
    assert k in cfg, k
assert header["model.embed_tokens.weight"]["shape"] == [256, 32]
assert header["model.layers.1.self_attn.k_proj.weight"]["shape"] == [16, 32]
if arch == "moe":
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["model_type"] == "mixtral"
    assert cfg["num_local_experts"] == 3 and cfg["num_experts_per_tok"] == 2
    assert cfg["intermediate_size"] == 48 and "router_aux_loss_coef" in cfg
    for j in range(3):
        assert header[f"model.layers.0.block_sparse_moe.experts.{j}.w1.weight"]["shape"] == [48, 32]
        assert header[f"model.layers.1.block_sparse_moe.experts.{j}.w2.weight"]["shape"] == [32, 48]
    assert header["model.layers.0.block_sparse_moe.gate.weight"]["shape"] == [3, 32]
    assert not any(k.endswith("experts.w1.weight") for k in header)
else:
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert header["model.layers.0.mlp.down_proj.weight"]["shape"] == [32, 64]
print(d, "ok:", len(header), "tensors")
PY
}

for arch in llama moe; do
    extra=()
    [ "$arch" = moe ] && extra=("${moe[@]}")
    run "$HS_BIN" train "${tiny[@]}" "${extra[@]}" train.steps=3 train.out_dir="$work/$arch/run"
    run "$HS_BIN" export --safetensors "$work/$arch/hf" --run "$work/$arch/run"
    check_hf "$work/$arch/hf" "$arch"
    # The trainer's own weights file is already in Hugging Face form.
    cmp "$work/$arch/run/model.safetensors" "$work/$arch/hf/model.safetensors"
    run "$HS_BIN" import "$work/$arch/hf" --out "$work/$arch/imported"
    grep -q "matches" "$work/log.txt"
    # lr 1e-30: AdamW moves no fp32 weight, so the saved weights are the loaded ones.
    run "$HS_BIN" train "${tiny[@]}" "${extra[@]}" train.steps=1 optimizer.lr=1e-30 optimizer.weight_decay=0 \
        train.out_dir="$work/$arch/again" --init-from "$work/$arch/imported"
    cmp "$work/$arch/hf/model.safetensors" "$work/$arch/again/model.safetensors"
done

# bfloat16 export halves the file and still parses.
run "$HS_BIN" export --safetensors "$work/bf16" --run "$work/llama/run" --dtype bfloat16
grep -q '"torch_dtype":"bfloat16"' "$work/bf16/config.json"

# A config that does not match the weights names the tensor and both shapes.
set +e
"$HS_BIN" export --safetensors "$work/int8" --run "$work/llama/run" --dtype int8 > "$work/bad_dt.txt" 2>&1
rc_dt=$?
"$HS_BIN" ckpt export "$work" --safetensors "$work/int8" --dtype int8 > "$work/bad_dt2.txt" 2>&1
rc_dt2=$?
"$HS_BIN" import "$work/llama/hf" model.dim=48 model.n_layers=2 > "$work/bad.txt" 2>&1
rc=$?
"$HS_BIN" train "${tiny[@]}" model.ffn_dim=80 train.steps=1 train.out_dir="$work/never" \
    --init-from "$work/llama/hf" > "$work/bad2.txt" 2>&1
rc2=$?
head -c 100 "$work/llama/hf/model.safetensors" > "$work/trunc.safetensors"
"$HS_BIN" import "$work" > "$work/bad3.txt" 2>&1
set -e
[ "$rc_dt" -eq 2 ] && grep -q "export: --dtype int8: expected float32, bfloat16 or float16" "$work/bad_dt.txt"
[ "$rc_dt2" -eq 2 ] && grep -q "ckpt export: --dtype int8: expected float32" "$work/bad_dt2.txt"
[ "$rc" -ne 0 ] && grep -q "model.embed_tokens.weight has shape \[256, 32\]" "$work/bad.txt" \
    || { echo "import mismatch:"; cat "$work/bad.txt"; exit 1; }
[ "$rc2" -ne 0 ] && grep -q "mlp.gate_proj.weight" "$work/bad2.txt" && [ ! -e "$work/never" ] \
    || { echo "init-from mismatch:"; cat "$work/bad2.txt"; exit 1; }
grep -q "model.safetensors" "$work/bad3.txt" || { cat "$work/bad3.txt"; exit 1; }
echo ok
