#!/usr/bin/env bash
# DeepSeek-V3's router (docs/moe.md): sigmoid scores, 8 experts in 4 groups
# of which each token keeps the 2 best, weights renormalised and times 2.5,
# aux-loss-free balancing (bias_update_speed 0.01, aux loss 0) and the
# sequence-wise balance loss (seq_aux_loss_coef 0.01, whose value, about
# 0.01 a block, every layout must log alike). Every
# layout matches the one-process run on the same global batch within 5e-5
# relative (fp32): FSDP 2 (and with activation checkpointing), EP 2, TP 2
# with sequence parallel, CP 2, PP 2
# (1F1B and ZB-V), and on 4 ranks EP 2 x EDP shard 2, HSDP 2 x 2, EP 2 x PP 2,
# PP 2 x TP 2 and CP 2 x TP 2 (both with sequence parallel), for 3
# steps: loss and grad norm of every step, step 1's gradients, the weights
# after steps 1 and 2, the logits and the export (whose correction biases
# must be equal to the last bit: a sign that flips is 2 x 0.01), and the
# expert loads of every step. Over 10 steps, EP 2 x EDP shard 2 and PP 2 x
# FSDP 2 end with one process's biases and curve, and so does a run
# resumed on one process from FSDP 2's step-5 checkpoint. The biases in the
# export equal those replayed from the loads in metrics.jsonl (b += 0.01
# sign(mean - load) after each step, in fp32) and moved, and survive export
# and import with the router's settings; with
# bias_update_speed 0 they stay zero, and a softmax router then has none.
# Bad settings exit 2 naming the key; a config.json with a bad
# scoring_func or n_group is refused by import naming it, writing nothing.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch moe_router
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8
      model.arch=moe model.moe.num_experts=8 model.moe.top_k=2
      model.moe.expert_ffn_dim=24 model.moe.shared_expert_ffn_dim=16
      model.moe.score_func=sigmoid model.moe.n_group=4 model.moe.topk_group=2
      model.moe.routed_scaling_factor=2.5 model.moe.aux_loss_coef=0
      model.moe.bias_update_speed=0.01 model.moe.seq_aux_loss_coef=0.01)
compare() {
    hs_compare_moe_runs "$1" "$2" 5e-5
    same_bias "$1" "$2"
}

# same_bias REF RUN: the exported correction biases bit for bit
same_bias() {
    python3 - "$work/$1/model.safetensors" "$work/$2/model.safetensors" <<'PY'
import json, struct, sys
def biases(p):
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k.endswith(".e_score_correction_bias")}
a, b = biases(sys.argv[1]), biases(sys.argv[2])
assert len(a) >= 2 and a.keys() == b.keys(), (a.keys(), b.keys())
for k in a:
    assert a[k] == b[k], (k, struct.unpack("<8f", a[k]), struct.unpack("<8f", b[k]))
PY
}

