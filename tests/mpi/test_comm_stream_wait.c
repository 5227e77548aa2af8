/* comm/work.c: hs_work_wait_stream on a group whose device backend
 * completes on a stream of its own (NCCL's enqueue / complete) makes the
 * stream wait for the collective's completion event and returns without
 * the host waiting; the communication thread still waits for it, then
 * frees the item and its event.
 * HS_MPI_RANKS: 2
 * HS_TEST_TIMEOUT: 120
 *
 * A cpu device with host_visible false stands for a GPU, and a stand-in
 * device backend for NCCL: its enqueue runs the collective at once (the
 * mpi backend, so the data are there when enqueue returns, as they would
 * be for a stream ordered behind the event) and makes the event; its
 * complete sleeps DELAY_US before it reports, which is the collective
 * still running on the GPU. Checked: the stream wait returns before
 * complete ran, with the published event handed to the device's
 * stream_wait and the right sums; hs_work_wait and the blocking form wait
 * for complete; a failure in complete reaches hs_work_wait; releasing the
 * device waits for the items left to the thread; every event made is
 * destroyed. (A failure after the stream wait returned ends every rank
 * through hs_comm_abort, which this process cannot survive to check.) */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "mpi_test_util.h"
#include "comm/group.h"
#include "hypershard/comm.h"

#define DELAY_US 400000
#define N 1000

typedef struct ctx {
    hs_comm *comm;
    int rank, size;
    int failures;
    hs_device *d;
    hs_stream *s;
    hs_pg *g;
} ctx;

/* ------------------------------------------------ the device's counters */

static atomic_int events_made, events_gone, stream_waits;
static _Atomic(hs_event *) waited_on;
static const hs_device_ops *base_ops;

static void *counting_event_create(hs_device *d) {
    atomic_fetch_add(&events_made, 1);
    return base_ops->event_create(d);
}

static void counting_event_destroy(hs_device *d, void *ev) {
    atomic_fetch_add(&events_gone, 1);
    base_ops->event_destroy(d, ev);
}

static void counting_stream_wait(hs_stream *s, hs_event *e) {
    atomic_fetch_add(&stream_waits, 1);
    atomic_store(&waited_on, e);
    base_ops->stream_wait(s, e);
}

/* ------------------------------------------------ the stand-in backend */

typedef struct fake {
    hs_pg *pg; /* runs the collectives on its mpi backend */
    atomic_int enqueued, completed;
    _Atomic(hs_event *) last_event;
    atomic_bool fail;
} fake;

static hs_status fake_enqueue(void *vctx, const hs_coll_args *a, hs_event **done, hs_error *e) {
    fake *f = vctx;
    hs_event_free(a->ready); /* taken, as NCCL takes it */
    hs_coll_args run = *a;
    run.ready = NULL;
    hs_status st = f->pg->backend->exec(f->pg->ctx, &run, e);
    if (st == HS_OK && done) {
        st = hs_event_create(a->dev, done, e);
        atomic_store(&f->last_event, *done);
    }
    atomic_fetch_add(&f->enqueued, 1);
    return st;
}

static hs_status fake_complete(void *vctx, const hs_coll_args *a, hs_event *done, hs_error *e) {
    fake *f = vctx;
    (void)done;
    usleep(DELAY_US);
    atomic_fetch_add(&f->completed, 1);
    if (atomic_load(&f->fail))
        return hs_error_set(e, HS_ERR_COMM, "%s: the stand-in's failure", hs_comm_op_name(a->op));
    return HS_OK;
}

static hs_status fake_exec(void *vctx, const hs_coll_args *a, hs_error *e) {
    hs_status st = fake_enqueue(vctx, a, NULL, e);
    return st == HS_OK ? fake_complete(vctx, a, NULL, e) : st;
}

static void fake_destroy(void *vctx) { (void)vctx; }

static const hs_pg_backend fake_backend = {.name = "stand-in",
                                           .exec = fake_exec,
                                           .enqueue = fake_enqueue,
                                           .complete = fake_complete,
                                           .destroy = fake_destroy};

/* ------------------------------------------------------------ checks */

static float *filled(ctx *t) {
    float *x = hs_device_alloc(t->d, N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)(t->rank + 1) * (float)(i % 7);
    return x;
}

/* sum over ranks r of (r + 1) * (i % 7) */
static int wrong_sums(const ctx *t, const float *x) {
    int bad = 0;
    float ranks = (float)(t->size * (t->size + 1) / 2);
    for (int i = 0; i < N; i++) bad += x[i] != ranks * (float)(i % 7);
    return bad;
}

static void test_stream_wait_returns_before_the_collective_completes(ctx *t, fake *f) {
    hs_error e;
    float *x = filled(t);
    int completed = atomic_load(&f->completed), waits = atomic_load(&stream_waits);
    hs_work *w = hs_pg_all_reduce_async(t->g, t->s, x, N, HS_DTYPE_F32, HS_REDUCE_SUM);
    double t0 = hs_now();
    hs_status st = hs_work_wait_stream(w, t->s, &e);
    double took = hs_now() - t0;
    int completed_then = atomic_load(&f->completed);
    CHECK_COUNT(t, st == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, completed_then == completed,
                "the stream wait returned after complete ran (%d completions, %d before)",
                completed_then, completed);
    CHECK_COUNT(t, took < 0.75 * DELAY_US / 1e6, "the stream wait took %.3f s", took);
    CHECK_COUNT(t, atomic_load(&stream_waits) == waits + 1, "%d stream waits, want %d",
                atomic_load(&stream_waits), waits + 1);
    CHECK_COUNT(t, atomic_load(&waited_on) == atomic_load(&f->last_event),
                "the stream waited on another event than the one published");
    CHECK_COUNT(t, wrong_sums(t, x) == 0, "%d wrong sums", wrong_sums(t, x));
    /* the thread finishes it and frees it with its event */
    hs_comm_settle_detached(t->comm);
    CHECK_COUNT(t, atomic_load(&f->completed) == completed + 1, "%d completions, want %d",
                atomic_load(&f->completed), completed + 1);
    hs_device_free_mem(t->d, x);
}

