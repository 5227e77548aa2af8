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
 * NS5 runs in fp32 (the reference uses bf16 on GPUs) on the device's
 * muon_newton_schulz; the momentum on its muon_momentum, and the update of
 * p (in its own dtype) on its muon_update. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"

int64_t hs_muon_work_floats(const hs_optim_param *p) {
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

/* The box of a sharded matrix: gather the direction, run NS on the whole
 * matrix (every holder computes the same bits from the same input) and keep
 * this shard's box of it. Returns it (rows x cols, contiguous) inside
 * `work`. */
static const float *muon_orthogonalise_shard(hs_device *d, const hs_optim_config *cfg,
                                             const hs_optim_param *p, const float *u, float *work,
                                             hs_error *e) {
    const hs_optim_gather *g = &p->gather;
    int64_t fc = g->full_cols ? g->full_cols : p->cols;
    float *full = work, *o = full + g->buffer_rows * fc, *ns = o + g->full_rows * fc;
    if (g->all_gather_rows(g->ctx, u, full, e) != HS_OK) {
        hs_error_append(e, e->code, "in the Muon step of '%s': gathering its %lldx%lld update",
                        p->fqn, (long long)g->full_rows, (long long)fc);
        return NULL;
    }
    d->k->muon_newton_schulz(d->stream, o, full, g->full_rows, fc, cfg->muon.ns_steps, ns);
    if (fc == p->cols) return o + g->row_offset * p->cols;
    /* a column slice: its rows into the (no longer needed) gather buffer */
    hs_dev_copy_2d(d, full, (size_t)p->cols * sizeof(float), o + g->row_offset * fc + g->col_offset,
                   (size_t)fc * sizeof(float), p->rows, (size_t)p->cols * sizeof(float));
    return full;
}

hs_status hs_muon_step_param(hs_device *d, const hs_optim_config *cfg, const hs_optim_param *p,
                             float *momentum, double lr, float *work, hs_error *e) {
    bool sharded = p->gather.all_gather_rows != NULL;
    if (p->numel == 0 && !sharded) return HS_OK;
    float *u = work;
    d->k->muon_momentum(d->stream, u, momentum, p->grad, (float)cfg->muon.momentum,
                        cfg->muon.nesterov, p->numel);
    const float *o = work + p->numel;
    int64_t rows = p->rows, cols = p->cols;
    if (sharded) {
        o = muon_orthogonalise_shard(d, cfg, p, u, work + p->numel, e);
        if (!o) return e->code;
        rows = p->gather.full_rows;
        cols = p->gather.full_cols ? p->gather.full_cols : p->cols;
    } else {
        /* [E, rows, cols] expert tensors: one orthogonalisation per matrix. */
        float *ns = work + 2 * p->numel;
        int64_t mat = p->rows * p->cols;
        for (int64_t off = 0; off < p->numel; off += mat)
            d->k->muon_newton_schulz(d->stream, work + p->numel + off, u + off, p->rows, p->cols,
                                     cfg->muon.ns_steps, ns);
    }
    if (p->numel == 0) return HS_OK;
    /* The shape scale is the whole matrix's, also for a row shard. */
    double scale = sqrt(fmax(1.0, (double)rows / (double)cols));
    float decay_factor = p->decay ? (float)(1.0 - lr * cfg->weight_decay) : 1.0f;
    d->k->muon_update(d->stream, p->data, p->dtype, o, decay_factor, (float)(lr * scale), p->numel);
    return HS_OK;
}
