/* The per-rank trace (base.h): collective counters, span recording from
 * several threads, and the Chrome trace JSON it writes, parsed back by a
 * strict JSON reader below. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "hypershard/base.h"

/* ------------------------------------------------- a strict JSON reader
 * Enough of RFC 8259 to reject anything a trace viewer would reject:
 * objects, arrays, strings with escapes, numbers, literals. Counts objects
 * whose "ph" is each phase letter so tests can check the event mix. */

typedef struct jr {
    const char *p;
    int objects;
    int phase_count[128];
} jr;

static bool jr_value(jr *r);

static void jr_ws(jr *r) {
    while (*r->p == ' ' || *r->p == '\n' || *r->p == '\t' || *r->p == '\r') r->p++;
}

static bool jr_string(jr *r, char *copy, size_t cap) {
    if (*r->p != '"') return false;
    size_t n = 0;
    for (r->p++; *r->p != '"'; r->p++) {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20) return false;
        if (c == '\\') {
            r->p++;
            if (*r->p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", r->p[i]) || !r->p[i]) return false;
                r->p += 4;
            } else if (!*r->p || !strchr("\"\\/bfnrt", *r->p)) {
                return false;
            }
        }
        if (copy && n + 1 < cap) copy[n++] = *r->p;
    }
    if (copy) copy[n] = '\0';
    r->p++;
    return true;
}

