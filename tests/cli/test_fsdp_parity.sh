#!/usr/bin/env bash
# `mpiexec -n W hypershard train` under FSDP / HSDP matches the one-process
# run on the same global batch: loss and grad norm of every step, every
# gradient of step 1, every weight after steps 1, 2 and 3 and the logits,
# within 1e-5 relative to each tensor's largest value (fp32). Covers pure FSDP over 2 and 3
# ranks (uneven shards at W=3), HSDP 2x2 with replicate_params, an MoE model
# over 2 ranks, and the log lines that say whether FSDP was wrapped or skipped.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
set -euo pipefail
work=$(mktemp -d /tmp/hs_cli_fsdp_XXXXXX)
trap 'rm -rf "$work"' EXIT
# eps 1e-6: see tests/mpi/test_fsdp_parity.c (Adam's conditioning at eps 1e-8)
tiny=(model.dim=32 model.n_layers=2 model.n_heads=4 model.n_kv_heads=1 model.ffn_dim=40
      train.seq_len=16 train.micro_batch_size=2 train.steps=3 train.eval_every=0
      optimizer.eps=1e-6 optimizer.schedule.warmup_steps=0)

train() { # name ranks args...
    local name=$1 n=$2
    shift 2
    if [ "$n" = 1 ]; then
        "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" --dump "$work/$name/dump" \
            > "$work/$name.txt" 2>&1 \
            || { cat "$work/$name.txt"; exit 1; }
    else
        "$MPIEXEC" -n "$n" "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" \
            --dump "$work/$name/dump" > "$work/$name.txt" 2>&1 || { cat "$work/$name.txt"; exit 1; }
    fi
}

compare() { # reference run
    python3 - "$work/$1" "$work/$2" <<'PY'
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
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out

ref, run = sys.argv[1], sys.argv[2]
a, b = metrics(ref), metrics(run)
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel < 1e-5, f"{run}: step {x['step']} {k} {y[k]} vs one process {x[k]} (rel {rel:.2e})"
worst, n = 0.0, 0
# the exported model, the step-1 gradient (before clipping), the weights after
# steps 1 and 2 (from --dump), and the logits step 2 starts from
files = ["model.safetensors", "dump/grads-step1.safetensors", "dump/weights-step1.safetensors",
         "dump/weights-step2.safetensors", "dump/logits-step2.safetensors"]
for f in files:
    ta, tb = tensors(ref + "/" + f), tensors(run + "/" + f)
    assert ta.keys() == tb.keys(), (f, set(ta) ^ set(tb))
    for k in ta:
        scale = max(abs(v) for v in ta[k]) or 1.0
        err = max(abs(p - q) for p, q in zip(ta[k], tb[k])) / scale
        assert err < 1e-5, f"{run}: {f} {k} differs by {err:.2e} relative"
        worst = max(worst, err)
        n += 1
print(f"{run.split('/')[-1]}: 3 steps, {n} tensors compared, worst error {worst:.2e}")
PY
}

train one8 1 train.global_batch_size=8
grep -q "fsdp: skipped: world size 1" "$work/one8.txt"
train fsdp2 2 train.global_batch_size=8 fsdp_config.dp_shard_size=2
grep -q "fsdp: wrapped 2 transformer blocks and the root" "$work/fsdp2.txt"
grep -q "shard degree 2, replicate degree 1" "$work/fsdp2.txt"
compare one8 fsdp2
train hsdp 4 train.global_batch_size=8 fsdp_config.dp_shard_size=2 \
    'fsdp_config.replicate_params=[model.norm.weight,model.layers.0.mlp.up_proj.weight]'
grep -q "shard degree 2, replicate degree 2; 2 replicate_params" "$work/hsdp.txt"
compare one8 hsdp
train one12 1 train.global_batch_size=12
train fsdp3 3 train.global_batch_size=12 fsdp_config.dp_shard_size=3
compare one12 fsdp3
# MoE: routed experts as nested units. The load-balancing term is computed
# per data-parallel rank over its own tokens, so parity holds without it.
moe=(model.arch=moe model.moe.num_experts=3 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0 train.global_batch_size=8)
train moe1 1 "${moe[@]}"
train moe2 2 "${moe[@]}" fsdp_config.dp_shard_size=2
grep -q "fsdp: wrapped 2 transformer blocks + 2 expert units and the root" "$work/moe2.txt"
compare moe1 moe2
