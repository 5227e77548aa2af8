#!/usr/bin/env python3
"""plan --time against published training runs.

Each run below is described as the publication states it (model, layout,
batch, sequence, GPU count) on one cluster file per GPU kind
(configs/clusters/), with no per-run tuning. Where the paper states a
layout detail it does not, the assumption is written beside it. The
publication's own figure of merit is recomputed from the predicted step
time: Megatron-LM and MT-NLG count hardware FLOPs (their formula
96 B s l h^2 (1 + s / 6h + V / 16 l h), full recompute included, attention
not halved for causality) against 312 TFLOP/s; Llama 3 counts model FLOPs
(6 N + attention) against 989 TFLOP/s (the trainer's MFU, hypershard's
`mfu`).

usage: bench/published.py --bin build/hypershard [--markdown]"""
import argparse, json, subprocess, sys, time

A100 = "configs/clusters/a100-sxm-hdr.yaml"
H100 = "configs/clusters/h100-sxm-ndr.yaml"


def gpt(h, heads, layers, tp, pp, gpus, batch, mb, tflops, pct):
    """A Megatron GPT of the 2021 weak-scaling table: vocabulary 51200,
    sequence 2048, an MLP of 4h (here SwiGLU of 8h/3: the same GEMM FLOPs),
    untied embeddings (pipeline stages cannot share one), fp16-class mixed precision, full recompute, data
    parallel by all-reduce (shard 1) once a step (requires_grad_sync false,
    as Megatron's DDP reduces after the last micro-batch), 1F1B (assumed:
    the table does not say which schedule)."""
    ffn = 8 * h // 3 // (64 * tp) * (64 * tp)
    return dict(world=gpus, cluster=A100, metric="hfu", published=pct, tflops=tflops,
                h=h, layers=layers, seq=2048, vocab=51200, batch=batch,
                over=[f"model.dim={h}", f"model.n_layers={layers}", f"model.n_heads={heads}",
                      f"model.n_kv_heads={heads}", f"model.ffn_dim={ffn}", "model.vocab_size=51200",
                      "model.tie_embeddings=false", "train.seq_len=2048",
                      f"train.micro_batch_size={mb}", f"train.global_batch_size={batch}",
                      "train.activation_checkpointing=true", f"accelerator.tp_size={tp}",
                      f"accelerator.pp_size={pp}", "accelerator.pp_schedule=1f1b",
                      "fsdp_config.dp_shard_size=1", "fsdp_config.requires_grad_sync=false"])


def llama405(gpus, cp, pp, dp, seq, per_dp, pct, tflops):
    """Llama 3 405B (Llama 3 paper, Table 4): 126 layers, 16384 wide, FFN
    53248, 128 heads, 8 kv heads, vocabulary 128256; tp 8 with sequence
    parallelism (assumed: the paper names tensor parallelism only); FSDP over dp
    without resharding between micro-batches (after forward or backward;
    the paper: not after forward), gradients reduced once a step
    (assumed); interleaved 1F1B, micro-batch 1; all-gather CP at 131072;
    no recompute. Virtual stages: the paper balances its pipeline by taking
    one layer from the first and the last stage, so that the first model
    chunk holds only the embedding and the last only the output projection
    and loss: a chunk is one layer slot, 128 slots over 16 stages, 8
    chunks a stage. Those two chunks are counted here as one block each
    (128 blocks: about 1.6% more FLOPs, in the MFU's numerator and the
    step alike)."""
    return dict(world=gpus, cluster=H100, metric="mfu", published=pct, tflops=tflops,
                over=["model.dim=16384", "model.n_layers=128", "model.n_heads=128",
                      "model.n_kv_heads=8", "model.ffn_dim=53248", "model.vocab_size=128256",
                      f"train.seq_len={seq}", "train.micro_batch_size=1",
                      f"train.global_batch_size={per_dp * dp}", "accelerator.tp_size=8",
                      "accelerator.sequence_parallel=true",
                      f"accelerator.cp_size={cp}", "accelerator.cp_rotate_method=allgather",
                      f"accelerator.pp_size={pp}", "accelerator.pp_schedule=interleaved_1f1b",
                      "accelerator.pp_virtual_stages=8", f"fsdp_config.dp_shard_size={dp * cp}",
                      "fsdp_config.reshard_after_forward=false",
                      "fsdp_config.reshard_after_backward=false",
                      "fsdp_config.requires_grad_sync=false"])


