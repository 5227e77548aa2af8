#!/usr/bin/env bash
# Pipeline parallelism through `hypershard train` matches the one-process
# run on the same global batch: loss and grad norm of every step, every
# gradient of step 1, every weight after steps 1, 2 and 3, the logits step
# 2 starts from and the exported model, within 1e-5 relative to each
# tensor's largest value (fp32). Layouts: PP 2 with 1f1b and with gpipe;
# PP 4; uneven stages (pp_layers [3, 1]); PP 2 x FSDP 2; PP 2 x HSDP 2x2;
# PP 2 x TP 2, with sequence parallel and loss parallel; PP 2 x FSDP 2 x
# TP 2 (W = 8); PP 2 x CP 2; PP with activation checkpointing and with
# no-sync accumulation. From the merged trace: each stage runs its
# schedule's forward and backward slots in order, one per micro-batch, and
# hands over exactly one activation forward and one gradient backward per
# micro-batch on the pp_forward / pp_backward groups. From the unit
# listings: every FSDP group of a stage holds that stage's ranks only.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 300
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

# The schedules as the stages ran them: M = 8 / (2 x 1) = 4 micro-batches
# per step, 3 steps; hand-over tensors of 2 x 16 rows x 32 fp32 = 4096 bytes.
check_schedule() { # RUN EXPECTED_STAGE0 EXPECTED_STAGE1
    python3 - "$work/$1/trace/trace.json" "$2" "$3" <<'PY'
import json, sys
path, want = sys.argv[1], {0: sys.argv[2].split(), 1: sys.argv[3].split()}
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
    kind = {0: ("send", "pp_forward"), 1: ("recv", "pp_forward")}[rank]
    fwd = [e for e in comm if (e["name"], e["args"]["group"]) == kind]
    kind = {0: ("recv", "pp_backward"), 1: ("send", "pp_backward")}[rank]
    bwd = [e for e in comm if (e["name"], e["args"]["group"]) == kind]
    # the forward-only chains (--dump's logits, the sample) hand over 1
    # sequence (2048 bytes); only training hands gradients back
    fwd = [e for e in fwd if e["args"]["bytes"] == 4096]
    assert len(fwd) == 12 and len(bwd) == 12, \
        f"rank {rank}: {len(fwd)} activation and {len(bwd)} gradient hand-overs in training"
    assert all(e["args"]["bytes"] == 4096 for e in bwd), f"rank {rank}: gradient bytes"
    print(f"rank {rank}: {' '.join(want[rank])} x 3 steps, {len(bwd)} gradient hand-overs")
PY
}
check_schedule pp2 "F0 F1 B0 F2 B1 F3 B2 B3" "F0 B0 F1 B1 F2 B2 F3 B3"
check_schedule pp2_gpipe "F0 F1 F2 F3 B0 B1 B2 B3" "F0 F1 F2 F3 B0 B1 B2 B3"

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
