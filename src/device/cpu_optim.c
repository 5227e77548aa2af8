/* The cpu optimizer kernels: AdamW's element loop (the optimizer keeps the
 * per-step scalars, the chunking over threads and the widening of 16-bit
 * parameters). */
#include <math.h>

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
