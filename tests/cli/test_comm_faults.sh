#!/usr/bin/env bash
# comm/: a hung collective and hs_comm_abort end every rank, non-zero, with
# one message that names what went wrong (and one line from another rank
# pointing at it); nothing hangs.
# HS_MPI_RANKS: 3
# HS_TEST_TIMEOUT: 120
set -u
PROG="$HS_BUILD/test_comm_faults"
[ -x "$PROG" ] || { echo "missing $PROG (build the test_comm_faults target)"; exit 1; }
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME ARGS...: runs the program on 3 ranks; sets rc, secs, out.
run() {
    local start=$SECONDS
    out=$(timeout 60 "$MPIEXEC" -n 3 "$PROG" "$@" 2>&1)
    rc=$?
    secs=$((SECONDS - start))
}

expect_text() { # what text
    grep -qF -- "$2" <<<"$out" || fail "$1: output lacks '$2'"
}

test_hang_on_world_ends_all_ranks_naming_op_group_seq_and_missing_rank() {
    run hang 1 20 world
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang world: exit code $rc (want non-zero, no timeout)"
    [ "$secs" -lt 15 ] || fail "hang world: took $secs s with a 2 s watchdog"
    expect_text "hang world" "comm timeout: all_reduce on group 'world' (sequence 3)"
    expect_text "hang world" "not arrived: world rank 1"
    expect_text "hang world" "arrived: world ranks "
    [ "$(grep -c 'comm timeout' <<<"$out")" -eq 1 ] || fail "hang world: want exactly one timeout message"
}

test_hang_on_subgroup_names_the_subgroup() {
    run hang 1 20 pair
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang pair: exit code $rc"
    expect_text "hang pair" "all_reduce on group 'pair' (sequence 3)"
    expect_text "hang pair" "not arrived: world rank 1"
}

test_abort_on_one_rank_ends_all_ranks_with_its_exit_code() {
    run abort 2
    [ "$rc" -eq 2 ] || fail "abort: exit code $rc (want 2, the config error's code)"
    [ "$secs" -lt 15 ] || fail "abort: took $secs s"
    expect_text "abort" "rank 2 of 3: train.steps = -1 must be >= 1"
    # One other rank says, in one line, who ended the job.
    expect_text "abort" "rank 0 of 3: stopping: rank 2 failed (its message is above)"
    [ "$(grep -c "stopping: rank" <<<"$out")" -eq 1 ] || fail "abort: not exactly one pointing line"
    run abort 0
    expect_text "abort 0" "rank 0 of 3: train.steps = -1 must be >= 1"
    expect_text "abort 0" "rank 1 of 3: stopping: rank 0 failed (its message is above)"
}

test_hang_on_world_ends_all_ranks_naming_op_group_seq_and_missing_rank
test_hang_on_subgroup_names_the_subgroup
test_abort_on_one_rank_ends_all_ranks_with_its_exit_code
if pgrep -f "$PROG" >/dev/null; then fail "processes of $PROG are still running"; fi
[ "$failures" -eq 0 ] || { echo "$out"; exit 1; }
echo OK
