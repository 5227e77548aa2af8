/* Expert parallelism of one MoE layer behind the model's seam: the grouped
 * (token, slot) rows of this rank travel to the ranks of their experts,
 * those ranks run their experts on everything they received (the model's
 * hs_moe_experts_forward), and the outputs travel back (the gradients
 * likewise in backward). Counts go first, as an all-to-all of E values
 * (rows for each (rank, local expert)); the rows follow with one
 * all-to-all-v. Nothing is dropped, so received rows are as many as the
 * routing sends: their buffers grow to fit.
 *
 * Row order is fixed by the routing alone. Grouped rows are sorted by
 * global expert, so the rows for EP rank d are one contiguous run; a
 * receiver holds the runs source-major as they arrive and reorders them
 * expert-major (expert j: source 0's rows, then source 1's, ...) so that
 * each expert is one GEMM, as in the one-device path. */
#include <stdlib.h>
#include <string.h>

#include "parallel/par_internal.h"

/* What one activation set keeps from its forward for its backward: the
 * counts sent and received, the expert-major offsets of the received rows
 * (device) and the rows themselves. */
typedef struct ep_state {
    float *send;  /* [E] rows for (rank d, local expert j) at d*EL + j */
    float *recv;  /* [E] rows from (source s, local expert j) at s*EL + j */
    int32_t *off; /* [EL+1] */
    int64_t rows; /* received */
    hs_ep_grow x, h1, h3, y;
} ep_state;

/* The rows an exchange brings are known only once their counts arrive,
 * inside the forward: a buffer the device refuses (it records why) ends the
 * run on every rank, whose exchange would otherwise wait for this one. */
static void *grow_to(const hs_parallel *p, hs_ep_grow *g, hs_device *dev, size_t bytes) {
    if (bytes <= g->bytes && g->p) return g->p;
    if (g->p) hs_device_free_mem(dev, g->p);
    g->bytes = bytes > HS_ALIGN ? bytes : HS_ALIGN;
    g->p = hs_device_alloc(dev, g->bytes);
    if (!g->p) {
        hs_error e;
        if (hs_device_status(dev, &e) == HS_OK)
            hs_device_oom(dev, g->bytes, "moe ep: the rows of an exchange", &e);
        hs_comm_abort(p->comm, &e);
    }
    return g->p;
}

static void grow_free(hs_ep_grow *g, hs_device *dev) {
    if (g->p) hs_device_free_mem(dev, g->p);
    *g = (hs_ep_grow){0};
}

/* What the row buffers grow to when R rows arrive (dropless: R is the
 * routing's; balanced, the layer's rows per rank): per activation set x,
 * y, h1, h3 (per_set), or once the call's shared scratch (stage, dy, a,
 * dh1, dh3). */
static int64_t rows_bytes(const hs_model_dims *d, int64_t R, bool per_set) {
    int64_t es = (int64_t)hs_dtype_size(d->dt), C = d->C, F = d->F_expert;
    if (per_set) return R * (2 * C + 2 * F) * es;
    return R * (2 * C * (int64_t)sizeof(float) + F * (es + 2 * (int64_t)sizeof(float)));
}

/* The plan counts the rows a balanced routing brings (BT*K per rank, its
 * share under sequence parallelism), through the model's allocator. */
static void count_rows(const hs_parallel *p, hs_model_alloc_fn alloc, void *actx, bool per_set) {
    int64_t R = p->d.moe_rows / p->seam.row_split;
    alloc(actx, rows_bytes(&p->d, R, per_set) / 2, HS_DTYPE_BF16); /* bytes, counted */
}

hs_status hs_ep_moe_bind(hs_parallel *p, hs_model_alloc_fn alloc, void *actx, hs_error *e) {
    hs_ep_moe *x = &p->moe;
    int E = p->d.E, EL = E / p->l.ep;
    HS_ASSERT(E >= p->l.ep && E % p->l.ep == 0 && EL <= HS_EP_MAX_LOCAL);
    if (p->d.count_only) {
        count_rows(p, alloc, actx, false);
        return HS_OK;
    }
    x->count_h = malloc((size_t)E * sizeof *x->count_h);
    x->send_h = malloc((size_t)E * sizeof *x->send_h);
    x->recv_h = malloc((size_t)E * sizeof *x->recv_h);
    x->off_h = malloc(((size_t)EL + 1) * sizeof *x->off_h);
    if (!x->count_h || !x->send_h || !x->recv_h || !x->off_h)
        return hs_error_oom(e, "moe ep: the host copies of %d experts' counts", E);
    return HS_OK;
}

