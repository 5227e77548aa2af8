/* The collectives of context-parallel attention on the cp group. They sit
 * on the compute path, so a failure ends every rank with the message. */
#include <stdlib.h>

#include "parallel/par_internal.h"

#define RING_TAG 71

struct hs_cp {
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream: every collective's */
    hs_pg *group;
    hs_pg *a2a; /* the all-to-all methods' group (group itself under alltoall) */
    int size, rank;
    int stride; /* ring steps go to CP rank + stride (the hybrid: its a2a size) */
    hs_parallel_stats stats;
    /* the one ring step in flight */
    hs_work *send, *recv;
    int64_t step_bytes;
    bool busy;
};

static void done(hs_cp *c, double t0, int64_t bytes, hs_status st, const hs_error *e) {
    hs_parallel_done(c->comm, &c->stats, t0, bytes, st, e);
}

void hs_cp_gather(hs_cp *c, void *out, const void *in, int64_t numel, hs_dtype dt) {
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_gather(c->group, c->stream, out, in, numel, dt, &e);
    done(c, t0, numel * c->size * (int64_t)hs_dtype_size(dt), st, &e);
}

void hs_cp_reduce_scatter(hs_cp *c, float *out, const float *in, int64_t numel) {
    hs_error e;
    double t0 = hs_now();
    hs_status st =
        hs_pg_reduce_scatter(c->group, c->stream, out, in, numel, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    done(c, t0, numel * c->size * (int64_t)sizeof(float), st, &e);
}

void hs_cp_all_to_all(hs_cp *c, void *out, const void *in, int64_t per_rank, hs_dtype dt) {
    HS_ASSERT(c->a2a);
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_to_all(c->a2a, c->stream, out, in, per_rank, dt, &e);
    done(c, t0, per_rank * hs_pg_size(c->a2a) * (int64_t)hs_dtype_size(dt), st, &e);
}

/* Even ring positions send first, odd ones receive first: the blocking
 * sends and receives on the comm thread then never wait on each other in a
 * cycle. */
void hs_cp_ring_start(hs_cp *c, void *recv, const void *send, int64_t numel, hs_dtype dt) {
    HS_ASSERT(!c->busy);
    int next = (c->rank + c->stride) % c->size, prev = (c->rank - c->stride + c->size) % c->size;
    if ((c->rank / c->stride) % 2 == 0) {
        c->send = hs_pg_send_async(c->group, c->stream, send, numel, dt, next, RING_TAG);
        c->recv = hs_pg_recv_async(c->group, c->stream, recv, numel, dt, prev, RING_TAG);
    } else {
        c->recv = hs_pg_recv_async(c->group, c->stream, recv, numel, dt, prev, RING_TAG);
        c->send = hs_pg_send_async(c->group, c->stream, send, numel, dt, next, RING_TAG);
    }
    c->step_bytes = numel * (int64_t)hs_dtype_size(dt);
    c->busy = true;
}

void hs_cp_ring_wait(hs_cp *c) {
    HS_ASSERT(c->busy);
    hs_error e;
    hs_error_clear(&e);
    double t0 = hs_now();
    hs_status st = hs_work_wait_stream(c->send, c->stream, &e);
    if (st == HS_OK) st = hs_work_wait_stream(c->recv, c->stream, &e);
    c->busy = false;
    done(c, t0, c->step_bytes, st, &e);
}

hs_status hs_cp_create(hs_comm *comm, hs_device *dev, hs_pg *group, hs_pg *a2a, hs_cp **out,
                       hs_error *e) {
    *out = NULL;
    if (!group || hs_pg_size(group) < 2)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "cp: context parallelism needs a cp group of >= 2 ranks");
    int stride = a2a && a2a != group ? hs_pg_size(a2a) : 1;
    if (hs_pg_size(group) % stride)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "cp: the all-to-all group '%s' of %d ranks does not divide the cp "
                            "group of %d",
                            hs_pg_name(a2a), stride, hs_pg_size(group));
    hs_cp *c = calloc(1, sizeof *c);
    if (!c) return hs_error_oom(e, "cp: the CP context");
    *c = (hs_cp){.comm = comm,
                 .stream = dev->stream,
                 .group = group,
                 .a2a = a2a,
                 .size = hs_pg_size(group),
                 .rank = hs_pg_rank(group),
                 .stride = stride};
    *out = c;
    return HS_OK;
}

void hs_cp_free(hs_cp *c) { free(c); }

hs_parallel_stats hs_cp_get_stats(const hs_cp *c) { return c->stats; }
void hs_cp_reset_stats(hs_cp *c) { c->stats = (hs_parallel_stats){0}; }
