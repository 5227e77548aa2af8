/* The whole MoE layer: memory layout of the saved activations and scratch,
 * and forward / backward composed from the router, the dispatch and the
 * SwiGLU expert kernel. See moe_layer.h for the contract. */
#include <string.h>

#include "model/layers.h"
#include "model/moe_layer.h"

hs_moe_shapes hs_moe_shapes_make(const hs_moe_config *mc, int BT, int C) {
    hs_moe_shapes s = {BT,
                       C,
                       mc->num_experts,
                       mc->top_k,
                       mc->expert_ffn_dim,
                       mc->shared_expert_ffn_dim,
                       mc->num_experts,
                       false,
                       {.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1.0f}};
    return s;
}

hs_moe_router hs_moe_router_of(const hs_model_config *m) {
    const hs_moe_config *x = &m->moe;
    return (hs_moe_router){.sigmoid = !strcmp(x->score_func, "sigmoid"),
                           .renorm = hs_model_arch_moe_renorm(m),
                           .n_group = x->n_group > 1 ? x->n_group : 1,
                           .topk_group = x->n_group > 1 ? x->topk_group : 1,
                           .scale = x->routed_scaling_factor > 0 ? (float)x->routed_scaling_factor
                                                                 : 1.0f};
}

static void shapes_check(const hs_moe_shapes *s) {
    HS_ASSERT(s->BT >= 0 && s->C > 0 && s->E > 0 && s->F > 0 && s->FS >= 0);
    HS_ASSERT(s->K >= 1 && s->K <= s->E);
    HS_ASSERT(s->EL >= 1 && s->E % s->EL == 0);
    /* Grouped-row indices are int32. */
    HS_ASSERT((int64_t)s->BT * s->K < INT32_MAX);
}

/* Bump allocator over one block; with base == NULL it only measures. */
typedef struct carver {
    char *base;
    size_t off;
} carver;

static void *carve(carver *c, size_t bytes) {
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + HS_ALIGN - 1) / HS_ALIGN * HS_ALIGN;
    return p;
}

static size_t act_layout(hs_moe_act *a, const hs_moe_shapes *s, hs_dtype dt, void *mem) {
    carver c = {mem, 0};
    const size_t es = hs_dtype_size(dt), bt = (size_t)s->BT, pairs = bt * (size_t)s->K;
    /* The seam's experts keep their hidden rows themselves. */
    const size_t local_pairs = s->seam_experts ? 0 : pairs;
    a->probs = carve(&c, bt * (size_t)s->E * sizeof(float));
    a->sel = carve(&c, pairs * sizeof(int32_t));
    a->weight = carve(&c, pairs * sizeof(float));
    a->offset = carve(&c, ((size_t)s->E + 1) * sizeof(int32_t));
    a->row_pair = carve(&c, pairs * sizeof(int32_t));
    a->pair_row = carve(&c, pairs * sizeof(int32_t));
    a->h1 = carve(&c, local_pairs * (size_t)s->F * es);
    a->h3 = carve(&c, local_pairs * (size_t)s->F * es);
    a->y = carve(&c, pairs * (size_t)s->C * es);
    a->sh1 = carve(&c, bt * (size_t)s->FS * es);
    a->sh3 = carve(&c, bt * (size_t)s->FS * es);
    a->count = carve(&c, (size_t)s->E * sizeof(int64_t));
    a->prob_sum = carve(&c, (size_t)s->E * sizeof(double));
    a->bias32 = carve(&c, (size_t)s->E * sizeof(float));
    return c.off;
}

size_t hs_moe_act_bytes(const hs_moe_shapes *s, hs_dtype dt) {
    hs_moe_act a;
    shapes_check(s);
    return act_layout(&a, s, dt, NULL);
}

void hs_moe_act_bind(hs_moe_act *act, hs_device *dev, const hs_moe_shapes *s, hs_dtype dt,
                     void *mem) {
    shapes_check(s);
    HS_ASSERT(mem != NULL && ((uintptr_t)mem % HS_ALIGN) == 0);
    *act = (hs_moe_act){0};
    act->cap = *s;
    act->dev = dev;
    act->dt = dt;
    act->out_dt = dt;
    act_layout(act, s, dt, mem);
}

/* Scratch of one call. Forward uses xg, a, acc and row; backward xg, a,
 * dh1, dh3, dyg, dw, dp and row. */
typedef struct moe_scratch {
    void *xg;   /* [BT*K, C] dt: x in grouped order */
    void *a;    /* [max(BT*K*F, BT*FS)] dt: silu(h1) * h3 */
    float *acc; /* [BT, C] fp32: forward output before rounding */
    float *dh1; /* [max(BT*K*F, BT*FS)] */
    float *dh3; /* [max(BT*K*F, BT*FS)] */
    float *dyg; /* [BT*K, C]: d loss / d y per grouped row, then d / d xg */
    float *dw;  /* [BT, K]: d loss / d routing weight */
    float *dp;  /* [BT, E]: d loss / d probs, then d / d logits */
    float *seq; /* [BT, E]: the sequence-wise balance loss's part of dp */
    float *row; /* [C] */
} moe_scratch;

