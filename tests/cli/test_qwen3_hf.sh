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
# k_norm), must not pass. The config.yaml that import writes beside the
# weights trains the same step with no model key given by hand.
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch qwen3_hf
data=$HS_SRC/tests/data
hf=$data/qwen3_hf

run_logged "$work/import.txt" "$HS_BIN" import "$hf" --out "$work/export"
grep -q "matches $hf/config.json: qwen3 model, 25 parameters" "$work/import.txt" ||
    die "import: $(tail -2 "$work/import.txt")"
python3 "$HS_SRC/tests/cli/hf_reference.py" same "$hf" "$work/export"
python3 - "$work/export" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1] + "/config.json"))
want = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16,
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False}
for k, v in want.items():
    assert cfg[k] == v, (k, cfg.get(k), v)
print("  config.json Qwen3ForCausalLM")
PY

# train NAME ARGS...: one step from the imported weights, dumped.
train() {
    local name=$1
    shift
    run_logged "$work/$name.txt" "$HS_BIN" train "$data/parity_qwen3.yaml" \
        "data.path=$data/parity_tokens.hstk" --init-from "$hf" "train.out_dir=$work/$name" \
        --dump "$work/$name/dump" "$@"
}
# check NAME: the run's loss, dumped logits and gradients against transformers'.
check() { python3 "$HS_SRC/tests/cli/hf_reference.py" check "$data/ref_qwen3_hf.safetensors" "$work/$1"; }

train hf
check hf || die "hypershard's Qwen3 differs from transformers'"

# import --out also wrote the run's config.yaml, its model section read
# from config.json: it resolves to the hand-written config's model, and
# training from it (the parity config's other sections as overrides)
# computes transformers' step.
[ -f "$work/export/config.yaml" ] || die "import --out wrote no config.yaml"
model_section() { "$HS_BIN" config "$1" | awk '/^[^ ]/ { on = ($0 == "model:") } on'; }
model_section "$work/export/config.yaml" > "$work/imported_model.yaml"
model_section "$data/parity_qwen3.yaml" > "$work/parity_model.yaml"
grep -q "arch: qwen3" "$work/imported_model.yaml" || die "no model section: $(head -3 "$work/imported_model.yaml")"
# (init_std is config.json's initializer_range, which the parity config leaves at its default)
grep -q "^  init_std: 0.1$" "$work/imported_model.yaml" || die "init_std is not initializer_range 0.1"
diff <(grep -v init_std "$work/parity_model.yaml") <(grep -v init_std "$work/imported_model.yaml") ||
    die "the imported config.yaml's model differs from parity_qwen3.yaml's"
run_logged "$work/yaml.txt" "$HS_BIN" train "$work/export/config.yaml" --init-from "$work/export" \
    optimizer.lr=0.001 optimizer.schedule.warmup_steps=0 optimizer.schedule.decay=constant \
    train.steps=1 train.global_batch_size=4 train.micro_batch_size=4 train.seq_len=16 \
    train.seed=1234 train.eval_every=0 train.log_every=1 data.source=tokens \
    "data.path=$data/parity_tokens.hstk" data.val_fraction=0.0 "train.out_dir=$work/yaml" \
    --dump "$work/yaml/dump"
check yaml || die "training from the imported config.yaml differs from transformers'"
train rope model.rope_theta=10000.0
if check rope; then die "a RoPE base of 1e4 passed the comparison"; fi
# without q_norm / k_norm the import itself may refuse the extra tensors
rc=0
"$HS_BIN" train "$data/parity_qwen3.yaml" "data.path=$data/parity_tokens.hstk" --init-from "$hf" \
    model.arch=llama "train.out_dir=$work/llama" --dump "$work/llama/dump" \
    > "$work/llama.txt" 2>&1 || rc=$?
if [ "$rc" = 0 ] && check llama; then die "arch llama passed the comparison"; fi
echo ok
