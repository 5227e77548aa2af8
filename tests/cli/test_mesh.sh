#!/usr/bin/env bash
# `hypershard mesh`: the table for a 16-rank pp2 × dp2 × cp2 × tp2 layout,
# every topology rule reported at once with exit code 2, usage errors.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch mesh
out="$work/out"
err="$work/err"

# A valid layout prints its sizes, every rank's coordinates and the groups.
"$HS_BIN" mesh --world 16 pp=2 cp=2 tp=2 ep=2 dp_shard=2 >"$out" 2>"$err" || die "valid layout exited $?"
grep -qF "world 16 = pp 2 × dp 2 × cp 2 × tp 2" "$out" || die "size line missing"
grep -qF "FSDP: shard 2 × replicate 2 over dp×cp = 4; experts: shard 1 × replicate 4 over edp = 4 (ep=2)" "$out" \
  || die "FSDP line missing"
[ "$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$out")" -eq 16 ] || die "expected 16 coordinate rows"
# rank 13 = pp 1, dp 1, cp 0, tp 1; fsdp_replicate 1, fsdp_shard 0; edp_replicate 2, ep 1
grep -qE '^ +13 +1 +1 +0 +1 +1 +0 +2 +0 +1$' "$out" || die "row of rank 13 wrong"
grep -qE '^tp +8 × 2 +\[0 1\] \[2 3\] \[4 5\] \[6 7\] \[8 9\] \[10 11\] \[12 13\] \[14 15\]$' "$out" || die "tp groups wrong"
grep -qE '^pp +8 × 2 +\[0 8\] \[1 9\] ' "$out" || die "pp groups wrong"
grep -qE '^fsdp_shard +8 × 2 +\[0 2\] \[4 6\] \[1 3\] \[5 7\] ' "$out" || die "fsdp_shard groups wrong"
grep -qE '^dp_cp +4 × 4 +\[0 2 4 6\] \[1 3 5 7\] \[8 10 12 14\] \[9 11 13 15\]$' "$out" || die "dp_cp groups wrong"
grep -qF "pipeline: model.n_layers 4 over pp 2" "$out" || die "pipeline line missing"
grep -qE '^stage 0 +layers \[0, 2\)  ranks 0-7$' "$out" || die "stage 0 wrong"
grep -qE '^stage 1 +layers \[2, 4\)  ranks 8-15$' "$out" || die "stage 1 wrong"
[ ! -s "$err" ] || die "stderr not empty: $(cat "$err")"

# The stages split n_layers evenly, extra blocks to the middle stages.
"$HS_BIN" mesh --world 8 pp=4 n_layers=10 >"$out" || die "pp 4 over 10 blocks exited $?"
grep -qE '^stage 1 +layers \[2, 5\)  ranks 2-3$' "$out" || die "stage 1 of 10 blocks wrong"
grep -qE '^stage 3 +layers \[8, 10\)  ranks 6-7$' "$out" || die "stage 3 of 10 blocks wrong"
"$HS_BIN" mesh --world 4 tp=2 >"$out"
! grep -q "^pipeline:" "$out" || die "stages printed without pp"
set +e
"$HS_BIN" mesh --world 4 pp=4 model.n_layers=3 >"$out" 2>"$err"; rc=$?
set -e
[ "$rc" -eq 2 ] || die "pp 4 over 3 blocks exited $rc"
grep -qF "accelerator.pp_size = 4 exceeds model.n_layers = 3" "$err" || die "pp > n_layers not named"

# Config paths work as keys too.
"$HS_BIN" mesh --world=8 accelerator.tp_size=2 fsdp_config.dp_shard_size=4 >"$out"
grep -qF "FSDP: shard 4 × replicate 1 over dp×cp = 4" "$out" || die "config-path keys ignored"

# A single rank skips FSDP.
"$HS_BIN" mesh --world 1 >"$out"
grep -qF "skipped: world size 1" "$out" || die "world 1 not skipped"

# A bad topology: every rule at once, exit 2, nothing on stdout.
set +e
"$HS_BIN" mesh --world 8 dp_shard=3 ep=3 edp_shard=0 >"$out" 2>"$err"
rc=$?
set -e
[ "$rc" -eq 2 ] || die "bad topology exited $rc, expected 2"
[ ! -s "$out" ] || die "bad topology printed a table"
grep -qF "3 configuration errors" "$err" || die "error count missing: $(cat "$err")"
grep -qF "fsdp_config.edp_shard_size=0 must be >= 1" "$err" || die "rule 2 missing"
grep -qF "fsdp_config.dp_shard_size=3 does not divide the DP×CP domain of 8 (dp=8, cp=1); use one of 1, 2, 4, 8" "$err" \
  || die "rule 5 missing"
grep -qF "accelerator.ep_size=3 does not divide the expert domain" "$err" || die "rule 6 missing"

set +e
"$HS_BIN" mesh --world 6 tp=2 cp=2 >"$out" 2>"$err"; rc=$?
set -e
[ "$rc" -eq 2 ] || die "world 6 tp2 cp2 exited $rc"
grep -qF "world size 6 is not divisible by accelerator.tp_size × cp_size × pp_size = 4 (tp=2, cp=2, pp=1)" "$err" \
  || die "rule 4 missing"

# Usage errors: missing --world, unknown key, non-integer value.
for args in "tp=2" "--world 4 bogus=1" "--world 4 tp=two" "--world"; do
  set +e
  # shellcheck disable=SC2086
  "$HS_BIN" mesh $args >"$out" 2>"$err"; rc=$?
  set -e
  [ "$rc" -eq 2 ] || die "'mesh $args' exited $rc, expected 2"
  grep -qF "usage: hypershard mesh" "$err" || die "'mesh $args' printed no usage"
done
"$HS_BIN" mesh --help | grep -qF "usage: hypershard mesh" || die "--help"

# The table is linear in the world size: 65536 ranks take well under a
# second (one group listing per dim was quadratic, over a minute).
set +e
timeout 10 "$HS_BIN" mesh --world 65536 tp=8 pp=4 ep=2 dp_shard=8 >"$out" 2>"$err"; rc=$?
set -e
[ "$rc" -eq 0 ] || die "mesh --world 65536 exited $rc (124: over 10 s)"
grep -qE '^tp +8192 × 8 +\[0 1 2 3 4 5 6 7\] ' "$out" || die "world 65536: tp groups wrong"
grep -qE '^pp +16384 × 4 +\[0 16384 32768 49152\] ' "$out" || die "world 65536: pp groups wrong"
echo "ok"
