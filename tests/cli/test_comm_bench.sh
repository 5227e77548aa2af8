#!/usr/bin/env bash
# `hypershard bench comm`: the table of our collectives next to MPI's, and
# its usage errors.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 90
set -u
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

test_quick_bench_prints_both_sizes_all_ops_and_targets() {
    local out rc
    out=$(timeout 60 "$MPIEXEC" -n 2 "$HS_BIN" bench comm --quick --iters 1 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] || fail "bench comm --quick exited $rc"
    grep -q "MPI_Allgather.*MPI_Reduce_scatter_block.*MPI_Allreduce" <<<"$out" || fail "no header"
    # size, then 3 x (ours, MPI, ratio): 10 cells of numbers per row.
    for size in "1 MiB" "4 MiB"; do
        grep -Eq "^\| $size +(\| +[0-9.]+x? +){9}\|$" <<<"$out" || fail "no full row for $size"
    done
    grep -q "reduce-scatter >= 10x MPI_Reduce_scatter_block" <<<"$out" || fail "no targets"
    [ "$failures" -eq 0 ] || echo "$out"
}

test_bad_arguments_are_usage_errors() {
    local rc
    "$HS_BIN" bench comm --iters zero >/dev/null 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || fail "--iters zero exited $rc, want 2"
    "$HS_BIN" bench comm --bogus >/dev/null 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || fail "--bogus exited $rc, want 2"
}

test_quick_bench_prints_both_sizes_all_ops_and_targets
test_bad_arguments_are_usage_errors
[ "$failures" -eq 0 ] || exit 1
echo OK
