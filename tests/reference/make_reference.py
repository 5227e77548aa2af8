#!/usr/bin/python3
"""Writes the PyTorch reference that tests/cli/test_torch_parity.sh checks
hypershard against.

Input: a 2-step `hypershard train --dump DIR` run: its initial weights
(DIR/weights-step0.safetensors), and from its train.out_dir the Hugging Face
config.json (the model) and the resolved config.yaml (optimizer, batch,
sequence length, the HSTK token file). It runs forward,
backward and two optimizer steps in fp32 with autograd, torch's own
gradient clipping and torch.optim.AdamW, and writes one safetensors file:

  loss.step1, loss.step2     [1]      mean token cross-entropy of the batch
  aux.step1, aux.step2       [1]      MoE only: router_aux_loss_coef x aux
  grad_norm.step1, .step2    [1]      global L2 norm before clipping
  logits.step1               [S,T,V]  every sequence, step-1 weights
  grad.<name>                         step-1 gradient of loss (+ aux), unclipped
  weight.<name>                       weights after step 2

The batch is the whole token file: it must hold exactly global_batch_size sequences
of seq_len + 1 tokens, so that hypershard's train split is one global batch
and every step reads the same sequences whatever its shuffle.

Needs python3-torch (Debian); CI does not: the output is committed under
tests/data and regenerated only when the model or the optimizers change.
See tests/reference/README.md.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=DTYPES[meta["dtype"]])
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def fingerprint(tensors):
    """sha256 over the sorted names and fp32 bytes: ties a reference to the
    initial weights it was made from (compare.py recomputes it)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().float().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_safetensors(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = dict(meta, format="pt", generator="tests/reference/make_reference.py")
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_tokens(path):
    """src/data/data_tokens.c: "HSTK", uint32 version 1, uint64 count, then
    count uint16 tokens, all little-endian, nothing after them."""
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, count = struct.unpack("<4sIQ", raw[:16])
    assert magic == b"HSTK" and version == 1, f"{path}: not an HSTK version 1 token file"
    assert len(raw) == 16 + 2 * count, f"{path}: header says {count} tokens, file has {len(raw)} bytes"
    return torch.tensor(struct.unpack(f"<{count}H", raw[16:]), dtype=torch.long)


def is_muon(name, t):
    """docs/optimizers.md: 2-D hidden matrices of attention and MLP (shared
    expert included) and each routed expert's matrices; embeddings, lm_head,
    norms and routers stay on AdamW."""
    if t.dim() != 2 or "embed_tokens" in name or name.startswith("lm_head"):
        return False
    return not name.endswith("block_sparse_moe.gate.weight")


def newton_schulz5(g, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if transposed else x


class Muon:
    """docs/optimizers.md, SGD-momentum form with optional Nesterov."""

    def __init__(self, params, args):
        self.params, self.args = params, args
        self.buf = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        a = self.args
        for p, buf in zip(self.params, self.buf):
            g = p.grad
            buf.mul_(a.momentum).add_(g)
            u = g + a.momentum * buf if a.nesterov else buf
            o = newton_schulz5(u, a.ns_steps)
            p.mul_(1 - a.lr * a.weight_decay)
            p.add_(o, alpha=-a.lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))


def make_optimizers(params, args):
    """torch.optim.AdamW for everything AdamW updates (weight decay on
    tensors of 2+ dims), Muon for the eligible matrices when asked."""
    muon = [n for n, p in params.items() if args.optimizer == "muon" and is_muon(n, p)]
    rest = [n for n in params if n not in muon]
    groups = [{"params": [params[n] for n in rest if params[n].dim() >= 2],
               "weight_decay": args.weight_decay},
              {"params": [params[n] for n in rest if params[n].dim() < 2], "weight_decay": 0.0}]
    opts = [torch.optim.AdamW([g for g in groups if g["params"]], lr=args.lr,
                              betas=(args.beta1, args.beta2), eps=args.eps, foreach=False)]
    if muon:
        opts.append(Muon([params[n] for n in muon], args))
    return opts


def settings(run_dir, tokens):
    """What the reference needs of the run, from its resolved config.yaml,
    refusing what it does not model."""
    import types

    import yaml  # python3-yaml; only this generator needs it

    c = yaml.safe_load(open(f"{run_dir}/config.yaml"))
    o, t, s = c["optimizer"], c["train"], c["optimizer"]["schedule"]
    assert s["warmup_steps"] == 0 and s["decay"] == "constant", \
        "the reference uses a constant learning rate: set optimizer.schedule.warmup_steps 0, decay constant"
    assert t["global_batch_size"] % t["micro_batch_size"] == 0
    if c["model"]["arch"] == "moe":
        assert t["micro_batch_size"] == t["global_batch_size"], \
            "MoE: the aux loss is per micro-batch; use one micro-batch of the whole batch"
    return types.SimpleNamespace(
        optimizer=o["_target_"], lr=o["lr"], beta1=o["betas"][0], beta2=o["betas"][1],
        eps=o["eps"], weight_decay=o["weight_decay"], clip=o["clip_grad_norm"],
        momentum=o["muon"]["momentum"], nesterov=o["muon"]["nesterov"],
        ns_steps=o["muon"]["ns_steps"], batch=t["global_batch_size"], seq_len=t["seq_len"],
        tokens=tokens or c["data"]["path"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="train.out_dir of the run (config.yaml, config.json)")
    ap.add_argument("--dump", required=True, help="its --dump DIR (weights-step0.safetensors)")
    ap.add_argument("--tokens", help="the HSTK file, when data.path of the run is not reachable")
    ap.add_argument("--out", required=True)
    cli = ap.parse_args()
    args = settings(cli.run, cli.tokens)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = json.load(open(f"{cli.run}/config.json"))
    weights = read_safetensors(f"{cli.dump}/weights-step0.safetensors")
    params = {k: v.float().requires_grad_(True) for k, v in weights.items()}
    init_sha256 = fingerprint(params)
    # Sequence s is tokens [s(T+1), (s+1)(T+1)); inputs are its first T
    # tokens, targets its last T (docs/data.md).
    toks = read_tokens(args.tokens)
    S, T = args.batch, args.seq_len
    assert toks.numel() // (T + 1) == S, \
        f"{args.tokens}: {toks.numel()} tokens make {toks.numel() // (T + 1)} sequences, want {S}"
    seqs = toks[: S * (T + 1)].view(S, T + 1)
    inputs, targets = seqs[:, :T], seqs[:, 1:]

    opts = make_optimizers(params, args)
    out = {}
    for step in (1, 2):
        for p in params.values():
            p.grad = None
        ce, aux, logits = torch_model.forward(params, cfg, inputs, targets)
        (ce + aux).backward()
        out[f"loss.step{step}"] = ce.detach().reshape(1)
        if cfg.get("model_type") == "mixtral":
            out[f"aux.step{step}"] = aux.detach().reshape(1)
        if step == 1:
            out["logits.step1"] = logits.detach()
            for k, p in params.items():
                out[f"grad.{k}"] = p.grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()),
                                              args.clip if args.clip > 0 else float("inf"))
        out[f"grad_norm.step{step}"] = norm.detach().reshape(1).float()
        for o in opts:
            o.step()
    for k, p in params.items():
        out[f"weight.{k}"] = p.detach()
    write_safetensors(cli.out, out, {"init_sha256": init_sha256})
    print(f"wrote {cli.out}: loss {out['loss.step1'].item():.6f} -> {out['loss.step2'].item():.6f}")


if __name__ == "__main__":
    main()
