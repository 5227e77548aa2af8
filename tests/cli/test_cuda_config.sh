#!/usr/bin/env bash
# accelerator.device: cuda where it cannot run is refused with exit 2 and a
# message that says why and what to set, before any output exists: in a
# build without the cuda backend ("has no CUDA backend"), and in one with it
# on a machine without a GPU ("no CUDA device is visible"). In a build with
# it, a MoE model and the Muon optimizer pass the check of the cuda table's
# kernels: without a GPU they stop only where every cuda run does, and with
# one they train. A value of HS_CUDA_ATTENTION other than cores or cudnn is
# refused (exit 2, named) before any GPU is asked for.
# HS_TEST_TIMEOUT: 60
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch cuda_config
tiny=("${HS_TINY[@]}" train.steps=1 train.eval_every=0)

# no_output NAME: the refused run left nothing behind.
no_output() { [ ! -e "$work/$1" ] || fail "$1: the refused run wrote $work/$1"; }

rc=0
"$HS_BIN" train "${tiny[@]}" accelerator.device=cuda train.out_dir="$work/probe" \
    > "$work/probe.log" 2>&1 || rc=$?
if grep -q "has no CUDA backend" "$work/probe.log"; then
    built=false
elif grep -q "no CUDA device is visible" "$work/probe.log"; then
    built=true
elif [ "$rc" -eq 0 ]; then
    built=true
    echo "a GPU is here: the refusal without one is not checked"
else
    cat "$work/probe.log"
    die "accelerator.device=cuda failed with exit $rc for another reason"
fi
if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 2 ] || fail "probe: exit $rc, want 2"
    grep -q "accelerator.device: cpu" "$work/probe.log" || fail "probe: no fix named"
    no_output probe
fi

moe=(model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24)
if $built && [ "$rc" -eq 0 ]; then
    hs_expect_exit 0 moe "done:" train "${tiny[@]}" "${moe[@]}" accelerator.device=cuda \
        train.out_dir="$work/moe"
    hs_expect_exit 0 muon "done:" train "${tiny[@]}" optimizer._target_=muon \
        accelerator.device=cuda train.out_dir="$work/muon"
elif $built; then
    hs_expect_exit 2 moe "no CUDA device is visible" train "${tiny[@]}" "${moe[@]}" \
        accelerator.device=cuda train.out_dir="$work/moe"
    hs_expect_exit 2 muon "no CUDA device is visible" train "${tiny[@]}" \
        optimizer._target_=muon accelerator.device=cuda train.out_dir="$work/muon"
    # the device's own refusal: the check of its kernels, which comes first, passed
    no_output moe
    no_output muon
else
    hs_expect_exit 2 moe "has no CUDA backend" train "${tiny[@]}" "${moe[@]}" \
        accelerator.device=cuda train.out_dir="$work/moe"
    no_output moe
fi
if $built; then
    HS_CUDA_ATTENTION=tensor hs_expect_exit 2 att_env "HS_CUDA_ATTENTION=tensor: set cores" \
        train "${tiny[@]}" accelerator.device=cuda train.out_dir="$work/att_env"
    no_output att_env
fi
# the same model and optimizer on cpu are not refused: the refusal is the device's
hs_expect_exit 0 moe_cpu "done:" train "${tiny[@]}" "${moe[@]}" train.out_dir="$work/moe_cpu"
hs_finish
