/* RMSNorm as Hugging Face LlamaRMSNorm: statistics in fp32 whatever the
 * storage dtype, out = w * (x * rstd). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu.h"
#include "device/device_backend.h"

void hs_rmsnorm_forward(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                        const void *w /* C */, hs_dtype dt, int64_t N, int C, float eps) {
    hs_rmsnorm_forward_x(out, rstd, x, dt, w, dt, N, C, eps);
}

static inline __attribute__((always_inline)) void fwd_row(void *out, float *rstd, const void *x,
                                                          hs_dtype xdt, const void *w, hs_dtype dt,
                                                          int64_t n, int C, float eps) {
    int64_t o = n * C;
    /* fp64 sum: the mean of C squares is then exact to fp32 rounding;
     * HS_LANES chains so that it vectorises. */
    double acc[HS_LANES] = {0.0}, ss = 0.0;
    int i = 0;
    for (; i + HS_LANES <= C; i += HS_LANES)
        for (int j = 0; j < HS_LANES; j++) {
            float v = hs_ld(x, xdt, o + i + j);
            acc[j] += (double)v * v;
        }
    for (; i < C; i++) {
        float v = hs_ld(x, xdt, o + i);
        ss += (double)v * v;
    }
    for (int j = 0; j < HS_LANES; j++) ss += acc[j];
    float r = 1.0f / sqrtf((float)(ss / C) + eps);
    rstd[n] = r;
    for (int c = 0; c < C; c++) hs_st(out, dt, o + c, hs_ld(w, dt, c) * (hs_ld(x, xdt, o + c) * r));
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
    else fwd_row(out, rstd, x, xdt, w, dt, n, C, eps);
}

void hs_rmsnorm_forward_x(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                          hs_dtype xdt, const void *w /* C */, hs_dtype dt, int64_t N, int C,
                          float eps) {
#pragma omp parallel for schedule(static) if (N * C >= HS_PAR_MIN)
    for (int64_t n = 0; n < N; n++) fwd_row_any(out, rstd, x, xdt, w, dt, n, C, eps);
}

/* y_i = w_i x_i r, r = (mean(x^2) + eps)^-1/2, dr/dx_i = -r^3 x_i / C:
 * dx_i = r w_i dy_i - x_i r^3 / C * sum_j(w_j dy_j x_j). */
/* With dw's partial sums in a scratch of its own. */
static hs_status backward_own_scratch(float *dx, void *dw, hs_dtype gdt, const float *dout,
                                      const void *x, hs_dtype xdt, const void *w, const float *rstd,
                                      hs_dtype dt, int64_t N, int C, hs_error *e) {
    double *part = NULL;
    if (dw) {
        size_t bytes = (size_t)hs_rmsnorm_backward_scratch(N, C) * sizeof(double);
        part = malloc(bytes);
        if (!part)
            return hs_error_oom(e, "rmsnorm backward: %zu bytes of partial sums for %lld rows",
                                bytes, (long long)N);
    }
    hs_rmsnorm_backward_x(dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, part);
    free(part);
    return HS_OK;
}

hs_status hs_rmsnorm_backward(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                              const float *dout /* N,C */, const void *x /* N,C */,
                              const void *w /* C */, const float *rstd /* N */, hs_dtype dt,
                              int64_t N, int C, hs_error *e) {
    return backward_own_scratch(dx, dw, gdt, dout, x, dt, w, rstd, dt, N, C, e);
}

void hs_cpu_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                        const void *w, hs_dtype dt, int64_t N, int C, float eps) {
    hs_rmsnorm_forward_x(out, rstd, x, xdt, w, dt, N, C, eps);
}

/* With the caller's workspace for dw's partial sums, or its own. */
void hs_cpu_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                        const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                        int64_t N, int C, double *ws) {
    if (ws || !dw) {
        hs_rmsnorm_backward_x(dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, ws);
        return;
    }
    hs_error e;
    hs_error_clear(&e);
    if (backward_own_scratch(dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, &e) != HS_OK)
        hs_device_fail(s->dev, &e);
}

