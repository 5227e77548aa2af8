/* ckpt/writer.c — the background save (hypershard/ckpt.h, docs/checkpoint.md
 * "Asynchronous save").
 *
 * The caller's thread runs the collective phases (save.h: begin, collect,
 * settle) and the snapshot; everything that waits for the disk runs on a
 * thread: first each rank's write (data file, CRC, fsync), then rank 0's
 * publish (metadata, fsyncs, rename, `latest`, prune). The threads never
 * communicate: the comm layer checks that every rank issues the same
 * collectives in the same order on a group's queue (hs_comm_check compares
 * running hashes), which a collective issued from a thread that runs beside
 * training, at a moment that differs per rank, would break. So the caller's
 * thread drives a save through its states with small collectives at step
 * boundaries, the same on every rank:
 *
 *   WRITING     each rank's thread writes; every poll all-reduces how many
 *               ranks are still writing. At 0: collect (agree on the
 *               snapshots and writes, gather the CRCs); rank 0 starts the
 *               publish thread.
 *   PUBLISHING  rank 0's thread publishes; every poll all-reduces whether it
 *               is still at it. At 0: settle (agree that it published).
 *
 * Rank 0 publishes only after collect, so only once every rank's data file
 * is on disk, and the publish itself is the synchronous save's, in the same
 * order: a process killed at any point leaves the previous checkpoint as
 * `latest` (or, after the rename of `latest`, the new one, complete). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/save.h"

typedef enum { IDLE, WRITING, PUBLISHING } writer_state;

struct hs_ckpt_writer {
    hs_device *dev;   /* the staging buffer's allocator; NULL: malloc */
    char *stage;      /* the snapshot of this rank's chunks, in file order */
    size_t stage_cap; /* its bytes */
    /* the save in flight */
    writer_state state;
    hs_pg *world;
    hs_ckpt_saver sv;
    hs_ckpt_tensor *staged; /* [n]: the list begin saw, data in `stage`, host */
    int n;
    pthread_t thread;
    bool thread_live; /* `thread` runs this state's work and is not joined yet */
    atomic_int done;  /* set when this state's work (a thread's, or none) has ended */
    hs_status written, published;
    hs_error write_error, publish_error;
    double cpu_s, wall_s; /* the write's thread CPU time and wall time */
    double publish_s;     /* rank 0's publish, wall time */
    /* The training thread's time spent on this save (the start, polls while
     * it is in flight, the wait): what a save costs training, logged when it
     * is published (bench/ckpt_stall.py). */
    double blocked_s, snapshot_s;
};

hs_status hs_ckpt_writer_create(hs_device *dev, hs_ckpt_writer **out, hs_error *e) {
    *out = calloc(1, sizeof **out);
    if (!*out) return hs_error_oom(e, "checkpoint: the background writer");
    (*out)->dev = dev;
    atomic_init(&(*out)->done, 0);
    return HS_OK;
}

static void stage_release(hs_ckpt_writer *w) {
    if (w->stage && w->dev) hs_host_free(w->dev, w->stage);
    else free(w->stage);
    w->stage = NULL;
    w->stage_cap = 0;
}

/* The staging buffer holds at least `bytes`; kept across saves (the same
 * checkpoint every time), replaced only when it must grow. */
static hs_status stage_reserve(hs_ckpt_writer *w, size_t bytes, hs_error *e) {
    if (bytes <= w->stage_cap) return HS_OK;
    stage_release(w);
    w->stage = w->dev ? hs_host_alloc(w->dev, bytes) : malloc(bytes);
    if (!w->stage) {
        const char *what = "the checkpoint snapshot's staging buffer (checkpoint.async)";
        if (w->dev) return hs_pool_oom(&w->dev->host_pool, bytes, what, e);
        return hs_error_oom(e, "%s: %zu bytes", what, bytes);
    }
    w->stage_cap = bytes;
    return HS_OK;
}

hs_status hs_ckpt_writer_reserve(hs_ckpt_writer *w, int64_t bytes, hs_error *e) {
    size_t had = w->stage_cap;
    hs_status s = bytes > 0 ? stage_reserve(w, (size_t)bytes, e) : HS_OK;
    if (s == HS_OK && w->stage_cap > had) memset(w->stage, 0, w->stage_cap);
    return s;
}

/* Copy the chunks this rank writes into the staging buffer, back to back
 * in file order; w->staged describes them as host memory. */
