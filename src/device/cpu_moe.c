/* The cpu backend's MoE routing, dispatch and combine (moved from
 * model/moe_router.c, moe_dispatch.c and moe.c: the same code): the router
 * logits rounded to the compute dtype, an fp32 softmax in place (libm expf,
 * fp64 sum), K passes of an arg-max, and the weights renormalised over the
 * chosen and rounded to the compute dtype; token rows copied to grouped
 * order; each token's slots summed in slot order with tensor/'s axpy; and
 * the backward of the combine and of the router (moved from model/moe.c and
 * model/moe_router.c); the router's statistics for the aux loss and their
 * running totals (moved from model/moe_router.c and model/moe_aux.c). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu.h"
#include "device/device_backend.h"

static void softmax_row(float *row, int E) {
    float mx = row[0];
    for (int e = 1; e < E; e++)
        if (row[e] > mx) mx = row[e];
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        row[e] = expf(row[e] - mx);
        sum += row[e];
    }
    float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++) row[e] *= inv;
}

/* K passes of an arg-max over the experts not yet taken. A strict '>'
 * keeps the earlier (lower) index on a tie, so equal probabilities pick the
 * lower expert first; torch.topk leaves ties unspecified. Experts whose
 * score is -inf (outside the chosen groups) are taken only when nothing
 * else is left, never when K <= the experts of the chosen groups. */
static void topk_row(int32_t *sel, const float *p, int E, int K) {
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken = taken || sel[j] == e;
            if (taken) continue;
            if (best < 0 || p[e] > p[best]) best = e;
        }
        sel[k] = best;
    }
}

/* Group-limited choice (hs_moe_router): each of the G groups of E / G
 * experts scored by the sum of its two best choice scores (fp32, the
 * larger first, as torch.topk(2).sum), the topk_group best groups kept
 * (ties to the lower group) and every other expert's score set to -inf. */
static void limit_groups(float *c, int E, int G, int TG) {
    const int n = E / G;
    float gs[HS_MOE_MAX_GROUPS];
    bool keep[HS_MOE_MAX_GROUPS];
    for (int g = 0; g < G; g++) {
        const float *x = c + g * n;
        int b = 0;
        for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
        int b2 = b == 0 ? 1 : 0;
        for (int i = 0; i < n; i++) b2 = i != b && x[i] > x[b2] ? i : b2;
        gs[g] = x[b] + x[b2];
        keep[g] = false;
    }
    for (int k = 0; k < TG; k++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = true;
    }
    for (int g = 0; g < G; g++)
        for (int i = 0; !keep[g] && i < n; i++) c[g * n + i] = -INFINITY;
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* DeepSeek-V3's and the general router (hs_moe_router); c: E floats of
 * workspace for the choice scores. */
static void route_row_scored(int32_t *sel, float *w, float *p, float *c, const float *bias, int E,
                             int K, const hs_moe_router *r, hs_dtype dt) {
    if (r->sigmoid)
        for (int e = 0; e < E; e++) p[e] = sigmoidf(p[e]);
    else {
        for (int e = 0; e < E; e++) p[e] = hs_round_to(dt, p[e]);
        softmax_row(p, E);
    }
    for (int e = 0; e < E; e++) c[e] = bias ? p[e] + bias[e] : p[e];
    if (r->n_group > 1) limit_groups(c, E, r->n_group, r->topk_group);
    topk_row(sel, c, E, K);
    float z = 0.0f;
    for (int k = 0; r->renorm && k < K; k++) z += p[sel[k]];
    if (r->sigmoid) z += 1e-20f;
    for (int k = 0; k < K; k++)
        w[k] = hs_round_to(dt, (r->renorm ? p[sel[k]] / z : p[sel[k]]) * r->scale);
}

void hs_cpu_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, const float *bias,
                      int64_t N, int E, int K, hs_moe_router r, hs_dtype dt) {
    if (!hs_moe_router_plain(&r) || bias) {
        float *c = malloc((size_t)E * sizeof *c);
        if (c == NULL) {
            hs_kernel_oom(s, "moe route: %zu bytes of choice scores", (size_t)E * sizeof *c);
            return;
        }
        for (int64_t t = 0; t < N; t++)
            route_row_scored(expert + t * K, weight + t * K, probs + t * E, c, bias, E, K, &r, dt);
        free(c);
        return;
    }
    for (int64_t t = 0; t < N; t++) {
        float *p = probs + t * E;
        int32_t *sel = expert + t * K;
        float *w = weight + t * K;
        for (int e = 0; e < E; e++) p[e] = hs_round_to(dt, p[e]);
        softmax_row(p, E);
        topk_row(sel, p, E, K);
        float z = 0.0f;
        for (int k = 0; r.renorm && k < K; k++) z += p[sel[k]];
        for (int k = 0; k < K; k++) w[k] = hs_round_to(dt, r.renorm ? p[sel[k]] / z : p[sel[k]]);
    }
}

