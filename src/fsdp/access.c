/* What the trainer sees of a wrapped model: hooks, micro-batch flags, the
 * optimizer's view of the local shards, the global grad norm, and whole
 * tensors in and out for export and import. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fusion.h"
#include "fsdp/manager.h"
#include "fsdp/policy.h"
#include "fsdp/prefetch.h"

const hs_model_hooks *hs_fsdp_hooks(hs_fsdp *f) { return &f->ctx.hooks; }

void hs_fsdp_set_micro_batch(hs_fsdp *f, bool requires_grad_sync, bool reshard_after_backward,
                             bool is_last) {
    /* spec 004 §2.3: the last micro-batch always syncs and reshards. */
    f->ctx.sync = requires_grad_sync || is_last;
    f->ctx.reshard = reshard_after_backward || is_last;
}

void hs_fsdp_begin_step(hs_fsdp *f) {
    /* and the secondary pieces of forwards that had no backward (evaluation) */
    for (int u = 0; u < f->ctx.n_units; u++) {
        f->ctx.units[u].fwd_outstanding = 0;
        if (f->ctx.units[u].fusion) hs_fsdp_fusion_drop_secondary(f->ctx.units[u].fusion);
    }
    for (int i = 0; i < f->ctx.n_params; i++) hs_fsdp_param_drop_secondary(&f->ctx.params[i]);
}

void hs_fsdp_drain(hs_fsdp *f) { hs_fsdp_ctx_drain(&f->ctx); }

/* Muon's whole-matrix view of a row shard (hs_optim_gather): this shard's
 * rows go to their torch.chunk slot of the padded unsharded buffer and one
 * in-place all-gather over the shard group fills the rest, so rows [0, D0)
 * are the whole matrix. The optimizer issues these in its parameter order,
 * the same on every rank of the group, as comm.h's ordering rule needs. */
static hs_status muon_gather_rows(void *ctx, const float *local, float *full, hs_error *e) {
    hs_fsdp_param *fp = ctx;
    const hs_fsdp_plan *pl = &fp->plan;
    float *mine = full + fp->mi.shard_rank * pl->padded_sharded_numel;
    hs_device *d = fp->mem->dev;
    hs_dev_copy(d, mine, local, (size_t)pl->actual_sharded_numel * sizeof(float));
    hs_dev_zero(d, mine + pl->actual_sharded_numel,
                (size_t)(pl->padded_sharded_numel - pl->actual_sharded_numel) * sizeof(float));
    return hs_pg_all_gather(fp->mi.shard_pg, d->stream, full, mine, pl->padded_sharded_numel,
                            HS_DTYPE_F32, e);
}

/* A matrix TP splits (Shard(0) or Shard(1) on a tp mesh > 1): Muon needs
 * the whole global matrix. */
static bool tp_split(const hs_fsdp_param *fp) {
    return fp->mi.tp_size > 1 && fp->p->on_tp_mesh && fp->p->tp.kind == HS_PLACEMENT_SHARD;
}

/* The whole matrix of a TP-split parameter in `full`, laid out [F | B | S]:
 * F the whole full_rows x full_cols matrix, B the TP ranks' local matrices
 * in rank order (Shard(1) only; Shard(0) gathers straight into F), S this
 * TP rank's local matrix gathered over the FSDP shard group (padded rows).
 * Collective over the shard group, then the tp group, in the optimizer's
 * parameter order. */
