#!/usr/bin/env python3
"""Turn a text corpus into a hypershard token file (data.source: tokens).

    python3 scripts/tokenize.py --text corpus.txt --out data/ \\
        (--tokenizer path/to/tokenizer.json | --train-bpe 8192)

writes data/tokens.hstk (HSTK version 1 for vocabularies up to 65,536,
version 2 with uint32 tokens above: docs/data.md) and keeps the tokenizer
beside it (data/tokenizer.json, tokenizer_config.json,
special_tokens_map.json), where `hypershard train` checks model.vocab_size
against it and from where the run's model.safetensors and `hypershard
export` get a copy, so that AutoTokenizer loads next to
AutoModelForCausalLM. --train-bpe trains a byte-level BPE of that size on
the corpus; --tokenizer uses an existing tokenizer.json (a directory with
one works too). Prints the model.vocab_size to set.

Needs the Hugging Face `tokenizers` package from PyPI (pip install
tokenizers), at tokenization time only.
"""
import argparse
import json
import os
import shutil
import struct
import sys


def write_hstk(path, ids):
    wide = max(ids, default=0) > 0xFFFF
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"HSTK" + struct.pack("<IQ", 2 if wide else 1, len(ids)))
        fmt = "I" if wide else "H"
        for i in range(0, len(ids), 1 << 16):
            chunk = ids[i:i + (1 << 16)]
            f.write(struct.pack(f"<{len(chunk)}{fmt}", *chunk))
    os.replace(tmp, path)
    return 2 if wide else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="UTF-8 text corpus")
    ap.add_argument("--out", required=True, help="output directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokenizer", help="an existing tokenizer.json (or a directory with one)")
    g.add_argument("--train-bpe", type=int, metavar="VOCAB", help="train a byte-level BPE")
    args = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(args.out, exist_ok=True)
    text = open(args.text, encoding="utf-8").read()
    if args.tokenizer:
        src = args.tokenizer
        if os.path.isdir(src):
            src_dir, src = src, os.path.join(src, "tokenizer.json")
        else:
            src_dir = os.path.dirname(src) or "."
        tok = Tokenizer.from_file(src)
        shutil.copyfile(src, os.path.join(args.out, "tokenizer.json"))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(src_dir, name)):
                shutil.copyfile(os.path.join(src_dir, name), os.path.join(args.out, name))
    else:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.train_bpe,
                                      special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        tok.save(os.path.join(args.out, "tokenizer.json"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                   "model_max_length": 1 << 20},
                  open(os.path.join(args.out, "tokenizer_config.json"), "w"), indent=2)
    ids = tok.encode(text).ids
    vocab = tok.get_vocab_size(with_added_tokens=True)
    version = write_hstk(os.path.join(args.out, "tokens.hstk"), ids)
    print(f"{len(ids)} tokens of a {vocab}-token vocabulary -> {args.out}/tokens.hstk "
          f"(HSTK version {version}); train with data.source=tokens "
          f"data.path={args.out}/tokens.hstk model.vocab_size={vocab}")


if __name__ == "__main__":
    sys.exit(main())
