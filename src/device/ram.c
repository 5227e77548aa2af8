/* Memory, streams and events of the backends that compute in host RAM (cpu
 * and reference). Both pools are RAM, kept apart for accounting only, and
 * copies are real memmove's, so the offload path costs and traces the way
 * it will on a GPU. Every call has finished when it returns: a stream has
 * no state, an event is complete once recorded, waits return at once. */
#include <stdlib.h>
#include <string.h>

#include "device/device_backend.h"

/* Device memory: 64-byte aligned RAM under the device's caching allocator,
 * counted in device_pool by the bytes asked for (as hs_pool counts). */
static void *ram_raw_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, HS_ALIGN, bytes) == 0 ? p : NULL;
}

static void ram_raw_free(void *ctx, void *p) { free(p); }

/* NULL when the device pool's limit or the caching allocator refuses;
 * counted once the memory is there, so a refusal leaves no trace in the
 * peak. */
static void *ram_alloc(hs_device *d, size_t bytes, hs_stream *s) {
    if (!hs_pool_fits(&d->device_pool, bytes)) return NULL;
    void *p = hs_mem_cache_alloc_on(d->cache, bytes, hs_device_stream_key(d, s));
    if (p && !hs_pool_charge(&d->device_pool, bytes)) { /* the room went meanwhile */
        hs_mem_cache_free(d->cache, p);
        p = NULL;
    }
    if (p) atomic_fetch_add(&d->device_pool.allocs, 1);
    return p;
}

static void ram_free(hs_device *d, void *p) {
    hs_pool_uncharge(&d->device_pool, hs_mem_cache_free(d->cache, p));
}

hs_status hs_ram_memory_init(hs_device *d, hs_error *e) {
    d->host_visible = true;
    return hs_mem_cache_create("device pool", ram_raw_alloc, ram_raw_free, d, &d->cache, e);
}

static void *ram_host_alloc(hs_device *d, size_t bytes) {
    return hs_pool_alloc(&d->host_pool, bytes);
}

static void ram_host_free(hs_device *d, void *p) { hs_pool_free(&d->host_pool, p); }

static void ram_memset(hs_stream *s, void *p, int value, size_t bytes) {
    if (bytes) memset(p, value, bytes);
}

static void ram_copy(hs_stream *s, void *dst, const void *src, size_t bytes, hs_copy_kind kind) {
    if (bytes == 0) return;
    /* memmove: an in-place D2D within one buffer is legal on CUDA too. */
    memmove(dst, src, bytes);
}

/* A stream or event needs no state of its own: any non-NULL ctx will do. */
static void *ram_no_ctx(hs_device *d) { return d; }
static void ram_ctx_destroy(hs_device *d, void *ctx) {}
static void ram_event_record(hs_event *e, hs_stream *s) {}
static void ram_stream_wait(hs_stream *s, hs_event *e) {}
static void ram_event_synchronize(hs_event *e) {}
static void ram_stream_synchronize(hs_stream *s) {}
static void ram_synchronize(hs_device *d) {}

const hs_device_ops hs_ram_ops = {
    .alloc = ram_alloc,
    .free = ram_free,
    .host_alloc = ram_host_alloc,
    .host_free = ram_host_free,
    .memset = ram_memset,
    .copy = ram_copy,
    .stream_create = ram_no_ctx,
    .stream_destroy = ram_ctx_destroy,
    .event_create = ram_no_ctx,
    .event_destroy = ram_ctx_destroy,
    .event_record = ram_event_record,
    .stream_wait = ram_stream_wait,
    .event_synchronize = ram_event_synchronize,
    .stream_synchronize = ram_stream_synchronize,
    .synchronize = ram_synchronize,
};
