/* ckpt/writer.c — the background save (hypershard/ckpt.h, docs/checkpoint.md
 * "Asynchronous save").
 *
 * The caller's thread runs the collective phases (save.h: begin, end) and
 * the snapshot; one thread per save runs only the write phase, on host
 * copies in the staging buffer. The thread never communicates, so the comm
 * layer sees collectives from one thread only, in the same order on every
 * rank: begin at the save, then at each poll one all-reduce of "still
 * writing" counts until every rank is done, then end. A rank killed during
 * the write leaves only .tmp-step-N: nothing is renamed before end. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/save.h"

struct hs_ckpt_writer {
    hs_device *dev;   /* the staging buffer's allocator; NULL: malloc */
    char *stage;      /* the snapshot of this rank's chunks, in file order */
    size_t stage_cap; /* its bytes */
    /* the save in flight */
    bool busy;
    hs_pg *world;
    hs_ckpt_saver sv;
    hs_ckpt_tensor *staged; /* [n]: the list begin saw, data in `stage`, host */
    int n;
    pthread_t thread;
    atomic_int done; /* set by the thread when its write has ended */
    hs_status written;
    hs_error write_error;
    double cpu_s, wall_s; /* the write's thread CPU time and wall time */
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
    hs_error_clear(&w->write_error);
    w->written = hs_ckpt_saver_write(&w->sv, w->staged, w->n, &w->write_error);
    w->cpu_s = thread_cpu_s() - c0;
    w->wall_s = hs_now() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

/* Forget the save in flight (its directory is the saver's business). */
static void drop(hs_ckpt_writer *w) {
    hs_ckpt_saver_free(&w->sv);
    free(w->staged);
    w->staged = NULL;
    w->busy = false;
}

/* This rank's write is over: agree and publish. */
static hs_status end_save(hs_ckpt_writer *w, hs_error *e) {
    if (w->written != HS_OK) *e = w->write_error;
    /* what the write took from the cores training runs on (bench/ckpt_stall.py) */
    hs_log_info(w->sv.opt.log, "checkpoint: %s written on rank 0 in %.2f s, %.2f s of it CPU",
                w->sv.step_name, w->wall_s, w->cpu_s);
    hs_status s = hs_ckpt_saver_end(&w->sv, w->world, w->written, e);
    drop(w);
    return s;
}

static hs_status finish(hs_ckpt_writer *w, hs_error *e) {
    pthread_join(w->thread, NULL);
    return end_save(w, e);
}

hs_status hs_ckpt_writer_wait(hs_ckpt_writer *w, hs_error *e) {
    return w && w->busy ? finish(w, e) : HS_OK;
}

hs_status hs_ckpt_writer_poll(hs_ckpt_writer *w, hs_error *e) {
    if (!w || !w->busy) return HS_OK;
    float writing = atomic_load(&w->done) ? 0.0f : 1.0f;
    hs_status s = hs_pg_all_reduce(w->world, NULL, &writing, 1, HS_DTYPE_F32, HS_REDUCE_SUM, e);
    if (s != HS_OK) return s;
    return writing == 0.0f ? finish(w, e) : HS_OK;
}

bool hs_ckpt_writer_busy(const hs_ckpt_writer *w) { return w && w->busy; }

int64_t hs_ckpt_writer_staging_bytes(const hs_ckpt_writer *w) {
    return w ? (int64_t)w->stage_cap : 0;
}

/* Begun: stage and snapshot on every rank (agreed), then start the write. */
static hs_status start(hs_ckpt_writer *w, const hs_ckpt_tensor *t, int n, hs_error *e) {
    double t0 = hs_now();
    hs_status s = stage_reserve(w, (size_t)hs_ckpt_saver_rank_bytes(&w->sv), e);
    if (s == HS_OK) s = snapshot(w, t, n, e);
    s = hs_pg_agree(w->world, s, "checkpoint save: the snapshot", e);
    if (s != HS_OK) {
        hs_ckpt_saver_abort(&w->sv); /* every rank fails here together */
        drop(w);
        return s;
    }
    atomic_store(&w->done, 0);
    w->busy = true;
    const hs_log *log = w->sv.opt.log;
    if (pthread_create(&w->thread, NULL, write_thread, w) != 0) {
        hs_log_warn(log, "checkpoint: no thread for the background write; writing %s now",
                    w->sv.step_name);
        write_thread(w);
        return end_save(w, e);
    }
    hs_log_info(log,
                "checkpoint: %s snapshot of %.2f MiB on rank 0 in %.3f s; writing in the "
                "background",
                w->sv.step_name, (double)hs_ckpt_saver_rank_bytes(&w->sv) / 1048576.0,
                hs_now() - t0);
    return HS_OK;
}

hs_status hs_ckpt_save_async(hs_ckpt_writer *w, hs_comm *comm, const hs_ckpt_save_options *opt,
                             const hs_ckpt_tensor *tensors, int n, const hs_ckpt_state *state,
                             hs_error *e) {
    hs_status s = hs_ckpt_writer_wait(w, e);
    if (s != HS_OK) return s;
    w->world = hs_comm_world(comm);
    s = hs_ckpt_saver_begin(&w->sv, w->world, opt, tensors, n, state, e);
    if (s != HS_OK) {
        hs_ckpt_saver_free(&w->sv);
        return s;
    }
    return start(w, tensors, n, e);
}

void hs_ckpt_writer_free(hs_ckpt_writer *w) {
    if (!w) return;
    if (w->busy) {
        pthread_join(w->thread, NULL);
        hs_log_warn(w->sv.opt.log,
                    "checkpoint: %s was not published (the run ended before its ranks agreed "
                    "on it); the previous checkpoint stays the latest",
                    w->sv.step_name);
        drop(w);
    }
    stage_release(w);
    free(w);
}
