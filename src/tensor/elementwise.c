/* fp32 elementwise kernels and reductions. Plain loops: at -O3 with
 * -march=x86-64-v3 the compiler vectorises them; sums accumulate in fp64 so
 * that norms over millions of elements do not depend on the order. */
#include <math.h>
#include <string.h>

#include "hypershard/tensor.h"

/* Elementwise loops go over the threads (OpenMP) from EW_PAR_MIN elements:
 * each element is computed the same way whatever the split. */
#define EW_PAR_MIN 65536

void hs_fill_f32(float *x, int64_t n, float v) {
#pragma omp parallel for schedule(static) if (n >= EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

void hs_add_f32(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void hs_add_to_zero_f32(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = 0.0f + x[i];
}

void hs_axpy_f32(float *y, float a, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void hs_scale_f32(float *x, float a, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

double hs_sum_f32(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

/* Sum of squares of one chunk: SUM_LANES independent fp64 accumulators
 * (the loop vectorises; one serial chain would cost an add latency per
 * element), then the tail, then the lanes in order. */
#define SUM_LANES 16
#define SUM_CHUNK 65536
#define SUM_GROUP 64

static double sumsq_chunk(const float *x, int64_t n) {
    double acc[SUM_LANES] = {0.0};
    int64_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    double s = 0.0;
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    for (int j = 0; j < SUM_LANES; j++) s += acc[j];
    return s;
}

/* Chunks of SUM_CHUNK elements, summed in chunk order: the value depends
 * on n only, not on the thread count that computed the chunks. */
double hs_sumsq_f32(const float *x, int64_t n) {
    int64_t chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double s = 0.0;
    for (int64_t g = 0; g < chunks; g += SUM_GROUP) {
        double part[SUM_GROUP];
        int m = chunks - g < SUM_GROUP ? (int)(chunks - g) : SUM_GROUP;
#pragma omp parallel for schedule(static) if (m > 1)
        for (int c = 0; c < m; c++) {
            int64_t lo = (g + c) * SUM_CHUNK;
            part[c] = sumsq_chunk(x + lo, n - lo < SUM_CHUNK ? n - lo : SUM_CHUNK);
        }
        for (int c = 0; c < m; c++) s += part[c];
    }
    return s;
}

/* Whether a block holds a NaN or an infinity: its largest magnitude's bit
 * pattern, a loop that vectorises (exponent all ones is Inf or NaN). */
#define FINITE_BLOCK 4096

static bool block_nonfinite(const float *x, int64_t n) {
    uint32_t top = 0;
    for (int64_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, &x[j], sizeof b);
        b &= 0x7FFFFFFFu;
        top = b > top ? b : top;
    }
    return top >= 0x7F800000u;
}

int64_t hs_first_nonfinite_f32(const float *x, int64_t n) {
    int64_t blocks = (n + FINITE_BLOCK - 1) / FINITE_BLOCK, first = blocks;
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= EW_PAR_MIN)
    for (int64_t k = 0; k < blocks; k++) {
        int64_t lo = k * FINITE_BLOCK, len = n - lo < FINITE_BLOCK ? n - lo : FINITE_BLOCK;
        if (k < first && block_nonfinite(x + lo, len)) first = k;
    }
    for (int64_t i = first * FINITE_BLOCK; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

float hs_max_abs_f32(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        /* A NaN must not vanish behind the comparison. */
        if (isnan(a)) return a;
        if (a > m) m = a;
    }
    return m;
}

/* NaN on either side counts as an infinite difference: a parity check must
 * never pass because a comparison with NaN is false. Equal values (equal
 * infinities included) differ by 0. */
double hs_max_rel_diff_f32(const float *a, const float *b, int64_t n, double floor) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (a[i] == b[i]) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        double ref = fabs((double)b[i]);
        double r = d / (ref > floor ? ref : floor);
        if (r > worst) worst = r;
    }
    return worst;
}
