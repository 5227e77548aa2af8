#!/usr/bin/env bash
# Pipeline parallelism through `hypershard train` matches the one-process
# run on the same global batch: loss and grad norm of every step, every
# gradient of step 1, every weight after steps 1, 2 and 3, the logits step
# 2 starts from and the exported model, within 1e-5 relative to each
# tensor's largest value (fp32). Layouts: PP 2 with 1f1b and with gpipe;
# PP 4; uneven stages (pp_layers [3, 1]); PP 2 x FSDP 2; PP 2 x HSDP 2x2;
# PP 2 x TP 2, with sequence parallel and loss parallel; PP 2 x FSDP 2 x
# TP 2 (W = 8); PP 2 x CP 2; PP with activation checkpointing and with
# no-sync accumulation; interleaved 1F1B with 2 virtual stages (each rank
# holds 2 non-adjacent chunks), alone, with 8 micro-batches, x FSDP 2, x TP
# 2 with sequence parallel, with activation checkpointing; 4 virtual
# stages; PP 4 x 2 virtual stages; uneven chunks [3, 1, 2, 2] (8 blocks).
# From the merged trace: each stage runs its schedule's forward and
# backward slots in order, one per micro-batch (and chunk), and hands over
# exactly one activation forward and one gradient backward per micro-batch
# and chunk boundary on the pp_forward / pp_backward groups. From the unit
# listings: every FSDP group of a stage holds that stage's ranks only.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch pp
tiny=("${HS_FSDP_TINY[@]}" model.n_layers=4 model.n_kv_heads=2 optimizer.eps=1e-3
      train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }
pp2=(accelerator.pp_size=2)

hs_train_dump one 1
hs_train_dump pp2 2 "${pp2[@]}" trace.enabled=true
grep -q "engine fsdp+pp on 2 rank(s)" "$work/pp2.txt"
compare one pp2
hs_train_dump pp2_gpipe 2 "${pp2[@]}" accelerator.pp_schedule=gpipe trace.enabled=true
compare one pp2_gpipe
hs_train_dump pp4 4 accelerator.pp_size=4
compare one pp4
# 8 micro-batches on 4 stages: the middle stages receive and send in both
# directions while others are in flight
hs_train_dump pp4_m8 4 accelerator.pp_size=4 train.micro_batch_size=1
compare one pp4_m8
hs_train_dump pp2_uneven 2 "${pp2[@]}" 'accelerator.pp_layers=[3,1]'
compare one pp2_uneven
hs_train_dump pp2_fsdp2 4 "${pp2[@]}" fsdp_config.dp_shard_size=2
compare one pp2_fsdp2
# dp 4: micro-batches of 1 sequence keep two per step for 1f1b
hs_train_dump pp2_hsdp 8 "${pp2[@]}" fsdp_config.dp_shard_size=2 train.micro_batch_size=1
grep -q "shard degree 2, replicate degree 2" "$work/pp2_hsdp.txt"
compare one pp2_hsdp
hs_train_dump pp2_tp2 4 "${pp2[@]}" accelerator.tp_size=2
compare one pp2_tp2
hs_train_dump pp2_tp2_sp 4 "${pp2[@]}" accelerator.tp_size=2 accelerator.sequence_parallel=true \
    accelerator.loss_parallel=true
compare one pp2_tp2_sp
hs_train_dump pp2_fsdp2_tp2 8 "${pp2[@]}" accelerator.tp_size=2 fsdp_config.dp_shard_size=2
compare one pp2_fsdp2_tp2
hs_train_dump pp2_cp2 4 "${pp2[@]}" accelerator.cp_size=2
compare one pp2_cp2
hs_train_dump pp2_ckpt 2 "${pp2[@]}" train.activation_checkpointing=true
compare one pp2_ckpt
hs_train_dump pp2_nosync 4 "${pp2[@]}" fsdp_config.dp_shard_size=2 \
    fsdp_config.requires_grad_sync=false
compare one pp2_nosync

# interleaved 1F1B: stage s holds chunks s and s + pp
il=(accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2)
hs_train_dump il2 2 "${pp2[@]}" "${il[@]}" trace.enabled=true
grep -q "wrapped 2 transformer blocks" "$work/il2.txt"
compare one il2
hs_train_dump il2_m8 2 "${pp2[@]}" "${il[@]}" train.micro_batch_size=1
compare one il2_m8
hs_train_dump il2_fsdp2 4 "${pp2[@]}" "${il[@]}" fsdp_config.dp_shard_size=2 \
    train.micro_batch_size=1
compare one il2_fsdp2
hs_train_dump il2_tp2_sp 4 "${pp2[@]}" "${il[@]}" accelerator.tp_size=2 \
    accelerator.sequence_parallel=true
