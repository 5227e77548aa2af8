/* comm/work.c — the work queues and their communication threads.
 *
 * Every group is bound to one queue (hs_comm_queue). The issuing thread
 * appends work to the queue of its group; each queue has a communication
 * thread of its own that executes that queue strictly in issue order (the
 * ordering rule of comm.h holds per queue), records each collective in the
 * trace and wakes the waiters. Queues share nothing but the trace (which
 * locks), the staging pool's and the per-slot counters (atomics), so a
 * collective on one queue never waits for another queue's work. Before running a collective a
 * thread publishes the sequence number it entered, which the watchdog
 * reports to other ranks when something hangs. A blocking call finding its
 * queue idle runs on the calling thread instead (hs_comm_run). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/group.h"

static const char *const queue_names[HS_COMM_QUEUE_COUNT] = {"default", "critical", "pp_forward",
                                                             "pp_backward"};
_Static_assert(sizeof queue_names / sizeof queue_names[0] == HS_COMM_QUEUE_COUNT,
               "queue_names follows hs_comm_queue");

const char *hs_comm_queue_name(hs_comm_queue q) {
    return q >= 0 && q < HS_COMM_QUEUE_COUNT ? queue_names[q] : "?";
}

static const char *const op_names[HS_OP_COUNT] = {
    "all_gather",  "reduce_scatter", "all_reduce", "broadcast", "all_to_all",
    "all_to_allv", "send",           "recv",       "barrier",
};
_Static_assert(sizeof op_names / sizeof op_names[0] == HS_OP_COUNT, "op_names follows hs_comm_op");

const char *hs_comm_op_name(hs_comm_op op) {
    return op >= 0 && op < HS_OP_COUNT ? op_names[op] : "?";
}

bool hs_comm_op_is_p2p(hs_comm_op op) { return op == HS_OP_SEND || op == HS_OP_RECV; }

const char *hs_comm_slot_name(const hs_comm *c, int slot) {
    if (slot < 0 || slot >= atomic_load(&c->nslots)) return "?";
    return c->groups[slot].name;
}

/* Bytes as counted in the trace: the full (unsharded) payload of the op. */
static int64_t work_bytes(const hs_pg *g, const hs_coll_args *a) {
    const int64_t es = (int64_t)hs_dtype_size(a->dt);
    switch (a->op) {
    case HS_OP_ALL_GATHER:
    case HS_OP_REDUCE_SCATTER:
    case HS_OP_ALL_TO_ALL: return (int64_t)g->size * a->count * es;
    case HS_OP_ALL_TO_ALLV: {
        int64_t n = 0;
        for (int i = 0; i < g->size; i++) n += a->send_counts[i];
        return n * es;
    }
    case HS_OP_BARRIER: return 0;
    default: return a->count * es;
    }
}

/* The span of one executed work item (with tracing on). */
static void work_trace(hs_comm *c, const hs_work *w, double t0, double t1) {
    const hs_coll_args *a = &w->args;
    const char *op = hs_comm_op_name(a->op);
    int64_t bytes = work_bytes(w->pg, a);
    if (!hs_trace_enabled(c->trace)) return;
    char args[1024];
    const char *dt = a->op == HS_OP_BARRIER ? "none" : hs_dtype_name(a->dt);
    int n = snprintf(
        args, sizeof args,
        "\"group\":\"%s\",\"bytes\":%lld,\"dtype\":\"%s\",\"seq\":%lld,\"queue\":\"%s\"",
        w->pg->name, (long long)bytes, dt, (long long)w->seq, hs_comm_queue_name(w->pg->queue->id));
    if (hs_comm_op_is_p2p(a->op) && n > 0 && (size_t)n < sizeof args)
        n += snprintf(args + n, sizeof args - (size_t)n, ",\"peer\":%d", a->peer);
    const char *path = hs_comm_exec_path(w->pg, a);
    if (path && n > 0 && (size_t)n < sizeof args)
        n += snprintf(args + n, sizeof args - (size_t)n, ",\"path\":\"%s\"", path);
    int64_t sent[2];
    hs_comm_sent_bytes(w->pg, a, sent);
    if (n > 0 && (size_t)n < sizeof args)
        n += snprintf(args + n, sizeof args - (size_t)n, ",\"sent_intra\":%lld,\"sent_inter\":%lld",
                      (long long)sent[0], (long long)sent[1]);
    /* all_to_allv: the elements sent to and received from each peer. */
    for (int k = 0; a->op == HS_OP_ALL_TO_ALLV && k < 2; k++) {
        const int64_t *v = k ? a->recv_counts : a->send_counts;
        for (int i = 0; i < w->pg->size && n > 0 && (size_t)n + 24 < sizeof args; i++)
            n += snprintf(args + n, sizeof args - (size_t)n, "%s%lld%s",
                          i   ? ","
                          : k ? ",\"recv_counts\":["
                              : ",\"send_counts\":[",
                          (long long)v[i], i == w->pg->size - 1 ? "]" : "");
    }
    hs_trace_span(c->trace, HS_LANE_COMM, op, "comm", t0, t1, args);
}