static size_t scratch_layout(moe_scratch *m, const hs_moe_shapes *s, hs_dtype dt, void *mem) {
    carver c = {mem, 0};
    const size_t es = hs_dtype_size(dt), bt = (size_t)s->BT, pairs = bt * (size_t)s->K;
    size_t hidden = s->seam_experts ? 0 : pairs * (size_t)s->F; /* else the seam's own */
    if (bt * (size_t)s->FS > hidden) hidden = bt * (size_t)s->FS;
    m->xg = carve(&c, pairs * (size_t)s->C * es);
    m->a = carve(&c, hidden * es);
    m->acc = carve(&c, bt * (size_t)s->C * sizeof(float));
    m->dh1 = carve(&c, hidden * sizeof(float));
    m->dh3 = carve(&c, hidden * sizeof(float));
    m->dyg = carve(&c, pairs * (size_t)s->C * sizeof(float));
    m->dw = carve(&c, pairs * sizeof(float));
    m->dp = carve(&c, bt * (size_t)s->E * sizeof(float));
    m->seq = carve(&c, bt * (size_t)s->E * sizeof(float));
    m->row = carve(&c, (size_t)s->C * sizeof(float));
    return c.off;
}

size_t hs_moe_scratch_bytes(const hs_moe_shapes *s, hs_dtype dt) {
    moe_scratch m;
    shapes_check(s);
    return scratch_layout(&m, s, dt, NULL);
}

static moe_scratch scratch_bind(const hs_moe_act *act, void *mem) {
    moe_scratch m;
    HS_ASSERT(mem != NULL && ((uintptr_t)mem % HS_ALIGN) == 0);
    scratch_layout(&m, &act->cap, act->dt, mem);
    return m;
}

/* The layer's rows at the expert-parallel seam. */
static hs_moe_exchange exchange(const hs_moe_act *act, const hs_moe_weights *w,
                                const hs_moe_grads *gr, moe_scratch *m) {
    return (hs_moe_exchange){.dt = act->dt,
                             .E = act->cap.E,
                             .C = act->cap.C,
                             .F = act->cap.F,
                             .count = act->count,
                             .xg = m->xg,
                             .y = act->y,
                             .dyg = m->dyg,
                             .w = w,
                             .gr = gr,
                             .state = act->ep_state};
}

static void experts_forward(hs_moe_act *act, const hs_moe_weights *w, moe_scratch *m) {
    if (act->ep_state) {
        hs_moe_exchange x = exchange(act, w, NULL, m);
        act->par->moe_experts_fwd(act->par->ctx, &x);
        return;
    }
    hs_moe_rows r = {act->dev, act->cap.E, hs_moe_dispatch_offsets(act), m->xg, act->h1, act->h3,
                     act->y,   NULL};
    hs_moe_experts_forward(&r, w, m->a, act->dt, act->cap.C, act->cap.F);
}

/* The expert unit's output cast: y (held in dt) takes the values of y cast
 * to out_dt. Widening to fp32 changes no value (the combine reads y into
 * fp32 anyway), so only a narrower out_dt does work. */
static void expert_output_cast(const hs_moe_act *act, float *row) {
    const int C = act->cap.C;
    if (act->out_dt == act->dt || act->out_dt == HS_DTYPE_F32) return;
    for (int64_t r = 0; r < (int64_t)act->BT * act->cap.K; r++) {
        void *y = hs_moe_at(act->y, act->dt, r * C);
        hs_dev_convert(act->dev, row, HS_DTYPE_F32, y, act->dt, C);
        hs_dev_round(act->dev, row, act->out_dt, C);
        hs_dev_convert(act->dev, y, act->dt, row, HS_DTYPE_F32, C);
    }
}

/* acc[t] = sum_k weight[t,k] * y[row of (t,k)], slots in order k = 0..K-1. */
static void combine(float *acc, float *row, const hs_moe_act *act) {
    act->dev->k->moe_unpermute(act->dev->stream, acc, act->y, act->dt, act->pair_row, act->weight,
                               act->BT, act->cap.K, act->cap.C, row);
}

void hs_moe_forward(void *out, hs_moe_act *act, const void *x, const hs_moe_weights *w, int BT,
                    void *scratch) {
    HS_ASSERT(BT >= 0 && BT <= act->cap.BT);
    const hs_moe_shapes *s = &act->cap;
    moe_scratch m = scratch_bind(act, scratch);
    act->BT = BT;
    hs_moe_route_forward(act, x, w->gate, w->bias, BT);
    hs_moe_dispatch_plan(act);
    hs_moe_dispatch_gather(m.xg, x, act);
    experts_forward(act, w, &m);
    expert_output_cast(act, m.row);
    combine(m.acc, m.row, act);
    if (s->FS > 0)
        hs_moe_swiglu_forward(act->dev, m.acc, HS_DTYPE_F32, 1.0f, act->sh1, act->sh3, m.a, x,
                              w->sh_gate, w->sh_up, w->sh_down, act->dt, BT, s->C, s->FS);
    hs_dev_convert(act->dev, out, act->dt, m.acc, HS_DTYPE_F32, (int64_t)BT * s->C);
}

