/* The backend registry, device creation, kind names, streams and events, and
 * the traced copy shared by all backends. */
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_backend.h"

static const char *const kind_names[] = {"cpu", "cuda", "reference"};
_Static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == HS_DEVICE_KIND_COUNT,
               "kind_names must follow hs_device_kind");

static const char *const copy_names[] = {"H2D", "D2H", "D2D"};
_Static_assert(sizeof(copy_names) / sizeof(copy_names[0]) == HS_COPY_KIND_COUNT,
               "copy_names must follow hs_copy_kind");

/* The compiled backends, each its init and its kernel table: adding one
 * is its files and one line here. */
typedef struct hs_backend_entry {
    hs_device_init_fn init;
    hs_device_kernels_fn kernels;
} hs_backend_entry;

static const hs_backend_entry backends[HS_DEVICE_KIND_COUNT] = {
    [HS_DEVICE_CPU] = {hs_device_cpu_init, hs_device_cpu_kernels},
    [HS_DEVICE_REFERENCE] = {hs_device_reference_init, hs_device_reference_kernels},
#ifdef HS_HAVE_CUDA
    [HS_DEVICE_CUDA] = {hs_device_cuda_module_init, hs_device_cuda_module_kernels},
#endif
};

const hs_device_kernels *hs_device_kind_kernels(hs_device_kind k) {
    return hs_device_kind_compiled(k) ? backends[k].kernels() : NULL;
}

const char *hs_device_kind_name(hs_device_kind k) {
    if (k < 0 || k >= HS_DEVICE_KIND_COUNT) return "unknown";
    return kind_names[k];
}

bool hs_device_kind_parse(const char *s, hs_device_kind *out) {
    if (s == NULL) return false;
    for (int i = 0; i < HS_DEVICE_KIND_COUNT; i++) {
        if (strcmp(s, kind_names[i]) == 0) {
            *out = (hs_device_kind)i;
            return true;
        }
    }
    return false;
}

bool hs_device_kind_compiled(hs_device_kind k) {
    return k >= 0 && k < HS_DEVICE_KIND_COUNT && backends[k].init != NULL;
}

/* The caching allocator's events on a device whose events complete later
 * than issued (a GPU): an hs_event per parked block and stream. */
static void *cache_mark(void *ctx, const void *key) {
    hs_device *d = ctx;
    hs_stream *s = key ? (hs_stream *)key : d->stream;
    hs_event *ev = NULL;
    if (hs_event_create(d, &ev, NULL) != HS_OK) { /* no event: the host waits now */
        hs_stream_synchronize(s);
        return NULL;
    }
    hs_event_record(ev, s);
    return ev;
}

static bool cache_done(void *ctx, void *ev) {
    hs_event *e = ev;
    return e->dev->ops->event_query(e);
}

static void cache_wait(void *ctx, void *ev) { hs_event_synchronize(ev); }
static void cache_release(void *ctx, void *ev) { hs_event_free(ev); }

hs_status hs_device_create(hs_device_kind kind, hs_trace *trace, hs_device **out, hs_error *e) {
    *out = NULL;
    if (kind == HS_DEVICE_CUDA && !hs_device_kind_compiled(kind))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.device: 'cuda' is not available: this build of "
                            "hypershard has no CUDA backend; set accelerator.device: cpu");
    if (!hs_device_kind_compiled(kind))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.device: unknown device kind %d; use 'cpu'", (int)kind);
    hs_device *d = calloc(1, sizeof *d);
    if (d == NULL)
        return hs_error_oom(e, "the %s device object: %zu bytes", kind_names[kind], sizeof *d);
    hs_pool_init(&d->device_pool, "device");
    hs_pool_init(&d->host_pool, "host");
    d->trace = trace;
    hs_error_clear(&d->fault);
    d->ordinal = -1;
    d->native_bf16 = hs_gemm16_native(HS_DTYPE_BF16);
    d->native_f16 = hs_gemm16_native(HS_DTYPE_F16);
    hs_status s = backends[kind].init(d, e);
    /* HS_DEVICE_GUARD=1: the guard; =staged: the guard, and collectives
     * staged through host memory as on a GPU (docs/device.md) */
    const char *guard = getenv("HS_DEVICE_GUARD");
    bool staged = guard && strcmp(guard, "staged") == 0;
    if (s == HS_OK && guard && (strcmp(guard, "1") == 0 || staged) && d->ops == &hs_ram_ops)
        s = hs_device_guard_install(d, staged, e);
    if (s == HS_OK) s = hs_stream_create(d, &d->stream, e);
    if (s != HS_OK) {
        hs_device_free(d);
        return s;
    }
    if (d->ops->event_query) {
        static const hs_mem_cache_events ev = {cache_mark, cache_done, cache_wait, cache_release};
        hs_mem_cache_set_events(d->cache, &ev, d);
    }
    *out = d;
    return HS_OK;
}

