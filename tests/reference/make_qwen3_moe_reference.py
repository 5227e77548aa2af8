#!/usr/bin/env python3
"""Builds the committed Qwen3-MoE reference for tests/cli/test_qwen3_moe_hf.sh
with Hugging Face transformers (tests/reference/README.md):

  tests/data/qwen3_moe_hf/        a random Qwen3MoeForCausalLM as
                                  save_pretrained writes it (config.json,
                                  model.safetensors), norm_topk_prob false
  tests/data/ref_qwen3_moe_hf.safetensors
                                  logits [4, 16, 256] of the four sequences of
                                  tests/data/parity_tokens.hstk, their mean
                                  token cross-entropy `ce` [1], the aux term
                                  `aux` [1] (router_aux_loss_coef x
                                  load_balancing_loss_func), and `grad.<name>`,
                                  the gradient of ce + aux for every parameter
                                  under the checkpoint's names (each expert's
                                  gate_proj / up_proj / down_proj, split from
                                  transformers' fused gate_up_proj and
                                  down_proj)
  tests/data/ref_qwen3_moe_hf_norm.safetensors
                                  `logits`, `ce` and `aux` of the same weights
                                  with norm_topk_prob true
  tests/data/qwen3_moe_dense_hf/  with --dense (only these two): the same
  tests/data/ref_qwen3_moe_dense_hf.safetensors
                                  shape with layer 0 a dense MLP of
                                  intermediate_size 48 (mlp_only_layers [0]),
                                  and its logits, losses and gradients
  tests/data/qwen3_moe_router_hf/ with --router (only these two): the same
  tests/data/ref_qwen3_moe_router_hf.safetensors
                                  model with each block's router replaced by
                                  transformers' DeepseekV3TopkRouter (sigmoid
                                  scores, 4 groups of 2 experts of which 2
                                  are kept, norm_topk_prob true,
                                  routed_scaling_factor 2.5) holding the same
                                  gate weight and a random
                                  e_score_correction_bias (written into
                                  model.safetensors beside the weights); its
                                  logits, cross-entropy (no aux loss) and
                                  gradients (the bias's zero: a buffer)

The model has the shape of tests/data/parity_qwen3_moe.yaml: Qwen3's
attention (head_dim 16 on hidden_size 32, 4 query and 2 key/value heads,
q_norm / k_norm) and 8 experts of moe_intermediate_size 24 in both layers,
top 2 per token, router_aux_loss_coef 0.01. Weights are normal(0, 0.1) and
every RMSNorm weight is 1 + normal(0, 0.2); the router is normal(0, 0.5) so
the routing is far from uniform.

Needs torch and transformers >= 5 (fused experts); run from the repository
root:

  /work/venv-ref/bin/python tests/reference/make_qwen3_moe_reference.py
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from make_qwen3_reference import SEQ, T, read_tokens


def build(seed, norm_topk_prob, mlp_only_layers=()):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
        decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), router_aux_loss_coef=0.01,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=64, initializer_range=0.1)
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="eager",
                                                          dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def run(model, ids):
    out = model(input_ids=ids[:, :T], output_router_logits=True)
    logits = out.logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
    aux = model.config.router_aux_loss_coef * out.aux_loss
    return logits, ce, aux


def grads(model):
    """Every gradient under hypershard's names: the fused experts split."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.contiguous()
        if n.endswith("mlp.experts.gate_up_proj"):
            pre, half = n[:-len("gate_up_proj")], g.shape[1] // 2
            for j in range(g.shape[0]):
                out[f"grad.{pre}{j}.gate_proj.weight"] = g[j, :half].contiguous()
                out[f"grad.{pre}{j}.up_proj.weight"] = g[j, half:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            pre = n[:-len("down_proj")]
            for j in range(g.shape[0]):
                out[f"grad.{pre}{j}.down_proj.weight"] = g[j].contiguous()
        else:
            out["grad." + n] = g
    return out


def reference(model, ids, path, meta):
    """The logits, losses and every gradient of one forward and backward."""
    logits, ce, aux = run(model, ids)
    (ce + aux).backward()
    ref = {"logits": logits.detach().contiguous(), "ce": ce.detach().reshape(1),
           "aux": aux.detach().reshape(1)}
    ref.update(grads(model))
    save_file(ref, path, metadata=meta)
    return ce, aux


def save_model(model, out):
    model.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "generation_config.json"))  # not read by hypershard