static bool jr_number(jr *r) {
    const char *s = r->p;
    if (*r->p == '-') r->p++;
    if (*r->p == '0') r->p++;
    else if (*r->p >= '1' && *r->p <= '9')
        while (*r->p >= '0' && *r->p <= '9') r->p++;
    else return false;
    if (*r->p == '.') {
        r->p++;
        if (!(*r->p >= '0' && *r->p <= '9')) return false;
        while (*r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (*r->p == 'e' || *r->p == 'E') {
        r->p++;
        if (*r->p == '+' || *r->p == '-') r->p++;
        if (!(*r->p >= '0' && *r->p <= '9')) return false;
        while (*r->p >= '0' && *r->p <= '9') r->p++;
    }
    return r->p > s;
}

static bool jr_object(jr *r) {
    r->p++;
    r->objects++;
    jr_ws(r);
    if (*r->p == '}') return r->p++, true;
    for (;;) {
        char key[64];
        jr_ws(r);
        if (!jr_string(r, key, sizeof key)) return false;
        jr_ws(r);
        if (*r->p++ != ':') return false;
        jr_ws(r);
        if (!strcmp(key, "ph") && *r->p == '"' && r->p[2] == '"')
            r->phase_count[(unsigned char)r->p[1] & 127]++;
        if (!jr_value(r)) return false;
        jr_ws(r);
        if (*r->p == '}') return r->p++, true;
        if (*r->p++ != ',') return false;
    }
}

static bool jr_array(jr *r) {
    r->p++;
    jr_ws(r);
    if (*r->p == ']') return r->p++, true;
    for (;;) {
        jr_ws(r);
        if (!jr_value(r)) return false;
        jr_ws(r);
        if (*r->p == ']') return r->p++, true;
        if (*r->p++ != ',') return false;
    }
}

static bool jr_value(jr *r) {
    jr_ws(r);
    switch (*r->p) {
    case '{': return jr_object(r);
    case '[': return jr_array(r);
    case '"': return jr_string(r, NULL, 0);
    case 't': return !strncmp(r->p, "true", 4) && (r->p += 4);
    case 'f': return !strncmp(r->p, "false", 5) && (r->p += 5);
    case 'n': return !strncmp(r->p, "null", 4) && (r->p += 4);
    default: return jr_number(r);
    }
}

/* Whole document valid, nothing after it. */
static bool json_valid(const char *s, jr *r) {
    memset(r, 0, sizeof *r);
    r->p = s;
    if (!jr_value(r)) return false;
    jr_ws(r);
    return *r->p == '\0';
}

static void test_json_reader_rejects_broken_documents(void **state) {
    (void)state;
    jr r;
    assert_true(json_valid("{\"a\":[1,2.5e3,-0.5,\"x\\\"y\",true,null,{}]}", &r));
    assert_false(json_valid("{\"a\":[1,]}", &r));
    assert_false(json_valid("{\"a\":1,}", &r));
    assert_false(json_valid("[1 2]", &r));
    assert_false(json_valid("{\"a\":\"tab\there\"}", &r));
    assert_false(json_valid("{\"a\":01}", &r));
    assert_false(json_valid("{\"a\":1}}", &r));
}

/* ---------------------------------------------------------------- helpers */

static char *serialize(const hs_trace *t, double offset) {
    char *body = NULL;
    size_t len = 0;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_trace_serialize(t, offset, &body, &len, &e), HS_OK);
    assert_int_equal(strlen(body), len);
    return body;
}

/* The array body wrapped as a document, as hs_trace_write does. */
static char *as_document(const char *body) {
    size_t n = strlen(body) + 64;
    char *doc = malloc(n);
    snprintf(doc, n, "{\"traceEvents\":[%s],\"displayTimeUnit\":\"ms\"}", body);
    return doc;
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* --------------------------------------------------------------- counters */

static void test_counters_are_keyed_by_op_and_group(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, false, NULL);
    hs_trace_count(t, "all_gather", "fsdp_shard", 100, NULL);
    hs_trace_count(t, "all_gather", "fsdp_shard", 50, NULL);
    hs_trace_count(t, "reduce_scatter", "fsdp_shard", 400, NULL);
    hs_trace_count(t, "all_reduce", "fsdp_replicate", 8, NULL);
    assert_int_equal(hs_trace_collectives(t, "all_gather", "fsdp_shard"), 2);
    assert_int_equal(hs_trace_collective_bytes(t, "all_gather", "fsdp_shard"), 150);
    assert_int_equal(hs_trace_collectives(t, NULL, "fsdp_shard"), 3);
    assert_int_equal(hs_trace_collective_bytes(t, NULL, "fsdp_shard"), 550);
    assert_int_equal(hs_trace_collectives(t, "all_reduce", NULL), 1);
    assert_int_equal(hs_trace_collectives(t, NULL, NULL), 4);
    assert_int_equal(hs_trace_collective_bytes(t, NULL, NULL), 558);
    assert_int_equal(hs_trace_collectives(t, "all_gather", "tp"), 0);
    assert_int_equal(hs_trace_collectives(t, "broadcast", NULL), 0);
    hs_trace_free(t);
}

static void test_reset_zeroes_counts_and_bytes(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_trace_count(t, "all_reduce", "dp", 64, NULL);
    hs_trace_reset_counters(t);
    assert_int_equal(hs_trace_collectives(t, NULL, NULL), 0);
    assert_int_equal(hs_trace_collective_bytes(t, NULL, NULL), 0);
    hs_trace_count(t, "all_reduce", "dp", 32, NULL);
    assert_int_equal(hs_trace_collectives(t, "all_reduce", "dp"), 1);
    assert_int_equal(hs_trace_collective_bytes(t, "all_reduce", "dp"), 32);
    hs_trace_free(t);
}

static void test_disabled_trace_counts_but_records_no_spans(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(3, false, NULL);
    assert_false(hs_trace_enabled(t));
    hs_trace_span(t, HS_LANE_COMPUTE, "forward", "compute", 1.0, 2.0, NULL);
    hs_trace_counter(t, "device_bytes", 1.0, 5);
    hs_trace_count(t, "barrier", "world", 0, NULL);
    char *body = serialize(t, 0.0);
    assert_int_equal(count_of(body, "\"ph\":\"X\""), 0);
    assert_int_equal(count_of(body, "\"ph\":\"C\""), 0);
    assert_int_equal(hs_trace_collectives(t, "barrier", "world"), 1);
    free(body);
    hs_trace_free(t);
}

/* ---------------------------------------------------------- serialisation */

static void test_span_microseconds_shifted_by_the_offset(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(2, true, NULL);
    hs_trace_span(t, HS_LANE_COMM, "all_gather", "comm", 1.5, 1.75,
                  "\"group\":\"fsdp_shard\",\"bytes\":4096");
    char *body = serialize(t, 2.0);
    assert_non_null(strstr(body, "{\"name\":\"all_gather\",\"ph\":\"X\",\"ts\":3500000.000,"
                                 "\"pid\":2,\"tid\":1,\"cat\":\"comm\",\"dur\":250000.000,"
                                 "\"args\":{\"group\":\"fsdp_shard\",\"bytes\":4096}}"));
    free(body);
    hs_trace_free(t);
}

static void test_metadata_names_rank_and_three_lanes(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(5, true, NULL);
    char *body = serialize(t, 0.0);
    assert_non_null(strstr(body, "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":5,\"tid\":0,"
                                 "\"args\":{\"name\":\"rank 5\"}"));
    assert_non_null(strstr(body, "\"tid\":0,\"args\":{\"name\":\"compute\"}"));
    assert_non_null(strstr(body, "\"tid\":1,\"args\":{\"name\":\"comm\"}"));
    assert_non_null(strstr(body, "\"tid\":2,\"args\":{\"name\":\"copy\"}"));
    char *doc = as_document(body);
    jr r;
    assert_true(json_valid(doc, &r));
    assert_int_equal(r.phase_count['M'], 8); /* process name + sort, 3 × (thread name + sort) */
    free(doc);
    free(body);
    hs_trace_free(t);
}

static void test_memory_counters_sample_both_pools(void **state) {
    (void)state;
    hs_pool dev, host;
    hs_pool_init(&dev, "device");
    hs_pool_init(&host, "host");
    void *a = hs_pool_alloc(&dev, 1000);
    void *b = hs_pool_alloc(&host, 64);
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_trace_memory(t, &dev, &host);
    char *body = serialize(t, 0.0);
    char want[128];
    snprintf(want, sizeof want, "\"name\":\"device_bytes\",\"ph\":\"C\"");
    assert_non_null(strstr(body, want));
    snprintf(want, sizeof want, "\"args\":{\"value\":%lld}", (long long)hs_pool_current(&dev));
    assert_non_null(strstr(body, want));
    snprintf(want, sizeof want, "\"args\":{\"value\":%lld}", (long long)hs_pool_current(&host));
    assert_non_null(strstr(body, want));
    assert_true(hs_pool_current(&dev) >= 1000);
    assert_int_equal(count_of(body, "\"ph\":\"C\""), 2);
    free(body);
    hs_trace_free(t);
    hs_pool_free(&dev, a);
    hs_pool_free(&host, b);
}

static void test_names_with_quotes_and_newlines_stay_valid_json(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_trace_span(t, HS_LANE_COMPUTE, "odd \"name\"\n\\ here", "cat\t1", 0.0, 1e-6, NULL);
    hs_trace_counter(t, "q\"c", 0.5, -7);
    char *body = serialize(t, 0.0);
    char *doc = as_document(body);
    jr r;
    assert_true(json_valid(doc, &r));
    assert_int_equal(r.phase_count['X'], 1);
    assert_int_equal(r.phase_count['C'], 1);
    assert_non_null(strstr(body, "\"odd \\\"name\\\"\\n\\\\ here\""));
    free(doc);
    free(body);
    hs_trace_free(t);
}

static void test_caller_strings_are_copied(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, true, NULL);
    char name[32] = "block.3.forward";
    char args[64] = "\"unit\":3";
    hs_trace_span(t, HS_LANE_COMPUTE, name, "compute", 0.0, 1.0, args);
    memset(name, 'x', sizeof name - 1);
    memset(args, 'y', sizeof args - 1);
    char *body = serialize(t, 0.0);
    assert_non_null(strstr(body, "\"block.3.forward\""));
    assert_non_null(strstr(body, "\"args\":{\"unit\":3}"));
    free(body);
    hs_trace_free(t);
}

