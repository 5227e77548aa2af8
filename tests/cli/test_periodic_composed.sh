#!/usr/bin/env bash
# Every periodic feature fires in every composed layout, and none changes
# the run: PP 2 x TP 2 (with and without sequence parallelism), CP 2 x TP 2,
# EP 2 x PP 2 (MoE), PP 2 x TP 2 x FSDP 2, and DeepSeek-V3 in PP 2 x TP 2
# + SP, EP 2 x PP 2 and CP 2 x TP 2, train 6 steps with the
# collective fingerprints compared every 2 steps, an asynchronous
# checkpoint (the default) every 2 steps pruned to the last one, the
# validation loss every 3 steps and a log line every step. Each ends 0,
# its losses equal bit for bit a run of the same layout with none of them,
# its newest checkpoint verifies and is the only one left. The check is
# not blind: one rank issuing a TP collective of another size in PP x TP
# is caught at the next check, naming the instance of the 'tp' group (each
# pipeline stage has its own, issuing other collectives).
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 400
# HS_TEST_TIERS: avx2
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch periodic
tiny=(model.dim=32 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=64
      train.seq_len=16 train.global_batch_size=8 train.micro_batch_size=2 train.steps=6
      train.eval_every=3 optimizer.schedule.warmup_steps=0)
periodic=(comm.check_every=2 checkpoint.save_every=2 checkpoint.keep_last=1 train.log_every=1)
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24)

# layout NAME RANKS ARGS...: the run with every periodic feature against
# the plain one.
layout() {
    local name=$1 n=$2
    shift 2
    hs_run "$n" "${name}_plain" "$@" train.out_dir="$work/${name}_plain" comm.check_every=0
    [ "$rc" -eq 0 ] || { fail "$name plain: exit $rc: $(tail -5 "$work/${name}_plain.log")"; return; }
    hs_run "$n" "$name" "$@" "${periodic[@]}" train.out_dir="$work/$name" \
        checkpoint.dir="$work/${name}_ckpt"
    [ "$rc" -eq 0 ] || { fail "$name: exit $rc: $(tail -5 "$work/$name.log")"; return; }
    python3 - "$work/${name}_plain/metrics.jsonl" "$work/$name/metrics.jsonl" "$name" <<'PY' ||
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [x["step"] for x in b] == list(range(1, 7)), [x["step"] for x in b]
assert [x["loss"] for x in a] == [x["loss"] for x in b], (sys.argv[3], a, b)
assert [x["step"] for x in b if "val_loss" in x] == [3, 6], sys.argv[3]
PY
        fail "$name: the periodic features changed the run"
    local steps
    steps=$(cd "$work/${name}_ckpt" && ls -d step-* 2> /dev/null | tr '\n' ' ')
    [ "$steps" = "step-6 " ] || fail "$name: checkpoints left: '$steps', want step-6 alone"
    "$HS_BIN" ckpt verify "$work/${name}_ckpt/step-6" > "$work/${name}_verify.log" 2>&1 ||
        fail "$name: step-6 does not verify: $(tail -3 "$work/${name}_verify.log")"
    [ "$(grep -c '^step ' "$work/$name.log")" -eq 6 ] || fail "$name: not one log line per step"
    echo "  $name: 6 steps with checks, saves and prunes every 2, validation at 3 and 6; losses equal"
}

layout pp2_tp2 4 accelerator.pp_size=2 accelerator.tp_size=2
layout pp2_tp2_sp 4 accelerator.pp_size=2 accelerator.tp_size=2 accelerator.sequence_parallel=true
layout cp2_tp2 4 accelerator.cp_size=2 accelerator.tp_size=2
layout ep2_pp2 4 "${moe[@]}" accelerator.ep_size=2 accelerator.pp_size=2 fsdp_config.dp_shard_size=2
layout pp2_tp2_fsdp2 8 accelerator.pp_size=2 accelerator.tp_size=2 fsdp_config.dp_shard_size=2
# DeepSeek-V3: latent attention, its correction bias moving every step
ds=(model.arch=deepseek_v3 model.n_kv_heads=4 model.mla.q_lora_rank=16 model.mla.kv_lora_rank=16
    model.mla.qk_nope_head_dim=8 model.mla.qk_rope_head_dim=8 model.mla.v_head_dim=8
    model.moe.first_k_dense_replace=1 model.moe.num_experts=4 model.moe.top_k=2
    model.moe.expert_ffn_dim=24 model.moe.score_func=sigmoid model.moe.aux_loss_coef=0
    model.moe.bias_update_speed=0.01)
layout ds_pp2_tp2_sp 4 "${ds[@]}" accelerator.pp_size=2 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true
layout ds_ep2_pp2 4 "${ds[@]}" accelerator.ep_size=2 accelerator.pp_size=2 \
    fsdp_config.dp_shard_size=2
layout ds_cp2_tp2 4 "${ds[@]}" accelerator.cp_size=2 accelerator.tp_size=2

# A TP collective of another size on world rank 3 (stage 1's TP group).
HS_COMM_TEST_FAULT=count:3:tp:5 hs_run 4 fault accelerator.pp_size=2 accelerator.tp_size=2 \
    train.out_dir="$work/fault" comm.check_every=2
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "fault: exit $rc, want a failure, no hang"
grep -q "collective fingerprint mismatch at the check after step 2 (in the instance of 'tp' led by world rank" \
    "$work/fault.log" || fail "fault: no mismatch naming the tp instance: $(grep -m3 -i finger "$work/fault.log")"
hs_finish