compare one il2_tp2_sp
hs_train_dump il2_ckpt 2 "${pp2[@]}" "${il[@]}" train.activation_checkpointing=true
compare one il2_ckpt
hs_train_dump one8 1 model.n_layers=8
hs_train_dump il2_v4 2 model.n_layers=8 "${pp2[@]}" accelerator.pp_schedule=interleaved_1f1b \
    accelerator.pp_virtual_stages=4
compare one8 il2_v4
hs_train_dump il4 4 model.n_layers=8 accelerator.pp_size=4 "${il[@]}" train.micro_batch_size=1
compare one8 il4
hs_train_dump il2_uneven 2 model.n_layers=8 "${pp2[@]}" "${il[@]}" 'accelerator.pp_layers=[3,1,2,2]'
compare one8 il2_uneven

# The schedules as the stages ran them: M = 8 / (2 x 1) = 4 micro-batches
# per step, 3 steps; hand-over tensors of 2 x 16 rows x 32 fp32 = 4096 bytes.
check_schedule() { # RUN EXPECTED_STAGE0 EXPECTED_STAGE1 [HAND-OVERS PER STEP]
    python3 - "$work/$1/trace/trace.json" "$2" "$3" "${4:-4}" <<'PY'
import json, sys
path, want = sys.argv[1], {0: sys.argv[2].split(), 1: sys.argv[3].split()}
per_step = int(sys.argv[4])
t = json.load(open(path))
ev = t["traceEvents"] if isinstance(t, dict) else t
for rank in (0, 1):
    slots = sorted((e for e in ev if e["pid"] == rank and e.get("cat") in
                    ("pp_forward", "pp_backward")), key=lambda e: e["ts"])
    got = [e["name"] for e in slots]
    assert got == want[rank] * 3, f"rank {rank} ran {got}, expected 3 x {want[rank]}"
    assert all(e["args"]["stage"] == rank for e in slots), f"rank {rank}: wrong stage in a slot"
    comm = [e for e in ev if e["pid"] == rank and e.get("cat") == "comm"
            and e["args"]["group"] in ("pp_forward", "pp_backward")]
    # sends and receives of each direction (interleaved stages do both)
    fwd = [e for e in comm if e["args"]["group"] == "pp_forward"]
    bwd = [e for e in comm if e["args"]["group"] == "pp_backward"]
    # the forward-only chains (--dump's logits, the sample) hand over 1
    # sequence (2048 bytes); only training hands gradients back
    fwd = [e for e in fwd if e["args"]["bytes"] == 4096]
    assert len(fwd) == 3 * per_step and len(bwd) == 3 * per_step, \
        f"rank {rank}: {len(fwd)} activation and {len(bwd)} gradient hand-overs in training"
    assert all(e["args"]["bytes"] == 4096 for e in bwd), f"rank {rank}: gradient bytes"
    print(f"rank {rank}: {' '.join(want[rank])} x 3 steps, {len(bwd)} gradient hand-overs")
PY
}
check_schedule pp2 "F0 F1 B0 F2 B1 F3 B2 B3" "F0 B0 F1 B1 F2 B2 F3 B3"
check_schedule pp2_gpipe "F0 F1 F2 F3 B0 B1 B2 B3" "F0 F1 F2 F3 B0 B1 B2 B3"
# interleaved, pp 2, 2 chunks per stage, M = 4: F<micro-batch>.<chunk>;
# rounds of 2 micro-batches per chunk; stage 0 fills with 2 (2-1-0) + 2 =
# 4 forwards, stage 1 with 2. The chunks are the model's 0, 2 (stage 0)
# and 1, 3 (stage 1), so per step and micro-batch three activations cross
# (0 -> 1, 1 -> 2 round the ring, 2 -> 3) and three gradients back: each
# stage sends or receives 12 of each per step, 4096 bytes each.
check_schedule il2 "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0" \
    "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0" 12

# Stage s of PP 2 x HSDP 2x2 is world ranks [4s, 4s + 4): every shard and
# replicate group of its parameters lies inside it.
python3 - "$work/pp2_hsdp/dump" <<'PY'
import json, sys
for rank in range(8):
    u = json.load(open(f"{sys.argv[1]}/units-rank{rank}.json"))
    stage = set(range(4 * (rank // 4), 4 * (rank // 4) + 4))
    n = 0
    for unit in u["units"]:
        for p in unit["params"]:
            for key in ("shard_ranks", "replicate_ranks"):
                assert len(p[key]) == 2 and set(p[key]) <= stage and rank in p[key], \
                    f"rank {rank}: {p['fqn']} {key} {p[key]} outside stage ranks {sorted(stage)}"
            n += 1
    print(f"rank {rank}: {n} parameters, groups within ranks {sorted(stage)}")
PY
hs_finish
