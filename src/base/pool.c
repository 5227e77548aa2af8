/* Accounted, 64-byte aligned allocation. Each block carries a small header
 * (its size) in front of the aligned pointer, so free needs no size and the
 * pool's byte counts stay exact. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/base.h"

typedef struct block_header {
    size_t bytes;
    void *raw;
} block_header;

#define HEADER_ROOM HS_ALIGN /* the header sits in the 64 bytes before the block */

void hs_pool_init(hs_pool *p, const char *name) {
    p->name = name;
    atomic_store(&p->current, 0);
    atomic_store(&p->peak, 0);
    atomic_store(&p->allocs, 0);
}

static void pool_count(hs_pool *p, long long delta) {
    long long now = atomic_fetch_add(&p->current, delta) + delta;
    long long peak = atomic_load(&p->peak);
    while (now > peak && !atomic_compare_exchange_weak(&p->peak, &peak, now)) {
    }
}

void *hs_pool_alloc(hs_pool *p, size_t bytes) {
    void *raw = NULL;
    if (posix_memalign(&raw, HS_ALIGN, bytes + HEADER_ROOM) != 0)
        hs_oom("the %s pool could not allocate %zu bytes (%.1f MiB; in use %lld, peak %lld)",
               p->name, bytes, (double)bytes / (1 << 20), (long long)atomic_load(&p->current),
               (long long)atomic_load(&p->peak));
    char *data = (char *)raw + HEADER_ROOM;
    block_header *h = (block_header *)(data - sizeof(block_header));
    h->bytes = bytes;
    h->raw = raw;
    atomic_fetch_add(&p->allocs, 1);
    pool_count(p, (long long)bytes);
    return data;
}

void *hs_pool_calloc(hs_pool *p, size_t bytes) {
    void *d = hs_pool_alloc(p, bytes);
    memset(d, 0, bytes);
    return d;
}

static block_header *header_of(const void *ptr) {
    return (block_header *)((char *)ptr - sizeof(block_header));
}

size_t hs_pool_block_size(const void *ptr) { return ptr ? header_of(ptr)->bytes : 0; }

void hs_pool_free(hs_pool *p, void *ptr) {
    if (!ptr) return;
    block_header *h = header_of(ptr);
    pool_count(p, -(long long)h->bytes);
    free(h->raw);
}

int64_t hs_pool_current(const hs_pool *p) { return atomic_load(&((hs_pool *)p)->current); }
int64_t hs_pool_peak(const hs_pool *p) { return atomic_load(&((hs_pool *)p)->peak); }
void hs_pool_reset_peak(hs_pool *p) { atomic_store(&p->peak, atomic_load(&p->current)); }