static hs_status muon_gather_tp(void *ctx, const float *local, float *full, hs_error *e) {
    hs_fsdp_param *fp = ctx;
    const hs_param *p = fp->p;
    const hs_fsdp_plan *pl = &fp->plan;
    int64_t whole = p->shape[0] * p->shape[1], ln = pl->unpacked_numel;
    float *blocks = full + whole, *staged = blocks + whole;
    hs_status st = HS_OK;
    if (fp->needs_all_gather) st = muon_gather_rows(fp, local, staged, e);
    else hs_dev_copy(fp->mem->dev, staged, local, (size_t)ln * sizeof(float));
    if (st != HS_OK) return st;
    hs_stream *s = fp->mem->dev->stream;
    if (p->tp.dim == 0) return hs_pg_all_gather(fp->mi.tp_pg, s, full, staged, ln, HS_DTYPE_F32, e);
    st = hs_pg_all_gather(fp->mi.tp_pg, s, blocks, staged, ln, HS_DTYPE_F32, e);
    int64_t rows = p->shape[0], lc = p->local_shape[1];
    size_t lb = (size_t)lc * sizeof(float);
    for (int r = 0; st == HS_OK && r < fp->mi.tp_size; r++)
        hs_dev_copy_2d(fp->mem->dev, full + r * lc, (size_t)p->shape[1] * sizeof(float),
                       blocks + r * ln, lb, rows, lb);
    return st;
}

static void set_muon_gather(hs_fsdp_param *fp, hs_optim_param *o) {
    const hs_param *p = fp->p;
    const hs_fsdp_layout *l = &fp->plan.layout;
    if (!tp_split(fp)) {
        o->gather = (hs_optim_gather){.ctx = fp,
                                      .full_rows = l->d0,
                                      .row_offset = l->row_offset,
                                      .buffer_rows = l->padded_rows,
                                      .all_gather_rows = muon_gather_rows};
        return;
    }
    int64_t fc = p->shape[1], staged = l->padded_rows * fp->plan.row_numel;
    o->gather = (hs_optim_gather){.ctx = fp,
                                  .full_rows = p->shape[0],
                                  .full_cols = fc,
                                  .row_offset = p->local_offset[0] + l->row_offset,
                                  .col_offset = p->local_offset[1],
                                  .buffer_rows = 2 * p->shape[0] + (staged + fc - 1) / fc,
                                  .all_gather_rows = muon_gather_tp};
}

static void fill_optim(hs_fsdp *f) {
    f->optim = calloc((size_t)f->ctx.n_params + 1, sizeof *f->optim);
    HS_ASSERT(f->optim != NULL);
    for (int i = 0; i < f->ctx.n_params; i++) {
        hs_fsdp_param *fp = &f->ctx.params[i];
        hs_optim_param *o = &f->optim[i];
        o->fqn = fp->p->fqn;
        o->data = fp->sharded;
        o->dtype = HS_DTYPE_F32;
        o->grad = fp->sharded_grad;
        o->numel = fp->plan.actual_sharded_numel;
        o->first = fp->plan.layout.row_offset * fp->plan.row_numel;
        /* the step rewrites the 16-bit model shard as it updates the main
         * param (its padded tail stays zero); hs_fsdp_after_optim_step
         * then has none to write back */
        o->copy = fp->lp_shard;
        o->copy_dtype = fp->compute_dtype;
        /* Same matrix view as the one-process engine: Muon takes each
         * routed expert's [out, in] matrix on its own, and dim-0 shards of
         * an expert tensor hold whole experts. */
        const hs_param *p = fp->p;
        bool expert = p->kind == HS_PARAM_EXPERT && p->ndim == 3;
        o->rows = expert ? p->shape[1] : fp->plan.layout.actual_rows;
        o->cols = expert ? p->shape[2] : fp->plan.row_numel;
        o->decay = p->kind != HS_PARAM_NORM;
        o->muon = (p->kind == HS_PARAM_LINEAR && p->ndim == 2) || expert;
        o->frozen = p->frozen;
        /* A row shard or TP slice of a hidden matrix needs the others'
         * parts for Newton-Schulz; whole experts and unsharded params do
         * not. */
        if (o->muon && !expert && (fp->needs_all_gather || tp_split(fp))) set_muon_gather(fp, o);
    }
}

int hs_fsdp_optim_params(hs_fsdp *f, hs_optim_param **out) {
    if (!f->optim) fill_optim(f);
    *out = f->optim;
    return f->ctx.n_params;
}

