#!/usr/bin/env bash
# `hypershard bench moe --quick` under 4 ranks trains the MoE at EP 1, 2
# and 4 side by side and prints one row each: EP 1 spends nothing and issues
# nothing on an ep group; EP 2 and EP 4 exchange 5 times per block per step
# (counts, rows out, outputs back; two more in backward), sum the expert
# grad-norm squares over ep once, and spend time in it; the FSDP bytes fall
# as each rank shards fewer experts.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch moe_bench
"$MPIEXEC" -n 4 "$HS_BIN" bench moe --quick > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
cat "$work/out"
python3 - "$work/out" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 10 and c[0].startswith("EP "):
        rows[c[0].split()[1]] = [float(x.rstrip("%")) for x in c[1:]]
assert sorted(rows) == ["1", "2", "4"], rows
step, a2a_ms, share, a2a_calls, a2a_mb, dp_colls, dp_mb, peak, tok = range(9)
e1, e2, e4 = rows["1"], rows["2"], rows["4"]
assert all(r[step] > 0 and r[tok] > 0 for r in (e1, e2, e4))
assert e1[a2a_ms] == 0 and e1[a2a_calls] == 0 and e1[a2a_mb] == 0, e1
for r in (e2, e4):
    # 5 exchanges per block, and the grad norm's sum of expert squares over ep
    assert r[a2a_ms] > 0 and r[a2a_calls] == 5 * 2 + 1 and r[a2a_mb] > 0, r
assert e1[dp_mb] > e2[dp_mb] > e4[dp_mb], (e1[dp_mb], e2[dp_mb], e4[dp_mb])
print("bench moe rows check out")
PY