/* Counts w, done with status st: a count that finds no memory fails the
 * work (the counters would be wrong), the collective itself done. */
static hs_status work_count(hs_comm *c, const hs_work *w, hs_status st, hs_error *err) {
    hs_status ct = hs_trace_count(c->trace, hs_comm_op_name(w->args.op), w->pg->name,
                                  work_bytes(w->pg, &w->args), st == HS_OK ? err : NULL);
    return st != HS_OK ? st : ct;
}

/* Runs w on its group. A device backend that completes on a stream of its
 * own (NCCL) enqueues it and records its completion event, published at
 * once for hs_work_wait_stream; this thread then waits for the event as it
 * waits for any collective, so the watchdog, the trace and a failure's
 * report are the same either way. */
static hs_status exec_published(hs_work *w, hs_error *err) {
    hs_pg *g = w->pg;
    const hs_pg_backend *b = g->dev_backend;
    if (!b || !b->enqueue || !hs_args_on_device(&w->args)) return hs_comm_exec(g, &w->args, err);
    hs_event *done = NULL;
    hs_status st = b->enqueue(g->dev_ctx, &w->args, &done, err);
    if (st != HS_OK) return st;
    hs_queue *q = g->queue;
    pthread_mutex_lock(&q->mu);
    w->done_event = done;
    pthread_cond_broadcast(&q->done_cv);
    pthread_mutex_unlock(&q->mu);
    return b->complete(g->dev_ctx, &w->args, done, err);
}

/* Execute, count and record one work item; the caller publishes the
 * outcome. */
static hs_status work_exec(hs_comm *c, hs_work *w, hs_error *err) {
    hs_pg *g = w->pg;
    bool p2p = hs_comm_op_is_p2p(w->args.op);
    if (!p2p) atomic_store(&c->entered[g->slot], w->seq);
    hs_error_clear(err);
    double t0 = hs_now();
    hs_status st = !p2p && atomic_load(&c->fp_each) ? hs_fp_compare_each(g, &w->fp, err) : HS_OK;
    if (st != HS_OK) return work_count(c, w, st, err);
    st = exec_published(w, err);
    double t1 = hs_now();
    st = work_count(c, w, st, err);
    work_trace(c, w, t0, t1);
    return st;
}

/* What the watchdog is told about w, outstanding since `started`. */
static hs_comm_current current_of(const hs_work *w, double started, bool in_flight) {
    const hs_coll_args *a = &w->args;
    return (hs_comm_current){.busy = true,
                             .in_flight = in_flight,
                             .op = a->op,
                             .slot = w->pg->slot,
                             .seq = w->seq,
                             .peer_world = hs_comm_op_is_p2p(a->op) ? w->pg->world_ranks[a->peer]
                                                                    : -1,
                             .started = started};
}

/* Under q->mu: mark the queue busy with w. */
static void current_set(hs_queue *q, const hs_work *w) {
    q->current = current_of(w, hs_now(), false);
}

/* Under q->mu: publish w's outcome. The communication thread has no
 * caller to return to: when even the report of a failure finds no memory,
 * the failure ends the run here, with its own message. */