# replay RUN: the biases are the steps' updates from the logged loads
replay() {
    python3 - "$work/$1" <<'PY'
import json, struct, sys
import array
d = sys.argv[1]
loads = [json.loads(l)["expert_tokens"] for l in open(d + "/metrics.jsonl")]
raw = open(d + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
moved = 0
for layer in range(2):
    v = h[f"model.layers.{layer}.block_sparse_moe.gate.e_score_correction_bias"]
    got = struct.unpack("<8f", raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
    b = array.array("f", [0.0] * 8)  # fp32 arithmetic, as the trainer's
    for step in loads:
        load = step[layer]
        assert sum(load) == 8 * 16 * 2, load  # every row chooses top_k experts
        mean = sum(load) / 8
        for e in range(8):
            d_ = mean - load[e]
            b[e] += array.array("f", [0.01 if d_ > 0 else -0.01 if d_ < 0 else 0.0])[0]
            b[e] = array.array("f", [b[e]])[0]
    assert tuple(b) == got, (layer, tuple(b), got)
    moved += sum(x != 0 for x in got)
assert moved > 0, "no bias moved"
print("biases replayed from the loads:", got)
PY
}

hs_train_dump one2 1
hs_train_dump one4 1 train.micro_batch_size=4
hs_train_dump one8 1 train.micro_batch_size=8
replay one4
# the sequence-wise balance term: 0.01 x (about 1 a block, 1 when balanced)
python3 - "$work/one4/metrics.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    a = json.loads(l)["aux_loss"]
    assert 0.02 <= a < 0.03, a
PY
hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2
compare one4 fsdp2
hs_train_dump fsdp2ac 2 fsdp_config.dp_shard_size=2 train.activation_checkpointing=true
compare one4 fsdp2ac
hs_train_dump ep2 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2
hs_train_dump tp2sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one2 tp2sp
hs_train_dump cp2 2 accelerator.cp_size=2
compare one2 cp2
hs_train_dump pp2 2 accelerator.pp_size=2
compare one2 pp2
zbv=(model.n_layers=4 accelerator.pp_virtual_stages=2 accelerator.pp_schedule=zbv)
hs_train_dump one2l4 1 model.n_layers=4
hs_train_dump pp2zbv 2 accelerator.pp_size=2 "${zbv[@]}"
compare one2l4 pp2zbv
hs_train_dump ep2e2 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 fsdp_config.edp_shard_size=2
compare one8 ep2e2
# composed: the bias moves and the sequence-wise loss sums every step
hs_train_dump ep2pp2 4 accelerator.ep_size=2 accelerator.pp_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2pp2
hs_train_dump pp2tp2 4 accelerator.pp_size=2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one2 pp2tp2
hs_train_dump cp2tp2 4 accelerator.cp_size=2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one2 cp2tp2
hs_train_dump hsdp 4 fsdp_config.dp_shard_size=2
compare one8 hsdp

# 10 steps: the biases of EP 2 x EDP shard 2 and PP 2 x FSDP 2 equal one
# process's to the last bit; a checkpoint of FSDP 2 at step 5 resumes on one
# process to the same bits
hs_train one8_10 1 train.micro_batch_size=8 train.steps=10
replay one8_10
hs_train ep2e2_10 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 \
    fsdp_config.edp_shard_size=2 train.steps=10
same_bias one8_10 ep2e2_10
close_curve "$work/one8_10/metrics.jsonl" "$work/ep2e2_10/metrics.jsonl" 1 10
# (a constant learning rate: the 5-step run's schedule is the 10-step one's)
flat=(optimizer.schedule.decay=constant)
hs_train one4_10 1 train.micro_batch_size=4 train.steps=10 "${flat[@]}"
hs_train pp2fsdp2_10 4 accelerator.pp_size=2 fsdp_config.dp_shard_size=2 train.steps=10 "${flat[@]}"
same_bias one4_10 pp2fsdp2_10
close_curve "$work/one4_10/metrics.jsonl" "$work/pp2fsdp2_10/metrics.jsonl" 1 10
hs_train fsdp2_5 2 fsdp_config.dp_shard_size=2 train.steps=5 checkpoint.dir="$work/ck" "${flat[@]}"
hs_train resumed 1 train.micro_batch_size=4 train.steps=10 checkpoint.resume="$work/ck/step-5" \
    checkpoint.dir="$work/ck1" "${flat[@]}"
same_bias one4_10 resumed
close_curve "$work/one4_10/metrics.jsonl" "$work/resumed/metrics.jsonl" 6 10

# the sigmoid router's bias stays at zero without bias_update_speed; a
# softmax router has none
hs_train still 1 model.moe.bias_update_speed=0
python3 - "$work/still/model.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
b = [v for k, v in h.items() if k.endswith(".e_score_correction_bias")]
assert len(b) == 2 and all(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
                           == bytes(32) for v in b), b
PY
hs_train softmax 1 model.moe.bias_update_speed=0 model.moe.score_func=softmax
if grep -q e_score_correction_bias "$work/softmax/model.safetensors"; then
    die "a softmax router without bias_update_speed exported a correction bias"
fi

# export writes the router into config.json (DeepSeek-V3's names), import
# reads it back into config.yaml, and the biases travel bit for bit
run_logged "$work/export.txt" "$HS_BIN" export --safetensors "$work/exp" --run "$work/one4"
run_logged "$work/import.txt" "$HS_BIN" import "$work/exp" --out "$work/imp"
for want in "score_func: sigmoid" "n_group: 4" "topk_group: 2" "routed_scaling_factor: 2.5" \
    "bias_update_speed: 0.01"; do
    grep -q "$want" "$work/imp/config.yaml" || fail "import: no '$want' in config.yaml"
done
same_bias one4 imp

# a config.json whose router fields are wrong is refused naming them, and
# import writes nothing
mkdir -p "$work/bad_hf"
for bad in '"scoring_func": "relu"' '"n_group": 3'; do
    cp "$HS_SRC/tests/data/qwen3_moe_router_hf/"* "$work/bad_hf/"
    python3 - "$work/bad_hf/config.json" "$bad" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(json.loads("{" + sys.argv[2] + "}"))
json.dump(c, open(sys.argv[1], "w"))
PY
    rc=0
    "$HS_BIN" import "$work/bad_hf" --out "$work/bad_out" > "$work/bad_import.log" 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "import with $bad: exit $rc, want 1"
    key=$(echo "$bad" | cut -d'"' -f2)
    grep -q "config.json: \"$key\"" "$work/bad_import.log" ||
        fail "import with $bad does not name \"$key\": $(tail -1 "$work/bad_import.log")"
    [ ! -e "$work/bad_out" ] || fail "import with $bad wrote $work/bad_out"
done

hs_expect_exit 2 aux "model.moe.aux_loss_coef = 0.01 with model.moe.score_func = sigmoid" \
    train "${tiny[@]}" model.moe.aux_loss_coef=0.01
hs_expect_exit 2 groups "model.moe.num_experts = 8 is not divisible by model.moe.n_group = 3" \
    train "${tiny[@]}" model.moe.n_group=3
hs_expect_exit 2 topk_group "model.moe.topk_group = 5 exceeds model.moe.n_group = 4" \
    train "${tiny[@]}" model.moe.topk_group=5
hs_expect_exit 2 lonely "model.moe.n_group = 8 leaves 1 expert a group" \
    train "${tiny[@]}" model.moe.n_group=8
hs_expect_exit 2 few "model.moe.top_k = 3 exceeds the 2 experts of model.moe.topk_group = 1 groups of 2" \
    train "${tiny[@]}" model.moe.top_k=3 model.moe.topk_group=1
hs_finish
