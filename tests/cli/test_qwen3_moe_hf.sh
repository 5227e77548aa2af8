#!/usr/bin/env bash
# Qwen3-MoE against Hugging Face transformers without torch: a random
# Qwen3MoeForCausalLM written by transformers (tests/data/qwen3_moe_hf, 8
# experts, top 2, norm_topk_prob false; made with its logits, losses and
# gradients by tests/reference/make_qwen3_moe_reference.py) is imported by
# `hypershard import`, re-exported bit for bit with a Qwen3-MoE config.json,
# and `hypershard train --init-from` computes transformers' cross-entropy,
# aux term (router_aux_loss_coef x load-balancing loss), logits and every
# parameter's gradient (router and experts among them) on the 4 sequences
# of tests/data/parity_tokens.hstk within 1e-4 (relative to each value and
# to each tensor's largest magnitude). With model.moe.norm_topk_prob=true
# it matches transformers' norm_topk_prob true instead. Negative controls:
# either setting against the other's reference, and arch moe (no q_norm /
# k_norm, Mixtral's names), must not pass. Dense layers mixed in
# (tests/data/qwen3_moe_dense_hf, mlp_only_layers [0]) import, re-export
# and match transformers' logits, losses and gradients alike. So does
# DeepSeek-V3's router (tests/data/qwen3_moe_router_hf: transformers'
# DeepseekV3TopkRouter in each block, a correction bias in the file).
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch qwen3_moe_hf
data=$HS_SRC/tests/data
hf=$data/qwen3_moe_hf

run_logged "$work/import.txt" "$HS_BIN" import "$hf" --out "$work/export"
grep -q "matches $hf/config.json: qwen3_moe model, 27 parameters" "$work/import.txt" ||
    die "import: $(tail -2 "$work/import.txt")"
python3 "$HS_SRC/tests/cli/hf_reference.py" same "$hf" "$work/export"
python3 - "$work/export" <<'PY'
import json, sys
out = sys.argv[1]
cfg = json.load(open(out + "/config.json"))
want = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 16,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "router_aux_loss_coef": 0.01, "rope_theta": 1000000.0, "use_sliding_window": False}
for k, v in want.items():
    assert cfg[k] == v, (k, cfg.get(k), v)
print("  config.json Qwen3MoeForCausalLM")
PY

# train NAME ARGS...: one step from the imported weights, dumped.
train() {
    local name=$1
    shift
    run_logged "$work/$name.txt" "$HS_BIN" train "$data/parity_qwen3_moe.yaml" \
        "data.path=$data/parity_tokens.hstk" --init-from "$hf" "train.out_dir=$work/$name" \
        --dump "$work/$name/dump" "$@"
}
# check NAME REF: the run's losses, dumped logits and (when REF has them)
# gradients against transformers'.
check() { python3 "$HS_SRC/tests/cli/hf_reference.py" check "$data/$2" "$work/$1"; }

train hf
check hf ref_qwen3_moe_hf.safetensors || die "hypershard's Qwen3-MoE differs from transformers'"
train norm model.moe.norm_topk_prob=true
check norm ref_qwen3_moe_hf_norm.safetensors ||
    die "norm_topk_prob true differs from transformers'"
if check hf ref_qwen3_moe_hf_norm.safetensors; then die "norm_topk_prob was ignored"; fi
if check norm ref_qwen3_moe_hf.safetensors; then die "norm_topk_prob was ignored"; fi
# without q_norm / k_norm and with Mixtral's names the import itself may refuse
rc=0
"$HS_BIN" train "$data/parity_qwen3_moe.yaml" "data.path=$data/parity_tokens.hstk" \
    --init-from "$hf" model.arch=moe model.moe.norm_topk_prob=true "train.out_dir=$work/moe" \
    --dump "$work/moe/dump" > "$work/moe.txt" 2>&1 || rc=$?
if [ "$rc" = 0 ] && check moe ref_qwen3_moe_hf_norm.safetensors; then
    die "arch moe passed the comparison"
