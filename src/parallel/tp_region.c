/* The tensor-parallel regions behind the model's seam (Megatron's f and g,
 * with sequence parallelism as a flag, not a second code path):
 *
 *   norm -> [enter] -> column-parallel GEMMs ... row-parallel GEMM -> [exit] + residual
 *
 *   enter forward:  identity, or all-gather of the local rows (SP)
 *   enter backward: all-reduce of the partial input gradient, or reduce-scatter (SP)
 *   exit forward:   all-reduce of the partial output, or reduce-scatter (SP)
 *   exit backward:  identity, or all-gather of the local rows' gradient (SP)
 *
 * Each call is told the style of its layer by the parameter's placement:
 * a region opened by a column-parallel linear is split; one opened by a
 * whole linear is token-wise and runs on the rows this rank holds, as one
 * device would (model/local.c). The vocabulary ends are Megatron's
 * VocabParallelEmbedding and the column-parallel lm_head with its
 * cross-entropy: this rank holds vocabulary rows [v0, v0 + V).
 *
 * Embedding: each rank writes the rows of the tokens it holds and zeros,
 * and the partial sums are all-reduced (reduce-scattered under sequence
 * parallel): one term per element is non-zero, so the result is exact.
 * Loss (loss_parallel): per row, the max over the vocabulary is an
 * all-reduce MAX of the local maxima, the sum of exponentials and the
 * target logit an all-reduce SUM; the logits are never gathered and the
 * gradient softmax - onehot is formed on the local columns. Without
 * loss_parallel the [rows, V] logits are gathered and the one-device
 * cross-entropy runs on them; both give the same numbers. */
#include "parallel/par_internal.h"

static const hs_model_par *one(void) { return hs_model_one_device_par(); }

static bool split_cols(const hs_param *w) {
    return w->on_tp_mesh && w->tp.kind == HS_PLACEMENT_SHARD && w->tp.dim == 0;
}

static bool split_rows(const hs_param *w) {
    return w->on_tp_mesh && w->tp.kind == HS_PLACEMENT_SHARD && w->tp.dim == 1;
}

/* The seam's row split (parallel.c seam_fill) says whether sequence
 * parallelism is on: one place decides it. */
static bool sp(const hs_parallel *p) { return p->seam.row_split > 1; }

static int64_t local_rows(const hs_parallel *p, int64_t N) { return N / p->seam.row_split; }

static int64_t tp_norm_enter(void *ctx, void *full, float *rstd, const void *x, hs_dtype xdt,
                             const void *w, const hs_param *first, int64_t N) {
    hs_parallel *p = ctx;
    int64_t Nl = local_rows(p, N);
    bool gather = sp(p) && split_cols(first);
    void *dst = gather ? p->b.local_ln : full;
    one()->norm_enter(&p->d, dst, rstd, x, xdt, w, first, Nl);
    if (!gather) return Nl;
    hs_tp_gather(p->tp, full, dst, Nl * p->d.C, p->d.dt);
    return N;
}

static void tp_rowwise_add(void *ctx, void *out, hs_dtype odt, const void *resid, hs_dtype rdt,
                           const void *x, const hs_param *w, int64_t N, int IC, int OC) {
    hs_parallel *p = ctx;
    if (!split_rows(w)) { /* a whole region: its rows are the rank's own */
        one()->rowwise_add(&p->d, out, odt, resid, rdt, x, w, N, IC, OC);
        return;
    }
    hs_dev_gemm(p->d.dev, false, true, N, OC, IC, 1.0f, x, p->d.dt, IC, w->data, p->d.dt, IC, 0.0f,
                p->b.part, HS_DTYPE_F32, OC);
    int64_t n = local_rows(p, N) * OC;
    float *red = sp(p) ? p->b.red : p->b.part;
    hs_tp_reduce_partial(p->tp, red, p->b.part, n);
    hs_dev_add_cast(p->d.dev, out, odt, resid, rdt, red, HS_DTYPE_F32, n);
}

/* The gradient of all N rows from the local rows' (sequence parallel). */
static const float *gather_grad(hs_parallel *p, const float *dres, int64_t N) {
    if (!sp(p)) return dres;
    int64_t Nl = local_rows(p, N);
    hs_tp_gather(p->tp, p->b.dfull, dres, Nl * p->d.C, HS_DTYPE_F32);
    return p->b.dfull;
}

static const float *tp_exit_grad(void *ctx, const float *dres, const hs_param *w, int64_t N) {
    hs_parallel *p = ctx;
    return split_rows(w) ? gather_grad(p, dres, N) : dres;
}

static const float *tp_enter_grad(void *ctx, float *dfull, const hs_param *first, int64_t N) {
    hs_parallel *p = ctx;
    if (!split_cols(first)) return dfull;
    float *local = sp(p) ? p->b.red : dfull;
    hs_tp_reduce_partial(p->tp, local, dfull, local_rows(p, N) * p->d.C);
    return local;
}

static void tp_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const hs_param *w,
                             int64_t N) {
    hs_parallel *p = ctx;
    int C = p->d.C;
    if (!split_cols(w)) { /* whole: token-wise on the rank's rows */
        int64_t r0 = sp(p) ? p->l.tp_rank * local_rows(p, N) : 0;
        one()->embedding_fwd(&p->d, out, tokens + r0, w, local_rows(p, N));
        return;
    }
    p->d.dev->k->embedding_fwd(p->d.dev->stream, p->b.part, HS_DTYPE_F32, tokens, w->data, p->d.dt,
                               N, C, w->local_offset[0], (int)w->local_shape[0]);
    int64_t n = local_rows(p, N) * C;
    float *red = sp(p) ? p->b.red : p->b.part;
    hs_tp_reduce_partial(p->tp, red, p->b.part, n);
    hs_dev_convert(p->d.dev, out, p->d.dt, red, HS_DTYPE_F32, n);
}

