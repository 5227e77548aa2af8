/* fsdp/mem.h — every byte FSDP allocates goes through here: the device
 * allocates it (so the device pool shows it) and FSDP keeps its own current
 * and peak counts per kind, which is what the memory bound of sharding is
 * measured against (parameter bytes per rank <= total/W + the unsharded
 * units alive at once). Only the compute thread allocates FSDP storage. */
#ifndef HS_FSDP_MEM_H
#define HS_FSDP_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hypershard/device.h"

typedef enum hs_fsdp_mem_kind {
    HS_FSDP_MEM_PARAM = 0, /* sharded storage, all-gather outputs, cast copies */
    HS_FSDP_MEM_GRAD,      /* unsharded grads, reduce buffers, sharded grads   */
    HS_FSDP_MEM_KIND_COUNT
} hs_fsdp_mem_kind;

typedef struct hs_fsdp_mem {
    hs_device *dev;
    /* The all-gathers' and the reduce-scatters' streams: an unsharded
     * buffer is written on ag_stream and read on the device's default
     * (compute) stream, a gradient written on the compute stream is reduced
     * on rs_stream, and events order them (fsdp/param.c). On cpu every
     * call completes at once and the waits return at once. */
    hs_stream *ag_stream, *rs_stream;
    /* Recorded on one stream and waited on by another at once
     * (hs_fsdp_mem_tie), so one event serves every such hand-over. */
    hs_event *tie;
    int64_t current[HS_FSDP_MEM_KIND_COUNT];
    int64_t peak[HS_FSDP_MEM_KIND_COUNT];
    int64_t allocs[HS_FSDP_MEM_KIND_COUNT];
    /* enable_offload: masters and sharded grads live in the host pool,
     * counted here and not in current/peak (fsdp/offload.c). */
    bool offload;
    int64_t host_current[HS_FSDP_MEM_KIND_COUNT];
    int64_t host_peak[HS_FSDP_MEM_KIND_COUNT];
} hs_fsdp_mem;

void hs_fsdp_mem_init(hs_fsdp_mem *m, hs_device *dev);
/* Creates ag_stream and rs_stream (a wrap does; without them, as in the
 * layer's unit tests, nothing is ordered). HS_ERR_OOM when the device
 * cannot create them. */
hs_status hs_fsdp_mem_open_streams(hs_fsdp_mem *m, hs_error *e);
/* The streams FSDP's all-gathers and reductions are issued on (comm.h's
 * stream argument): ag_stream / rs_stream, or the device's default stream
 * when none were opened. */
hs_stream *hs_fsdp_mem_ag(const hs_fsdp_mem *m);
hs_stream *hs_fsdp_mem_rs(const hs_fsdp_mem *m);
/* `to` waits for the work issued on `from` so far (no-op without the
 * streams, when both are the default stream). A collective on a side
 * stream whose input the compute stream wrote, or whose output reuses a
 * buffer the compute stream last read, is issued after
 * tie(m, dev->stream, side); the compute stream reads a result after
 * tie(m, side, dev->stream). */
void hs_fsdp_mem_tie(hs_fsdp_mem *m, hs_stream *from, hs_stream *to);
/* Frees the streams; the buffers must be freed already. */
void hs_fsdp_mem_release(hs_fsdp_mem *m);
/* Zero-filled; bytes == 0 still returns a valid, unique block. NULL when
 * the device will not give it, with HS_ERR_OOM in e naming `what` of
 * `owner` (a parameter's FQN or a unit's name), the bytes, the device pool
 * and FSDP's own count of kind k. */
void *hs_fsdp_mem_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                        const char *owner, hs_error *e);
/* The same without the zero fill, for buffers written whole before anything
 * reads them (all-gather outputs and inputs, cast copies, staging): the
 * fill would be a second pass over them per unit and step. */
void *hs_fsdp_mem_alloc_uninit(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                               const char *owner, hs_error *e);
/* The same for a buffer written on stream s (NULL: the compute stream) and
 * given back to the cache only after s has waited for its last reader, as
 * FSDP2 allocates its all-gather outputs on the all-gather stream: freed,
 * it serves s's next request (hs_device_alloc_on). */
void *hs_fsdp_mem_alloc_on(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, hs_stream *s,
                           const char *what, const char *owner, hs_error *e);
/* `bytes` must be what was asked for at allocation. NULL is fine. */
void hs_fsdp_mem_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes);
void hs_fsdp_mem_reset_peak(hs_fsdp_mem *m);
/* Host-pool twins of alloc/free (zero-filled, accounted in host_*; NULL
 * and e as hs_fsdp_mem_alloc). */
void *hs_fsdp_mem_host_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                             const char *owner, hs_error *e);
void hs_fsdp_mem_host_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes);
/* Where a master (sharded storage, sharded grad) lives: the host pool under
 * offload, else the device pool. */
void *hs_fsdp_mem_master_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                               const char *owner, hs_error *e);
void hs_fsdp_mem_master_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes);

#endif
