/* The caching allocator: size classes, reuse of freed blocks, the in-use
 * and peak accounting that hs_pool_peak means, trimming, and the retry
 * after a failed raw allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/device.h"

/* A raw allocator that counts, and refuses once `budget` blocks are out. */
typedef struct raw_counter {
    int64_t allocs, frees, out, budget;
} raw_counter;

static void *raw_alloc(void *ctx, size_t bytes) {
    raw_counter *r = ctx;
    if (r->budget && r->out >= r->budget) return NULL;
    r->allocs++, r->out++;
    return malloc(bytes);
}

static void raw_free(void *ctx, void *p) {
    raw_counter *r = ctx;
    r->frees++, r->out--;
    free(p);
}

static void test_size_classes_round_up_by_under_a_fifth_and_are_stable(void **state) {
    (void)state;
    assert_int_equal(hs_mem_cache_class(0), 512);
    assert_int_equal(hs_mem_cache_class(512), 512);
    assert_int_equal(hs_mem_cache_class(513), 640);
    assert_int_equal(hs_mem_cache_class(896), 896);
    assert_int_equal(hs_mem_cache_class(897), 1024);
    assert_int_equal(hs_mem_cache_class(1025), 1280);
    assert_int_equal(hs_mem_cache_class((size_t)3 << 30), (size_t)3 << 30);
    size_t prev = 0;
    for (size_t b = 1; b <= (1u << 20); b += 1 + b / 97) {
        size_t c = hs_mem_cache_class(b);
        assert_true(c >= b && c >= prev);
        if (b > 512) assert_true(5 * (c - b) < c);
        assert_int_equal(hs_mem_cache_class(c), c);
        prev = c;
    }
}

static void test_a_freed_block_serves_the_next_request_of_its_class(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    void *a = hs_mem_cache_alloc(c, 1000);
    hs_mem_cache_free(c, a);
    void *b = hs_mem_cache_alloc(c, 900); /* 1000 and 900 are both in class 1024 */
    assert_ptr_equal(a, b);
    void *other = hs_mem_cache_alloc(c, 2000); /* another class: a new block */
    assert_ptr_not_equal(other, b);
    hs_mem_cache_stats st = hs_mem_cache_stats_get(c);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 2);
    assert_int_equal(r.allocs, 2);
    assert_int_equal(st.in_use, 2900);
    assert_int_equal(st.reserved, 1024 + 2048);
    hs_mem_cache_free(c, b), hs_mem_cache_free(c, other), hs_mem_cache_free(c, NULL);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.frees, 2);
}

/* The same allocations and frees through an hs_pool and the cache: in use
 * and peak agree at every step, also after a peak reset. */
static void test_in_use_and_peak_follow_hs_pool_for_the_same_sequence(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    hs_pool pool;
    hs_pool_init(&pool, "mirror");
    enum { SLOTS = 37 };
    void *cp[SLOTS] = {0}, *pp[SLOTS] = {0};
    uint64_t x = 12345;
    for (int step = 0; step < 4000; step++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((x >> 33) % SLOTS);
        if (cp[i]) {
            hs_mem_cache_free(c, cp[i]), hs_pool_free(&pool, pp[i]);
            cp[i] = pp[i] = NULL;
        } else {
            size_t bytes = (size_t)((x >> 40) % 70000);
            cp[i] = hs_mem_cache_alloc(c, bytes), pp[i] = hs_pool_alloc(&pool, bytes);
            memset(cp[i], 0xab, bytes); /* the block holds what was asked */
        }
        if (step == 2000) hs_mem_cache_reset_peak(c), hs_pool_reset_peak(&pool);
        hs_mem_cache_stats st = hs_mem_cache_stats_get(c);
        assert_int_equal(st.in_use, hs_pool_current(&pool));
        assert_int_equal(st.peak, hs_pool_peak(&pool));
        assert_true(st.reserved >= st.in_use && st.reserved_peak >= st.reserved);
    }
    for (int i = 0; i < SLOTS; i++) hs_mem_cache_free(c, cp[i]), hs_pool_free(&pool, pp[i]);
    assert_int_equal(hs_mem_cache_stats_get(c).in_use, 0);
    assert_true(hs_mem_cache_stats_get(c).hits > 0);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.out, 0);
}

