#!/usr/bin/env python3
"""Turn a corpus into a hypershard token file or a Megatron-LM indexed dataset.

    python3 scripts/tokenize.py corpus.txt --out data/ \\
        (--tokenizer path/to/tokenizer.json | --train-bpe 8192 | --bytes) \\
        [--format hstk|indexed] [--jsonl FIELD | --parquet COLUMN] [--paragraphs]

Inputs are files (several are tokenized in parallel, --workers processes):
plain text (each file one document; with --paragraphs each
blank-line-separated paragraph one), JSON Lines (--jsonl FIELD: each line's
FIELD one document) or Parquet (--parquet COLUMN: each row one document;
needs pyarrow). `--text FILE` is the same as a positional input.

--format hstk (the default) writes data/tokens.hstk, the documents one
after another (HSTK version 1 for vocabularies up to 65,536, version 2 with
uint32 tokens above: docs/data.md); train with data.source=tokens.
--format indexed writes data/tokens.bin and data/tokens.idx, Megatron-LM's
indexed dataset with one sequence per document (uint16 tokens up to 65,536
ids, int32 above); train with data.source=indexed data.path=data/tokens and
data.eos_id set to put an end-of-text token between documents.

The tokenizer is kept beside the output (data/tokenizer.json,
tokenizer_config.json, special_tokens_map.json), where `hypershard train`
checks model.vocab_size against it and from where the run's
model.safetensors and `hypershard export` get a copy. --train-bpe trains a
byte-level BPE of that size on the corpus; --tokenizer uses an existing
tokenizer.json (a directory with one works too); --bytes uses the UTF-8
bytes as ids (vocabulary 256, no tokenizer file, like data.source text).
Prints the settings to train with.

Needs only the Python standard library, plus the Hugging Face `tokenizers`
package for --tokenizer and --train-bpe and `pyarrow` for --parquet.
"""
import argparse
import json
import multiprocessing
import os
import shutil
import struct
import sys

INDEX_MAGIC = b"MMIDIDX\x00\x00"
DTYPE_INT32, DTYPE_UINT16 = 4, 8  # Megatron-LM's dtype codes


def fail(msg):
    print(f"tokenize.py: {msg}", file=sys.stderr)
    sys.exit(2)


def documents(path, args):
    """The documents (strings) of one input file."""
    if args.parquet:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            fail(f"{path}: --parquet needs the pyarrow package (pip install pyarrow)")
        table = pq.read_table(path, columns=[args.parquet])
        return [str(v) for v in table.column(args.parquet).to_pylist() if v is not None]
    with open(path, encoding="utf-8") as f:
        if args.jsonl:
            docs = []
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not a JSON line ({e})")
                if not isinstance(row, dict) or not isinstance(row.get(args.jsonl), str):
                    fail(f"{path}:{n}: no string field {args.jsonl!r}")
                docs.append(row[args.jsonl])
            return docs
        text = f.read()
    if args.paragraphs:
        return [p for p in text.split("\n\n") if p.strip()]
    return [text]


_worker = {}


def _init(tokenizer_path, args):
    _worker["args"] = args
    if tokenizer_path:
        from tokenizers import Tokenizer
        _worker["tok"] = Tokenizer.from_file(tokenizer_path)


def encode_file(path):
    """[ids of each document] of one input file (in a worker)."""
    args, tok = _worker["args"], _worker.get("tok")
    docs = documents(path, args)
    if tok is None:
        return [list(d.encode("utf-8")) for d in docs]
    return [e.ids for e in tok.encode_batch(docs)]


def write_hstk(path, docs):
    ids = [t for d in docs for t in d]
    wide = max(ids, default=0) > 0xFFFF
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"HSTK" + struct.pack("<IQ", 2 if wide else 1, len(ids)))
        fmt = "I" if wide else "H"
        for i in range(0, len(ids), 1 << 16):
            chunk = ids[i:i + (1 << 16)]
            f.write(struct.pack(f"<{len(chunk)}{fmt}", *chunk))
    os.replace(tmp, path)
    return f"HSTK version {2 if wide else 1}"


