"""The PyTorch peer of `hypershard train` for bench/peer/compare.py.

Hugging Face LlamaForCausalLM with FSDP2: fully_shard on every decoder layer,
then on the root, over gloo; AdamW and clip_grad_norm_ as hypershard's
defaults; random tokens; launched by torchrun, one process per rank. With
--dtype bf16 the MixedPrecisionPolicy is param_dtype bfloat16, reduce_dtype
float32. Rank 0 prints one JSON line: the step times (the slowest rank's,
after the warm-up steps) and the largest peak RSS of any rank.

This file runs only under a Python that has torch and transformers (see
docs/performance.md, "PyTorch peer"); nothing in the build or the tests
imports it.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("dim", 512), ("layers", 8), ("heads", 8), ("kv-heads", 4),
                          ("ffn", 1408), ("vocab", 4096), ("seq", 256), ("batch", 4),
                          ("steps", 5), ("warmup", 2), ("threads", 1)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    return p.parse_args()


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if a.dtype == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if step >= a.warmup:
            times.append(dt.item())
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"median_step_s": statistics.median(times), "step_s": times,
                          "max_rss_kib": int(rss.item()), "torch": torch.__version__}))
    dist.barrier()  # the result is out on every rank before any exits
    sys.stdout.flush()
    # Leave without running C++ destructors: torch 2.15's gloo threads can
    # abort a rank at interpreter exit ("terminate called without an active
    # exception") after the measurement is complete.
    os._exit(0)


if __name__ == "__main__":
    main()