static void test_trim_hands_cached_blocks_back_and_reserved_drops(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    void *a = hs_mem_cache_alloc(c, 100), *b = hs_mem_cache_alloc(c, 5000);
    hs_mem_cache_free(c, a);
    hs_mem_cache_trim(c);
    assert_int_equal(r.frees, 1);
    assert_int_equal(hs_mem_cache_stats_get(c).reserved, 5120);
    assert_int_equal(hs_mem_cache_stats_get(c).reserved_peak, 512 + 5120);
    hs_mem_cache_free(c, b);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.out, 0);
}

static void test_a_refused_raw_allocation_trims_the_cache_and_retries(void **state) {
    (void)state;
    raw_counter r = {.budget = 1};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    hs_mem_cache_free(c, hs_mem_cache_alloc(c, 1000)); /* one block cached in class 1024 */
    void *b = hs_mem_cache_alloc(c, 3000);             /* refused at first: the budget is used */
    assert_non_null(b);
    assert_int_equal(r.frees, 1);
    assert_int_equal(hs_mem_cache_stats_get(c).reserved, 3072);
    hs_mem_cache_free(c, b);
    hs_mem_cache_free_all(c);
}

/* Enough live blocks to grow the address table several times, freed in
 * another order than allocated, each found again. */
static void test_thousands_of_live_blocks_are_each_found_when_freed(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    enum { N = 3000 };
    void **p = malloc(N * sizeof *p);
    for (int i = 0; i < N; i++) p[i] = hs_mem_cache_alloc(c, (size_t)(i % 7) * 300);
    for (int i = 0; i < N; i++) hs_mem_cache_free(c, p[(i * 1237) % N]); /* 1237 prime to N */
    assert_int_equal(hs_mem_cache_stats_get(c).in_use, 0);
    for (int i = 0; i < N; i++) p[i] = hs_mem_cache_alloc(c, (size_t)(i % 7) * 300);
    assert_int_equal(r.allocs, N); /* the second round came from the free lists */
    for (int i = N - 1; i >= 0; i--) hs_mem_cache_free(c, p[i]);
    free(p);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.out, 0);
}

/* Events that complete when the test says so: each mark is a flag. */
typedef struct fake_events {
    int marks, waits, releases, live;
    const void *last_stream;
    int *flags[16];
} fake_events;

static void *ev_mark(void *ctx, const void *stream) {
    fake_events *f = ctx;
    int *flag = calloc(1, sizeof *flag);
    f->flags[f->marks++] = flag;
    f->last_stream = stream;
    f->live++;
    return flag;
}
static bool ev_done(void *ctx, void *ev) { return *(int *)ev != 0; }
static void ev_wait(void *ctx, void *ev) {
    ((fake_events *)ctx)->waits++;
    *(int *)ev = 1;
}
static void ev_release(void *ctx, void *ev) {
    fake_events *f = ctx;
    f->releases++, f->live--;
    for (int i = 0; i < f->marks; i++)
        if (f->flags[i] == ev) f->flags[i] = NULL;
    free(ev);
}
static const hs_mem_cache_events fake_ops = {ev_mark, ev_done, ev_wait, ev_release};

static const char stream_a, stream_b; /* two streams' keys */

/* A block freed on one stream serves that stream's next request, never
 * another stream's: the other stream's work is not ordered after it. */
static void test_a_freed_block_serves_only_its_own_stream(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    void *a = hs_mem_cache_alloc_on(c, 1000, &stream_a);
    hs_mem_cache_free(c, a);
    void *d = hs_mem_cache_alloc(c, 1000); /* the default stream: a block of its own */
    void *b = hs_mem_cache_alloc_on(c, 1000, &stream_b);
    assert_ptr_not_equal(d, a);
    assert_ptr_not_equal(b, a);
    assert_ptr_equal(hs_mem_cache_alloc_on(c, 900, &stream_a), a); /* its own stream again */
    assert_int_equal(r.allocs, 3);
    hs_mem_cache_free(c, a), hs_mem_cache_free(c, b), hs_mem_cache_free(c, d);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.out, 0);
}

/* A block recorded on another stream waits, parked, for an event on that
 * stream; until it completes its own stream gets another block, after it
 * the block itself. */
