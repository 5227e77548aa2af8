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

/* The slowest rank's value (groups of at most 64 ranks). */
static inline double hs_bench_max_over(hs_pg *g, double v) {
    float all[64], x = (float)v;
    hs_error e;
    if (hs_pg_size(g) > 64 || hs_pg_all_gather(g, NULL, all, &x, 1, HS_DTYPE_F32, &e) != HS_OK)
        return v;
    for (int r = 0; r < hs_pg_size(g); r++) x = all[r] > x ? all[r] : x;
    return x;
}

/* "load average WHEN: a b c" (this rank prints it). */
static inline void hs_bench_print_load(const char *when) {
    double l[3];
    if (getloadavg(l, 3) == 3) printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

#endif
