#!/usr/bin/env bash
# hypershard's single-process trainer against PyTorch: two optimizer steps
# of a tiny Llama and a tiny Mixtral MoE, each with AdamW and with Muon, on
# the fixed batch in tests/data, compared with the committed references
# tests/data/ref_*.safetensors (tests/reference/README.md) by
# tests/reference/compare.py (standard-library Python; no torch needed).
#
# fp32: losses (and MoE aux losses, grad norms) of steps 1 and 2, the step-1
# logits of one sequence, every step-1 gradient and every weight after step
# 2 within 1e-4 of the tensor's max |ref|; the two optimizer updates
# (weights minus initial weights) within 1e-3 of their max |ref|.
# bf16: the Llama/AdamW case with fsdp_config.mix_precision.param_dtype bf16
# (bf16 compute, fp32 parameters and optimizer), on one process and on 2 FSDP
# ranks, against the same fp32 reference: losses and grad norms within 1e-2;
# logits, gradients and weights within 2e-2 and updates within 1e-1 in
# relative L2 norm. And the fp32 case on 2 FSDP ranks at the fp32 tolerances.
# Negative control: a run with another RoPE base must fail the comparison.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -euo pipefail
work=$(mktemp -d /tmp/hs_cli_parity_XXXXXX)
trap 'rm -rf "$work"' EXIT
data=$HS_SRC/tests/data
compare=(python3 "$HS_SRC/tests/reference/compare.py")

train() { # name model optimizer [extra args...]
    local name=$1 model=$2 opt=$3
    shift 3
    local lr=0.003
    [ "$opt" = muon ] && lr=0.02
    "$HS_BIN" train "$data/parity_$model.yaml" "data.path=$data/parity_tokens.hstk" \
        "optimizer._target_=$opt" "optimizer.lr=$lr" "train.out_dir=$work/$name/run" "$@" \
        > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}

for model in llama moe; do
    for opt in adamw muon; do
        name=$model-$opt
        train "$name" "$model" "$opt" --dump "$work/$name/dump"
        for f in weights-step0 logits-step1 grads-step1 weights-step1 logits-step2 grads-step2 \
                 weights-step2; do
            [ -s "$work/$name/dump/$f.safetensors" ] || { echo "--dump lacks $f"; exit 1; }
        done
        echo "$name (fp32):"
        "${compare[@]}" --ref "$data/ref_${model}_${opt}.safetensors" --dump "$work/$name/dump" \
            --metrics "$work/$name/run/metrics.jsonl"
    done
done

bf16=(--metric l2 --tol 2e-2 --update-tol 1e-1 --scalar-tol 1e-2)
train llama-adamw-bf16 llama adamw fsdp_config.mix_precision.param_dtype=bf16 \
    --dump "$work/llama-adamw-bf16/dump"
echo "llama-adamw (bf16 compute, one process):"
"${compare[@]}" --ref "$data/ref_llama_adamw.safetensors" --dump "$work/llama-adamw-bf16/dump" \
    --metrics "$work/llama-adamw-bf16/run/metrics.jsonl" "${bf16[@]}"

# The same case on 2 FSDP ranks, fp32 and bf16 compute.
fsdp() { # name [extra args...]
    local name=$1
    shift
    "$MPIEXEC" -n 2 "$HS_BIN" train "$data/parity_llama.yaml" "data.path=$data/parity_tokens.hstk" \
        fsdp_config.dp_shard_size=2 "train.out_dir=$work/$name/run" --dump "$work/$name/dump" "$@" \
        > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
    grep -q "engine fsdp on 2 rank" "$work/$name.log"
}
fsdp llama-adamw-fsdp
echo "llama-adamw (fp32, 2 FSDP ranks):"
"${compare[@]}" --ref "$data/ref_llama_adamw.safetensors" --dump "$work/llama-adamw-fsdp/dump" \
    --metrics "$work/llama-adamw-fsdp/run/metrics.jsonl"
fsdp llama-adamw-fsdp-bf16 fsdp_config.mix_precision.param_dtype=bf16
echo "llama-adamw (bf16 compute, 2 FSDP ranks):"
"${compare[@]}" --ref "$data/ref_llama_adamw.safetensors" --dump "$work/llama-adamw-fsdp-bf16/dump" \
    --metrics "$work/llama-adamw-fsdp-bf16/run/metrics.jsonl" "${bf16[@]}"

# The comparison has teeth: RoPE base 1000 instead of 10000 must be caught.
train control llama adamw model.rope_theta=1000.0 --dump "$work/control/dump"
if "${compare[@]}" --ref "$data/ref_llama_adamw.safetensors" --dump "$work/control/dump" \
    --metrics "$work/control/run/metrics.jsonl" > "$work/control.txt"; then
    cat "$work/control.txt"
    echo "a run with model.rope_theta=1000 passed the parity check"
    exit 1
fi
grep -q "FAIL logits" "$work/control.txt"

echo "torch parity: all passed"