void hs_device_free(hs_device *d) {
    if (d == NULL) return;
    hs_stream_free(d->stream);
    hs_mem_cache_free_all(d->cache);
    if (d->ops && d->ops->destroy) d->ops->destroy(d);
    hs_device_guard_free(d);
    hs_device_profile_free(d);
    free(d);
}

hs_mem_cache_stats hs_device_mem_stats(hs_device *d) { return hs_mem_cache_stats_get(d->cache); }

void *hs_device_alloc(hs_device *d, size_t bytes) { return hs_device_alloc_on(d, bytes, NULL); }

void *hs_device_alloc_on(hs_device *d, size_t bytes, hs_stream *s) {
    void *p = d->ops->alloc(d, bytes, s);
    if (p == NULL) {
        hs_error e;
        hs_device_oom(d, bytes, "a device buffer", &e);
        hs_device_fail(d, &e);
    }
    return p;
}

void hs_device_record_stream(hs_device *d, void *p, hs_stream *s) {
    hs_mem_cache_record(d->cache, p, hs_device_stream_key(d, s));
}

void *hs_host_alloc(hs_device *d, size_t bytes) {
    void *p = d->ops->host_alloc(d, bytes);
    if (p == NULL) {
        hs_error e;
        hs_pool_oom(&d->host_pool, bytes, "a host buffer of the device", &e);
        hs_device_fail(d, &e);
    }
    return p;
}

hs_status hs_device_oom(hs_device *d, size_t bytes, const char *what, hs_error *e) {
    hs_mem_cache_stats st = hs_device_mem_stats(d);
    char limit[64] = "";
    if (d->device_pool.limit > 0)
        snprintf(limit, sizeof limit, ", limit %lld", (long long)d->device_pool.limit);
    return hs_error_oom(e,
                        "the device pool of the %s device could not allocate %zu bytes (%.1f MiB) "
                        "for %s; in use %lld bytes, peak %lld, held by its cache %lld%s",
                        d->name, bytes, (double)bytes / (1 << 20), what,
                        (long long)hs_pool_current(&d->device_pool),
                        (long long)hs_pool_peak(&d->device_pool), (long long)st.reserved, limit);
}

/* Claims the one fault slot (0 -> 1), writes it, then publishes it (2):
 * the first failure wins and a reader never sees half a message. */
void hs_device_fail(hs_device *d, const hs_error *e) {
    int none = 0;
    if (!atomic_compare_exchange_strong(&d->fault_state, &none, 1)) return;
    d->fault = *e;
    if (d->fault.code == HS_OK) d->fault.code = HS_ERR_INTERNAL;
    atomic_store(&d->fault_state, 2);
}

void hs_kernel_oom(hs_stream *s, const char *fmt, ...) {
    char what[HS_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    hs_error e;
    hs_error_clear(&e);
    hs_error_oom(&e, "%s", what);
    hs_device_fail(s->dev, &e);
}

void hs_device_note(hs_device *d, const char *fmt, ...) {
    int open = 0;
    while (!atomic_compare_exchange_weak(&d->note_lock, &open, 1)) open = 0, sched_yield();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->note, sizeof d->note, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&d->note_serial, 1);
    atomic_store(&d->note_lock, 0);
}

void hs_adamw_many_each(hs_stream *s, const hs_adamw_tensor *t, int count,
                        const hs_adamw_hparams *h, const hs_device_kernels *k) {
    for (int i = 0; i < count; i++) {
        hs_adamw_hparams hi = *h;
        hi.decay_factor = t[i].decay_factor;
        k->adamw(s, t[i].p, t[i].pdt, t[i].m, t[i].v, t[i].g, &hi, t[i].n);
        if (t[i].copy) k->convert(s, t[i].copy, t[i].copy_dt, t[i].p, t[i].pdt, t[i].n);
    }
}

