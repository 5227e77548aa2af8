#!/bin/bash
# Every example in configs/ runs as its header says: at the rank count of its
# `mpiexec -n N` line (1 without one; a `--world M` line must agree),
# `hypershard config FILE --world N` accepts it, and `hypershard train FILE`
# under mpiexec -n N trains 2 steps to finite losses. Overrides keep each run
# short and leave the config's own parallel layout alone.
#
# HS_CONFIGS_SKIP="tp.yaml other.yaml" (spaces or commas) leaves files out;
# nothing is skipped by default.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch configs

# Two steps, no evaluation, checkpoint or trace, logged every step.
fast=(train.steps=2 train.eval_every=0 train.log_every=1 optimizer.schedule.warmup_steps=0
      checkpoint.dir=null checkpoint.resume=none trace.enabled=false)

skip=" ${HS_CONFIGS_SKIP:-} "
skip=${skip//,/ }

# header_count FILE REGEX: the number ending the first header comment line
# that matches REGEX, or nothing.
header_count() {
    awk '!/^#/ { exit } { print }' "$1" | grep -oE -- "$2" | head -1 | grep -oE '[0-9]+$'
}

# why LOG: hypershard's own error lines, else the end of LOG (mpiexec's
# report of who exited follows them).
why() { grep -m 5 '^hypershard' "$1" || tail -5 "$1"; }

ran=0
for f in "$HS_SRC"/configs/*.yaml; do
    name=$(basename "$f")
    if [[ "$skip" == *" $name "* ]]; then
        echo "skip $name (HS_CONFIGS_SKIP)"
        continue
    fi
    n=$(header_count "$f" 'mpiexec -n [0-9]+')
    n=${n:-1}
    world=$(header_count "$f" '--world [0-9]+')
    if [ -n "$world" ] && [ "$world" != "$n" ]; then
        fail "$name: its header says --world $world but mpiexec -n $n"
        continue
    fi
    if ! "$HS_BIN" config "$f" --world "$n" >"$work/$name.config" 2>&1; then
        fail "$name: hypershard config --world $n failed: $(tail -5 "$work/$name.config")"
        continue
    fi
    out="$work/${name%.yaml}"
    timeout 120 "$MPIEXEC" -n "$n" "$HS_BIN" train "$f" "${fast[@]}" train.out_dir="$out" \
        >"$work/$name.train" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name: mpiexec -n $n hypershard train exited $rc: $(why "$work/$name.train")"
        continue
    fi
    if ! python3 - "$out/metrics.jsonl" >"$work/$name.check" 2>&1 <<'PY'; then
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2], [r["step"] for r in rows]
assert all(math.isfinite(r["loss"]) for r in rows), [r["loss"] for r in rows]
PY
        fail "$name: metrics after 2 steps: $(tail -3 "$work/$name.check")"
        continue
    fi
    echo "ok $name on $n rank(s)"
    ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || [ "$failures" -gt 0 ] || fail "no config in $HS_SRC/configs was run"
hs_finish
