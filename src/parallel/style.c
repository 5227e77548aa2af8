/* The style table: FQN suffix -> style, and a parameter's placement from
 * it (parallel.h). The first matching rule wins. */
#include <string.h>

#include "parallel/par_internal.h"

static const char *const style_names[] = {"colwise", "rowwise",   "vocab",
                                          "norm",    "replicate", "expert"};
_Static_assert(sizeof style_names / sizeof style_names[0] == HS_STYLE_COUNT,
               "style names follow the enum");

const char *hs_style_name(hs_style s) {
    return (unsigned)s < HS_STYLE_COUNT ? style_names[s] : "?";
}

hs_placement hs_style_placement(hs_style s) {
    switch (s) {
    case HS_STYLE_COLWISE:
    case HS_STYLE_VOCAB: return (hs_placement){HS_PLACEMENT_SHARD, 0};
    case HS_STYLE_ROWWISE: return (hs_placement){HS_PLACEMENT_SHARD, 1};
    default: return (hs_placement){HS_PLACEMENT_REPLICATE, 0};
    }
}

/* Megatron / torchtitan's Llama plan; the MoE layer stays replicated over
 * TP (its router and shared expert whole on every TP rank) and its routed
 * experts are split over EP. */
static const hs_style_rule default_plan[] = {
    {"model.embed_tokens.weight", HS_STYLE_VOCAB},
    {"lm_head.weight", HS_STYLE_VOCAB},
    {"self_attn.q_proj.weight", HS_STYLE_COLWISE},
    {"self_attn.k_proj.weight", HS_STYLE_COLWISE},
    {"self_attn.v_proj.weight", HS_STYLE_COLWISE},
    {"self_attn.o_proj.weight", HS_STYLE_ROWWISE},
    /* qwen3's per-head norms: one [head_dim] weight that every rank applies
     * to the heads it holds; its gradient sums over the ranks' heads
     * (hs_param.per_head), all-reduced over TP with the other replicas */
    {"self_attn.q_norm.weight", HS_STYLE_REPLICATE},
    {"self_attn.k_norm.weight", HS_STYLE_REPLICATE},
    /* DeepSeek-V3's latent attention: the heads split on the
     * up-projections, the down-projections and latent norms whole */
    {"self_attn.q_a_proj.weight", HS_STYLE_REPLICATE},
    {"self_attn.q_a_layernorm.weight", HS_STYLE_REPLICATE},
    {"self_attn.q_b_proj.weight", HS_STYLE_COLWISE},
    {"self_attn.kv_a_proj_with_mqa.weight", HS_STYLE_REPLICATE},
    {"self_attn.kv_a_layernorm.weight", HS_STYLE_REPLICATE},
    {"self_attn.kv_b_proj.weight", HS_STYLE_COLWISE},
    /* and its shared experts, dense beside the routed ones */
    {"mlp.shared_experts.gate_proj.weight", HS_STYLE_REPLICATE},
    {"mlp.shared_experts.up_proj.weight", HS_STYLE_REPLICATE},
    {"mlp.shared_experts.down_proj.weight", HS_STYLE_REPLICATE},
    {"mlp.gate_proj.weight", HS_STYLE_COLWISE},
    {"mlp.up_proj.weight", HS_STYLE_COLWISE},
    {"mlp.down_proj.weight", HS_STYLE_ROWWISE},
    {"input_layernorm.weight", HS_STYLE_NORM},
    {"post_attention_layernorm.weight", HS_STYLE_NORM},
    {"model.norm.weight", HS_STYLE_NORM},
    {"block_sparse_moe.gate.weight", HS_STYLE_REPLICATE},
    /* DeepSeek-V3's correction bias: no gradient, the same on every rank */
    {"block_sparse_moe.gate.e_score_correction_bias", HS_STYLE_REPLICATE},
    {"block_sparse_moe.experts.w1.weight", HS_STYLE_EXPERT},
    {"block_sparse_moe.experts.w2.weight", HS_STYLE_EXPERT},
    {"block_sparse_moe.experts.w3.weight", HS_STYLE_EXPERT},
    {"block_sparse_moe.shared_expert.gate_proj.weight", HS_STYLE_REPLICATE},
    {"block_sparse_moe.shared_expert.up_proj.weight", HS_STYLE_REPLICATE},
    {"block_sparse_moe.shared_expert.down_proj.weight", HS_STYLE_REPLICATE},
    /* Qwen3-MoE's names of the same layer (no shared expert) */
    {"mlp.gate.weight", HS_STYLE_REPLICATE},
    {"mlp.gate.e_score_correction_bias", HS_STYLE_REPLICATE},
    {"mlp.experts.gate_proj.weight", HS_STYLE_EXPERT},
    {"mlp.experts.down_proj.weight", HS_STYLE_EXPERT},
    {"mlp.experts.up_proj.weight", HS_STYLE_EXPERT},
};

