/* comm/stage.c — collectives on device memory the host cannot address (a
 * GPU's), for a group whose backend moves host memory (mpi): the
 * communication thread copies the input to pinned host buffers of its
 * queue, runs the backend on them and copies the output back. Also the
 * routing of every work item between that, a group's device backend
 * (nccl) and the plain host call.
 *
 * The buffers come from the device's host pool (hs_host_alloc: pinned on a
 * GPU), are lent per collective and given back after it, and are reused:
 * once they have grown to the largest collective, staging allocates
 * nothing. The copies run on a stream of the queue's own and wait for it,
 * so they never wait behind the compute queued on the device's default
 * stream; the issue already waited for the issuing stream (collectives.c),
 * so the input is there. A failed copy is recorded on the device, as every
 * device call's failure is (hs_device_status). */
#include <stdlib.h>

#include "comm/group.h"

/* Staging buffers start at 4 KiB and double. */
#define STAGE_MIN_BYTES 4096

void hs_stage_init(hs_stage *st) {
    *st = (hs_stage){0};
    HS_CHECK_PTHREAD(pthread_mutex_init(&st->mu, NULL));
}

void hs_stage_bind(hs_stage *st, hs_device *d) {
    pthread_mutex_lock(&st->mu);
    if (st->lent)
        hs_panic("the staging buffers of device '%s' are released with %d of them lent to "
                 "collectives in flight; wait for every collective on the device first",
                 st->dev ? st->dev->name : "?", st->lent);
    while (st->idle) {
        hs_stage_buf *b = st->idle;
        st->idle = b->next;
        hs_host_free(st->dev, b->p);
        free(b);
    }
    hs_stream_free(st->stream);
    st->stream = NULL;
    st->dev = d;
    pthread_mutex_unlock(&st->mu);
}

void hs_stage_destroy(hs_stage *st) {
    hs_stage_bind(st, NULL);
    pthread_mutex_destroy(&st->mu);
}

/* Under st->mu: the smallest idle buffer of at least `bytes`, unlinked, or
 * NULL. */
static hs_stage_buf *take_fitting(hs_stage *st, size_t bytes) {
    hs_stage_buf **best = NULL;
    for (hs_stage_buf **l = &st->idle; *l; l = &(*l)->next)
        if ((*l)->cap >= bytes && (!best || (*l)->cap < (*best)->cap)) best = l;
    if (!best) return NULL;
    hs_stage_buf *b = *best;
    *best = b->next;
    return b;
}

/* Under st->mu: a buffer of at least `bytes` from the idle ones, growing
 * one when none is large enough. */
static hs_status lend_locked(hs_stage *st, size_t bytes, hs_stage_buf **out, hs_error *e) {
    hs_stage_buf *b = take_fitting(st, bytes);
    if (!b && st->idle) { /* the first idle one grows */
        b = st->idle;
        st->idle = b->next;
        hs_host_free(st->dev, b->p);
        b->p = NULL, b->cap = 0;
    }
    if (!b && !(b = calloc(1, sizeof *b)))
        return hs_error_oom(e, "a staging buffer's record: %zu bytes", sizeof *b);
    if (!b->p) {
        size_t cap = STAGE_MIN_BYTES;
        while (cap < bytes) cap *= 2;
        b->p = hs_host_alloc(st->dev, cap);
        if (!b->p) {
            free(b);
            return hs_pool_oom(&st->dev->host_pool, cap,
                               "a pinned staging buffer of a communication queue", e);
        }
        b->cap = cap;
    }
    b->next = NULL;
    st->lent++;
    *out = b;
    return HS_OK;
}

/* A buffer of at least `bytes` for a collective on a's device, and the
 * copy stream made on first use. A device other than the one the context
 * was given is refused: its buffers would outlive it. */
static hs_status lend(hs_pg *g, const hs_coll_args *a, size_t bytes, hs_stage_buf **out,
                      hs_error *e) {
    hs_stage *st = &g->queue->stage;
    pthread_mutex_lock(&st->mu);
    hs_status s = HS_OK;
    if (a->dev != st->dev)
        s = hs_error_set(e, HS_ERR_INTERNAL,
                         "%s on group '%s': its buffers are memory of the %s device, which the "
                         "host cannot address and the communication context was not given; "
                         "call hs_comm_set_device with it first",
                         hs_comm_op_name(a->op), g->name, a->dev->name);
    if (s == HS_OK && !st->stream) s = hs_stream_create(st->dev, &st->stream, e);
    if (s == HS_OK) s = lend_locked(st, bytes, out, e);
    pthread_mutex_unlock(&st->mu);
    return s;
}

static void give_back(hs_stage *st, hs_stage_buf *b) {
    if (!b) return;
    pthread_mutex_lock(&st->mu);
    b->next = st->idle;
    st->idle = b;
    st->lent--;
    pthread_mutex_unlock(&st->mu);
}

/* Copies on the queue's stream, done when this returns. */
static void stage_copy(hs_stage *st, void *dst, const void *src, size_t bytes, hs_copy_kind kind) {
    if (!bytes) return;
    hs_device_copy_async(st->stream, dst, src, bytes, kind);
    hs_stream_synchronize(st->stream);
}

/* One past the last element of a v collective's blocks. */
static int64_t extent(const int64_t *counts, const int64_t *displs, int n) {
    int64_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0 && displs[i] + counts[i] > end) end = displs[i] + counts[i];
    return end;
}

/* The staging of one collective: bytes of its input and output. An op
 * whose output buffer holds its input (all-reduce, broadcast, all-gather's
 * own block) stages both in one buffer, the input at in_at. */
typedef struct stage_plan {
    size_t in, out;
    bool shared;
    size_t in_at;
} stage_plan;