RUNS = [
    ("Megatron-LM 1.7B, 32 A100", gpt(2304, 24, 24, 1, 1, 32, 512, 4, 137, 0.44)),
    ("Megatron-LM 3.6B, 64 A100", gpt(3072, 32, 30, 2, 1, 64, 512, 4, 138, 0.44)),
    ("Megatron-LM 7.5B, 128 A100", gpt(4096, 32, 36, 4, 1, 128, 512, 4, 142, 0.46)),
    ("Megatron-LM 18.4B, 256 A100", gpt(6144, 48, 40, 8, 1, 256, 1024, 4, 135, 0.43)),
    ("Megatron-LM 39.1B, 512 A100", gpt(8192, 64, 48, 8, 2, 512, 1536, 2, 138, 0.44)),
    ("Megatron-LM 76.1B, 1024 A100", gpt(10240, 80, 60, 8, 4, 1024, 1792, 2, 140, 0.45)),
    ("Megatron-LM 145.6B, 1536 A100", gpt(12288, 96, 80, 8, 8, 1536, 2304, 2, 148, 0.47)),
    ("Megatron-LM 310.1B, 1920 A100", gpt(16384, 128, 96, 8, 16, 1920, 2160, 1, 155, 0.50)),
    ("Megatron-LM 529.6B, 2520 A100", gpt(20480, 128, 105, 8, 35, 2520, 2520, 1, 163, 0.52)),
    ("Megatron-LM 1008B, 3072 A100", gpt(25600, 160, 128, 8, 64, 3072, 3072, 1, 163, 0.52)),
    # MT-NLG 530B (Smith et al. 2022, Table 1): 105 layers, 20480 wide, 128
    # heads, tp 8, pp 35, batch 1920, micro-batch 1; 280 / 350 / 420 DGX A100
    # nodes reached 126 / 121 / 113 TFLOP/s a GPU.
    ("MT-NLG 530B, 2240 A100", gpt(20480, 128, 105, 8, 35, 2240, 1920, 1, 126, 126 / 312)),
    ("MT-NLG 530B, 2800 A100", gpt(20480, 128, 105, 8, 35, 2800, 1920, 1, 121, 121 / 312)),
    ("MT-NLG 530B, 3360 A100", gpt(20480, 128, 105, 8, 35, 3360, 1920, 1, 113, 113 / 312)),
    ("Llama 3 405B, 8192 H100", llama405(8192, 1, 16, 64, 8192, 32, 0.43, 430)),
    ("Llama 3 405B, 16384 H100", llama405(16384, 1, 16, 128, 8192, 16, 0.41, 400)),
    ("Llama 3 405B, 16384 H100, CP 16", llama405(16384, 16, 16, 8, 131072, 16, 0.38, 380)),
]


def megatron_flops(r):
    B, s, l, h, V = r["batch"], r["seq"], r["layers"], r["h"], r["vocab"]
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    errs = []
    if args.markdown:
        print("| run | GPUs | published | predicted | error | step s | bubble | fits 80 GB | answered in |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in RUNS:
        cmd = [args.bin, "plan", "--time", "--json", "--cluster", r["cluster"], "--world",
               str(r["world"]), "accelerator.device=cuda",
               "fsdp_config.mix_precision.param_dtype=bfloat16", *r["over"]]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        took = time.time() - t0
        if p.returncode:
            sys.exit(f"published: {name}: {' '.join(cmd)}\n{p.stderr}")
        t = json.loads(p.stdout)
        if r["metric"] == "hfu":
            pred = megatron_flops(r) / (t["step_time_s"] * r["world"] * 312e12)
        else:
            pred = t["mfu"]
        err = pred / r["published"] - 1
        errs.append(abs(err))
        if args.markdown:
            print(f"| {name} | {r['world']} | {100 * r['published']:.0f}% | {100 * pred:.1f}% | "
                  f"{100 * err:+.0f}% | {t['step_time_s']:.2f} | {100 * t['bubble']:.0f}% | "
                  f"{'yes' if t['fits'] else 'no'} | {took:.2f} s |")
        else:
            print(f"{name:34s} published {100 * r['published']:4.0f}%  predicted {100 * pred:5.1f}%"
                  f"  {100 * err:+5.0f}%  step {t['step_time_s']:7.2f} s  bubble "
                  f"{100 * t['bubble']:3.0f}%  fits {t['fits']}  ({took:.2f} s)", flush=True)
    print(f"{len(errs)} runs: within 20% relative: {sum(e <= 0.2 for e in errs)}; "
          f"worst {100 * max(errs):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
