"""Plain-PyTorch Llama and Mixtral with Hugging Face semantics.

The reference that hypershard's hand-written forward and backward are checked
against. Written from the Hugging Face modeling semantics (LlamaForCausalLM,
MixtralForCausalLM) with autograd doing the backward, so that nothing of
hypershard's own code is involved. Parameters are a flat dict keyed by the
Hugging Face FQNs, as in model.safetensors.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return w * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(T, head_dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def attention(x, p, pre, cfg, cos, sin):
    B, T, C = x.shape
    nh, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = C // nh
    q = F.linear(x, p[pre + "q_proj.weight"]).view(B, T, nh, hd).transpose(1, 2)
    k = F.linear(x, p[pre + "k_proj.weight"]).view(B, T, kvh, hd).transpose(1, 2)
    v = F.linear(x, p[pre + "v_proj.weight"]).view(B, T, kvh, hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = nh // kvh
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.full((T, T), float("-inf")).triu(1)
    probs = torch.softmax(scores.float() + mask, dim=-1).to(q.dtype)
    out = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return F.linear(out, p[pre + "o_proj.weight"])


def swiglu(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def sparse_moe(x, p, pre, cfg, router_logits_out):
    """MixtralSparseMoeBlock: softmax router in fp32, top-k, renormalised."""
    B, T, C = x.shape
    h = x.view(-1, C)
    E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    logits = F.linear(h, p[pre + "gate.weight"])
    router_logits_out.append(logits)
    weights = torch.softmax(logits, dim=1, dtype=torch.float)
    weights, selected = torch.topk(weights, K, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(h.dtype)
    out = torch.zeros_like(h)
    for e in range(E):
        ep = pre + f"experts.{e}."
        tok, slot = torch.where(selected == e)
        if tok.numel() == 0:
            continue
        y = swiglu(h[tok], p[ep + "w1.weight"], p[ep + "w3.weight"], p[ep + "w2.weight"])
        out = out.index_add(0, tok, y * weights[tok, slot, None])
    if cfg.get("shared_expert_intermediate_size", 0):
        sp = pre + "shared_expert."
        out = out + swiglu(h, p[sp + "gate_proj.weight"], p[sp + "up_proj.weight"],
                           p[sp + "down_proj.weight"])
    return out.view(B, T, C)


def load_balancing_loss(router_logits, num_experts, top_k):
    """Hugging Face load_balancing_loss_func without an attention mask: all
    layers' router logits are concatenated and the loss computed once."""
    logits = torch.cat(router_logits, dim=0)
    weights = torch.softmax(logits, dim=-1)
    _, selected = torch.topk(weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_experts)
    tokens_per_expert = expert_mask.float().mean(dim=0)
    router_prob_per_expert = weights.mean(dim=0)
    return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * num_experts


def forward(p, cfg, tokens, targets):
    """Returns (ce, aux, logits): the mean token cross-entropy, the MoE term
    router_aux_loss_coef x load-balancing loss (0 for dense; Mixtral's loss
    is ce + aux) and the fp32 logits [B, T, V]."""
    B, T = tokens.shape
    C = cfg["hidden_size"]
    dtype = p["model.embed_tokens.weight"].dtype
    cos, sin = rope_cos_sin(T, C // cfg["num_attention_heads"], cfg["rope_theta"], dtype)
    eps = cfg["rms_norm_eps"]
    x = F.embedding(tokens, p["model.embed_tokens.weight"])
    moe = cfg.get("model_type") == "mixtral"
    router_logits = []
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        x = x + attention(h, p, pre + "self_attn.", cfg, cos, sin)
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if moe:
            x = x + sparse_moe(h, p, pre + "block_sparse_moe.", cfg, router_logits)
        else:
            m = pre + "mlp."
            x = x + swiglu(h, p[m + "gate_proj.weight"], p[m + "up_proj.weight"],
                           p[m + "down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    logits = F.linear(x, head).float()
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    aux = torch.zeros((), dtype=torch.float32)
    if moe:
        aux = cfg["router_aux_loss_coef"] * load_balancing_loss(
            router_logits, cfg["num_local_experts"], cfg["num_experts_per_tok"])
    return ce, aux, logits
