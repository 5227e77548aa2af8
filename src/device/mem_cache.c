/* The caching allocator: blocks rounded up to a size class, kept on a free
 * list of their class when freed and handed out again for the next request
 * of that class, so that a GPU pool does not call cudaMalloc / cudaFree in
 * the step. Device memory cannot carry a header, so live blocks are found
 * by address in an open-addressing table.
 *
 * Stream-ordered reuse, as PyTorch's CUDA caching allocator does it: every
 * block belongs to the stream it was allocated on and goes back to that
 * stream's free lists, so the next request on the same stream, ordered
 * after all the block's earlier work there, takes it without a wait. A
 * block also used on other streams (hs_mem_cache_record) is parked when
 * freed, with an event marked on each of those streams, and reaches its
 * free list once they have all completed: looked at on every allocation,
 * waited for before a trim. */
#include <pthread.h>
#include <stdlib.h>

#include "device/device_backend.h"

#define MIN_CLASS ((size_t)512)
#define MIN_SHIFT 7 /* 512 = 4 << 7 */
#define MAX_BYTES ((size_t)1 << 60)
#define N_CLASSES ((60 - 2 - MIN_SHIFT + 1) * 4) /* the last one holds MAX_BYTES */
#define MAX_STREAMS 64                           /* bits of live_block.used_on */

typedef struct live_block {
    void *p; /* NULL: empty slot */
    size_t bytes;
    int cls;
    int stream;       /* the slot of the stream it was allocated on */
    uint64_t used_on; /* the slots of the other streams it was recorded on */
} live_block;

typedef struct free_list {
    void **v;
    int64_t n, cap;
} free_list;

/* A freed block waiting for its other streams' events. */
typedef struct parked_block {
    void *p;
    int cls, stream, n_ev;
    void **ev;
} parked_block;

/* A stream the cache has seen: its key (NULL: the default stream, slot 0;
 * GONE: a slot free for the next new stream) and its free lists, one per
 * class, allocated with the slot. */
#define GONE ((const void *)&gone_key)
static const char gone_key;

typedef struct stream_slot {
    const void *key;
    free_list *lists;
} stream_slot;

struct hs_mem_cache {
    const char *name;
    hs_raw_alloc_fn raw_alloc;
    hs_raw_free_fn raw_free;
    void *ctx;
    pthread_mutex_t mu;
    live_block *live;
    size_t live_cap, live_n; /* live_cap a power of two, live_n <= cap / 2 */
    stream_slot streams[MAX_STREAMS];
    int n_streams;
    hs_mem_cache_events events; /* all NULL: a stream's work is done once issued */
    void *events_ctx;
    parked_block *parked;
    int n_parked, cap_parked;
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
    c->streams[0].lists = calloc(N_CLASSES, sizeof *c->streams[0].lists);
    if (c->streams[0].lists == NULL) {
        free(c);
        *out = NULL;
        return hs_error_oom(e, "the %s caching allocator: %zu bytes of free lists", name,
                            N_CLASSES * sizeof(free_list));
    }
    c->n_streams = 1;
    HS_CHECK_PTHREAD(pthread_mutex_init(&c->mu, NULL));
    return HS_OK;
}

void hs_mem_cache_set_events(hs_mem_cache *c, const hs_mem_cache_events *ev, void *ctx) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    c->events = *ev, c->events_ctx = ctx;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
}

/* The slot of stream `key`, or -1 when the cache has not seen it. */
static int find_stream(const hs_mem_cache *c, const void *key) {
    if (key == NULL) return 0;
    for (int i = 1; i < c->n_streams; i++)
        if (c->streams[i].key == key) return i;
    return -1;
}

/* The slot of `key`, given one (with its free lists) when new; -1 when
 * the lists cannot be allocated. */
