/* The guard: device memory the host cannot touch. With HS_DEVICE_GUARD=1
 * the cpu and reference devices place device memory (hs_device_alloc) in
 * page-aligned mappings kept PROT_NONE while the host runs, and open them
 * only inside the device's own members: every kernel, memset and copy. A
 * read or write of device memory from above the seam (a host loop, a
 * memcpy, a tensor/ call) then faults at once, where on a GPU it would read
 * garbage or crash later; what passes under the guard runs unchanged on a
 * backend whose memory the host cannot address. Device memory comes from
 * one reserved arena, so opening and closing it is one mprotect each; the
 * mpi group opens it while it moves a stream's buffers
 * (hs_device_host_access_begin). A test tool, not a mode to train in. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device/device_backend.h"
#include "device/kernel_list.h"

typedef struct region {
    void *p;
    size_t bytes;
} region;

struct hs_device_guard {
    const hs_device_ops *ops; /* the backend's own tables */
    const hs_device_kernels *k;
    hs_device_ops guarded_ops;
    hs_device_kernels guarded_k;
    pthread_mutex_t mu;
    int depth;   /* nested members: the mappings close when the outermost returns */
    char *arena; /* arena_bytes reserved, PROT_NONE while closed */
    size_t arena_bytes;
    size_t arena_used; /* bytes handed out from the arena's start */
    region *r;         /* live device blocks */
    size_t n, cap;
    region *spare; /* freed blocks, reused first fit */
    size_t n_spare, cap_spare;
    region *host; /* host-pool blocks */
    size_t n_host, cap_host;
};

/* Address space only (MAP_NORESERVE): pages exist once written. */
#define ARENA_BYTES ((size_t)1 << 38)

static void protect_all(hs_device_guard *g, int prot) {
    if (g->arena_used && mprotect(g->arena, g->arena_used, prot) != 0)
        hs_panic("device guard: mprotect of %zu bytes failed", g->arena_used);
}

static void open_memory(hs_device_guard *g) {
    pthread_mutex_lock(&g->mu);
    if (g->depth++ == 0) protect_all(g, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g->mu);
}

static void close_memory(hs_device_guard *g) {
    pthread_mutex_lock(&g->mu);
    if (--g->depth == 0) protect_all(g, PROT_NONE);
    pthread_mutex_unlock(&g->mu);
}

/* Room for one more record: false when the list could not grow. */
static bool room(region **r, size_t *n, size_t *cap) {
    if (*n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 64;
    region *v = realloc(*r, c * sizeof *v);
    if (!v) return false;
    *r = v, *cap = c;
    return true;
}

/* False (nothing recorded) when the list could not grow. */
static bool record(region **r, size_t *n, size_t *cap, void *p, size_t bytes) {
    if (!room(r, n, cap)) return false;
    (*r)[(*n)++] = (region){p, bytes};
    return true;
}

/* Drops p's record; returns its bytes (0: not recorded). */
static size_t forget(region *r, size_t *n, const void *p) {
    for (size_t i = 0; i < *n; i++) {
        if (r[i].p != p) continue;
        size_t bytes = r[i].bytes;
        r[i] = r[--*n];
        return bytes;
    }
    return 0;
}

static size_t page_round(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

/* Under g->mu: a freed block of at least len bytes (its length in *len),
 * or the arena's next pages. */
static void *take(hs_device_guard *g, size_t *len) {
    for (size_t i = 0; i < g->n_spare; i++) {
        if (g->spare[i].bytes < *len) continue;
        region b = g->spare[i];
        g->spare[i] = g->spare[--g->n_spare];
        *len = b.bytes;
        return b.p;
    }
    if (*len > g->arena_bytes - g->arena_used) return NULL;
    char *p = g->arena + g->arena_used;
    g->arena_used += *len;
    if (g->depth > 0 && mprotect(p, *len, PROT_READ | PROT_WRITE) != 0)
        hs_panic("device guard: mprotect of %zu bytes failed", *len);
    return p;
}

static void *guard_raw_alloc(void *ctx, size_t bytes) {
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    size_t len = page_round(bytes ? bytes : 1);
    pthread_mutex_lock(&g->mu);
    /* Room for its record first: a block the guard does not know of would
     * read as host memory. */
    void *p = room(&g->r, &g->n, &g->cap) ? take(g, &len) : NULL;
    if (p) record(&g->r, &g->n, &g->cap, p, len);
    pthread_mutex_unlock(&g->mu);
    return p;
}

/* The pages go back to the system; the addresses stay reserved (and are
 * not reused when the spare list cannot grow). */
static void guard_raw_free(void *ctx, void *p) {
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    pthread_mutex_lock(&g->mu);
    size_t len = forget(g->r, &g->n, p);
    if (len) {
        madvise(p, len, MADV_DONTNEED);
        record(&g->spare, &g->n_spare, &g->cap_spare, p, len);
    }
    pthread_mutex_unlock(&g->mu);
}

static bool in_any(const region *r, size_t n, const char *c) {
    for (size_t i = 0; i < n; i++)
        if (c >= (const char *)r[i].p && c < (const char *)r[i].p + r[i].bytes) return true;
    return false;
}

/* Whether p lies in a live mapping of device memory, or (with pinned) in
 * host-pool memory, which a GPU's kernels may read as pinned memory (the
 * offloaded optimizer). */
static bool in_device(hs_device_guard *g, const void *p, bool pinned) {
    pthread_mutex_lock(&g->mu);
    bool found = in_any(g->r, g->n, p) || (pinned && in_any(g->host, g->n_host, p));
    pthread_mutex_unlock(&g->mu);
    return found;
}

/* Each non-NULL argument of `dev` must be device memory. */
static void need_device(hs_device_guard *g, const char *op, const char *names, const void *const *p,
                        size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] && !in_device(g, p[i], true))
            hs_panic("device guard: %s: argument %zu of %s is host memory (%p), not device "
                     "memory: copy it across with hs_device_copy first",
                     op, i + 1, names, p[i]);
}