static void test_host_waits_wait_for_completion(ctx *t, fake *f) {
    hs_error e;
    float *x = filled(t);
    int completed = atomic_load(&f->completed), waits = atomic_load(&stream_waits);
    hs_work *w = hs_pg_all_reduce_async(t->g, t->s, x, N, HS_DTYPE_F32, HS_REDUCE_SUM);
    CHECK_COUNT(t, hs_work_wait(w, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, atomic_load(&f->completed) == completed + 1,
                "hs_work_wait returned before complete");
    CHECK_COUNT(t, wrong_sums(t, x) == 0, "async + hs_work_wait: %d wrong sums", wrong_sums(t, x));
    /* the blocking form is a host wait too, inline or queued */
    hs_device_free_mem(t->d, x);
    x = filled(t);
    CHECK_COUNT(t, hs_pg_all_reduce(t->g, t->s, x, N, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t, atomic_load(&f->completed) == completed + 2,
                "the blocking all-reduce returned before complete");
    CHECK_COUNT(t, wrong_sums(t, x) == 0, "blocking: %d wrong sums", wrong_sums(t, x));
    /* a NULL stream is a host wait */
    hs_work *h = hs_pg_all_reduce_async(t->g, t->s, x, 1, HS_DTYPE_F32, HS_REDUCE_SUM);
    CHECK_COUNT(t, hs_work_wait_stream(h, NULL, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, atomic_load(&f->completed) == completed + 3,
                "hs_work_wait_stream(w, NULL) returned before complete");
    CHECK_COUNT(t, atomic_load(&stream_waits) == waits, "a host wait made a stream wait");
    hs_device_free_mem(t->d, x);
}

static void test_failure_reaches_the_host_wait(ctx *t, fake *f) {
    hs_error e;
    hs_error_clear(&e);
    float *x = filled(t);
    atomic_store(&f->fail, true);
    hs_work *w = hs_pg_all_reduce_async(t->g, t->s, x, N, HS_DTYPE_F32, HS_REDUCE_SUM);
    hs_status st = hs_work_wait(w, &e);
    atomic_store(&f->fail, false);
    CHECK_COUNT(t, st == HS_ERR_COMM && strstr(e.msg, "the stand-in's failure"), "status %d: %s",
                (int)st, e.msg);
    hs_device_free_mem(t->d, x);
}

static void test_release_settles_what_the_thread_still_holds(ctx *t, fake *f) {
    hs_error e;
    float *x = filled(t);
    int completed = atomic_load(&f->completed);
    hs_work *w = hs_pg_all_reduce_async(t->g, t->s, x, N, HS_DTYPE_F32, HS_REDUCE_SUM);
    CHECK_COUNT(t, hs_work_wait_stream(w, t->s, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, hs_comm_set_device(t->comm, NULL, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, atomic_load(&f->completed) == completed + 1,
                "the device was released with a collective still finishing");
    CHECK_COUNT(t, atomic_load(&events_made) == atomic_load(&events_gone),
                "%d events made, %d destroyed", atomic_load(&events_made),
                atomic_load(&events_gone));
    hs_device_free_mem(t->d, x);
}

int main(int argc, char **argv) {
    ctx t = {0};
    hs_error e;
    hs_comm_options opt = {.timeout_s = 60};
    t.comm = mt_comm_init(&argc, &argv, &opt);
    t.rank = hs_comm_rank(t.comm);
    t.size = hs_comm_size(t.comm);
    mt_cpu_device(&t.d, &t.s);
    base_ops = t.d->ops;
    hs_device_ops counting = *base_ops;
    counting.event_create = counting_event_create;
    counting.event_destroy = counting_event_destroy;
    counting.stream_wait = counting_stream_wait;
    t.d->ops = &counting;
    t.d->host_visible = false; /* as a GPU's */
    CHECK_COUNT(&t, hs_comm_set_device(t.comm, t.d, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(&t, hs_comm_split(t.comm, "stand_in", 0, t.rank, &t.g, &e) == HS_OK, "%s", e.msg);
    fake f = {.pg = t.g};
    t.g->dev_backend = &fake_backend;
    t.g->dev_ctx = &f;

    test_stream_wait_returns_before_the_collective_completes(&t, &f);
    test_host_waits_wait_for_completion(&t, &f);
    test_failure_reaches_the_host_wait(&t, &f);
    test_release_settles_what_the_thread_still_holds(&t, &f);

    t.g->dev_backend = NULL;
    t.g->dev_ctx = NULL;
    int rc = mt_verdict(t.failures, t.rank, t.size);
    hs_stream_free(t.s);
    t.d->ops = base_ops;
    hs_device_free(t.d);
    hs_comm_finalize(t.comm);
    return rc;
}