def write_indexed(prefix, docs):
    """PREFIX.bin and PREFIX.idx: one sequence per document."""
    wide = max((max(d) for d in docs if d), default=0) > 0xFFFF
    code, fmt, width = (DTYPE_INT32, "i", 4) if wide else (DTYPE_UINT16, "H", 2)
    with open(prefix + ".bin.tmp", "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{fmt}", *d))
    pointers, at = [], 0
    for d in docs:
        pointers.append(at)
        at += width * len(d)
    n = len(docs)
    with open(prefix + ".idx.tmp", "wb") as f:
        f.write(INDEX_MAGIC + struct.pack("<QBQQ", 1, code, n, n + 1))
        f.write(struct.pack(f"<{n}i", *[len(d) for d in docs]))
        f.write(struct.pack(f"<{n}q", *pointers))
        f.write(struct.pack(f"<{n + 1}q", *range(n + 1)))
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
    return f"indexed, {'int32' if wide else 'uint16'} tokens, {n} documents"


def prepare_tokenizer(args, inputs):
    """The tokenizer.json path the workers load (None for --bytes), kept
    in args.out, and the vocabulary size and end-of-text id."""
    if args.bytes:
        return None, 256, None
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        how = "--tokenizer" if args.tokenizer else "--train-bpe"
        fail(f"{how} needs the tokenizers package (pip install tokenizers), "
             "or use --bytes for byte-level ids without one")
    if args.tokenizer:
        src = args.tokenizer
        if os.path.isdir(src):
            src_dir, src = src, os.path.join(src, "tokenizer.json")
        else:
            src_dir = os.path.dirname(src) or "."
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
        texts = (line for p in inputs for d in documents(p, args)
                 for line in d.splitlines(keepends=True))
        tok.train_from_iterator(texts, trainer=trainer)
        tok.save(os.path.join(args.out, "tokenizer.json"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                   "model_max_length": 1 << 20},
                  open(os.path.join(args.out, "tokenizer_config.json"), "w"), indent=2)
    path = os.path.join(args.out, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    eos = next((tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<|end_of_text|>")
                if tok.token_to_id(t) is not None), None)
    return path, tok.get_vocab_size(with_added_tokens=True), eos


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="input files (text, JSON Lines or Parquet)")
    ap.add_argument("--text", action="append", default=[], help="an input file (repeatable)")
    ap.add_argument("--out", required=True, help="output directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokenizer", help="an existing tokenizer.json (or a directory with one)")
    g.add_argument("--train-bpe", type=int, metavar="VOCAB", help="train a byte-level BPE")
    g.add_argument("--bytes", action="store_true", help="UTF-8 bytes as ids (vocabulary 256)")
    ap.add_argument("--format", choices=("hstk", "indexed"), default="hstk")
    r = ap.add_mutually_exclusive_group()
    r.add_argument("--jsonl", metavar="FIELD", help="inputs are JSON Lines; FIELD holds the text")
    r.add_argument("--parquet", metavar="COLUMN", help="inputs are Parquet; COLUMN holds the text")
    ap.add_argument("--paragraphs", action="store_true",
                    help="text inputs: each blank-line-separated paragraph is a document")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    args = ap.parse_args()
    inputs = args.inputs + args.text
    if not inputs:
        fail("no input files; name them (or --text FILE)")
    for p in inputs:
        if not os.path.isfile(p):
            fail(f"{p}: no such input file")
    os.makedirs(args.out, exist_ok=True)
    tok_path, vocab, eos = prepare_tokenizer(args, inputs)
    workers = max(1, min(args.workers, len(inputs)))
    if workers == 1:
        _init(tok_path, args)
        per_file = [encode_file(p) for p in inputs]
    else:
        with multiprocessing.Pool(workers, _init, (tok_path, args)) as pool:
            per_file = pool.map(encode_file, inputs)  # input order kept
    docs = [d for f in per_file for d in f]
    n_tokens = sum(len(d) for d in docs)
    if args.format == "indexed":
        target = os.path.join(args.out, "tokens")
        what = write_indexed(target, docs)
        settings = f"data.source=indexed data.path={target}"
        if eos is not None:
            settings += f" data.eos_id={eos}"
    else:
        target = os.path.join(args.out, "tokens.hstk")
        what = write_hstk(target, docs)
        settings = f"data.source=tokens data.path={target}"
    print(f"{n_tokens} tokens in {len(docs)} documents of a {vocab}-token vocabulary -> {target} "
          f"({what}); train with {settings} model.vocab_size={vocab}")


if __name__ == "__main__":
    sys.exit(main())
