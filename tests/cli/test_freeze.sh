#!/usr/bin/env bash
# train.freeze (fine-tuning, RFC 000 §8.5 frozen parameters): with the
# embedding and block 0 frozen, FSDP 2, HSDP 2x2, TP 2 and PP 2 match one
# process with the same freeze within 1e-5 (loss, grad norm, step-1
# gradients, weights, logits, export); the frozen tensors are bit for bit
# the initial ones after training and their dumped gradients are zero,
# while every other tensor moved; under FSDP 2 the frozen parameters get
# no reduce-scatter (block 0's unit issues none: 7 fewer per micro-batch
# than without the freeze) and a checkpoint holds no optimizer state for
# them; the --init-from + freeze path trains from given weights. A pattern
# that matches nothing, one that matches an MoE parameter, and freeze with
# comm_fusion exit 2 naming the pattern or the keys.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch freeze
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8
      'train.freeze=[model.embed_tokens.*,model.layers.0.*]')
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }

hs_train_dump one 1
hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2 trace.enabled=true checkpoint.dir="$work/ck"
compare one fsdp2
hs_train_dump hsdp 4 fsdp_config.dp_shard_size=2
compare one hsdp
hs_train_dump tp2 2 accelerator.tp_size=2
compare one tp2
hs_train_dump pp2 2 accelerator.pp_size=2
compare one pp2

python3 - "$work" <<'PY'
import fnmatch, json, struct, sys
work = sys.argv[1]

def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__"}

frozen = lambda k: any(fnmatch.fnmatch(k, p) for p in ("model.embed_tokens.*", "model.layers.0.*"))
for run in ("one", "fsdp2", "pp2"):
    w0 = tensors(f"{work}/{run}/dump/weights-step0.safetensors")
    end = tensors(f"{work}/{run}/model.safetensors")
    g1 = tensors(f"{work}/{run}/dump/grads-step1.safetensors")
    nf = 0
    for k in w0:
        if frozen(k):
            nf += 1
            assert end[k] == w0[k], f"{run}: frozen {k} changed"
            assert not any(struct.unpack(f"<{len(g1[k]) // 4}f", g1[k])), f"{run}: {k} has a gradient"
        else:
            assert end[k] != w0[k], f"{run}: {k} did not train"
    assert nf == 10, nf
    print(f"{run}: {nf} frozen tensors bit for bit unchanged, zero gradients; the others trained")
PY

# block 0 is one unit: 9 parameters (7 sharded matrices); with the freeze
# its backward issues no reduce-scatter
hs_train_dump nofreeze 2 fsdp_config.dp_shard_size=2 trace.enabled=true 'train.freeze=[]'
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def rs(run):
    t = json.load(open(f"{work}/{run}/trace/trace.json"))
    ev = t["traceEvents"] if isinstance(t, dict) else t
    return sum(1 for e in ev if e.get("cat") == "comm" and e["pid"] == 0
               and e["name"] == "reduce_scatter")
a, b = rs("nofreeze"), rs("fsdp2")
# 3 steps x 2 micro-batches: the embedding (1) and block 0's 9 parameters
assert a - b == 6 * 10, (a, b)
print(f"reduce-scatters per rank: {a} without the freeze, {b} with it (10 parameters x 6 backwards fewer)")
PY
"$HS_BIN" ckpt inspect "$work/ck" > "$work/inspect.log" 2>&1 || fail "ckpt inspect failed"
grep -q "optim.model.layers.1.mlp.up_proj.weight.exp_avg" "$work/inspect.log" ||
    fail "the checkpoint lacks a trained parameter's optimizer state"
grep -q "optim.model.layers.0.\|optim.model.embed_tokens" "$work/inspect.log" &&
    fail "the checkpoint holds optimizer state for a frozen parameter"
# fine-tuning: start from the exported weights, embedding frozen
hs_train init 2 fsdp_config.dp_shard_size=2 --init-from "$work/one" 'train.freeze=[model.embed_tokens.weight]'
grep -q "loaded weights from $work/one" "$work/init.txt" || fail "--init-from was not used"

expect_refused() { # NAME PATTERN OVERRIDES...: exit 2, nothing written
    local name=$1 pat=$2
    shift 2
    hs_expect_exit 2 "$name" "$pat" train "${HS_FSDP_TINY[@]}" train.out_dir="$work/$name" "$@"
    [ ! -e "$work/$name" ] || fail "$name: out_dir written"
}
expect_refused nomatch "train.freeze\[0\] = 'model.layer.*' matches no parameter" 'train.freeze=[model.layer.*]'
expect_refused moe "matches model.layers.0.block_sparse_moe.gate.weight, a parameter of the MoE layer" \
    model.arch=moe 'train.freeze=[model.layers.0.block_sparse_moe.*]'
expect_refused fusion "train.freeze with fsdp_config.comm_fusion: true" fsdp_config.comm_fusion=true \
    'train.freeze=[model.norm.weight]'
hs_finish
