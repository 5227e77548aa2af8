#!/usr/bin/env bash
# A token file with its Hugging Face tokenizer beside it (as
# scripts/tokenize.py leaves them): train refuses a model.vocab_size smaller
# than the tokenizer's (exit 2 naming both, before out_dir exists), trains
# with one that fits, and the run's weights and `hypershard export --run`
# carry a copy of tokenizer.json and tokenizer_config.json, so
# AutoTokenizer loads beside the model. A uint32 (HSTK version 2) token
# file with ids over 65,535 trains; an indexed dataset's tokenizer follows
# its run as a token file's does, and both runs' samples are text; without
# the tokenizers package, tokenize.py says what to install (exit 2). With a
# byte-level BPE tokenizer (built
# here by hand: GPT-2's byte symbols and 7 merges, behind GPT-2's split and
# behind Llama 3's) `hypershard tokenize` encodes text to the ids the merges
# give and decodes them back, a WordPiece tokenizer is refused by name, and
# `generate --run` takes the prompt as text through it (2 tokens for "the
# cat") and answers in text. Hostile ids (a vocab id of -5 to tokenize, a
# list model.vocab beside data.path to train) are refused naming the file
# and the field, exit 1, no crash, no out_dir.
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tokenizer_files
mkdir -p "$work/data/bpe"
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
# a byte-level BPE: GPT-2's bytes_to_unicode symbols, then 5 merges
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {sym[b]: b for b in range(256)}
merges = [["t", "h"], ["th", "e"], ["\u0120", "c"], ["\u0120c", "a"], ["\u0120ca", "t"],
          ["1", "2"], ["3", "4"]]
for i, (l, r) in enumerate(merges):
    vocab[l + r] = 256 + i
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": merges},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"}, "added_tokens": []},
          open(f"{d}/bpe/tokenizer.json", "w"))
# the same vocabulary behind Llama 3's split (digits in runs of at most 3)
llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": merges},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": llama3}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
           "decoder": {"type": "ByteLevel"}, "added_tokens": []},
          open(f"{d}/llama3.json", "w"))
json.dump({"model": {"type": "WordPiece", "vocab": vocab}}, open(f"{d}/wordpiece.json", "w"))
ids = [(i * 11) % 263 for i in range(4000)]
open(f"{d}/bpe/tokens.hstk", "wb").write(b"HSTK" + struct.pack("<IQ", 1, len(ids)) +
                                         struct.pack(f"<{len(ids)}H", *ids))
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

"$HS_BIN" tokenize "$work/data/bpe/tokenizer.json" "the cat the" > "$work/tok.txt" 2>&1 ||
    fail "tokenize failed: $(cat "$work/tok.txt")"
# "the" merges whole, " cat" to Ġcat, " the" is Ġ (byte 32's symbol, id 32) then "the"
[ "$(sed -n 1p "$work/tok.txt")" = "257 260 32 257" ] || fail "tokenize: $(sed -n 1p "$work/tok.txt")"
[ "$(sed -n 2p "$work/tok.txt")" = "the cat the" ] || fail "decode: $(sed -n 2p "$work/tok.txt")"
# GPT-2's split keeps "12345" whole (12 34 5); Llama 3's cuts it 123|45 (12 3 4 5)
[ "$("$HS_BIN" tokenize "$work/data/bpe/tokenizer.json" 12345 | sed -n 1p)" = "261 262 53" ] ||
    fail "GPT-2 split of 12345: $("$HS_BIN" tokenize "$work/data/bpe/tokenizer.json" 12345)"
[ "$("$HS_BIN" tokenize "$work/data/llama3.json" 12345 | sed -n 1p)" = "261 51 52 53" ] ||
    fail "Llama 3 split of 12345: $("$HS_BIN" tokenize "$work/data/llama3.json" 12345)"
"$HS_BIN" tokenize "$work/data/wordpiece.json" x > "$work/wp.txt" 2>&1 && fail "a WordPiece tokenizer was read"
grep -q "model type WordPiece, not BPE" "$work/wp.txt" || fail "WordPiece refusal: $(cat "$work/wp.txt")"
# hostile ids: refused naming the file and the field, never a crash
python3 - "$work/data" <<'PY'
import json, os, sys
d = sys.argv[1]
bpe = json.load(open(f"{d}/bpe/tokenizer.json"))
bpe["model"]["vocab"]["t"] = -5
json.dump(bpe, open(f"{d}/minus5.json", "w"))
os.makedirs(f"{d}/listvocab", exist_ok=True)
json.dump({"model": {"type": "BPE", "vocab": ["a", "b"], "merges": []}},
          open(f"{d}/listvocab/tokenizer.json", "w"))
