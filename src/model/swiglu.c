/* SwiGLU gate of the Llama MLP: silu(gate) * up, in fp32. Element loops,
 * split over the GEMM threads (OpenMP) when long enough: every element is
 * computed the same way whatever the split. */
#include <math.h>

#include "model/layers.h"

void hs_swiglu_forward(void *out /* N,F */, const void *gate /* N,F */, const void *up /* N,F */,
                       hs_dtype dt, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= HS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = hs_ld(gate, dt, i);
        hs_st(out, dt, i, g / (1.0f + expf(-g)) * hs_ld(up, dt, i));
    }
}

/* d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g))). */
void hs_swiglu_backward(float *dgate /* N,F */, float *dup /* N,F */, const float *dout /* N,F */,
                        const void *gate, const void *up, hs_dtype dt, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= HS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = hs_ld(gate, dt, i), u = hs_ld(up, dt, i);
        float sg = 1.0f / (1.0f + expf(-g));
        dgate[i] += dout[i] * u * sg * (1.0f + g * (1.0f - sg));
        dup[i] += dout[i] * g * sg;
    }
}
