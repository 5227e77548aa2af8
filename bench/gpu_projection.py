"""The bf16 training step of a Llama-shaped model on one NVIDIA GPU, projected
kernel class by kernel class from what hypershard's cuda backend runs: each
class's FLOPs and bytes moved, its roofline bound on the GPU (the larger of
FLOPs / peak and bytes / bandwidth), and an expected time from the
efficiencies stated below; then the step time, tokens/s and MFU against the
nominal dense bf16 peak. The first GPU run (tests/gpu/run.sh) is read
against this table; docs/cuda.md carries its output for the 1.1B shape.

    python3 bench/gpu_projection.py                      # 1.1B, H100 and H200
    python3 bench/gpu_projection.py --dim 768 --layers 12 --heads 12 \
        --kv-heads 12 --ffn 2048 --vocab 50304 --seq 1024 --batch 8

What the step does (src/model, src/device/cuda*): activations in bf16, the
residual stream and activation gradients in fp32, each GEMM's 16-bit input
gradient converted from fp32 first but the gate and up projections' (the
SwiGLU backward writes them in bf16), attention through cuDNN's fused SDPA
(its 16-bit gradients added into the fp32 ones), the fp32 main parameters
(optimizer.fp32_main_params, as tests/gpu/run.sh runs it) updated by one
adamw_many that also writes the bf16 shard, the gradient norm in one
sumsq_many. One GPU: the model computes on its own bf16 shard (FSDP's
unshard over one rank aliases it), and the reduction over one rank is a
copy.
"""
import argparse

# Efficiencies assumed, each against the GPU's nominal figure (stated, not
# measured here): cuBLASLt bf16 GEMMs of these shapes; cuDNN's fused SDPA
# at head dim 64-128 (flash-attention-class kernels reach 40-60% forward,
# 30-45% backward on Hopper); memory-bound kernels against HBM; the
# CUDA-core fallback attention (fp32 FMAs, no tensor cores).
EFF = {"gemm": 0.72, "attn_fwd": 0.40, "attn_bwd": 0.30, "mem": 0.80, "cores_attn": 8e12}
# Nominal dense bf16 tensor-core peak (FLOP/s) and HBM bandwidth (B/s).
GPUS = {
    "H100 SXM": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
}
HOST_WAIT = 20e-6  # a host synchronisation with the queue drained, seconds


def classes(a):
    """(name, FLOPs, bytes, kind) per kernel class of one step."""
    N = a.batch * a.seq
    C, F, V, L = a.dim, a.ffn, a.vocab, a.layers
    HD = C // a.heads
    Q, KV = a.heads * HD, a.kv_heads * HD
    P_layer = C * (Q + 2 * KV) + Q * C + 3 * C * F + 2 * C
    P = L * P_layer + 2 * V * C + C  # untied embedding and head, final norm
    bf, f4 = 2, 4
    out = []

    def gemm(name, m, n, k, count=1):
        # forward, input gradient and weight gradient: 3 products
        fl = 3 * 2 * m * n * k * count * L
        by = 3 * (m * k + k * n + m * n) * bf * count * L
        out.append((name, fl, by, "gemm"))

    gemm("GEMM q/k/v", N, Q + 2 * KV, C)  # three calls, summed
    gemm("GEMM o", N, C, Q)
    gemm("GEMM gate/up", N, F, C, 2)
    gemm("GEMM down", N, C, F)
    out.append(("GEMM lm_head", 3 * 2 * N * C * V, 3 * (N * C + C * V + N * V) * bf, "gemm"))
    # causal: half the T^2 pairs; forward QK^T and PV, backward five products
    pair = a.batch * a.heads * a.seq * a.seq * HD
    out.append(("attention fwd", L * 2 * pair, L * (N * (2 * Q + 2 * KV) * bf + N * a.heads * f4),
                "attn_fwd"))
    out.append(("attention bwd", L * 5 * pair,
                L * (N * (3 * Q + 2 * KV) * bf + N * (Q + 2 * KV) * bf + N * a.heads * f4),
                "attn_bwd"))
    # element-wise, bytes per layer
    norm = 2 * (N * C * (f4 + bf)) + 2 * (N * C * (f4 * 3))  # 2 fwd, 2 bwd
    rope = N * (Q + KV) * bf * 2 + N * (Q + KV) * f4 * 2
    # the backward writes the gate and up projections' 16-bit input
    # gradients itself (swiglu_bwd16)
    swiglu = N * F * (3 * bf) + N * F * (f4 + 2 * bf + 2 * bf)
    resid = 2 * N * C * (f4 + bf + f4) + 2 * N * C * (3 * f4)
    # fp32 -> bf16 input gradients before the down, o and q/k/v GEMMs'
    # backward
    casts = N * (C + C + (Q + 2 * KV)) * (f4 + bf)
    # attention's extras: D = dO . O, and the 16-bit dq/dk/dv added into fp32
    attn_glue = N * Q * (f4 + bf) + N * (Q + 2 * KV) * (f4 + bf + f4)
    out.append(("RMSNorm fwd+bwd", 0, L * norm, "mem"))
    out.append(("RoPE fwd+bwd", 0, L * rope, "mem"))
    out.append(("SwiGLU fwd+bwd", 0, L * swiglu, "mem"))
    out.append(("residual adds", 0, L * resid, "mem"))
    out.append(("casts of gradients", 0, L * casts + N * V * (f4 + bf), "mem"))
    out.append(("attention glue", 0, L * attn_glue, "mem"))
    out.append(("embedding + cross-entropy", 0, N * V * f4 * 3 + N * C * (bf + f4) * 2, "mem"))
    # per parameter: AdamW reads p g m v and writes p m v (fp32) and the
    # bf16 shard in the same pass; the norm reads g; the reduction is a copy
    # on one rank (the unshard aliases the bf16 shard); gradients are zeroed
    out.append(("AdamW + bf16 shard", 0, P * (7 * f4 + bf), "mem"))
    out.append(("FSDP copy, zero, norm", 0, P * (2 * f4 + f4 + f4), "mem"))
    return out, P


