/* Deterministic, shard-independent initialisation: element j of a
 * parameter is normal(0, init_std) drawn at counter j of the Philox stream
 * hs_hash64(FQN), so any dim-0 slice can be initialised alone. */
#include <string.h>

#include "model/model_internal.h"

#define INIT_CHUNK 4096

static int64_t row_numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 1; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

void hs_model_init_param_rows(const hs_model *m, const hs_param *p, uint64_t seed, void *dst,
                              hs_dtype dt, int64_t row_start, int64_t rows) {
    (void)m;
    HS_ASSERT(row_start >= 0 && rows >= 0 && row_start + rows <= p->shape[0]);
    int64_t rn = row_numel(p), n = rows * rn, first = row_start * rn;
    uint64_t stream = hs_hash64(p->fqn);
    float buf[INIT_CHUNK];
    for (int64_t i = 0; i < n; i += INIT_CHUNK) {
        int64_t k = n - i < INIT_CHUNK ? n - i : INIT_CHUNK;
        if (p->kind == HS_PARAM_NORM)
            hs_fill_f32(buf, k, 1.0f);
        else
            hs_rng_fill_normal(buf, k, seed, stream, first + i, 0.0f, p->init_std);
        hs_convert((char *)dst + (size_t)i * hs_dtype_size(dt), dt, buf, HS_DTYPE_F32, k);
    }
}

void hs_model_init_weights(hs_model *m, uint64_t seed) {
    for (int i = 0; i < m->n_params; i++) {
        hs_param *p = &m->params[i];
        if (p->data) hs_model_init_param_rows(m, p, seed, p->data, m->dt, 0, p->shape[0]);
    }
    hs_model_zero_grads(m);
}

void hs_model_zero_grads(hs_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        hs_param *p = &m->params[i];
        int64_t n = p->shape[0] * row_numel(p);
        if (p->grad) memset(p->grad, 0, (size_t)n * hs_dtype_size(p->grad_dtype));
    }
}
