/* Expert parallelism of one MoE layer: the grouped (token, slot) rows of
 * this rank travel to the ranks of their experts, those ranks run their
 * experts on everything they received, and the outputs travel back (the
 * gradients likewise in backward). Counts go first, as an all-to-all of
 * E values (rows for each (rank, local expert)); the rows follow with one
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

#include "model/moe.h"

void *hs_moe_grow_to(hs_moe_grow *g, size_t bytes) {
    if (bytes <= g->bytes && g->p) return g->p;
    HS_ASSERT(g->dev != NULL);
    hs_device_free_mem(g->dev, g->p);
    g->bytes = bytes > HS_ALIGN ? bytes : HS_ALIGN;
    g->p = hs_device_alloc(g->dev, g->bytes);
    return g->p;
}

size_t hs_moe_ep_rows_bytes(const hs_moe_shapes *s, hs_dtype dt, int64_t R, bool per_set) {
    size_t es = hs_dtype_size(dt), C = (size_t)s->C, F = (size_t)s->F, rows = (size_t)R;
    /* forward's x, y (C) and h1, h3 (F) in dt; backward's fp32 stage and dy
     * (C), a in dt and fp32 dh1, dh3 (F) */
    if (per_set) return rows * (2 * C + 2 * F) * es;
    return rows * (2 * C * sizeof(float) + F * (es + 2 * sizeof(float)));
}

void hs_moe_grow_free(hs_moe_grow *g) {
    if (g->dev) hs_device_free_mem(g->dev, g->p);
    g->p = NULL;
    g->bytes = 0;
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
 * expert 0, 1, ...) and expert-major ones (ep_off), by the host's copies of
 * the layer's counts. to_expert: src is source-major. */
static void reorder(void *dst, const void *src, const hs_moe_act *act, size_t row_bytes,
                    bool to_expert) {
    const hs_moe_ep *ep = act->ep;
    const int EL = act->cap.EL, ranks = ep->size;
    int64_t at = 0; /* source-major row */
    int64_t next[HS_MOE_EP_MAX_LOCAL];
    HS_ASSERT(EL <= HS_MOE_EP_MAX_LOCAL);
    for (int j = 0; j < EL; j++) next[j] = ep->off_h[j];
    for (int s = 0; s < ranks; s++)
        for (int j = 0; j < EL; j++) {
            int64_t n = (int64_t)ep->recv_h[s * EL + j];
            const char *from = (const char *)src + (size_t)(to_expert ? at : next[j]) * row_bytes;
            char *to = (char *)dst + (size_t)(to_expert ? next[j] : at) * row_bytes;
            hs_dev_copy(act->dev, to, from, (size_t)n * row_bytes);
            at += n;
            next[j] += n;
        }
}

/* d -> (send, recv) element counts per rank for rows of `row` elements. */
static void exchange_counts(const hs_moe_act *act, int64_t *send, int64_t *recv, int64_t row) {
    per_rank(send, act->ep->send_h, act->ep->size, act->cap.EL, row);
    per_rank(recv, act->ep->recv_h, act->ep->size, act->cap.EL, row);
}

/* The counts sent and received and the offsets act saved in forward,
 * copied across to the host again for its backward. */
static void fetch_counts(const hs_moe_act *act) {
    const hs_moe_ep *ep = act->ep;
    const size_t E = (size_t)act->cap.E;
    hs_device_copy(act->dev, ep->send_h, act->ep_send, E * sizeof(float), HS_COPY_D2H);
    hs_device_copy(act->dev, ep->recv_h, act->ep_recv, E * sizeof(float), HS_COPY_D2H);
    hs_device_copy(act->dev, ep->off_h, act->ep_off, ((size_t)act->cap.EL + 1) * sizeof(int32_t),
                   HS_COPY_D2H);
}

/* The routing's counts go to the experts' ranks (an all-to-all of the
 * device's ep_send into ep_recv); the host sizes the exchange from copies
 * of both, and act keeps them, with the offsets, for backward. */
static void plan_received(hs_moe_act *act) {
    hs_moe_ep *ep = act->ep;
    const int E = act->cap.E, EL = act->cap.EL;
    hs_device_copy(act->dev, ep->count_h, act->count, (size_t)E * sizeof(int64_t), HS_COPY_D2H);
    for (int e = 0; e < E; e++) {
        HS_ASSERT(ep->count_h[e] < (1 << 24)); /* exact in the fp32 exchange */
        ep->send_h[e] = (float)ep->count_h[e];
    }
    hs_device_copy(act->dev, act->ep_send, ep->send_h, (size_t)E * sizeof(float), HS_COPY_H2D);
    ep->ops->ep_all_to_all(ep->ops->ctx, act->ep_recv, act->ep_send, EL);
    hs_device_copy(act->dev, ep->recv_h, act->ep_recv, (size_t)E * sizeof(float), HS_COPY_D2H);
    ep->off_h[0] = 0;
    for (int j = 0; j < EL; j++) {
        int64_t n = 0;
        for (int s = 0; s < ep->size; s++) n += (int64_t)ep->recv_h[s * EL + j];
        HS_ASSERT(ep->off_h[j] + n < INT32_MAX);
        ep->off_h[j + 1] = ep->off_h[j] + (int32_t)n;
    }
    hs_device_copy(act->dev, act->ep_off, ep->off_h, ((size_t)EL + 1) * sizeof(int32_t),
                   HS_COPY_H2D);
    act->ep_rows = ep->off_h[EL];
}

