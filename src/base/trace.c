/* The per-rank trace: spans and counter samples for a Chrome trace file, and
 * the always-on collective counters that tests use to count communication.
 *
 * One mutex guards everything: the compute thread and the communication
 * thread both record, and a span costs one short critical section. Strings
 * are copied because callers pass names built on their stack. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/base.h"

/* A long run with tracing on would otherwise grow without bound; past this
 * many events new ones are dropped and the drop is reported in the file.
 * An event that cannot be recorded for want of memory is dropped too, and
 * the trace then refuses to be written (hs_trace_serialize) rather than
 * pass for complete. */
#define TRACE_MAX_EVENTS (1 << 22)

typedef struct trace_event {
    char ph;        /* 'X' span, 'C' counter sample */
    int lane;       /* tid */
    double ts, dur; /* hs_now() seconds */
    int64_t value;  /* counters */
    char *name;     /* one allocation holds name, cat and args */
    char *cat;
    char *args; /* NULL when none */
} trace_event;

typedef struct trace_counter {
    char *op;
    char *group;
    int64_t count;
    int64_t bytes;
} trace_counter;

struct hs_trace {
    int rank;
    bool enabled;
    pthread_mutex_t mu;
    trace_event *events;
    size_t n_events, cap_events;
    int64_t dropped;
    int64_t lost;        /* events not recorded for want of memory */
    char lost_what[160]; /* the first of them, and its bytes */
    trace_counter *counters;
    size_t n_counters, cap_counters;
};

static const char *const lane_names[] = {
    [HS_LANE_COMPUTE] = "compute",
    [HS_LANE_COMM] = "comm",
    [HS_LANE_COPY] = "copy",
};
_Static_assert(sizeof(lane_names) / sizeof(lane_names[0]) == HS_LANE_COUNT,
               "lane_names must follow hs_trace_lane");

/* The lock is not part of the trace's logical state, so readers taking it
 * through a const pointer is fine. */
static void trace_lock(const hs_trace *t) {
    HS_CHECK_PTHREAD(pthread_mutex_lock((pthread_mutex_t *)&t->mu));
}
static void trace_unlock(const hs_trace *t) {
    HS_CHECK_PTHREAD(pthread_mutex_unlock((pthread_mutex_t *)&t->mu));
}

/* Room for one more entry in *p: false (and *p as it was) when the array
 * could not grow; *bytes is then what was asked for. */
