#!/usr/bin/env python3
"""Developer check: a Hugging Face tokenizer round trip through hypershard.

text -> scripts/tokenize.py (a byte-level BPE trained on the corpus, and a
second vocabulary over 65,536 ids to force uint32 tokens) -> `hypershard
train` 20 steps on the token file -> `hypershard export --run` ->
AutoTokenizer.from_pretrained + AutoModelForCausalLM.from_pretrained of the
export -> the model's logits on a tokenized sentence equal hypershard's own
(`hypershard eval` is compared on the loss instead: the same sentence
file's mean loss), and a vocabulary too small for the tokenizer is refused
by `train` (exit 2 naming model.vocab_size).

Needs torch, transformers and tokenizers (a venv outside the repository):
    /tmp/peer/bin/python tests/reference/check_tokenizer.py --bin build/hypershard
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, ok=(0,)):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode not in ok:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/hypershard")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = tempfile.mkdtemp(prefix="hs_tokenizer_check_")
    corpus = os.path.join(work, "corpus.txt")
    words = "the old bird sees a small cat and the cat sleeps under a green tree".split()
    with open(corpus, "w") as f:
        for i in range(3000):
            f.write(" ".join(words[(i * 7 + k) % len(words)] for k in range(9)) + ".\n")
    tokenize = os.path.join(HERE, "..", "..", "scripts", "tokenize.py")
    print(run([sys.executable, tokenize, "--text", corpus, "--out", f"{work}/bpe",
               "--train-bpe", "512"]).stdout.strip())
    vocab = 512
    model = ["data.source=tokens", f"data.path={work}/bpe/tokens.hstk", "data.val_fraction=0.1",
             "model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
             "model.ffn_dim=128", "train.seq_len=32", "train.steps=20", "train.eval_every=20"]
    # a vocabulary smaller than the tokenizer's is refused before training
    bad = run([args.bin, "train", *model, "model.vocab_size=256", f"train.out_dir={work}/bad"],
              ok=(2,))
    assert "model.vocab_size = 256 is smaller than the" in bad.stderr + bad.stdout, bad.stderr
    assert not os.path.exists(f"{work}/bad"), "the refused run wrote its out_dir"
    run([args.bin, "train", *model, f"model.vocab_size={vocab}", f"train.out_dir={work}/run"])
    run([args.bin, "export", "--safetensors", f"{work}/hf", "--run", f"{work}/run"])
    tok = AutoTokenizer.from_pretrained(f"{work}/hf")
    hf = AutoModelForCausalLM.from_pretrained(f"{work}/hf", dtype=torch.float32)
    text = "the old bird sees a small cat and the cat sleeps under a green tree."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text, (tok.decode(ids), text)
    with torch.no_grad():
        loss_hf = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    # the same sentence as a token file, evaluated by hypershard: two copies,
    # one sequence each, the second the validation split
    n = len(ids)
    with open(f"{work}/one.hstk", "wb") as f:
        f.write(b"HSTK" + struct.pack("<IQ", 1, 2 * n) + struct.pack(f"<{2 * n}H", *(ids + ids)))
    out = run([args.bin, "eval", "--run", f"{work}/run", "data.source=tokens",
               f"data.path={work}/one.hstk", f"train.seq_len={n - 1}", "data.val_fraction=0.5"])
    loss_hs = float(out.stdout.split()[2])
    print(f"tokenizer {len(tok)} tokens, sentence of {n}; loss transformers {loss_hf:.6f}, "
          f"hypershard eval {loss_hs:.6f}")
    assert abs(loss_hf - loss_hs) < 1e-4 * max(1, abs(loss_hf)), (loss_hf, loss_hs)
    # hypershard's own encoder (generate's text in) gives transformers' ids
    cases = [text, "the cat  sees\n the bird!! 42", "isn't it? The CAT's 1234567\n\n\n  x",
             "   leading", "tabs\tand newlines  ", "punct!!!...  ,,x", "a'sb'tc're", "end "]
    for t in cases:
        out = run([args.bin, "tokenize", f"{work}/hf/tokenizer.json", t]).stdout
        got = [int(x) for x in out.split("\n")[0].split()]
        assert got == tok(t)["input_ids"], (t, got, tok(t)["input_ids"])
    print(f"hypershard tokenize = transformers on {len(cases)} texts")
    # Llama 3's split (a Split with its pattern, then ByteLevel without a regex)
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    l3 = Tokenizer(models.BPE(unk_token=None))
    l3.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    l3.decoder = decoders.ByteLevel()
    l3.train_from_iterator(open(corpus).read().splitlines(keepends=True) + ["12345 DON'T x\n\n"] * 50,
                           trainer=trainers.BpeTrainer(
                               vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    l3.save(f"{work}/llama3_style.json")
    cases += ["DON'T 1234567 x\n\n  y", "  \n\t z", "!!!\n\nabc", "12 345 6789"]
    for t in cases:
        out = run([args.bin, "tokenize", f"{work}/llama3_style.json", t]).stdout
        got = [int(x) for x in out.split("\n")[0].split()]
        assert got == l3.encode(t).ids, (t, got, l3.encode(t).ids)
    print(f"Llama 3 split: hypershard tokenize = tokenizers on {len(cases)} texts")
    gen = run([args.bin, "generate", "--run", f"{work}/run", "--prompt", "the old bird",
               "--max-new-tokens", "8"]).stdout
    with torch.no_grad():
        p = torch.tensor([tok("the old bird")["input_ids"]])
        want = tok.decode(hf.generate(p, max_new_tokens=8, do_sample=False)[0])
    assert gen.rstrip("\n") == want, (gen, want)
    print(f"generate (text in, text out) = transformers: {want!r}")
    # ids over 65,535 make a uint32 token file that trains
    big = f"{work}/big"
    os.makedirs(big)
    ids_big = [70000 + (i * 13) % 1000 for i in range(4000)]
    with open(f"{big}/tokens.hstk", "wb") as f:
        f.write(b"HSTK" + struct.pack("<IQ", 2, len(ids_big)) + struct.pack(f"<{len(ids_big)}I", *ids_big))
    run([args.bin, "train", "data.source=tokens", f"data.path={big}/tokens.hstk",
         "model.vocab_size=71040", "model.dim=64", "model.n_layers=1", "model.n_heads=4",
         "model.ffn_dim=64", "train.seq_len=16", "train.steps=3", "train.eval_every=0",
         "data.val_fraction=0", f"train.out_dir={work}/run_big"])
    print("uint32 token file (ids 70000..70999) trained 3 steps")
    print("ok")


if __name__ == "__main__":
    main()
