/* The parameter registry: every parameter with its Hugging Face FQN, kind,
 * shape and owning unit, in Hugging Face's named_parameters() order, and
 * the unit list (root, then each block, each followed by its routed
 * experts for arch moe). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

static const char *const KIND_NAMES[] = {"embedding", "norm",   "linear", "lm_head",
                                         "router",    "expert", "bias"};
_Static_assert(sizeof KIND_NAMES / sizeof KIND_NAMES[0] == HS_PARAM_KIND_COUNT,
               "KIND_NAMES must follow hs_param_kind");

const char *hs_param_kind_name(hs_param_kind k) {
    return (unsigned)k < HS_PARAM_KIND_COUNT ? KIND_NAMES[k] : "unknown";
}

static int registry_capacity(const hs_model_config *c) {
    /* norms, attention and its q/k norms (or MLA's 7), mlp or router +
     * bias + 3 experts + 3 shared */
    int per_block = 2 + 7 + 8;
    return 3 + c->n_layers * per_block;
}

__attribute__((format(printf, 6, 7))) static hs_param *param_add(hs_model *m, hs_param_kind kind,
                                                                 int unit, int ndim,
                                                                 const int64_t *shape,
                                                                 const char *fmt, ...) {
    HS_ASSERT(m->n_params < registry_capacity(&m->cfg));
    hs_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->fqn, sizeof p->fqn, fmt, ap);
    va_end(ap);
    HS_ASSERT(n > 0 && n < HS_FQN_MAX);
    p->kind = kind;
    p->unit = unit;
    p->ndim = ndim;
    for (int d = 0; d < ndim; d++) p->shape[d] = p->local_shape[d] = shape[d];
    p->tp = (hs_placement){HS_PLACEMENT_REPLICATE, 0};
    p->grad_dtype = m->opt.grad_dtype;
    p->init_std = kind == HS_PARAM_NORM || kind == HS_PARAM_BIAS ? 0.0f : (float)m->cfg.init_std;
    /* the correction bias steers the choice only: no gradient reaches it */
    p->frozen = kind == HS_PARAM_BIAS;
    return p;
}

static hs_param *add2(hs_model *m, hs_param_kind kind, int unit, int64_t d0, int64_t d1,
                      const char *fqn) {
    int64_t s[2] = {d0, d1};
    return param_add(m, kind, unit, 2, s, "%s", fqn);
}

static void unit_add(hs_model *m, int parent, bool is_expert, const char *name) {
    hs_unit_desc *u = &m->units[m->n_units++];
    snprintf(u->name, sizeof u->name, "%s", name);
    u->parent = parent;
    u->is_expert = is_expert;
    u->root = parent < 0;
    u->chunk = 0;
}

#define LAYER "model.layers.%d."

static hs_param *lin(hs_model *m, hs_param_kind kind, int unit, int64_t out, int64_t in, int i,
                     const char *name) {
    int64_t s[2] = {out, in};
    return param_add(m, kind, unit, 2, s, LAYER "%s.weight", i, name);
}

/* Dense linears: block.c's weight GEMM is each gradient's first write. */
static void first_store(hs_param *const *w, int n) {
    for (int k = 0; k < n; k++) w[k]->grad_first_store = true;
}

