#!/usr/bin/env bash
# DeepSeek-V3 against Hugging Face transformers without torch: two random
# DeepseekV3ForCausalLM written by transformers (made with their logits,
# cross-entropy and gradients by tests/reference/make_deepseek_v3_reference.py):
# tests/data/deepseek_v3_hf (multi-head latent attention with q_lora_rank
# 24, DeepSeek's interleaved rope rows; a dense first layer and two of 8
# routed experts in 4 groups with a shared expert and a correction bias) and
# tests/data/deepseek_v3_noq_hf (q_proj without compression, rotate_half
# rope rows, YaRN with mscale_all_dim). `hypershard import` reads each
# config.json, re-exports the weights bit for bit and writes config.yaml;
# `hypershard train` of that config with --init-from computes transformers'
# cross-entropy, logits and every parameter's gradient on the 4 sequences
# of tests/data/parity_tokens.hstk within 1e-4, and `hypershard generate`
# (its latent KV cache on one process, under TP 2 and under PP 2, and
# without a cache) continues "This bird" with the 32 tokens of
# transformers' greedy generate. Negative controls that must
# not pass: the interleaved file read as rotate_half rows, and YaRN's
# softmax factor left out.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch deepseek_v3_hf
data=$HS_SRC/tests/data
one=(data.path="$data/parity_tokens.hstk" data.source=tokens data.val_fraction=0.0
     train.steps=1 train.global_batch_size=4 train.micro_batch_size=4 train.seq_len=16
     train.eval_every=0 train.log_every=1 optimizer.schedule.warmup_steps=0)

# model NAME PARAMS: import, the export bit for bit, one dumped step
# against the reference; then check_as RUN ARGS... for variants
model() {
    local name=$1 params=$2 hf=$data/$1
    run_logged "$work/$name.import.txt" "$HS_BIN" import "$hf" --out "$work/$name"
    grep -q "matches $hf/config.json: deepseek_v3 model, $params parameters" \
        "$work/$name.import.txt" || die "import: $(tail -2 "$work/$name.import.txt")"
    python3 "$HS_SRC/tests/cli/hf_reference.py" same "$hf" "$work/$name"
    train "$name" "$name.run"
    check "$name" "$name.run" || die "hypershard's $name differs from transformers'"
}
# greedy NAME ARGS...: generate's 32 tokens after "This bird" equal
# transformers' greedy generate's (the reference's `generate`)
greedy() {
    local name=$1 launch=()
    shift
    if [ "${1:-}" = "-n" ]; then
        launch=("$MPIEXEC" -n "$2")
        shift 2
    fi
    "${launch[@]}" "$HS_BIN" generate --run "$work/$name" --prompt "This bird" --max-new-tokens 32 "$@" \
        > "$work/$name.gen" 2> "$work/$name.gen.err" || die "generate: $(tail -2 "$work/$name.gen.err")"
    python3 - "$data/ref_$name.safetensors" "$work/$name.gen" <<'PY' || die "$name: generate differs"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
a, b = json.loads(raw[8:8 + n])["generate"]["data_offsets"]
want = [int(x) for x in struct.unpack("<32f", raw[8 + n + a:8 + n + b])]
got = list(open(sys.argv[2], "rb").read()[len(b"This bird"):][:32])
assert got == want, (got, want)
print(f"  generate: the 32 tokens transformers' greedy generate gives")
PY
}
train() {
    local name=$1 run=$2
    shift 2
    run_logged "$work/$run.txt" "$HS_BIN" train "$work/$name/config.yaml" "${one[@]}" \
        --init-from "$data/$name" "train.out_dir=$work/$run" --dump "$work/$run/dump" "$@"
}
check() { python3 "$HS_SRC/tests/cli/hf_reference.py" check "$data/ref_$1.safetensors" "$work/$2"; }

model deepseek_v3_hf 49
grep -q "rope_interleave: true" "$work/deepseek_v3_hf/config.yaml" || die "no rope_interleave"
python3 - "$work/deepseek_v3_hf/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
want = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
        "v_head_dim": 12, "rope_interleave": True, "n_routed_experts": 8, "n_shared_experts": 1,
        "moe_intermediate_size": 24, "first_k_dense_replace": 1, "n_group": 4,
        "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True}
for k, v in want.items():
    assert cfg[k] == v, (k, cfg.get(k), v)
print("  config.json DeepseekV3ForCausalLM")
PY
greedy deepseek_v3_hf
greedy deepseek_v3_hf --no-kv-cache
greedy deepseek_v3_hf -n 2 accelerator.tp_size=2
greedy deepseek_v3_hf -n 2 accelerator.pp_size=2
train deepseek_v3_hf halves model.mla.rope_interleave=false
if check deepseek_v3_hf halves > /dev/null; then die "the interleaved rope rows were ignored"; fi

model deepseek_v3_noq_hf 43
grep -q "q_lora_rank: 0" "$work/deepseek_v3_noq_hf/config.yaml" || die "q_lora_rank not 0"
greedy deepseek_v3_noq_hf
train deepseek_v3_noq_hf no_mscale model.rope_scaling.mscale_all_dim=0
if check deepseek_v3_noq_hf no_mscale > /dev/null; then die "YaRN's softmax factor was ignored"; fi
echo ok
