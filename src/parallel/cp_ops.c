/* The collectives of context-parallel attention on the cp group, as the
 * cp_* members of the model's ops table (model.h). They sit on the
 * compute path, so a failure ends every rank with the message. */
#include <stdlib.h>

#include "hypershard/parallel.h"

#define RING_TAG 71

struct hs_cp {
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream: every collective's */
    hs_pg *group;
    int size, rank;
    bool ring;
    hs_parallel_stats stats;
    /* the one ring step in flight */
    hs_work *send, *recv;
    int64_t step_bytes;
    bool busy;
};

static void done(hs_cp *c, double t0, int64_t bytes, hs_status st, const hs_error *e) {
    hs_parallel_done(c->comm, &c->stats, t0, bytes, st, e);
}

static void cp_all_gather(void *ctx, void *out, const void *in, int64_t numel, hs_dtype dt) {
    hs_cp *c = ctx;
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_gather(c->group, c->stream, out, in, numel, dt, &e);
    done(c, t0, numel * c->size * (int64_t)hs_dtype_size(dt), st, &e);
}

static void cp_reduce_scatter(void *ctx, float *out, const float *in, int64_t numel) {
    hs_cp *c = ctx;
    hs_error e;
    double t0 = hs_now();
    hs_status st =
        hs_pg_reduce_scatter(c->group, c->stream, out, in, numel, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    done(c, t0, numel * c->size * (int64_t)sizeof(float), st, &e);
}

/* Even ranks send first, odd ranks receive first: the blocking sends and
 * receives on the comm thread then never wait on each other in a cycle. */
static void *cp_ring_start(void *ctx, void *recv, const void *send, int64_t numel, hs_dtype dt) {
    hs_cp *c = ctx;
    HS_ASSERT(!c->busy);
    int next = (c->rank + 1) % c->size, prev = (c->rank - 1 + c->size) % c->size;
    if (c->rank % 2 == 0) {
        c->send = hs_pg_send_async(c->group, c->stream, send, numel, dt, next, RING_TAG);
        c->recv = hs_pg_recv_async(c->group, c->stream, recv, numel, dt, prev, RING_TAG);
    } else {
        c->recv = hs_pg_recv_async(c->group, c->stream, recv, numel, dt, prev, RING_TAG);
        c->send = hs_pg_send_async(c->group, c->stream, send, numel, dt, next, RING_TAG);
    }
    c->step_bytes = numel * (int64_t)hs_dtype_size(dt);
    c->busy = true;
    return c;
}

static void cp_ring_wait(void *ctx, void *step) {
    hs_cp *c = ctx;
    HS_ASSERT(step == c && c->busy);
    hs_error e;
    hs_error_clear(&e);
    double t0 = hs_now();
    hs_status st = hs_work_wait_stream(c->send, c->stream, &e);
    if (st == HS_OK) st = hs_work_wait_stream(c->recv, c->stream, &e);
    c->busy = false;
    done(c, t0, c->step_bytes, st, &e);
}

hs_status hs_cp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool ring, hs_cp **out,
                       hs_error *e) {
    *out = NULL;
    if (!group || hs_pg_size(group) < 2)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "cp: context parallelism needs a cp group of >= 2 ranks");
    hs_cp *c = calloc(1, sizeof *c);
    if (!c) return hs_error_set(e, HS_ERR_OOM, "cp: cannot allocate the CP context");
    *c = (hs_cp){.comm = comm,
                 .stream = dev->stream,
                 .group = group,
                 .size = hs_pg_size(group),
                 .rank = hs_pg_rank(group),
                 .ring = ring};
    *out = c;
    return HS_OK;
}

void hs_cp_free(hs_cp *c) { free(c); }

void hs_cp_fill_ops(hs_cp *c, hs_model_ops *ops) {
    ops->cp_ctx = c;
    ops->cp_size = c->size;
    ops->cp_rank = c->rank;
    ops->cp_ring = c->ring;
    ops->cp_all_gather = cp_all_gather;
    ops->cp_reduce_scatter = cp_reduce_scatter;
    ops->cp_ring_start = cp_ring_start;
    ops->cp_ring_wait = cp_ring_wait;
}

hs_parallel_stats hs_cp_get_stats(const hs_cp *c) { return c->stats; }
void hs_cp_reset_stats(hs_cp *c) { c->stats = (hs_parallel_stats){0}; }