void hs_moe_ep_forward(hs_moe_act *act, const hs_moe_weights *w, const void *xg) {
    hs_moe_ep *ep = act->ep;
    const hs_model_par *ops = ep->ops;
    const int C = act->cap.C, F = act->cap.F;
    const hs_dtype dt = act->dt;
    const size_t es = hs_dtype_size(dt), row_bytes = (size_t)C * es;
    plan_received(act);
    const int64_t R = act->ep_rows;
    int64_t send[HS_MOE_EP_MAX_RANKS], recv[HS_MOE_EP_MAX_RANKS];
    HS_ASSERT(ep->size <= HS_MOE_EP_MAX_RANKS);
    exchange_counts(act, send, recv, C);
    void *stage = hs_moe_grow_to(&ep->stage, (size_t)R * row_bytes);
    void *x = hs_moe_grow_to(&act->ep_x, (size_t)R * row_bytes);
    void *y = hs_moe_grow_to(&act->ep_y, (size_t)R * row_bytes);
    void *h1 = hs_moe_grow_to(&act->ep_h1, (size_t)R * (size_t)F * es);
    void *h3 = hs_moe_grow_to(&act->ep_h3, (size_t)R * (size_t)F * es);
    void *a = hs_moe_grow_to(&ep->a, (size_t)R * (size_t)F * es);
    ops->ep_all_to_allv(ops->ctx, stage, recv, xg, send, dt);
    reorder(x, stage, act, row_bytes, true);
    hs_moe_rows r = {act->dev, act->cap.EL, ep->off_h, x, h1, h3, y};
    hs_moe_experts_forward(&r, w, a, dt, C, F);
    reorder(stage, y, act, row_bytes, false);
    ops->ep_all_to_allv(ops->ctx, act->y, send, stage, recv, dt);
}

void hs_moe_ep_backward(const hs_moe_act *act, const hs_moe_grads *gr, const hs_moe_weights *w,
                        float *dyg) {
    hs_moe_ep *ep = act->ep;
    const hs_model_par *ops = ep->ops;
    const int C = act->cap.C, F = act->cap.F;
    const hs_dtype dt = act->dt;
    const size_t row_bytes = (size_t)C * sizeof(float), es = hs_dtype_size(dt);
    const int64_t R = act->ep_rows;
    int64_t send[HS_MOE_EP_MAX_RANKS], recv[HS_MOE_EP_MAX_RANKS];
    fetch_counts(act);
    exchange_counts(act, send, recv, C);
    float *stage = hs_moe_grow_to(&ep->stage, (size_t)R * row_bytes);
    float *dy = hs_moe_grow_to(&ep->dy, (size_t)R * row_bytes);
    void *a = hs_moe_grow_to(&ep->a, (size_t)R * (size_t)F * es);
    float *dh1 = hs_moe_grow_to(&ep->dh1, (size_t)R * (size_t)F * sizeof(float));
    float *dh3 = hs_moe_grow_to(&ep->dh3, (size_t)R * (size_t)F * sizeof(float));
    ops->ep_all_to_allv(ops->ctx, stage, recv, dyg, send, HS_DTYPE_F32);
    reorder(dy, stage, act, row_bytes, true);
    hs_moe_rows r = {act->dev,     act->cap.EL,  ep->off_h,  act->ep_x.p,
                     act->ep_h1.p, act->ep_h3.p, act->ep_y.p};
    hs_moe_experts_backward(&r, dy, gr, w, a, dh1, dh3, dt, C, F);
    reorder(stage, dy, act, row_bytes, false);
    ops->ep_all_to_allv(ops->ctx, dyg, send, stage, recv, HS_DTYPE_F32);
}

void hs_moe_ep_init(hs_moe_ep *ep, const hs_model_par *ops, int size, int rank, hs_device *dev,
                    int E) {
    hs_moe_grow g = {.dev = dev};
    *ep = (hs_moe_ep){.ops = ops,
                      .size = size,
                      .rank = rank,
                      .dev = dev,
                      .stage = g,
                      .dy = g,
                      .a = g,
                      .dh1 = g,
                      .dh3 = g};
    if (size <= 1) return;
    HS_ASSERT(E >= size && E % size == 0);
    ep->count_h = malloc((size_t)E * sizeof *ep->count_h);
    ep->send_h = malloc((size_t)E * sizeof *ep->send_h);
    ep->recv_h = malloc((size_t)E * sizeof *ep->recv_h);
    ep->off_h = malloc(((size_t)(E / size) + 1) * sizeof *ep->off_h);
    if (!ep->count_h || !ep->send_h || !ep->recv_h || !ep->off_h)
        hs_oom("moe ep: cannot allocate the host copies of %d experts' counts", E);
}

void hs_moe_ep_free(hs_moe_ep *ep) {
    hs_moe_grow_free(&ep->stage);
    hs_moe_grow_free(&ep->dy);
    hs_moe_grow_free(&ep->a);
    hs_moe_grow_free(&ep->dh1);
    hs_moe_grow_free(&ep->dh3);
    free(ep->count_h);
    free(ep->send_h);
    free(ep->recv_h);
    free(ep->off_h);
    ep->count_h = NULL;
    ep->send_h = ep->recv_h = NULL;
    ep->off_h = NULL;
}
