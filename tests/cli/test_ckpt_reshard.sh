#!/usr/bin/env bash
# ckpt/: a checkpoint saved on W ranks loads on W' ranks under another
# layout, bit for bit (RFC 000 §8.4): 2 -> 2 uneven, 2 -> 4 with zero-length
# shards, 4 -> 2, FSDP <-> HSDP, one process <-> sharded. HSDP replicas are
# written once and the data files hold no padding (tests/mpi/test_ckpt_reshard
# checks every element, the padded tail and the trainer state).
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 150
set -u
PROG="$HS_BUILD/test_ckpt_reshard"
[ -x "$PROG" ] || { echo "missing $PROG (build the test_ckpt_reshard target)"; exit 1; }
work=$(mktemp -d /tmp/hs_cli_ckpt_reshard_XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# tool N ARGS...: the test program on N ranks; sets rc and out.
tool() {
    local n=$1
    shift
    out=$(timeout 60 "$MPIEXEC" -n "$n" "$PROG" "$@" 2>&1)
    rc=$?
}
save() { # N LAYOUT DIR STEP
    tool "$1" save "$3" "$4" "$2"
    [ "$rc" -eq 0 ] || fail "save on $1 ranks ($2) to $3: rc $rc: $out"
}
load() { # N LAYOUT DIR STEP
    tool "$1" load "$3" "$4" "$2"
    [ "$rc" -eq 0 ] || fail "load $3 on $1 ranks ($2): rc $rc: $out"
}
files_are() { # STEPDIR EXPECTED...: the data files, sorted
    local got
    got=$(cd "$1" && ls rank-*.bin 2>/dev/null | sort | tr '\n' ' ')
    [ "$got" = "$2" ] || fail "$1 holds data files '$got', want '$2'"
}
# 10x4 + 10x4 + 10x4 f32, 5x3 bf16, 2x(5x3) f32, 3 f32, 2x3 f32, 7x4x2 f16, 6 f32
ACTUAL_BYTES=$(( (40 * 3 + 15 * 2 + 3 + 6 + 6) * 4 + 15 * 2 + 56 * 2 ))
bytes_are_actual() { # STEPDIR
    local total
    total=$(cat "$1"/rank-*.bin | wc -c)
    [ "$total" -eq "$ACTUAL_BYTES" ] || fail "$1: data files hold $total bytes, the tensors $ACTUAL_BYTES"
}

test_w2_uneven_save_loads_on_2_4_1_ranks_and_into_hsdp() {
    save 2 fsdp "$work/w2" 1
    files_are "$work/w2/step-1" "rank-0.bin rank-1.bin "
    bytes_are_actual "$work/w2/step-1"
    load 2 fsdp "$work/w2" 1
    load 4 fsdp "$work/w2" 1   # 3-row and 2-row tensors: zero-length shards on ranks 2, 3
    load 1 full "$work/w2" 1
    load 4 hsdp "$work/w2" 1
    load 2 hsdp "$work/w2" 1
    load 3 fsdp "$work/w2/step-1" 1
}

test_w4_save_loads_on_2_and_1_ranks() {
    save 4 fsdp "$work/w4" 2
    files_are "$work/w4/step-2" "rank-0.bin rank-1.bin rank-2.bin rank-3.bin "
    bytes_are_actual "$work/w4/step-2"
    load 2 fsdp "$work/w4" 2
    load 1 full "$work/w4" 2
}

test_hsdp_2x2_writes_replicas_once_and_loads_into_fsdp() {
    save 4 hsdp "$work/h4" 3
    files_are "$work/h4/step-3" "rank-0.bin rank-1.bin "
    bytes_are_actual "$work/h4/step-3"
    load 2 fsdp "$work/h4" 3
    load 4 fsdp "$work/h4" 3
    load 1 full "$work/h4" 3
}

test_single_process_save_loads_sharded() {
    save 1 full "$work/w1" 4
    files_are "$work/w1/step-4" "rank-0.bin "
    bytes_are_actual "$work/w1/step-4"
    load 4 fsdp "$work/w1" 4
    load 2 hsdp "$work/w1" 4
}

test_a_load_checked_against_other_values_fails() {
    tool 2 load "$work/w2" 9 fsdp
    [ "$rc" -ne 0 ] || fail "loading step-1 as step 9 passed: the check cannot fail"
}

test_w2_uneven_save_loads_on_2_4_1_ranks_and_into_hsdp
test_w4_save_loads_on_2_and_1_ranks
test_hsdp_2x2_writes_replicas_once_and_loads_into_fsdp
test_single_process_save_loads_sharded
test_a_load_checked_against_other_values_fails
[ "$failures" -eq 0 ] || exit 1
echo OK