/* dyg[row of (t,k)] = weight[t,k] * dout[t]; dw[t,k] = dout[t] . y[row]. */
static void combine_backward(moe_scratch *m, const float *dout, const hs_moe_act *act) {
    act->dev->k->moe_combine_bwd(act->dev->stream, m->dyg, m->dw, dout, act->y, act->dt,
                                 act->pair_row, act->weight, act->BT, act->cap.K, act->cap.C,
                                 m->row);
}

size_t hs_moe_wgrad_host_bytes(const hs_moe_shapes *s, int max_sequences) {
    return ((size_t)s->E + 1) * ((size_t)max_sequences + 1) * sizeof(int64_t) +
           (size_t)s->BT * (size_t)s->K * sizeof(int32_t);
}

/* Layout mode (gr->wgrad): where each sequence's rows start among every
 * expert's grouped rows (hs_moe_rows.seq_first, from offset), its rows
 * in token order, and after them the equal blocks of the token rows; in
 * wg's host scratch. */
static const int64_t *sequence_rows(const hs_moe_act *act, const int32_t *offset,
                                    const hs_moe_wgrad *wg) {
    const int E = act->cap.E, K = act->cap.K, S = wg->nseq;
    const int64_t BT = act->BT, T = BT / S;
    HS_ASSERT(S >= 1 && T * S == BT);
    int64_t *first = wg->host;
    int32_t *pair = (int32_t *)(first + ((size_t)E + 1) * ((size_t)S + 1));
    hs_device_copy(act->dev, pair, act->row_pair, (size_t)(BT * K) * sizeof *pair, HS_COPY_D2H);
    for (int e = 0; e < E; e++) {
        int64_t o0 = offset[e], o1 = offset[e + 1], *f = first + (size_t)e * ((size_t)S + 1);
        int s = 0;
        f[0] = 0;
        for (int64_t r = o0; r < o1; r++)
            for (int q = (int)(pair[r] / K / T); s < q;) f[++s] = r - o0;
        while (s < S) f[++s] = o1 - o0;
    }
    int64_t *eq = first + (size_t)E * ((size_t)S + 1);
    for (int s = 0; s <= S; s++) eq[s] = s * T;
    return first;
}

static void experts_backward(const hs_moe_grads *gr, const hs_moe_act *act, const hs_moe_weights *w,
                             moe_scratch *m, const int64_t *seq_first) {
    if (act->ep_state) {
        HS_ASSERT(!gr->wgrad); /* layout mode refuses expert parallelism */
        hs_moe_exchange x = exchange(act, w, gr, m);
        act->par->moe_experts_bwd(act->par->ctx, &x);
        return;
    }
    hs_moe_rows r = {act->dev, act->cap.E, hs_moe_dispatch_offsets(act), m->xg, act->h1, act->h3,
                     act->y,   seq_first};
    hs_moe_experts_backward(&r, m->dyg, gr, w, m->a, m->dh1, m->dh3, act->dt, act->cap.C,
                            act->cap.F);
}

void hs_moe_backward(float *dx, const float *dout, const hs_moe_grads *gr, const hs_moe_act *act,
                     const void *x, const hs_moe_weights *w, const float *aux_grad,
                     const hs_moe_seq *seq, void *scratch) {
    const hs_moe_shapes *s = &act->cap;
    const int C = s->C, K = s->K;
    moe_scratch m = scratch_bind(act, scratch);
    if (!act->ep_state) hs_moe_dispatch_gather(m.xg, x, act); /* EP keeps its received rows */
    combine_backward(&m, dout, act);
    /* The backward of the output cast: the gradient back to dt. */
    if (act->out_dt != act->dt) hs_dev_round(act->dev, m.dyg, act->dt, (int64_t)act->BT * K * C);
    const hs_moe_wgrad *wg = gr->wgrad;
    const int64_t *first = wg ? sequence_rows(act, hs_moe_dispatch_offsets(act), wg) : NULL;
    /* the token rows' equal blocks, after the experts' */
    const int64_t *blocks = wg ? first + (size_t)s->E * ((size_t)wg->nseq + 1) : NULL;
    experts_backward(gr, act, w, &m, first);
    act->dev->k->moe_permute_bwd(act->dev->stream, dx, m.dyg, act->row_pair, act->BT, K, C);
    if (s->FS > 0)
        hs_moe_swiglu_backward(act->dev, dx, 1.0f, gr->sh_gate, gr->sh_up, gr->sh_down, gr->dt,
                               dout, x, act->sh1, act->sh3, w->sh_gate, w->sh_up, w->sh_down,
                               act->dt, m.a, m.dh1, m.dh3, act->BT, C, s->FS, wg, blocks);
    hs_moe_route_backward(dx, gr, m.dw, aux_grad, seq, act, x, w->gate, m.dp, m.seq, blocks);
}
