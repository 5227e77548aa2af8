"""The PyTorch peer of `hypershard train` on one NVIDIA GPU, for tests/gpu/run.sh.

Hugging Face LlamaForCausalLM (SDPA attention) on cuda with FSDP2: fully_shard
on every decoder layer, then on the root, over NCCL in a one-process group;
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32); fused AdamW
and clip_grad_norm_ as hypershard's defaults; random tokens. Writes one JSON
object: the median tokens/s of the timed steps (each timed between CUDA
synchronizes), the step times, and torch.cuda.max_memory_allocated.

This file runs only under a Python with torch and transformers and a GPU;
nothing in the build or the tests imports it.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("dim", 768), ("layers", 12), ("heads", 12), ("kv-heads", 12),
                          ("ffn", 2048), ("vocab", 50304), ("seq", 1024), ("batch", 8),
                          ("steps", 8), ("warmup", 4)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--json", required=True, help="write the result here")
    return p.parse_args()


def main():
    a = parse()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    times = []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    with open(a.json, "w") as f:
        json.dump({"tokens_per_s": a.batch * a.seq / med, "median_step_s": med, "step_s": times,
                   "peak_bytes": torch.cuda.max_memory_allocated(), "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(0)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
