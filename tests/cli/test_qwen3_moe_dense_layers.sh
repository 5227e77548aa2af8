#!/usr/bin/env bash
# Qwen3-MoE with dense blocks among the MoE ones (model.moe.mlp_only_layers,
# model.moe.decoder_sparse_step: Hugging Face's rule, block i has experts
# when it is not listed and (i + 1) % decoder_sparse_step is 0). A 4-block
# model with blocks 0 and 2 dense (mlp.gate_proj / up_proj / down_proj of
# model.ffn_dim) and 1 and 3 MoE (8 experts of 24, top 2) has exactly
# those parameters, routes tokens only in blocks 1 and 3 (expert_tokens
# rows 0 and 2 are zero), and trained in every parallel layout matches the
# one-process run within 5e-5 (fp32): loss and grad norm of 3 steps, every
# gradient of step 1, every weight after steps 1 and 2, the logits step 2
# starts from and the exported model, with the aux loss and expert rows
# equal. Layouts: FSDP 2, FSDP 2 with activation checkpointing, EP 2, TP 2
# with sequence parallel, PP 2 (1F1B), PP 2 with zb1p's split backward, and
# PP 2 with pp_layers [1, 3] (a stage with no MoE block). decoder_sparse_step
# 2 gives the same network as mlp_only_layers [0, 2]; mlp_only_layers []
# is another network (the comparison can fail). The export writes the
# layers to config.json and `hypershard import` reads them back bit for
# bit; generate's KV cache gives the full forward's text. Refused with
# exit 2: dense layers with arch moe, an index outside the model, no MoE
# block left.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 240
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch qwen3_moe_dense
tiny=("${HS_FSDP_TINY[@]}" model.n_layers=4 model.arch=qwen3_moe model.head_dim=16
      model.n_kv_heads=2 model.moe.num_experts=8 model.moe.top_k=2 model.moe.expert_ffn_dim=24
      model.moe.norm_topk_prob=false model.moe.aux_loss_coef=0.01 'model.moe.mlp_only_layers=[0,2]'
      optimizer.eps=1e-3 train.global_batch_size=4)
files=("${HS_DUMP_FILES[@]}")
compare() { hs_compare_moe_runs "$1" "$2" 5e-5; }

hs_train_dump one2 1
hs_train_dump one4 1 train.micro_batch_size=4

# the parameters and the routing of the dense and MoE blocks
python3 - "$work/one2" <<'PY'
import json, struct, sys
d = sys.argv[1]
raw = open(d + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
names = set(json.loads(raw[8:8 + n])) - {"__metadata__"}
for i in range(4):
    dense = {f"model.layers.{i}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
    moe = {f"model.layers.{i}.mlp.gate.weight"} | {
        f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
        for e in range(8) for p in ("gate_proj", "up_proj", "down_proj")}
    want, other = (dense, moe) if i in (0, 2) else (moe, dense)
    assert want <= names, (i, sorted(want - names))
    assert not (other & names), (i, sorted(other & names))
shape = json.loads(raw[8:8 + n])["model.layers.0.mlp.gate_proj.weight"]["shape"]
assert shape == [40, 32], shape
for line in open(d + "/metrics.jsonl"):
    tok = json.loads(line)["expert_tokens"]
    assert len(tok) == 4 and not any(tok[0]) and not any(tok[2]), tok
    assert sum(tok[1]) == sum(tok[3]) == 4 * 16 * 2, tok  # batch x seq x top_k
print("  blocks 0 and 2 dense, 1 and 3 routed")
PY
grep -q '"aux_loss":0.0[1-9]' "$work/one4/metrics.jsonl" ||
    die "one4: no aux loss in $(head -1 "$work/one4/metrics.jsonl")"

hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2
compare one4 fsdp2
hs_train_dump fsdp2_ac 2 fsdp_config.dp_shard_size=2 train.activation_checkpointing=true
compare one4 fsdp2_ac
hs_train_dump ep2 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2
hs_train_dump tp2_sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one2 tp2_sp
hs_train_dump pp2 2 accelerator.pp_size=2
compare one2 pp2
hs_train_dump pp2_zb 2 accelerator.pp_size=2 accelerator.pp_schedule=zb1p
compare one2 pp2_zb
hs_train_dump pp2_13 2 accelerator.pp_size=2 'accelerator.pp_layers=[1,3]'
compare one2 pp2_13

# the same network by decoder_sparse_step; another without dense blocks
hs_train_dump step2 1 'model.moe.mlp_only_layers=[]' model.moe.decoder_sparse_step=2
hs_compare_runs one2 step2 0 "${files[@]}"
hs_train_dump all_moe 1 'model.moe.mlp_only_layers=[]'
if hs_compare_runs one2 all_moe 5e-5 dump/logits-step2.safetensors >/dev/null 2>&1; then
    die "mlp_only_layers [] matched [0, 2]"
fi

# Hugging Face config.json: written by export, read back by import
run_logged "$work/export.txt" "$HS_BIN" export --run "$work/one2" --safetensors "$work/hf"
python3 - "$work/hf/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "qwen3_moe", c["model_type"]
assert c["mlp_only_layers"] == [0, 2] and c["decoder_sparse_step"] == 1, c
assert c["intermediate_size"] == 40 and c["moe_intermediate_size"] == 24, c
PY
run_logged "$work/import.txt" "$HS_BIN" import "$work/hf" --out "$work/reexport"
grep -q "qwen3_moe model" "$work/import.txt" || die "import: $(tail -2 "$work/import.txt")"
cmp "$work/hf/model.safetensors" "$work/reexport/model.safetensors" ||
    die "the re-exported weights differ"
cmp "$work/hf/config.json" "$work/reexport/config.json" || die "the re-exported config differs"

# generate: the KV cache's text is the full forward's
gen() {
    "$HS_BIN" generate --run "$work/one2" --prompt "the " --max-new-tokens 24 "$@" 2>/dev/null
}
cached=$(gen) full=$(gen --no-kv-cache)
[ -n "$cached" ] && [ "$cached" = "$full" ] || die "generate: cache '$cached', full '$full'"

# refusals
hs_expect_exit 2 arch_moe "Qwen3-MoE's" train "${tiny[@]}" model.arch=moe \
    model.moe.norm_topk_prob=true train.out_dir="$work/no1"
hs_expect_exit 2 outside "mlp_only_layers\[1\] = 7" train "${tiny[@]}" \
    'model.moe.mlp_only_layers=[0,7]' train.out_dir="$work/no2"
hs_expect_exit 2 none_left "no block of the 4 with experts" train "${tiny[@]}" \
    model.moe.decoder_sparse_step=5 'model.moe.mlp_only_layers=[]' train.out_dir="$work/no3"
for d in no1 no2 no3; do [ ! -e "$work/$d" ] || fail "$d: a refused run wrote $work/$d"; done
hs_finish