def dense(args, ids, meta):
    """--dense: layer 0 a dense MLP (mlp_only_layers [0]), layer 1 experts."""
    model = build(args.seed, False, [0])
    save_model(model, os.path.join(args.data, "qwen3_moe_dense_hf"))
    ce, aux = reference(model, ids, os.path.join(args.data, "ref_qwen3_moe_dense_hf.safetensors"),
                        meta)
    print(f"mlp_only_layers [0]: ce {ce.item():.6f}, aux {aux.item():.6f}")


def router(args, ids, meta):
    """--router: DeepSeek-V3's router in each block of the Qwen3-MoE model.
    Qwen3MoeSparseMoeBlock calls its gate as DeepseekV3MoE does (router
    logits, weights, chosen experts) and applies the experts the same way,
    so only the routing is DeepSeek-V3's."""
    model = build(args.seed, True)
    ds = transformers.DeepseekV3Config(
        hidden_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5)
    torch.manual_seed(args.seed + 1)
    for layer in model.model.layers:
        gate = DeepseekV3TopkRouter(ds)
        with torch.no_grad():
            gate.weight.copy_(layer.mlp.gate.weight)
            gate.e_score_correction_bias.copy_(0.05 * torch.randn(8))
        layer.mlp.gate = gate
    out = os.path.join(args.data, "qwen3_moe_router_hf")
    save_model(model, out)
    path = os.path.join(out, "model.safetensors")
    weights = load_file(path)
    for i, layer in enumerate(model.model.layers):
        weights[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = \
            layer.mlp.gate.e_score_correction_bias.clone()
    save_file(weights, path, metadata={"format": "pt"})
    logits = model(input_ids=ids[:, :T]).logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
    ce.backward()
    ref = {"logits": logits.detach().contiguous(), "ce": ce.detach().reshape(1)}
    ref.update(grads(model))
    for i in range(len(model.model.layers)):
        ref[f"grad.model.layers.{i}.mlp.gate.e_score_correction_bias"] = torch.zeros(8)
    save_file(ref, os.path.join(args.data, "ref_qwen3_moe_router_hf.safetensors"), metadata=meta)
    print(f"DeepSeek-V3 router: ce {ce.item():.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="tests/data")
    ap.add_argument("--seed", type=int, default=20260502)
    ap.add_argument("--dense", action="store_true",
                    help="write only the mixed dense / MoE model and its reference")
    ap.add_argument("--router", action="store_true",
                    help="write only the model with DeepSeek-V3's router and its reference")
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    ids = read_tokens(os.path.join(args.data, "parity_tokens.hstk")).view(SEQ, T + 1)
    if args.dense:
        return dense(args, ids, meta)
    if args.router:
        return router(args, ids, meta)
    model = build(args.seed, False)
    save_model(model, os.path.join(args.data, "qwen3_moe_hf"))
    ce, aux = reference(model, ids, os.path.join(args.data, "ref_qwen3_moe_hf.safetensors"), meta)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"ce {ce.item():.6f}, aux {aux.item():.6f}")
    normed = build(args.seed, True)
    logits, ce, aux = run(normed, ids)
    ref = {"logits": logits.detach().contiguous(), "ce": ce.detach().reshape(1),
           "aux": aux.detach().reshape(1)}
    save_file(ref, os.path.join(args.data, "ref_qwen3_moe_hf_norm.safetensors"), metadata=meta)
    print(f"norm_topk_prob true: ce {ce.item():.6f}, aux {aux.item():.6f}")


if __name__ == "__main__":
    main()