void hs_cpu_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt,
                        int64_t N, int K, int C) {
    const size_t row = (size_t)C * hs_dtype_size(dt);
    for (int64_t r = 0; r < N * K; r++)
        memcpy((char *)xg + (size_t)r * row, (const char *)x + (size_t)(row_pair[r] / K) * row,
               row);
}

/* A scatter-add in grouped order: fixed for a given routing. */
void hs_cpu_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                            int64_t N, int K, int C) {
    for (int64_t r = 0; r < N * K; r++)
        hs_add_f32(dx + (int64_t)(row_pair[r] / K) * C, dxg + r * C, C);
}

void hs_cpu_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                          const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                          float *ws) {
    const size_t es = hs_dtype_size(dt);
    memset(out, 0, (size_t)N * (size_t)C * sizeof(float));
    for (int64_t pr = 0; pr < N * K; pr++) {
        hs_convert(ws, HS_DTYPE_F32, (const char *)y + (size_t)pair_row[pr] * (size_t)C * es, dt,
                   C);
        hs_axpy_f32(out + (pr / K) * C, weight[pr], ws, C);
    }
}

void hs_cpu_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                            hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                            int K, int C, float *ws) {
    const size_t es = hs_dtype_size(dt);
    for (int64_t pr = 0; pr < N * K; pr++) {
        int64_t r = pair_row[pr];
        const float *g = dout + (pr / K) * C;
        float *dy = dyg + r * C, wt = weight[pr];
        hs_convert(ws, HS_DTYPE_F32, (const char *)y + (size_t)r * (size_t)C * es, dt, C);
        float dot = 0.0f;
        for (int c = 0; c < C; c++) {
            dy[c] = wt * g[c];
            dot += g[c] * ws[c];
        }
        dw[pr] = dot;
    }
}

/* d loss / d logits of one token, in place over g (which holds d loss /
 * d scores on entry). */
static void route_token_backward(float *g, const float *p, const int32_t *sel, const float *dw,
                                 int E, int K, const hs_moe_router *r) {
    /* Renormalisation w_k = s p_k / Z, Z = sum_j p_j over the selected
     * (+ 1e-20 for sigmoid), s the scale: d/dp_j = s (dw_j - sum_k dw_k
     * p_k / Z) / Z. The unrounded w is rebuilt from the saved fp32
     * probabilities. Without it w_k = s p_k. (s = 1: the bits of the
     * products without it.) */
    const bool renorm = r->renorm;
    const float sc = r->scale;
    float z = 0.0f;
    for (int k = 0; renorm && k < K; k++) z += p[sel[k]];
    if (r->sigmoid) z += 1e-20f;
    double wdot = 0.0;
    for (int k = 0; renorm && k < K; k++) wdot += (double)dw[k] * (p[sel[k]] / z);
    for (int k = 0; k < K; k++) {
        double d = (double)sc * dw[k];
        g[sel[k]] += renorm ? (float)((d - (double)sc * wdot) / z) : (float)d;
    }
    if (r->sigmoid) { /* each score its own logit's: s' = s (1 - s) */
        for (int e = 0; e < E; e++) g[e] = g[e] * (p[e] * (1.0f - p[e]));
        return;
    }
    double pdot = 0.0;
    for (int e = 0; e < E; e++) pdot += (double)p[e] * g[e];
    for (int e = 0; e < E; e++) g[e] = p[e] * (float)(g[e] - pdot);
}

void hs_cpu_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          hs_moe_router r) {
    for (int64_t t = 0; t < N; t++) {
        float *g = dp + t * E;
        for (int e = 0; e < E; e++) g[e] = aux_grad ? aux_grad[e] : 0.0f;
        route_token_backward(g, probs + t * E, expert + t * K, dw + t * K, E, K, &r);
    }
}

/* Token-major, as the router summed them before the table had this entry:
 * each expert's probabilities added in token order in fp64 (the inner loop
 * over experts vectorises across experts, not along one sum). */
void hs_cpu_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                      const float *probs, int64_t N, int E, int K) {
    for (int64_t t = 0; t < N; t++) {
        for (int k = 0; k < K; k++) count[expert[t * K + k]]++;
        if (!prob_sum) continue;
        const float *p = probs + t * E;
        for (int e = 0; e < E; e++) prob_sum[e] += p[e];
    }
}

void hs_cpu_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                          const double *prob_sum_in, int E) {
    for (int e = 0; e < E; e++) count[e] += count_in[e];
    for (int e = 0; prob_sum && e < E; e++) prob_sum[e] += prob_sum_in[e];
}

/* A counting sort: offset[e + 1] first holds the start of expert e and is
 * advanced as its rows are placed, ending at the start of e + 1. */
void hs_cpu_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                         const int32_t *expert, const int64_t *count, int64_t N, int E, int K) {
    const int64_t pairs = N * K;
    int64_t start = 0;
    offset[0] = 0;
    for (int e = 0; e < E; e++) {
        offset[e + 1] = (int32_t)start;
        start += count[e];
    }
    HS_ASSERT(start == pairs);
    for (int64_t p = 0; p < pairs; p++) {
        int32_t row = offset[expert[p] + 1]++;
        row_pair[row] = (int32_t)p;
        pair_row[p] = row;
    }
}