/* Each element counts once: a sharded gradient's squares are summed over
 * its shard group; replicas (HSDP, replicate_params, shard size 1) hold the
 * same values, so their local sum already is the global one. Across TP a
 * Shard-placed parameter's pieces are summed over the tp group, while a
 * Replicate one (identical on every TP rank after the TP tail) counts once.
 * sums[g][0]: TP-whole squares, sums[g][1]: TP-sharded squares. */
/* Which model-parallel group a parameter's local tensors are distinct
 * pieces over: 0 none (replicated), 1 tp (TP-split), 2 ep (routed experts
 * under EP). */
static int split_kind(const hs_fsdp_param *fp) {
    if (fp->p->on_ep_mesh && fp->mi.ep_size > 1) return 2;
    return fp->mi.tp_size > 1 && fp->p->on_tp_mesh && fp->p->tp.kind == HS_PLACEMENT_SHARD;
}

/* The index of shard group pg among the n groups seen so far (at most
 * 8), added when new (*added). */
static int group_index(hs_pg **groups, int *n, hs_pg *pg, bool *added) {
    int g = 0;
    while (g < *n && groups[g] != pg) g++;
    *added = g == *n;
    if (*added) {
        HS_ASSERT(*n < 8);
        groups[(*n)++] = pg;
    }
    return g;
}

hs_status hs_fsdp_grad_norm(hs_fsdp *f, double *norm, hs_error *e) {
    hs_pg *groups[8], *split_pg[3] = {NULL, NULL, NULL};
    float sums[8][3];
    int n_groups = 0;
    double by_kind[3] = {0.0, 0.0, 0.0};
    /* The shards' sums of squares by sumsq_many, NORM_CHUNK parameters a
     * call (a GPU waits once per call, not once per parameter), added in
     * parameter order. */
    enum { NORM_CHUNK = 256 };
    const float *xs[NORM_CHUNK];
    int64_t ns[NORM_CHUNK];
    double ss[NORM_CHUNK];
    int np = f->ctx.n_params;
    for (int i = 0; i < np; i++) {
        hs_fsdp_param *fp = &f->ctx.params[i];
        int k = i % NORM_CHUNK;
        if (k == 0) {
            int end = np - i < NORM_CHUNK ? np : i + NORM_CHUNK;
            for (int a = i; a < end; a++) {
                hs_fsdp_param_settle_sharded_grad(&f->ctx.params[a]);
                xs[a - i] = f->ctx.params[a].sharded_grad;
                ns[a - i] = f->ctx.params[a].plan.actual_sharded_numel;
            }
            for (int a = i, b; a < end; a = b) { /* a call per run on one device */
                hs_device *dev = f->ctx.params[a].mem->dev;
                for (b = a + 1; b < end && f->ctx.params[b].mem->dev == dev; b++) {
                }
                hs_dev_sumsq_many(dev, ss + (a - i), xs + (a - i), ns + (a - i), b - a);
            }
        }
        double s = ss[k];
        int kind = split_kind(fp);
        if (kind) split_pg[kind] = kind == 1 ? fp->mi.tp_pg : fp->mi.ep_pg;
        if (!fp->needs_all_gather) {
            by_kind[kind] += s;
            continue;
        }
        bool added;
        int g = group_index(groups, &n_groups, fp->mi.shard_pg, &added);
        if (added) sums[g][0] = sums[g][1] = sums[g][2] = 0.0f;
        sums[g][kind] += (float)s;
    }
    for (int g = 0; g < n_groups; g++) {
        hs_status st =
            hs_pg_all_reduce(groups[g], NULL, sums[g], 3, HS_DTYPE_F32, HS_REDUCE_SUM, e);
        if (st != HS_OK) return st;
        for (int k = 0; k < 3; k++) by_kind[k] += sums[g][k];
    }
    /* Every rank takes part in both, in this order, when the group exists. */
    for (int k = 1; k < 3; k++) {
        if (!split_pg[k]) continue;
        float s = (float)by_kind[k];
        hs_status st = hs_pg_all_reduce(split_pg[k], NULL, &s, 1, HS_DTYPE_F32, HS_REDUCE_SUM, e);
        if (st != HS_OK) return st;
        by_kind[k] = s;
    }
    *norm = sqrt(by_kind[0] + by_kind[1] + by_kind[2]);
    return HS_OK;
}