static bool grow(void **p, size_t n, size_t *cap, size_t elem, size_t *bytes) {
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 256;
    *bytes = c * elem;
    void *q = realloc(*p, *bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Under the lock: an event that could not be recorded. */
static void lose(hs_trace *t, const char *name, size_t bytes) {
    if (t->lost++ == 0)
        snprintf(t->lost_what, sizeof t->lost_what, "event '%.80s' (%zu bytes)", name ? name : "",
                 bytes);
}

hs_trace *hs_trace_create(int rank, bool enabled, hs_error *e) {
    hs_trace *t = calloc(1, sizeof *t);
    if (!t) {
        hs_error_oom(e, "the trace of rank %d: %zu bytes", rank, sizeof *t);
        return NULL;
    }
    t->rank = rank;
    t->enabled = enabled;
    HS_CHECK_PTHREAD(pthread_mutex_init(&t->mu, NULL));
    return t;
}

void hs_trace_free(hs_trace *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_events; i++) free(t->events[i].name);
    for (size_t i = 0; i < t->n_counters; i++) {
        free(t->counters[i].op);
        free(t->counters[i].group);
    }
    free(t->events);
    free(t->counters);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

bool hs_trace_enabled(const hs_trace *t) { return t && t->enabled; }

/* Copies the strings outside the lock, then appends under it. */
static void trace_append(hs_trace *t, trace_event ev, const char *name, const char *cat,
                         const char *args) {
    size_t ln = strlen(name ? name : "") + 1, lc = strlen(cat ? cat : "") + 1;
    size_t la = args ? strlen(args) + 1 : 0;
    char *buf = malloc(ln + lc + la);
    if (!buf) {
        trace_lock(t);
        lose(t, name, ln + lc + la);
        trace_unlock(t);
        return;
    }
    memcpy(buf, name ? name : "", ln);
    memcpy(buf + ln, cat ? cat : "", lc);
    if (args) memcpy(buf + ln + lc, args, la);
    ev.name = buf;
    ev.cat = buf + ln;
    ev.args = args ? buf + ln + lc : NULL;
    trace_lock(t);
    if (t->n_events >= TRACE_MAX_EVENTS) {
        t->dropped++;
        trace_unlock(t);
        free(buf);
        return;
    }
    size_t bytes = 0;
    if (!grow((void **)&t->events, t->n_events, &t->cap_events, sizeof *t->events, &bytes)) {
        lose(t, name, bytes);
        trace_unlock(t);
        free(buf);
        return;
    }
    t->events[t->n_events++] = ev;
    trace_unlock(t);
}

void hs_trace_span(hs_trace *t, hs_trace_lane lane, const char *name, const char *cat, double t0,
                   double t1, const char *args_json) {
    if (!hs_trace_enabled(t)) return;
    HS_ASSERT(lane >= 0 && lane < HS_LANE_COUNT);
    trace_event ev = {.ph = 'X', .lane = (int)lane, .ts = t0, .dur = t1 > t0 ? t1 - t0 : 0.0};
    trace_append(t, ev, name, cat, args_json);
}

void hs_trace_counter(hs_trace *t, const char *name, double ts, int64_t value) {
    if (!hs_trace_enabled(t)) return;
    trace_event ev = {.ph = 'C', .lane = HS_LANE_COMPUTE, .ts = ts, .value = value};
    trace_append(t, ev, name, "memory", NULL);
}

void hs_trace_memory(hs_trace *t, const hs_pool *device, const hs_pool *host) {
    if (!hs_trace_enabled(t)) return;
    double now = hs_now();
    if (device) hs_trace_counter(t, "device_bytes", now, hs_pool_current(device));
    if (host) hs_trace_counter(t, "host_bytes", now, hs_pool_current(host));
}

/* ------------------------------------------------------ collective counters */

static bool counter_matches(const trace_counter *c, const char *op, const char *group) {
    return (!op || !strcmp(c->op, op)) && (!group || !strcmp(c->group, group));
}

/* Under the lock: a new counter for (op, group), or false. */
static bool counter_add(hs_trace *t, const char *op, const char *group, int64_t bytes,
                        size_t *asked) {
    if (!grow((void **)&t->counters, t->n_counters, &t->cap_counters, sizeof *t->counters, asked))
        return false;
    char *o = strdup(op), *g = strdup(group);
    if (!o || !g) {
        free(o);
        free(g);
        *asked = strlen(op) + strlen(group) + 2;
        return false;
    }
    t->counters[t->n_counters++] = (trace_counter){.op = o, .group = g, .count = 1, .bytes = bytes};
    return true;
}

hs_status hs_trace_count(hs_trace *t, const char *op, const char *group, int64_t bytes,
                         hs_error *e) {
    if (!t) return HS_OK;
    if (!op) op = "";
    if (!group) group = "";
    trace_lock(t);
    for (size_t i = 0; i < t->n_counters; i++) {
        trace_counter *c = &t->counters[i];
        if (!strcmp(c->op, op) && !strcmp(c->group, group)) {
            c->count++;
            c->bytes += bytes;
            trace_unlock(t);
            return HS_OK;
        }
    }
    size_t asked = 0;
    bool added = counter_add(t, op, group, bytes, &asked);
    trace_unlock(t);
    if (added) return HS_OK;
    return hs_error_oom(e, "the collective counters of rank %d: %zu bytes for (%s, %s)", t->rank,
                        asked, op, group);
}

static int64_t counter_sum(const hs_trace *t, const char *op, const char *group, bool bytes) {
    if (!t) return 0;
    int64_t sum = 0;
    trace_lock(t);
    for (size_t i = 0; i < t->n_counters; i++)
        if (counter_matches(&t->counters[i], op, group))
            sum += bytes ? t->counters[i].bytes : t->counters[i].count;
    trace_unlock(t);
    return sum;
}

int64_t hs_trace_collectives(const hs_trace *t, const char *op, const char *group) {
    return counter_sum(t, op, group, false);
}

int64_t hs_trace_collective_bytes(const hs_trace *t, const char *op, const char *group) {
    return counter_sum(t, op, group, true);
}

void hs_trace_reset_counters(hs_trace *t) {
    if (!t) return;
    trace_lock(t);
    for (size_t i = 0; i < t->n_counters; i++) t->counters[i].count = t->counters[i].bytes = 0;
    trace_unlock(t);
}

/* ------------------------------------------------------------- serialising */

/* A fresh writer at depth 0 writes exactly one escaped string. */
static void put_string(FILE *f, const char *s) {
    hs_json j;
    hs_json_init(&j, f);
    hs_json_string(&j, s);
}

static void put_metadata(FILE *f, int pid, int tid, const char *what, const char *key,
                         const char *value) {
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", what, pid,
            tid, key);
    put_string(f, value);
    fputs("}}", f);
}

static void put_header(const hs_trace *t, FILE *f) {
    char label[64];
    snprintf(label, sizeof label, "rank %d", t->rank);
    put_metadata(f, t->rank, 0, "process_name", "name", label);
    fprintf(f,
            ",{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
            t->rank, t->rank);
    for (int lane = 0; lane < HS_LANE_COUNT; lane++) {
        fputc(',', f);
        put_metadata(f, t->rank, lane, "thread_name", "name", lane_names[lane]);
        fprintf(f,
                ",{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                t->rank, lane, lane);
    }
    if (t->dropped > 0) {
        char note[96];
        snprintf(note, sizeof note, "%lld events dropped past the %d-event limit",
                 (long long)t->dropped, TRACE_MAX_EVENTS);
        fputc(',', f);
        put_metadata(f, t->rank, 0, "process_labels", "labels", note);
    }
}

static void put_event(const hs_trace *t, const trace_event *ev, double offset, FILE *f) {
    fputs(",{\"name\":", f);
    put_string(f, ev->name);
    fprintf(f, ",\"ph\":\"%c\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d", ev->ph, (ev->ts + offset) * 1e6,
            t->rank, ev->lane);
    if (ev->ph == 'X') {
        fputs(",\"cat\":", f);
        put_string(f, ev->cat);
        fprintf(f, ",\"dur\":%.3f,\"args\":{%s}}", ev->dur * 1e6, ev->args ? ev->args : "");
    } else {
        fprintf(f, ",\"args\":{\"value\":%lld}}", (long long)ev->value);
    }
}

hs_status hs_trace_serialize(const hs_trace *t, double clock_offset_s, char **out, size_t *len,
                             hs_error *e) {
    *out = NULL;
    *len = 0;
    trace_lock(t);
    int64_t lost = t->lost;
    char what[sizeof t->lost_what];
    memcpy(what, t->lost_what, sizeof what);
    trace_unlock(t);
    if (lost > 0)
        return hs_error_oom(e,
                            "the trace of rank %d lost %lld events, the first %s, for want of "
                            "memory; it is not written incomplete",
                            t->rank, (long long)lost, what);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return hs_error_oom(e, "cannot serialise the trace of rank %d: %s", t->rank,
                            hs_strerror_errno());
    trace_lock(t);
    put_header(t, f);
    for (size_t i = 0; i < t->n_events; i++) put_event(t, &t->events[i], clock_offset_s, f);
    trace_unlock(t);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return hs_error_oom(e, "cannot serialise the trace of rank %d: out of memory", t->rank);
    }
    *out = buf;
    *len = n;
    return HS_OK;
}

hs_status hs_trace_write(const hs_trace *t, const char *path, hs_error *e) {
    char *body;
    size_t len;
    hs_status s = hs_trace_serialize(t, 0.0, &body, &len, e);
    if (s != HS_OK) return s;
    /* Written beside the target and renamed, so a failure never leaves a
     * truncated trace where a good one is expected. */
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    if (!tmp) {
        free(body);
        return hs_error_oom(e, "writing trace %s: %zu bytes for its name", path, plen);
    }
    snprintf(tmp, plen, "%s.tmp", path);
    FILE *f = hs_fopen(tmp, "wb", "check that the trace directory exists and is writable", e);
    if (!f) {
        free(tmp);
        free(body);
        return HS_ERR_IO;
    }
    fputs("{\"traceEvents\":[", f);
    fwrite(body, 1, len, f);
    fputs("],\"displayTimeUnit\":\"ms\"}\n", f);
    free(body);
    bool bad = ferror(f) != 0;
    bad = (fclose(f) != 0) || bad;
    if (bad || rename(tmp, path) != 0) {
        s = hs_error_set(e, HS_ERR_IO,
                         "cannot write trace %s: %s; check free disk space and "
                         "permissions",
                         path, hs_strerror_errno());
        remove(tmp);
    }
    free(tmp);
    return s;
}
