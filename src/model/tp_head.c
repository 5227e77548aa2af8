/* The vocab-parallel ends of the model (Megatron's VocabParallelEmbedding
 * and the column-parallel lm_head with its cross-entropy): this TP rank
 * holds vocabulary rows [v0, v0 + V) of the embedding and of the head.
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
#include "model/layers.h"
#include "model/model_internal.h"

void hs_tp_embedding_forward(hs_model *m, const int32_t *tokens, int64_t N) {
    int C = m->C;
    m->k->embedding_fwd(m->s, m->tp_part, HS_DTYPE_F32, tokens, m->embed->data, m->dt, N, C, m->v0,
                        m->V);
    int64_t n = hs_tp_local_rows(m, N) * C;
    float *red = m->sp ? m->tp_red : m->tp_part;
    m->ops->reduce_partial(m->ops->ctx, red, m->tp_part, n);
    hs_dev_convert(m->dev, m->resid[0], m->dt, red, HS_DTYPE_F32, n);
}

void hs_tp_embedding_backward(hs_model *m, const int32_t *tokens, int64_t N) {
    const float *d = hs_tp_exit_grad(m, N);
    m->k->embedding_bwd(m->s, m->embed->grad, m->embed->grad_dtype, d, tokens, N, m->C, m->v0,
                        m->V);
}

/* Local logits [rows, V] of rows [r0, r0 + rows) into m->logits. */
static void local_logits(hs_model *m, int64_t r0, int64_t rows) {
    hs_dev_gemm(m->dev, false, true, rows, m->V, m->C, 1.0f, hs_cat(m->lnf, m->dt, r0 * m->C),
                m->dt, m->C, m->head->data, m->dt, m->C, 0.0f, m->logits, HS_DTYPE_F32, m->V);
    if (hs_model_root_casts(m))
        hs_dev_round(m->dev, m->logits, m->bnd[0].output_stored, rows * m->V);
}

/* All ranks' logits of the chunk as one [rows, Vg] matrix in `dst`. */
static void gather_logits(hs_model *m, float *dst, int64_t rows) {
    float *blocks = m->logits_all;
    m->ops->gather_logits(m->ops->ctx, blocks, m->logits, rows * m->V);
    size_t vb = (size_t)m->V * sizeof(float);
    for (int r = 0; r < m->tp; r++)
        hs_dev_copy_2d(m->dev, dst + (int64_t)r * m->V, (size_t)m->Vg * sizeof(float),
                       blocks + (int64_t)r * rows * m->V, vb, rows, vb);
}

/* The gathered [rows, Vg] logits are assembled in the model's own buffer;
 * `full`, where given, is the caller's host buffer and gets a copy. */
static double gathered_loss(hs_model *m, const int32_t *targets, int64_t rows, float scale,
                            bool grad, float *full) {
    float *all = m->logits_all + m->head_rows * m->Vg;
    gather_logits(m, all, rows);
    if (full)
        hs_device_copy(m->dev, full, all, (size_t)(rows * m->Vg) * sizeof(float), HS_COPY_D2H);
    if (!targets) return 0.0;
    double loss = hs_dev_xent(m->dev, grad ? all : NULL, all, targets, rows, m->Vg, scale, NULL);
    if (grad)
        hs_dev_copy_2d(m->dev, m->logits, (size_t)m->V * sizeof(float), all + m->v0,
                       (size_t)m->Vg * sizeof(float), rows, (size_t)m->V * sizeof(float));
    return loss;
}

static double parallel_loss(hs_model *m, const int32_t *targets, int64_t rows, float scale,
                            bool grad) {
    int V = m->V;
    float *mx = m->tp_stats, *sum = mx + rows, *tl = sum + rows;
    m->k->xent_shard_max(m->s, mx, m->logits, rows, V);
    m->ops->all_reduce_max(m->ops->ctx, mx, rows);
    m->k->xent_shard_sums(m->s, sum, tl, m->logits, mx, targets, rows, V, m->v0);
    m->ops->all_reduce_sum(m->ops->ctx, sum, 2 * rows); /* sum and tl together */
    double loss = 0.0;
    m->k->xent_shard_loss(m->s, &loss, mx, sum, tl, targets, rows);
    if (grad) m->k->xent_shard_grad(m->s, m->logits, mx, sum, targets, rows, V, m->v0, scale);
    return loss;
}

double hs_tp_head_chunk(hs_model *m, const int32_t *targets, int64_t r0, int64_t rows, float scale,
                        bool grad, float *full) {
    local_logits(m, r0, rows);
    const int32_t *tg = targets ? targets + r0 : NULL;
    if (full || !m->ops->loss_parallel) return gathered_loss(m, tg, rows, scale, grad, full);
    return tg ? parallel_loss(m, tg, rows, scale, grad) : 0.0;
}
