#!/usr/bin/env python3
"""Compares a `hypershard train --dump` run with a reference written by
make_reference.py. Standard library only (json, struct), so CI needs no
numpy or torch.

Metric, per tensor (--metric):
  max (default)  err = max |ours - ref| / max |ref|: the largest difference
                 relative to the tensor's largest magnitude
  l2             err = ||ours - ref||_2 / ||ref||_2: for 16-bit runs, where
                 rounding moves single elements but not the tensor
Scalars (loss, aux, grad_norm) use |ours - ref| / |ref|. Checked:

  loss, aux, grad_norm   steps 1 and 2 (metrics.jsonl), |ours - ref| / |ref|
  logits                 step 1, the dumped sequence
  grad.*                 every gradient of step 1, before clipping
  weight.*               every weight after step 2
  update.*               weights after step 2 minus initial weights: the two
                         optimizer updates alone (much smaller than the
                         weights, so a sharper test of the optimizer)

Each must be <= its tolerance; the worst of each kind is printed.
Exit 0 when all pass, 1 otherwise.
"""
import argparse
import hashlib
import json
import struct
import sys

FORMATS = {"F32": ("f", 4), "F16": ("e", 2)}


def read_safetensors(path):
    """name -> (shape, flat list of floats); and the metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        if h["dtype"] == "BF16":
            words = struct.unpack(f"<{(b - a) // 2}H", data[a:b])
            vals = list(struct.unpack(f"<{len(words)}f", struct.pack(f"<{len(words)}I",
                                                                     *[w << 16 for w in words])))
        else:
            code, size = FORMATS[h["dtype"]]
            vals = list(struct.unpack(f"<{(b - a) // size}{code}", data[a:b]))
        out[name] = (h["shape"], vals)
    return out, meta


def fingerprint(tensors):
    """make_reference.py's init_sha256: sha256 over sorted names and fp32 bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(struct.pack(f"<{len(tensors[name][1])}f", *tensors[name][1]))
    return h.hexdigest()


def rel_err_l2(ours, ref):
    if len(ours) != len(ref):
        return float("inf")
    num = sum((x - y) ** 2 for x, y in zip(ours, ref)) ** 0.5
    den = sum(y * y for y in ref) ** 0.5
    return num / den if den > 0 else num


def rel_err(ours, ref):
    scale = max((abs(x) for x in ref), default=0.0)
    diff = max((abs(x - y) for x, y in zip(ours, ref)), default=0.0)
    if len(ours) != len(ref):
        return float("inf")
    return diff / scale if scale > 0 else diff


class Checker:
    def __init__(self, metric):
        self.worst, self.failures = {}, []
        self.err = rel_err_l2 if metric == "l2" else rel_err

    def check(self, kind, name, err, tol):
        if kind not in self.worst or err > self.worst[kind][1]:
            self.worst[kind] = (name, err, tol)
        if not err <= tol:
            self.failures.append(f"{kind} {name}: error {err:.3g} > tolerance {tol:.3g}")

    def report(self):
        for kind, (name, err, tol) in sorted(self.worst.items()):
            print(f"  {kind:10s} worst {err:.3e} (tolerance {tol:.0e})  {name}")
        for f in self.failures[:12]:
            print(f"FAIL {f}")
        if len(self.failures) > 12:
            print(f"FAIL ... and {len(self.failures) - 12} more")
        return not self.failures


def check_metrics(c, ref, metrics_path, tol):
    lines = [json.loads(l) for l in open(metrics_path) if l.strip()]
    by_step = {m["step"]: m for m in lines}
    for step in (1, 2):
        m = by_step.get(step)
        if m is None:
            c.failures.append(f"{metrics_path}: no step {step}")
            continue
        for key, ref_key in (("loss", "loss"), ("aux_loss", "aux"), ("grad_norm", "grad_norm")):
            r = ref.get(f"{ref_key}.step{step}")
            if r is None:
                continue
            if key not in m:
                c.failures.append(f"{metrics_path}: step {step} lacks {key}")
                continue
            want = r[1][0]
            c.check(key, f"step{step}", abs(m[key] - want) / max(abs(want), 1e-30), tol)