/* Rows per backward chunk: the chunks go over the threads, each with its
 * own fp64 partial dw sums, added in chunk order, so dw does not depend on
 * the thread count. */
#define BWD_ROWS 32

int64_t hs_rmsnorm_backward_scratch(int64_t N, int C) { return (N + BWD_ROWS - 1) / BWD_ROWS * C; }

static inline __attribute__((always_inline)) void
bwd_rows(float *dx, double *dwsum, const float *dout, const void *x, hs_dtype xdt, const void *w,
         hs_dtype dt, const float *rstd, int64_t n0, int64_t n1, int C) {
    for (int64_t n = n0; n < n1; n++) {
        int64_t o = n * C;
        const float *dy = dout + o;
        float r = rstd[n];
        /* sum_j w_j dy_j x_j in fp64, HS_LANES chains so that it vectorises */
        double acc[HS_LANES] = {0.0}, dot = 0.0;
        int i = 0;
        for (; i + HS_LANES <= C; i += HS_LANES)
            for (int j = 0; j < HS_LANES; j++)
                acc[j] += (double)hs_ld(w, dt, i + j) * dy[i + j] * hs_ld(x, xdt, o + i + j);
        for (; i < C; i++) dot += (double)hs_ld(w, dt, i) * dy[i] * hs_ld(x, xdt, o + i);
        for (int j = 0; j < HS_LANES; j++) dot += acc[j];
        if (dwsum)
            for (int c = 0; c < C; c++) dwsum[c] += (double)dy[c] * (hs_ld(x, xdt, o + c) * r);
        float k = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++)
            dx[o + c] += r * hs_ld(w, dt, c) * dy[c] - k * hs_ld(x, xdt, o + c);
    }
}

static void bwd_rows_any(float *dx, double *dwsum, const float *dout, const void *x, hs_dtype xdt,
                         const void *w, hs_dtype dt, const float *rstd, int64_t n0, int64_t n1,
                         int C) {
    if (xdt == HS_DTYPE_F32 && dt == HS_DTYPE_F32)
        bwd_rows(dx, dwsum, dout, x, HS_DTYPE_F32, w, HS_DTYPE_F32, rstd, n0, n1, C);
    else if (xdt == HS_DTYPE_BF16 && dt == HS_DTYPE_BF16)
        bwd_rows(dx, dwsum, dout, x, HS_DTYPE_BF16, w, HS_DTYPE_BF16, rstd, n0, n1, C);
    else if (xdt == HS_DTYPE_F32 && dt == HS_DTYPE_BF16)
        bwd_rows(dx, dwsum, dout, x, HS_DTYPE_F32, w, HS_DTYPE_BF16, rstd, n0, n1, C);
    else bwd_rows(dx, dwsum, dout, x, xdt, w, dt, rstd, n0, n1, C);
}

void hs_rmsnorm_backward_x(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                           const float *dout /* N,C */, const void *x /* N,C */, hs_dtype xdt,
                           const void *w /* C */, const float *rstd /* N */, hs_dtype dt, int64_t N,
                           int C, double *part) {
    int64_t chunks = (N + BWD_ROWS - 1) / BWD_ROWS;
    /* fp64 column sums for dw, one row of C per chunk, rounded once into
     * dw at the end. */
    if (!dw) part = NULL;
    HS_ASSERT(!dw || part);
    if (part) memset(part, 0, (size_t)(chunks * C) * sizeof(double));
#pragma omp parallel for schedule(static) if (N * C >= HS_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = c * BWD_ROWS, n1 = n0 + BWD_ROWS < N ? n0 + BWD_ROWS : N;
        bwd_rows_any(dx, part ? part + c * C : NULL, dout, x, xdt, w, dt, rstd, n0, n1, C);
    }
    if (!part || chunks == 0) return; /* no rows: dw += 0, and part has no row to read */
    for (int64_t c = 1; c < chunks; c++)
        for (int i = 0; i < C; i++) part[i] += part[c * C + i];
    for (int i = 0; i < C; i++) hs_acc(dw, gdt, i, (float)part[i]);
}
