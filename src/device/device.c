/* The backend registry, device creation, kind names, streams and events, and
 * the traced copy shared by all backends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_backend.h"

static const char *const kind_names[] = {"cpu", "cuda", "reference"};
_Static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == HS_DEVICE_KIND_COUNT,
               "kind_names must follow hs_device_kind");

static const char *const copy_names[] = {"H2D", "D2H", "D2D"};
_Static_assert(sizeof(copy_names) / sizeof(copy_names[0]) == HS_COPY_KIND_COUNT,
               "copy_names must follow hs_copy_kind");

/* The compiled backends: adding one is its files and one line here. */
static const hs_device_init_fn backends[HS_DEVICE_KIND_COUNT] = {
    [HS_DEVICE_CPU] = hs_device_cpu_init,
    [HS_DEVICE_REFERENCE] = hs_device_reference_init,
};

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
    return k >= 0 && k < HS_DEVICE_KIND_COUNT && backends[k] != NULL;
}

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
        return hs_error_set(e, HS_ERR_OOM, "cannot allocate the %s device object",
                            kind_names[kind]);
    hs_pool_init(&d->device_pool, "device");
    hs_pool_init(&d->host_pool, "host");
    d->trace = trace;
    backends[kind](d);
    const char *guard = getenv("HS_DEVICE_GUARD");
    if (guard && strcmp(guard, "1") == 0 && d->ops == &hs_ram_ops) hs_device_guard_install(d);
    d->stream = hs_stream_create(d);
    *out = d;
    return HS_OK;
}

void hs_device_free(hs_device *d) {
    if (d == NULL) return;
    hs_stream_free(d->stream);
    hs_mem_cache_free_all(d->cache);
    hs_device_guard_free(d);
    free(d);
}

hs_mem_cache_stats hs_device_mem_stats(hs_device *d) { return hs_mem_cache_stats_get(d->cache); }

hs_stream *hs_stream_create(hs_device *d) {
    hs_stream *s = malloc(sizeof *s);
    if (s == NULL) hs_oom("cannot allocate a stream of the %s device", d->name);
    s->dev = d;
    s->ctx = d->ops->stream_create(d);
    return s;
}

void hs_stream_free(hs_stream *s) {
    if (s == NULL) return;
    s->dev->ops->stream_destroy(s->dev, s->ctx);
    free(s);
}

hs_event *hs_event_create(hs_device *d) {
    hs_event *ev = malloc(sizeof *ev);
    if (ev == NULL) hs_oom("cannot allocate an event of the %s device", d->name);
    ev->dev = d;
    ev->ctx = d->ops->event_create(d);
    return ev;
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
