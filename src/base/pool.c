/* Accounted, 64-byte aligned allocation. Each block carries a small header
 * (its size) in front of the aligned pointer, so free needs no size and the
 * pool's byte counts stay exact. */
#include <stdint.h>
#include <stdio.h>
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
    p->limit = 0;
}

void hs_pool_set_limit(hs_pool *p, int64_t bytes) { p->limit = bytes > 0 ? bytes : 0; }

bool hs_pool_fits(const hs_pool *p, size_t bytes) {
    return bytes <= (size_t)INT64_MAX &&
           (p->limit <= 0 || hs_pool_current(p) <= p->limit - (int64_t)bytes);
}

bool hs_pool_charge(hs_pool *p, size_t bytes) {
    if (bytes > (size_t)INT64_MAX) return false;
    long long now = atomic_fetch_add(&p->current, (long long)bytes) + (long long)bytes;
    if (p->limit > 0 && now > p->limit) {
        atomic_fetch_sub(&p->current, (long long)bytes);
        return false;
    }
    long long peak = atomic_load(&p->peak);
    while (now > peak && !atomic_compare_exchange_weak(&p->peak, &peak, now)) {
    }
    return true;
}

void hs_pool_uncharge(hs_pool *p, size_t bytes) { atomic_fetch_sub(&p->current, (long long)bytes); }

/* Counted once the memory is there, so a refused request leaves no trace
 * in the peak. */
void *hs_pool_alloc(hs_pool *p, size_t bytes) {
    void *raw = NULL;
    if (bytes > SIZE_MAX - HEADER_ROOM || !hs_pool_fits(p, bytes)) return NULL;
    if (posix_memalign(&raw, HS_ALIGN, bytes + HEADER_ROOM) != 0) return NULL;
    if (!hs_pool_charge(p, bytes)) { /* another thread took the room meanwhile */
        free(raw);
        return NULL;
    }
    atomic_fetch_add(&p->allocs, 1);
    char *data = (char *)raw + HEADER_ROOM;
    block_header *h = (block_header *)(data - sizeof(block_header));
    h->bytes = bytes;
    h->raw = raw;
    return data;
}

void *hs_pool_calloc(hs_pool *p, size_t bytes) {
    void *d = hs_pool_alloc(p, bytes);
    if (d) memset(d, 0, bytes);
    return d;
}

hs_status hs_pool_oom(const hs_pool *p, size_t bytes, const char *what, hs_error *e) {
    char limit[64] = "";
    if (p->limit > 0) snprintf(limit, sizeof limit, ", limit %lld", (long long)p->limit);
    return hs_error_oom(e,
                        "the %s pool could not allocate %zu bytes (%.1f MiB) for %s; in use "
                        "%lld bytes, peak %lld%s",
                        p->name, bytes, (double)bytes / (1 << 20), what,
                        (long long)hs_pool_current(p), (long long)hs_pool_peak(p), limit);
}

static block_header *header_of(const void *ptr) {
    return (block_header *)((char *)ptr - sizeof(block_header));
}

size_t hs_pool_block_size(const void *ptr) { return ptr ? header_of(ptr)->bytes : 0; }

void hs_pool_free(hs_pool *p, void *ptr) {
    if (!ptr) return;
    block_header *h = header_of(ptr);
    hs_pool_uncharge(p, h->bytes);
    free(h->raw);
}

int64_t hs_pool_current(const hs_pool *p) { return atomic_load(&((hs_pool *)p)->current); }
int64_t hs_pool_peak(const hs_pool *p) { return atomic_load(&((hs_pool *)p)->peak); }
void hs_pool_reset_peak(hs_pool *p) { atomic_store(&p->peak, atomic_load(&p->current)); }