hs_status hs_fsdp_grad_sumsq_exact(hs_fsdp *f, hs_xsum *whole, hs_error *e) {
    hs_pg *groups[8];
    hs_xsum sums[8];
    int n_groups = 0;
    for (int i = 0; i < f->ctx.n_params; i++) {
        hs_fsdp_param *fp = &f->ctx.params[i];
        hs_fsdp_param_settle_sharded_grad(fp);
        HS_ASSERT(!split_kind(fp)); /* data-parallel layouts only (config validation) */
        if (fp->p->frozen || !fp->sharded_grad) continue;
        hs_xsum *x = whole;
        if (fp->needs_all_gather) {
            bool added;
            int g = group_index(groups, &n_groups, fp->mi.shard_pg, &added);
            if (added) hs_xsum_init(&sums[g]);
            x = &sums[g];
        }
        hs_xsum_add_squares(x, fp->sharded_grad, fp->plan.actual_sharded_numel);
    }
    for (int g = 0; g < n_groups; g++) {
        hs_status st = hs_pg_all_reduce_xsum(groups[g], &sums[g], e);
        if (st != HS_OK) return st;
        hs_xsum_merge(whole, &sums[g]);
    }
    return HS_OK;
}

static void masters_changed(hs_fsdp *f, bool write_back) {
    if (hs_fsdp_ctx_pending(&f->ctx)) hs_fsdp_ctx_drain(&f->ctx);
    hs_fsdp_prefetch_settle(&f->ctx);
    /* The masters changed: any unsharded copy still alive is stale. */
    for (int u = 0; u < f->ctx.n_units; u++) hs_fsdp_unit_reshard(&f->ctx.units[u]);
    if (write_back)
        for (int i = 0; i < f->ctx.n_params; i++) hs_fsdp_main_write_back(&f->ctx.params[i]);
}

hs_status hs_fsdp_after_step(hs_fsdp *f, hs_error *e) {
    (void)e;
    masters_changed(f, true);
    return HS_OK;
}

hs_status hs_fsdp_after_optim_step(hs_fsdp *f, hs_error *e) {
    (void)e;
    masters_changed(f, f->optim == NULL);
    return HS_OK;
}

void hs_fsdp_zero_grads(hs_fsdp *f) {
    for (int i = 0; i < f->ctx.n_params; i++) {
        hs_fsdp_param_zero_sharded_grad(&f->ctx.params[i]);
    }
}

static hs_fsdp_param *param_at(hs_fsdp *f, int i) {
    if (i < 0 || i >= f->ctx.n_params)
        hs_panic("fsdp: parameter index %d of %d", i, f->ctx.n_params);
    return &f->ctx.params[i];
}

/* The full tensor from every rank's actual rows (fp32, `src` holding this
 * rank's actual shard). Export / dump time only: a one-off padded buffer,
 * not the training buffers. It is device memory, as a collective's buffers
 * must be on a GPU: a dump inside a step counts it in that step's device
 * peak, which stays below the forward / backward peak it comes after
 * (plan = measured holds, tests/cli/test_plan.sh). */
