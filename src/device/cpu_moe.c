/* The cpu backend's MoE routing (moved from model/moe_router.c: the same
 * code): the router logits rounded to the compute dtype, an fp32 softmax in
 * place (libm expf, fp64 sum), K passes of an arg-max, and the weights
 * renormalised over the chosen and rounded to the compute dtype. */
#include <math.h>
#include <stdbool.h>

#include "device/cpu.h"

static void softmax_row(float *row, int E)
{
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
 * lower expert first; torch.topk leaves ties unspecified. */
static void topk_row(int32_t *sel, const float *p, int E, int K)
{
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

void hs_cpu_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N,
                      int E, int K, bool renorm, hs_dtype dt)
{
    for (int64_t t = 0; t < N; t++) {
        float *p = probs + t * E;
        int32_t *sel = expert + t * K;
        float *w = weight + t * K;
        for (int e = 0; e < E; e++) p[e] = hs_round_to(dt, p[e]);
        softmax_row(p, E);
        topk_row(sel, p, E, K);
        float z = 0.0f;
        for (int k = 0; renorm && k < K; k++) z += p[sel[k]];
        for (int k = 0; k < K; k++) w[k] = hs_round_to(dt, renorm ? p[sel[k]] / z : p[sel[k]]);
    }
}