static void work_finish(hs_queue *q, hs_work *w, hs_status st, const hs_error *err) {
    if (w->detached) {
        /* work on the waiting stream already reads the result: a failed
         * collective cannot be reported to it, so it ends every rank */
        if (st != HS_OK) hs_comm_abort(q->comm, err);
        hs_event_free(w->done_event);
        free(w);
        q->detached--;
        pthread_cond_broadcast(&q->done_cv);
        return;
    }
    if (st != HS_OK) {
        w->err = malloc(sizeof *w->err);
        if (!w->err) hs_comm_abort(q->comm, err);
        memcpy(w->err, err, sizeof *err);
    }
    w->status = st;
    w->done = true;
    pthread_cond_broadcast(&q->done_cv);
}

/* A pipeline queue's send / recv: started, then polled (poll_inflight).
 * Returns false when the backend cannot start it without blocking. */
static bool p2p_start(hs_queue *q, hs_work *w, hs_error *err) {
    hs_pg *g = w->pg;
    if (!q->async_p2p || !hs_comm_op_is_p2p(w->args.op) || !g->backend->p2p_start ||
        (hs_args_on_device(&w->args) && g->dev_backend))
        return false;
    hs_error_clear(err);
    w->started = hs_now();
    void *req = NULL;
    hs_coll_args run; /* the buffer, or its host copy (stage.c) */
    hs_status st = hs_stage_p2p_begin(w, &run, err);
    if (st == HS_OK) {
        st = g->backend->p2p_start(g->ctx, &run, &req, err);
        if (st != HS_OK || !req) hs_stage_p2p_end(w, false);
    }
    if (st == HS_OK && !req) return false;
    pthread_mutex_lock(&q->mu);
    if (st != HS_OK) {
        work_finish(q, w, st, err);
    } else {
        w->req = req;
        w->next_inflight = q->inflight;
        q->inflight = w;
    }
    q->current.busy = false;
    pthread_mutex_unlock(&q->mu);
    return true;
}

/* Under q->mu: test every started send / recv and publish those done. */
static void poll_inflight(hs_queue *q, hs_error *err) {
    hs_work **link = &q->inflight;
    while (*link) {
        hs_work *w = *link;
        bool done = false;
        hs_error_clear(err);
        hs_status st = w->pg->backend->p2p_test(w->pg->ctx, w->req, &done, err);
        if (!done && st == HS_OK) {
            link = &w->next_inflight;
            continue;
        }
        *link = w->next_inflight;
        hs_stage_p2p_end(w, st == HS_OK); /* a received host copy goes to the device */
        st = work_count(q->comm, w, st, err);
        work_trace(q->comm, w, w->started, hs_now());
        work_finish(q, w, st, err);
    }
}