def check_logits(c, ref, dump, tol):
    logits, meta = read_safetensors(f"{dump}/logits-step1.safetensors")
    shape, want = ref["logits.step1"]
    seq, per_seq = int(meta["sequence"]), shape[1] * shape[2]
    ours = logits["logits"][1]
    c.check("logits", f"sequence {seq}", c.err(ours, want[seq * per_seq:(seq + 1) * per_seq]),
            tol)


def check_tensors(c, kind, ours, ref, prefix, tol):
    names = {k[len(prefix):] for k in ref if k.startswith(prefix)}
    if names != set(ours):
        missing, extra = sorted(names - set(ours)), sorted(set(ours) - names)
        c.failures.append(f"{kind}: tensor names differ; missing {missing[:5]}, extra {extra[:5]}")
    for name in sorted(names & set(ours)):
        if ours[name][0] != ref[prefix + name][0]:
            c.failures.append(f"{kind} {name}: shape {ours[name][0]} vs {ref[prefix + name][0]}")
            continue
        c.check(kind, name, c.err(ours[name][1], ref[prefix + name][1]), tol)


def check_updates(c, w0, w2, ref, tol):
    for name in sorted(set(w0) & set(w2)):
        if "weight." + name not in ref:
            continue
        base = w0[name][1]
        ours = [b - a for a, b in zip(base, w2[name][1])]
        want = [b - a for a, b in zip(base, ref["weight." + name][1])]
        c.check("update", name, c.err(ours, want), tol)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True, help="make_reference.py output")
    ap.add_argument("--dump", help="the --dump DIR of the run: logits, grads and weights")
    ap.add_argument("--weights", help="without --dump: the run's weights after step 2 "
                                      "(model.safetensors of a 2-step run)")
    ap.add_argument("--init", help="without --dump: initial weights (weights-step0.safetensors "
                                   "of any run of the same model and seed), for the update check")
    ap.add_argument("--metrics", required=True, help="metrics.jsonl of the run")
    ap.add_argument("--metric", choices=["max", "l2"], default="max", help="tensor metric")
    ap.add_argument("--tol", type=float, default=1e-4, help="logits, grads, weights")
    ap.add_argument("--scalar-tol", type=float, help="loss, aux, grad_norm (default: --tol)")
    ap.add_argument("--update-tol", type=float, default=1e-3, help="weights minus initial")
    args = ap.parse_args()

    ref, ref_meta = read_safetensors(args.ref)
    c = Checker(args.metric)
    init = f"{args.dump}/weights-step0.safetensors" if args.dump else args.init
    w0 = read_safetensors(init)[0] if init else None
    if w0 is not None and ref_meta.get("init_sha256") not in (None, fingerprint(w0)):
        print(f"FAIL {init} is not the initial state {args.ref} was made from: the model's "
              "initialisation, the config or the seed changed. If on purpose, regenerate the "
              "references (tests/reference/README.md).")
        return 1
    check_metrics(c, ref, args.metrics, args.scalar_tol if args.scalar_tol else args.tol)
    if args.dump:
        check_logits(c, ref, args.dump, args.tol)
        grads, _ = read_safetensors(f"{args.dump}/grads-step1.safetensors")
        check_tensors(c, "grad", grads, ref, "grad.", args.tol)
    final = f"{args.dump}/weights-step2.safetensors" if args.dump else args.weights
    if not final:
        ap.error("give --dump, or --weights (and optionally --init)")
    w2, _ = read_safetensors(final)
    check_tensors(c, "weight", w2, ref, "weight.", args.tol)
    if w0 is not None:
        check_updates(c, w0, w2, ref, args.update_tol)
    ok = c.report()
    print("parity: PASS" if ok else "parity: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
