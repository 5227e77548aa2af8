/* Token embedding: a row gather forward, a row scatter-add backward, over
 * the vocabulary rows [v0, v0 + V) the table holds (all of it on one
 * device, a shard of it under tensor parallelism). */
#include <stdint.h>
#include <string.h>

#include "device/cpu.h"

/* Row of wte for token `tok`, or -1 where the table does not hold it. */
static int64_t held_row(int32_t tok, int64_t v0, int64_t V) {
    int64_t t = (int64_t)tok - v0;
    return t >= 0 && t < V ? t : -1;
}

static void gather_rows(void *out, hs_dtype odt, const int32_t *tokens, const void *wte,
                        hs_dtype dt, int64_t N, int C, int64_t v0, int64_t V) {
    size_t row = (size_t)C * hs_dtype_size(odt);
    for (int64_t n = 0; n < N; n++) {
        int64_t t = held_row(tokens[n], v0, V);
        void *o = hs_at(out, odt, n * C);
        if (t < 0) memset(o, 0, row);
        else if (odt == dt) memcpy(o, hs_cat(wte, dt, t * C), row);
        else hs_convert(o, odt, hs_cat(wte, dt, t * C), dt, C);
    }
}

static void scatter_add_rows(void *dwte, hs_dtype gdt, const float *dout, const int32_t *tokens,
                             int64_t N, int C, int64_t v0, int64_t V) {
    if (!dwte) return; /* frozen */
    for (int64_t n = 0; n < N; n++) {
        int64_t t = held_row(tokens[n], v0, V);
        if (t < 0) continue;
        const float *d = dout + n * C;
        int64_t base = t * C;
        if (gdt == HS_DTYPE_F32) {
            float *g = (float *)dwte + base;
            for (int i = 0; i < C; i++) g[i] += d[i];
        } else {
            for (int i = 0; i < C; i++) hs_acc(dwte, gdt, base + i, d[i]);
        }
    }
}

void hs_embedding_forward(void *out /* N,C */, const int32_t *tokens /* N */,
                          const void *wte /* V,C */, hs_dtype dt, int64_t N, int C) {
    gather_rows(out, dt, tokens, wte, dt, N, C, 0, INT32_MAX);
}

void hs_embedding_backward(void *dwte /* V,C */, hs_dtype gdt, const float *dout /* N,C */,
                           const int32_t *tokens /* N */, int64_t N, int C) {
    scatter_add_rows(dwte, gdt, dout, tokens, N, C, 0, INT32_MAX);
}

void hs_cpu_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                          const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V) {
    gather_rows(out, odt, tokens, wte, dt, N, C, v0, V);
}

void hs_cpu_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C, int64_t v0, int V) {
    scatter_add_rows(dwte, gdt, dout, tokens, N, C, v0, V);
}
