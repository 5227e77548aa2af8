#!/usr/bin/env bash
# `hypershard bench step --quick` builds its one-process engines and prints
# a step time, tokens/s and a positive MFU for each of its two models. (No
# upper bound on MFU here: the suite runs tests side by side, and the sgemm
# windows and the step it times are then slowed unevenly; a loaded run read
# 100.4% for the demo model. docs/performance.md has quiet-machine figures.)
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch step_bench
"$HS_BIN" bench step --quick --steps 1 > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
cat "$work/out"
python3 - "$work/out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
mfu = dict(re.findall(r"^(\S+)\s+(?:\d+) tok/s .*MFU\s+([0-9.]+)%", text, re.M))
tok = dict(re.findall(r"^(\S+)\s+(\d+) tok/s", text, re.M))
steps = dict(re.findall(r"^(\S+)\s+[0-9.]+M .*\| step\s+([0-9.]+) s", text, re.M))
assert set(mfu) == set(steps) == set(tok) == {"demo", "gpt2-small-quick"}, (mfu, steps, tok)
for name in mfu:
    assert float(mfu[name]) > 0, (name, mfu[name])
    assert float(steps[name]) > 0 and int(tok[name]) > 0, (name, steps[name], tok[name])
PY
echo "ok"
