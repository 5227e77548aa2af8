#!/usr/bin/env python3
"""Standard-library checks of hypershard against a committed transformers
reference (tests/reference/make_qwen3*_reference.py), shared by the Hugging
Face CLI tests:

  hf_reference.py same SRC OUT
      every tensor of SRC/model.safetensors is in OUT/model.safetensors with
      the same dtype, shape and bytes, and no other is.
  hf_reference.py check REF RUN
      RUN (a one-step `hypershard train --dump RUN/dump`) against REF: the
      step-1 loss (REF's `loss`, or its `ce` and, as metrics.jsonl's
      aux_loss, `aux`) relative to the reference value, the dumped
      sequence's logits and every `grad.<name>` REF holds relative to the
      tensor's largest magnitude. Exit 0 when all are below 1e-4.
"""
import json
import struct
import sys

TOL = 1e-4


def header(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    return raw, 8 + n, head.pop("__metadata__", {}), head


def raw_tensors(path):
    raw, base, _, head = header(path)
    return {k: (v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in head.items()}


def tensors(path):
    raw, base, meta, head = header(path)
    out = {}
    for k, v in head.items():
        assert v["dtype"] == "F32", (path, k)
        a, b = v["data_offsets"]
        out[k] = (v["shape"], struct.unpack(f"<{(b - a) // 4}f", raw[base + a:base + b]))
    return out, meta


def same(src, out):
    a, b = raw_tensors(src + "/model.safetensors"), raw_tensors(out + "/model.safetensors")
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        assert a[k] == b[k], f"{k} differs after import and export"
    print(f"  import + export: {len(a)} tensors bit for bit")
    return 0


def rel_max(ours, want):
    """Relative to want's largest magnitude; absolute where want is all
    zeros (a buffer's gradient)."""
    scale = max(abs(q) for q in want) or 1.0
    return max(abs(p - q) for p, q in zip(ours, want)) / scale


def check(ref_path, run):
    ref, _ = tensors(ref_path)
    m = json.loads(open(run + "/metrics.jsonl").readline())
    pairs = [("loss", "loss" if "loss" in ref else "ce")] + [("aux_loss", "aux")] * ("aux" in ref)
    errs, words = [], []
    for ours, theirs in pairs:
        want = ref[theirs][1][0]
        errs.append(abs(m[ours] - want) / abs(want))
        words.append(f"{theirs} {m[ours]:.7f} vs {want:.7f} (rel {errs[-1]:.1e})")
    dumped, meta = tensors(run + "/dump/logits-step1.safetensors")
    seq = int(meta["sequence"])
    (S, T, V), logits = ref["logits"]
    want_l = logits[seq * T * V:(seq + 1) * T * V]
    ours_l = dumped["logits"][1]
    assert len(ours_l) == len(want_l), (len(ours_l), len(want_l))
    errs.append(rel_max(ours_l, want_l))
    words.append(f"logits of sequence {seq} max rel {errs[-1]:.1e}")
    names = {k[len("grad."):] for k in ref if k.startswith("grad.")}
    if names:
        grads, _ = tensors(run + "/dump/grads-step1.safetensors")
        assert names == set(grads), names ^ set(grads)
        worst, where = 0.0, ""
        for k in sorted(names):
            g, w = grads[k], ref["grad." + k]
            assert g[0] == w[0], (k, g[0], w[0])
            e = rel_max(g[1], w[1])
            if e >= worst:
                worst, where = e, k
        errs.append(worst)
        words.append(f"{len(names)} gradients max rel {worst:.1e} ({where})")
    print(f"  {run.rstrip('/').split('/')[-1]}: " + ", ".join(words))
    return 0 if max(errs) < TOL else 1


if __name__ == "__main__":
    cmd, a, b = sys.argv[1:4]
    sys.exit({"same": same, "check": check}[cmd](a, b))
