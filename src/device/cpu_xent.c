/* Softmax cross-entropy over the vocabulary: fp32 exponentials, fp64 sums.
 * Rows are independent: they go over the GEMM threads (OpenMP) in blocks,
 * each row's loss term into the block's table, and the terms are added in
 * row order afterwards, so the loss has the bits of one thread's loop
 * whatever the split. */
#include <math.h>
#include <string.h>

#include "device/cpu.h"

#define XENT_BLOCK 256 /* rows whose loss terms wait on the stack */

/* Row n's loss term (NAN: an ignored target), its gradient into d. */
static inline __attribute__((always_inline)) double xent_row_any(float *d, const float *l,
                                                                 int32_t tgt, int V, float scale) {
    if (tgt < 0) {
        if (d) memset(d, 0, (size_t)V * sizeof(float));
        return NAN;
    }
    float mx = hs_row_max(l, V), lt = l[tgt];
    double sum = 0.0;
    if (d) {
        /* d may alias l: each exponential replaces the logit it came from. */
        for (int i = 0; i < V; i++) d[i] = hs_expf(l[i] - mx); /* vectorises */
        sum = hs_row_sum(d, V);
        float k = (float)(scale / sum);
        for (int i = 0; i < V; i++) d[i] *= k;
        d[tgt] -= scale;
    } else {
        for (int i = 0; i < V; i++) sum += hs_expf(l[i] - mx);
    }
    return (double)mx + log(sum) - (double)lt;
}

typedef double row_fn(float *, const float *, int32_t, int, float);

/* The row, and its AVX-512 clone (HS_WIDE): the same bits. */
static double xent_row(float *d, const float *l, int32_t tgt, int V, float scale) {
    return xent_row_any(d, l, tgt, V, scale);
}

HS_WIDE static double xent_row_wide(float *d, const float *l, int32_t tgt, int V, float scale) {
    return xent_row_any(d, l, tgt, V, scale);
}

double hs_xent_forward_backward(float *dlogits /* N,V */, const float *logits /* N,V */,
                                const int32_t *targets /* N */, int64_t N, int V, float scale,
                                int64_t *valid) {
    double total = 0.0;
    int64_t used = 0;
    row_fn *row = hs_cpu_wide_vectors() ? xent_row_wide : xent_row;
    for (int64_t b0 = 0; b0 < N; b0 += XENT_BLOCK) {
        int rows = N - b0 < XENT_BLOCK ? (int)(N - b0) : XENT_BLOCK;
        double term[XENT_BLOCK];
#pragma omp parallel for schedule(static) if ((int64_t)rows * V >= HS_PAR_MIN)
        for (int r = 0; r < rows; r++) {
            int64_t n = b0 + r;
            term[r] = row(dlogits ? dlogits + n * V : NULL, logits + n * V, targets[n], V, scale);
        }
        for (int r = 0; r < rows; r++) {
            if (targets[b0 + r] < 0) continue;
            total += term[r];
            used++;
        }
    }
    if (valid) *valid = used;
    return total;
}

void hs_cpu_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale) {
    *loss = hs_xent_forward_backward(dlogits, logits, targets, N, V, scale, valid);
}

/* The vocab-parallel pieces (parallel/tp_region.c's loss over vocab-sharded
 * logits): fp32 exponentials summed in fp64, the sum rounded to fp32 for
 * the all-reduce. */
void hs_cpu_xent_shard_max(hs_stream *s, float *row_max, const float *logits, int64_t N, int V) {
#pragma omp parallel for schedule(static) if (N * V >= HS_PAR_MIN)
    for (int64_t i = 0; i < N; i++) row_max[i] = hs_row_max(logits + i * V, V);
}

void hs_cpu_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target, const float *logits,
                            const float *gmax, const int32_t *targets, int64_t N, int V,
                            int64_t v0) {
#pragma omp parallel for schedule(static) if (N * V >= HS_PAR_MIN)
    for (int64_t i = 0; i < N; i++) {
        const float *l = logits + i * V;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += hs_expf(l[j] - gmax[i]);
        int64_t t = (int64_t)targets[i] - v0;
        row_sumexp[i] = (float)sum;
        row_target[i] = targets[i] >= 0 && t >= 0 && t < V ? l[t] : 0.0f;
    }
}

void hs_cpu_xent_shard_grad(hs_stream *s, float *logits, const float *gmax, const float *row_sumexp,
                            const int32_t *targets, int64_t N, int V, int64_t v0, float scale) {
#pragma omp parallel for schedule(static) if (N * V >= HS_PAR_MIN)
    for (int64_t i = 0; i < N; i++) {
        float *l = logits + i * V;
        int64_t t = (int64_t)targets[i] - v0;
        if (targets[i] < 0) {
            memset(l, 0, (size_t)V * sizeof(float));
            continue;
        }
        float k = (float)(scale / (double)row_sumexp[i]);
        for (int j = 0; j < V; j++) l[j] = hs_expf(l[j] - gmax[i]) * k;
        if (t >= 0 && t < V) l[t] -= scale;
    }
}

void hs_cpu_xent_shard_loss(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                            const float *row_target, const int32_t *targets, int64_t N) {
    double total = 0.0;
    for (int64_t i = 0; i < N; i++)
        if (targets[i] >= 0)
            total += (double)gmax[i] + log((double)row_sumexp[i]) - (double)row_target[i];
    *loss = total;
}
