#!/usr/bin/env bash
# `hypershard bench tp --quick` under 4 ranks trains FSDP 4, TP 2 x FSDP 2
# and TP 2 x FSDP 2 with sequence parallel side by side and prints one row
# each: FSDP alone spends nothing and issues nothing on the tp group; both
# TP layouts spend time in TP collectives and issue them; with TP each FSDP
# collective moves half the bytes (each rank shards half the model).
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tp_bench
"$MPIEXEC" -n 4 "$HS_BIN" bench tp --quick > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
cat "$work/out"
python3 - "$work/out" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 9 and c[0] in ("FSDP W", "TP 2 x FSDP W/2", "TP 2 x FSDP W/2, SP + loss parallel"):
        rows[c[0]] = [float(x.rstrip("%")) for x in c[1:]]
assert len(rows) == 3, rows
f, t, s = rows["FSDP W"], rows["TP 2 x FSDP W/2"], rows["TP 2 x FSDP W/2, SP + loss parallel"]
step, tp_ms, share, tp_colls, tp_mb, dp_colls, dp_mb, tok = range(8)
assert f[step] > 0 and t[step] > 0 and s[step] > 0
assert f[tp_ms] == 0 and f[tp_colls] == 0 and f[tp_mb] == 0, f
for r in (t, s):
    assert r[tp_ms] > 0 and r[tp_colls] > 0 and r[tp_mb] > 0, r
    assert abs(r[dp_mb] - f[dp_mb] / 2) <= 0.02 * f[dp_mb], (r[dp_mb], f[dp_mb])
# sequence parallel: all-gathers and reduce-scatters instead of all-reduces
assert s[tp_colls] > t[tp_colls], (s, t)
print("bench tp rows check out")
PY