static void *guarded_host_alloc(hs_device *d, size_t bytes) {
    hs_device_guard *g = d->guard;
    void *p = g->ops->host_alloc(d, bytes);
    pthread_mutex_lock(&g->mu);
    bool known = p && record(&g->host, &g->n_host, &g->cap_host, p, bytes);
    pthread_mutex_unlock(&g->mu);
    if (p && !known) g->ops->host_free(d, p), p = NULL;
    return p;
}

static void guarded_host_free(hs_device *d, void *p) {
    hs_device_guard *g = d->guard;
    pthread_mutex_lock(&g->mu);
    forget(g->host, &g->n_host, p);
    pthread_mutex_unlock(&g->mu);
    g->ops->host_free(d, p);
}

static void guarded_memset(hs_stream *s, void *p, int value, size_t bytes) {
    hs_device_guard *g = s->dev->guard;
    if (bytes && !in_device(g, p, true))
        hs_panic("device guard: memset of %zu bytes of host memory", bytes);
    open_memory(g);
    g->ops->memset(s, p, value, bytes);
    close_memory(g);
}

static void guarded_copy(hs_stream *s, void *dst, const void *src, size_t bytes,
                         hs_copy_kind kind) {
    hs_device_guard *g = s->dev->guard;
    static const char *const kinds[] = {"H2D", "D2H", "D2D"};
    bool dst_ok = in_device(g, dst, false) == (kind != HS_COPY_D2H);
    bool src_ok = in_device(g, src, false) == (kind != HS_COPY_H2D);
    if (bytes && (!dst_ok || !src_ok))
        hs_panic("device guard: a %s copy of %zu bytes from %s memory to %s memory", kinds[kind],
                 bytes, in_device(g, src, false) ? "device" : "host",
                 in_device(g, dst, false) ? "device" : "host");
    open_memory(g);
    g->ops->copy(s, dst, src, bytes, kind);
    close_memory(g);
}

#define DEVICE_ARGS(...)                                                                           \
    ((const void *const[]){__VA_ARGS__}),                                                          \
        sizeof((const void *const[]){__VA_ARGS__}) / sizeof(const void *)
#define GUARDED(name, params, args, devs)                                                          \
    static void guarded_##name params {                                                            \
        hs_device_guard *guard_ = s->dev->guard; /* `g` is a kernel argument */                    \
        need_device(guard_, #name, #devs, DEVICE_ARGS devs);                                       \
        open_memory(guard_);                                                                       \
        guard_->k->name args;                                                                      \
        close_memory(guard_);                                                                      \
    }
HS_DEVICE_KERNEL_LIST(GUARDED)
#undef GUARDED

#define ONE(name, params, args, devs) +1
_Static_assert(0 HS_DEVICE_KERNEL_LIST(ONE) == sizeof(hs_device_kernels) / sizeof(void (*)(void)),
               "the guard wraps every member of hs_device_kernels");
#undef ONE

void hs_device_host_access_begin(hs_device *d) {
    if (d->guard) open_memory(d->guard);
}

void hs_device_host_access_end(hs_device *d) {
    if (d->guard) close_memory(d->guard);
}

hs_status hs_device_guard_install(hs_device *d, bool staged, hs_error *e) {
    hs_device_guard *g = calloc(1, sizeof *g);
    if (!g) return hs_error_oom(e, "device guard: %zu bytes of state", sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    /* The largest reservation the address-space limit (ulimit -v) allows. */
    for (g->arena_bytes = ARENA_BYTES; g->arena_bytes >= ((size_t)1 << 24); g->arena_bytes /= 2) {
        g->arena = mmap(NULL, g->arena_bytes, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g->arena != MAP_FAILED) break;
    }
    if (g->arena == MAP_FAILED) {
        free(g);
        return hs_error_oom(e, "device guard: an arena of 16 MiB of address space (ulimit -v)");
    }
    g->ops = d->ops, g->k = d->k;
    g->guarded_ops = *d->ops;
    g->guarded_ops.memset = guarded_memset;
    g->guarded_ops.copy = guarded_copy;
    g->guarded_ops.host_alloc = guarded_host_alloc;
    g->guarded_ops.host_free = guarded_host_free;
    g->guarded_k = *d->k;
#define SET(name, params, args, devs)                                                              \
    if (g->k->name) g->guarded_k.name = guarded_##name;
    HS_DEVICE_KERNEL_LIST(SET)
#undef SET
    d->guard = g;
    d->ops = &g->guarded_ops;
    d->k = &g->guarded_k;
    hs_mem_cache_free_all(d->cache);
    d->cache = NULL;
    hs_status s =
        hs_mem_cache_create("device pool", guard_raw_alloc, guard_raw_free, d, &d->cache, e);
    if (s != HS_OK) return s;
    /* staged: the host may not address it at all, as on a GPU: the
     * collectives stage its buffers through host memory (comm/stage.c) */
    d->host_visible = !staged;
    fprintf(stderr,
            "device guard: the %s device's memory is closed to the host outside its calls%s\n",
            d->name, staged ? "; collectives stage it through host memory, as a GPU's" : "");
    return HS_OK;
}

void hs_device_guard_free(hs_device *d) {
    hs_device_guard *g = d->guard;
    if (!g) return;
    munmap(g->arena, g->arena_bytes);
    free(g->r);
    free(g->spare);
    free(g->host);
    pthread_mutex_destroy(&g->mu);
    free(g);
    d->guard = NULL;
}