/* ------------------------------------------------------------- threads */

typedef struct worker {
    hs_trace *t;
    int id;
} worker;

static void *record_many(void *arg) {
    worker *w = arg;
    char name[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof name, "w%d.%d", w->id, i);
        hs_trace_span(w->t, (hs_trace_lane)(w->id % HS_LANE_COUNT), name, "compute", i * 1e-6,
                      (i + 1) * 1e-6, "\"i\":1");
        hs_trace_count(w->t, w->id % 2 ? "all_gather" : "reduce_scatter", "fsdp_shard", 10, NULL);
    }
    return NULL;
}

static void test_four_threads_record_every_span_and_count(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(1, true, NULL);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){t, i};
        assert_int_equal(pthread_create(&th[i], NULL, record_many, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    assert_int_equal(hs_trace_collectives(t, "all_gather", "fsdp_shard"), 4000);
    assert_int_equal(hs_trace_collectives(t, "reduce_scatter", "fsdp_shard"), 4000);
    assert_int_equal(hs_trace_collective_bytes(t, NULL, NULL), 80000);
    char *body = serialize(t, 0.0);
    char *doc = as_document(body);
    jr r;
    assert_true(json_valid(doc, &r));
    assert_int_equal(r.phase_count['X'], 8000);
    free(doc);
    free(body);
    hs_trace_free(t);
}

/* ------------------------------------------------------------------ files */

static void test_write_produces_a_valid_trace_file(void **state) {
    (void)state;
    char path[] = "/tmp/hs_trace_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_trace_span(t, HS_LANE_COMPUTE, "forward", "compute", 10.0, 10.5, NULL);
    hs_trace_span(t, HS_LANE_COPY, "h2d", "copy", 10.1, 10.2, "\"bytes\":8");
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_trace_write(t, path, &e), HS_OK);
    char *text = NULL;
    assert_int_equal(hs_read_file(path, &text, NULL, &e), HS_OK);
    assert_int_equal(strncmp(text, "{\"traceEvents\":[", 16), 0);
    assert_non_null(strstr(text, "],\"displayTimeUnit\":\"ms\"}"));
    jr r;
    assert_true(json_valid(text, &r));
    assert_int_equal(r.phase_count['X'], 2);
    free(text);
    hs_trace_free(t);
    remove(path);
}

