/* The collectives of the TP regions, on the tp group, as the model's ops
 * table (model.h hs_model_ops). They run on the calling thread's critical
 * path, so a failure cannot be returned through the model: it ends every
 * rank with the message. */
#include <stdlib.h>

#include "parallel/tp_internal.h"

static void done(hs_tp *t, double t0, int64_t bytes, hs_status st, const hs_error *e) {
    hs_parallel_done(t->comm, &t->stats, t0, bytes, st, e);
}

static void sp_all_gather(void *ctx, void *full, const void *local, int64_t numel, hs_dtype dt) {
    hs_tp *t = ctx;
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_gather(t->group, t->stream, full, local, numel, dt, &e);
    done(t, t0, numel * t->size * (int64_t)hs_dtype_size(dt), st, &e);
}

static void reduce_partial(void *ctx, float *local, float *full, int64_t numel) {
    hs_tp *t = ctx;
    hs_error e;
    double t0 = hs_now();
    hs_status st =
        t->ops.sequence_parallel
            ? hs_pg_reduce_scatter(t->group, t->stream, local, full, numel, HS_DTYPE_F32,
                                   HS_REDUCE_SUM, &e)
            : hs_pg_all_reduce(t->group, t->stream, full, numel, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    int64_t n = t->ops.sequence_parallel ? numel * t->size : numel;
    done(t, t0, n * (int64_t)sizeof(float), st, &e);
}

static void sp_all_gather_grad(void *ctx, float *full, const float *local, int64_t numel) {
    sp_all_gather(ctx, full, local, numel, HS_DTYPE_F32);
}

static void all_reduce(void *ctx, float *buf, int64_t n, hs_reduce_op op) {
    hs_tp *t = ctx;
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_reduce(t->group, t->stream, buf, n, HS_DTYPE_F32, op, &e);
    done(t, t0, n * (int64_t)sizeof(float), st, &e);
}

static void all_reduce_max(void *ctx, float *buf, int64_t n) {
    all_reduce(ctx, buf, n, HS_REDUCE_MAX);
}
static void all_reduce_sum(void *ctx, float *buf, int64_t n) {
    all_reduce(ctx, buf, n, HS_REDUCE_SUM);
}

static void gather_logits(void *ctx, float *out, const float *in, int64_t numel) {
    sp_all_gather(ctx, out, in, numel, HS_DTYPE_F32);
}

hs_status hs_tp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool sequence_parallel,
                       bool loss_parallel, hs_tp **out, hs_error *e) {
    *out = NULL;
    if (!group || hs_pg_size(group) < 2)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "tp: tensor parallelism needs a tp group of >= 2 ranks");
    hs_tp *t = calloc(1, sizeof *t);
    if (!t) return hs_error_set(e, HS_ERR_OOM, "tp: cannot allocate the TP context");
    t->comm = comm;
    t->stream = dev->stream;
    t->group = group;
    t->size = hs_pg_size(group);
    t->rank = hs_pg_rank(group);
    t->ops = (hs_model_ops){
        .ctx = t,
        .tp_size = t->size,
        .tp_rank = t->rank,
        .sequence_parallel = sequence_parallel,
        .loss_parallel = loss_parallel,
        .sp_all_gather = sp_all_gather,
        .reduce_partial = reduce_partial,
        .sp_all_gather_grad = sp_all_gather_grad,
        .all_reduce_max = all_reduce_max,
        .all_reduce_sum = all_reduce_sum,
        .gather_logits = gather_logits,
    };
    *out = t;
    return HS_OK;
}

void hs_tp_free(hs_tp *t) { free(t); }
const hs_model_ops *hs_tp_ops(const hs_tp *t) { return &t->ops; }
hs_parallel_stats hs_tp_get_stats(const hs_tp *t) { return t->stats; }
void hs_tp_reset_stats(hs_tp *t) { t->stats = (hs_parallel_stats){0}; }
