/* Pairwise trees: the one order in which train.reproducibility: layout
 * adds per-sequence, per-rank and per-micro-batch sums (docs/numerics.md
 * "Layout-invariant training"): 0+1, 2+3, then (0+1)+(2+3), the largest
 * power of two on the left. */
#include "hypershard/tensor.h"

double hs_tree_f64(const double *v, int n, int stride) {
    if (n == 1) return v[0];
    int half = 1;
    while (half * 2 < n) half *= 2;
    return hs_tree_f64(v, half, stride) + hs_tree_f64(v + (size_t)half * stride, n - half, stride);
}

int hs_tree_stack_push(hs_tree_stack *t) {
    int level = 0, merges = 0;
    while (t->top > 0 && t->level[t->top - 1] == level) t->top--, level++, merges++;
    HS_ASSERT(t->top <= HS_TREE_MAX_LEVELS);
    t->level[t->top++] = level;
    return merges;
}
