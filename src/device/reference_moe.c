/* Reference MoE routing, permute and unpermute. */
#include <math.h>
#include <stdlib.h>

#include "device/reference.h"

void hs_ref_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N,
                      int E, int K, bool renorm, hs_dtype dt)
{
    double *p = malloc((size_t)(E + K) * sizeof *p), *taken = p + E;
    if (p == NULL) hs_oom("reference moe route: cannot allocate %d probabilities", E + K);
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

void hs_ref_moe_permute(hs_stream *s, void *dst, const void *src, const int32_t *idx,
                        hs_dtype dt, int64_t n, int C)
{
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            hs_st(dst, dt, i * C + c, hs_ld(src, dt, (int64_t)idx[i] * C + c));
}

void hs_ref_moe_unpermute(hs_stream *s, float *dst, const float *src, const int32_t *idx,
                          const float *w, int64_t n, int C)
{
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            dst[(int64_t)idx[i] * C + c] += (w ? w[i] : 1.0f) * src[i * C + c];
}
