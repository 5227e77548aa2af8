/* Sums over a micro-batch's tokens in one order for every layout
 * (train.reproducibility: layout; docs/numerics.md "Layout-invariant
 * training"). Each sequence's part of a token sum is computed alone, the
 * same way whichever rank and micro-batch hold the sequence, and the parts
 * are added as a pairwise tree over the sequences: parts 0+1, 2+3, then
 * (0+1)+(2+3), and so on. A rank's micro-batch holds an aligned block of
 * the global batch (docs/data.md "What each rank reads"), so its tree is
 * a subtree of the global one and the reductions across ranks and
 * micro-batches merge whole subtrees. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "model/layers.h"

/* The pairwise tree of parts 0..n-1 (n a power of two) in scratch slots
 * of len floats (hs_tree_stack: each new part merged with the equal-sized
 * subtrees before it, left + right). Returns where the sum lies. */
static float *tree_sum(hs_model *m, int n, int64_t len, hs_canon_part_fn fn, void *ctx,
                       float *scratch) {
    hs_tree_stack st = {.top = 0};
    bool swap = m->canon_mutate == HS_CANON_SWAP_LEAVES && n >= 4;
    for (int p = 0; p < n; p++) {
        int s = st.top, leaf = swap && (p == 1 || p == 2) ? 3 - p : p;
        fn(ctx, leaf, scratch + (int64_t)s * len);
        int merges = hs_tree_stack_push(&st);
        for (int k = 0; k < merges; k++)
            hs_dev_add(m->dev, scratch + (int64_t)(s - k - 1) * len,
                       scratch + (int64_t)(s - k) * len, len);
    }
    HS_ASSERT(st.top == 1);
    return scratch;
}

static int64_t tree_slots(int n) {
    int levels = 0;
    while ((1 << levels) < n) levels++;
    return levels + 2;
}

hs_status hs_canon_mutation_from_env(hs_canon_mutation *out, hs_error *e) {
    const char *v = getenv("HS_CANON_TEST_MUTATE");
    *out = HS_CANON_INTACT;
    if (!v || !v[0]) return HS_OK;
    if (!strcmp(v, "swap_leaves")) *out = HS_CANON_SWAP_LEAVES;
    else if (!strcmp(v, "wgrad_k")) *out = HS_CANON_WGRAD_K;
    else
        return hs_error_set(e, HS_ERR_CONFIG,
                            "HS_CANON_TEST_MUTATE=%s: expected swap_leaves or wgrad_k (a test "
                            "hook; unset it to train)",
                            v);
    return HS_OK;
}

void hs_canon_scratch_floats(const hs_model *m, int64_t *tree, int64_t *tied) {
    int64_t len = 0;
    for (int i = 0; i < m->n_params; i++) {
        int64_t n = hs_param_local_numel(&m->params[i]);
        len = n > len ? n : len;
    }
    *tree = tree_slots(m->opt.max_batch) * len;
    *tied = m->head && m->head == m->embed
                ? (int64_t)m->opt.max_batch * hs_param_local_numel(m->embed)
                : 0;
}

/* The model's block, sized for its capacity when it was created
 * (hs_canon_scratch_floats), holds a tree of any micro-batch's parts. */
float *hs_canon_tree(hs_model *m, int64_t len, hs_canon_part_fn fn, void *ctx) {
    HS_ASSERT(tree_slots(m->canon_nseq) * len <= m->canon_floats);
    return tree_sum(m, m->canon_nseq, len, fn, ctx, m->canon_buf);
}

/* The tree's sum added into a parameter's gradient: stored over it while
 * the buffer holds no value yet (grad_unset), added to after. */
void hs_canon_into_grad(hs_model *m, hs_param *w, const float *sum, int64_t len) {
    if (!sum) return;
    if (w->grad_unset) hs_dev_convert(m->dev, w->grad, w->grad_dtype, sum, HS_DTYPE_F32, len);
    else if (w->grad_dtype == HS_DTYPE_F32) hs_dev_add(m->dev, w->grad, sum, len);
    else
        hs_dev_add_cast(m->dev, w->grad, w->grad_dtype, w->grad, w->grad_dtype, sum, HS_DTYPE_F32,
                        len);
    w->grad_unset = false;
}

typedef struct wgrad_ctx {
    hs_model *m;
    const void *dy, *x;
    hs_dtype ydt;
    int64_t T;
    int IC, OC;
} wgrad_ctx;

static void wgrad_part(void *vctx, int s, float *out) {
    const wgrad_ctx *c = vctx;
    int64_t r0 = (int64_t)s * c->T;
    /* the mutation's K blocking: the sequence's first half, then the rest */
    int64_t k0 = c->m->canon_mutate == HS_CANON_WGRAD_K && c->T >= 2 ? c->T / 2 : c->T;
    for (int64_t k = 0; k < c->T; k += k0) {
        int64_t K = c->T - k < k0 ? c->T - k : k0;
        hs_dev_gemm(c->m->dev, true, false, c->OC, c->IC, K, 1.0f,
                    hs_cat(c->dy, c->ydt, (r0 + k) * c->OC), c->ydt, c->OC,
                    hs_cat(c->x, c->m->dt, (r0 + k) * c->IC), c->m->dt, c->IC, k ? 1.0f : 0.0f, out,
                    HS_DTYPE_F32, c->IC);
    }
}

