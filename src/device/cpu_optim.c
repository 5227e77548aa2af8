/* The cpu optimizer kernels: AdamW's element loop (the optimizer keeps the
 * per-step scalars, the chunking over threads and the widening of 16-bit
 * parameters), and Muon's momentum and Newton-Schulz orthogonalisation
 * (its matmuls on BLAS). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu.h"

void hs_adamw_update_f32(float *restrict p, float *restrict m, float *restrict v,
                         const float *restrict g, const hs_adamw_hparams *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        m[i] = h->beta1 * m[i] + h->one_minus_beta1 * g[i];
        v[i] = h->beta2 * v[i] + h->one_minus_beta2 * (g[i] * g[i]);
        float denom = sqrtf(v[i]) / h->bias2_sqrt + h->eps;
        p[i] = p[i] * h->decay_factor - h->step_size * (m[i] / denom);
    }
}

void hs_cpu_adamw(hs_stream *s, float *p, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n)
{
    hs_adamw_update_f32(p, m, v, g, h, n);
}

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

int64_t hs_newton_schulz5_scratch_floats(int64_t rows, int64_t cols)
{
    int64_t n = rows < cols ? rows : cols;
    return 2 * rows * cols + 2 * n * n;
}

static void transpose(float *dst, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* One iteration on X (n x m, n <= m): X <- a X + (b A + c A^2) X, A = X X^T. */
static void ns_iterate(float *x_next, const float *x, float *gram, float *poly, int64_t n, int64_t m)
{
    hs_sgemm(false, true, n, n, m, 1.0f, x, m, x, m, 0.0f, gram, n);
    memcpy(poly, gram, (size_t)(n * n) * sizeof(float));
    hs_sgemm(false, false, n, n, n, NS_C, gram, n, gram, n, NS_B, poly, n);
    memcpy(x_next, x, (size_t)(n * m) * sizeof(float));
    hs_sgemm(false, false, n, m, n, 1.0f, poly, n, x, m, NS_A, x_next, m);
}

void hs_newton_schulz5(float *out, const float *g, int64_t rows, int64_t cols, int steps,
                       float *scratch)
{
    HS_ASSERT(rows > 0 && cols > 0 && steps >= 0);
    float *owned = NULL;
    if (scratch == NULL) {
        owned = malloc((size_t)hs_newton_schulz5_scratch_floats(rows, cols) * sizeof(float));
        if (owned == NULL)
            hs_oom("Newton-Schulz: cannot allocate scratch for a %lldx%lld matrix",
                     (long long)rows, (long long)cols);
        scratch = owned;
    }
    /* Iterate on the wide orientation so the Gram matrix is the small one. */
    bool tall = rows > cols;
    int64_t n = tall ? cols : rows, m = tall ? rows : cols, numel = rows * cols;
    float *x = scratch, *x_next = scratch + numel, *gram = x_next + numel, *poly = gram + n * n;
    if (tall) transpose(x, g, rows, cols);
    else memcpy(x, g, (size_t)numel * sizeof(float));
    double norm = sqrt(hs_sumsq_f32(x, numel));
    hs_scale_f32(x, (float)(1.0 / (norm + 1e-7)), numel);
    for (int s = 0; s < steps; s++) {
        ns_iterate(x_next, x, gram, poly, n, m);
        float *t = x;
        x = x_next, x_next = t;
    }
    if (tall) transpose(out, x, cols, rows);
    else memcpy(out, x, (size_t)numel * sizeof(float));
    free(owned);
}

void hs_cpu_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        buf[i] = mu * buf[i] + g[i];
        dir[i] = nesterov ? g[i] + mu * buf[i] : buf[i];
    }
}

void hs_cpu_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows,
                               int64_t cols, int steps, float *ws)
{
    hs_newton_schulz5(out, g, rows, cols, steps, ws);
}
