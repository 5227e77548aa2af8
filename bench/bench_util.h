/* bench/bench_util.h — what the benchmarks share: medians, the slowest
 * rank's value, the load average. */
#ifndef HS_BENCH_UTIL_H
#define HS_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "hypershard/comm.h"

static inline int hs_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static inline double hs_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, hs_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Every rank's v in all[] (groups of at most 64 ranks); the count, or 0. */
static inline int hs_bench_gather_over(hs_pg *g, double v, float all[64]) {
    float x = (float)v;
    hs_error e;
    if (hs_pg_size(g) > 64 || hs_pg_all_gather(g, NULL, all, &x, 1, HS_DTYPE_F32, &e) != HS_OK)
        return 0;
    return hs_pg_size(g);
}

/* The slowest rank's value. */
static inline double hs_bench_max_over(hs_pg *g, double v) {
    float all[64];
    int n = hs_bench_gather_over(g, v, all);
    double x = v;
    for (int r = 0; r < n; r++) x = all[r] > x ? all[r] : x;
    return x;
}

/* The ranks' mean value. */
static inline double hs_bench_mean_over(hs_pg *g, double v) {
    float all[64];
    int n = hs_bench_gather_over(g, v, all);
    double sum = 0.0;
    for (int r = 0; r < n; r++) sum += all[r];
    return n ? sum / n : v;
}

/* "load average WHEN: a b c" (this rank prints it). */
static inline void hs_bench_print_load(const char *when) {
    double l[3];
    if (getloadavg(l, 3) == 3) printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

/* The cpu backend's rate of one of bench ops' ops by its name ("axpy",
 * "attention fwd", ...) at its full shape: FLOP/s or bytes/s; 0 with e
 * set when it cannot run (bench_ops.c). */
double hs_bench_ops_cpu_rate(const char *name, hs_error *e);

#endif