void hs_ep_moe_unbind(hs_parallel *p) {
    hs_ep_moe *x = &p->moe;
    hs_device *dev = p->d.dev;
    grow_free(&x->stage, dev);
    grow_free(&x->dy, dev);
    grow_free(&x->a, dev);
    grow_free(&x->dh1, dev);
    grow_free(&x->dh3, dev);
    free(x->count_h);
    free(x->send_h);
    free(x->recv_h);
    free(x->off_h);
    *x = (hs_ep_moe){0};
}

static void *state_new(void *ctx, hs_model_alloc_fn alloc, void *actx) {
    hs_parallel *p = ctx;
    ep_state *st = calloc(1, sizeof *st);
    if (!st) return NULL; /* the model reports it */
    int E = p->d.E, EL = E / p->l.ep;
    st->send = alloc(actx, E, HS_DTYPE_F32);
    st->recv = alloc(actx, E, HS_DTYPE_F32);
    st->off = alloc(actx, EL + 1, HS_DTYPE_F32); /* int32: 4 bytes each */
    if (p->d.count_only) count_rows(p, alloc, actx, true);
    return st;
}

static void state_free(void *ctx, void *state) {
    hs_parallel *p = ctx;
    ep_state *st = state;
    hs_device *dev = p->d.dev;
    void *ptrs[] = {st->send, st->recv, st->off};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i]) hs_device_free_mem(dev, ptrs[i]);
    grow_free(&st->x, dev);
    grow_free(&st->h1, dev);
    grow_free(&st->h3, dev);
    grow_free(&st->y, dev);
    free(st);
}

/* Elements per rank of a row exchange: counts [ranks x EL] of rows of
 * `row` elements each. */
static void per_rank(int64_t *out, const float *counts, int ranks, int EL, int64_t row) {
    for (int r = 0; r < ranks; r++) {
        int64_t rows = 0;
        for (int j = 0; j < EL; j++) rows += (int64_t)counts[r * EL + j];
        out[r] = rows * row;
    }
}

/* Between the source-major rows as received (source s: its rows of local
 * expert 0, 1, ...) and expert-major ones (off_h), by the host's copies of
 * the layer's counts. to_expert: src is source-major. */
static void reorder(hs_parallel *p, void *dst, const void *src, size_t row_bytes, bool to_expert) {
    const hs_ep_moe *x = &p->moe;
    const int ranks = p->l.ep, EL = p->d.E / ranks;
    int64_t at = 0; /* source-major row */
    int64_t next[HS_EP_MAX_LOCAL];
    for (int j = 0; j < EL; j++) next[j] = x->off_h[j];
    for (int s = 0; s < ranks; s++)
        for (int j = 0; j < EL; j++) {
            int64_t n = (int64_t)x->recv_h[s * EL + j];
            const char *from = (const char *)src + (size_t)(to_expert ? at : next[j]) * row_bytes;
            char *to = (char *)dst + (size_t)(to_expert ? next[j] : at) * row_bytes;
            hs_dev_copy(p->d.dev, to, from, (size_t)n * row_bytes);
            at += n;
            next[j] += n;
        }
}

/* (send, recv) element counts per rank for rows of `row` elements. */
static void exchange_counts(const hs_parallel *p, int64_t *send, int64_t *recv, int64_t row) {
    int EL = p->d.E / p->l.ep;
    per_rank(send, p->moe.send_h, p->l.ep, EL, row);
    per_rank(recv, p->moe.recv_h, p->l.ep, EL, row);
}

/* The counts sent and received and the offsets the state saved in
 * forward, copied across to the host again for its backward. */
static void fetch_counts(hs_parallel *p, const ep_state *st) {
    hs_ep_moe *x = &p->moe;
    const size_t E = (size_t)p->d.E, EL = E / (size_t)p->l.ep;
    hs_device_copy(p->d.dev, x->send_h, st->send, E * sizeof(float), HS_COPY_D2H);
    hs_device_copy(p->d.dev, x->recv_h, st->recv, E * sizeof(float), HS_COPY_D2H);
    hs_device_copy(p->d.dev, x->off_h, st->off, (EL + 1) * sizeof(int32_t), HS_COPY_D2H);
}

/* The routing's counts go to the experts' ranks (an all-to-all of the
 * device's send into recv); the host sizes the exchange from copies of
 * both, and the state keeps them, with the offsets, for backward. */
