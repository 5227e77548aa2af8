#!/usr/bin/env bash
# `hypershard bench cp --quick` under 4 ranks trains FSDP 4 and CP 2 / CP 4
# with allgather, ring and alltoall, and CP 4 alltoall_ring over pairs, side
# by side (parameters sharded over all 4 ranks in every layout) and prints
# one row each: FSDP alone issues nothing on the cp group; every CP layout
# does and spends time in it; the device peak per rank falls with the
# rank's share of the sequence. The quick model's 2 heads do not split over
# CP 4's all-to-all: that layout is skipped, saying so.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch cp_bench
"$MPIEXEC" -n 4 "$HS_BIN" bench cp --quick > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
cat "$work/out"
python3 - "$work/out" <<'PY'
import sys
names = ("FSDP W", "CP 2 allgather", "CP 2 ring", "CP 2 alltoall", "CP 4 allgather",
         "CP 4 ring", "CP 4 alltoall_ring (a2a 2)")
assert "CP 4 alltoall: skipped" in open(sys.argv[1]).read()
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 9 and c[0] in names:
        rows[c[0]] = [float(x.rstrip("%")) for x in c[1:]]
assert sorted(rows) == sorted(names), rows
seqs, step, cp_ms, share, colls, mb, peak, tok = range(8)
f = rows["FSDP W"]
assert f[colls] == 0 and f[mb] == 0 and f[cp_ms] == 0, f
for n in names[1:]:
    assert rows[n][colls] > 0 and rows[n][mb] > 0 and rows[n][cp_ms] > 0, (n, rows[n])
for how in ("allgather", "ring"):
    assert rows["CP 4 " + how][peak] < rows["CP 2 " + how][peak] < f[peak], (how, rows)
assert rows["CP 4 alltoall_ring (a2a 2)"][peak] < rows["CP 2 alltoall"][peak] < f[peak], rows
print("bench cp rows check out")
PY
