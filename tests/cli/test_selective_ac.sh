#!/usr/bin/env bash
# train.activation_checkpointing: selective keeps each block's GEMM and
# attention outputs and re-runs only its element-wise ops (norms, RoPE,
# SwiGLU) in backward, so it trains bit for bit like false (fp32): loss and
# grad norm of 3 steps, every gradient of step 1 and the final weights, in
# every layout whose activations differ: one process, FSDP 2, TP 2 with
# sequence parallel, PP 2 (1F1B, and zb1p, whose split backward keeps
# copies of the recomputed inputs for its weight pass), CP 2, qwen3's q/k
# norms under TP 2, and qwen3_moe with a dense and an MoE block (one
# process, EP 2, PP 2 zb1p). Its activations lie between true's and
# false's, planned and measured. The key reads true, false, True and
# selective from YAML and refuses another name with exit 2.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 300
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch selective_ac
base=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 train.global_batch_size=4)
tiny=("${base[@]}")
files=(model.safetensors dump/grads-step1.safetensors)

# pair NAME RANKS ARGS...: the layout with false and with selective, bit for bit.
pair() {
    local name=$1 n=$2
    shift 2
    hs_train_dump "${name}_off" "$n" "$@" train.activation_checkpointing=false
    hs_train_dump "${name}_sel" "$n" "$@" train.activation_checkpointing=selective
    hs_compare_runs "${name}_off" "${name}_sel" 0 "${files[@]}" || fail "$name: selective != false"
}

pair one 1
pair fsdp2 2 fsdp_config.dp_shard_size=2
pair tp2_sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true
pair pp2 2 accelerator.pp_size=2
pair pp2_zb 2 accelerator.pp_size=2 accelerator.pp_schedule=zb1p
pair cp2 2 accelerator.cp_size=2
pair qwen3_tp2_sp 2 model.arch=qwen3 model.head_dim=16 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true

tiny=("${base[@]}" model.arch=qwen3_moe model.head_dim=16 model.moe.num_experts=4
      model.moe.top_k=2 model.moe.expert_ffn_dim=24 model.moe.aux_loss_coef=0.01
      'model.moe.mlp_only_layers=[0]' optimizer.eps=1e-3)
pair moe_one 1
hs_compare_moe_stats moe_one_off moe_one_sel || fail "moe_one: routing differs"
pair moe_ep2 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
pair moe_pp2_zb 2 accelerator.pp_size=2 accelerator.pp_schedule=zb1p

# activation memory: true < selective < false, in the plan and measured
tiny=("${base[@]}")
hs_train full 1 train.activation_checkpointing=true
for ac in false selective true; do
    "$HS_BIN" plan --world 1 --json "${tiny[@]}" train.activation_checkpointing=$ac \
        > "$work/plan_$ac.json" || fail "plan $ac"
done
python3 - "$work" <<'PY' || fail "selective's activations are not between true's and false's"
import json, sys
w = sys.argv[1]
def peak(run):
    return max(json.loads(l)["peak_device_bytes"] for l in open(f"{w}/{run}/metrics.jsonl"))
def planned(ac):
    return json.load(open(f"{w}/plan_{ac}.json"))["ranks"][0]["device"]["activations"]
m = [peak("one_off"), peak("one_sel"), peak("full")]
p = [planned("false"), planned("selective"), planned("true")]
print("  peak device bytes false / selective / true:", m)
print("  planned activation bytes false / selective / true:", p)
assert m[0] > m[1] > m[2] and p[0] > p[1] > p[2]
PY

# the key's values, from YAML and the command line
for v in true false True selective; do
    printf 'train:\n  activation_checkpointing: %s\n' "$v" > "$work/ac_$v.yaml"
    want=$v
    [ "$v" = True ] && want=true
    "$HS_BIN" config "$work/ac_$v.yaml" 2>&1 | grep -q "activation_checkpointing: $want$" ||
        fail "yaml $v: not read as $want"
done
hs_expect_exit 2 bad_value "train.activation_checkpointing.*one of false | true | selective" \
    train "${tiny[@]}" train.activation_checkpointing=sometimes train.out_dir="$work/no"
[ ! -e "$work/no" ] || fail "a refused run wrote $work/no"
hs_finish
