/* One Chrome trace for the whole job: every rank's events, gathered to
 * world rank 0 and put on rank 0's monotonic clock.
 *
 * Clock alignment: right after a barrier each rank reads its wall clock and
 * its monotonic clock together. wall - mono is the rank's epoch difference;
 * subtracting rank 0's maps the rank's monotonic times onto rank 0's. On one
 * node the monotonic clocks already agree and the offset is ~0; across nodes
 * it is as good as the nodes' wall-clock sync plus the barrier skew.
 *
 * Only the public group API is used: payloads travel as F32 elements (a
 * byte copy; nothing is reduced), so an int64 is two elements and a blob of
 * n bytes ceil(n/4). */
#include <stdlib.h>
#include <string.h>

#include "hypershard/comm.h"

#define TRACE_TAG 7301

typedef struct merge_out {
    FILE *f;
    char *tmp;
    bool wrote_any;
    hs_error err; /* rank 0's file error, reported after the others finish */
} merge_out;

static int64_t words_of(int64_t bytes) { return (bytes + 3) / 4; }

/* Every rank learns rank 0's epoch difference; the offset maps this rank's
 * monotonic times onto rank 0's. */
static hs_status merge_clock_offset(hs_pg *world, double *offset, hs_error *e) {
    hs_status s = hs_pg_barrier(world, e);
    if (s != HS_OK) return s;
    double wall = hs_wall_now(), mono = hs_now();
    double mine = wall - mono, ref = mine;
    s = hs_pg_broadcast(world, NULL, &ref, 2, HS_DTYPE_F32, 0, e);
    *offset = mine - ref;
    return s;
}

static void merge_append(merge_out *o, const char *body, size_t len) {
    if (!o->f || len == 0) return;
    if (o->wrote_any) fputc(',', o->f);
    fwrite(body, 1, len, o->f);
    o->wrote_any = true;
}

/* A file that cannot be opened (or named) is o->err, reported after the
 * other ranks' traces are received. */
static void merge_open(merge_out *o, const char *path) {
    size_t n = strlen(path) + 8;
    o->tmp = malloc(n);
    if (!o->tmp) {
        hs_error_oom(&o->err, "writing trace %s: %zu bytes for its name", path, n);
        return;
    }
    snprintf(o->tmp, n, "%s.tmp", path);
    o->f = hs_fopen(o->tmp, "wb", "check that the trace directory exists and is writable", &o->err);
    if (o->f) fputs("{\"traceEvents\":[", o->f);
}

/* Written beside the target and renamed, so a failure never leaves a
 * truncated trace where a good one is expected. */
static void merge_close(merge_out *o, const char *path, bool complete) {
    if (o->f && !complete) {
        fclose(o->f);
        remove(o->tmp);
    } else if (o->f) {
        fputs("],\"displayTimeUnit\":\"ms\"}\n", o->f);
        bool bad = ferror(o->f) != 0;
        bad = (fclose(o->f) != 0) || bad;
        if (bad || rename(o->tmp, path) != 0) {
            hs_error_set(&o->err, HS_ERR_IO,
                         "cannot write trace %s: %s; check free disk space "
                         "and permissions",
                         path, hs_strerror_errno());
            remove(o->tmp);
        }
    }
    free(o->tmp);
}

/* Rank 0 receives every other rank's blob in rank order, even when its file
 * could not be opened: a sender blocked on a large message would hang. */
static hs_status merge_receive(hs_pg *world, const int64_t *sizes, merge_out *o, hs_error *e) {
    int n = hs_pg_size(world);
    int64_t biggest = 0;
    for (int r = 1; r < n; r++) biggest = sizes[r] > biggest ? sizes[r] : biggest;
    size_t bytes = (size_t)words_of(biggest) * 4 + 4;
    char *buf = malloc(bytes);
    if (!buf) return hs_error_oom(e, "receiving the other ranks' traces: %zu bytes", bytes);
    hs_status s = HS_OK;
    for (int r = 1; r < n && s == HS_OK; r++) {
        if (sizes[r] == 0) continue;
        s = hs_pg_recv(world, NULL, buf, words_of(sizes[r]), HS_DTYPE_F32, r, TRACE_TAG, e);
        if (s == HS_OK) merge_append(o, buf, (size_t)sizes[r]);
    }
    free(buf);
    return s;
}

static hs_status merge_send(hs_pg *world, char *body, int64_t len, hs_error *e) {
    if (len == 0) {
        free(body);
        return HS_OK;
    }
    /* The last word may run past the body: copy into a padded buffer. */
    char *padded = realloc(body, (size_t)words_of(len) * 4);
    if (!padded) {
        free(body);
        return hs_error_oom(e, "sending this rank's trace: %zu bytes", (size_t)words_of(len) * 4);
    }
    hs_status s = hs_pg_send(world, NULL, padded, words_of(len), HS_DTYPE_F32, 0, TRACE_TAG, e);
    free(padded);
    return s;
}

/* All ranks return rank 0's file status, so no rank reports success for a
 * trace that was not written. */
static hs_status merge_agree(hs_pg *world, merge_out *o, hs_error *e) {
    int32_t code[2] = {o->err.code, 0};
    hs_status s = hs_pg_broadcast(world, NULL, code, 2, HS_DTYPE_F32, 0, e);
    if (s != HS_OK) return s;
    if (hs_pg_rank(world) == 0 && o->err.code != HS_OK) {
        *e = o->err;
        return e->code;
    }
    if (code[0] != HS_OK)
        return hs_error_set(e, (hs_status)code[0],
                            "world rank 0 could not write the merged "
                            "trace (see its message)");
    return HS_OK;
}

hs_status hs_comm_write_merged_trace(hs_comm *c, const char *path, hs_error *e) {
    hs_pg *world = hs_comm_world(c);
    int rank = hs_pg_rank(world), n = hs_pg_size(world);
    double offset = 0.0;
    hs_status s = merge_clock_offset(world, &offset, e);
    if (s != HS_OK) return s;
    char *body = NULL;
    size_t len = 0;
    s = hs_trace_serialize(hs_comm_trace(c), offset, &body, &len, e);
    if (s != HS_OK) return s;
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (!sizes) {
        free(body);
        return hs_error_oom(e, "gathering the trace sizes of %d ranks: %zu bytes", n,
                            (size_t)n * sizeof *sizes);
    }
    int64_t mine = (int64_t)len;
    s = hs_pg_all_gather(world, NULL, sizes, &mine, 2, HS_DTYPE_F32, e);
    merge_out o = {0};
    hs_error_clear(&o.err);
    if (s == HS_OK && rank == 0) {
        merge_open(&o, path);
        merge_append(&o, body, len);
        free(body);
        s = merge_receive(world, sizes, &o, e);
        merge_close(&o, path, s == HS_OK);
    } else if (s == HS_OK) {
        s = merge_send(world, body, mine, e);
    } else {
        free(body);
    }
    free(sizes);
    if (s != HS_OK) return s;
    return merge_agree(world, &o, e);
}