static void plan_received(hs_parallel *p, ep_state *st, const int64_t *count) {
    hs_ep_moe *x = &p->moe;
    hs_device *dev = p->d.dev;
    const int E = p->d.E, EL = E / p->l.ep;
    hs_device_copy(dev, x->count_h, count, (size_t)E * sizeof(int64_t), HS_COPY_D2H);
    for (int e = 0; e < E; e++) {
        HS_ASSERT(x->count_h[e] < (1 << 24)); /* exact in the fp32 exchange */
        x->send_h[e] = (float)x->count_h[e];
    }
    hs_device_copy(dev, st->send, x->send_h, (size_t)E * sizeof(float), HS_COPY_H2D);
    hs_ep_all_to_all(p->ep, st->recv, st->send, EL);
    hs_device_copy(dev, x->recv_h, st->recv, (size_t)E * sizeof(float), HS_COPY_D2H);
    x->off_h[0] = 0;
    for (int j = 0; j < EL; j++) {
        int64_t n = 0;
        for (int s = 0; s < p->l.ep; s++) n += (int64_t)x->recv_h[s * EL + j];
        HS_ASSERT(x->off_h[j] + n < INT32_MAX);
        x->off_h[j + 1] = x->off_h[j] + (int32_t)n;
    }
    hs_device_copy(dev, st->off, x->off_h, ((size_t)EL + 1) * sizeof(int32_t), HS_COPY_H2D);
    st->rows = x->off_h[EL];
}

static void experts_fwd(void *ctx, const hs_moe_exchange *io) {
    hs_parallel *p = ctx;
    ep_state *st = io->state;
    hs_ep_moe *x = &p->moe;
    hs_device *dev = p->d.dev;
    const int C = io->C, F = io->F, EL = io->E / p->l.ep;
    const hs_dtype dt = io->dt;
    const size_t es = hs_dtype_size(dt), row_bytes = (size_t)C * es;
    plan_received(p, st, io->count);
    const int64_t R = st->rows;
    int64_t send[HS_EP_MAX_RANKS], recv[HS_EP_MAX_RANKS];
    exchange_counts(p, send, recv, C);
    void *stage = grow_to(p, &x->stage, dev, (size_t)R * row_bytes);
    void *xr = grow_to(p, &st->x, dev, (size_t)R * row_bytes);
    void *y = grow_to(p, &st->y, dev, (size_t)R * row_bytes);
    void *h1 = grow_to(p, &st->h1, dev, (size_t)R * (size_t)F * es);
    void *h3 = grow_to(p, &st->h3, dev, (size_t)R * (size_t)F * es);
    void *a = grow_to(p, &x->a, dev, (size_t)R * (size_t)F * es);
    hs_ep_all_to_allv(p->ep, stage, recv, io->xg, send, dt);
    reorder(p, xr, stage, row_bytes, true);
    hs_moe_rows r = {dev, EL, x->off_h, xr, h1, h3, y, NULL};
    hs_moe_experts_forward(&r, io->w, a, dt, C, F);
    reorder(p, stage, y, row_bytes, false);
    hs_ep_all_to_allv(p->ep, io->y, send, stage, recv, dt);
}

static void experts_bwd(void *ctx, const hs_moe_exchange *io) {
    hs_parallel *p = ctx;
    ep_state *st = io->state;
    hs_ep_moe *x = &p->moe;
    hs_device *dev = p->d.dev;
    const int C = io->C, F = io->F, EL = io->E / p->l.ep;
    const hs_dtype dt = io->dt;
    const size_t row_bytes = (size_t)C * sizeof(float), es = hs_dtype_size(dt);
    const int64_t R = st->rows;
    int64_t send[HS_EP_MAX_RANKS], recv[HS_EP_MAX_RANKS];
    fetch_counts(p, st);
    exchange_counts(p, send, recv, C);
    float *stage = grow_to(p, &x->stage, dev, (size_t)R * row_bytes);
    float *dy = grow_to(p, &x->dy, dev, (size_t)R * row_bytes);
    void *a = grow_to(p, &x->a, dev, (size_t)R * (size_t)F * es);
    float *dh1 = grow_to(p, &x->dh1, dev, (size_t)R * (size_t)F * sizeof(float));
    float *dh3 = grow_to(p, &x->dh3, dev, (size_t)R * (size_t)F * sizeof(float));
    hs_ep_all_to_allv(p->ep, stage, recv, io->dyg, send, HS_DTYPE_F32);
    reorder(p, dy, stage, row_bytes, true);
    hs_moe_rows r = {dev, EL, x->off_h, st->x.p, st->h1.p, st->h3.p, st->y.p, NULL};
    hs_moe_experts_backward(&r, dy, io->gr, io->w, a, dh1, dh3, dt, C, F);
    reorder(p, stage, dy, row_bytes, false);
    hs_ep_all_to_allv(p->ep, io->dyg, send, stage, recv, HS_DTYPE_F32);
}

void hs_ep_moe_fill(hs_model_par *seam) {
    seam->moe_state_new = state_new;
    seam->moe_state_free = state_free;
    seam->moe_experts_fwd = experts_fwd;
    seam->moe_experts_bwd = experts_bwd;
}