fi

# dense layers mixed in (tests/data/qwen3_moe_dense_hf: mlp_only_layers [0],
# layer 0 a dense MLP of intermediate_size 48): import reads the layers and
# re-exports the config and weights bit for bit; trained with the same
# model.moe.mlp_only_layers it matches transformers; without them the
# tensors do not fit and --init-from refuses
dense=$data/qwen3_moe_dense_hf
run_logged "$work/dense_import.txt" "$HS_BIN" import "$dense" --out "$work/dense_export"
grep -q "matches $dense/config.json: qwen3_moe model, 26 parameters" "$work/dense_import.txt" ||
    die "import: $(tail -2 "$work/dense_import.txt")"
python3 "$HS_SRC/tests/cli/hf_reference.py" same "$dense" "$work/dense_export"
python3 - "$dense/config.json" "$work/dense_export/config.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for k in ("mlp_only_layers", "decoder_sparse_step", "intermediate_size", "moe_intermediate_size"):
    assert a[k] == b[k], (k, a[k], b[k])
PY
hf=$dense
train dense 'model.moe.mlp_only_layers=[0]'
check dense ref_qwen3_moe_dense_hf.safetensors || die "the dense-layer model differs from transformers'"
if check hf ref_qwen3_moe_dense_hf.safetensors >/dev/null 2>&1; then
    die "the all-MoE run matched the dense one"
fi
rc=0
"$HS_BIN" train "$data/parity_qwen3_moe.yaml" "data.path=$data/parity_tokens.hstk" \
    --init-from "$dense" "train.out_dir=$work/no_dense" > "$work/no_dense.txt" 2>&1 || rc=$?
[ "$rc" != 0 ] || die "--init-from without mlp_only_layers: exit 0"
grep -q "tensor model.layers.0.mlp.gate.weight .* is missing; the file was written for a" \
    "$work/no_dense.txt" || die "--init-from without mlp_only_layers: $(tail -2 "$work/no_dense.txt")"
[ ! -e "$work/no_dense" ] || die "the refused run wrote $work/no_dense"
# DeepSeek-V3's router (tests/data/qwen3_moe_router_hf: each block's gate
# is transformers' DeepseekV3TopkRouter, sigmoid scores, 4 groups of 2 of
# which 2 kept, norm_topk_prob true, routed_scaling_factor 2.5, a random
# e_score_correction_bias in the file): the same logits, cross-entropy and
# gradients (the bias's zero). Without the groups, with scale 1, or with
# the file's biases zeroed it must differ.
hf=$data/qwen3_moe_router_hf
ds=(model.moe.score_func=sigmoid model.moe.n_group=4 model.moe.topk_group=2
    model.moe.routed_scaling_factor=2.5 model.moe.norm_topk_prob=true model.moe.aux_loss_coef=0)
train router "${ds[@]}"
check router ref_qwen3_moe_router_hf.safetensors || die "DeepSeek-V3's router differs from transformers'"
train router_g1 "${ds[@]}" model.moe.n_group=1 model.moe.topk_group=1
train router_s1 "${ds[@]}" model.moe.routed_scaling_factor=1
for run in router_g1 router_s1; do
    if check $run ref_qwen3_moe_router_hf.safetensors > /dev/null; then die "$run matched"; fi
done
mkdir -p "$work/zero_bias"
python3 - "$hf/model.safetensors" "$work/zero_bias/model.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", raw[:8])
for k, v in json.loads(raw[8:8 + n]).items():
    if k.endswith(".e_score_correction_bias"):
        a, b = v["data_offsets"]
        raw[8 + n + a:8 + n + b] = bytes(b - a)
open(sys.argv[2], "wb").write(raw)
PY
hf=$work/zero_bias
train router_b0 "${ds[@]}"
if check router_b0 ref_qwen3_moe_router_hf.safetensors > /dev/null; then
    die "the correction bias was ignored"
fi
echo ok
