/* The input and weight gradients of a block's dense linears and norms,
 * which the block (block.c) and its attention variants (mla.c) share:
 * the weight gradient stored over while its buffer holds no value yet,
 * added to after, and in layout mode taken per sequence in a fixed tree
 * (canon.c). */
#include "model/internal.h"
#include "model/layers.h"

void hs_block_dense_backward_dy(hs_model *m, float *dx, bool overwrite_dx, hs_param *w,
                                const void *dy, hs_dtype ydt, const void *x, int64_t N, int IC,
                                int OC) {
    if (m->canon_nseq && w->grad) {
        hs_linear_backward_dy(m->dev, dx, overwrite_dx, NULL, false, w->grad_dtype, dy, ydt, x,
                              w->data, m->dt, N, IC, OC);
        hs_canon_linear_wgrad(m, w, dy, ydt, x, N, IC, OC);
        return;
    }
    bool store = w->grad && w->grad_unset;
    hs_linear_backward_dy(m->dev, dx, overwrite_dx, w->grad, store, w->grad_dtype, dy, ydt, x,
                          w->data, m->dt, N, IC, OC);
    if (w->grad) w->grad_unset = false;
}

void hs_block_linear_backward(hs_model *m, float *dx, bool overwrite_dx, hs_param *w,
                              const float *dout, const void *x, int64_t N, int IC, int OC) {
    hs_dtype ydt;
    const void *dy = hs_linear_dout(m->dev, dout, m->dout16, m->dt, N * OC, &ydt);
    hs_block_dense_backward_dy(m, dx, overwrite_dx, w, dy, ydt, x, N, IC, OC);
}

void hs_block_norm_backward(hs_model *m, float *dx, hs_param *w, const float *dout, const void *x,
                            hs_dtype xdt, const float *rstd, int64_t rows, int C) {
    if (m->canon_nseq) hs_canon_rmsnorm_bwd(m, dx, w, dout, x, xdt, rstd, rows, C);
    else
        m->k->rmsnorm_bwd(m->s, dx, w->grad, w->grad_dtype, dout, x, xdt, w->data, rstd, m->dt,
                          rows, C, m->norm_part);
}
