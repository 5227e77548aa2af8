/* hs_parallel: TP -> CP -> EP composed into the model's seam (parallel.h).
 * It owns the dimensions' contexts, places each parameter by the style
 * table as the model registers it, holds the regions' buffers (from the
 * model's allocator, so the plan counts them) and fills the seam: the TP
 * regions (tp_region.c), CP attention (cp_attention.c) or the one-device
 * attention, the MoE statistics and the EP exchanges. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/par_internal.h"

static const hs_model_par *one(void) { return hs_model_one_device_par(); }

static bool par_place(void *ctx, hs_param *q, hs_error *e) { return hs_style_place(ctx, q, e); }

static void tp_bufs(hs_parallel *p, hs_model_alloc_fn alloc, void *actx) {
    const hs_model_dims *d = &p->d;
    int64_t n = d->rows * d->C;
    p->b.part = alloc(actx, n, HS_DTYPE_F32);
    p->b.red = alloc(actx, n, HS_DTYPE_F32);
    p->b.local_ln = alloc(actx, n, d->dt);
    p->b.dfull = alloc(actx, n, HS_DTYPE_F32);
    p->b.stats = alloc(actx, 3 * d->head_rows, HS_DTYPE_F32);
    p->b.logits = alloc(actx, 2 * d->head_rows * d->Vg, HS_DTYPE_F32);
}

/* Ring attention's blocks and online-softmax state for `rows` query rows
 * of q elements and blocks of nkv elements (K or V). */
static void ring_bufs(hs_parallel *p, hs_model_alloc_fn alloc, void *actx, int64_t rows, int64_t q,
                      int64_t nkv, int NH) {
    for (int i = 0; i < 2; i++) {
        p->b.ring_kv[i] = alloc(actx, 2 * nkv, p->d.dt);
        p->b.ring_dkv[i] = alloc(actx, 2 * nkv, HS_DTYPE_F32);
    }
    p->b.ring_bout = alloc(actx, rows * q, HS_DTYPE_F32);
    p->b.ring_out = alloc(actx, rows * q, HS_DTYPE_F32);
    p->b.ring_lse = alloc(actx, rows * NH, HS_DTYPE_F32);
    p->b.ring_blse = alloc(actx, rows * NH, HS_DTYPE_F32);
}

/* The all-to-all methods: staging of one exchange (the largest is q's, or
 * its fp32 gradient's) and the rank's heads over its group's rows; the
 * hybrid rings those over the groups. */
static void a2a_bufs(hs_parallel *p, hs_model_alloc_fn alloc, void *actx, int64_t q) {
    const hs_model_dims *d = &p->d;
    int a = p->l.cp_a2a;
    int64_t kv = (int64_t)a * hs_cp_a2a_heads(d->KVH, a) * d->HD; /* kv heads of a group row */
    int64_t stage = d->rows * (q > kv ? q : kv);
    p->b.a2a_send = alloc(actx, stage, HS_DTYPE_F32);
    p->b.a2a_recv = alloc(actx, stage, HS_DTYPE_F32);
    p->b.a2a_q = alloc(actx, d->rows * q, d->dt);
    p->b.a2a_k = alloc(actx, d->rows * kv, d->dt);
    p->b.a2a_v = alloc(actx, d->rows * kv, d->dt);
    p->b.a2a_out = alloc(actx, d->rows * q, d->dt);
    p->b.a2a_dout = alloc(actx, d->rows * q, HS_DTYPE_F32);
    p->b.a2a_dq = alloc(actx, d->rows * q, HS_DTYPE_F32);
    p->b.a2a_dk = alloc(actx, d->rows * kv, HS_DTYPE_F32);
    p->b.a2a_dv = alloc(actx, d->rows * kv, HS_DTYPE_F32);
    if (p->l.cp_method == HS_CP_ALLTOALL_RING) /* the group's rows of this rank's heads */
        ring_bufs(p, alloc, actx, a * d->rows, q / a, d->rows * kv, d->NH / a);
}