bool hs_device_gemm_native(const hs_device *d, hs_dtype dt) {
    if (dt == HS_DTYPE_F32) return false;
    if (!d) return hs_gemm16_native(dt);
    return d->kind == HS_DEVICE_CUDA || (dt == HS_DTYPE_BF16 ? d->native_bf16 : d->native_f16);
}

hs_gemm_shape hs_device_gemm_shape(const hs_device *d, const hs_gemm_shape *g) {
    hs_gemm_shape w = *g;
    hs_dtype low = g->a_dt != HS_DTYPE_F32 ? g->a_dt : g->b_dt;
    w.split_rows = g->split_rows || (d && d->split_gemm_rows);
    /* split rows run the fp32 sgemm, whose blocks were verified */
    w.widen = g->widen || w.split_rows || (low != HS_DTYPE_F32 && !hs_device_gemm_native(d, low));
    return w;
}

int hs_device_note_read(hs_device *d, char *buf, size_t n) {
    int open = 0;
    while (!atomic_compare_exchange_weak(&d->note_lock, &open, 1)) open = 0, sched_yield();
    int serial = atomic_load(&d->note_serial);
    if (n > 0) snprintf(buf, n, "%s", serial ? d->note : "");
    atomic_store(&d->note_lock, 0);
    return serial;
}

hs_status hs_device_status(hs_device *d, hs_error *e) {
    int state;
    while ((state = atomic_load(&d->fault_state)) == 1) sched_yield();
    if (state == 0) return HS_OK;
    if (e) *e = d->fault;
    return d->fault.code;
}

hs_status hs_stream_create(hs_device *d, hs_stream **out, hs_error *e) {
    hs_stream *s = *out = malloc(sizeof *s);
    if (s != NULL) s->dev = d, s->ctx = d->ops->stream_create(d);
    if (s != NULL && s->ctx != NULL) return HS_OK;
    free(s);
    *out = NULL;
    return hs_error_oom(e, "a stream of the %s device (%zu bytes and the backend's state)", d->name,
                        sizeof *s);
}

void hs_stream_free(hs_stream *s) {
    if (s == NULL) return;
    hs_device *d = s->dev;
    if (s != d->stream && d->cache) {
        /* its blocks go to the default stream once its work is done */
        hs_stream_synchronize(s);
        hs_mem_cache_stream_gone(d->cache, s);
    }
    d->ops->stream_destroy(d, s->ctx);
    free(s);
}

hs_status hs_event_create(hs_device *d, hs_event **out, hs_error *e) {
    hs_event *ev = *out = malloc(sizeof *ev);
    if (ev != NULL) ev->dev = d, ev->ctx = d->ops->event_create(d);
    if (ev != NULL && ev->ctx != NULL) return HS_OK;
    free(ev);
    *out = NULL;
    return hs_error_oom(e, "an event of the %s device (%zu bytes and the backend's state)", d->name,
                        sizeof *ev);
}

void hs_event_free(hs_event *ev) {
    if (ev == NULL) return;
    ev->dev->ops->event_destroy(ev->dev, ev->ctx);
    free(ev);
}

void hs_device_copy_async(hs_stream *s, void *dst, const void *src, size_t bytes,
                          hs_copy_kind kind) {
    HS_ASSERT(kind >= 0 && kind < HS_COPY_KIND_COUNT);
    hs_device *d = s->dev;
    if (!hs_trace_enabled(d->trace)) {
        d->ops->copy(s, dst, src, bytes, kind);
        return;
    }
    double t0 = hs_now();
    d->ops->copy(s, dst, src, bytes, kind);
    double t1 = hs_now();
    char args[48];
    snprintf(args, sizeof args, "\"bytes\":%zu", bytes);
    hs_trace_span(d->trace, HS_LANE_COPY, copy_names[kind], "copy", t0, t1, args);
}

void hs_device_copy(hs_device *d, void *dst, const void *src, size_t bytes, hs_copy_kind kind) {
    hs_device_copy_async(d->stream, dst, src, bytes, kind);
    d->ops->stream_synchronize(d->stream);
}
