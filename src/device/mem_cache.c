/* The caching allocator: blocks rounded up to a size class, kept on a free
 * list of their class when freed and handed out again for the next request
 * of that class, so that a GPU pool does not call cudaMalloc / cudaFree in
 * the step. Device memory cannot carry a header, so live blocks are found
 * by address in an open-addressing table. */
#include <pthread.h>
#include <stdlib.h>

#include "device/device_backend.h"

#define MIN_CLASS ((size_t)512)
#define MIN_SHIFT 7 /* 512 = 4 << 7 */
#define MAX_BYTES ((size_t)1 << 60)
#define N_CLASSES ((60 - 2 - MIN_SHIFT + 1) * 4) /* the last one holds MAX_BYTES */

typedef struct live_block {
    void *p; /* NULL: empty slot */
    size_t bytes;
    int cls;
} live_block;

typedef struct free_list {
    void **v;
    int64_t n, cap;
} free_list;

struct hs_mem_cache {
    const char *name;
    hs_raw_alloc_fn raw_alloc;
    hs_raw_free_fn raw_free;
    void *ctx;
    pthread_mutex_t mu;
    live_block *live;
    size_t live_cap, live_n; /* live_cap a power of two, live_n <= cap / 2 */
    free_list lists[N_CLASSES];
    hs_mem_cache_stats st;
};

/* Class c is (4 + c % 4) << (MIN_SHIFT + c / 4): 512, 640, 768, 896, 1024,
 * 1280, ... */
static size_t class_bytes(int c) { return (size_t)(4 + c % 4) << (MIN_SHIFT + c / 4); }

static int class_of(size_t bytes) {
    if (bytes <= MIN_CLASS) return 0;
    int top = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^top <= bytes-1 */
    int e = top - 2;
    size_t m = (bytes + ((size_t)1 << e) - 1) >> e; /* in [4, 8] */
    if (m == 8) m = 4, e++;
    return (e - MIN_SHIFT) * 4 + (int)(m - 4);
}

size_t hs_mem_cache_class(size_t bytes) {
    HS_ASSERT(bytes <= MAX_BYTES);
    return class_bytes(class_of(bytes));
}

hs_status hs_mem_cache_create(const char *name, hs_raw_alloc_fn raw_alloc, hs_raw_free_fn raw_free,
                              void *ctx, hs_mem_cache **out, hs_error *e) {
    hs_mem_cache *c = *out = calloc(1, sizeof *c);
    if (c == NULL)
        return hs_error_oom(e, "the %s caching allocator: %zu bytes of tables", name, sizeof *c);
    c->name = name, c->raw_alloc = raw_alloc, c->raw_free = raw_free, c->ctx = ctx;
    HS_CHECK_PTHREAD(pthread_mutex_init(&c->mu, NULL));
    return HS_OK;
}

static size_t slot_of(const hs_mem_cache *c, const void *p) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (c->live_cap - 1);
}

/* Puts b in a table with room for it (live_room made sure). */
static void live_put(hs_mem_cache *c, live_block b) {
    HS_ASSERT(2 * (c->live_n + 1) <= c->live_cap);
    size_t i = slot_of(c, b.p);
    while (c->live[i].p) i = (i + 1) & (c->live_cap - 1);
    c->live[i] = b;
    c->live_n++;
}

/* Room in the block table for one more live block: false when the table
 * had to grow and could not (it is left as it was). */
static bool live_room(hs_mem_cache *c) {
    if (2 * (c->live_n + 1) <= c->live_cap) return true;
    live_block *old = c->live;
    size_t old_cap = c->live_cap, cap = old_cap ? 2 * old_cap : 64;
    live_block *grown = calloc(cap, sizeof *grown);
    if (grown == NULL) return false;
    c->live = grown, c->live_cap = cap, c->live_n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].p) live_put(c, old[i]);
    free(old);
    return true;
}

