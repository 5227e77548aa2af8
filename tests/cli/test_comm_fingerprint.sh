#!/usr/bin/env bash
# Collective fingerprints in `hypershard train` on 2 ranks: with no fault
# the checks change no loss; a collective issued with another size or
# another reduction on one rank (HS_COMM_TEST_FAULT) ends the job non-zero
# at the first check after it, with one message naming the group, the
# sequence number and what each side issued; in the debug mode
# (comm.check_every = 1) a skipped collective is caught before the next
# one runs, and without checks the watchdog's timeout report names it.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch fingerprint
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.steps=4
      train.eval_every=0)
group=fsdp_replicate # the 2-rank data-parallel group of this model's gradients

# faulty NAME FAULT ARGS...: the 2-rank run with HS_COMM_TEST_FAULT=FAULT;
# sets rc, secs and out.
faulty() {
    local name=$1 fault=$2 start=$SECONDS
    shift 2
    HS_COMM_TEST_FAULT=$fault timeout 90 "$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" "$@" \
        train.out_dir="$work/$name" > "$work/$name.txt" 2>&1
    rc=$?
    secs=$((SECONDS - start))
    out=$(cat "$work/$name.txt")
}

expect_text() { # name text
    grep -qF -- "$2" <<<"$out" || { fail "$1: output lacks '$2'"; sed 's/^/    /' <<<"$out" | head -30; }
}

ended() { # name max_secs: non-zero, not the timeout guard, in time
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "$1: exit code $rc (want non-zero, no hang)"
    [ "$secs" -le "$2" ] || fail "$1: took $secs s (want <= $2 s)"
}

# 1. No fault: checking every 2 steps, and the debug mode, give the losses
#    of a run without checks, bit for bit.
hs_train off 2 comm.check_every=0
hs_train every2 2 comm.check_every=2
hs_train debug 2 comm.check_every=1
python3 - "$work"/off/metrics.jsonl "$work"/every2/metrics.jsonl "$work"/debug/metrics.jsonl <<'PY' \
    || fail "checks changed the losses"
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert all(len(r) == 4 for r in runs), [len(r) for r in runs]
for r in runs[1:]:
    for x, y in zip(runs[0], r):
        assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
PY

# 2. One element fewer on rank 1 in step 1: the check after step 2 ends the
#    run before step 3, naming both sides.
faulty count "count:1:$group:3" comm.check_every=2
ended count 30
expect_text count "collective fingerprint mismatch at the check after step 2: group '$group', sequence 3: world rank 0 issued all_reduce float32 x "
n0=$(sed -n "s/.*world rank 0 issued all_reduce float32 x \([0-9]*\) (sum); world rank 1 issued all_reduce float32 x \([0-9]*\) (sum).*/\1 \2/p" <<<"$out")
read -r a b <<<"$n0"
[ -n "${a:-}" ] && [ "$b" -eq $((a - 1)) ] || fail "count: want sizes N and N-1 on the two sides, got '$n0'"
[ "$(grep -c 'collective fingerprint mismatch' <<<"$out")" -eq 1 ] || fail "count: want one message"
grep -q '^step 3/' <<<"$out" && fail "count: step 3 ran after the mismatch"

# 3. Another reduction on rank 1 (the same size: nothing else would notice)
#    in step 1, caught at the check after step 3.
faulty reduce "reduce:1:$group:3" comm.check_every=3
ended reduce 30
expect_text reduce "collective fingerprint mismatch at the check after step 3: group '$group', sequence 3:"
expect_text reduce "(sum); world rank 1 issued all_reduce float32 x "
grep -qE "world rank 1 issued all_reduce float32 x [0-9]+ \(avg\)" <<<"$out" || fail "reduce: rank 1's side"

# 4. Debug mode: rank 1 skips a collective; the next one it issues on the
#    group is compared with rank 0's third and the run ends at once, long
#    before the 60 s watchdog.
faulty skip_debug "skip:1:$group:3" comm.check_every=1 comm.timeout_s=60
ended skip_debug 20
expect_text skip_debug "collective fingerprint mismatch (comm.check_every = 1 compares each collective before it runs): group '$group', sequence 3: world rank 0 issued all_reduce"
grep -q '^step 1/' <<<"$out" && fail "skip_debug: step 1 completed"

# 5. No checks: the skip hangs rank 0, and the watchdog's report names the
#    first collective that differs.
faulty skip_watchdog "skip:1:$group:3" comm.check_every=0 comm.timeout_s=3
ended skip_watchdog 30
expect_text skip_watchdog "comm timeout"
expect_text skip_watchdog "collective fingerprints differ: group '$group', sequence 3: world rank "

# A malformed hook is refused.
faulty badhook "count:1:$group" comm.check_every=0
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "badhook: exit code $rc"
expect_text badhook "HS_COMM_TEST_FAULT = 'count:1:$group': want skip|count|reduce:RANK:GROUP:SEQ"

hs_finish
