/* Rotary position embedding in the Hugging Face layout (rotate_half pairs
 * dim i with dim i + HD/2 of the same head; positions 0..T-1). */
#include <math.h>

#include "device/cpu.h"

/* Mirrors LlamaRotaryEmbedding in fp32: angle = float(pos) * inv_freq,
 * cos/sin in float, times the attention scaling (1 but under YaRN). */
void hs_rope_tables_freqs(float *cos_t /* T,HD/2 */, float *sin_t /* T,HD/2 */, int T, int HD,
                          const float *inv_freq, float scale) {
    int half = HD / 2;
    for (int i = 0; i < half; i++) {
        float inv = inv_freq[i];
        for (int t = 0; t < T; t++) {
            float a = (float)t * inv;
            cos_t[t * half + i] = cosf(a) * scale;
            sin_t[t * half + i] = sinf(a) * scale;
        }
    }
}

/* One (sequence, position) row of H heads, inlined per storage dtype so
 * that the loads, stores and products vectorise. */
static inline __attribute__((always_inline)) void
rotate_row(void *x, hs_dtype dt, int64_t o, const float *c, const float *s, int H, int HD) {
    int half = HD / 2;
    for (int h = 0; h < H; h++, o += HD)
        for (int i = 0; i < half; i++) {
            float x1 = hs_ld(x, dt, o + i), x2 = hs_ld(x, dt, o + i + half);
            hs_st(x, dt, o + i, x1 * c[i] - x2 * s[i]);
            hs_st(x, dt, o + i + half, x2 * c[i] + x1 * s[i]);
        }
}

static void rotate_row_dt(void *x, hs_dtype dt, int64_t o, const float *c, const float *s, int H,
                          int HD) {
    switch (dt) {
    case HS_DTYPE_F32: rotate_row(x, HS_DTYPE_F32, o, c, s, H, HD); break;
    case HS_DTYPE_BF16: rotate_row(x, HS_DTYPE_BF16, o, c, s, H, HD); break;
    default: rotate_row(x, dt, o, c, s, H, HD); break;
    }
}

void hs_rope_forward(void *x /* B,T,H,HD */, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD) {
    int half = HD / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * H * HD >= HS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            rotate_row_dt(x, dt, ((int64_t)b * T + t) * H * HD, cos_t + t * half, sin_t + t * half,
                          H, HD);
}

/* The rotation is orthogonal, so its gradient is the rotation by -angle;
 * rows over the threads as the forward's. */
void hs_rope_backward(float *dx /* B,T,H,HD */, const float *cos_t, const float *sin_t, int B,
                      int T, int H, int HD) {
    int half = HD / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * H * HD >= HS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos_t + t * half, *s = sin_t + t * half;
            float *d = dx + ((int64_t)b * T + t) * H * HD;
            for (int h = 0; h < H; h++, d += HD)
                for (int i = 0; i < half; i++) {
                    float d1 = d[i], d2 = d[i + half];
                    d[i] = d1 * c[i] + d2 * s[i];
                    d[i + half] = d2 * c[i] - d1 * s[i];
                }
        }
}

void hs_cpu_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD,
                        const float *inv_freq, float scale) {
    hs_rope_tables_freqs(cos_t, sin_t, T, HD, inv_freq, scale);
}

void hs_cpu_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD) {
    hs_rope_forward(x, dt, cos_t, sin_t, B, T, H, HD);
}

void hs_cpu_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                     int H, int HD) {
    hs_rope_backward(dx, cos_t, sin_t, B, T, H, HD);
}