open(f"{d}/listvocab/tokens.hstk", "wb").write(open(f"{d}/tokens.hstk", "rb").read())
PY
"$HS_BIN" tokenize "$work/data/minus5.json" x > "$work/m5.txt" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a vocab id of -5: exit $rc, want 1 ($(tail -2 "$work/m5.txt"))"
grep -q "$work/data/minus5.json: model.vocab\[\"t\"\] is -5" "$work/m5.txt" ||
    fail "the -5 refusal does not name the file and the token: $(cat "$work/m5.txt")"
tiny=("${HS_TINY[@]}" data.source=tokens data.path="$work/data/listvocab/tokens.hstk" train.steps=3
      train.eval_every=0)
hs_run 1 listvocab model.vocab_size=320 train.out_dir="$work/listvocab"
[ "$rc" -eq 1 ] || fail "a list model.vocab beside data.path: exit $rc, want 1"
grep -q "$work/data/listvocab/tokenizer.json: model.vocab is a list" "$work/listvocab.log" ||
    fail "the list vocab refusal does not name the file: $(head -3 "$work/listvocab.log")"
[ ! -e "$work/listvocab" ] || fail "the refused run created its out_dir"
tiny=("${HS_TINY[@]}" data.source=tokens data.path="$work/data/bpe/tokens.hstk" train.steps=3
      train.eval_every=0 model.vocab_size=320)
hs_must_run 1 bpe train.out_dir="$work/bpe"
"$HS_BIN" generate --run "$work/bpe" --prompt "the cat" --max-new-tokens 4 > "$work/gen.txt" 2> "$work/gen.err" ||
    fail "generate with the tokenizer failed: $(tail -3 "$work/gen.err")"
grep -q "prompt: 2 tokens (tokenizer $work/bpe/tokenizer.json" "$work/gen.err" ||
    fail "generate did not encode the prompt with the tokenizer: $(cat "$work/gen.err")"
grep -q "^the cat" "$work/gen.txt" || fail "generate's text does not start with the prompt: $(cat "$work/gen.txt")"
grep -q 'sample (greedy): "[^"0-9]' "$work/bpe.log" ||
    fail "the end-of-run sample is not the tokenizer's text: $(grep sample "$work/bpe.log")"

# The same ids as an indexed dataset beside the same tokenizer (as
# tokenize.py --format indexed leaves them): the run gets the tokenizer,
# its sample is text, and generate --run encodes and decodes with it.
mkdir -p "$work/data/ix"
cp "$work/data/bpe/tokenizer.json" "$work/data/ix/"
python3 - "$HS_SRC/scripts/tokenize.py" "$work/data/ix/tokens" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("hs_tokenize", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
ids = [(i * 11) % 263 for i in range(4000)]
m.write_indexed(sys.argv[2], [ids[i:i + 400] for i in range(0, 4000, 400)])
PY
tiny=("${HS_TINY[@]}" data.source=indexed data.path="$work/data/ix/tokens" train.steps=3
      train.eval_every=0 model.vocab_size=320)
hs_must_run 1 ix train.out_dir="$work/ix"
cmp -s "$work/data/ix/tokenizer.json" "$work/ix/tokenizer.json" ||
    fail "an indexed run's directory lacks the data's tokenizer.json"
grep -q 'sample (greedy): "[^"0-9]' "$work/ix.log" ||
    fail "the indexed run's sample is not text: $(grep sample "$work/ix.log")"
"$HS_BIN" generate --run "$work/ix" --prompt "the cat" --max-new-tokens 4 > "$work/gen_ix.txt" 2> "$work/gen_ix.err" ||
    fail "generate --run on the indexed run failed: $(tail -3 "$work/gen_ix.err")"
grep -q "prompt: 2 tokens (tokenizer $work/ix/tokenizer.json" "$work/gen_ix.err" ||
    fail "generate did not use the indexed run's tokenizer: $(cat "$work/gen_ix.err")"
grep -q "^the cat" "$work/gen_ix.txt" || fail "generate on the indexed run: $(cat "$work/gen_ix.txt")"

# tokenize.py without the tokenizers package: a sentence, exit 2
if ! python3 -c "import tokenizers" 2> /dev/null; then
    echo "the cat" > "$work/in.txt"
    python3 "$HS_SRC/scripts/tokenize.py" "$work/in.txt" --out "$work/tp" --train-bpe 300 > "$work/tp.log" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] && grep -q "pip install tokenizers" "$work/tp.log" && ! grep -q Traceback "$work/tp.log" ||
        fail "tokenize.py without tokenizers: exit $rc: $(cat "$work/tp.log")"
fi
hs_finish