static void cp_bufs(hs_parallel *p, hs_model_alloc_fn alloc, void *actx) {
    const hs_model_dims *d = &p->d;
    int T = d->seq_len;
    int64_t kv = (int64_t)d->KVH * d->HD, q = (int64_t)d->NH * d->HD;
    int64_t nkv = (int64_t)d->max_batch * T * kv;
    p->b.cos_l = alloc(actx, (int64_t)T * (d->rope_hd / 2), HS_DTYPE_F32);
    p->b.sin_l = alloc(actx, (int64_t)T * (d->rope_hd / 2), HS_DTYPE_F32);
    switch (p->l.cp_method) {
    case HS_CP_RING: ring_bufs(p, alloc, actx, d->rows, q, nkv / p->l.cp, d->NH); return;
    case HS_CP_ALLTOALL:
    case HS_CP_ALLTOALL_RING: a2a_bufs(p, alloc, actx, q); return;
    default:
        p->b.kf = alloc(actx, nkv, d->dt);
        p->b.vf = alloc(actx, nkv, d->dt);
        p->b.stage = alloc(actx, nkv, d->dt);
        p->b.dkf = alloc(actx, nkv, HS_DTYPE_F32);
        p->b.dvf = alloc(actx, nkv, HS_DTYPE_F32);
        p->b.fstage = alloc(actx, nkv, HS_DTYPE_F32);
    }
}

static hs_status par_bind(void *ctx, const hs_model_dims *d, hs_model_alloc_fn alloc, void *actx,
                          hs_error *e) {
    hs_parallel *p = ctx;
    /* one running model per hs_parallel; a described one may count the
     * buffers of several */
    HS_ASSERT(!p->bound || p->described);
    p->d = *d;
    p->bound = true;
    if (p->l.tp > 1) tp_bufs(p, alloc, actx);
    if (p->l.cp > 1) cp_bufs(p, alloc, actx);
    if (p->l.ep > 1 && d->E > 0) return hs_ep_moe_bind(p, alloc, actx, e);
    return HS_OK;
}

static void par_unbind(void *ctx) {
    hs_parallel *p = ctx;
    void *ptrs[] = {p->b.part,        p->b.red,         p->b.local_ln,   p->b.dfull,
                    p->b.stats,       p->b.logits,      p->b.cos_l,      p->b.sin_l,
                    p->b.kf,          p->b.vf,          p->b.stage,      p->b.dkf,
                    p->b.dvf,         p->b.fstage,      p->b.ring_kv[0], p->b.ring_kv[1],
                    p->b.ring_dkv[0], p->b.ring_dkv[1], p->b.ring_bout,  p->b.ring_out,
                    p->b.ring_lse,    p->b.ring_blse,   p->b.a2a_send,   p->b.a2a_recv,
                    p->b.a2a_q,       p->b.a2a_k,       p->b.a2a_v,      p->b.a2a_out,
                    p->b.a2a_dout,    p->b.a2a_dq,      p->b.a2a_dk,     p->b.a2a_dv};
    /* a counting model (the plan) allocated nothing, and its device may be gone */
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i]) hs_device_free_mem(p->d.dev, ptrs[i]);
    p->b = (hs_par_bufs){0};
    if (p->l.ep > 1) hs_ep_moe_unbind(p);
    p->bound = false;
}

/* Without CP, attention is the one device's on this rank's heads. */
static void whole_rope_tables(void *ctx, int T_local, const float **cos, const float **sin) {
    hs_parallel *p = ctx;
    one()->rope_tables(&p->d, T_local, cos, sin);
}

static void whole_attention_fwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    one()->attention_fwd(&p->d, io);
}

static void whole_attention_bwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    one()->attention_bwd(&p->d, io);
}

static void whole_attention_cached(void *ctx, const hs_attn_io *io, int pos, int cache_rows) {
    hs_parallel *p = ctx;
    one()->attention_cached(&p->d, io, pos, cache_rows);
}

/* SUM of n fp32 values over group g (NULL: none), then over the row
 * split of sequence parallelism. */
static void sum_rows(hs_parallel *p, hs_pg *g, float *buf, int64_t n) {
    if (g) {
        hs_error e;
        if (hs_pg_all_reduce(g, p->stream, buf, n, HS_DTYPE_F32, HS_REDUCE_SUM, &e) != HS_OK)
            hs_comm_abort(p->comm, &e);
    }
    if (p->seam.row_split > 1) hs_tp_all_reduce(p->tp, buf, n, HS_REDUCE_SUM);
}

/* The MoE router statistics over the global micro-batch: the batch group
 * (dp x cp), then the row split. */
static void stats_sum(void *ctx, float *buf, int64_t n) {
    hs_parallel *p = ctx;
    sum_rows(p, p->batch, buf, n);
}

/* Per-sequence router statistics: the CP ranks of the sequences, then the
 * row split. */
static void seq_sum(void *ctx, float *buf, int64_t n) {
    hs_parallel *p = ctx;
    sum_rows(p, p->seq, buf, n);
}