static void test_a_recorded_block_returns_once_the_other_streams_event_completes(void **state) {
    (void)state;
    raw_counter r = {0};
    fake_events f = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    hs_mem_cache_set_events(c, &fake_ops, &f);
    void *a = hs_mem_cache_alloc_on(c, 4096, &stream_a);
    hs_mem_cache_record(c, a, &stream_b);
    hs_mem_cache_record(c, a, &stream_a); /* its own stream: nothing to wait for */
    hs_mem_cache_free(c, a);
    assert_int_equal(f.marks, 1);
    assert_ptr_equal(f.last_stream, &stream_b);
    assert_int_equal(hs_mem_cache_stats_get(c).in_use, 0);
    void *x = hs_mem_cache_alloc_on(c, 4096, &stream_a); /* stream b may still read a */
    assert_ptr_not_equal(x, a);
    *f.flags[0] = 1; /* b's work up to the free has completed */
    void *y = hs_mem_cache_alloc_on(c, 4096, &stream_a);
    assert_ptr_equal(y, a);
    assert_int_equal(f.releases, 1);
    assert_int_equal(f.waits, 0);
    /* used on the default stream and b: two events, a block of b's own */
    void *z = hs_mem_cache_alloc_on(c, 100, &stream_b);
    hs_mem_cache_record(c, z, NULL);
    hs_mem_cache_record(c, z, &stream_a);
    hs_mem_cache_free(c, z);
    assert_int_equal(f.marks, 3);
    *f.flags[1] = 1; /* one of two: still parked */
    void *w = hs_mem_cache_alloc_on(c, 100, &stream_b);
    assert_ptr_not_equal(w, z);
    hs_mem_cache_free(c, x), hs_mem_cache_free(c, y), hs_mem_cache_free(c, w);
    /* a trim waits for what is parked and hands it back with the rest */
    hs_mem_cache_trim(c);
    assert_int_equal(f.waits, 1);
    assert_int_equal(f.live, 0);
    assert_int_equal(hs_mem_cache_stats_get(c).reserved, 0);
    assert_int_equal(r.out, 0);
    hs_mem_cache_free_all(c);
}

/* Without events (the RAM backends) a recorded block goes straight back;
 * a stream that goes away leaves its blocks to the default stream. */
static void test_a_gone_streams_blocks_serve_the_default_stream(void **state) {
    (void)state;
    raw_counter r = {0};
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("test", raw_alloc, raw_free, &r, &c, NULL), HS_OK);
    void *a = hs_mem_cache_alloc_on(c, 2000, &stream_a);
    void *live = hs_mem_cache_alloc_on(c, 3000, &stream_a);
    hs_mem_cache_record(c, a, &stream_b);
    hs_mem_cache_free(c, a);
    assert_ptr_equal(hs_mem_cache_alloc_on(c, 2000, &stream_a), a);
    hs_mem_cache_free(c, a);
    hs_mem_cache_stream_gone(c, &stream_a);
    assert_ptr_equal(hs_mem_cache_alloc(c, 2000), a);
    hs_mem_cache_free(c, live); /* owned by the default stream now */
    assert_ptr_equal(hs_mem_cache_alloc(c, 3000), live);
    /* the slot serves a new stream, with empty lists */
    void *n = hs_mem_cache_alloc_on(c, 2000, &stream_b);
    assert_ptr_not_equal(n, a);
    hs_mem_cache_free(c, a), hs_mem_cache_free(c, live), hs_mem_cache_free(c, n);
    hs_mem_cache_free_all(c);
    assert_int_equal(r.out, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes_round_up_by_under_a_fifth_and_are_stable),
        cmocka_unit_test(test_a_freed_block_serves_the_next_request_of_its_class),
        cmocka_unit_test(test_in_use_and_peak_follow_hs_pool_for_the_same_sequence),
        cmocka_unit_test(test_trim_hands_cached_blocks_back_and_reserved_drops),
        cmocka_unit_test(test_a_refused_raw_allocation_trims_the_cache_and_retries),
        cmocka_unit_test(test_thousands_of_live_blocks_are_each_found_when_freed),
        cmocka_unit_test(test_a_freed_block_serves_only_its_own_stream),
        cmocka_unit_test(test_a_recorded_block_returns_once_the_other_streams_event_completes),
        cmocka_unit_test(test_a_gone_streams_blocks_serve_the_default_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
