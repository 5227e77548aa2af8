/* Muon (MomentUm Orthogonalized by Newton-Schulz), after Keller Jordan's
 * reference implementation (github.com/KellerJordan/Muon, and the write-up
 * "Muon: An optimizer for hidden layers in neural networks", 2024). The
 * exact rule is in docs/optimizers.md:
 *
 *   m  = mu * m + g
 *   u  = nesterov ? g + mu * m : m
 *   O  = NS5(u)                       (per rows x cols matrix)
 *   p *= 1 - lr * wd                  (when decay)
 *   p -= lr * sqrt(max(1, rows / cols)) * O
 *
 * A row shard (hs_optim_gather) keeps its momentum local and all-gathers u.
 *
 * NS5 runs in fp32 (the reference uses bf16 on GPUs); its matmuls go to BLAS. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

int64_t hs_newton_schulz5_scratch_floats(int64_t rows, int64_t cols)
{
    int64_t n = rows < cols ? rows : cols;
    return 2 * rows * cols + 2 * n * n;
}

static void transpose(float *dst, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* One iteration on X (n x m, n <= m): X <- a X + (b A + c A^2) X, A = X X^T. */
static void ns_iterate(float *x_next, const float *x, float *gram, float *poly, int64_t n, int64_t m)
{
    hs_sgemm(false, true, n, n, m, 1.0f, x, m, x, m, 0.0f, gram, n);
    memcpy(poly, gram, (size_t)(n * n) * sizeof(float));
    hs_sgemm(false, false, n, n, n, NS_C, gram, n, gram, n, NS_B, poly, n);
    memcpy(x_next, x, (size_t)(n * m) * sizeof(float));
    hs_sgemm(false, false, n, m, n, 1.0f, poly, n, x, m, NS_A, x_next, m);
}

void hs_newton_schulz5(float *out, const float *g, int64_t rows, int64_t cols, int steps,
                       float *scratch)
{
    HS_ASSERT(rows > 0 && cols > 0 && steps >= 0);
    float *owned = NULL;
    if (scratch == NULL) {
        owned = malloc((size_t)hs_newton_schulz5_scratch_floats(rows, cols) * sizeof(float));
        if (owned == NULL)
            hs_oom("Newton-Schulz: cannot allocate scratch for a %lldx%lld matrix",
                     (long long)rows, (long long)cols);
        scratch = owned;
    }
    /* Iterate on the wide orientation so the Gram matrix is the small one. */
    bool tall = rows > cols;
    int64_t n = tall ? cols : rows, m = tall ? rows : cols, numel = rows * cols;
    float *x = scratch, *x_next = scratch + numel, *gram = x_next + numel, *poly = gram + n * n;
    if (tall) transpose(x, g, rows, cols);
    else memcpy(x, g, (size_t)numel * sizeof(float));
    double norm = sqrt(hs_sumsq_f32(x, numel));
    hs_scale_f32(x, (float)(1.0 / (norm + 1e-7)), numel);
    for (int s = 0; s < steps; s++) {
        ns_iterate(x_next, x, gram, poly, n, m);
        float *t = x;
        x = x_next, x_next = t;
    }
    if (tall) transpose(out, x, cols, rows);
    else memcpy(out, x, (size_t)numel * sizeof(float));
    free(owned);
}

int64_t hs_muon_work_floats(const hs_optim_param *p)
{
    const hs_optim_gather *g = &p->gather;
    if (g->all_gather_rows) {
        /* local direction, gathered (padded) direction, orthogonalised
         * whole matrix, NS scratch of the whole matrix */
        int64_t fc = g->full_cols ? g->full_cols : p->cols;
        return p->numel + (g->buffer_rows + g->full_rows) * fc +
               hs_newton_schulz5_scratch_floats(g->full_rows, fc);
    }
    if (p->numel == 0) return 0;
    /* direction u, orthogonalised O, NS scratch for one matrix */
    return 2 * p->numel + hs_newton_schulz5_scratch_floats(p->rows, p->cols);
}

typedef struct muon_apply_ctx {
    const float *update;
    float decay_factor;
    float step; /* lr * scale */
} muon_apply_ctx;

static void muon_apply(float *p, int64_t off, int64_t n, const void *vctx)
{
    const muon_apply_ctx *x = vctx;
    const float *o = x->update + off;
    for (int64_t i = 0; i < n; i++) p[i] = p[i] * x->decay_factor - x->step * o[i];
}

static void muon_direction(const hs_optim_config *cfg, const hs_optim_param *p, float *momentum,
                           float *u)
{
    float mu = (float)cfg->muon.momentum;
    for (int64_t i = 0; i < p->numel; i++) {
        momentum[i] = mu * momentum[i] + p->grad[i];
        u[i] = cfg->muon.nesterov ? p->grad[i] + mu * momentum[i] : momentum[i];
    }
}

/* The box of a sharded matrix: gather the direction, run NS on the whole
 * matrix (every holder computes the same bits from the same input) and keep
 * this shard's box of it. Returns it (rows x cols, contiguous) inside
 * `work`. */
static const float *muon_orthogonalise_shard(const hs_optim_config *cfg, const hs_optim_param *p,
                                             const float *u, float *work)
{
    const hs_optim_gather *g = &p->gather;
    int64_t fc = g->full_cols ? g->full_cols : p->cols;
    float *full = work, *o = full + g->buffer_rows * fc, *ns = o + g->full_rows * fc;
    hs_error e;
    hs_error_clear(&e);
    if (g->all_gather_rows(g->ctx, u, full, &e) != HS_OK)
        hs_panic("Muon step of '%s': gathering the %lldx%lld update failed: %s", p->fqn,
                 (long long)g->full_rows, (long long)fc, e.msg);
    hs_newton_schulz5(o, full, g->full_rows, fc, cfg->muon.ns_steps, ns);
    if (fc == p->cols) return o + g->row_offset * p->cols;
    /* a column slice: its rows into the (no longer needed) gather buffer */
    for (int64_t r = 0; r < p->rows; r++)
        memcpy(full + r * p->cols, o + (g->row_offset + r) * fc + g->col_offset,
               (size_t)p->cols * sizeof(float));
    return full;
}

void hs_muon_step_param(const hs_optim_config *cfg, const hs_optim_param *p, float *momentum,
                        double lr, float *work)
{
    bool sharded = p->gather.all_gather_rows != NULL;
    if (p->numel == 0 && !sharded) return;
    float *u = work;
    muon_direction(cfg, p, momentum, u);
    const float *o = work + p->numel;
    int64_t rows = p->rows, cols = p->cols;
    if (sharded) {
        o = muon_orthogonalise_shard(cfg, p, u, work + p->numel);
        rows = p->gather.full_rows;
        cols = p->gather.full_cols ? p->gather.full_cols : p->cols;
    } else {
        /* [E, rows, cols] expert tensors: one orthogonalisation per matrix. */
        float *ns = work + 2 * p->numel;
        int64_t mat = p->rows * p->cols;
        for (int64_t off = 0; off < p->numel; off += mat)
            hs_newton_schulz5(work + p->numel + off, u + off, p->rows, p->cols,
                              cfg->muon.ns_steps, ns);
    }
    if (p->numel == 0) return;
    /* The shape scale is the whole matrix's, also for a row shard. */
    double scale = sqrt(fmax(1.0, (double)rows / (double)cols));
    muon_apply_ctx x = {
        .update = o,
        .decay_factor = p->decay ? (float)(1.0 - lr * cfg->weight_decay) : 1.0f,
        .step = (float)(lr * scale),
    };
    hs_optim_update_data(p->data, p->dtype, p->numel, muon_apply, &x);
}