void hs_canon_linear_wgrad(hs_model *m, hs_param *w, const void *dy, hs_dtype ydt, const void *x,
                           int64_t N, int IC, int OC) {
    int n = m->canon_nseq;
    int64_t T = N / n, len = (int64_t)OC * IC;
    HS_ASSERT(n > 0 && n * T == N);
    wgrad_ctx c = {.m = m, .dy = dy, .x = x, .ydt = ydt, .T = T, .IC = IC, .OC = OC};
    hs_canon_into_grad(m, w, hs_canon_tree(m, len, wgrad_part, &c), len);
}

typedef struct rows_ctx {
    hs_model *m;
    const void *dy, *x;
    hs_dtype ydt, xdt;
    const int64_t *first;
    int IC, OC;
} rows_ctx;

/* Sequence s's part of a product over rows of varying count (an expert's
 * rows of each sequence): zero when it has none. */
static void rows_part(void *vctx, int s, float *out) {
    const rows_ctx *c = vctx;
    int64_t r0 = c->first[s], n = c->first[s + 1] - r0;
    if (n == 0) {
        hs_dev_zero(c->m->dev, out, (size_t)c->OC * (size_t)c->IC * sizeof(float));
        return;
    }
    hs_dev_gemm(c->m->dev, true, false, c->OC, c->IC, n, 1.0f, hs_cat(c->dy, c->ydt, r0 * c->OC),
                c->ydt, c->OC, hs_cat(c->x, c->xdt, r0 * c->IC), c->xdt, c->IC, 0.0f, out,
                HS_DTYPE_F32, c->IC);
}

/* The MoE layer's weight gradients (hs_moe_wgrad.fn): dw += the tree of
 * the sequences' parts (the layer's gradients are zeroed before its
 * backward, never stored over). */
void hs_canon_rows_wgrad(void *ctx, void *dw, hs_dtype gdt, const void *dy, hs_dtype ydt,
                         const void *x, hs_dtype xdt, const int64_t *first, int IC, int OC) {
    hs_model *m = ctx;
    rows_ctx c = {
        .m = m, .dy = dy, .x = x, .ydt = ydt, .xdt = xdt, .first = first, .IC = IC, .OC = OC};
    int64_t len = (int64_t)OC * IC;
    const float *sum = hs_canon_tree(m, len, rows_part, &c);
    if (gdt == HS_DTYPE_F32) hs_dev_add(m->dev, dw, sum, len);
    else hs_dev_add_cast(m->dev, dw, gdt, dw, gdt, sum, HS_DTYPE_F32, len);
}

typedef struct norm_ctx {
    hs_model *m;
    float *dx;
    const float *dout, *rstd;
    const void *x, *w;
    hs_dtype xdt;
    int64_t rows; /* of one sequence */
    int C;
} norm_ctx;

static void norm_part(void *vctx, int s, float *out) {
    const norm_ctx *c = vctx;
    int64_t r0 = (int64_t)s * c->rows;
    hs_dev_zero(c->m->dev, out, (size_t)c->C * sizeof(float));
    c->m->k->rmsnorm_bwd(c->m->s, c->dx + r0 * c->C, out, HS_DTYPE_F32, c->dout + r0 * c->C,
                         hs_cat(c->x, c->xdt, r0 * c->C), c->xdt, c->w, c->rstd + r0, c->m->dt,
                         c->rows, c->C, c->m->norm_part);
}

void hs_canon_rmsnorm_bwd(hs_model *m, float *dx, hs_param *w, const float *dout, const void *x,
                          hs_dtype xdt, const float *rstd, int64_t rows, int C) {
    int nseq = m->canon_nseq;
    HS_ASSERT(nseq > 0 && rows % nseq == 0);
    if (!w->grad) {
        m->k->rmsnorm_bwd(m->s, dx, NULL, w->grad_dtype, dout, x, xdt, w->data, rstd, m->dt, rows,
                          C, m->norm_part);
        return;
    }
    norm_ctx c = {.m = m,
                  .dx = dx,
                  .dout = dout,
                  .rstd = rstd,
                  .x = x,
                  .w = w->data,
                  .xdt = xdt,
                  .rows = rows / nseq,
                  .C = C};
    hs_canon_into_grad(m, w, hs_canon_tree(m, C, norm_part, &c), C);
}

typedef struct embed_ctx {
    hs_model *m;
    const float *dres;
    const int32_t *tokens;
    int64_t T, len;
} embed_ctx;

static void embed_part(void *vctx, int s, float *out) {
    const embed_ctx *c = vctx;
    hs_model *m = c->m;
    hs_param w = *m->embed;
    w.grad = out, w.grad_dtype = HS_DTYPE_F32;
    hs_dev_zero(m->dev, out, (size_t)c->len * sizeof(float));
    int64_t r0 = (int64_t)s * c->T;
    m->par->embedding_bwd(m->par->ctx, c->dres + r0 * m->C, c->tokens + r0, &w, c->T);
    /* tied: the sequence's part is its head part + its embedding part */
    if (m->head == m->embed && m->canon_tied)
        hs_dev_add(m->dev, out, m->canon_tied + (int64_t)s * c->len, c->len);
}

float *hs_canon_tied_parts(hs_model *m, int64_t len) {
    HS_ASSERT((int64_t)m->canon_nseq * len <= m->canon_tied_floats);
    return m->canon_tied;
}

void hs_canon_embedding_bwd(hs_model *m, const float *dres, const int32_t *tokens, int64_t N) {
    hs_param *w = m->embed;
    int64_t len = hs_param_local_numel(w);
    embed_ctx c = {.m = m, .dres = dres, .tokens = tokens, .T = N / m->canon_nseq, .len = len};
    hs_canon_into_grad(m, w, hs_canon_tree(m, len, embed_part, &c), len);
}
