/* FSDP storage accounting on top of the device allocator. */
#include "fsdp/mem.h"

#include <string.h>

void hs_fsdp_mem_init(hs_fsdp_mem *m, hs_device *dev) { *m = (hs_fsdp_mem){.dev = dev}; }

void hs_fsdp_mem_open_streams(hs_fsdp_mem *m) {
    m->ag_stream = hs_stream_create(m->dev);
    m->rs_stream = hs_stream_create(m->dev);
    m->tie = hs_event_create(m->dev);
}

void hs_fsdp_mem_release(hs_fsdp_mem *m) {
    hs_stream_free(m->ag_stream);
    hs_stream_free(m->rs_stream);
    hs_event_free(m->tie);
    m->ag_stream = m->rs_stream = NULL;
    m->tie = NULL;
}

hs_stream *hs_fsdp_mem_ag(const hs_fsdp_mem *m) {
    return m->ag_stream ? m->ag_stream : m->dev->stream;
}

hs_stream *hs_fsdp_mem_rs(const hs_fsdp_mem *m) {
    return m->rs_stream ? m->rs_stream : m->dev->stream;
}

void hs_fsdp_mem_tie(hs_fsdp_mem *m, hs_stream *from, hs_stream *to) {
    if (!m->tie || from == to) return;
    hs_event_record(m->tie, from);
    hs_stream_wait(to, m->tie);
}

void *hs_fsdp_mem_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes) {
    /* A zero-length shard still needs a distinct pointer so that views of it
     * never alias another parameter's storage. Filled by the device. */
    void *p = hs_fsdp_mem_alloc_uninit(m, k, bytes);
    hs_dev_zero(m->dev, p, bytes ? bytes : 1);
    return p;
}

void *hs_fsdp_mem_alloc_uninit(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes) {
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    void *p = hs_device_alloc(m->dev, bytes ? bytes : 1);
    HS_ASSERT(p != NULL);
    m->current[k] += (int64_t)bytes;
    m->allocs[k]++;
    if (m->current[k] > m->peak[k]) m->peak[k] = m->current[k];
    return p;
}

void hs_fsdp_mem_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes) {
    if (!p) return;
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    hs_device_free_mem(m->dev, p);
    m->current[k] -= (int64_t)bytes;
    HS_ASSERT(m->current[k] >= 0);
}

void hs_fsdp_mem_reset_peak(hs_fsdp_mem *m) {
    for (int k = 0; k < HS_FSDP_MEM_KIND_COUNT; k++) {
        m->peak[k] = m->current[k];
        m->host_peak[k] = m->host_current[k];
    }
}

void *hs_fsdp_mem_host_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes) {
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    void *p = hs_host_alloc(m->dev, bytes ? bytes : 1);
    HS_ASSERT(p != NULL);
    hs_dev_zero(m->dev, p, bytes ? bytes : 1);
    m->host_current[k] += (int64_t)bytes;
    if (m->host_current[k] > m->host_peak[k]) m->host_peak[k] = m->host_current[k];
    return p;
}

void hs_fsdp_mem_host_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes) {
    if (!p) return;
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    hs_host_free(m->dev, p);
    m->host_current[k] -= (int64_t)bytes;
    HS_ASSERT(m->host_current[k] >= 0);
}

void *hs_fsdp_mem_master_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes) {
    return m->offload ? hs_fsdp_mem_host_alloc(m, k, bytes) : hs_fsdp_mem_alloc(m, k, bytes);
}

void hs_fsdp_mem_master_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes) {
    if (m->offload) hs_fsdp_mem_host_free(m, k, p, bytes);
    else hs_fsdp_mem_free(m, k, p, bytes);
}