/* Under q->mu: wait for work, polling what is in flight every 50 us. */
static void queue_wait(hs_queue *q, hs_error *err) {
    for (;;) {
        if (q->inflight) poll_inflight(q, err);
        bool ready = q->head && !q->current.busy;
        if (ready || (q->stopping && !q->inflight)) return;
        if (!q->inflight) {
            pthread_cond_wait(&q->queue_cv, &q->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&q->queue_cv, &q->mu, &ts);
    }
}

static void *queue_thread_main(void *arg) {
    hs_queue *q = arg;
    hs_comm *c = q->comm;
    hs_error *scratch = q->scratch;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        /* busy here means a blocking call runs inline on the issuing thread. */
        queue_wait(q, scratch);
        if (!q->head) break;
        hs_work *w = q->head;
        q->head = w->next;
        if (!q->head) q->tail = NULL;
        current_set(q, w);
        pthread_mutex_unlock(&q->mu);
        if (p2p_start(q, w, scratch)) {
            pthread_mutex_lock(&q->mu);
            continue;
        }
        hs_status st = work_exec(c, w, scratch);
        pthread_mutex_lock(&q->mu);
        q->current.busy = false;
        work_finish(q, w, st, scratch);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static hs_status queue_start(hs_comm *c, int i, hs_error *e) {
    hs_queue *q = &c->queues[i];
    q->comm = c;
    q->id = (hs_comm_queue)i;
    q->async_p2p = i == HS_COMM_QUEUE_PP_FORWARD || i == HS_COMM_QUEUE_PP_BACKWARD;
    q->scratch = malloc(sizeof *q->scratch);
    if (!q->scratch)
        return hs_error_oom(e, "starting the %s communication thread: %zu bytes",
                            hs_comm_queue_name(q->id), sizeof *q->scratch);
    HS_CHECK_PTHREAD(pthread_mutex_init(&q->mu, NULL));
    HS_CHECK_PTHREAD(pthread_cond_init(&q->queue_cv, NULL));
    HS_CHECK_PTHREAD(pthread_cond_init(&q->done_cv, NULL));
    hs_stage_init(&q->stage);
    int rc = pthread_create(&q->thread, NULL, queue_thread_main, q);
    q->started = rc == 0;
    if (rc == 0) return HS_OK;
    pthread_cond_destroy(&q->queue_cv);
    pthread_cond_destroy(&q->done_cv);
    pthread_mutex_destroy(&q->mu);
    hs_stage_destroy(&q->stage);
    free(q->scratch);
    q->scratch = NULL;
    return hs_error_set(e, HS_ERR_INTERNAL,
                        "starting the %s communication thread: pthread_create failed: %s; check "
                        "the limit on threads (ulimit -u)",
                        hs_comm_queue_name(q->id), strerror(rc));
}

hs_status hs_comm_queue_start(hs_comm *c, hs_error *e) {
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) {
        hs_status st = queue_start(c, i, e);
        if (st != HS_OK) {
            hs_comm_queue_stop(c);
            return st;
        }
    }
    return HS_OK;
}

/* Every queue is told to stop before any is joined: each drains on its own
 * thread, so pending work on one queue that a peer can only match after
 * work on another queue still completes. */
void hs_comm_queue_stop(hs_comm *c) {
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) {
        hs_queue *q = &c->queues[i];
        if (!q->started) continue;
        pthread_mutex_lock(&q->mu);
        q->stopping = true;
        pthread_cond_broadcast(&q->queue_cv);
        pthread_mutex_unlock(&q->mu);
    }
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) {
        hs_queue *q = &c->queues[i];
        if (!q->started) continue;
        HS_CHECK_PTHREAD(pthread_join(q->thread, NULL));
        pthread_cond_destroy(&q->queue_cv);
        pthread_cond_destroy(&q->done_cv);
        pthread_mutex_destroy(&q->mu);
        hs_stage_destroy(&q->stage);
        free(q->scratch);
        q->scratch = NULL;
        q->started = false;
    }
}

/* Under g->queue->mu: number w by the next sequence number of its kind on
 * g; a collective goes into g's fingerprint. */
static void number(hs_pg *g, hs_work *w) {
    if (hs_comm_op_is_p2p(w->args.op)) {
        w->seq = ++g->next_p2p;
        return;
    }
    w->seq = ++g->next_seq;
    hs_fp_issue(g, &w->args, w->seq, &w->fp);
}

hs_work *hs_comm_enqueue(hs_pg *g, const hs_coll_args *a) {
    hs_queue *q = g->queue;
    hs_work *w = calloc(1, sizeof *w);
    if (!w) {
        hs_error e;
        hs_error_oom(&e, "queueing %s on group '%s': %zu bytes", hs_comm_op_name(a->op), g->name,
                     sizeof *w);
        hs_comm_abort(g->comm, &e);
    }
    w->pg = g;
    w->args = *a;
    pthread_mutex_lock(&q->mu);
    if (q->stopping)
        hs_panic("%s issued on group '%s' after hs_comm_finalize", hs_comm_op_name(a->op), g->name);
    if (hs_fp_fault_apply(g, &w->args)) { /* done without running */
        hs_args_ready_free(&w->args);
        w->done = true;
        pthread_mutex_unlock(&q->mu);
        return w;
    }
    number(g, w);
    if (q->tail) q->tail->next = w;
    else q->head = w;
    q->tail = w;
    pthread_cond_signal(&q->queue_cv);
    pthread_mutex_unlock(&q->mu);
    return w;
}

/* A blocking call. When nothing is queued or running on the group's queue,
 * it executes on the calling thread: the same order and result as async +
 * wait, without two thread hand-offs (each a scheduler wake-up, which on a
 * loaded machine costs more than a small collective). The busy mark keeps
 * that queue's thread off while it runs, and the watchdog sees it alike;
 * the other queue is not involved and keeps running. */