/* DeepseekV3Attention's parameters, in its named_parameters() order. */
static void block_mla_add(hs_model *m, hs_block_params *bp, int i) {
    const hs_mla_shape *s = &m->mla;
    int u = bp->unit;
    int64_t C = m->C, q = (int64_t)m->NHg * m->HD, kvb = (int64_t)m->NHg * (s->nope + s->Vd);
    if (s->QL > 0) {
        int64_t ql[1] = {s->QL};
        bp->q_a = lin(m, HS_PARAM_LINEAR, u, s->QL, C, i, "self_attn.q_a_proj");
        bp->q_a_norm =
            param_add(m, HS_PARAM_NORM, u, 1, ql, LAYER "self_attn.q_a_layernorm.weight", i);
        bp->wq = lin(m, HS_PARAM_LINEAR, u, q, s->QL, i, "self_attn.q_b_proj");
    } else {
        bp->wq = lin(m, HS_PARAM_LINEAR, u, q, C, i, "self_attn.q_proj");
    }
    int64_t kl[1] = {s->KL};
    bp->kv_a = lin(m, HS_PARAM_LINEAR, u, s->KL + s->R, C, i, "self_attn.kv_a_proj_with_mqa");
    bp->kv_a_norm =
        param_add(m, HS_PARAM_NORM, u, 1, kl, LAYER "self_attn.kv_a_layernorm.weight", i);
    bp->kv_b = lin(m, HS_PARAM_LINEAR, u, kvb, s->KL, i, "self_attn.kv_b_proj");
    bp->wo = lin(m, HS_PARAM_LINEAR, u, C, (int64_t)m->NHg * s->Vd, i, "self_attn.o_proj");
    first_store((hs_param *[]){bp->wq, bp->kv_a, bp->kv_b, bp->wo}, 4);
    if (bp->q_a) first_store((hs_param *[]){bp->q_a}, 1);
    /* whole on every TP rank, they feed every head: a rank holding some
     * heads computes a summand of their gradients */
    hs_param *latent[] = {bp->q_a, bp->q_a_norm, bp->kv_a, bp->kv_a_norm};
    for (int k = 0; k < 4; k++)
        if (latent[k]) latent[k]->per_head = true;
}

static void block_attention_add(hs_model *m, hs_block_params *bp, int i) {
    if (m->mla.on) {
        block_mla_add(m, bp, i);
        return;
    }
    int u = bp->unit;
    int64_t C = m->C, q = (int64_t)m->NHg * m->HD, kv = (int64_t)m->KVHg * m->HD;
    bp->wq = lin(m, HS_PARAM_LINEAR, u, q, C, i, "self_attn.q_proj");
    bp->wk = lin(m, HS_PARAM_LINEAR, u, kv, C, i, "self_attn.k_proj");
    bp->wv = lin(m, HS_PARAM_LINEAR, u, kv, C, i, "self_attn.v_proj");
    bp->wo = lin(m, HS_PARAM_LINEAR, u, C, q, i, "self_attn.o_proj");
    first_store((hs_param *[]){bp->wq, bp->wk, bp->wv, bp->wo}, 4);
    if (!m->qk_norm) return;
    int64_t hd[1] = {m->HD};
    bp->q_norm = param_add(m, HS_PARAM_NORM, u, 1, hd, LAYER "self_attn.q_norm.weight", i);
    bp->k_norm = param_add(m, HS_PARAM_NORM, u, 1, hd, LAYER "self_attn.k_norm.weight", i);
    bp->q_norm->per_head = bp->k_norm->per_head = true;
}

static void block_mlp_add(hs_model *m, hs_block_params *bp, int i) {
    int u = bp->unit;
    bp->wg = lin(m, HS_PARAM_LINEAR, u, m->Fg, m->C, i, "mlp.gate_proj");
    bp->wu = lin(m, HS_PARAM_LINEAR, u, m->Fg, m->C, i, "mlp.up_proj");
    bp->wd = lin(m, HS_PARAM_LINEAR, u, m->C, m->Fg, i, "mlp.down_proj");
    first_store((hs_param *[]){bp->wg, bp->wu, bp->wd}, 3);
}

/* Mixtral's or Qwen3-MoE's names (hs_model_arch_moe_names); the routed
 * experts are stacked [E, out, in] per block and live in the nested expert
 * unit, the router and shared expert in the block. */
static void block_moe_add(hs_model *m, hs_block_params *bp, int i) {
    const hs_moe_shapes *s = &m->moe_shapes;
    const hs_moe_names *nm = hs_model_arch_moe_names(&m->cfg);
    const char *b = nm->block;
    int u = bp->unit, eu = bp->expert_unit;
    int64_t gate[2] = {s->E, s->C}, up[3] = {s->E, s->F, s->C}, down[3] = {s->E, s->C, s->F};
    bp->router = param_add(m, HS_PARAM_ROUTER, u, 2, gate, LAYER "%s.gate.weight", i, b);
    if (hs_model_moe_bias(&m->cfg))
        bp->bias =
            param_add(m, HS_PARAM_BIAS, u, 1, gate, LAYER "%s.gate.e_score_correction_bias", i, b);
    bp->w1 = param_add(m, HS_PARAM_EXPERT, eu, 3, up, LAYER "%s.experts.%s.weight", i, b, nm->w1);
    bp->w2 = param_add(m, HS_PARAM_EXPERT, eu, 3, down, LAYER "%s.experts.%s.weight", i, b, nm->w2);
    bp->w3 = param_add(m, HS_PARAM_EXPERT, eu, 3, up, LAYER "%s.experts.%s.weight", i, b, nm->w3);
    if (s->FS <= 0) return;
    int64_t gu[2] = {s->FS, s->C}, dn[2] = {s->C, s->FS};
    const char *sh = nm->shared;
    bp->sh_gate = param_add(m, HS_PARAM_LINEAR, u, 2, gu, LAYER "%s.%s.gate_proj.weight", i, b, sh);
    bp->sh_up = param_add(m, HS_PARAM_LINEAR, u, 2, gu, LAYER "%s.%s.up_proj.weight", i, b, sh);
    bp->sh_down = param_add(m, HS_PARAM_LINEAR, u, 2, dn, LAYER "%s.%s.down_proj.weight", i, b, sh);
}

