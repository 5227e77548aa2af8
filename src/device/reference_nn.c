/* Reference RMSNorm, RoPE, SwiGLU, cross-entropy and embedding. */
#include <math.h>

#include "device/cpu_kernels.h"
#include "device/reference.h"

void hs_ref_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                        const void *w, hs_dtype dt, int64_t N, int C, float eps) {
    for (int64_t n = 0; n < N; n++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++) {
            double v = hs_ld(x, xdt, n * C + c);
            ss += v * v;
        }
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = (float)r;
        for (int c = 0; c < C; c++)
            hs_st(out, dt, n * C + c, (float)(hs_ld(w, dt, c) * hs_ld(x, xdt, n * C + c) * r));
    }
}

/* dx_i = r w_i dy_i - x_i r^3 / C * sum_j(w_j dy_j x_j); dw_i = sum_n dy_i x_i r */
void hs_ref_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                        const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                        int64_t N, int C, double *ws) {
    for (int c = 0; dw && c < C; c++) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; n++)
            acc += (double)dout[n * C + c] * hs_ld(x, xdt, n * C + c) * rstd[n];
        hs_st(dw, gdt, c, (float)(hs_ld(dw, gdt, c) + acc));
    }
    for (int64_t n = 0; n < N; n++) {
        double r = rstd[n], dot = 0.0;
        for (int c = 0; c < C; c++)
            dot += (double)hs_ld(w, dt, c) * dout[n * C + c] * hs_ld(x, xdt, n * C + c);
        for (int c = 0; c < C; c++)
            dx[n * C + c] += (float)(r * hs_ld(w, dt, c) * dout[n * C + c] -
                                     hs_ld(x, xdt, n * C + c) * r * r * r / C * dot);
    }
}

/* The definition is Hugging Face's LlamaRotaryEmbedding, which forms the
 * angles in fp32: the tables are that, not a closer approximation. */
void hs_ref_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD,
                        const float *inv_freq, float scale) {
    int half = HD / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)t * inv_freq[i];
            cos_t[t * half + i] = cosf(a) * scale;
            sin_t[t * half + i] = sinf(a) * scale;
        }
}

/* Rotates pairs (i, i + HD/2) of every head by the angle of +1 or -1 times
 * the table's. */
static void rotate(void *x, hs_dtype dt, const float *cos_t, const float *sin_t, double sign, int B,
                   int T, int H, int HD) {
    int half = HD / 2;
    for (int64_t row = 0; row < (int64_t)B * T * H; row++) {
        int t = (int)(row / H % T);
        for (int i = 0; i < half; i++) {
            int64_t a = row * HD + i, b = a + half;
            double c = cos_t[t * half + i], sn = sign * sin_t[t * half + i];
            double x1 = hs_ld(x, dt, a), x2 = hs_ld(x, dt, b);
            hs_st(x, dt, a, (float)(x1 * c - x2 * sn));
            hs_st(x, dt, b, (float)(x2 * c + x1 * sn));
        }
    }
}

void hs_ref_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD) {
    rotate(x, dt, cos_t, sin_t, 1.0, B, T, H, HD);
}

void hs_ref_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                     int H, int HD) {
    rotate(dx, HS_DTYPE_F32, cos_t, sin_t, -1.0, B, T, H, HD);
}

void hs_ref_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                       int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = hs_ld(gate, dt, i);
        hs_st(out, dt, i, (float)(g / (1.0 + exp(-g)) * hs_ld(up, dt, i)));
    }
}

void hs_ref_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                       const void *gate, const void *up, hs_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = hs_ld(gate, dt, i), u = hs_ld(up, dt, i), sg = 1.0 / (1.0 + exp(-g));
        double dg = dout[i] * u * sg * (1.0 + g * (1.0 - sg)), du = dout[i] * g * sg;
        dgate[i] = (float)(overwrite ? dg : dgate[i] + dg);
        dup[i] = (float)(overwrite ? du : dup[i] + du);
    }
}

void hs_ref_swiglu_bwd16(hs_stream *s, void *dgate16, void *dup16, const float *dout,
                         const void *gate, const void *up, hs_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = hs_ld(gate, dt, i), u = hs_ld(up, dt, i), sg = 1.0 / (1.0 + exp(-g));
        hs_st(dgate16, dt, i, (float)(dout[i] * u * sg * (1.0 + g * (1.0 - sg))));
        hs_st(dup16, dt, i, (float)(dout[i] * g * sg));
    }
}

static double row_max(const float *l, int V) {
    double mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}

void hs_ref_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale) {
    double total = 0.0;
    int64_t used = 0;
    for (int64_t n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float *d = dlogits ? dlogits + n * V : NULL;
        if (targets[n] < 0) {
            for (int i = 0; d && i < V; i++) d[i] = 0.0f;
            continue;
        }
        double mx = row_max(l, V), sum = 0.0, lt = l[targets[n]];
        for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
        for (int i = 0; d && i < V; i++) /* d may alias l: each i reads l[i] first */
            d[i] = (float)((exp(l[i] - mx) / sum - (i == targets[n])) * scale);
        total += mx + log(sum) - lt;
        used++;
    }
    *loss = total;
    if (valid) *valid = used;
}

void hs_ref_xent_shard_max(hs_stream *s, float *row_max_out, const float *logits, int64_t N,
                           int V) {
    for (int64_t n = 0; n < N; n++) row_max_out[n] = (float)row_max(logits + n * V, V);
}

void hs_ref_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target, const float *logits,
                            const float *gmax, const int32_t *targets, int64_t N, int V,
                            int64_t v0) {
    for (int64_t n = 0; n < N; n++) {
        const float *l = logits + n * V;
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)l[i] - gmax[n]);
        row_sumexp[n] = (float)sum;
        int64_t t = targets[n] - v0;
        row_target[n] = targets[n] >= 0 && t >= 0 && t < V ? l[t] : 0.0f;
    }
}

void hs_ref_xent_shard_grad(hs_stream *s, float *logits, const float *gmax, const float *row_sumexp,
                            const int32_t *targets, int64_t N, int V, int64_t v0, float scale) {
    for (int64_t n = 0; n < N; n++) {
        float *l = logits + n * V;
        int64_t t = targets[n] - v0;
        for (int i = 0; i < V; i++)
            l[i] = targets[n] < 0
                       ? 0.0f
                       : (float)((exp((double)l[i] - gmax[n]) / row_sumexp[n] - (i == t)) * scale);
    }
}

/* In fp64, rows in order. */
void hs_ref_xent_shard_loss(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                            const float *row_target, const int32_t *targets, int64_t N) {
    double total = 0.0;
    for (int64_t n = 0; n < N; n++)
        if (targets[n] >= 0) total += gmax[n] + log(row_sumexp[n]) - row_target[n];
    *loss = total;
}

static bool in_vocab(int32_t tok, int64_t v0, int V) { return tok >= v0 && tok < v0 + V; }

void hs_ref_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                          const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V) {
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            hs_st(out, odt, n * C + c,
                  in_vocab(tokens[n], v0, V) ? hs_ld(wte, dt, (tokens[n] - v0) * C + c) : 0.0f);
}

void hs_ref_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C, int64_t v0, int V) {
    for (int64_t n = 0; dwte && n < N; n++)
        for (int c = 0; in_vocab(tokens[n], v0, V) && c < C; c++)
            hs_acc(dwte, gdt, (tokens[n] - v0) * C + c, dout[n * C + c]);
}
