#!/usr/bin/env bash
# Megatron-LM indexed datasets end to end: scripts/tokenize.py writes the
# same corpus (three input files, tokenized in parallel, byte ids) as an
# HSTK file and as PREFIX.bin/.idx; 3 training steps on each give bit for
# bit the same losses, gradient norms and weights (no EOS). A 0.7/0.3
# blend with an EOS between documents trains, and hostile or missing files
# (a truncated .bin, a wrong magic, a token beyond the vocabulary, a blend
# path that does not exist, a negative weight) stop `train` with exit 2,
# naming the file and the field, before out_dir exists.
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch data_indexed
tiny=("${HS_TINY[@]}" train.micro_batch_size=2 train.global_batch_size=4 train.steps=3
      train.eval_every=0 optimizer.schedule.warmup_steps=0)
mkdir -p "$work/in"
for i in 1 2 3; do
    python3 - "$work/in/part$i.txt" "$i" <<'PY'
import sys
words = "the cat sees a quiet dog near the river and many foxes sleep".split()
n = int(sys.argv[2])
paras = [" ".join(words[(p * 7 + j * n) % len(words)] for j in range(40)) for p in range(30)]
open(sys.argv[1], "w").write("\n\n".join(paras) + "\n")
PY
done
tok=("$HS_SRC/scripts/tokenize.py" "$work/in/part1.txt" "$work/in/part2.txt"
     "$work/in/part3.txt" --bytes --workers 3)
run_logged "$work/tok_hstk.log" python3 "${tok[@]}" --out "$work/hstk"
run_logged "$work/tok_idx.log" python3 "${tok[@]}" --out "$work/idx" --format indexed
grep -q "3 documents" "$work/tok_idx.log" || fail "one document per file: $(cat "$work/tok_idx.log")"
[ -f "$work/idx/tokens.bin" ] && [ -f "$work/idx/tokens.idx" ] || fail "no tokens.bin/.idx"

hs_train hstk 1 data.source=tokens data.path="$work/hstk/tokens.hstk"
hs_train indexed 1 data.source=indexed data.path="$work/idx/tokens"
hs_compare_runs hstk indexed 0 || fail "indexed and HSTK runs differ"

# A blend of the same text by file and by paragraph, EOS 10 between.
run_logged "$work/tok_b.log" python3 "${tok[@]}" --out "$work/b" --format indexed --paragraphs
grep -q "90 documents" "$work/tok_b.log" || fail "paragraphs: $(cat "$work/tok_b.log")"
cat > "$work/blend.yaml" <<YAML
data:
  source: indexed
  eos_id: 10
  blend:
    - {path: $work/idx/tokens, weight: 0.7}
    - {path: $work/b/tokens, weight: 0.3}
YAML
"$HS_BIN" train "$work/blend.yaml" "${tiny[@]}" train.out_dir="$work/blend" > "$work/blend.txt" 2>&1 ||
    fail "blend run: $(tail -3 "$work/blend.txt")"
[ "$(wc -l < "$work/blend/metrics.jsonl")" -eq 3 ] || fail "blend run: not 3 steps"

# Hostile files: exit 2, the file and the field named, no out_dir.
bad() { # bad NAME PATTERN ARGS...
    local name=$1 pat=$2
    shift 2
    hs_expect_exit 2 "$name" "$pat" train "${tiny[@]}" train.out_dir="$work/out_$name" "$@"
    [ ! -e "$work/out_$name" ] || fail "$name: out_dir created"
}
mkdir -p "$work/h"
head -c 100 "$work/idx/tokens.bin" > "$work/h/short.bin"
cp "$work/idx/tokens.idx" "$work/h/short.idx"
bad truncated "h/short.idx: sequence_pointers\[" data.source=indexed data.path="$work/h/short"
cp "$work/idx/tokens.bin" "$work/h/magic.bin"
{ printf 'XXIDIDX'; tail -c +8 "$work/idx/tokens.idx"; } > "$work/h/magic.idx"
bad magic "h/magic.idx: magic" data.source=indexed data.path="$work/h/magic"
bad vocab "tokens.bin: token 1[0-9][0-9] (uint16) at sequence" data.source=indexed \
    data.path="$work/idx/tokens" model.vocab_size=100
bad missing "nothing.bin" data.source=indexed "data.blend=[{path: $work/nothing, weight: 1}]"
bad weight "data.blend\[1\].weight = -1" data.source=indexed \
    "data.blend=[{path: $work/idx/tokens, weight: 1}, {path: $work/b/tokens, weight: -1}]"
bad eos "data.eos_id = 300" data.source=indexed data.path="$work/idx/tokens" data.eos_id=300
hs_finish
