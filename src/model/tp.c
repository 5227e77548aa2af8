/* The tensor-parallel regions of a block (Megatron's f and g, with
 * sequence parallelism as a flag, not a second code path):
 *
 *   norm -> [enter] -> column-parallel GEMMs ... row-parallel GEMM -> [exit] + residual
 *
 *   enter forward:  identity, or all-gather of the local rows (SP)
 *   enter backward: all-reduce of the partial input gradient, or reduce-scatter (SP)
 *   exit forward:   all-reduce of the partial output, or reduce-scatter (SP)
 *   exit backward:  identity, or all-gather of the local rows' gradient (SP)
 *
 * Every collective goes through the model's ops table; without ops these
 * functions are the one-device path. */
#include "model/layers.h"
#include "model/model_internal.h"

int64_t hs_tp_local_rows(const hs_model *m, int64_t N) { return m->sp ? N / m->tp : N; }

void hs_tp_norm_enter(hs_model *m, void *full, float *rstd, const void *x, hs_dtype xdt,
                      const void *w, int64_t N) {
    int64_t Nl = hs_tp_local_rows(m, N);
    void *local = m->sp ? m->sp_ln : full;
    m->k->rmsnorm_fwd(m->s, local, rstd, x, xdt, w, m->dt, Nl, m->C, (float)m->cfg.norm_eps);
    if (m->sp) m->ops->sp_all_gather(m->ops->ctx, full, local, Nl * m->C, m->dt);
}

void hs_tp_exit_add(hs_model *m, void *out, hs_dtype odt, const void *resid, hs_dtype rdt,
                    int64_t N) {
    int64_t n = hs_tp_local_rows(m, N) * m->C;
    float *red = m->sp ? m->tp_red : m->tp_part;
    m->ops->reduce_partial(m->ops->ctx, red, m->tp_part, n);
    hs_dev_add_cast(m->dev, out, odt, resid, rdt, red, HS_DTYPE_F32, n);
}

const float *hs_tp_exit_grad(hs_model *m, int64_t N) {
    if (!m->sp) return m->dres;
    int64_t Nl = hs_tp_local_rows(m, N);
    m->ops->sp_all_gather_grad(m->ops->ctx, m->sp_dfull, m->dres, Nl * m->C);
    return m->sp_dfull;
}

const float *hs_tp_enter_grad(hs_model *m, float *dfull, int64_t N) {
    if (!m->tp_on) return dfull;
    float *local = m->sp ? m->tp_red : dfull;
    m->ops->reduce_partial(m->ops->ctx, local, dfull, hs_tp_local_rows(m, N) * m->C);
    return local;
}
