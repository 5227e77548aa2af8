/* Reference MoE routing, dispatch, combine and their backward. */
#include <math.h>
#include <stdlib.h>

#include "device/device_backend.h"
#include "device/reference.h"

void hs_ref_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N, int E,
                      int K, bool renorm, hs_dtype dt) {
    double *p = malloc((size_t)(E + K) * sizeof *p), *taken = p + E;
    if (p == NULL) {
        hs_kernel_oom(s, "reference moe route: %zu bytes of probabilities",
                      (size_t)(E + K) * sizeof *p);
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        float *l = probs + n * E;
        for (int e = 0; e < E; e++) l[e] = hs_round_to(dt, l[e]);
        double mx = l[0], sum = 0.0, chosen = 0.0;
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = exp(l[e] - mx));
        for (int e = 0; e < E; e++) l[e] = (float)(p[e] / sum);
        for (int j = 0; j < K; j++) { /* the largest left, the lower expert on a tie */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (p[e] >= 0.0 && (best < 0 || p[e] > p[best])) best = e;
            expert[n * K + j] = best;
            chosen += (taken[j] = p[best] / sum);
            p[best] = -1.0;
        }
        for (int j = 0; j < K; j++)
            weight[n * K + j] = hs_round_to(dt, (float)(renorm ? taken[j] / chosen : taken[j]));
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

/* All in fp64: w_k = p_k / Z over the chosen; d/dp_j gets (dw_j - sum_k
 * dw_k w_k) / Z (dw_j when not renormalised: w_k = p_k); then the
 * softmax's backward p_e (g_e - p . g). */
void hs_ref_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          bool renorm) {
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
        double z = 0.0, wdot = 0.0, pdot = 0.0;
        for (int e = 0; e < E; e++) g[e] = aux_grad ? aux_grad[e] : 0.0;
        for (int k = 0; renorm && k < K; k++) z += p[sel[k]];
        for (int k = 0; renorm && k < K; k++) wdot += (double)d[k] * (p[sel[k]] / z);
        for (int k = 0; k < K; k++) g[sel[k]] += renorm ? (d[k] - wdot) / z : (double)d[k];
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
