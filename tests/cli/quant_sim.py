#!/usr/bin/env python3
"""The weights FSDP computes with under fsdp_config.param_gather, built from
the format's definition with the standard library alone:

  quant_sim.py SRC DST WORLD BLOCK FORMAT [FQN...]

reads the fp32 tensors of SRC (a --dump weights-step0.safetensors), and
writes DST/model.safetensors with each tensor as its all-gather delivers
it: dim 0 split into WORLD chunks of ceil(D0 / WORLD) rows (the last
zero-padded), each chunk's values quantized in blocks of BLOCK from its
first value and read back, the rows [0, D0) kept. FORMAT is int8 (scale
amax / 127, round half to even, clamp to +-127) or fp8_e4m3 (scale
amax / 448, OCP e4m3: 3 mantissa bits, subnormals from 2^-9, 448 the
largest, round to nearest even); a block of zeros reads back zeros. The
FQNs listed (replicate_params) are kept as they are. fp32 arithmetic is
done in double and rounded once, which gives IEEE fp32's quotient and
product exactly (53 >= 2 x 24 + 2 bits)."""
import json
import os
import struct
import sys
from array import array


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def e4m3_grid():
    """The non-negative finite e4m3 values in code order (codes 0..126)."""
    out = []
    for c in range(127):
        e, m = (c >> 3) & 15, c & 7
        out.append(m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10))
    return out


GRID = e4m3_grid()


def to_e4m3(y):
    a = abs(y)
    if a >= 448.0:
        r = 448.0
    else:
        lo, hi = 0, len(GRID) - 1  # the last code <= a
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if GRID[mid] <= a:
                lo = mid
            else:
                hi = mid - 1
        c = lo
        if c + 1 < len(GRID):
            below, above = a - GRID[c], GRID[c + 1] - a
            if above < below or (above == below and (c + 1) % 2 == 0):
                c += 1
        r = GRID[c]
    return -r if y < 0 else r


def read_back(vals, block, fmt):
    top = 127.0 if fmt == "int8" else 448.0
    out = []
    for s in range(0, len(vals), block):
        blk = vals[s : s + block]
        scale = f32(max(abs(v) for v in blk) / top)
        for v in blk:
            if scale == 0.0:
                out.append(0.0)
                continue
            y = f32(v / scale)
            q = max(-127.0, min(127.0, float(round(y)))) if fmt == "int8" else to_e4m3(y)
            out.append(f32(q * scale))
    return out


def main():
    src, dst, world, block, fmt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    keep = set(sys.argv[6:])
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    tensors = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32", (name, h["dtype"])
        s, e = h["data_offsets"]
        vals = array("f", raw[8 + n + s : 8 + n + e]).tolist()
        if name not in keep:
            d0 = h["shape"][0]
            row = len(vals) // d0
            chunk = -(-d0 // world) * row
            padded = vals + [0.0] * (chunk * world - len(vals))
            full = []
            for r in range(world):
                full += read_back(padded[r * chunk : (r + 1) * chunk], block, fmt)
            vals = full[: len(vals)]
        tensors[name] = (h["shape"], array("f", vals).tobytes())
    out, off, blobs = {}, 0, []
    for name, (shape, data) in tensors.items():
        out[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


main()