static hs_status gather_rows(hs_fsdp_param *fp, const float *src, float *out, hs_error *e) {
    const hs_fsdp_plan *pl = &fp->plan;
    if (!fp->needs_all_gather) {
        hs_dev_copy(fp->mem->dev, out, src, (size_t)pl->unpacked_numel * sizeof(float));
        return HS_OK;
    }
    hs_device *d = fp->mem->dev;
    size_t shard = (size_t)pl->padded_sharded_numel, full = (size_t)pl->padded_unsharded_numel;
    size_t actual = (size_t)pl->actual_sharded_numel;
    size_t bytes = (shard + full + 1) * sizeof(float);
    float *buf = hs_device_alloc(d, bytes);
    if (!buf) {
        char what[320];
        snprintf(what, sizeof what, "gathering %s whole", fp->p->fqn);
        return hs_device_oom(d, bytes, what, e);
    }
    hs_dev_copy(d, buf, src, actual * sizeof(float));
    hs_dev_zero(d, buf + actual, (shard - actual) * sizeof(float));
    hs_status st = hs_pg_all_gather(fp->mi.shard_pg, d->stream, buf + shard, buf,
                                    pl->padded_sharded_numel, HS_DTYPE_F32, e);
    if (st == HS_OK) hs_dev_copy(d, out, buf + shard, (size_t)pl->unpacked_numel * sizeof(float));
    hs_device_free_mem(d, buf);
    return st;
}

hs_status hs_fsdp_gather_full(hs_fsdp *f, int param_index, float *out, hs_error *e) {
    hs_fsdp_param *fp = param_at(f, param_index);
    return gather_rows(fp, fp->sharded, out, e);
}

hs_status hs_fsdp_gather_full_grad(hs_fsdp *f, int param_index, float *out, hs_error *e) {
    hs_fsdp_param *fp = param_at(f, param_index);
    hs_fsdp_param_settle_sharded_grad(fp);
    return gather_rows(fp, fp->sharded_grad, out, e);
}

hs_status hs_fsdp_set_full(hs_fsdp *f, int param_index, const float *full, hs_error *e) {
    (void)e;
    hs_fsdp_param *fp = param_at(f, param_index);
    const hs_fsdp_plan *pl = &fp->plan;
    /* A live compute copy would keep the old values, and so would a kept
     * secondary piece, the parameter's or its fused unit's. */
    if (fp->state != HS_FSDP_SHARDED && fp->ag_work == NULL) hs_fsdp_param_reshard(fp);
    hs_fsdp_param_drop_secondary(fp);
    hs_fsdp_fusion *fu = f->ctx.units[fp->p->unit].fusion;
    if (fu) hs_fsdp_fusion_drop_secondary(fu);
    hs_dev_copy(fp->mem->dev, fp->sharded, full + pl->layout.row_offset * pl->row_numel,
                (size_t)pl->actual_sharded_numel * sizeof(float));
    hs_fsdp_main_write_back(fp);
    return HS_OK;
}

void hs_fsdp_shard_view_get(hs_fsdp *f, int param_index, hs_fsdp_shard_view *out) {
    hs_fsdp_param *fp = param_at(f, param_index);
    const hs_fsdp_plan *pl = &fp->plan;
    *out = (hs_fsdp_shard_view){
        .row_offset = pl->layout.row_offset,
        .rows = pl->layout.actual_rows,
        .storage_rows = pl->row_numel > 0 ? fp->storage_numel / pl->row_numel : 0,
        .master = fp->sharded,
        .model_copy = fp->lp_shard,
        .model_dtype = fp->lp_shard ? fp->compute_dtype : HS_DTYPE_F32,
    };
}

void hs_fsdp_get_stats(const hs_fsdp *f, hs_fsdp_stats *out) {
    *out = (hs_fsdp_stats){0};
    out->param_bytes = f->ctx.mem.current[HS_FSDP_MEM_PARAM];
    out->param_peak_bytes = f->ctx.mem.peak[HS_FSDP_MEM_PARAM];
    out->grad_bytes = f->ctx.mem.current[HS_FSDP_MEM_GRAD];
    out->grad_peak_bytes = f->ctx.mem.peak[HS_FSDP_MEM_GRAD];
    out->total_param_bytes = f->total_param_bytes;
    out->shard_size = f->groups.shard_size;
    out->replicate_size = f->groups.replicate_size;
    out->blocks_wrapped = f->blocks_wrapped;
    out->units = f->ctx.n_units;
}

void hs_fsdp_reset_peak(hs_fsdp *f) { hs_fsdp_mem_reset_peak(&f->ctx.mem); }
