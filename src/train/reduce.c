/* Cross-rank reductions for metrics. The collectives reduce only fp32/16-bit
 * payloads, which would cut a loss sum to 7 digits; an all-gather moves bytes
 * unchanged, so 8-byte values travel as pairs of 4-byte elements and are
 * combined here in fp64, as a pairwise tree in rank order (hs_tree_f64: the
 * order a one-rank run adds the sequences those ranks held), the same on
 * every rank. */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

static hs_status gather_words(hs_pg *g, const void *vals, int n, void **all, hs_error *e) {
    int w = hs_pg_size(g);
    *all = malloc(sizeof(uint64_t) * (size_t)n * (size_t)w);
    if (!*all) return hs_error_oom(e, "metrics: cannot allocate the gather buffer");
    uint64_t *mine = (uint64_t *)*all + (size_t)hs_pg_rank(g) * (size_t)n;
    memcpy(mine, vals, sizeof(uint64_t) * (size_t)n);
    /* In place: this rank's block already sits at out + rank*count. */
    return hs_pg_all_gather(g, NULL, *all, mine, 2 * (int64_t)n, HS_DTYPE_F32, e);
}

hs_status hs_reduce_sum_f64(hs_pg *g, double *vals, int n, hs_error *e) {
    if (hs_pg_size(g) == 1) return HS_OK;
    void *all = NULL;
    hs_status s = gather_words(g, vals, n, &all, e);
    if (s == HS_OK) {
        const double *d = all;
        for (int i = 0; i < n; i++) vals[i] = hs_tree_f64(d + i, hs_pg_size(g), n);
    }
    free(all);
    return s;
}

hs_status hs_reduce_max_i64(hs_pg *g, int64_t *vals, int n, hs_error *e) {
    if (hs_pg_size(g) == 1) return HS_OK;
    void *all = NULL;
    hs_status s = gather_words(g, vals, n, &all, e);
    if (s == HS_OK) {
        const int64_t *d = all;
        for (int i = 0; i < n; i++)
            for (int r = 0; r < hs_pg_size(g); r++)
                if (d[(size_t)r * n + i] > vals[i]) vals[i] = d[(size_t)r * n + i];
    }
    free(all);
    return s;
}