const hs_style_rule *hs_style_default_plan(int *n) {
    *n = (int)(sizeof default_plan / sizeof default_plan[0]);
    return default_plan;
}

static bool suffix_matches(const char *fqn, const char *suffix) {
    size_t a = strlen(fqn), b = strlen(suffix);
    if (b > a || strcmp(fqn + a - b, suffix) != 0) return false;
    return a == b || fqn[a - b - 1] == '.';
}

static const hs_style_rule *rule_for(const char *fqn, const hs_style_rule *rules, int n) {
    for (int i = 0; i < n; i++)
        if (suffix_matches(fqn, rules[i].suffix)) return &rules[i];
    return NULL;
}

/* A tied lm_head is the embedding tensor itself: both names must get one
 * placement. */
hs_status hs_style_check_tied(const hs_style_rule *rules, int n, bool tied, hs_error *e) {
    hs_error_clear(e);
    if (!tied) return HS_OK;
    const hs_style_rule *a = rule_for("model.embed_tokens.weight", rules, n);
    const hs_style_rule *b = rule_for("lm_head.weight", rules, n);
    if (!a || !b) return HS_OK; /* an unmatched name is reported on its own */
    hs_placement pa = hs_style_placement(a->style), pb = hs_style_placement(b->style);
    if (pa.kind == pb.kind && pa.dim == pb.dim) return HS_OK;
    return hs_error_set(e, HS_ERR_CONFIG,
                        "model.embed_tokens.weight and lm_head.weight are one tied tensor "
                        "(model.tie_embeddings: true) but the plan gives them %s and %s; give "
                        "both the same style or set model.tie_embeddings: false",
                        hs_style_name(a->style), hs_style_name(b->style));
}

static bool place_expert(const hs_parallel *p, hs_param *q, hs_error *e) {
    if (!hs_param_place_ep(q, p->l.ep, p->l.ep_rank)) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "%s: expert (Shard(0) on ep) over ep_size=%d does not divide its %lld "
                     "experts; choose an accelerator.ep_size that divides "
                     "model.moe.num_experts",
                     q->fqn, p->l.ep, (long long)q->shape[0]);
        return false;
    }
    return true;
}

bool hs_style_place(const hs_parallel *p, hs_param *q, hs_error *e) {
    const hs_style_rule *r = rule_for(q->fqn, p->rules, p->n_rules);
    if (!r) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "%s: no rule of the parallel plan matches this parameter; every "
                     "parameter needs a style (add a rule for its FQN suffix)",
                     q->fqn);
        return false;
    }
    if (r->style == HS_STYLE_EXPERT && p->l.ep > 1) return place_expert(p, q, e);
    if (p->l.tp < 2) return true; /* whole, off the tp mesh */
    hs_placement pl = hs_style_placement(r->style);
    if (!hs_param_place_tp(q, pl, p->l.tp, p->l.tp_rank)) {
        char buf[32];
        hs_error_set(e, HS_ERR_CONFIG,
                     "%s: %s (%s) splits dim %d of size %lld over tp_size=%d, which does "
                     "not divide it; choose an accelerator.tp_size that divides it",
                     q->fqn, hs_style_name(r->style), hs_placement_str(pl, buf, sizeof buf), pl.dim,
                     (long long)(pl.dim < q->ndim ? q->shape[pl.dim] : 0), p->l.tp);
        return false;
    }
    q->tp_grad_partial = (p->l.sequence_parallel || q->per_head) &&
                         pl.kind == HS_PLACEMENT_REPLICATE;
    return true;
}
