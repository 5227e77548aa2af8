#!/usr/bin/env python3
"""Hostile-input probe: every command and file format fed what a careless or
hostile user would give it.

Each case runs `hypershard` in a fresh sandbox (its own working directory
and HOME) and passes when the program
  - exits with one of the codes the case allows (2 for configuration and
    usage errors, 1 for a bad file where the case allows it, 0 where the
    input is legal),
  - was not killed by a signal and printed no sanitizer report,
  - finished before its time limit (no hang),
  - printed every text the case requires (the file, key or flag it names)
    and none it forbids (the first bytes of a foreign file),
  - wrote nothing outside the paths the case gave: nothing new in `/`, the
    working directory or HOME, and in the sandbox only under the case's
    output paths.
It prints one table row per case and exits 1 when any case fails.

    python3 tests/probe/probe.py HYPERSHARD_BINARY [--faults] [--only WORD]

--faults adds the MPI fault cases (a rank stopped or killed mid-run); they
need mpiexec and take about a minute on two cores.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TINY = ["model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
        "model.ffn_dim=64", "train.seq_len=16", "train.global_batch_size=2",
        "train.micro_batch_size=2", "train.eval_every=0"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_hwloc_base_binding_policy": "none", "OMP_NUM_THREADS": "1"}


class Case:
    def __init__(self, cls, name, args, codes=(2,), want=(), forbid=(), outputs=(),
                 timeout=60, setup=None, mpi=0, fault=None, env=None):
        self.cls, self.name, self.args, self.codes = cls, name, args, tuple(codes)
        self.want, self.forbid, self.outputs = tuple(want), tuple(forbid), tuple(outputs)
        self.timeout, self.setup, self.mpi, self.fault = timeout, setup, mpi, fault
        self.env = dict(env or {})


# ------------------------------------------------------------------ files


def hstk(path, ids, version=1, count=None, magic=b"HSTK"):
    fmt = "H" if version == 1 else "I"
    n = len(ids) if count is None else count
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<IQ", version, n) + struct.pack(f"<{len(ids)}{fmt}", *ids))


def safetensors(path, header, data=b"", raw_len=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(h) if raw_len is None else raw_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + h + data)


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def tokenizer(path, vocab=None, added=(), model_type="BPE", merges=(), raw=None, drop_vocab=False):
    if raw is not None:
        open(path, "w").write(raw)
        return
    v = {chr(c): c - 32 for c in range(33, 127)}
    if isinstance(vocab, dict):
        v.update(vocab)
    elif vocab is not None:
        v = vocab
    model = {"type": model_type, "merges": list(merges)}
    if not drop_vocab:
        model["vocab"] = v
    json.dump({"model": model, "added_tokens": list(added), "decoder": {"type": "ByteLevel"},
               "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                 "use_regex": True}}, open(path, "w"))


class Fixture:
    """A real run, its checkpoint and its export, made once and copied into
    each case that mutates them."""

    def __init__(self, hs, root):
        self.hs, self.root = hs, root
        self.run = os.path.join(root, "run")
        self.ck = os.path.join(root, "ck")
        self.exp = os.path.join(root, "exp")
        r = subprocess.run([hs, "train", *TINY, "train.steps=2", f"train.out_dir={self.run}",
                            f"checkpoint.dir={self.ck}"], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            sys.exit("probe: the fixture run failed:\n" + r.stdout + r.stderr)
        r = subprocess.run([hs, "export", "--safetensors", self.exp, "--run", self.run],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            sys.exit("probe: the fixture export failed:\n" + r.stdout + r.stderr)
        self.step = os.path.join(self.ck, open(os.path.join(self.ck, "latest")).read().strip())

    def copy_ck(self, box):
        dst = os.path.join(box, "ck")
        shutil.copytree(self.ck, dst, symlinks=True)
        return dst, os.path.join(dst, os.path.basename(self.step))

    def copy_exp(self, box):
        dst = os.path.join(box, "exp")
        shutil.copytree(self.exp, dst)
        return dst


def edit_meta(step_dir, fn):
    p = os.path.join(step_dir, "metadata.json")
    m = json.load(open(p))
    fn(m)
    json.dump(m, open(p, "w"))


def first_chunk(m):
    return m["tensors"][0]["chunks"][0]


def edit_exp(box, fx, fn, data_fn=None):
    d = fx.copy_exp(box)
    p = os.path.join(d, "model.safetensors")
    h, data = read_safetensors(p)
    fn(h)
    if data_fn:
        data = data_fn(h, data)
    safetensors(p, h, data)
    return d


def edit_hf_config(box, fx, fn):
    d = fx.copy_exp(box)
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    fn(c)
    json.dump(c, open(p, "w"))
    return d


# ------------------------------------------------------------------ cases


def cli_cases():
    return [
        Case("cli", "no arguments", [], want=["usage"]),
        Case("cli", "unknown command", ["frobnicate"], want=["frobnicate"]),
        Case("cli", "unknown bench", ["bench", "nope"], want=["nope"]),
        Case("cli", "train unknown flag", ["train", "--bogus"], want=["--bogus"]),
        Case("cli", "train config missing", ["train", "{box}/none.yaml"], want=["none.yaml"]),
        Case("cli", "train config is a directory", ["train", "{box}"], want=["{box}"]),
        Case("cli", "generate without a source", ["generate", "--prompt", "hi"]),
        Case("cli", "export without arguments", ["export"]),
        Case("cli", "tokenize without text", ["tokenize"]),
        Case("cli", "ckpt without verb", ["ckpt"]),
        Case("cli", "ckpt unknown verb", ["ckpt", "shred", "{box}"], want=["shred"]),
        Case("cli", "hostfile line over 1023 bytes",
             ["launch", "-n", "2", "--hostfile", "{box}/hosts", "train.steps=1"],
             setup=lambda box, fx: open(os.path.join(box, "hosts"), "w").write(
                 "h" * 2000 + " slots=2\n"), want=["--hostfile", "line 1"]),
        Case("mesh", "mesh world 0", ["mesh", "--world", "0"], want=["world"]),
        Case("mesh", "mesh world -4", ["mesh", "--world", "-4"], want=["world"]),
        Case("mesh", "mesh world abc", ["mesh", "--world", "abc"], want=["abc"]),
        Case("mesh", "mesh world 2^40", ["mesh", "--world", "1099511627776"]),
        Case("mesh", "mesh world 65536 is quick", ["mesh", "--world", "65536"], codes=(0,),
             timeout=5),
        Case("mesh", "config world 65536 is quick", ["config", "--world", "65536",
             "fsdp_config.dp_shard_size=65536"], codes=(0,), timeout=5),
    ]


def config_cases():
    def yaml(text):
        return lambda box, fx: open(os.path.join(box, "c.yaml"), "w").write(text)

    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    c = "config"
    return [
        Case(c, "yaml syntax error", ["config", "{box}/c.yaml"], setup=yaml("model: {dim: [\n"),
             want=["c.yaml"]),
        Case(c, "binary garbage", ["config", "{box}/c.yaml"], setup=yaml("\x00\x01\xff\xfe" * 64),
             want=["c.yaml"]),
        Case(c, "alias bomb", ["config", "{box}/c.yaml"], setup=yaml(bomb), timeout=20),
        Case(c, "deep nesting", ["config", "{box}/c.yaml"], setup=yaml("a: " + "[" * 5000),
             timeout=20),
        Case(c, "unknown key", ["config", "model.dimm=32"], want=["model.dimm"]),
        Case(c, "blend entry unknown key",
             ["config", "data.source=indexed", "data.blend=[{{path: a, wieght: 0.7}}]"],
             want=["data.blend[0]", "wieght"]),
        Case(c, "blend weight past 1e300",
             ["config", "data.source=indexed", "data.blend=[{{path: a, weight: 1e301}}]"],
             want=["data.blend[0].weight", "1e300"]),
        Case(c, "HS_CPU_ISA unknown", ["config"], want=["HS_CPU_ISA", "avx9"],
             env={"HS_CPU_ISA": "avx9"}),
        Case(c, "wrong type", ["config", "model.dim=abc"], want=["model.dim"]),
        Case(c, "negative dim", ["config", "model.dim=-32"], want=["model.dim"]),
        Case(c, "int beyond int64", ["config", "model.dim=99999999999999999999"],
             want=["model.dim"]),
        Case(c, "parameter count overflows int64",
             ["plan", "model.dim=1048576", "model.ffn_dim=1073741824", "model.n_layers=1000000",
              "model.n_heads=8", "model.n_kv_heads=8"], want=["model."]),
        Case(c, "activations overflow int64",
             ["plan", "train.micro_batch_size=1073741824", "train.seq_len=1073741824",
              "train.global_batch_size=1073741824"], want=["train."]),
        Case(c, "activation checkpointing peak overflow",
             ["plan", "train.micro_batch_size=1073741824", "train.seq_len=1073741824",
              "train.global_batch_size=1073741824", "train.activation_checkpointing=true"],
             want=["train."]),
        Case(c, "pipeline schedule overflow",
             ["plan", "--world", "2", "accelerator.pp_size=2", "fsdp_config.dp_shard_size=1",
              "train.global_batch_size=1073741824", "train.micro_batch_size=1"],
             want=["global_batch_size"], timeout=20),
        Case(c, "vocab too small for the builtin data", ["config", "model.vocab_size=10"],
             want=["vocab_size"]),
        Case(c, "empty config file", ["config", "{box}/c.yaml"], setup=yaml(""), codes=(0, 2)),
    ]


def tokenizer_cases():
    def tok(**kw):
        return lambda box, fx: tokenizer(os.path.join(box, "tok.json"), **kw)

    t = "tokenizer"
    args = ["tokenize", "{box}/tok.json", "t1t2"]
    cases = [
        ("vocab id -5", dict(vocab={"ab": -5})),
        ("vocab id 2^32", dict(vocab={"ab": 4294967296})),
        ("vocab id INT_MAX", dict(vocab={"ab": 2147483647})),
        ("vocab id as string", dict(vocab={"ab": "3"})),
        ("vocab id fractional", dict(vocab={"ab": 1.5})),
        ("duplicate vocab id", dict(vocab={"ab": 1})),
        ("added token id -7", dict(added=[{"id": -7, "content": "<x>", "special": True}])),
        ("added token id 2^40", dict(added=[{"id": 1 << 40, "content": "<x>", "special": True}])),
        ("missing vocab", dict(drop_vocab=True)),
        ("vocab is a list", dict(vocab=["a", "b"])),
        ("merge of unknown symbols", dict(merges=[["zz", "qq"]])),
        ("not JSON", dict(raw="{model: nope")),
        ("empty file", dict(raw="")),
    ]
    out = [Case(t, name, args, codes=(1, 2), setup=tok(**kw), want=["tok.json"])
           for name, kw in cases]
    out.append(Case(t, "tokenizer file missing", ["tokenize", "{box}/none.json", "x"],
                    codes=(1, 2), want=["none.json"]))
    return out


def hstk_cases():
    def data(**kw):
        return lambda box, fx: hstk(os.path.join(box, "d.hstk"), **kw)

    def raw(b):
        return lambda box, fx: open(os.path.join(box, "d.hstk"), "wb").write(b)

    ids = [i % 200 for i in range(4000)]
    base = ["train", *TINY, "train.steps=1", "data.source=tokens", "data.path={box}/d.hstk",
            "train.out_dir={box}/out"]
    h = "hstk"
    rows = [
        ("bad magic", data(ids=ids, magic=b"HSTX")),
        ("version 3", data(ids=ids, version=3)),
        ("count past the end", data(ids=ids, count=len(ids) * 10)),
        ("count 2^63", data(ids=ids, count=1 << 63)),
        ("count 2^62 (bytes overflow)", data(ids=ids, count=1 << 62)),
        ("token id over the vocab", data(ids=[300] + ids, version=1)),
        ("wide token id 2^31", data(ids=[1 << 31] + ids, version=2)),
        ("truncated header", raw(b"HSTK\x01\x00")),
        ("empty file", raw(b"")),
        ("too few tokens", data(ids=[1, 2, 3])),
    ]
    out = [Case(h, name, base, codes=(1, 2), setup=s, want=["d.hstk"], outputs=["out"])
           for name, s in rows]
    # A FIFO blocks open() until a writer comes: refused without opening
    # it for reading, with exit 2 naming the file, for every data source.
    fifo = lambda *names: lambda box, fx: [os.mkfifo(os.path.join(box, n)) for n in names]
    out += [
        Case(h, "token file is a FIFO", base, setup=fifo("d.hstk"), want=["d.hstk", "FIFO"],
             outputs=["out"], timeout=20),
        Case(h, "text file is a FIFO",
             ["train", *TINY, "train.steps=1", "data.source=text", "data.path={box}/d.hstk",
              "train.out_dir={box}/out"], setup=fifo("d.hstk"), want=["d.hstk", "FIFO"],
             outputs=["out"], timeout=20),
        Case(h, "indexed .idx and .bin are FIFOs",
             ["train", *TINY, "train.steps=1", "data.source=indexed", "data.path={box}/ix",
              "train.out_dir={box}/out"], setup=fifo("ix.idx", "ix.bin"),
             want=["ix.", "regular file"], outputs=["out"], timeout=20),
    ]
    return out


def safetensors_cases():
    def ex(fn, data_fn=None):
        return lambda box, fx: edit_exp(box, fx, fn, data_fn)

    def raw(b, n=None):
        def s(box, fx):
            d = fx.copy_exp(box)
            safetensors(os.path.join(d, "model.safetensors"), b, raw_len=n)
        return s

    def first(h):
        return next(k for k in h if k != "__metadata__")

    def dup(h):
        pass  # json cannot hold duplicate keys: the raw case below writes them

    def overlap(h):
        keys = [k for k in h if k != "__metadata__"]
        h[keys[1]]["data_offsets"] = h[keys[0]]["data_offsets"]

    def nan_data(h, data):
        a, _ = h[first(h)]["data_offsets"]
        return data[:a] + struct.pack("<f", float("nan")) + data[a + 4:]

    def inf_data(h, data):
        a, _ = h[first(h)]["data_offsets"]
        return data[:a] + struct.pack("<f", float("inf")) + data[a + 4:]

    def dup_raw(box, fx):
        d = fx.copy_exp(box)
        p = os.path.join(d, "model.safetensors")
        h, data = read_safetensors(p)
        k = first(h)
        text = json.dumps(h)
        entry = json.dumps({k: h[k]})[1:-1]
        safetensors(p, ("{" + entry + ", " + text[1:]).encode(), data)

    def setk(field, value):
        def fn(h):
            h[first(h)][field] = value
        return fn

    s = "safetensors"
    base = ["import", "{box}/exp", "--out", "{box}/out"]
    rows = [
        ("header length 2^63", raw(b"{}", 1 << 63)),
        ("header length 100 MB", raw(b"{}", 100 << 20)),
        ("header not JSON", raw(b"{not json")),
        ("offsets past the end", ex(setk("data_offsets", [0, 1 << 40]))),
        ("offsets reversed", ex(setk("data_offsets", [64, 0]))),
        ("negative offset", ex(setk("data_offsets", [-8, 0]))),
        ("overlapping tensors", ex(overlap)),
        ("duplicate tensor name", dup_raw),
        ("negative shape", ex(setk("shape", [-256, 32]))),
        ("shape product overflows", ex(setk("shape", [1 << 32, 1 << 32]))),
        ("unknown dtype", ex(setk("dtype", "F99"))),
        ("NaN in the weights", ex(lambda h: None, nan_data)),
        ("Inf in the weights", ex(lambda h: None, inf_data)),
    ]
    out = [Case(s, name, base, codes=(1, 2), setup=st, want=["model.safetensors"],
                outputs=["out"]) for name, st in rows]

    def hf(fn):
        return lambda box, fx: edit_hf_config(box, fx, fn)

    def drop(k):
        return lambda c: c.pop(k)

    def setc(k, v):
        def fn(c):
            c[k] = v
        return fn

    hrows = [
        ("hf vocab_size -1", hf(setc("vocab_size", -1)), "vocab_size"),
        ("hf hidden_size 2^62", hf(setc("hidden_size", 1 << 62)), "hidden_size"),
        ("hf num_attention_heads 0", hf(setc("num_attention_heads", 0)), "num_attention_heads"),
        ("hf hidden_size as string", hf(setc("hidden_size", "32")), "hidden_size"),
        ("hf missing hidden_size", hf(drop("hidden_size")), "hidden_size"),
        ("hf transformers 4 rope_scaling dynamic",
         hf(setc("rope_scaling", {"type": "dynamic", "factor": 4.0})), "rope_scaling"),
        ("hf rope_scaling llama3 without original_max_position_embeddings",
         hf(setc("rope_scaling", {"rope_type": "llama3", "factor": 8.0})), "rope_scaling"),
        ("hf rope_scaling yarn factor -4",
         hf(setc("rope_scaling", {"type": "yarn", "factor": -4.0,
                                  "original_max_position_embeddings": 4096})), "rope_scaling"),
        ("hf rope_parameters yarn factor as string",
         hf(setc("rope_parameters", {"rope_type": "yarn", "factor": "4",
                                     "original_max_position_embeddings": 4096})),
         "rope_parameters"),
        ("hf config not JSON",
         lambda box, fx: open(os.path.join(fx.copy_exp(box), "config.json"), "w").write("{"),
         "config.json"),
    ]
    out += [Case(s, name, base, codes=(1, 2), setup=st, want=[w], outputs=["out"])
            for name, st, w in hrows]
    return out


def ckpt_cases():
    def meta(fn):
        def s(box, fx):
            _, step = fx.copy_ck(box)
            edit_meta(step, fn)
        return s

    def chunk(field, value):
        def fn(m):
            first_chunk(m)[field] = value
        return fn

    def wrap_zero(m):
        t = m["tensors"][0]
        t["shape"] = [1 << 32, 1 << 32]
        t["chunks"][0]["sizes"] = [1 << 32, 1 << 32]
        t["chunks"][0]["length"] = 0

    def overlap(m):
        t = m["tensors"][0]
        t["chunks"].append(dict(t["chunks"][0]))

    def dup_tensor(m):
        m["tensors"].append(m["tensors"][0])

    def step_mismatch(m):
        m["state"]["step"] = m["state"]["step"] - 1

    def latest(target):
        def s(box, fx):
            ck, _ = fx.copy_ck(box)
            os.remove(os.path.join(ck, "latest"))
            os.symlink(target, os.path.join(ck, "latest"))
        return s

    def edit_config(box, fx):
        _, step = fx.copy_ck(box)
        p = os.path.join(step, "config.yaml")
        text = open(p).read().replace("dim: 32", "dim: 48", 1)
        open(p, "w").write(text)

    def truncate_data(box, fx):
        _, step = fx.copy_ck(box)
        p = os.path.join(step, "rank-0.bin")
        os.truncate(p, os.path.getsize(p) // 2)

    k = "ckpt"
    verify = ["ckpt", "verify", "{box}/ck/step-2"]
    rows = [
        ("metadata not JSON", lambda box, fx: open(
            os.path.join(fx.copy_ck(box)[1], "metadata.json"), "w").write("{\"format\":")),
        ("chunk byte offset near INT64_MAX", meta(chunk("byte_offset", (1 << 63) - 8))),
        ("chunk negative byte offset", meta(chunk("byte_offset", -64))),
        ("chunk offsets past the shape", meta(chunk("offsets", [1 << 62, 0]))),
        ("element count wraps to 0", meta(wrap_zero)),
        ("overlapping chunks", meta(overlap)),
        ("duplicate tensor", meta(dup_tensor)),
        ("unknown dtype", meta(lambda m: m["tensors"][0].__setitem__("dtype", "float99"))),
        ("step 1 inside step-2/", meta(step_mismatch)),
        ("data file truncated", truncate_data),
    ]
    out = [Case(k, name, verify, codes=(1, 2), setup=s, want=["step-2"]) for name, s in rows]
    resume = ["train", *TINY, "train.steps=3", "train.out_dir={box}/out",
              "checkpoint.dir={box}/ck", "checkpoint.resume=auto"]
    out += [
        Case(k, "resume: chunk offset near INT64_MAX", resume, codes=(1, 2),
             setup=meta(chunk("byte_offset", (1 << 63) - 8)), want=["step-2"],
             outputs=["out", "ck"]),
        Case(k, "resume: latest is a symlink to /etc/passwd", resume, codes=(1, 2),
             setup=latest("/etc/passwd"), want=["latest"], forbid=["root:"],
             outputs=["out", "ck"]),
        Case(k, "resume: latest points outside the directory", resume, codes=(1, 2),
             setup=latest("../../../../etc"), want=["latest"], outputs=["out", "ck"]),
        Case(k, "verify: config.yaml edited", verify, codes=(1,), setup=edit_config,
             want=["config.yaml", "edited"]),
        # the run's own settings match the metadata: the tensors load as saved
        Case(k, "resume: config.yaml edited", resume, codes=(0,), setup=edit_config,
             outputs=["out", "ck"]),
        Case(k, "inspect: element count wraps to 0", ["ckpt", "inspect", "{box}/ck/step-2"],
             codes=(0, 1, 2), setup=meta(wrap_zero)),
    ]
    return out


def output_cases():
    run_src = ["--run", "{run}"]
    o = "outputs"

    def make_file(name):
        return lambda box, fx: open(os.path.join(box, name), "w").write("x")

    train = ["train", *TINY, "train.steps=1"]
    return [
        Case(o, "export --safetensors ''", ["export", "--safetensors", "", *run_src],
             want=["--safetensors"]),
        Case(o, "export --ckpt with empty output",
             ["export", "--safetensors", "", "--ckpt", "{step}"], want=["--safetensors"]),
        Case(o, "ckpt export --safetensors ''", ["ckpt", "export", "{step}", "--safetensors", ""],
             want=["--safetensors"]),
        Case(o, "import --out ''", ["import", "{exp}", "--out", ""], want=["--out"]),
        Case(o, "export onto a file", ["export", "--safetensors", "{box}/f", *run_src],
             setup=make_file("f"), want=["{box}/f"]),
        Case(o, "export under /proc", ["export", "--safetensors", "/proc/hs_probe", *run_src],
             want=["/proc/hs_probe"]),
        Case(o, "train out_dir ''", [*train, "train.out_dir="], want=["train.out_dir"]),
        Case(o, "train out_dir is a file", [*train, "train.out_dir={box}/f"],
             setup=make_file("f"), want=["train.out_dir"]),
        Case(o, "train checkpoint.dir is a file",
             [*train, "train.out_dir={box}/out", "checkpoint.dir={box}/f"],
             setup=make_file("f"), want=["checkpoint.dir"]),
        Case(o, "train --init-from ''", [*train, "train.out_dir={box}/out", "--init-from", ""],
             want=["--init-from"]),
        Case(o, "train out_dir under /proc", [*train, "train.out_dir=/proc/hs_probe"],
             want=["/proc/hs_probe"]),
    ] + [Case("inputs", f"{' '.join(a)} ''", [*a, "", *rest], want=[w + ": empty path"],
              outputs=["out"])
         for a, rest, w in [
             (["export", "--safetensors", "{box}/out", "--run"], [], "--run"),
             (["export", "--safetensors", "{box}/out", "--ckpt"], [], "--ckpt"),
             (["generate", "--prompt", "x", "--run"], [], "--run"),
             (["eval", "--ckpt"], [], "--ckpt"),
             (["import"], [], "DIR"),
             (["ckpt", "verify"], [], "verify"),
             (["ckpt", "export"], ["--safetensors", "{box}/out"], "DIR"),
             (["tokenize"], ["abc"], "TOKENIZER_JSON")]]


def infer_cases():
    g = ["generate", "--run", "{run}", "--prompt", "the"]
    i = "infer"
    rows = [
        ("generate --max-new-tokens -1", [*g, "--max-new-tokens", "-1"], "--max-new-tokens"),
        ("generate --max-new-tokens 1e11", [*g, "--max-new-tokens", "99999999999"],
         "--max-new-tokens"),
        ("generate --top-k -5", [*g, "--top-k", "-5"], "--top-k"),
        ("generate --temperature nan", [*g, "--temperature", "nan"], "--temperature"),
        ("generate --seed abc", [*g, "--seed", "abc"], "--seed"),
        ("generate empty prompt", ["generate", "--run", "{run}", "--prompt", ""], "--prompt"),
        ("generate --run missing", ["generate", "--run", "{box}/none", "--prompt", "x"], "none"),
        ("eval val_fraction 2", ["eval", "--run", "{run}", "data.val_fraction=2"],
         "data.val_fraction"),
    ]
    return [Case(i, name, args, want=[w]) for name, args, w in rows]


def metrics_cases():
    def full(box, fx):
        os.makedirs(os.path.join(box, "out"))
        os.symlink("/dev/full", os.path.join(box, "out", "metrics.jsonl"))

    return [Case("metrics", "metrics.jsonl on a full disk",
                 ["train", *TINY, "train.steps=2", "train.out_dir={box}/out"], codes=(0, 1),
                 setup=full, want=["metrics.jsonl"], outputs=["out"])]


def fault_cases():
    pp = ["train", *TINY, "model.n_layers=4", "accelerator.pp_size=4",
          "accelerator.pp_schedule=1f1b", "train.global_batch_size=8", "train.micro_batch_size=1",
          "train.steps=1000000", "comm.timeout_s=6", "train.out_dir={box}/out"]
    dp = ["train", *TINY, "fsdp_config.dp_shard_size=2", "train.global_batch_size=4",
          "train.steps=1000000",
          "comm.timeout_s=4", "train.out_dir={box}/out"]
    f = "faults"
    return [
        Case(f, "SIGSTOP rank 1 of FSDP 2", dp, codes=(1,), mpi=2, fault=(1, "STOP", 3.0, 4),
             want=["timeout"], outputs=["out"], timeout=60),
        Case(f, "SIGKILL rank 1 of FSDP 2", dp, codes=(1, 137, 9), mpi=2,
             fault=(1, "KILL", 3.0, 4), outputs=["out"], timeout=60),
        Case(f, "SIGSTOP rank 2 of PP 4", pp, codes=(1,), mpi=4, fault=(2, "STOP", 4.0, 6),
             want=["timeout"], outputs=["out"], timeout=90),
    ]


# ------------------------------------------------------------------ running


def snapshot(paths):
    seen = set()
    for p in paths:
        try:
            for name in os.listdir(p):
                seen.add(os.path.join(p, name))
        except OSError:
            pass
    return seen


def sandbox_files(box):
    out = set()
    for d, dirs, files in os.walk(box):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(d, n), box))
    return out


def rank_pids(hs, n, deadline):
    """The pids of the n hypershard ranks under mpiexec, by rank order."""
    while time.time() < deadline:
        r = subprocess.run(["pgrep", "-f", "-x", f"{hs} train .*"], capture_output=True,
                           text=True)
        pids = sorted(int(p) for p in r.stdout.split())
        if len(pids) == n:
            ranks = {}
            for p in pids:
                try:
                    env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                for kv in env:
                    if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                        ranks[int(kv.split(b"=")[1])] = p
            if len(ranks) == n:
                return ranks
        time.sleep(0.1)
    return {}


def run_case(hs, fx, c, top):
    box = tempfile.mkdtemp(prefix="case_", dir=top)
    home, cwd = os.path.join(box, "home"), os.path.join(box, "cwd")
    os.makedirs(home)
    os.makedirs(cwd)
    if c.setup:
        c.setup(box, fx)
    subst = {"box": box, "run": fx.run, "step": fx.step, "exp": fx.exp}
    args = [a.format(**subst) for a in c.args]
    want = [w.format(**subst) for w in c.want]
    before_box = sandbox_files(box)
    watch = ["/", home, cwd, os.path.dirname(box)]
    before = snapshot(watch)
    env = dict(os.environ, HOME=home, **MPI_ENV, **c.env)
    cmd = [hs, *args]
    if c.mpi:
        cmd = ["mpiexec", "-n", str(c.mpi), *cmd]
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    detect = None
    if c.fault:
        rank, sig, after, limit = c.fault
        pids = rank_pids(hs, c.mpi, t0 + 30)
        time.sleep(after)
        if rank in pids and p.poll() is None:
            os.kill(pids[rank], getattr(signal, "SIG" + sig))
            t_fault = time.time()
        else:
            t_fault = None
    try:
        out, _ = p.communicate(timeout=c.timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        hung = True
    secs = time.time() - t0
    if c.fault:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        subprocess.run(["pkill", "-9", "-f", f"{hs} train .*{box}"], capture_output=True)
        if t_fault is not None:
            detect = time.time() - t_fault if hung else secs - (t_fault - t0)
    text = out.decode("utf-8", "replace")
    rc = p.returncode
    problems = []
    if hung:
        problems.append(f"hang (> {c.timeout} s)")
    elif rc < 0 or (rc >= 128 and rc not in c.codes):
        problems.append(f"killed by signal {-rc if rc < 0 else rc - 128}")
    elif rc not in c.codes:
        problems.append(f"exit {rc}, want {'/'.join(map(str, c.codes))}")
    if "Sanitizer" in text or "runtime error:" in text:
        problems.append("sanitizer report")
    if rc != 0 and not hung and not text.strip():
        problems.append("no message")
    for w in want:
        if w not in text:
            problems.append(f"does not name '{w}'")
    for f in c.forbid:
        if f in text:
            problems.append(f"prints '{f}'")
    if c.fault and detect is not None:
        rank, sig, after, limit = c.fault
        if sig == "STOP" and detect > limit + 2.5:
            problems.append(f"detected {detect:.1f} s after the stop (timeout {limit} s)")
    stray = sorted(snapshot(watch) - before - {box})
    new_box = sandbox_files(box) - before_box
    stray += sorted(os.path.join(box, f) for f in new_box
                    if not any(f == o or f.startswith(o + "/") for o in c.outputs))
    if stray:
        problems.append("wrote " + ", ".join(stray[:3]))
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    shutil.rmtree(box, ignore_errors=True)
    return rc, secs, problems, first.replace(box, "BOX")[:90], detect


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    hs = os.path.abspath(sys.argv[1])
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    cases = (cli_cases() + config_cases() + tokenizer_cases() + hstk_cases() +
             safetensors_cases() + ckpt_cases() + output_cases() + infer_cases() +
             metrics_cases())
    if "--faults" in sys.argv:
        cases += fault_cases()
    if only:
        cases = [c for c in cases if only in c.cls or only in c.name]
    top = tempfile.mkdtemp(prefix="hs_probe_")
    bad = 0
    try:
        fx = Fixture(hs, os.path.join(top, "fixture"))
        print("| class | case | exit | s | verdict | first line |")
        print("|---|---|---|---|---|---|")
        for c in cases:
            rc, secs, problems, first, detect = run_case(hs, fx, c, top)
            verdict = "ok" if not problems else "BAD: " + "; ".join(problems)
            if detect is not None:
                verdict += f" (ended {detect:.1f} s after the signal)"
            bad += bool(problems)
            first = first.replace("|", "\\|")
            print(f"| {c.cls} | {c.name} | {rc} | {secs:.1f} | {verdict} | {first} |", flush=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"{len(cases) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