static void tp_embedding_bwd(void *ctx, const float *dres, const int32_t *tokens, hs_param *w,
                             int64_t N) {
    hs_parallel *p = ctx;
    if (!split_cols(w)) {
        int64_t r0 = sp(p) ? p->l.tp_rank * local_rows(p, N) : 0;
        one()->embedding_bwd(&p->d, dres, tokens + r0, w, local_rows(p, N));
        return;
    }
    const float *d = gather_grad(p, dres, N);
    p->d.dev->k->embedding_bwd(p->d.dev->stream, w->grad, w->grad_dtype, d, tokens, N, p->d.C,
                               w->local_offset[0], (int)w->local_shape[0]);
}

/* Every rank's [rows, V] logits as one [rows, Vg] matrix in `dst`. */
static void gather_logits(hs_parallel *p, float *dst, const float *logits, int64_t rows, int V) {
    float *blocks = p->b.logits;
    hs_tp_gather(p->tp, blocks, logits, rows * V, HS_DTYPE_F32);
    size_t vb = (size_t)V * sizeof(float);
    for (int r = 0; r < p->l.tp; r++)
        hs_dev_copy_2d(p->d.dev, dst + (int64_t)r * V, (size_t)p->d.Vg * sizeof(float),
                       blocks + (int64_t)r * rows * V, vb, rows, vb);
}

/* The gathered [rows, Vg] logits are assembled in the seam's own buffer;
 * `full`, where given, is the caller's host buffer and gets a copy. */
static double gathered_loss(hs_parallel *p, float *logits, const hs_param *w,
                            const int32_t *targets, int64_t rows, float scale, bool grad,
                            float *full) {
    int V = (int)w->local_shape[0], Vg = p->d.Vg;
    float *all = p->b.logits + p->d.head_rows * Vg;
    gather_logits(p, all, logits, rows, V);
    if (full) hs_device_copy(p->d.dev, full, all, (size_t)(rows * Vg) * sizeof(float), HS_COPY_D2H);
    if (!targets) return 0.0;
    double loss = hs_dev_xent(p->d.dev, grad ? all : NULL, all, targets, rows, Vg, scale, NULL);
    if (grad)
        hs_dev_copy_2d(p->d.dev, logits, (size_t)V * sizeof(float), all + w->local_offset[0],
                       (size_t)Vg * sizeof(float), rows, (size_t)V * sizeof(float));
    return loss;
}

static double parallel_loss(hs_parallel *p, float *logits, const hs_param *w,
                            const int32_t *targets, int64_t rows, float scale, bool grad) {
    const hs_device_kernels *k = p->d.dev->k;
    hs_stream *s = p->d.dev->stream;
    int V = (int)w->local_shape[0];
    int64_t v0 = w->local_offset[0];
    float *mx = p->b.stats, *sum = mx + rows, *tl = sum + rows;
    k->xent_shard_max(s, mx, logits, rows, V);
    hs_tp_all_reduce(p->tp, mx, rows, HS_REDUCE_MAX);
    k->xent_shard_sums(s, sum, tl, logits, mx, targets, rows, V, v0);
    hs_tp_all_reduce(p->tp, sum, 2 * rows, HS_REDUCE_SUM); /* sum and tl together */
    double loss = 0.0;
    k->xent_shard_loss(s, &loss, mx, sum, tl, targets, rows);
    if (grad) k->xent_shard_grad(s, logits, mx, sum, targets, rows, V, v0, scale);
    return loss;
}

static double tp_head_chunk(void *ctx, float *logits, const void *lnf, const hs_param *w,
                            const int32_t *targets, int64_t rows, float scale, bool grad,
                            float *full, hs_dtype round_dt) {
    hs_parallel *p = ctx;
    if (!split_cols(w))
        return one()->head_chunk(&p->d, logits, lnf, w, targets, rows, scale, grad, full, round_dt);
    int V = (int)w->local_shape[0];
    hs_dev_gemm(p->d.dev, false, true, rows, V, p->d.C, 1.0f, lnf, p->d.dt, p->d.C, w->data,
                p->d.dt, p->d.C, 0.0f, logits, HS_DTYPE_F32, V);
    if (round_dt != HS_DTYPE_F32) hs_dev_round(p->d.dev, logits, round_dt, rows * V);
    if (full || !p->l.loss_parallel)
        return gathered_loss(p, logits, w, targets, rows, scale, grad, full);
    return targets ? parallel_loss(p, logits, w, targets, rows, scale, grad) : 0.0;
}

void hs_tp_region_fill(hs_model_par *seam) {
    seam->norm_enter = tp_norm_enter;
    seam->rowwise_add = tp_rowwise_add;
    seam->exit_grad = tp_exit_grad;
    seam->enter_grad = tp_enter_grad;
    seam->embedding_fwd = tp_embedding_fwd;
    seam->embedding_bwd = tp_embedding_bwd;
    seam->head_chunk = tp_head_chunk;
}
