/* RMSNorm as Hugging Face LlamaRMSNorm: statistics in fp32 whatever the
 * storage dtype, out = w * (x * rstd). */
#include <math.h>
#include <stdlib.h>

#include "model/layers.h"

void hs_rmsnorm_forward(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                        const void *w /* C */, hs_dtype dt, int64_t N, int C, float eps) {
    hs_rmsnorm_forward_x(out, rstd, x, dt, w, dt, N, C, eps);
}

static inline __attribute__((always_inline)) void fwd_row(void *out, float *rstd, const void *x,
                                                          hs_dtype xdt, const void *w,
                                                          hs_dtype dt, int64_t n, int C,
                                                          float eps) {
    int64_t o = n * C;
    /* fp64 sum: the mean of C squares is then exact to fp32 rounding. */
    double ss = 0.0;
    for (int i = 0; i < C; i++) {
        float v = hs_ld(x, xdt, o + i);
        ss += (double)v * v;
    }
    float r = 1.0f / sqrtf((float)(ss / C) + eps);
    rstd[n] = r;
    for (int i = 0; i < C; i++)
        hs_st(out, dt, o + i, hs_ld(w, dt, i) * (hs_ld(x, xdt, o + i) * r));
}

/* One row, its loops inlined for the usual dtype pairs so that they
 * vectorise. */
static void fwd_row_any(void *out, float *rstd, const void *x, hs_dtype xdt, const void *w,
                        hs_dtype dt, int64_t n, int C, float eps) {
    if (xdt == HS_DTYPE_F32 && dt == HS_DTYPE_F32)
        fwd_row(out, rstd, x, HS_DTYPE_F32, w, HS_DTYPE_F32, n, C, eps);
    else if (xdt == HS_DTYPE_BF16 && dt == HS_DTYPE_BF16)
        fwd_row(out, rstd, x, HS_DTYPE_BF16, w, HS_DTYPE_BF16, n, C, eps);
    else if (xdt == HS_DTYPE_F32 && dt == HS_DTYPE_BF16)
        fwd_row(out, rstd, x, HS_DTYPE_F32, w, HS_DTYPE_BF16, n, C, eps);
    else
        fwd_row(out, rstd, x, xdt, w, dt, n, C, eps);
}

void hs_rmsnorm_forward_x(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                          hs_dtype xdt, const void *w /* C */, hs_dtype dt, int64_t N, int C,
                          float eps) {
#pragma omp parallel for schedule(static) if (N * C >= HS_PAR_MIN)
    for (int64_t n = 0; n < N; n++) fwd_row_any(out, rstd, x, xdt, w, dt, n, C, eps);
}

/* y_i = w_i x_i r, r = (mean(x^2) + eps)^-1/2, dr/dx_i = -r^3 x_i / C:
 * dx_i = r w_i dy_i - x_i r^3 / C * sum_j(w_j dy_j x_j). */
void hs_rmsnorm_backward(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                         const float *dout /* N,C */, const void *x /* N,C */,
                         const void *w /* C */, const float *rstd /* N */, hs_dtype dt, int64_t N,
                         int C) {
    hs_rmsnorm_backward_x(dx, dw, gdt, dout, x, dt, w, rstd, dt, N, C);
}

void hs_rmsnorm_backward_x(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                           const float *dout /* N,C */, const void *x /* N,C */, hs_dtype xdt,
                           const void *w /* C */, const float *rstd /* N */, hs_dtype dt,
                           int64_t N, int C) {
    /* fp64 column sums for dw, rounded once into dw at the end. */
    double *dwsum = dw ? calloc((size_t)C, sizeof(double)) : NULL;
    if (dw && !dwsum) hs_oom("rmsnorm backward: cannot allocate %d doubles", C);
    for (int64_t n = 0; n < N; n++) {
        int64_t o = n * C;
        const float *dy = dout + o;
        float r = rstd[n];
        double dot = 0.0;
        for (int i = 0; i < C; i++) {
            float xi = hs_ld(x, xdt, o + i);
            dot += (double)hs_ld(w, dt, i) * dy[i] * xi;
            if (dwsum) dwsum[i] += (double)dy[i] * (xi * r);
        }
        float k = (float)(dot * r * r * r / C);
        for (int i = 0; i < C; i++)
            dx[o + i] += r * hs_ld(w, dt, i) * dy[i] - k * hs_ld(x, xdt, o + i);
    }
    if (!dwsum) return;
    for (int i = 0; i < C; i++) hs_acc(dw, gdt, i, (float)dwsum[i]);
    free(dwsum);
}
