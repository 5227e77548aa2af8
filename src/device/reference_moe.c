/* Reference MoE routing, dispatch, combine and their backward. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "device/device_backend.h"
#include "device/reference.h"

/* The best of c[lo..hi) not yet taken (taken[e] set), the lower on a tie;
 * -1 when none is left. */
static int best_of(const double *c, const bool *taken, int lo, int hi) {
    int best = -1;
    for (int e = lo; e < hi; e++)
        if (!taken[e] && (best < 0 || c[e] > c[best])) best = e;
    return best;
}

/* In fp64: scores (the softmax of the rounded logits, or each logit's
 * sigmoid), choice scores c = scores + bias, groups scored by their two best
 * and all but the topk_group best masked, K picks of the best unmasked,
 * weights renormalised over the chosen (+ 1e-20 for sigmoid) and scaled. */
void hs_ref_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, const float *bias,
                      int64_t N, int E, int K, hs_moe_router r, hs_dtype dt) {
    const int G = r.n_group > 1 ? r.n_group : 1, n = E / G;
    size_t bytes = (size_t)(2 * E + K + G) * sizeof(double) + (size_t)(E + G) * sizeof(bool);
    double *p = malloc(bytes), *c = p + E, *taken = c + E, *gs = taken + K;
    bool *out = (bool *)(gs + G), *gone = out + E;
    if (p == NULL) {
        hs_kernel_oom(s, "reference moe route: %zu bytes of scores", bytes);
        return;
    }
    for (int64_t t = 0; t < N; t++) {
        float *l = probs + t * E;
        double sum = 0.0, chosen = 0.0;
        if (r.sigmoid)
            for (int e = 0; e < E; e++) l[e] = (float)(p[e] = 1.0 / (1.0 + exp(-(double)l[e])));
        else {
            double mx = l[0] = hs_round_to(dt, l[0]);
            for (int e = 1; e < E; e++) mx = (l[e] = hs_round_to(dt, l[e])) > mx ? l[e] : mx;
            for (int e = 0; e < E; e++) sum += (p[e] = exp(l[e] - mx));
            for (int e = 0; e < E; e++) l[e] = (float)(p[e] /= sum);
        }
        for (int e = 0; e < E; e++) c[e] = p[e] + (bias ? bias[e] : 0.0), out[e] = false;
        for (int g = 0; g < G && G > 1; g++) {
            int b = best_of(c, out, g * n, (g + 1) * n);
            out[b] = true;
            int b2 = best_of(c, out, g * n, (g + 1) * n);
            out[b] = false, gs[g] = c[b] + c[b2], gone[g] = true;
        }
        for (int j = 0; j < r.topk_group && G > 1; j++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (gone[g] && (best < 0 || gs[g] > gs[best])) best = g;
            gone[best] = false;
        }
        for (int e = 0; e < E && G > 1; e++) out[e] = gone[e / n];
        for (int j = 0; j < K; j++) { /* the largest left, the lower expert on a tie */
            int best = best_of(c, out, 0, E);
            expert[t * K + j] = best;
            chosen += (taken[j] = p[best]);
            out[best] = true;
        }
        if (r.sigmoid) chosen += 1e-20;
        for (int j = 0; j < K; j++)
            weight[t * K + j] =
                hs_round_to(dt, (float)((r.renorm ? taken[j] / chosen : taken[j]) * r.scale));
    }
    free(p);
}

void hs_ref_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt,
                        int64_t N, int K, int C) {
    for (int64_t r = 0; r < N * K; r++)
        for (int c = 0; c < C; c++)
            hs_st(xg, dt, r * C + c, hs_ld(x, dt, (int64_t)(row_pair[r] / K) * C + c));
}

/* fp32 adds in grouped-row order, as the table fixes it. */
void hs_ref_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                            int64_t N, int K, int C) {
    for (int64_t r = 0; r < N * K; r++)
        for (int c = 0; c < C; c++) dx[(int64_t)(row_pair[r] / K) * C + c] += dxg[r * C + c];
}