static stage_plan plan_of(const hs_pg *g, const hs_coll_args *a) {
    const size_t es = hs_dtype_size(a->dt), n = (size_t)a->count * es, all = n * (size_t)g->size;
    switch (a->op) {
    case HS_OP_ALL_GATHER:
        return (stage_plan){.in = n, .out = all, .shared = true, .in_at = (size_t)g->rank * n};
    case HS_OP_REDUCE_SCATTER: return (stage_plan){.in = all, .out = n};
    case HS_OP_ALL_REDUCE:
    case HS_OP_BROADCAST: return (stage_plan){.in = n, .out = n, .shared = true};
    case HS_OP_ALL_TO_ALL: return (stage_plan){.in = all, .out = all};
    case HS_OP_ALL_TO_ALLV:
        return (stage_plan){.in = (size_t)extent(a->send_counts, a->send_displs, g->size) * es,
                            .out = (size_t)extent(a->recv_counts, a->recv_displs, g->size) * es};
    case HS_OP_SEND: return (stage_plan){.in = n};
    case HS_OP_RECV: return (stage_plan){.out = n};
    default: hs_panic("staging: %s has no buffers", hs_comm_op_name(a->op));
    }
}

/* The output back to the device: all of it, except for all-to-allv, whose
 * output between the received blocks is not the collective's to write
 * (runs of adjacent blocks go in one copy). */
static void copy_out(hs_stage *st, const hs_pg *g, const hs_coll_args *a, const char *host,
                     size_t bytes) {
    if (a->op != HS_OP_ALL_TO_ALLV) {
        stage_copy(st, a->out, host, bytes, HS_COPY_H2D);
        return;
    }
    const size_t es = hs_dtype_size(a->dt);
    const int64_t *c = a->recv_counts, *d = a->recv_displs;
    for (int i = 0; i < g->size;) {
        int j = i + 1;
        while (j < g->size && d[j] == d[j - 1] + c[j - 1]) j++;
        size_t at = (size_t)d[i] * es, len = (size_t)(d[j - 1] + c[j - 1] - d[i]) * es;
        if (len) stage_copy(st, (char *)a->out + at, host + at, len, HS_COPY_H2D);
        i = j;
    }
}

/* a through host memory: input in, g's backend on the host buffers, output
 * back. */
static hs_status stage_exec(hs_pg *g, const hs_coll_args *a, hs_error *e) {
    hs_stage *st = &g->queue->stage;
    stage_plan p = plan_of(g, a);
    hs_stage_buf *bin = NULL, *bout = NULL;
    hs_status s = HS_OK;
    /* Buffers even for no bytes: a backend never sees NULL. */
    if (a->op != HS_OP_SEND) s = lend(g, a, p.out, &bout, e);
    if (s == HS_OK && a->op != HS_OP_RECV && !p.shared) s = lend(g, a, p.in, &bin, e);
    if (s == HS_OK) {
        hs_coll_args h = *a;
        h.dev = NULL;
        h.out = bout ? bout->p : NULL;
        h.in = p.shared ? (char *)bout->p + p.in_at : bin ? bin->p : NULL;
        stage_copy(st, (void *)h.in, a->in, p.in, HS_COPY_D2H);
        s = g->backend->exec(g->ctx, &h, e);
        if (s == HS_OK && bout) copy_out(st, g, a, h.out, p.out);
    }
    give_back(st, bin);
    give_back(st, bout);
    return s;
}

hs_status hs_comm_exec(hs_pg *g, const hs_coll_args *a, hs_error *e) {
    if (hs_args_on_device(a))
        return g->dev_backend ? g->dev_backend->exec(g->dev_ctx, a, e) : stage_exec(g, a, e);
    if (a->dev) hs_device_host_access_begin(a->dev);
    hs_status s = g->backend->exec(g->ctx, a, e);
    if (a->dev) hs_device_host_access_end(a->dev);
    return s;
}

const char *hs_comm_exec_path(const hs_pg *g, const hs_coll_args *a) {
    bool dev = hs_args_on_device(a) && g->dev_backend;
    const hs_pg_backend *b = dev ? g->dev_backend : g->backend;
    return b->path ? b->path(dev ? g->dev_ctx : g->ctx, a) : NULL;
}

hs_status hs_stage_p2p_begin(hs_work *w, hs_coll_args *run, hs_error *e) {
    const hs_coll_args *a = &w->args;
    *run = *a;
    w->staged = NULL;
    if (!a->dev) return HS_OK;
    if (!hs_args_on_device(a)) { /* MPI reads or writes it until the request completes */
        hs_device_host_access_begin(a->dev);
        return HS_OK;
    }
    size_t bytes = (size_t)a->count * hs_dtype_size(a->dt);
    hs_status s = lend(w->pg, a, bytes, &w->staged, e);
    if (s != HS_OK) return s;
    run->dev = NULL;
    if (a->op == HS_OP_SEND) {
        stage_copy(&w->pg->queue->stage, w->staged->p, a->in, bytes, HS_COPY_D2H);
        run->in = w->staged->p;
    } else {
        run->out = w->staged->p;
    }
    return HS_OK;
}

void hs_stage_p2p_end(hs_work *w, bool arrived) {
    const hs_coll_args *a = &w->args;
    if (!a->dev) return;
    if (!w->staged) {
        hs_device_host_access_end(a->dev);
        return;
    }
    hs_stage *st = &w->pg->queue->stage;
    if (arrived && a->op == HS_OP_RECV)
        stage_copy(st, a->out, w->staged->p, (size_t)a->count * hs_dtype_size(a->dt), HS_COPY_H2D);
    give_back(st, w->staged);
    w->staged = NULL;
}
