/* Token embedding: a row gather forward, a row scatter-add backward. */
#include <string.h>

#include "device/cpu.h"

void hs_embedding_forward(void *out /* N,C */, const int32_t *tokens /* N */,
                          const void *wte /* V,C */, hs_dtype dt, int64_t N, int C) {
    size_t row = (size_t)C * hs_dtype_size(dt);
    for (int64_t n = 0; n < N; n++)
        memcpy(hs_at(out, dt, n * C), hs_cat(wte, dt, (int64_t)tokens[n] * C), row);
}

void hs_embedding_backward(void *dwte /* V,C */, hs_dtype gdt, const float *dout /* N,C */,
                           const int32_t *tokens /* N */, int64_t N, int C) {
    if (!dwte) return; /* frozen */
    for (int64_t n = 0; n < N; n++) {
        const float *d = dout + n * C;
        int64_t base = (int64_t)tokens[n] * C;
        if (gdt == HS_DTYPE_F32) {
            float *g = (float *)dwte + base;
            for (int i = 0; i < C; i++) g[i] += d[i];
        } else {
            for (int i = 0; i < C; i++) hs_acc(dwte, gdt, base + i, d[i]);
        }
    }
}

void hs_cpu_embedding_fwd(hs_stream *s, void *out, const int32_t *tokens, const void *wte,
                          hs_dtype dt, int64_t N, int C) {
    hs_embedding_forward(out, tokens, wte, dt, N, C);
}

void hs_cpu_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C) {
    hs_embedding_backward(dwte, gdt, dout, tokens, N, C);
}
