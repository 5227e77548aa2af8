"""grads_within.py REF RUN TOL [nonzero]: the step-1 gradients RUN dumped
(RUN/dump/grads-step1.safetensors, fp32) are within TOL of REF's, relative
to each tensor's largest value; with `nonzero`, not all equal (something
was quantized). Prints the worst; exits 1 naming the tensor otherwise."""
import json
import struct
import sys


def grads(d):
    raw = open(d + "/dump/grads-step1.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out


def main():
    ref, run, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    nonzero = len(sys.argv) > 4 and sys.argv[4] == "nonzero"
    ga, gb = grads(ref), grads(run)
    if ga.keys() != gb.keys():
        sys.exit(f"{run}: other tensors than {ref}'s: {sorted(set(ga) ^ set(gb))}")
    worst = 0.0
    for k in ga:
        err = max(abs(p - q) for p, q in zip(ga[k], gb[k])) / (max(abs(v) for v in ga[k]) or 1.0)
        if err >= tol:
            sys.exit(f"{run}: the step-1 gradient of {k} is off by {err:.2e} (tol {tol})")
        worst = max(worst, err)
    if nonzero and worst == 0:
        sys.exit(f"{run}: the exact gradients: nothing was quantized")
    print(f"{run.split('/')[-1]} vs {ref.split('/')[-1]}: step-1 gradients within {worst:.2e}")


if __name__ == "__main__":
    main()
