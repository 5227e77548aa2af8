#!/usr/bin/env bash
# ckpt/: a save killed in the middle (HS_CKPT_TEST_KILL_AFTER_BYTES makes one
# rank _exit(9) after writing that many bytes of its data file) leaves the
# previous checkpoint intact, loadable and named by `latest`; the next save
# clears the leftover temporary directory and succeeds.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
PROG="$HS_BUILD/test_ckpt_reshard"
[ -x "$PROG" ] || { echo "missing $PROG (build the test_ckpt_reshard target)"; exit 1; }
work=$(mktemp -d /tmp/hs_cli_ckpt_atomic_XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
d="$work/ckpt"

tool() { # N ARGS...
    local n=$1
    shift
    out=$(timeout 60 "$MPIEXEC" -n "$n" "$PROG" "$@" 2>&1)
    rc=$?
}

previous_is_intact() { # WHAT
    [ "$(cat "$d/latest")" = "step-1" ] || fail "$1: latest is '$(cat "$d/latest")', want step-1"
    [ ! -e "$d/step-2" ] || fail "$1: a partial step-2 was published"
    tool 2 load "$d" 1 fsdp
    [ "$rc" -eq 0 ] || fail "$1: step-1 no longer loads on 2 ranks: $out"
    tool 1 load "$d" 1 full
    [ "$rc" -eq 0 ] || fail "$1: step-1 no longer loads on 1 rank: $out"
    if [ -n "${HS_BIN:-}" ] && [ -x "$HS_BIN" ]; then
        "$HS_BIN" ckpt verify "$d" >/dev/null 2>&1 || fail "$1: ckpt verify fails on step-1"
    fi
}

test_rank1_killed_mid_write_leaves_step1_loadable() {
    tool 2 save "$d" 1 fsdp
    [ "$rc" -eq 0 ] || { fail "first save: $out"; return; }
    out=$(HS_CKPT_TEST_KILL_AFTER_BYTES=100 timeout 60 "$MPIEXEC" -n 2 "$PROG" save "$d" 2 fsdp 2>&1)
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "killed save: exit code $rc"
    grep -q "HS_CKPT_TEST_KILL_AFTER_BYTES: exiting after 100 bytes" <<<"$out" || fail "the kill hook did not fire: $out"
    local part
    part=$(stat -c %s "$d/.tmp-step-2/rank-1.bin" 2>/dev/null || echo missing)
    [ "$part" = "100" ] || fail "rank-1.bin of the killed save is '$part' bytes, want 100 (killed mid-write)"
    previous_is_intact "rank 1 killed"
}

test_rank0_killed_before_metadata_leaves_step1_loadable() {
    out=$(HS_CKPT_TEST_KILL_RANK=0 HS_CKPT_TEST_KILL_AFTER_BYTES=0 timeout 60 "$MPIEXEC" -n 2 "$PROG" save "$d" 2 fsdp 2>&1)
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "killed save: exit code $rc"
    previous_is_intact "rank 0 killed"
}

test_next_save_clears_the_leftover_and_moves_latest() {
    tool 2 save "$d" 2 fsdp
    [ "$rc" -eq 0 ] || fail "save after the kill: $out"
    [ "$(cat "$d/latest")" = "step-2" ] || fail "latest is '$(cat "$d/latest")', want step-2"
    [ ! -e "$d/.tmp-step-2" ] || fail "the temporary directory is still there"
    tool 2 load "$d" 2 fsdp
    [ "$rc" -eq 0 ] || fail "step-2 does not load: $out"
}

test_rank1_killed_mid_write_leaves_step1_loadable
test_rank0_killed_before_metadata_leaves_step1_loadable
test_next_save_clears_the_leftover_and_moves_latest
if pgrep -f "$PROG" >/dev/null; then fail "processes of $PROG are still running"; fi
[ "$failures" -eq 0 ] || exit 1
echo OK
