/* FSDP storage accounting on top of the device allocator. */
#include "fsdp/mem.h"

#include <stdio.h>
#include <string.h>

void hs_fsdp_mem_init(hs_fsdp_mem *m, hs_device *dev) { *m = (hs_fsdp_mem){.dev = dev}; }

hs_status hs_fsdp_mem_open_streams(hs_fsdp_mem *m, hs_error *e) {
    hs_status st = hs_stream_create(m->dev, &m->ag_stream, e);
    if (st == HS_OK) st = hs_stream_create(m->dev, &m->rs_stream, e);
    if (st == HS_OK) st = hs_event_create(m->dev, &m->tie, e);
    return st;
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

static const char *const kind_names[] = {"parameter", "gradient"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == HS_FSDP_MEM_KIND_COUNT,
               "kind_names follows hs_fsdp_mem_kind");

/* "the all-gather output of layers.0.attn.wq (FSDP parameter memory: N bytes
 * held)", for a failed allocation's report. */
static void oom_what(const hs_fsdp_mem *m, hs_fsdp_mem_kind k, bool host, const char *what,
                     const char *owner, char *buf, size_t cap) {
    snprintf(buf, cap, "%s of %s (FSDP %s memory%s: %lld bytes held)", what,
             owner && owner[0] ? owner : "the root", kind_names[k], host ? " in the host pool" : "",
             (long long)(host ? m->host_current[k] : m->current[k]));
}

void *hs_fsdp_mem_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                        const char *owner, hs_error *e) {
    /* A zero-length shard still needs a distinct pointer so that views of it
     * never alias another parameter's storage. Filled by the device. */
    void *p = hs_fsdp_mem_alloc_uninit(m, k, bytes, what, owner, e);
    if (p) hs_dev_zero(m->dev, p, bytes ? bytes : 1);
    return p;
}

void *hs_fsdp_mem_alloc_uninit(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                               const char *owner, hs_error *e) {
    return hs_fsdp_mem_alloc_on(m, k, bytes, NULL, what, owner, e);
}

void *hs_fsdp_mem_alloc_on(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, hs_stream *s,
                           const char *what, const char *owner, hs_error *e) {
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    void *p = hs_device_alloc_on(m->dev, bytes ? bytes : 1, s);
    if (p == NULL) {
        char buf[512];
        oom_what(m, k, false, what, owner, buf, sizeof buf);
        hs_device_oom(m->dev, bytes ? bytes : 1, buf, e);
        return NULL;
    }
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

void *hs_fsdp_mem_host_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                             const char *owner, hs_error *e) {
    HS_ASSERT((unsigned)k < HS_FSDP_MEM_KIND_COUNT);
    void *p = hs_host_alloc(m->dev, bytes ? bytes : 1);
    if (p == NULL) {
        char buf[512];
        oom_what(m, k, true, what, owner, buf, sizeof buf);
        hs_pool_oom(&m->dev->host_pool, bytes ? bytes : 1, buf, e);
        return NULL;
    }
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

void *hs_fsdp_mem_master_alloc(hs_fsdp_mem *m, hs_fsdp_mem_kind k, size_t bytes, const char *what,
                               const char *owner, hs_error *e) {
    return m->offload ? hs_fsdp_mem_host_alloc(m, k, bytes, what, owner, e)
                      : hs_fsdp_mem_alloc(m, k, bytes, what, owner, e);
}

void hs_fsdp_mem_master_free(hs_fsdp_mem *m, hs_fsdp_mem_kind k, void *p, size_t bytes) {
    if (m->offload) hs_fsdp_mem_host_free(m, k, p, bytes);
    else hs_fsdp_mem_free(m, k, p, bytes);
}