def model_flops_per_token(a):
    """hs_model_flops_per_token: 6 x the parameters every token multiplies
    (all but the embedding) + 6 L T NH HD for the causal attention."""
    HD = a.dim // a.heads
    P_mm = a.layers * (a.dim * (a.heads * HD + 2 * a.kv_heads * HD) + a.heads * HD * a.dim
                       + 3 * a.dim * a.ffn + 2 * a.dim) + a.vocab * a.dim + a.dim
    return 6 * P_mm + 6 * a.layers * a.seq * a.heads * HD


def project(a, peak, bw, cores_attention=False):
    rows, P = classes(a)
    total, lines = 0.0, []
    for name, fl, by, kind in rows:
        bound = max(fl / peak, by / bw)
        if kind == "mem":
            t = by / (bw * EFF["mem"])
        elif cores_attention and kind.startswith("attn"):
            t = fl / EFF["cores_attn"]
        else:
            t = max(fl / (peak * EFF[kind]), by / (bw * EFF["mem"]))
        total += t
        lines.append((name, fl, by, bound, t))
    syncs = 2 + 2  # the loss, the norm (one sumsq_many), clipping, the step's end
    total += syncs * HOST_WAIT
    tokens = a.batch * a.seq
    mfu = model_flops_per_token(a) * tokens / total / peak
    return lines, total, tokens / total, mfu, P


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    print(f"step of {a.batch} x {a.seq} tokens, model FLOPs "
          f"{model_flops_per_token(a) * a.batch * a.seq / 1e12:.1f} TFLOP; efficiencies "
          f"assumed: GEMM {EFF['gemm']:.0%}, cuDNN attention {EFF['attn_fwd']:.0%} fwd / "
          f"{EFF['attn_bwd']:.0%} bwd of peak, memory-bound {EFF['mem']:.0%} of HBM\n")
    names = list(GPUS)
    res = {g: project(a, *GPUS[g]) for g in names}
    print("| class | TFLOP | GB moved | " + " | ".join(
        f"{g} bound ms | {g} expected ms" for g in names) + " |")
    print("|---|---:|---:|" + "---:|---:|" * len(names))
    for i, (name, fl, by, _, _) in enumerate(res[names[0]][0]):
        cells = " | ".join(f"{res[g][0][i][3] * 1e3:.1f} | {res[g][0][i][4] * 1e3:.1f}"
                           for g in names)
        print(f"| {name} | {fl / 1e12:.2f} | {by / 1e9:.1f} | {cells} |")
    print()
    print(f"parameters {res[names[0]][4] / 1e9:.3f} B")
    for g in names:
        _, t, tps, mfu, _ = res[g]
        _, tc, tpsc, mfuc, _ = project(a, *GPUS[g], cores_attention=True)
        print(f"{g}: step {t * 1e3:.0f} ms, {tps:,.0f} tokens/s, MFU {mfu:.1%} of "
              f"{GPUS[g][0] / 1e12:.0f} TFLOP/s; with attention on the CUDA cores "
              f"({EFF['cores_attn'] / 1e12:.0f} TFLOP/s): {tc * 1e3:.0f} ms, MFU {mfuc:.1%}")


if __name__ == "__main__":
    main()
