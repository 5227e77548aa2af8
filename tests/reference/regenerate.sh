#!/usr/bin/env bash
# Rewrites tests/data/ref_{llama,moe}_{adamw,muon}.safetensors: for each
# tiny config and optimizer, a 2-step `hypershard train --dump` gives the
# initial weights and the resolved config, and make_reference.py replays
# the same two steps in PyTorch. Needs python3-torch and python3-yaml
# (Debian) for /usr/bin/python3. See tests/reference/README.md.
#
#   tests/reference/regenerate.sh build/hypershard
set -euo pipefail
bin=$(realpath "${1:?usage: regenerate.sh path/to/hypershard}")
src=$(cd "$(dirname "$0")/../.." && pwd)
python=${HS_TORCH_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/hs_reference_XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
for model in llama moe; do
    for opt in adamw muon; do
        lr=$([ "$opt" = muon ] && echo 0.02 || echo 0.003)
        run=$work/$model-$opt
        "$bin" train "$src/tests/data/parity_$model.yaml" "data.path=$src/tests/data/parity_tokens.hstk" \
            "optimizer._target_=$opt" "optimizer.lr=$lr" "train.out_dir=$run/run" \
            --dump "$run/dump" > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
        "$python" "$src/tests/reference/make_reference.py" --run "$run/run" --dump "$run/dump" \
            --out "$src/tests/data/ref_${model}_${opt}.safetensors"
    done
done
