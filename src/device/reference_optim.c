/* Reference AdamW and Muon pieces and the in-place scaling of 16-bit data,
 * in fp64 with each state rounded once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_backend.h"
#include "device/reference.h"

/* p is read and stored in pdt: a 16-bit parameter's one rounding is the
 * store's. */
void hs_ref_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        m[i] = (float)((double)h->beta1 * m[i] + (double)h->one_minus_beta1 * g[i]);
        v[i] = (float)((double)h->beta2 * v[i] + (double)h->one_minus_beta2 * g[i] * g[i]);
        double denom = sqrt((double)v[i]) / h->bias2_sqrt + h->eps;
        double pi = hs_ld(p, pdt, i);
        hs_st(p, pdt, i, (float)(pi * h->decay_factor - (double)h->step_size * m[i] / denom));
    }
}

void hs_ref_adamw_many(hs_stream *s, const hs_adamw_tensor *t, int count,
                       const hs_adamw_hparams *h) {
    hs_adamw_many_each(s, t, count, h, hs_device_reference_kernels());
}

void hs_ref_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                        float step, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        hs_st(p, pdt, i, (float)((double)hs_ld(p, pdt, i) * decay_factor - (double)step * u[i]));
}

void hs_ref_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) hs_st(x, dt, i, (float)((double)a * hs_ld(x, dt, i)));
}

void hs_ref_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        buf[i] = (float)((double)mu * buf[i] + g[i]);
        dir[i] = nesterov ? (float)(g[i] + (double)mu * buf[i]) : buf[i];
    }
}

/* x (n x m, n <= m) <- a x + (b A + c A^2) x, A = x x^T, in fp64. */
static void ns_step(double *x, double *A, double *A2, double *y, int64_t n, int64_t m) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            A[i * n + j] = 0.0;
            for (int64_t k = 0; k < m; k++) A[i * n + j] += x[i * m + k] * x[j * m + k];
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double a2 = 0.0;
            for (int64_t k = 0; k < n; k++) a2 += A[i * n + k] * A[k * n + j];
            A2[i * n + j] = -4.7750 * A[i * n + j] + 2.0315 * a2;
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double acc = 3.4445 * x[i * m + j];
            for (int64_t k = 0; k < n; k++) acc += A2[i * n + k] * x[k * m + j];
            y[i * m + j] = acc;
        }
    memcpy(x, y, (size_t)(n * m) * sizeof *x);
}

void hs_ref_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols,
                               int steps, float *ws) {
    bool tall = rows > cols;
    int64_t n = tall ? cols : rows, m = tall ? rows : cols;
    double *x = malloc((size_t)(2 * n * m + 2 * n * n) * sizeof *x);
    if (x == NULL) {
        hs_kernel_oom(s, "reference Newton-Schulz: %zu bytes for a %lldx%lld matrix",
                      (size_t)(2 * n * m + 2 * n * n) * sizeof *x, (long long)rows,
                      (long long)cols);
        return;
    }
    double norm = 0.0;
    for (int64_t i = 0; i < n * m; i++) norm += (double)g[i] * g[i];
    norm = sqrt(norm) + 1e-7;
    for (int64_t r = 0; r < rows; r++) /* the wide orientation: x is n x m */
        for (int64_t c = 0; c < cols; c++)
            x[tall ? c * rows + r : r * cols + c] = g[r * cols + c] / norm;
    double *A = x + 2 * n * m, *A2 = A + n * n, *y = x + n * m;
    for (int k = 0; k < steps; k++) ns_step(x, A, A2, y, n, m);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = (float)x[tall ? c * rows + r : r * cols + c];
    free(x);
}
