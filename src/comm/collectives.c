/* comm/collectives.c — the public collectives: argument checks, then a
 * queued work item (async forms) or hs_comm_run (blocking forms, which
 * behave as async + wait). */
#include <stdlib.h>

#include "comm/group.h"

/* Before a collective may read or write its buffers, the work issued on s
 * before the call must be done. The mpi backend moves bytes from the host
 * (its communication thread, or the caller's inline), so the host waits
 * for s: on cpu and reference that returns at once, and on a GPU stream
 * with host-staged MPI it is what makes the collective read what s
 * computed. A group's device backend (NCCL) orders its own stream after an
 * event recorded on s instead, so the issuing thread never waits for the
 * GPU (FSDP2's all-gather stream waits on the compute stream the same
 * way); without an event to record, the host waits as for MPI. */
static hs_coll_args on_stream(const hs_pg *g, hs_stream *s, const hs_coll_args *a) {
    hs_coll_args on = *a;
    on.dev = s ? s->dev : NULL;
    on.ready = NULL;
    if (!s) return on;
    if (hs_args_on_device(&on) && g->dev_backend &&
        hs_event_create(s->dev, &on.ready, NULL) == HS_OK)
        hs_event_record(on.ready, s);
    else hs_stream_synchronize(s);
    return on;
}

static hs_work *enqueue_on(hs_pg *g, hs_stream *s, const hs_coll_args *a) {
    hs_coll_args on = on_stream(g, s, a);
    return hs_comm_enqueue(g, &on);
}

/* async on s + hs_work_wait_stream on s, which for this backend is a host
 * wait (work.c): the inline run of hs_comm_run is that. */
static hs_status run_on(hs_pg *g, hs_stream *s, const hs_coll_args *a, hs_error *e) {
    hs_coll_args on = on_stream(g, s, a);
    return hs_comm_run(g, &on, e);
}

static void check_common(const hs_pg *g, int64_t count, hs_dtype dt) {
    HS_ASSERT(g != NULL);
    HS_ASSERT(count >= 0);
    HS_ASSERT(dt >= 0 && dt < HS_DTYPE_COUNT);
}

static void check_peer(const hs_pg *g, int peer, const char *what) {
    if (peer < 0 || peer >= g->size)
        hs_panic("%s on group '%s': rank %d is outside the group's %d ranks", what, g->name, peer,
                 g->size);
}

static hs_coll_args args_all_gather(hs_pg *g, void *out, const void *in, int64_t count,
                                    hs_dtype dt) {
    check_common(g, count, dt);
    return (hs_coll_args){.op = HS_OP_ALL_GATHER, .dt = dt, .out = out, .in = in, .count = count};
}

static hs_coll_args args_reduce_scatter(hs_pg *g, void *out, const void *in, int64_t count,
                                        hs_dtype dt, hs_reduce_op op) {
    check_common(g, count, dt);
    HS_ASSERT(hs_dtype_is_float(dt)); /* a reduction adds */
    HS_ASSERT(op >= 0 && op < HS_REDUCE_OP_COUNT);
    return (hs_coll_args){
        .op = HS_OP_REDUCE_SCATTER, .dt = dt, .reduce = op, .out = out, .in = in, .count = count};
}

static hs_coll_args args_all_reduce(hs_pg *g, void *buf, int64_t count, hs_dtype dt,
                                    hs_reduce_op op) {
    check_common(g, count, dt);
    HS_ASSERT(hs_dtype_is_float(dt)); /* a reduction adds */
    HS_ASSERT(op >= 0 && op < HS_REDUCE_OP_COUNT);
    return (hs_coll_args){
        .op = HS_OP_ALL_REDUCE, .dt = dt, .reduce = op, .out = buf, .in = buf, .count = count};
}

static hs_coll_args args_broadcast(hs_pg *g, void *buf, int64_t count, hs_dtype dt, int root) {
    check_common(g, count, dt);
    check_peer(g, root, "broadcast");
    return (hs_coll_args){
        .op = HS_OP_BROADCAST, .dt = dt, .out = buf, .in = buf, .count = count, .peer = root};
}

static hs_coll_args args_all_to_all(hs_pg *g, void *out, const void *in, int64_t count,
                                    hs_dtype dt) {
    check_common(g, count, dt);
    return (hs_coll_args){.op = HS_OP_ALL_TO_ALL, .dt = dt, .out = out, .in = in, .count = count};
}

static hs_coll_args args_p2p(hs_pg *g, hs_comm_op op, void *buf, int64_t count, hs_dtype dt,
                             int peer, int tag) {
    check_common(g, count, dt);
    check_peer(g, peer, hs_comm_op_name(op));
    HS_ASSERT(tag >= 0);
    return (hs_coll_args){
        .op = op, .dt = dt, .out = buf, .in = buf, .count = count, .peer = peer, .tag = tag};
}

static hs_coll_args args_barrier(hs_pg *g) {
    HS_ASSERT(g != NULL);
    return (hs_coll_args){.op = HS_OP_BARRIER, .dt = HS_DTYPE_F32};
}