hs_status hs_comm_run(hs_pg *g, const hs_coll_args *a, hs_error *e) {
    hs_queue *q = g->queue;
    pthread_mutex_lock(&q->mu);
    if (q->head || q->current.busy || q->stopping) {
        pthread_mutex_unlock(&q->mu);
        return hs_work_wait(hs_comm_enqueue(g, a), e);
    }
    hs_work w = {.pg = g, .args = *a};
    if (hs_fp_fault_apply(g, &w.args)) {
        hs_args_ready_free(&w.args);
        pthread_mutex_unlock(&q->mu);
        return HS_OK;
    }
    number(g, &w);
    current_set(q, &w);
    pthread_mutex_unlock(&q->mu);
    hs_error scratch;
    hs_status st = work_exec(g->comm, &w, &scratch);
    if (st != HS_OK && e) memcpy(e, &scratch, sizeof scratch);
    hs_event_free(w.done_event); /* complete: nothing waits on it */
    pthread_mutex_lock(&q->mu);
    q->current.busy = false;
    if (q->head) pthread_cond_signal(&q->queue_cv); /* queued meanwhile by another thread */
    pthread_mutex_unlock(&q->mu);
    return st;
}

/* The oldest of what the queue executes and what it has in flight: the
 * first to exceed the timeout. A send / recv in flight counts from its
 * start like a blocking one, although the thread has gone on. */
hs_comm_current hs_comm_current_get(hs_comm *c, hs_comm_queue id) {
    HS_ASSERT(id >= 0 && id < HS_COMM_QUEUE_COUNT);
    hs_queue *q = &c->queues[id];
    pthread_mutex_lock(&q->mu);
    hs_comm_current cur = q->current;
    for (const hs_work *w = q->inflight; w; w = w->next_inflight)
        if (!cur.busy || w->started < cur.started) cur = current_of(w, w->started, true);
    pthread_mutex_unlock(&q->mu);
    return cur;
}

hs_status hs_work_wait(hs_work *w, hs_error *e) {
    HS_ASSERT(w != NULL);
    hs_queue *q = w->pg->queue;
    pthread_mutex_lock(&q->mu);
    while (!w->done) pthread_cond_wait(&q->done_cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    hs_status st = w->status;
    if (st != HS_OK && e) memcpy(e, w->err, sizeof *e);
    hs_event_free(w->done_event);
    free(w->err);
    free(w);
    return st;
}

/* On a device backend that published its completion event (NCCL): s waits
 * for the event on the device and the host goes on as soon as the
 * collective is enqueued; the communication thread still waits for it,
 * then frees the item (a failure then ends every rank: work on s already
 * reads the result). Otherwise the result is in place by the time the work
 * is done (mpi wrote it from the host, or into staging copied back with a
 * synchronized copy), so the host wait is the stream wait. */
hs_status hs_work_wait_stream(hs_work *w, hs_stream *s, hs_error *e) {
    HS_ASSERT(w != NULL);
    if (!s) return hs_work_wait(w, e);
    hs_queue *q = w->pg->queue;
    pthread_mutex_lock(&q->mu);
    while (!w->done && !w->done_event) pthread_cond_wait(&q->done_cv, &q->mu);
    if (!w->done) {
        hs_stream_wait(s, w->done_event);
        w->detached = true;
        q->detached++;
        pthread_mutex_unlock(&q->mu);
        return HS_OK;
    }
    pthread_mutex_unlock(&q->mu);
    return hs_work_wait(w, e);
}

void hs_comm_settle_detached(hs_comm *c) {
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) {
        hs_queue *q = &c->queues[i];
        if (!q->started) continue;
        pthread_mutex_lock(&q->mu);
        while (q->detached > 0) pthread_cond_wait(&q->done_cv, &q->mu);
        pthread_mutex_unlock(&q->mu);
    }
}

bool hs_work_test(hs_work *w) {
    HS_ASSERT(w != NULL);
    hs_queue *q = w->pg->queue;
    pthread_mutex_lock(&q->mu);
    bool done = w->done;
    pthread_mutex_unlock(&q->mu);
    return done;
}