/* Local block `local` is the model's block i = l0 + local (FQNs are global). */
static void block_add(hs_model *m, int local) {
    hs_block_params *bp = &m->blocks[local];
    int i = m->layer_of[local];
    char name[HS_FQN_MAX];
    snprintf(name, sizeof name, "model.layers.%d", i);
    bp->unit = m->n_units;
    unit_add(m, 0, false, name);
    int chunk = 0;
    while (chunk + 1 < m->n_chunks && local >= m->chunk_begin[chunk + 1]) chunk++;
    m->units[bp->unit].chunk = chunk;
    bp->expert_unit = -1;
    bool moe = hs_model_layer_moe(&m->cfg, i);
    if (moe) {
        snprintf(name, sizeof name, "model.layers.%d.%s.experts", i,
                 hs_model_arch_moe_names(&m->cfg)->block);
        bp->expert_unit = m->n_units;
        unit_add(m, bp->unit, true, name);
        m->units[bp->expert_unit].chunk = chunk;
    }
    block_attention_add(m, bp, i);
    if (moe) block_moe_add(m, bp, i);
    else block_mlp_add(m, bp, i);
    if (moe && m->moe_head < 0) m->moe_head = local;
    m->dense |= !moe;
    int64_t c[1] = {m->C};
    bp->ln1 = param_add(m, HS_PARAM_NORM, bp->unit, 1, c, LAYER "input_layernorm.weight", i);
    bp->ln2 =
        param_add(m, HS_PARAM_NORM, bp->unit, 1, c, LAYER "post_attention_layernorm.weight", i);
}

hs_status hs_model_registry_build(hs_model *m, hs_error *e) {
    int cap = registry_capacity(&m->cfg);
    m->params = calloc((size_t)cap, sizeof *m->params);
    m->units = calloc((size_t)(2 + 2 * m->L), sizeof *m->units);
    m->blocks = calloc((size_t)m->L, sizeof *m->blocks);
    if (!m->params || !m->units || !m->blocks)
        return hs_error_oom(e, "model registry: %d parameters", cap);
    unit_add(m, -1, false, "");
    m->moe_head = -1;
    m->dense = false;
    if (m->cfg.tie_embeddings && m->first_stage != m->last_stage)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "model.tie_embeddings=true cannot be split into pipeline stages: "
                            "the embedding lives on the first and lm_head on the last; set "
                            "model.tie_embeddings: false or accelerator.pp_size: 1");
    /* the embedding and lm_head are one tensor when tied */
    if (m->first_stage)
        m->embed = add2(m, HS_PARAM_EMBEDDING, 0, m->Vg, m->C, "model.embed_tokens.weight");
    for (int i = 0; i < m->L; i++) block_add(m, i);
    /* hs_model_root_chunk: the head's chunk on the last stage */
    if (m->last_stage && !m->first_stage) m->units[0].chunk = m->n_chunks - 1;
    if (!m->last_stage) return HS_OK;
    int64_t c[1] = {m->C};
    /* zbv's V: the head's chunk gets a root of its own (hs_unit_desc.root);
     * a tied head is the embedding's tensor, so both chunks call unit 0 */
    m->head_unit = 0;
    if (m->first_stage && m->n_chunks > 1 && !m->cfg.tie_embeddings) {
        m->head_unit = m->n_units;
        unit_add(m, -1, false, "lm_head");
        m->units[m->head_unit].chunk = m->n_chunks - 1;
    } else if (m->first_stage && m->n_chunks > 1) {
        m->units[0].chunk = -1;
    }
    m->norm = param_add(m, HS_PARAM_NORM, m->head_unit, 1, c, "model.norm.weight");
    m->head = m->cfg.tie_embeddings
                  ? m->embed
                  : add2(m, HS_PARAM_LM_HEAD, m->head_unit, m->Vg, m->C, "lm_head.weight");
    return HS_OK;
}

