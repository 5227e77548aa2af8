"""The PyTorch peer of `hypershard train` for bench/peer/compare.py.

Hugging Face LlamaForCausalLM with FSDP2: fully_shard on every decoder layer,
then on the root, over gloo; AdamW and clip_grad_norm_ as hypershard's
defaults; random tokens; launched by torchrun, one process per rank. With
--dtype bf16 the MixedPrecisionPolicy is param_dtype bfloat16, reduce_dtype
float32. Rank 0 prints one JSON line: the step times (the slowest rank's,
after the warm-up steps) and the largest peak RSS of any rank. With
--profile FILE the timed steps run under torch.profiler and rank 0 writes
their time per step by the op classes of `hypershard bench step
--breakdown` (profile_classes) to FILE.

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
    p.add_argument("--profile", help="write the timed steps' op classes (JSON) here")
    return p.parse_args()


# Modules whose forward and backward are one class: a record_function
# range "hs::<class>" opened and closed by their hooks.
MODULE_CLASSES = {"q_proj": "gemm qkv", "k_proj": "gemm qkv", "v_proj": "gemm qkv",
                  "o_proj": "gemm o", "gate_proj": "gemm gate/up", "up_proj": "gemm gate/up",
                  "down_proj": "gemm down", "lm_head": "gemm head", "act_fn": "swiglu",
                  "input_layernorm": "norms", "post_attention_layernorm": "norms",
                  "norm": "norms", "embed_tokens": "embedding", "rotary_emb": "rope"}
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def label_modules(model):
    def enter(m, *args):
        m._hs_ranges.append(torch.autograd.profiler.record_function(m._hs_tag))
        m._hs_ranges[-1].__enter__()

    def leave(m, *args):
        if m._hs_ranges:
            m._hs_ranges.pop().__exit__(None, None, None)

    for name, mod in model.named_modules():
        cls = MODULE_CLASSES.get(name.rsplit(".", 1)[-1])
        if cls is None:
            continue
        mod._hs_tag, mod._hs_ranges = "hs::" + cls, []
        mod.register_forward_pre_hook(enter)
        mod.register_forward_hook(leave)
        if cls.startswith("gemm"):
            mod.register_full_backward_pre_hook(enter)
            mod.register_full_backward_hook(leave)


def event_class(ev):
    """The class of one profiler event's self time: its enclosing hs:: range
    (a GEMM op in a linear's range is that linear's GEMM; anything else in
    it is other), else by the op's name."""
    name = ev.name
    label, p = None, ev.cpu_parent
    while p is not None:
        if p.name.startswith("hs::"):
            label = p.name[4:]
            break
        if "attention" in p.name.lower():
            return "attention"
        if p.name.startswith("FSDP::") and "wait" not in name.lower():
            return "copies"
        p = p.cpu_parent
    low = name.lower()
    if label:
        if label.startswith("gemm"):
            return label if name in GEMM_OPS else "other"
        return label
    if "attention" in low:
        return "attention"
    if "wait" in low or "all_reduce" in low or "gloo" in low:
        return "comm waits"
    if "softmax" in low or "nll_loss" in low or "cross_entropy" in low:
        return "cross-entropy"
    if name in GEMM_OPS:
        return "gemm other"
    if name in ("aten::to", "aten::_to_copy"):
        return "casts"
    if name.startswith("FSDP::"):
        return "copies"
    return "other"


def profile_classes(prof, steps):
    """ms per step by class (self CPU time of the main thread's events)."""
    out = {}
    for ev in prof.events():
        if ev.name.startswith("hs::") or ev.name.startswith("ProfilerStep"):
            continue
        if ev.name == "hs_optimizer" or (ev.cpu_parent is None and ev.name == "optimizer"):
            continue
        cls = "optimizer" if any(p.name == "optimizer_step" for p in parents(ev)) else \
            event_class(ev)
        out[cls] = out.get(cls, 0.0) + ev.self_cpu_time_total / 1e3 / steps
    return out


def parents(ev):
    p = ev.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


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
    prof = None
    if a.profile:
        label_modules(model)
    for step in range(a.warmup + a.steps):
        if a.profile and step == a.warmup:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        with torch.autograd.profiler.record_function("optimizer_step"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if step >= a.warmup:
            times.append(dt.item())
    if prof is not None:
        prof.__exit__(None, None, None)
        if rank == 0:
            with open(a.profile, "w") as f:
                json.dump({"classes": profile_classes(prof, a.steps),
                           "step_ms": 1e3 * statistics.mean(times)}, f)
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
