#!/usr/bin/env bash
# The zero-bubble schedules zb1p (ZB-H1: each backward split into its
# input pass B and its weight pass W) and zbv (ZB-V: two chunks per stage
# in a V, split likewise) through `hypershard train` match the one-process
# run on the same global batch: loss and grad norm of every step, every
# gradient of step 1, every weight after steps 1, 2 and 3, the logits step
# 2 starts from and the exported model, within 1e-5 relative (fp32).
# Layouts, each for both schedules: PP 2; PP 4 (8 micro-batches); PP 2 x
# FSDP 2; PP 2 x HSDP 2x2; PP 2 x TP 2 with sequence and loss parallel;
# PP 2 x CP 2; PP 2 with activation checkpointing; no-sync accumulation;
# MoE at PP 2 and PP 2 x EP 2 (with the aux loss and expert counts); qwen3
# (per-head q/k norms) at PP 2 under zbv. In
# bf16 with fp32 reduction at PP 2 x FSDP 2, zb1p gives 1f1b's numbers bit
# for bit (the same products, summed in the same order). From the merged
# trace: each zb1p stage runs the paper's ZB-H1 list, every W after its B;
# each zbv stage runs 6 M actions over its two chunks, every W after its B
# and every B after its F. A zb1p or zbv checkpoint resumes under 1f1b and
# gpipe, and a 1f1b one under zb1p and zbv, on the uninterrupted curve.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch pp_zb
tiny=("${HS_FSDP_TINY[@]}" model.n_layers=4 model.n_kv_heads=2 optimizer.eps=1e-3
      train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" "${3:-1e-5}" "${files[@]}"; }
zb=(accelerator.pp_size=2 accelerator.pp_schedule=zb1p)

zbv=(accelerator.pp_size=2 accelerator.pp_schedule=zbv accelerator.pp_virtual_stages=2)

hs_train_dump one 1
hs_train_dump one8 1 model.n_layers=8
hs_train_dump zb2 2 "${zb[@]}" trace.enabled=true
grep -q "engine fsdp+pp on 2 rank(s)" "$work/zb2.txt"
compare one zb2
hs_train_dump zbv2 2 "${zbv[@]}" trace.enabled=true
compare one zbv2
hs_train_dump zb4 4 accelerator.pp_size=4 accelerator.pp_schedule=zb1p
compare one zb4
hs_train_dump zb4_m8 4 accelerator.pp_size=4 accelerator.pp_schedule=zb1p \
    train.micro_batch_size=1 trace.enabled=true
compare one zb4_m8
hs_train_dump zbv4_m8 4 model.n_layers=8 accelerator.pp_size=4 accelerator.pp_schedule=zbv \
    accelerator.pp_virtual_stages=2 train.micro_batch_size=1 trace.enabled=true
compare one8 zbv4_m8
for s in zb zbv; do
    declare -n sched=$s
    hs_train_dump ${s}2_fsdp2 4 "${sched[@]}" fsdp_config.dp_shard_size=2
    compare one ${s}2_fsdp2
    hs_train_dump ${s}2_hsdp 8 "${sched[@]}" fsdp_config.dp_shard_size=2 train.micro_batch_size=1
    compare one ${s}2_hsdp
    hs_train_dump ${s}2_tp2_sp 4 "${sched[@]}" accelerator.tp_size=2 \
        accelerator.sequence_parallel=true accelerator.loss_parallel=true
    compare one ${s}2_tp2_sp
    hs_train_dump ${s}2_cp2 4 "${sched[@]}" accelerator.cp_size=2
    compare one ${s}2_cp2
    hs_train_dump ${s}2_ckpt 2 "${sched[@]}" train.activation_checkpointing=true
    compare one ${s}2_ckpt
    hs_train_dump ${s}2_nosync 4 "${sched[@]}" fsdp_config.dp_shard_size=2 \
        fsdp_config.requires_grad_sync=false
    compare one ${s}2_nosync
done

# qwen3: its per-head q/k norms stay in B, their projections go to W
hs_train_dump qwen3_one 1 model.arch=qwen3 model.head_dim=16
hs_train_dump qwen3_zbv2 2 model.arch=qwen3 model.head_dim=16 "${zbv[@]}"
compare qwen3_one qwen3_zbv2

# bf16 compute, fp32 reduction: the split changes no product and no sum
bf=(fsdp_config.dp_shard_size=2 accelerator.pp_size=2 fsdp_config.mix_precision.param_dtype=bfloat16
    fsdp_config.mix_precision.reduce_dtype=float32)
hs_train_dump bf_1f1b 4 "${bf[@]}"
hs_train_dump bf_zb 4 "${bf[@]}" accelerator.pp_schedule=zb1p
compare bf_1f1b bf_zb 0

# Each stage's compute spans of the 3 training steps in time order: the
# ZB-H1 lists (hs_pp_schedule), and every W after the B of its micro-batch.
check_schedule() { # RUN STAGES EXPECTED_STAGE0 ... EXPECTED_STAGE(N-1)
    python3 - "$work/$1/trace/trace.json" "${@:2}" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
want = {s: sys.argv[3 + s].split() for s in range(n)}
t = json.load(open(path))
ev = t["traceEvents"] if isinstance(t, dict) else t
for rank in range(n):
    slots = sorted((e for e in ev if e["pid"] == rank and e.get("cat") in
                    ("pp_forward", "pp_backward", "pp_weight")), key=lambda e: e["ts"])
    got = [e["name"] for e in slots]
    assert got == want[rank] * 3, f"rank {rank} ran {got}, expected 3 x {want[rank]}"
    for step in range(3):
        seen = set()
        for name in got[step * len(want[rank]):(step + 1) * len(want[rank])]:
            assert name[0] != "W" or "B" + name[1:] in seen, f"rank {rank}: {name} before its B"
            seen.add(name)
    print(f"rank {rank}: {' '.join(want[rank])} x 3 steps")
PY
}
check_schedule zb2 2 "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3" "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3"
check_schedule zb4_m8 4 \
    "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7" \
    "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7" \
    "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7" \
    "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"

# zbv's lists come from a simulation (hs_pp_schedule): each stage runs 6 M
# actions, the same list every step, and its passes in dependency order.
check_zbv() { # RUN STAGES M
    python3 - "$work/$1/trace/trace.json" "$2" "$3" <<'PY'
import json, sys
path, n, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = json.load(open(path))
ev = t["traceEvents"] if isinstance(t, dict) else t
for rank in range(n):
    got = [e["name"] for e in sorted((e for e in ev if e["pid"] == rank and e.get("cat") in
           ("pp_forward", "pp_backward", "pp_weight")), key=lambda e: e["ts"])]
    per = 6 * M
    assert len(got) == 3 * per, f"rank {rank}: {len(got)} actions in 3 steps, not {3 * per}"
    step = got[:per]
    assert got == step * 3, f"rank {rank}: the steps ran different lists"
    assert sorted(step) == sorted(f"{k}{mb}.{v}" for k in "FBW" for mb in range(M)
                                  for v in (0, 1)), f"rank {rank}: {step}"
    for i, name in enumerate(step):
        before = {"B": "F", "W": "B"}.get(name[0])
        assert before is None or before + name[1:] in step[:i], f"rank {rank}: {name} too early"
    print(f"rank {rank}: {' '.join(step)}")
PY
}
check_zbv zbv2 2 4
check_zbv zbv4_m8 4 8

# MoE: the experts' gradients stay in B, the attention linears' go to W
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
     model.moe.aux_loss_coef=0.01 model.moe.shared_expert_ffn_dim=16)