/* fp64 sums over the slots in slot order, one rounding per output. */
void hs_ref_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                          const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                          float *ws) {
    for (int64_t t = 0; t < N; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)weight[t * K + k] *
                       hs_ld(y, dt, (int64_t)pair_row[t * K + k] * C + c);
            out[t * C + c] = (float)acc;
        }
}

void hs_ref_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                            hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                            int K, int C, float *ws) {
    for (int64_t p = 0; p < N * K; p++) {
        int64_t r = pair_row[p], t = p / K;
        double dot = 0.0;
        for (int c = 0; c < C; c++) {
            dyg[r * C + c] = (float)((double)weight[p] * dout[t * C + c]);
            dot += (double)dout[t * C + c] * hs_ld(y, dt, r * C + c);
        }
        dw[p] = (float)dot;
    }
}

/* All in fp64: w_k = s p_k / Z over the chosen (Z + 1e-20 for sigmoid);
 * d/dp_j gets s (dw_j - sum_k dw_k p_k / Z) / Z (s dw_j when not
 * renormalised: w_k = s p_k); then the softmax's backward p_e (g_e - p .
 * g), or the sigmoid's p_e (1 - p_e) g_e. */
void hs_ref_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          hs_moe_router r) {
    double *g = malloc((size_t)E * sizeof *g);
    if (g == NULL) {
        hs_kernel_oom(s, "reference moe route backward: %zu bytes of gradients",
                      (size_t)E * sizeof *g);
        return;
    }
    for (int64_t t = 0; t < N; t++) {
        const float *p = probs + t * E;
        const int32_t *sel = expert + t * K;
        const float *d = dw + t * K;
        double z = r.sigmoid ? 1e-20 : 0.0, wdot = 0.0, pdot = 0.0;
        for (int e = 0; e < E; e++) g[e] = aux_grad ? aux_grad[e] : 0.0;
        for (int k = 0; r.renorm && k < K; k++) z += p[sel[k]];
        for (int k = 0; r.renorm && k < K; k++) wdot += (double)d[k] * (p[sel[k]] / z);
        for (int k = 0; k < K; k++)
            g[sel[k]] += r.scale * (r.renorm ? (d[k] - wdot) / z : (double)d[k]);
        if (r.sigmoid) {
            for (int e = 0; e < E; e++) dp[t * E + e] = (float)(p[e] * (1.0 - p[e]) * g[e]);
            continue;
        }
        for (int e = 0; e < E; e++) pdot += (double)p[e] * g[e];
        for (int e = 0; e < E; e++) dp[t * E + e] = (float)(p[e] * (g[e] - pdot));
    }
    free(g);
}

/* Expert by expert: its selections counted, then its probabilities summed
 * in token order (the order the table fixes). */
void hs_ref_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                      const float *probs, int64_t N, int E, int K) {
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t p = 0; p < N * K; p++) {
            HS_ASSERT(expert[p] >= 0 && expert[p] < E);
            n += expert[p] == e;
        }
        count[e] += n;
        if (!prob_sum) continue;
        double sum = prob_sum[e];
        for (int64_t t = 0; t < N; t++) sum += (double)probs[t * E + e];
        prob_sum[e] = sum;
    }
}

void hs_ref_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                          const double *prob_sum_in, int E) {
    for (int e = 0; e < E; e++) {
        count[e] += count_in[e];
        if (prob_sum) prob_sum[e] += prob_sum_in[e];
    }
}

/* Expert by expert, each scanning every pair in order: the rows it gets
 * follow those of the experts before it. The counts are checked, not used. */
void hs_ref_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                         const int32_t *expert, const int64_t *count, int64_t N, int E, int K) {
    int64_t row = 0;
    for (int e = 0; e < E; e++) {
        offset[e] = (int32_t)row;
        for (int64_t p = 0; p < N * K; p++) {
            HS_ASSERT(expert[p] >= 0 && expert[p] < E);
            if (expert[p] != e) continue;
            row_pair[row] = (int32_t)p;
            pair_row[p] = (int32_t)row++;
        }
        HS_ASSERT(row - offset[e] == count[e]);
    }
    offset[E] = (int32_t)row;
}