hs_work *hs_pg_all_gather_async(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                                hs_dtype dt) {
    hs_coll_args a = args_all_gather(g, out, in, count, dt);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_reduce_scatter_async(hs_pg *g, hs_stream *s, void *out, const void *in,
                                    int64_t count, hs_dtype dt, hs_reduce_op op) {
    hs_coll_args a = args_reduce_scatter(g, out, in, count, dt, op);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_all_reduce_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                                hs_reduce_op op) {
    hs_coll_args a = args_all_reduce(g, buf, count, dt, op);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_broadcast_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                               int root) {
    hs_coll_args a = args_broadcast(g, buf, count, dt, root);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_all_to_all_async(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                                hs_dtype dt) {
    hs_coll_args a = args_all_to_all(g, out, in, count, dt);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_all_to_allv_async(hs_pg *g, hs_stream *s, void *out, const int64_t *recv_counts,
                                 const int64_t *recv_displs, const void *in,
                                 const int64_t *send_counts, const int64_t *send_displs,
                                 hs_dtype dt) {
    check_common(g, 0, dt);
    HS_ASSERT(recv_counts && recv_displs && send_counts && send_displs);
    hs_coll_args a = {.op = HS_OP_ALL_TO_ALLV,
                      .dt = dt,
                      .out = out,
                      .in = in,
                      .recv_counts = recv_counts,
                      .recv_displs = recv_displs,
                      .send_counts = send_counts,
                      .send_displs = send_displs};
    return enqueue_on(g, s, &a);
}

/* The buffer of a send is only read. */
hs_work *hs_pg_send_async(hs_pg *g, hs_stream *s, const void *buf, int64_t count, hs_dtype dt,
                          int peer, int tag) {
    hs_coll_args a = args_p2p(g, HS_OP_SEND, (void *)buf, count, dt, peer, tag);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_recv_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int peer,
                          int tag) {
    hs_coll_args a = args_p2p(g, HS_OP_RECV, buf, count, dt, peer, tag);
    return enqueue_on(g, s, &a);
}

hs_work *hs_pg_barrier_async(hs_pg *g) {
    hs_coll_args a = args_barrier(g);
    return hs_comm_enqueue(g, &a);
}

hs_status hs_pg_all_gather(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                           hs_dtype dt, hs_error *e) {
    hs_coll_args a = args_all_gather(g, out, in, count, dt);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_reduce_scatter(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                               hs_dtype dt, hs_reduce_op op, hs_error *e) {
    hs_coll_args a = args_reduce_scatter(g, out, in, count, dt, op);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_all_reduce(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                           hs_reduce_op op, hs_error *e) {
    hs_coll_args a = args_all_reduce(g, buf, count, dt, op);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_broadcast(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int root,
                          hs_error *e) {
    hs_coll_args a = args_broadcast(g, buf, count, dt, root);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_all_to_all(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                           hs_dtype dt, hs_error *e) {
    hs_coll_args a = args_all_to_all(g, out, in, count, dt);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_send(hs_pg *g, hs_stream *s, const void *buf, int64_t count, hs_dtype dt, int peer,
                     int tag, hs_error *e) {
    hs_coll_args a = args_p2p(g, HS_OP_SEND, (void *)buf, count, dt, peer, tag);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_recv(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int peer,
                     int tag, hs_error *e) {
    hs_coll_args a = args_p2p(g, HS_OP_RECV, buf, count, dt, peer, tag);
    return run_on(g, s, &a, e);
}

hs_status hs_pg_barrier(hs_pg *g, hs_error *e) {
    hs_coll_args a = args_barrier(g);
    return hs_comm_run(g, &a, e);
}

hs_status hs_pg_all_reduce_xsum(hs_pg *g, hs_xsum *x, hs_error *e) {
    int w = g->size;
    if (w == 1) return HS_OK;
    hs_xsum *all = malloc(sizeof *all * (size_t)w);
    if (!all) return hs_error_oom(e, "the exact sums of %d ranks on group '%s'", w, g->name);
    all[g->rank] = *x;
    /* the gather moves bytes unchanged: the limbs travel as fp32 words */
    int64_t words = (int64_t)(sizeof *x / sizeof(float));
    hs_status st = hs_pg_all_gather(g, NULL, all, all + g->rank, words, HS_DTYPE_F32, e);
    if (st == HS_OK) {
        hs_xsum_init(x);
        for (int r = 0; r < w; r++) hs_xsum_merge(x, &all[r]);
    }
    free(all);
    return st;
}

int hs_pg_rank(const hs_pg *g) { return g->rank; }
int hs_pg_size(const hs_pg *g) { return g->size; }
const char *hs_pg_name(const hs_pg *g) { return g->name; }
hs_comm_queue hs_pg_queue(const hs_pg *g) { return g->queue->id; }

int hs_pg_world_rank(const hs_pg *g, int r) {
    check_peer(g, r, "hs_pg_world_rank");
    return g->world_ranks[r];
}
