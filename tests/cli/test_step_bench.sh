#!/usr/bin/env bash
# `hypershard bench step --quick` builds its one-process engines and prints
# a step time and an MFU in (0, 100%) for each of its two models.
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch step_bench
"$HS_BIN" bench step --quick --steps 1 > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
cat "$work/out"
python3 - "$work/out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
mfu = dict(re.findall(r"^(\S+)\s+\d+ tok/s .*MFU\s+([0-9.]+)%", text, re.M))
steps = dict(re.findall(r"^(\S+)\s+[0-9.]+M .*\| step\s+([0-9.]+) s", text, re.M))
assert set(mfu) == set(steps) == {"demo", "gpt2-small-quick"}, (mfu, steps)
for name in mfu:
    assert 0 < float(mfu[name]) < 100, (name, mfu[name])
    assert float(steps[name]) > 0, (name, steps[name])
PY
echo "ok"