static void seam_fill(hs_parallel *p, bool moe_stats) {
    bool sp = p->l.sequence_parallel && p->l.tp > 1;
    hs_model_par *s = &p->seam;
    *s = (hs_model_par){.ctx = p,
                        .row_split = sp ? p->l.tp : 1,
                        .row_rank = sp ? p->l.tp_rank : 0,
                        .cp_size = p->l.cp,
                        .ep_size = p->l.ep,
                        .ep_rank = p->l.ep_rank,
                        .place = par_place,
                        .bind = par_bind,
                        .unbind = par_unbind,
                        .rope_tables = whole_rope_tables,
                        .attention_fwd = whole_attention_fwd,
                        .attention_bwd = whole_attention_bwd,
                        .attention_cached = whole_attention_cached};
    hs_tp_region_fill(s);
    /* CP splits a sequence's rows over ranks: one new row has no split,
     * so generation under CP runs the full forward (docs/generate.md) */
    if (p->l.cp > 1) s->attention_cached = NULL;
    if (p->l.cp > 1) hs_cp_attention_fill(s);
    if (moe_stats || sp) s->stats_sum = stats_sum;
    if (p->seq || sp) s->seq_sum = seq_sum;
    if (p->l.ep > 1) hs_ep_moe_fill(s);
}

static hs_status layout_check(const hs_model_config *c, const hs_accel_config *accel,
                              const hs_parallel_layout *l, hs_error *e) {
    int E = c->moe.num_experts;
    if (l->ep > 1 && (!hs_model_arch_moe(c) || E % l->ep || l->ep > HS_EP_MAX_RANKS ||
                      E / l->ep > HS_EP_MAX_LOCAL))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.ep_size=%d needs model.arch=moe with "
                            "model.moe.num_experts (%d) a multiple of it, at most %d EP ranks and "
                            "%d experts per rank",
                            l->ep, E, HS_EP_MAX_RANKS, HS_EP_MAX_LOCAL);
    int tp = l->tp > 0 ? l->tp : 1, a = l->cp_a2a > 0 ? l->cp_a2a : 1;
    int kv = c->n_kv_heads > 0 ? c->n_kv_heads : c->n_heads;
    int nh = c->n_heads / tp, kvh = kv / tp;
    if (a > 1 && (l->cp % a || nh % a || (kvh % a && a % kvh)))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.cp_rotate_method = %s exchanges heads over %d CP ranks "
                            "(of cp_size %d), which needs model.n_heads / tp_size = %d and "
                            "n_kv_heads / tp_size = %d split evenly over them (or the kv heads a "
                            "divisor of %d); choose cp_a2a_size or the method by docs/cp.md",
                            accel->cp_rotate_method, a, l->cp, nh, kvh, a);
    if (l->tp > 1 && l->ep > 1 && !l->sequence_parallel)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.ep_size=%d with tp_size=%d needs "
                            "accelerator.sequence_parallel: true, so that each token reaches its "
                            "experts from one TP rank only",
                            l->ep, l->tp);
    return HS_OK;
}

static hs_status make(const hs_model_config *model, const hs_accel_config *accel,
                      const hs_parallel_layout *l, const hs_style_rule *rules, int n_rules,
                      hs_parallel **out, hs_error *e) {
    *out = NULL;
    hs_error_clear(e);
    if (!rules) rules = hs_style_default_plan(&n_rules);
    if (layout_check(model, accel, l, e) != HS_OK) return e->code;
    if (hs_style_check_tied(rules, n_rules, model->tie_embeddings && l->tp > 1, e) != HS_OK)
        return e->code;
    hs_parallel *p = calloc(1, sizeof *p);
    if (!p) return hs_error_oom(e, "parallel: the plan's context");
    p->l = *l;
    p->rules = rules;
    p->n_rules = n_rules;
    *out = p;
    return HS_OK;
}

hs_status hs_parallel_describe(const hs_model_config *model, const hs_accel_config *accel,
                               const hs_parallel_layout *l, const hs_style_rule *rules, int n_rules,
                               hs_parallel **out, hs_error *e) {
    if (make(model, accel, l, rules, n_rules, out, e) != HS_OK) return e->code;
    (*out)->described = true;
    seam_fill(*out, hs_model_arch_moe(model));
    return HS_OK;
}

static int size_of(hs_pg *g) { return g ? hs_pg_size(g) : 1; }
static int rank_of(hs_pg *g) { return g ? hs_pg_rank(g) : 0; }

