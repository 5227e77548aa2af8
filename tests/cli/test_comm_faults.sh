#!/usr/bin/env bash
# comm/: a hung collective, a pipeline send or recv whose peer never posts
# its match, and hs_comm_abort end every rank, non-zero, with one message
# that names what went wrong (and one line from another rank pointing at
# it); nothing hangs. A watchdog timeout ends the job within
# comm.timeout_s + 2 s of the hung operation's start, also when the missing
# rank is stopped (SIGSTOP) and cannot answer.
# HS_MPI_RANKS: 3
# HS_TEST_TIMEOUT: 120
set -u
PROG="$HS_BUILD/test_comm_faults"
[ -x "$PROG" ] || { echo "missing $PROG (build the test_comm_faults target)"; exit 1; }
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run ARGS...: runs the program on 3 ranks; sets rc, secs, out and, when a
# rank printed "hang-start T" before the hung operation, late: the seconds
# from T to the job's end.
run() {
    local start=$SECONDS
    out=$(timeout 60 "$MPIEXEC" -n 3 "$PROG" "$@" 2>&1)
    rc=$?
    secs=$((SECONDS - start))
    late=$(awk -v end="$(date +%s.%N)" '/^hang-start /{printf "%.2f", end - $2; exit}' <<<"$out")
}

# ends_in_time WHAT: the job ended within the 2 s timeout + 2 s of the
# hung operation's start (the watchdog's poll, its questions to the other
# ranks and MPI_Abort's teardown share the 2 s).
ends_in_time() {
    if [ -z "$late" ]; then fail "$1: no hang-start line"; return; fi
    awk -v l="$late" 'BEGIN { exit !(l <= 4.0) }' ||
        fail "$1: ended $late s after the hung operation began (want <= 4 s)"
}

expect_text() { # what text
    grep -qF -- "$2" <<<"$out" || fail "$1: output lacks '$2'"
}

test_hang_on_world_ends_all_ranks_naming_op_group_seq_and_missing_rank() {
    run hang 1 20 world
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang world: exit code $rc (want non-zero, no timeout)"
    [ "$secs" -lt 15 ] || fail "hang world: took $secs s with a 2 s watchdog"
    ends_in_time "hang world"
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

test_hang_in_all_to_allv_on_the_critical_queue_names_it() {
    run hang 2 20 ep
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang ep: exit code $rc"
    ends_in_time "hang ep"
    expect_text "hang ep" "comm timeout: all_to_allv on group 'ep' (sequence 3)"
    expect_text "hang ep" "not arrived: world rank 2"
    expect_text "hang ep" "its communication thread (critical queue) is idle"
}

# Rank 0, which grants the right to report, stopped: rank 1 grants it.
test_hang_with_the_missing_rank_stopped_ends_all_within_timeout_plus_2s() {
    local who
    for who in 1 0; do
        run hang "$who" stop world
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "hang stopped $who: exit code $rc"
        ends_in_time "hang stopped $who"
        expect_text "hang stopped $who" "comm timeout: all_reduce on group 'world' (sequence 3)"
        expect_text "hang stopped $who" "world rank $who: did not answer the watchdog (stopped"
        [ "$(grep -c 'comm timeout' <<<"$out")" -eq 1 ] ||
            fail "hang stopped $who: want exactly one timeout message"
    done
}

# p2p OP: rank 0 starts OP with rank 1 on a pipeline queue, where it stays
# in flight (the thread goes on) while rank 1 never posts the match.
test_p2p_in_flight_without_match_ends_all_naming_op_peer_group_and_number() {
    local op peer
    for op in recv send; do
        run p2p 1 20 "$op"
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "p2p $op: exit code $rc (want non-zero, no timeout)"
        ends_in_time "p2p $op"
        [ "$op" = send ] && peer="to" || peer="from"
        expect_text "p2p $op" "comm timeout: $op $peer world rank 1 on group 'pp' (send/recv number 2)"
        expect_text "p2p $op" "not arrived: world rank 1"
        expect_text "p2p $op" "world rank 1: its communication thread (pp_forward queue) is idle"
        expect_text "p2p $op" "the program has not issued the matching"
        [ "$(grep -c 'comm timeout' <<<"$out")" -eq 1 ] || fail "p2p $op: want exactly one timeout message"
    done
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
test_hang_in_all_to_allv_on_the_critical_queue_names_it
test_hang_with_the_missing_rank_stopped_ends_all_within_timeout_plus_2s
test_p2p_in_flight_without_match_ends_all_naming_op_peer_group_and_number
test_abort_on_one_rank_ends_all_ranks_with_its_exit_code
if pgrep -f "$PROG" >/dev/null; then fail "processes of $PROG are still running"; fi
[ "$failures" -eq 0 ] || { echo "$out"; exit 1; }
echo OK
