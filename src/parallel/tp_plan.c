/* The TP plan: FQN suffix -> style for the Llama and MoE models, and its
 * application to a model's parameters (placements and local shapes). */
#include <stdlib.h>
#include <string.h>

#include "parallel/tp_internal.h"

static const char *const style_names[] = {"colwise", "rowwise", "vocab", "replicate"};
_Static_assert(sizeof style_names / sizeof style_names[0] == HS_TP_STYLE_COUNT,
               "style names follow the enum");

const char *hs_tp_style_name(hs_tp_style s) {
    return (unsigned)s < HS_TP_STYLE_COUNT ? style_names[s] : "?";
}

hs_placement hs_tp_style_placement(hs_tp_style s) {
    switch (s) {
    case HS_TP_COLWISE:
    case HS_TP_VOCAB: return (hs_placement){HS_PLACEMENT_SHARD, 0};
    case HS_TP_ROWWISE: return (hs_placement){HS_PLACEMENT_SHARD, 1};
    default: return (hs_placement){HS_PLACEMENT_REPLICATE, 0};
    }
}

/* Megatron / torchtitan's Llama plan; the MoE layer stays replicated over
 * TP (its experts are whole on every TP rank). */
static const hs_tp_rule default_plan[] = {
    {"model.embed_tokens.weight", HS_TP_VOCAB},
    {"lm_head.weight", HS_TP_VOCAB},
    {"self_attn.q_proj.weight", HS_TP_COLWISE},
    {"self_attn.k_proj.weight", HS_TP_COLWISE},
    {"self_attn.v_proj.weight", HS_TP_COLWISE},
    {"self_attn.o_proj.weight", HS_TP_ROWWISE},
    {"mlp.gate_proj.weight", HS_TP_COLWISE},
    {"mlp.up_proj.weight", HS_TP_COLWISE},
    {"mlp.down_proj.weight", HS_TP_ROWWISE},
    {"input_layernorm.weight", HS_TP_REPLICATE},
    {"post_attention_layernorm.weight", HS_TP_REPLICATE},
    {"model.norm.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.gate.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.experts.w1.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.experts.w2.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.experts.w3.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.shared_expert.gate_proj.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.shared_expert.up_proj.weight", HS_TP_REPLICATE},
    {"block_sparse_moe.shared_expert.down_proj.weight", HS_TP_REPLICATE},
};

const hs_tp_rule *hs_tp_default_plan(int *n) {
    *n = (int)(sizeof default_plan / sizeof default_plan[0]);
    return default_plan;
}

static bool suffix_matches(const char *fqn, const char *suffix) {
    size_t a = strlen(fqn), b = strlen(suffix);
    if (b > a || strcmp(fqn + a - b, suffix) != 0) return false;
    return a == b || fqn[a - b - 1] == '.';
}

static const hs_tp_rule *rule_for(const char *fqn, const hs_tp_rule *rules, int n) {
    for (int i = 0; i < n; i++)
        if (suffix_matches(fqn, rules[i].suffix)) return &rules[i];
    return NULL;
}

/* A tied lm_head is the embedding tensor itself: both names must get one
 * placement. */
static void check_tied(const hs_model *m, const hs_tp_rule *rules, int n, hs_error *e) {
    const hs_model_config *c = hs_model_config_of(m);
    if (!c->tie_embeddings) return;
    const hs_tp_rule *a = rule_for("model.embed_tokens.weight", rules, n);
    const hs_tp_rule *b = rule_for("lm_head.weight", rules, n);
    if (!a || !b) return; /* an unmatched name is reported on its own */
    hs_placement pa = hs_tp_style_placement(a->style), pb = hs_tp_style_placement(b->style);
    if (pa.kind == pb.kind && pa.dim == pb.dim) return;
    hs_error_append(e, HS_ERR_CONFIG,
                    "model.embed_tokens.weight and lm_head.weight are one tied tensor "
                    "(model.tie_embeddings: true) but the TP plan gives them %s and %s; give "
                    "both the same style or set model.tie_embeddings: false",
                    hs_tp_style_name(a->style), hs_tp_style_name(b->style));
}

hs_status hs_tp_apply_plan(hs_tp *t, hs_model *m, const hs_tp_rule *rules, int n_rules,
                           hs_error *e) {
    return hs_tp_place(m, rules, n_rules, t->size, t->rank, t->ops.sequence_parallel, e);
}

hs_status hs_tp_place(hs_model *m, const hs_tp_rule *rules, int n_rules, int size, int rank,
                      bool sequence_parallel, hs_error *e) {
    hs_error_clear(e);
    check_tied(m, rules, n_rules, e);
    int np = hs_model_num_params(m);
    for (int i = 0; i < np; i++) {
        hs_param *p = hs_model_param(m, i);
        if (p->on_ep_mesh) continue; /* experts under EP: not on the tp mesh */
        const hs_tp_rule *r = rule_for(p->fqn, rules, n_rules);
        if (!r) {
            hs_error_append(e, HS_ERR_CONFIG,
                            "%s: no rule of the tensor-parallel plan matches this parameter; "
                            "every parameter needs a placement on the tp mesh (add a rule "
                            "for its FQN suffix)",
                            p->fqn);
            continue;
        }
        hs_placement pl = hs_tp_style_placement(r->style);
        if (!hs_param_place_tp(p, pl, size, rank)) {
            char buf[32];
            hs_error_append(e, HS_ERR_CONFIG,
                            "%s: %s (%s) splits dim %d of size %lld over tp_size=%d, which "
                            "does not divide it; choose an accelerator.tp_size that divides it",
                            p->fqn, hs_tp_style_name(r->style),
                            hs_placement_str(pl, buf, sizeof buf), pl.dim,
                            (long long)(pl.dim < p->ndim ? p->shape[pl.dim] : 0), size);
            continue;
        }
        p->tp_grad_partial = sequence_parallel && pl.kind == HS_PLACEMENT_REPLICATE;
    }
    if (e->code != HS_OK) return e->code;
    return hs_model_check_tp_layout(m, e);
}
