#!/usr/bin/env bash
# Output directories on a file system too small for what a command writes
# there are refused before any work, exit 2, naming the key or flag, the
# path, the bytes needed and available, and a fix; nothing is written.
# train.out_dir is checked for the final weights (the plan's parameter
# count), checkpoint.dir for the checkpoints the run holds at once,
# train.out_dir and checkpoint.dir on one file system for both together,
# export --safetensors for the exported weights. The small file
# systems are tmpfs mounts in a private mount namespace; where none can be
# made (not root, no unshare) the test is skipped (exit 77).
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch output_space
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.eval_every=0
      train.steps=2)
mkdir -p "$work/tiny"

# in_tiny_fs SIZE LOG COMMAND...: COMMAND with a tmpfs of SIZE on
# $work/tiny, in a mount namespace of its own (the mount ends with it);
# sets rc, output in $work/LOG.log, what the tmpfs held in $work/LOG.held.
in_tiny_fs() {
    local size=$1 log=$2
    shift 2
    unshare -m --propagation private sh -c 'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99
        dir=$2 held=$3
        shift 3
        timeout 120 "$@"
        rc=$?
        ls -A "$dir" > "$held"
        exit $rc' sh "$size" "$work/tiny" "$work/$log.held" "$@" > "$work/$log.log" 2>&1
    rc=$?
}
in_tiny_fs 64k probe true
[ "$rc" -eq 0 ] || hs_skip "cannot mount a tmpfs in a private mount namespace: $(cat "$work/probe.log")"

# refused LOG PATTERN: exit 2, PATTERN in the message, nothing written
refused() {
    [ "$rc" -eq 2 ] || fail "$1: exit $rc, want 2: $(tail -3 "$work/$1.log")"
    grep -q -- "$2" "$work/$1.log" || fail "$1: '$2' not in $(tail -3 "$work/$1.log")"
    [ ! -s "$work/$1.held" ] || fail "$1: wrote $(cat "$work/$1.held")"
}

# the final weights: 34976 fp32 values, 139904 bytes, on 64 KiB
for n in 1 2; do
    in_tiny_fs 64k "weights_$n" "$MPIEXEC" -n "$n" "$HS_BIN" train "${tiny[@]}" \
        fsdp_config.dp_shard_size="$n" train.out_dir="$work/tiny/run"
    refused "weights_$n" "train.out_dir = $work/tiny/run: $work/tiny has 0.1 MiB free and the final model.safetensors takes about 0.1 MiB (34976 fp32 values) (139904 bytes needed, 65536 available); free space there or choose another train.out_dir on another file system"
done
# one file system for the weights and a checkpoint (410 KiB by the plan):
# each fits in 512 KiB, both do not
in_tiny_fs 512k both "$HS_BIN" train "${tiny[@]}" train.out_dir="$work/tiny/run" \
    checkpoint.dir="$work/tiny/ck"
refused both "train.out_dir = $work/tiny/run: $work/tiny has 0.5 MiB free and the final model.safetensors takes about 0.1 MiB (34976 fp32 values); on the same file system, checkpoint.dir = $work/tiny/ck: one checkpoint of this run takes about 0.4 MiB (the plan's estimate: fp32 weights and optimizer state) and the run adds up to 1 there at once (checkpoint.keep_last = 2)"
grep -q "(559616 bytes needed in all, 524288 available); free space there or put one of these on another file system" \
    "$work/both.log" || fail "both: the sum is not given: $(tail -3 "$work/both.log")"
# saving every step, the run holds keep_last + 1 checkpoints at once (the
# new one is written before the oldest is pruned): 3 of 410 KiB on 1 MiB
in_tiny_fs 1m keep "$HS_BIN" train "${tiny[@]}" train.steps=4 checkpoint.save_every=1 \
    checkpoint.keep_last=2 checkpoint.dir="$work/tiny/ck" train.out_dir="$work/keep_out"
refused keep "checkpoint.dir = $work/tiny/ck: $work/tiny has 1.0 MiB free and one checkpoint of this run takes about 0.4 MiB (the plan's estimate: fp32 weights and optimizer state) and the run adds up to 3 there at once (checkpoint.keep_last = 2) (1259136 bytes needed, 1048576 available)"
[ ! -e "$work/keep_out" ] || fail "keep: train.out_dir was written"
# export of a finished run
hs_train run 1
in_tiny_fs 64k export "$HS_BIN" export --safetensors "$work/tiny/out" --run "$work/run"
refused export "--safetensors $work/tiny/out: $work/tiny has 0.1 MiB free and model.safetensors takes about 0.1 MiB (34976 float32 values) (139904 bytes needed, 65536 available)"
in_tiny_fs 64k export_bf16 "$HS_BIN" export --safetensors "$work/tiny/out" --run "$work/run" \
    --dtype bfloat16
refused export_bf16 "(69952 bytes needed, 65536 available)"
hs_finish