/* The all-to-all group of a CP rank: the cp group under alltoall; under
 * alltoall_ring its l->cp_a2a consecutive CP ranks, split from the world
 * (every rank creates its hs_parallel, so every rank takes part) on the
 * critical queue as the cp group is, named after it and the size. */
static hs_status a2a_group(hs_comm *comm, hs_pg *cp, const hs_parallel_layout *l, hs_pg **out,
                           hs_error *e) {
    *out = cp;
    if (l->cp_a2a == l->cp) return HS_OK;
    int per = l->cp / l->cp_a2a; /* groups per cp group: colours unique over the world */
    int colour = hs_pg_world_rank(cp, 0) * per + l->cp_rank / l->cp_a2a;
    char name[96];
    snprintf(name, sizeof name, "%s.a2a%d", hs_pg_name(cp), l->cp_a2a);
    hs_status s = hs_comm_split_queue(comm, name, colour, l->cp_rank % l->cp_a2a,
                                      HS_COMM_QUEUE_CRITICAL, out, e);
    if (s == HS_OK && (hs_pg_size(*out) != l->cp_a2a || hs_pg_rank(*out) != l->cp_rank % l->cp_a2a))
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "cp: group '%s' has %d ranks (this one %d), expected %d (%d); a group "
                            "of that name was created earlier with another layout",
                            name, hs_pg_size(*out), hs_pg_rank(*out), l->cp_a2a,
                            l->cp_rank % l->cp_a2a);
    return s;
}

hs_status hs_parallel_create(const hs_model_config *model, const hs_accel_config *accel,
                             const hs_mesh *mesh, hs_comm *comm, hs_device *dev,
                             const hs_style_rule *rules, int n_rules, hs_parallel **out,
                             hs_error *e) {
    hs_pg *tp = hs_mesh_group(mesh, HS_DIM_TP), *cp = hs_mesh_group(mesh, HS_DIM_CP);
    hs_pg *ep = hs_mesh_group(mesh, HS_DIM_EP), *batch = hs_mesh_group(mesh, HS_DIM_DP_CP);
    hs_parallel_layout l = {.tp = size_of(tp),
                            .tp_rank = rank_of(tp),
                            .sequence_parallel = accel->sequence_parallel,
                            .loss_parallel = accel->loss_parallel,
                            .cp = size_of(cp),
                            .cp_rank = rank_of(cp),
                            .ep = size_of(ep),
                            .ep_rank = rank_of(ep)};
    l.cp_method = hs_cp_method_of(accel, l.cp, &l.cp_a2a);
    if (make(model, accel, &l, rules, n_rules, out, e) != HS_OK) return e->code;
    hs_parallel *p = *out;
    p->comm = comm;
    p->stream = dev->stream;
    bool moe = hs_model_arch_moe(model);
    if (moe && size_of(batch) > 1) p->batch = batch;
    if (moe && size_of(cp) > 1) p->seq = cp;
    /* TP -> CP -> EP, as spec 004 §3 orders them */
    hs_status s = HS_OK;
    if (l.tp > 1) s = hs_tp_create(comm, dev, tp, l.sequence_parallel, &p->tp, e);
    hs_pg *a2a = NULL;
    if (l.cp > 1 && l.cp_a2a > 1) s = a2a_group(comm, cp, &l, &a2a, e);
    if (s == HS_OK && l.cp > 1) s = hs_cp_create(comm, dev, cp, a2a, &p->cp, e);
    if (s == HS_OK && l.ep > 1) s = hs_ep_create(comm, dev, ep, &p->ep, e);
    if (s != HS_OK) {
        hs_parallel_free(p);
        *out = NULL;
        return s;
    }
    seam_fill(p, p->batch != NULL);
    return HS_OK;
}

void hs_parallel_free(hs_parallel *p) {
    if (!p) return;
    hs_tp_free(p->tp);
    hs_cp_free(p->cp);
    hs_ep_free(p->ep);
    free(p);
}

const hs_model_par *hs_parallel_seam(const hs_parallel *p) {
    const hs_parallel_layout *l = &p->l;
    bool any = l->tp > 1 || l->cp > 1 || l->ep > 1 || p->batch;
    return any ? &p->seam : NULL;
}

const hs_parallel_layout *hs_parallel_layout_of(const hs_parallel *p) { return &p->l; }
hs_tp *hs_parallel_tp(const hs_parallel *p) { return p->tp; }
hs_cp *hs_parallel_cp(const hs_parallel *p) { return p->cp; }
hs_ep *hs_parallel_ep(const hs_parallel *p) { return p->ep; }
