#!/usr/bin/env python3
"""Builds the committed DeepSeek-V3 references for tests/cli/test_deepseek_v3_hf.sh
with Hugging Face transformers (tests/reference/README.md):

  tests/data/deepseek_v3_hf/      a random DeepseekV3ForCausalLM as
                                  save_pretrained writes it (config.json,
                                  model.safetensors with each block's
                                  e_score_correction_bias): multi-head latent
                                  attention with q_lora_rank 24, kv_lora_rank
                                  16, qk_nope_head_dim 8, qk_rope_head_dim 8,
                                  v_head_dim 12 and DeepSeek's interleaved
                                  rope rows; layer 0 dense, layers 1 and 2 of
                                  8 routed experts of 24 in 4 groups (2 kept),
                                  top 2, a shared expert, routed_scaling_factor
                                  2.5
  tests/data/ref_deepseek_v3_hf.safetensors
                                  logits [4, 16, 256] of the four sequences of
                                  tests/data/parity_tokens.hstk, their mean
                                  token cross-entropy `ce` [1] and `grad.<name>`
                                  for every parameter (each expert's
                                  gate_proj / up_proj / down_proj split from
                                  transformers' fused tensors; the rope rows of
                                  q_b_proj and kv_a_proj_with_mqa in
                                  rotate_half's order, as hypershard holds them;
                                  the correction bias's zero: a buffer),
                                  and `generate` [32]: the tokens transformers'
                                  greedy generate (its cache) continues the
                                  bytes of "This bird" with
  tests/data/deepseek_v3_noq_hf/  the same shape without the query's
  tests/data/ref_deepseek_v3_noq_hf.safetensors
                                  compression (q_lora_rank null: q_proj), rope
                                  rows in rotate_half's order
                                  (rope_interleave false) and YaRN RoPE
                                  (factor 4 over 4 original positions,
                                  mscale_all_dim 1: the softmax scale times
                                  mscale^2)

Weights are normal(0, 0.1), every RMSNorm weight 1 + normal(0, 0.2), the
router normal(0, 0.5) and the correction bias normal(0, 0.05). Needs torch
and transformers >= 5; run from the repository root:

  /work/venv-ref/bin/python tests/reference/make_deepseek_v3_reference.py
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import save_file

from make_qwen3_moe_reference import grads, save_model
from make_qwen3_reference import SEQ, T, read_tokens


def build(seed, q_lora_rank, interleave, rope):
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=q_lora_rank,
        qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, rms_norm_eps=1e-6,
        rope_parameters=rope, rope_interleave=interleave, tie_word_embeddings=False,
        max_position_embeddings=64, initializer_range=0.1)
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                            dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    return model.eval()


def model_order(g, cfg, runs, first, step):
    """A rope-row gradient from the file's interleaved pairs to rotate_half's
    halves: file row 2j + b is model row j + b R / 2."""
    R = cfg.qk_rope_head_dim
    g = g.clone()
    for h in range(runs):
        rows = g[h * step + first:h * step + first + R].clone()
        idx = [i // 2 + (i % 2) * (R // 2) for i in range(R)]
        g[[h * step + first + j for j in idx]] = rows
    return g


PROMPT = b"This bird"


def reference(model, ids, name, args, meta):
    save_model(model, os.path.join(args.data, name))
    prompt = torch.tensor([list(PROMPT)])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=32, do_sample=False, use_cache=True)
    generated = out[0, len(PROMPT):].float()
    logits = model(input_ids=ids[:, :T]).logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
    ce.backward()
    ref = {"logits": logits.detach().contiguous(), "ce": ce.detach().reshape(1),
           "generate": generated.contiguous()}
    ref.update(grads(model))
    cfg = model.config
    step = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    for i, layer in enumerate(model.model.layers):
        pre = f"grad.model.layers.{i}."
        if cfg.rope_interleave:
            q = pre + ("self_attn.q_b_proj.weight" if cfg.q_lora_rank else "self_attn.q_proj.weight")
            ref[q] = model_order(ref[q], cfg, cfg.num_attention_heads, cfg.qk_nope_head_dim, step)
            kv = pre + "self_attn.kv_a_proj_with_mqa.weight"
            ref[kv] = model_order(ref[kv], cfg, 1, cfg.kv_lora_rank, step)
        if i >= cfg.first_k_dense_replace:
            ref[pre + "mlp.gate.e_score_correction_bias"] = torch.zeros(cfg.n_routed_experts)
    save_file({k: v.contiguous() for k, v in ref.items()},
              os.path.join(args.data, f"ref_{name}.safetensors"), metadata=meta)
    print(f"{name}: ce {ce.item():.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="tests/data")
    ap.add_argument("--seed", type=int, default=20261207)
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    ids = read_tokens(os.path.join(args.data, "parity_tokens.hstk")).view(SEQ, T + 1)
    plain = {"rope_type": "default", "rope_theta": 10000.0}
    reference(build(args.seed, 24, True, plain), ids, "deepseek_v3_hf", args, meta)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 4, "mscale": 1.0, "mscale_all_dim": 1.0,
            "beta_fast": 32.0, "beta_slow": 1.0}
    reference(build(args.seed + 1, None, False, yarn), ids, "deepseek_v3_noq_hf", args, meta)


if __name__ == "__main__":
    main()
