#!/usr/bin/env bash
# A token file with its Hugging Face tokenizer beside it (as
# scripts/tokenize.py leaves them): train refuses a model.vocab_size smaller
# than the tokenizer's (exit 2 naming both, before out_dir exists), trains
# with one that fits, and the run's weights and `hypershard export --run`
# carry a copy of tokenizer.json and tokenizer_config.json, so
# AutoTokenizer loads beside the model. A uint32 (HSTK version 2) token
# file with ids over 65,535 trains.
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tokenizer_files
mkdir -p "$work/data"
python3 - "$work/data" <<'PY'
import json, struct, sys
d = sys.argv[1]
ids = [(i * 7) % 300 for i in range(4000)]
open(f"{d}/tokens.hstk", "wb").write(b"HSTK" + struct.pack("<IQ", 1, len(ids)) +
                                      struct.pack(f"<{len(ids)}H", *ids))
vocab = {f"t{i}": i for i in range(299)}
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []},
           "added_tokens": [{"id": 299, "content": "<|endoftext|>", "special": True}]},
          open(f"{d}/tokenizer.json", "w"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(f"{d}/tokenizer_config.json", "w"))
big = [70000 + (i * 13) % 1000 for i in range(2000)]
open(f"{d}/big.hstk", "wb").write(b"HSTK" + struct.pack("<IQ", 2, len(big)) +
                                  struct.pack(f"<{len(big)}I", *big))
PY
tiny=("${HS_TINY[@]}" data.source=tokens data.path="$work/data/tokens.hstk" train.steps=3
      train.eval_every=0)
hs_run 1 small model.vocab_size=256 train.out_dir="$work/small"
[ "$rc" -eq 2 ] || fail "a vocabulary smaller than the tokenizer's: exit $rc, want 2"
grep -q "model.vocab_size = 256 is smaller than the 300 tokens of the tokenizer $work/data/tokenizer.json" \
    "$work/small.log" || fail "the message does not name both: $(head -2 "$work/small.log")"
[ ! -e "$work/small" ] || fail "the refused run created its out_dir"
hs_must_run 1 fits model.vocab_size=320 train.out_dir="$work/run"
for f in tokenizer.json tokenizer_config.json; do
    cmp -s "$work/data/$f" "$work/run/$f" || fail "the run's weights lack $f"
done
"$HS_BIN" export --safetensors "$work/hf" --run "$work/run" > "$work/export.log" 2>&1 ||
    fail "export failed: $(cat "$work/export.log")"
grep -q "with the run's tokenizer" "$work/export.log" || fail "export does not say it copied the tokenizer"
cmp -s "$work/data/tokenizer.json" "$work/hf/tokenizer.json" || fail "the export lacks tokenizer.json"
tiny=("${HS_TINY[@]}" data.source=tokens data.path="$work/data/big.hstk" train.steps=2
      train.eval_every=0 data.val_fraction=0)
hs_must_run 1 big model.vocab_size=71040 train.out_dir="$work/big"
hs_finish