static int stream_of(hs_mem_cache *c, const void *key) {
    int i = find_stream(c, key);
    if (i >= 0) return i;
    for (i = 1; i < c->n_streams && c->streams[i].key != GONE; i++) {
    }
    HS_ASSERT(i < MAX_STREAMS && "more than 64 streams allocate from one caching allocator");
    if (c->streams[i].lists == NULL) {
        c->streams[i].lists = calloc(N_CLASSES, sizeof *c->streams[i].lists);
        if (c->streams[i].lists == NULL) return -1;
    }
    c->streams[i].key = key;
    if (i == c->n_streams) c->n_streams++;
    return i;
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

/* The index of p's entry; p must be live. */
static size_t live_find(const hs_mem_cache *c, const void *p) {
    size_t mask = c->live_cap - 1, i = c->live_cap ? slot_of(c, p) : 0;
    while (c->live_cap && c->live[i].p && c->live[i].p != p) i = (i + 1) & mask;
    HS_ASSERT(c->live_cap && c->live[i].p == p && "block not from this caching allocator");
    return i;
}

/* Removes p's entry (backward-shift deletion keeps every probe chain whole). */
static live_block live_take(hs_mem_cache *c, void *p) {
    size_t mask = c->live_cap - 1, i = live_find(c, p);
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

/* Hands a parked block to its stream's free list once every event is
 * complete (wait: the host waits for them first); false when it must stay
 * parked. */
static bool unpark(hs_mem_cache *c, parked_block *b, bool wait) {
    for (int k = 0; k < b->n_ev; k++) {
        if (b->ev[k] == NULL) continue;
        if (wait) c->events.wait(c->events_ctx, b->ev[k]);
        else if (!c->events.done(c->events_ctx, b->ev[k])) return false;
        c->events.release(c->events_ctx, b->ev[k]);
        b->ev[k] = NULL;
    }
    free(b->ev);
    list_push(c, &c->streams[b->stream].lists[b->cls], b->cls, b->p);
    return true;
}

static void collect_parked(hs_mem_cache *c, bool wait) {
    for (int i = 0; i < c->n_parked;) {
        if (unpark(c, &c->parked[i], wait)) c->parked[i] = c->parked[--c->n_parked];
        else i++;
    }
}

static void trim_locked(hs_mem_cache *c) {
    collect_parked(c, true);
    for (int s = 0; s < c->n_streams; s++) {
        for (int k = 0; k < N_CLASSES; k++) {
            free_list *l = &c->streams[s].lists[k];
            if (l->n == 0) continue;
            for (int64_t i = 0; i < l->n; i++) c->raw_free(c->ctx, l->v[i]);
            c->st.reserved -= l->n * (int64_t)class_bytes(k);
            l->n = 0;
        }
    }
}

static void *take_block(hs_mem_cache *c, int stream, int cls) {
    if (c->n_parked) collect_parked(c, false);
    free_list *l = &c->streams[stream].lists[cls];
    if (l->n > 0) {
        c->st.hits++;
        return l->v[--l->n];
    }
    size_t cb = class_bytes(cls);
    void *p = c->raw_alloc(c->ctx, cb);
    if (p == NULL) { /* what the other classes and streams hold may make room */
        trim_locked(c);
        p = c->raw_alloc(c->ctx, cb);
    }
    if (p == NULL) return NULL;
    c->st.misses++;
    c->st.reserved += (int64_t)cb;
    if (c->st.reserved > c->st.reserved_peak) c->st.reserved_peak = c->st.reserved;
    return p;
}

void *hs_mem_cache_alloc_on(hs_mem_cache *c, size_t bytes, const void *stream) {
    if (bytes > MAX_BYTES) return NULL;
    int cls = class_of(bytes);
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    int s = stream_of(c, stream);
    void *p = s >= 0 && live_room(c) ? take_block(c, s, cls) : NULL;
    if (p == NULL) {
        HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
        return NULL;
    }
    live_put(c, (live_block){.p = p, .bytes = bytes, .cls = cls, .stream = s});
    c->st.in_use += (int64_t)bytes;
    if (c->st.in_use > c->st.peak) c->st.peak = c->st.in_use;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
    return p;
}

void *hs_mem_cache_alloc(hs_mem_cache *c, size_t bytes) {
    return hs_mem_cache_alloc_on(c, bytes, NULL);
}

void hs_mem_cache_record(hs_mem_cache *c, void *p, const void *stream) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    live_block *b = &c->live[live_find(c, p)];
    int s = stream_of(c, stream);
    HS_ASSERT(s >= 0 && "no memory for a stream's free lists");
    if (s != b->stream) b->used_on |= (uint64_t)1 << s;
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
}

/* Parks b, an event marked on each stream it was recorded on; where the
 * park cannot be recorded the host waits for those events instead, so a
 * free never fails. */
static void park(hs_mem_cache *c, const live_block *b) {
    int n = __builtin_popcountll(b->used_on);
    parked_block pb = {.p = b->p, .cls = b->cls, .stream = b->stream};
    pb.ev = calloc((size_t)n, sizeof *pb.ev);
    for (int s = 0, k = 0; s < MAX_STREAMS && pb.ev; s++)
        if (b->used_on >> s & 1) pb.ev[k++] = c->events.mark(c->events_ctx, c->streams[s].key);
    pb.n_ev = pb.ev ? n : 0;
    if (pb.ev && c->n_parked == c->cap_parked) {
        int cap = c->cap_parked ? 2 * c->cap_parked : 16;
        parked_block *v = realloc(c->parked, (size_t)cap * sizeof *v);
        if (v) c->parked = v, c->cap_parked = cap;
    }
    if (pb.ev == NULL) {
        /* no room to remember the events: wait for the streams themselves */
        for (int s = 0; s < MAX_STREAMS; s++) {
            if (!(b->used_on >> s & 1)) continue;
            void *ev = c->events.mark(c->events_ctx, c->streams[s].key);
            if (ev) c->events.wait(c->events_ctx, ev), c->events.release(c->events_ctx, ev);
        }
        list_push(c, &c->streams[b->stream].lists[b->cls], b->cls, b->p);
    } else if (c->n_parked == c->cap_parked) {
        unpark(c, &pb, true);
    } else {
        c->parked[c->n_parked++] = pb;
    }
}

size_t hs_mem_cache_free(hs_mem_cache *c, void *p) {
    if (p == NULL) return 0;
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    live_block b = live_take(c, p);
    c->st.in_use -= (int64_t)b.bytes;
    if (b.used_on && c->events.mark) park(c, &b);
    else list_push(c, &c->streams[b.stream].lists[b.cls], b.cls, p);
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
    return b.bytes;
}

void hs_mem_cache_stream_gone(hs_mem_cache *c, const void *stream) {
    HS_CHECK_PTHREAD(pthread_mutex_lock(&c->mu));
    int s = find_stream(c, stream);
    if (s > 0) {
        /* its work is complete: what it owns or used is the default's now */
        for (size_t i = 0; i < c->live_cap; i++) {
            live_block *b = &c->live[i];
            if (b->p == NULL) continue;
            if (b->stream == s) b->stream = 0;
            b->used_on &= ~((uint64_t)1 << s);
            if (b->stream == 0) b->used_on &= ~(uint64_t)1;
        }
        for (int i = 0; i < c->n_parked; i++)
            if (c->parked[i].stream == s) c->parked[i].stream = 0;
        for (int k = 0; k < N_CLASSES; k++) {
            free_list *l = &c->streams[s].lists[k];
            while (l->n > 0) list_push(c, &c->streams[0].lists[k], k, l->v[--l->n]);
        }
        c->streams[s].key = GONE;
    }
    HS_CHECK_PTHREAD(pthread_mutex_unlock(&c->mu));
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
    for (int s = 0; s < c->n_streams; s++) {
        for (int k = 0; c->streams[s].lists && k < N_CLASSES; k++) free(c->streams[s].lists[k].v);
        free(c->streams[s].lists);
    }
    free(c->parked);
    free(c->live);
    HS_CHECK_PTHREAD(pthread_mutex_destroy(&c->mu));
    free(c);
}
