/* Deterministic, shard-independent initialisation: element j of a
 * parameter is normal(0, init_std) drawn at counter j of the Philox stream
 * hs_hash64(FQN), so any dim-0 slice can be initialised alone. */

#include "model/internal.h"

#define INIT_CHUNK (1 << 16)

static int64_t local_row_numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 1; d < p->ndim; d++) n *= p->local_shape[d];
    return n;
}

/* Elements [first, first + n) of the global tensor, normal or ones, drawn
 * by the device into buf (INIT_CHUNK fp32 values of its memory) and cast. */
static void init_span(hs_device *d, const hs_param *p, uint64_t seed, uint64_t stream,
                      int64_t first, int64_t n, char *dst, hs_dtype dt, float *buf) {
    for (int64_t i = 0; i < n; i += INIT_CHUNK) {
        int64_t k = n - i < INIT_CHUNK ? n - i : INIT_CHUNK;
        if (p->kind == HS_PARAM_NORM || p->kind == HS_PARAM_BIAS)
            hs_dev_fill(d, buf, k, p->kind == HS_PARAM_NORM ? 1.0f : 0.0f);
        else hs_dev_rng_normal(d, buf, k, seed, stream, first + i, 0.0f, p->init_std);
        hs_dev_convert(d, dst + (size_t)i * hs_dtype_size(dt), dt, buf, HS_DTYPE_F32, k);
    }
}

/* A TP-local tensor is a box of the global one: rows from local_offset[0]
 * on, and in each row the local_shape[1..] slice at local_offset[1..].
 * Only dims 0 and 1 are ever split, so a local row is contiguous in the
 * global tensor unless dim 1 is split, when each of its dim-1 slices is. */
void hs_model_init_param_rows(const hs_model *m, const hs_param *p, uint64_t seed, void *dst,
                              hs_dtype dt, int64_t row_start, int64_t rows) {
    HS_ASSERT(row_start >= 0 && rows >= 0 && row_start + rows <= p->local_shape[0]);
    int64_t lrn = local_row_numel(p), grn = 1, inner = 1;
    if (m->opt.weights_from_file) {
        hs_dev_zero(m->dev, dst, (size_t)(rows * lrn) * hs_dtype_size(dt));
        return;
    }
    uint64_t stream = hs_hash64(p->fqn);
    for (int d = 1; d < p->ndim; d++) grn *= p->shape[d];
    for (int d = 2; d < p->ndim; d++) inner *= p->shape[d];
    bool col_split = p->ndim > 1 && p->local_shape[1] != p->shape[1];
    int64_t g0 = p->local_offset[0] + row_start;
    float *buf = hs_device_alloc(m->dev, INIT_CHUNK * sizeof(float));
    if (!buf) return; /* refused: the device keeps it, and whoever builds the model checks it */
    size_t es = hs_dtype_size(dt);
    if (!col_split) init_span(m->dev, p, seed, stream, g0 * grn, rows * lrn, dst, dt, buf);
    else
        for (int64_t r = 0; r < rows; r++)
            init_span(m->dev, p, seed, stream, (g0 + r) * grn + p->local_offset[1] * inner, lrn,
                      (char *)dst + (size_t)(r * lrn) * es, dt, buf);
    hs_device_free_mem(m->dev, buf);
}

void hs_model_init_weights(hs_model *m, uint64_t seed) {
    /* Weights from a file: the load that follows writes every element of
     * every parameter (a missing or mis-shaped tensor fails it), so nothing
     * is drawn or zeroed first. */
    for (int i = 0; i < m->n_params && !m->opt.weights_from_file; i++) {
        hs_param *p = &m->params[i];
        if (p->data) hs_model_init_param_rows(m, p, seed, p->data, m->dt, 0, p->local_shape[0]);
    }
    hs_model_zero_grads(m);
}

void hs_model_freeze(hs_model *m, int i) {
    hs_param *p = hs_model_param(m, i);
    p->frozen = true;
    if (m->opt.allocate_params) hs_device_free_mem(m->dev, p->grad);
    p->grad = NULL;
}

void hs_model_zero_grads(hs_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        hs_param *p = &m->params[i];
        int64_t n = hs_param_local_numel(p);
        if (p->grad) hs_dev_zero(m->dev, p->grad, (size_t)n * hs_dtype_size(p->grad_dtype));
        p->grad_unset = false;
    }
}

void hs_model_unset_grads(hs_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        hs_param *p = &m->params[i];
        if (!p->grad) continue;
        if (p->grad_first_store) p->grad_unset = true;
        else
            hs_dev_zero(m->dev, p->grad,
                        (size_t)hs_param_local_numel(p) * hs_dtype_size(p->grad_dtype));
    }
}

void hs_param_grad_settle(hs_device *d, hs_param *p) {
    if (!p->grad_unset) return;
    if (p->grad)
        hs_dev_zero(d, p->grad, (size_t)hs_param_local_numel(p) * hs_dtype_size(p->grad_dtype));
    p->grad_unset = false;
}
