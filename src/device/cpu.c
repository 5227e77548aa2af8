/* The cpu backend: both pools are RAM, kept apart for accounting only, and
 * copies are real memcpy's so the offload path costs and traces the way it
 * will on a GPU. Streams and events need nothing: everything is complete
 * when the call returns. */
#include <string.h>

#include "device/device_backend.h"

static void *cpu_alloc(hs_device *d, size_t bytes) { return hs_pool_alloc(&d->device_pool, bytes); }

static void cpu_free(hs_device *d, void *p) { hs_pool_free(&d->device_pool, p); }

static void *cpu_host_alloc(hs_device *d, size_t bytes)
{
    return hs_pool_alloc(&d->host_pool, bytes);
}

static void cpu_host_free(hs_device *d, void *p) { hs_pool_free(&d->host_pool, p); }

static void cpu_copy(hs_device *d, void *dst, const void *src, size_t bytes, hs_copy_kind kind)
{
    if (bytes == 0) return;
    /* memmove: an in-place D2D within one buffer is legal on CUDA too. */
    memmove(dst, src, bytes);
}

static void cpu_synchronize(hs_device *d) {}

static const hs_device_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
};

void hs_device_cpu_init(hs_device *d)
{
    d->kind = HS_DEVICE_CPU;
    d->name = "cpu";
    d->ops = &cpu_ops;
    d->ctx = NULL;
}
