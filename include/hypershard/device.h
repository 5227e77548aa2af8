/* hypershard/device.h — where tensors live and how bytes move between the
 * host and the compute device.
 *
 * Contract of this layer:
 * - A device is a struct of function pointers with a `ctx` (ggml-style
 *   backends): `cpu` now, `cuda` later, with no #ifdef above this layer.
 * - Every device has two accounted pools: `device` (where compute reads
 *   parameters and activations) and `host` (pinned host memory on a GPU; the
 *   offload target). On the cpu device both are RAM; the split is accounting
 *   only, and copies between them are real memcpy's so that the offload path
 *   is exercised and traced the same way it will be on a GPU.
 * - Streams and events exist in the interface; on the cpu device they are
 *   no-ops that complete immediately.
 */
#ifndef HYPERSHARD_DEVICE_H
#define HYPERSHARD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "hypershard/base.h"

typedef enum hs_device_kind { HS_DEVICE_CPU = 0, HS_DEVICE_CUDA, HS_DEVICE_KIND_COUNT } hs_device_kind;

typedef enum hs_copy_kind { HS_COPY_H2D = 0, HS_COPY_D2H, HS_COPY_D2D, HS_COPY_KIND_COUNT } hs_copy_kind;

typedef struct hs_device hs_device;

typedef struct hs_device_ops {
    void *(*alloc)(hs_device *d, size_t bytes);         /* device pool */
    void (*free)(hs_device *d, void *p);
    void *(*host_alloc)(hs_device *d, size_t bytes);    /* host pool   */
    void (*host_free)(hs_device *d, void *p);
    void (*copy)(hs_device *d, void *dst, const void *src, size_t bytes, hs_copy_kind kind);
    void (*synchronize)(hs_device *d);
} hs_device_ops;

struct hs_device {
    hs_device_kind kind;
    const char *name;
    const hs_device_ops *ops;
    void *ctx;
    hs_pool device_pool;
    hs_pool host_pool;
    hs_trace *trace; /* may be NULL; copies are recorded on HS_LANE_COPY */
};

const char *hs_device_kind_name(hs_device_kind k);
/* "cpu" or "cuda". */
bool hs_device_kind_parse(const char *s, hs_device_kind *out);

/* Create the device. `cuda` returns HS_ERR_CONFIG with a clear message in a
 * build without CUDA. */
hs_status hs_device_create(hs_device_kind kind, hs_trace *trace, hs_device **out, hs_error *e);
void hs_device_free(hs_device *d);

static inline void *hs_device_alloc(hs_device *d, size_t bytes) { return d->ops->alloc(d, bytes); }
static inline void hs_device_free_mem(hs_device *d, void *p) { d->ops->free(d, p); }
static inline void *hs_host_alloc(hs_device *d, size_t bytes) { return d->ops->host_alloc(d, bytes); }
static inline void hs_host_free(hs_device *d, void *p) { d->ops->host_free(d, p); }
/* Records a span on the trace's copy lane with the byte count. */
void hs_device_copy(hs_device *d, void *dst, const void *src, size_t bytes, hs_copy_kind kind);

#endif
