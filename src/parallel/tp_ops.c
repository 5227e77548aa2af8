/* The collectives of the TP regions on the tp group. They run on the
 * calling thread's critical path, so a failure cannot be returned through
 * the model: it ends every rank with the message. */
#include <stdlib.h>

#include "parallel/par_internal.h"

static void done(hs_tp *t, double t0, int64_t bytes, hs_status st, const hs_error *e) {
    hs_parallel_done(t->comm, &t->stats, t0, bytes, st, e);
}

void hs_tp_gather(hs_tp *t, void *full, const void *local, int64_t numel, hs_dtype dt) {
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_gather(t->group, t->stream, full, local, numel, dt, &e);
    done(t, t0, numel * t->size * (int64_t)hs_dtype_size(dt), st, &e);
}

void hs_tp_reduce_partial(hs_tp *t, float *local, float *full, int64_t numel) {
    hs_error e;
    double t0 = hs_now();
    hs_status st =
        t->sequence_parallel
            ? hs_pg_reduce_scatter(t->group, t->stream, local, full, numel, HS_DTYPE_F32,
                                   HS_REDUCE_SUM, &e)
            : hs_pg_all_reduce(t->group, t->stream, full, numel, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    int64_t n = t->sequence_parallel ? numel * t->size : numel;
    done(t, t0, n * (int64_t)sizeof(float), st, &e);
}

void hs_tp_all_reduce(hs_tp *t, float *buf, int64_t n, hs_reduce_op op) {
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_reduce(t->group, t->stream, buf, n, HS_DTYPE_F32, op, &e);
    done(t, t0, n * (int64_t)sizeof(float), st, &e);
}

hs_status hs_tp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool sequence_parallel,
                       hs_tp **out, hs_error *e) {
    *out = NULL;
    if (!group || hs_pg_size(group) < 2)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "tp: tensor parallelism needs a tp group of >= 2 ranks");
    hs_tp *t = calloc(1, sizeof *t);
    if (!t) return hs_error_oom(e, "tp: the TP context");
    *t = (hs_tp){.comm = comm,
                 .stream = dev->stream,
                 .group = group,
                 .size = hs_pg_size(group),
                 .rank = hs_pg_rank(group),
                 .sequence_parallel = sequence_parallel};
    *out = t;
    return HS_OK;
}

void hs_tp_free(hs_tp *t) { free(t); }
hs_parallel_stats hs_tp_get_stats(const hs_tp *t) { return t->stats; }
void hs_tp_reset_stats(hs_tp *t) { t->stats = (hs_parallel_stats){0}; }
