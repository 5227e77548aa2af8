#!/usr/bin/env python3
"""Builds the committed Qwen3 reference for tests/cli/test_qwen3_hf.sh with
Hugging Face transformers (tests/reference/README.md):

  tests/data/qwen3_hf/            a random Qwen3ForCausalLM as save_pretrained
                                  writes it (config.json, model.safetensors)
  tests/data/ref_qwen3_hf.safetensors
                                  logits [4, 16, 256] of the four sequences of
                                  tests/data/parity_tokens.hstk and their mean
                                  token cross-entropy `loss` [1], and
                                  `grad.<name>`, the gradient of that loss
                                  for every parameter (Hugging Face names)

The model has the shape of tests/data/parity_qwen3.yaml: head_dim 16 on
hidden_size 32 with 4 query and 2 key/value heads, rope_theta 1e6,
rms_norm_eps 1e-6. Weights are normal(0, 0.1) and every RMSNorm weight
(input, post-attention, final, q_norm, k_norm) is 1 + normal(0, 0.2), so a
norm applied to the wrong axis or with the wrong weight shows.

Needs torch and transformers >= 4.51 (Qwen3); run from the repository root:

  /work/venv/bin/python tests/reference/make_qwen3_reference.py
"""
import argparse
import os
import struct

import torch
import transformers
from safetensors.torch import save_file

SEQ, T = 4, 16


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, count = struct.unpack("<4sIQ", raw[:16])
    assert magic == b"HSTK" and version == 1, path
    return torch.tensor(struct.unpack(f"<{count}H", raw[16:16 + 2 * count]), dtype=torch.long)


def build(seed):
    cfg = transformers.Qwen3Config(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, max_position_embeddings=64,
        initializer_range=0.1)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                       dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="tests/data")
    ap.add_argument("--seed", type=int, default=20260501)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build(args.seed)
    out = os.path.join(args.data, "qwen3_hf")
    model.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "generation_config.json"))  # not read by hypershard
    ids = read_tokens(os.path.join(args.data, "parity_tokens.hstk")).view(SEQ, T + 1)
    logits = model(input_ids=ids[:, :T]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    ref = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    ref.update({"grad." + n: p.grad.contiguous() for n, p in model.named_parameters()})
    save_file(ref,
              os.path.join(args.data, "ref_qwen3_hf.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"loss {loss.item():.6f}, max |logit| {logits.abs().max().item():.4f}")


if __name__ == "__main__":
    main()
