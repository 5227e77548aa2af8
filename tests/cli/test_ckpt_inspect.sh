#!/usr/bin/env bash
# `hypershard ckpt inspect | verify | export`: the listing shows the trainer
# state, files, tensors with dtype, shape and chunk layout; a bad directory
# is a usage error (exit 2); a flipped byte or a truncated file is an error
# naming the file, the tensor and both checksums or lengths; export of a
# sharded checkpoint writes the same safetensors bytes as hs_hf_save of the
# full weights.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
PROG="$HS_BUILD/test_ckpt_reshard"
[ -x "$PROG" ] || { echo "missing $PROG (build the test_ckpt_reshard target)"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ckpt_inspect
d="$work/ckpt"

hs() { out=$("$HS_BIN" "$@" 2>&1); rc=$?; }
expect_text() { grep -qF -- "$2" <<<"$out" || fail "$1: output lacks '$2':"$'\n'"$out"; }

out=$(timeout 60 "$MPIEXEC" -n 2 "$PROG" save "$d" 6 fsdp 2>&1) || { echo "save failed: $out"; exit 1; }

test_inspect_lists_state_files_tensors_and_chunks() {
    for dir in "$d" "$d/step-6"; do
        hs ckpt inspect "$dir"
        [ "$rc" -eq 0 ] || fail "inspect $dir: rc $rc: $out"
        expect_text inspect "checkpoint $d/step-6"
        expect_text inspect "saved by 2 ranks"
        expect_text inspect "step 6, data_position 24, optim_step 6"
        expect_text inspect "rng_seed 0x9e3779b97f4a7c15"
        expect_text inspect "rank-1.bin"
        expect_text inspect "model.layers.0.self_attn.q_proj.weight"
        expect_text inspect "bfloat16"
        expect_text inspect "[7, 4, 2]"
        expect_text inspect "[3:5, 0:3]"      # rank 1's rows of the 5-row tensor
        expect_text inspect "model.replicated.bias"
        expect_text inspect "optim.model.embed_tokens.weight.exp_avg_sq"
    done
}

test_bad_directory_and_bad_usage_exit_2() {
    hs ckpt inspect "$work/nothing"
    [ "$rc" -eq 2 ] || fail "inspect of a missing dir: rc $rc"
    expect_text "missing dir" "$work/nothing is not a checkpoint directory"
    mkdir -p "$work/empty"
    hs ckpt inspect "$work/empty"
    [ "$rc" -eq 2 ] || fail "inspect of an empty dir: rc $rc"
    expect_text "empty dir" "holds neither metadata.json"
    hs ckpt
    [ "$rc" -eq 2 ] || fail "ckpt without arguments: rc $rc"
}

test_verify_passes_then_names_a_flipped_byte() {
    hs ckpt verify "$d"
    [ "$rc" -eq 0 ] || fail "verify: rc $rc: $out"
    expect_text verify "verified"
    cp -r "$d/step-6" "$work/bad"
    python3 -c "
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[10] ^= 0x40
open(p, 'wb').write(bytes(b))" "$work/bad/rank-1.bin"
    hs ckpt verify "$work/bad"
    [ "$rc" -eq 1 ] || fail "verify of a corrupted file: rc $rc"
    expect_text corrupted "checkpoint data file $work/bad/rank-1.bin is corrupted: tensor 'model.embed_tokens.weight' chunk [5:10, 0:4]"
    expect_text corrupted "has CRC32 0x"
    expect_text corrupted "the metadata expects 0x"
    out=$(timeout 60 "$MPIEXEC" -n 2 "$PROG" load "$work/bad" 6 fsdp 2>&1)
    [ $? -ne 0 ] || fail "loading a corrupted checkpoint passed"
    expect_text "corrupted load" "rank-1.bin is corrupted: tensor 'model.embed_tokens.weight'"
}

test_truncated_file_names_lengths_and_tensor() {
    cp -r "$d/step-6" "$work/short"
    local n
    n=$(stat -c %s "$work/short/rank-0.bin")
    truncate -s $((n - 3)) "$work/short/rank-0.bin"
    hs ckpt verify "$work/short"
    [ "$rc" -eq 1 ] || fail "verify of a truncated file: rc $rc"
    expect_text truncated "checkpoint data file $work/short/rank-0.bin is $((n - 3)) bytes, expected $n (truncated; first tensor affected: '"
}

test_export_of_a_sharded_checkpoint_equals_the_full_weights() {
    out=$(timeout 60 "$MPIEXEC" -n 2 "$PROG" model "$work/model" "$work/ref" 2>&1) || { fail "model save: $out"; return; }
    hs ckpt export "$work/model" --safetensors "$work/hf"
    [ "$rc" -eq 0 ] || { fail "export: rc $rc: $out"; return; }
    expect_text export "exported"
    cmp "$work/ref/model.safetensors" "$work/hf/model.safetensors" || fail "exported weights differ from hs_hf_save's"
    cmp "$work/ref/config.json" "$work/hf/config.json" || fail "exported config.json differs"
    hs import "$work/hf"
    expect_text import "matches"
    hs ckpt export "$d" --safetensors "$work/hf2"
    [ "$rc" -ne 0 ] || fail "export of a checkpoint without config.yaml passed"
    expect_text "no config" "has no config.yaml"
}

test_inspect_lists_state_files_tensors_and_chunks
test_bad_directory_and_bad_usage_exit_2
test_verify_passes_then_names_a_flipped_byte
test_truncated_file_names_lengths_and_tensor
test_export_of_a_sharded_checkpoint_equals_the_full_weights
hs_finish
