#!/usr/bin/env bash
# The default trainer is bitwise reproducible from run to run on one
# layout: the same config run twice gives the same loss and gradient norm
# at every step and byte-identical model.safetensors, with what runs by
# default switched on (two GEMM threads where the cores allow, unit
# prefetch and overlapped reductions, the asynchronous checkpoint) in one
# process (fp32, bf16), FSDP 2 (bf16), PP 2 x TP 2 x FSDP 2 under 1F1B and
# under ZB-V, CP 2 x TP 2 and EP 2 x PP 2 (MoE). Nothing in a step
# depends on timing: every sum has one order (the threads split output
# elements, never a sum; the collectives have fixed schedules), so two runs
# can only differ through a bug. Layouts differ from one another by
# rounding (docs/numerics.md); this test is about one layout at a time.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 400
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch repro
tiny=(model.dim=32 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=64
      train.seq_len=32 train.global_batch_size=8 train.micro_batch_size=2 train.steps=3
      train.eval_every=0 optimizer.schedule.warmup_steps=0)
bf16=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)
moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24)

# twice NAME RANKS ARGS...: the same run twice, each with its own
# checkpoint directory (saved every 2 steps); losses, gradient norms and the
# exported weights bit for bit, the weights file byte for byte.
twice() {
    local name=$1 n=$2
    shift 2
    for run in a b; do
        hs_run "$n" "${name}_$run" "$@" train.out_dir="$work/${name}_$run" \
            checkpoint.dir="$work/${name}_${run}_ckpt" checkpoint.save_every=2
        [ "$rc" -eq 0 ] || { fail "$name $run: exit $rc: $(tail -5 "$work/${name}_$run.log")"; return; }
    done
    hs_compare_runs "${name}_a" "${name}_b" 0 > "$work/${name}_cmp.log" 2>&1 ||
        { fail "$name: two runs differ: $(tail -3 "$work/${name}_cmp.log")"; return; }
    cmp -s "$work/${name}_a/model.safetensors" "$work/${name}_b/model.safetensors" ||
        { fail "$name: model.safetensors differs byte for byte"; return; }
    echo "  $name: two runs equal bit for bit (3 steps: losses, grad norms, weights)"
}

twice one_fp32 1 train.threads=2
twice one_bf16 1 train.threads=2 "${bf16[@]}"
twice fsdp2_bf16 2 train.threads=1 fsdp_config.dp_shard_size=2 "${bf16[@]}"
twice pp2_tp2_fsdp2 8 accelerator.pp_size=2 accelerator.tp_size=2 fsdp_config.dp_shard_size=2
twice pp2_tp2_fsdp2_zbv 8 accelerator.pp_size=2 accelerator.tp_size=2 \
    fsdp_config.dp_shard_size=2 accelerator.pp_schedule=zbv accelerator.pp_virtual_stages=2
twice cp2_tp2 4 accelerator.cp_size=2 accelerator.tp_size=2 train.global_batch_size=4
twice ep2_pp2 4 "${moe[@]}" accelerator.ep_size=2 accelerator.pp_size=2 fsdp_config.dp_shard_size=2

hs_finish