/* Removes p's entry (backward-shift deletion keeps every probe chain whole). */
static live_block live_take(hs_mem_cache *c, void *p) {
    size_t mask = c->live_cap - 1, i = c->live_cap ? slot_of(c, p) : 0;
    while (c->live_cap && c->live[i].p && c->live[i].p != p) i = (i + 1) & mask;
    HS_ASSERT(c->live_cap && c->live[i].p == p && "block not from this caching allocator");
    live_block b = c->live[i];
    for (size_t j = (i + 1) & mask; c->live[j].p; j = (j + 1) & mask) {
        size_t home = slot_of(c, c->live[j].p);
        /* j's entry may move into the hole at i when its home is not in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) c->live[i] = c->live[j], i = j;
    }
    c->live[i].p = NULL;
    c->live_n--;
    return b;
}

/* Keeps p for its class; a free list that cannot grow hands p back to
 * raw_free instead, so a free never fails. */
static void list_push(hs_mem_cache *c, free_list *l, int cls, void *p) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        void **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (v == NULL) {
            c->raw_free(c->ctx, p);
            c->st.reserved -= (int64_t)class_bytes(cls);
            return;
        }
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = p;
}

static void trim_locked(hs_mem_cache *c) {
    for (int k = 0; k < N_CLASSES; k++) {
        free_list *l = &c->lists[k];
        if (l->n == 0) continue;
        for (int64_t i = 0; i < l->n; i++) c->raw_free(c->ctx, l->v[i]);
        c->st.reserved -= l->n * (int64_t)class_bytes(k);
        l->n = 0;
    }
}

static void *take_block(hs_mem_cache *c, int cls) {
    free_list *l = &c->lists[cls];
    if (l->n > 0) {
        c->st.hits++;
        return l->v[--l->n];
    }
    size_t cb = class_bytes(cls);
    void *p = c->raw_alloc(c->ctx, cb);
    if (p == NULL) { /* what the other classes hold may make room */
        trim_locked(c);
        p = c->raw_alloc(c->ctx, cb);
    }
    if (p == NULL) return NULL;
    c->st.misses++;
    c->st.reserved += (int64_t)cb;
    if (c->st.reserved > c->st.reserved_peak) c->st.reserved_peak = c->st.reserved;
    return p;
}

void *hs_mem_cache_alloc(hs_mem_cache *c, size_t bytes) {
    if (bytes > MAX_BYTES) return NULL;
    int cls = class_of(bytes);
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    void *p = live_room(c) ? take_block(c, cls) : NULL;
    if (p == NULL) {
        HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
        return NULL;
    }
    live_put(c, (live_block){.p = p, .bytes = bytes, .cls = cls});
    c->st.in_use += (int64_t)bytes;
    if (c->st.in_use > c->st.peak) c->st.peak = c->st.in_use;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
    return p;
}

size_t hs_mem_cache_free(hs_mem_cache *c, void *p) {
    if (p == NULL) return 0;
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    live_block b = live_take(c, p);
    c->st.in_use -= (int64_t)b.bytes;
    list_push(c, &c->lists[b.cls], b.cls, p);
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
    return b.bytes;
}

void hs_mem_cache_trim(hs_mem_cache *c) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    trim_locked(c);
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
}

hs_mem_cache_stats hs_mem_cache_stats_get(hs_mem_cache *c) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    hs_mem_cache_stats st = c->st;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
    return st;
}

void hs_mem_cache_reset_peak(hs_mem_cache *c) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    c->st.peak = c->st.in_use;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
}

void hs_mem_cache_free_all(hs_mem_cache *c) {
    if (c == NULL) return;
    HS_ASSERT(c->live_n == 0 && "blocks still live at hs_mem_cache_free_all");
    trim_locked(c);
    for (int k = 0; k < N_CLASSES; k++) free(c->lists[k].v);
    free(c->live);
    HS_CHECK_PTHREAD(pthread_mutex_destroy(&c->mu));
    free(c);
}