static hs_status snapshot(hs_ckpt_writer *w, const hs_ckpt_tensor *t, int n, hs_error *e) {
    w->staged = malloc(sizeof *w->staged * (size_t)(n > 0 ? n : 1));
    if (!w->staged) return hs_error_oom(e, "checkpoint: the snapshot's list of %d tensors", n);
    w->n = n;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        w->staged[i] = t[i];
        w->staged[i].dev = NULL;
        w->staged[i].name = NULL; /* the caller's; the plan holds a copy */
        if (!hs_ckpt_saver_writes(&w->sv, i)) {
            w->staged[i].data = NULL;
            continue;
        }
        size_t bytes = (size_t)hs_ckpt_tensor_numel(&t[i]) * hs_dtype_size(t[i].dtype);
        w->staged[i].data = w->stage + at;
        if (t[i].dev) hs_device_copy(t[i].dev, w->stage + at, t[i].data, bytes, HS_COPY_D2H);
        else if (bytes) memcpy(w->stage + at, t[i].data, bytes);
        at += bytes;
    }
    return HS_OK;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * ts.tv_nsec
                                                            : 0.0;
}

static void *write_thread(void *arg) {
    hs_ckpt_writer *w = arg;
    double c0 = thread_cpu_s(), t0 = hs_now();
    w->written = hs_ckpt_saver_write(&w->sv, w->staged, w->n, &w->write_error);
    w->cpu_s = thread_cpu_s() - c0;
    w->wall_s = hs_now() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

static void *publish_thread(void *arg) {
    hs_ckpt_writer *w = arg;
    double t0 = hs_now();
    hs_error_clear(&w->publish_error);
    w->published = hs_ckpt_saver_publish(&w->sv, &w->publish_error);
    w->publish_s = hs_now() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

/* Run fn on a thread of its own; where no thread can be had, here and now
 * (correct, only not in the background). */
static void run_thread(hs_ckpt_writer *w, void *(*fn)(void *), const char *what) {
    atomic_store(&w->done, 0);
    w->thread_live = pthread_create(&w->thread, NULL, fn, w) == 0;
    if (w->thread_live) return;
    hs_log_warn(w->sv.opt.log, "checkpoint: no thread for the background %s of %s; doing it now",
                what, w->sv.step_name);
    fn(w);
}

static void join(hs_ckpt_writer *w) {
    if (w->thread_live) pthread_join(w->thread, NULL);
    w->thread_live = false;
}

/* Forget the save in flight (its directory is the saver's business). */
static void drop(hs_ckpt_writer *w) {
    hs_ckpt_saver_free(&w->sv);
    free(w->staged);
    w->staged = NULL;
    w->state = IDLE;
}

/* Every rank's write is over (joined): agree on them, gather the CRCs, and
 * hand rank 0's publish to a thread. The other ranks have nothing to
 * publish: their part is done. */
static hs_status collect(hs_ckpt_writer *w, double t0, hs_error *e) {
    /* a failed snapshot or write, or what the write took from the cores
     * training runs on (bench/ckpt_stall.py) */
    if (w->written != HS_OK) *e = w->write_error;
    else
        hs_log_info(w->sv.opt.log, "checkpoint: %s written on rank 0 in %.2f s, %.2f s of it CPU",
                    w->sv.step_name, w->wall_s, w->cpu_s);
    hs_status s = hs_ckpt_saver_collect(&w->sv, w->world, w->written, e);
    if (s != HS_OK) {
        drop(w);
        return s;
    }
    w->state = PUBLISHING;
    w->published = HS_OK;
    w->publish_s = 0.0;
    if (w->sv.plan.rank == 0) run_thread(w, publish_thread, "publish");
    else atomic_store(&w->done, 1);
    w->blocked_s += hs_now() - t0;
    return HS_OK;
}

/* Rank 0's publish is over (joined): agree that it succeeded. */
static hs_status settle(hs_ckpt_writer *w, double t0, hs_error *e) {
    if (w->published != HS_OK) *e = w->publish_error;
    hs_status s = hs_ckpt_saver_settle(&w->sv, w->world, w->published, e);
    w->blocked_s += hs_now() - t0;
    if (s == HS_OK)
        hs_log_info(w->sv.opt.log,
                    "checkpoint: %s cost the training thread %.3f s (snapshot %.3f s); rank 0's "
                    "publish took %.3f s on the writer thread",
                    w->sv.step_name, w->blocked_s, w->snapshot_s, w->publish_s);
    drop(w);
    return s;
}

/* The work of the current state has ended on every rank: move on. t0: when
 * the training thread began on it (its time counts to the save's). */
static hs_status advance(hs_ckpt_writer *w, double t0, hs_error *e) {
    join(w);
    return w->state == WRITING ? collect(w, t0, e) : settle(w, t0, e);
}

hs_status hs_ckpt_writer_wait(hs_ckpt_writer *w, hs_error *e) {
    hs_status s = HS_OK;
    /* Joining stands for the polls' all-reduce: every rank joins its own
     * thread, and the next phase's agreement is collective. */
    while (s == HS_OK && w && w->state != IDLE) s = advance(w, hs_now(), e);
    return s;
}

hs_status hs_ckpt_writer_poll(hs_ckpt_writer *w, hs_error *e) {
    if (!w || w->state == IDLE) return HS_OK;
    double t0 = hs_now();
    /* One number per step while a save is in flight: how many ranks are
     * still at this state's work (writing; in PUBLISHING only rank 0 can
     * be). Every rank issues it at the same step boundary. */
    float pending = atomic_load(&w->done) ? 0.0f : 1.0f;
    hs_status s = hs_pg_all_reduce(w->world, NULL, &pending, 1, HS_DTYPE_F32, HS_REDUCE_SUM, e);
    if (s == HS_OK && pending == 0.0f) return advance(w, t0, e);
    w->blocked_s += hs_now() - t0;
    return s;
}

bool hs_ckpt_writer_busy(const hs_ckpt_writer *w) { return w && w->state != IDLE; }

int64_t hs_ckpt_writer_staging_bytes(const hs_ckpt_writer *w) {
    return w ? (int64_t)w->stage_cap : 0;
}

/* Begun: stage and snapshot, then start the write. The snapshot is not
 * agreed here: that would make every rank wait for the slowest one's copy
 * before training on. A rank whose snapshot failed starts no thread and
 * reports the failure as its write's, so the collect's agreement fails the
 * save on every rank and nothing is published, as for a failed write. */
static void start(hs_ckpt_writer *w, const hs_ckpt_tensor *t, int n, double t0) {
    double t1 = hs_now();
    hs_error_clear(&w->write_error);
    hs_status s = stage_reserve(w, (size_t)hs_ckpt_saver_rank_bytes(&w->sv), &w->write_error);
    if (s == HS_OK) s = snapshot(w, t, n, &w->write_error);
    w->snapshot_s = hs_now() - t1;
    w->state = WRITING;
    w->blocked_s = hs_now() - t0;
    if (s != HS_OK) {
        w->written = s;
        atomic_store(&w->done, 1);
        return;
    }
    hs_ckpt_saver_test_kill(&w->sv, "snapshot");
    run_thread(w, write_thread, "write");
    hs_log_info(w->sv.opt.log,
                "checkpoint: %s snapshot of %.2f MiB on rank 0 in %.3f s; writing in the "
                "background",
                w->sv.step_name, (double)hs_ckpt_saver_rank_bytes(&w->sv) / 1048576.0,
                w->snapshot_s);
}

hs_status hs_ckpt_save_async(hs_ckpt_writer *w, hs_comm *comm, const hs_ckpt_save_options *opt,
                             const hs_ckpt_tensor *tensors, int n, const hs_ckpt_state *state,
                             hs_error *e) {
    hs_status s = hs_ckpt_writer_wait(w, e);
    if (s != HS_OK) return s;
    double t0 = hs_now();
    w->world = hs_comm_world(comm);
    s = hs_ckpt_saver_begin(&w->sv, w->world, opt, tensors, n, state, e);
    if (s != HS_OK) {
        hs_ckpt_saver_free(&w->sv);
        return s;
    }
    start(w, tensors, n, t0);
    return HS_OK;
}

void hs_ckpt_writer_free(hs_ckpt_writer *w) {
    if (!w) return;
    if (w->state != IDLE) {
        join(w);
        /* Rank 0's publish, once started, runs to its end: every rank's
         * data was on disk. Only rank 0 knows whether it got there. */
        if (w->state == PUBLISHING && w->sv.plan.rank == 0 && w->published == HS_OK)
            hs_log_warn(w->sv.opt.log,
                        "checkpoint: %s was published, but the run ended before its ranks "
                        "confirmed it",
                        w->sv.step_name);
        else if (w->state == WRITING || w->sv.plan.rank == 0)
            hs_log_warn(w->sv.opt.log,
                        "checkpoint: %s was not published (the run ended before its ranks "
                        "agreed on it); the previous checkpoint stays the latest",
                        w->sv.step_name);
        drop(w);
    }
    stage_release(w);
    free(w);
}
