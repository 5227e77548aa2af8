/* Blending several datasets by weight: which member each blended sample
 * comes from, so that every member's share of the first k samples stays
 * within one sample of weight_i * k. The greedy rule is Megatron-LM's
 * blending index: sample k goes to the member whose count lags its target
 * weight_i * (k + 1) the most. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

struct hs_blend {
    int n;
    double *w;      /* normalised weights */
    int64_t *count; /* samples given to each member so far */
    int64_t next;   /* the blended sample the counts stand before */
    int last;       /* member of sample next - 1 */
};

/* The member of sample k given the counts before it; members whose `full`
 * flag is set are passed over (NULL: none is). -1 when every member is. */
static int choose(const double *w, const int64_t *count, const bool *full, int n, int64_t k) {
    int best = -1;
    double best_err = 0;
    for (int i = 0; i < n; i++) {
        if ((full && full[i]) || w[i] <= 0) continue;
        double err = w[i] * (double)(k + 1) - (double)count[i];
        if (best < 0 || err > best_err) best = i, best_err = err;
    }
    return best;
}

hs_status hs_blend_weights_check(const double *weights, int n, const char *what, hs_error *e) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(weights[i]) || weights[i] < 0)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "%s[%d].weight: %g must be a finite number >= 0; weights are "
                                "relative shares (normalised by their sum)",
                                what, i, weights[i]);
        sum += weights[i];
    }
    if (n > 0 && !(sum > 0 && isfinite(sum)))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "%s: the weights sum to %g; at least one weight must be > 0 (and the "
                            "sum finite)",
                            what, sum);
    return HS_OK;
}

hs_status hs_blend_create(const double *weights, int n, hs_blend **out, hs_error *e) {
    *out = NULL;
    hs_status s = hs_blend_weights_check(weights, n, "data.blend", e);
    if (s != HS_OK) return s;
    if (n < 1) return hs_error_set(e, HS_ERR_CONFIG, "data.blend: a blend needs a member");
    hs_blend *b = calloc(1, sizeof *b);
    if (b) b->w = malloc(sizeof(double) * (size_t)n);
    if (b) b->count = calloc((size_t)n, sizeof(int64_t));
    if (!b || !b->w || !b->count) {
        hs_blend_free(b);
        return hs_error_oom(e, "data.blend: the blending state of %d datasets", n);
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += weights[i];
    for (int i = 0; i < n; i++) b->w[i] = weights[i] / sum;
    b->n = n;
    *out = b;
    return HS_OK;
}

void hs_blend_free(hs_blend *b) {
    if (!b) return;
    free(b->w);
    free(b->count);
    free(b);
}

int hs_blend_at(hs_blend *b, int64_t k, int64_t *local) {
    HS_ASSERT(k >= 0);
    /* The state moves forward from where the last question left it; an
     * earlier sample replays from the start (a resume, or another rank's
     * slice read first), so the answer depends on k alone. */
    if (k < b->next - 1 || b->next == 0) {
        memset(b->count, 0, sizeof(int64_t) * (size_t)b->n);
        b->next = 0;
    }
    while (b->next <= k) {
        b->last = choose(b->w, b->count, NULL, b->n, b->next);
        b->count[b->last]++;
        b->next++;
    }
    *local = b->count[b->last] - 1;
    return b->last;
}

hs_status hs_blend_fill(const double *weights, const int64_t *caps, int n, int32_t *member,
                        int64_t *local, int64_t total, hs_error *e) {
    hs_blend *b;
    hs_status s = hs_blend_create(weights, n, &b, e);
    if (s != HS_OK) return s;
    bool *full = calloc((size_t)n, sizeof(bool));
    if (!full) {
        hs_blend_free(b);
        return hs_error_oom(e, "data.blend: %d flags", n);
    }
    for (int64_t k = 0; k < total; k++) {
        for (int i = 0; i < n; i++) full[i] = b->count[i] >= caps[i];
        int m = choose(b->w, b->count, full, n, k);
        HS_ASSERT(m >= 0); /* total is at most the sum of the caps of weighted members */
        member[k] = m;
        local[k] = b->count[m]++;
    }
    free(full);
    hs_blend_free(b);
    return HS_OK;
}