hs_train_dump moe_one 1 "${moe[@]}"
hs_train_dump moe_one4 1 "${moe[@]}" train.micro_batch_size=4
hs_train_dump moe_zb2 2 "${moe[@]}" "${zb[@]}"
compare moe_one moe_zb2
hs_compare_moe_stats moe_one moe_zb2
hs_train_dump moe_zbv2 2 "${moe[@]}" "${zbv[@]}"
compare moe_one moe_zbv2
hs_compare_moe_stats moe_one moe_zbv2
for s in zb zbv; do
    declare -n sched=$s
    hs_train_dump moe_${s}2_ep2 4 "${moe[@]}" "${sched[@]}" accelerator.ep_size=2 \
        fsdp_config.dp_shard_size=2 fsdp_config.edp_shard_size=1
    compare moe_one4 moe_${s}2_ep2
    hs_compare_moe_stats moe_one4 moe_${s}2_ep2
done

# Resume across schedules: the checkpoint holds no schedule state.
tiny=("${HS_TINY[@]}" model.n_layers=4 train.global_batch_size=8 train.micro_batch_size=2
      train.eval_every=0 optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
hs_must_run 2 uninterrupted accelerator.pp_size=2 train.steps=5 train.out_dir="$work/u"
hs_must_run 2 stopped_zb "${zb[@]}" train.steps=2 train.out_dir="$work/s" \
    checkpoint.dir="$work/ck_zb"
hs_resume_layouts "$work/ck_zb/step-2" "$work/u" \
    "2 to_1f1b accelerator.pp_size=2" \
    "2 to_gpipe accelerator.pp_size=2 accelerator.pp_schedule=gpipe"
hs_must_run 2 stopped_zbv "${zbv[@]}" train.steps=2 train.out_dir="$work/sv" \
    checkpoint.dir="$work/ck_zbv"
hs_resume_layouts "$work/ck_zbv/step-2" "$work/u" "2 zbv_to_1f1b accelerator.pp_size=2" \
    "1 zbv_to_one accelerator.pp_size=1"
hs_must_run 2 stopped_1f1b accelerator.pp_size=2 train.steps=2 train.out_dir="$work/s1" \
    checkpoint.dir="$work/ck_1f1b"
hs_resume_layouts "$work/ck_1f1b/step-2" "$work/u" "2 to_zb ${zb[*]}" "2 to_zbv ${zbv[*]}"
hs_finish
