#!/usr/bin/env bash
# `hypershard bench fsdp --quick` under 4 ranks measures W = 2 and W = 4
# with prefetch 0/1/2 x fusion off / copy-in / zero-copy, prints the nine
# rows of each table, and on its own counters: with fusion the collectives
# per step equal the per-unit minimum (one all-gather per unshard, one
# reduce-scatter per unit) and the bytes moved equal the theoretical minimum.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 180
set -euo pipefail
out=$(mktemp /tmp/hs_cli_bench_fsdp_XXXXXX)
trap 'rm -f "$out"' EXIT
"$MPIEXEC" -n 4 "$HS_BIN" bench fsdp --quick > "$out" 2>&1 || { cat "$out"; exit 1; }
cat "$out"
for W in 2 4; do
    grep -q "^W=$W  (8 blocks" "$out"
    grep -q "^W=$W: fusion collectives at the per-unit minimum: yes; bytes at the minimum: yes" "$out"
    for f in off copy-in zero-copy; do
        grep -q "^W=$W fusion $f *: exposed comm prefetch 1 / prefetch 0 = " "$out"
    done
done
# nine rows per W, and the fused rows at the minimum (26 for 8 blocks + root)
[ "$(grep -cE '^[012] +(off|copy-in|zero-copy) ' "$out")" = 18 ]
[ "$(grep -cE '^[012] +(copy-in|zero-copy) .* 26 \(  26\)' "$out")" = 12 ]
