/* The model-parallel seam for one device (model.h hs_model_par): every
 * layer whole on this rank, all rows, the whole vocabulary. The model runs
 * through this table when created without one, and parallel/ calls these
 * functions for the layers its plan leaves whole. ctx is the model's
 * hs_model_dims. */
#include "model/layers.h"
#include "model/internal.h"

static bool one_place(void *ctx, hs_param *p, hs_error *e) {
    (void)ctx, (void)p, (void)e;
    return true;
}

static hs_status one_bind(void *ctx, const hs_model_dims *d, hs_model_alloc_fn alloc, void *actx,
                          hs_error *e) {
    (void)ctx, (void)d, (void)alloc, (void)actx, (void)e;
    return HS_OK;
}

static void one_unbind(void *ctx) { (void)ctx; }

static int64_t one_norm_enter(void *ctx, void *full, float *rstd, const void *x, hs_dtype xdt,
                              const void *w, const hs_param *first, int64_t N) {
    const hs_model_dims *d = ctx;
    (void)first;
    d->dev->k->rmsnorm_fwd(d->dev->stream, full, rstd, x, xdt, w, d->dt, N, d->C, d->norm_eps);
    return N;
}

/* The residual folded into the GEMM (beta = 1): one rounding for the sum.
 * rdt differs from odt only when odt is fp32, so the copy is exact. */
static void one_rowwise_add(void *ctx, void *out, hs_dtype odt, const void *resid, hs_dtype rdt,
                            const void *x, const hs_param *w, int64_t N, int IC, int OC) {
    const hs_model_dims *d = ctx;
    hs_dev_convert(d->dev, out, odt, resid, rdt, N * OC);
    hs_linear_forward_to(d->dev, out, odt, x, w->data, d->dt, N, IC, OC, 1);
}

static const float *one_exit_grad(void *ctx, const float *dres, const hs_param *w, int64_t N) {
    (void)ctx, (void)w, (void)N;
    return dres;
}

static const float *one_enter_grad(void *ctx, float *dfull, const hs_param *first, int64_t N) {
    (void)ctx, (void)first, (void)N;
    return dfull;
}

static void one_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const hs_param *w,
                              int64_t N) {
    const hs_model_dims *d = ctx;
    d->dev->k->embedding_fwd(d->dev->stream, out, d->dt, tokens, w->data, d->dt, N, d->C, 0,
                             (int)w->local_shape[0]);
}

static void one_embedding_bwd(void *ctx, const float *dres, const int32_t *tokens, hs_param *w,
                              int64_t N) {
    const hs_model_dims *d = ctx;
    d->dev->k->embedding_bwd(d->dev->stream, w->grad, w->grad_dtype, dres, tokens, N, d->C, 0,
                             (int)w->local_shape[0]);
}

static double one_head_chunk(void *ctx, float *logits, const void *lnf, const hs_param *w,
                             const int32_t *targets, int64_t rows, float scale, bool grad,
                             float *full, hs_dtype round_dt) {
    const hs_model_dims *d = ctx;
    int V = (int)w->local_shape[0];
    hs_linear_forward_to(d->dev, logits, HS_DTYPE_F32, lnf, w->data, d->dt, rows, d->C, V, 0);
    if (round_dt != HS_DTYPE_F32) hs_dev_round(d->dev, logits, round_dt, rows * V);
    double loss = 0.0;
    if (targets)
        loss = hs_dev_xent(d->dev, grad ? logits : NULL, logits, targets, rows, V, scale, NULL);
    if (full) /* the caller's host array */
        hs_device_copy(d->dev, full, logits, (size_t)(rows * V) * sizeof(float), HS_COPY_D2H);
    return loss;
}

static void one_rope_tables(void *ctx, int T_local, const float **cos, const float **sin) {
    const hs_model_dims *d = ctx;
    (void)T_local;
    *cos = d->cos_t, *sin = d->sin_t;
}

/* The whole sequence's rows, within each document under masking. */
static hs_att_rows one_rows(const hs_attn_io *io) {
    hs_att_rows r = hs_att_rows_all(io->T);
    r.lo = io->doc_lo, r.lo_ld = io->doc_ld;
    return r;
}

static void one_attention_fwd(void *ctx, const hs_attn_io *io) {
    const hs_model_dims *d = ctx;
    hs_att_rows r = one_rows(io);
    hs_att_work w = {.scratch = io->scratch, .threads = io->threads};
    d->dev->k->attention_fwd(d->dev->stream, io->out, io->dt, io->lse, io->q, io->k, io->v, io->dt,
                             io->B, io->NH, io->KVH, io->HD, &r, &w);
}

/* dout is rounded once for the 16-bit products, into the model's dout16
 * when it has one. */
static void one_attention_bwd(void *ctx, const hs_attn_io *io) {
    const hs_model_dims *d = ctx;
    int64_t n = (int64_t)io->B * io->T * io->NH * io->HD;
    if (io->dout16) hs_dev_convert(d->dev, io->dout16, io->dt, io->dout, HS_DTYPE_F32, n);
    hs_att_rows r = one_rows(io);
    hs_att_work w = {
        .scratch = io->scratch, .threads = io->threads, .delta = io->delta, .dout16 = io->dout16};
    d->dev->k->attention_bwd(d->dev->stream, io->dq, io->dk, io->dv, io->dout, io->out, io->dt,
                             io->q, io->k, io->v, io->lse, io->dt, io->B, io->NH, io->KVH, io->HD,
                             &r, &w);
}

/* The new rows against the cache: causal over global positions, so row i
 * (position pos + i) sees cache rows [0, pos + i]. */
static void one_attention_cached(void *ctx, const hs_attn_io *io, int pos, int cache_rows) {
    const hs_model_dims *d = ctx;
    hs_att_rows r = {.Tq = io->T,
                     .Tk = cache_rows,
                     .q0 = 0,
                     .nq = io->T,
                     .k0 = 0,
                     .nk = pos + io->T,
                     .gq = pos,
                     .gk = 0};
    hs_att_work w = {.scratch = io->scratch, .threads = io->threads};
    d->dev->k->attention_fwd(d->dev->stream, io->out, io->dt, io->lse, io->q, io->k, io->v, io->dt,
                             io->B, io->NH, io->KVH, io->HD, &r, &w);
}

static const hs_model_par one_device = {
    .row_split = 1,
    .cp_size = 1,
    .ep_size = 1,
    .place = one_place,
    .bind = one_bind,
    .unbind = one_unbind,
    .norm_enter = one_norm_enter,
    .rowwise_add = one_rowwise_add,
    .exit_grad = one_exit_grad,
    .enter_grad = one_enter_grad,
    .embedding_fwd = one_embedding_fwd,
    .embedding_bwd = one_embedding_bwd,
    .head_chunk = one_head_chunk,
    .rope_tables = one_rope_tables,
    .attention_fwd = one_attention_fwd,
    .attention_bwd = one_attention_bwd,
    .attention_cached = one_attention_cached,
};

const hs_model_par *hs_model_one_device_par(void) { return &one_device; }