static void test_write_to_missing_directory_names_the_path(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_error e;
    hs_error_clear(&e);
    const char *path = "/nonexistent-hs-dir/trace.json";
    assert_int_equal(hs_trace_write(t, path, &e), HS_ERR_IO);
    assert_non_null(strstr(e.msg, "/nonexistent-hs-dir/trace.json"));
    assert_int_equal(access(path, F_OK), -1);
    hs_trace_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_reader_rejects_broken_documents),
        cmocka_unit_test(test_counters_are_keyed_by_op_and_group),
        cmocka_unit_test(test_reset_zeroes_counts_and_bytes),
        cmocka_unit_test(test_disabled_trace_counts_but_records_no_spans),
        cmocka_unit_test(test_span_microseconds_shifted_by_the_offset),
        cmocka_unit_test(test_metadata_names_rank_and_three_lanes),
        cmocka_unit_test(test_memory_counters_sample_both_pools),
        cmocka_unit_test(test_names_with_quotes_and_newlines_stay_valid_json),
        cmocka_unit_test(test_caller_strings_are_copied),
        cmocka_unit_test(test_four_threads_record_every_span_and_count),
        cmocka_unit_test(test_write_produces_a_valid_trace_file),
        cmocka_unit_test(test_write_to_missing_directory_names_the_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
