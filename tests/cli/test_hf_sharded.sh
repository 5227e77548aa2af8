#!/usr/bin/env bash
# Sharded Hugging Face weights (save_pretrained above max_shard_size):
# tests/data/deepseek_v3_hf's model.safetensors split into three shards
# with a model.safetensors.index.json reads as the single file does —
# `hypershard import` matches it and re-exports the same bytes, `train
# --init-from` starts from the same weights (the same step-1 loss to the
# last digit) and `generate --run` gives the same text. An index that
# names a missing shard, puts a tensor in the wrong shard, leaves a
# shard's tensor out or names a file outside the directory is refused
# naming the index and the tensor or file (exit 1), writing nothing.
# HS_TEST_TIMEOUT: 60
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch hf_sharded
src=$HS_SRC/tests/data/deepseek_v3_hf
sharded=$work/sharded

# shard SRC OUT [MUTATION]: SRC's tensors in three files and an index
shard() {
    python3 - "$1" "$2" "${3:-}" <<'PY'
import json, os, shutil, struct, sys
src, out, mutation = sys.argv[1:4]
os.makedirs(out)
shutil.copy(src + "/config.json", out)
raw = open(src + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
head = json.loads(raw[8:8 + n])
head.pop("__metadata__", None)
names = sorted(head)
files = [f"model-{i + 1:05d}-of-00003.safetensors" for i in range(3)]
weight_map = {}
for i, f in enumerate(files):
    part, data, off = {}, b"", 0
    for k in names[i::3]:
        a, b = head[k]["data_offsets"]
        blob = raw[8 + n + a:8 + n + b]
        part[k] = {"dtype": head[k]["dtype"], "shape": head[k]["shape"],
                   "data_offsets": [off, off + len(blob)]}
        data += blob
        off += len(blob)
        weight_map[k] = f
    h = json.dumps(part).encode()
    h += b" " * (-len(h) % 8)
    open(f"{out}/{f}", "wb").write(struct.pack("<Q", len(h)) + h + data)
if mutation == "missing":
    os.remove(f"{out}/{files[2]}")
elif mutation == "wrong":
    weight_map[names[0]] = files[1]
elif mutation == "unlisted":
    del weight_map[names[1]]
elif mutation == "outside":
    weight_map[names[2]] = "../" + files[2]
json.dump({"metadata": {"total_size": len(raw) - 8 - n}, "weight_map": weight_map},
          open(out + "/model.safetensors.index.json", "w"))
print(names[{"wrong": 0, "unlisted": 1, "outside": 2}.get(mutation, 0)])
PY
}
shard "$src" "$sharded" > /dev/null
[ ! -e "$sharded/model.safetensors" ] || die "the sharded copy kept model.safetensors"

run_logged "$work/import.txt" "$HS_BIN" import "$sharded" --out "$work/imp"
grep -q "matches $sharded/config.json: deepseek_v3 model, 49 parameters" "$work/import.txt" ||
    die "import: $(tail -2 "$work/import.txt")"
grep -q "model.safetensors.index.json: 91 tensors" "$work/import.txt" ||
    die "import did not read the index: $(head -1 "$work/import.txt")"
python3 "$HS_SRC/tests/cli/hf_reference.py" same "$src" "$work/imp"

one=(data.path="$HS_SRC/tests/data/parity_tokens.hstk" data.source=tokens data.val_fraction=0.0
     train.steps=1 train.global_batch_size=4 train.micro_batch_size=4 train.seq_len=16
     train.eval_every=0)
for from in "$src" "$sharded"; do
    name=$(basename "$from")
    run_logged "$work/$name.txt" "$HS_BIN" train "$work/imp/config.yaml" "${one[@]}" \
        --init-from "$from" "train.out_dir=$work/run_$name"
done
python3 - "$work/run_deepseek_v3_hf/metrics.jsonl" "$work/run_sharded/metrics.jsonl" <<'PY' ||
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:])
for k in ("loss", "grad_norm", "expert_tokens"):
    assert a[k] == b[k], (k, a[k], b[k])
print(f"  --init-from the shards: loss {b['loss']}, grad norm {b['grad_norm']}, as the file's")
PY
    die "training from the shards differs"
cp "$work/imp/config.yaml" "$sharded/"
gen() { "$HS_BIN" generate --run "$1" --prompt "This bird" --max-new-tokens 16 2> /dev/null; }
[ "$(gen "$work/imp")" = "$(gen "$sharded")" ] || die "generate from the shards differs"

for m in missing wrong unlisted outside; do
    name=$(shard "$src" "$work/bad_$m" $m)
    rc=0
    "$HS_BIN" import "$work/bad_$m" --out "$work/bad_out" > "$work/bad_$m.log" 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "$m: exit $rc, want 1"
    case $m in
    missing) want="model-00003-of-00003.safetensors" ;;
    outside) want="gives tensor $name the file \"../model-00003-of-00003.safetensors\"" ;;
    *) want="tensor $name" ;;
    esac
    grep -q "model.safetensors.index.json" "$work/bad_$m.log" || [ $m = missing ] ||
        fail "$m: the index is not named: $(tail -1 "$work/bad_$m.log")"
    grep -qF "$want" "$work/bad_$m.log" || fail "$m: '$want' not in $(tail -1 "$work/bad_$m.log")"
    [ ! -e "$work/bad_out" ] || fail "$m: import wrote $work/bad_out"
done
hs_finish