void hs_model_registry_free(hs_model *m) {
    free(m->params);
    free(m->units);
    free(m->blocks);
    m->params = NULL;
    m->units = NULL;
    m->blocks = NULL;
}

int hs_model_num_params(const hs_model *m) { return m->n_params; }

hs_param *hs_model_param(hs_model *m, int i) {
    HS_ASSERT(i >= 0 && i < m->n_params);
    return &m->params[i];
}

int hs_model_find_param(const hs_model *m, const char *fqn) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].fqn, fqn) == 0) return i;
    return -1;
}

int hs_model_num_units(const hs_model *m) { return m->n_units; }

const hs_unit_desc *hs_model_unit(const hs_model *m, int u) {
    HS_ASSERT(u >= 0 && u < m->n_units);
    return &m->units[u];
}

int64_t hs_param_numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

int64_t hs_model_param_count(const hs_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += hs_param_numel(&m->params[i]);
    return n;
}

/* 6 * (parameters that multiply every token: all but the embedding table,
 * routed experts scaled by top_k / E, plus the lm_head product even when
 * tied) + 6 * L * T * NH * HD for the causal QK^T and PV products (2
 * GEMMs, 2 FLOPs per MAC, x3 for forward + backward, halved by the causal
 * mask); NH * HD is C unless model.head_dim sets another head size. */
double hs_model_flops_per_token(const hs_model *m, int seq_len) {
    double f = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const hs_param *p = &m->params[i];
        if (p->kind == HS_PARAM_EMBEDDING) continue;
        double k = (double)hs_param_numel(p);
        if (p->kind == HS_PARAM_EXPERT) k *= (double)m->moe_shapes.K / m->moe_shapes.E;
        /* forward 2, input gradient 2, weight gradient 2 (none when frozen) */
        f += (p->frozen ? 4.0 : 6.0) * k;
    }
    if (m->cfg.tie_embeddings && m->last_stage) f += 6.0 * (double)m->Vg * m->C;
    /* MLA: QK^T over the query head, PV over the value head */
    double att = m->mla.on ? 0.5 * (m->HD + m->mla.Vd) : m->HD;
    return f + 6.0 * m->L * (double)seq_len * m->NHg * att;
}

/* INT64_MAX when the product overflows: the plan reports it as an error. */
int64_t hs_param_local_numel(const hs_param *p) {
    hs_checked ck = {0};
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n = hs_ck_mul(&ck, n, p->local_shape[d]);
    return n;
}

bool hs_param_place_tp(hs_param *p, hs_placement pl, int tp, int rank) {
    p->on_tp_mesh = true;
    p->tp = pl;
    for (int d = 0; d < p->ndim; d++) {
        p->local_shape[d] = p->shape[d];
        p->local_offset[d] = 0;
    }
    if (pl.kind != HS_PLACEMENT_SHARD) return true;
    if (pl.dim < 0 || pl.dim >= p->ndim || p->shape[pl.dim] % tp) return false;
    p->local_shape[pl.dim] = p->shape[pl.dim] / tp;
    p->local_offset[pl.dim] = p->local_shape[pl.dim] * rank;
    return true;
}

bool hs_param_place_ep(hs_param *p, int ep, int rank) {
    if (p->kind != HS_PARAM_EXPERT || ep < 1 || p->shape[0] % ep) return false;
    p->on_tp_mesh = false;
    p->tp = (hs_placement){.kind = HS_PLACEMENT_REPLICATE};
    p->tp_grad_partial = false;
    p->on_ep_mesh = true;
    for (int d = 0; d < p->ndim; d++) {
        p->local_shape[d] = p->shape[d];
        p->local_offset[d] = 0;
    }
    p->local_shape[0] = p->shape[0] / ep;
    p->local_offset[0] = p->local_shape[0] * rank;
    return true;
}
