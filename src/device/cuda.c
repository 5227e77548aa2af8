/* The cuda backend: device memory from cudaMalloc under the caching
 * allocator, pinned host memory (mapped: a kernel may read it) under a
 * second one, copies and memsets on CUDA streams, events, the GPU chosen by
 * the process's local rank, and the kernel table over cuda_*.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cuda.h"

/* ------------------------------------------------------------ failures */

static void fail_cuda(hs_device *d, cudaError_t err, const char *what) {
    hs_error e;
    hs_error_clear(&e);
    hs_error_set(&e, err == cudaErrorMemoryAllocation ? HS_ERR_OOM : HS_ERR_INTERNAL,
                 "cuda device %d: %s failed: %s (%s)", ((hs_cuda_ctx *)d->ctx)->ordinal, what,
                 cudaGetErrorString(err), cudaGetErrorName(err));
    hs_device_fail(d, &e);
}

void hs_cuda_check(hs_stream *s, cudaError_t err, const char *what) {
    if (err != cudaSuccess) fail_cuda(s->dev, err, what);
}

static void set_current(hs_device *d) { cudaSetDevice(((hs_cuda_ctx *)d->ctx)->ordinal); }

cudaStream_t hs_cuda_stream(hs_stream *s) {
    set_current(s->dev);
    return (cudaStream_t)s->ctx;
}

/* -------------------------------------------------------------- memory */

/* The stream-ordered pool kernel scratch comes from keeps what it was
 * given; when cudaMalloc is refused, what it holds unused goes back to
 * the driver (cudaMemPoolTrimTo: no device-wide wait, unlike cudaFree,
 * which would wait for an NCCL kernel spinning on a peer) and the
 * allocation is tried once more, before the cache hands back its own free
 * lists. */
static void *gpu_raw_alloc(void *ctx, size_t bytes) {
    hs_device *d = ctx;
    void *p = NULL;
    set_current(d);
    if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
    (void)cudaGetLastError(); /* an allocation failure is reported as NULL, not kept */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, ((hs_cuda_ctx *)d->ctx)->ordinal) == cudaSuccess &&
        cudaMemPoolTrimTo(pool, 0) == cudaSuccess && cudaMalloc(&p, bytes) == cudaSuccess)
        return p;
    (void)cudaGetLastError();
    return NULL;
}

static void gpu_raw_free(void *ctx, void *p) {
    set_current(ctx);
    cudaFree(p);
}

static void *pinned_raw_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    set_current(ctx);
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void pinned_raw_free(void *ctx, void *p) { cudaFreeHost(p); }

/* Counted in the pool by the bytes asked for once the cache has them, as
 * ram.c counts. */
static void *cached_alloc(hs_mem_cache *c, hs_pool *pool, size_t bytes, const void *stream) {
    if (!hs_pool_fits(pool, bytes)) return NULL;
    void *p = hs_mem_cache_alloc_on(c, bytes, stream);
    if (p && !hs_pool_charge(pool, bytes)) {
        hs_mem_cache_free(c, p);
        p = NULL;
    }
    if (p) atomic_fetch_add(&pool->allocs, 1);
    return p;
}

/* A live piece of kernel scratch and the bytes it was charged. */
typedef struct scratch_piece {
    void *p;
    size_t bytes;
} scratch_piece;

/* Events kept for reuse: a collective on an NCCL group records one per
 * call (comm/collectives.c) and the caching allocator one per parked
 * block, so a step would otherwise create and destroy hundreds. */
#define IDLE_EVENTS_MAX 256

/* The pinned host memory's cache (the device pool's is d->cache), the
 * live kernel scratch, counted in the device pool, and the idle events
 * (taken on the issuing thread, given back on a communication thread). */
typedef struct cuda_state {
    hs_cuda_ctx pub;
    hs_mem_cache *pinned;
    pthread_mutex_t scratch_mu;
    scratch_piece *scratch;
    int n_scratch, cap_scratch;
    pthread_mutex_t event_mu;
    cudaEvent_t idle_events[IDLE_EVENTS_MAX];
    int n_idle_events;
} cuda_state;

static void *gpu_alloc(hs_device *d, size_t bytes, hs_stream *s) {
    return cached_alloc(d->cache, &d->device_pool, bytes, hs_device_stream_key(d, s));
}

static void gpu_free(hs_device *d, void *p) {
    hs_pool_uncharge(&d->device_pool, hs_mem_cache_free(d->cache, p));
}

static void *gpu_host_alloc(hs_device *d, size_t bytes) {
    return cached_alloc(((cuda_state *)d->ctx)->pinned, &d->host_pool, bytes, NULL);
}

static void gpu_host_free(hs_device *d, void *p) {
    hs_pool_uncharge(&d->host_pool, hs_mem_cache_free(((cuda_state *)d->ctx)->pinned, p));
}

static void gpu_memset(hs_stream *s, void *p, int value, size_t bytes) {
    if (bytes) hs_cuda_check(s, cudaMemsetAsync(p, value, bytes, hs_cuda_stream(s)), "memset");
}

static void gpu_copy(hs_stream *s, void *dst, const void *src, size_t bytes, hs_copy_kind kind) {
    if (bytes == 0 || dst == src) return;
    const char *d = dst, *sr = src;
    if (kind == HS_COPY_D2D && d < sr + bytes && sr < d + bytes) {
        /* cudaMemcpy leaves overlapping ranges undefined; the contract is
         * memmove's: through scratch */
        void *tmp = hs_cuda_scratch(s, bytes, "an overlapping device copy");
        if (tmp == NULL) return;
        cudaStream_t st = hs_cuda_stream(s);
        hs_cuda_check(s, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, st), "a copy");
        hs_cuda_check(s, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, st), "a copy");
        hs_cuda_scratch_free(s, tmp);
        return;
    }
    /* cudaMemcpyDefault: with unified addressing the runtime knows which
     * side each pointer is on, pageable or pinned host memory alike. */
    hs_cuda_check(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, hs_cuda_stream(s)),
                  "a copy");
    /* The host arrays of the layers above (batches, logits, checkpoint
     * pieces, staged collectives) are read or reused once the call
     * returns, so a copy with a host end completes here. */
    if (kind != HS_COPY_D2D)
        hs_cuda_check(s, cudaStreamSynchronize((cudaStream_t)s->ctx), "a host copy's wait");
}

/* ------------------------------------------------------ streams, events */

static void *gpu_stream_create(hs_device *d) {
    cudaStream_t st = NULL;
    set_current(d);
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return NULL;
    return st;
}

static void gpu_stream_destroy(hs_device *d, void *ctx) {
    set_current(d);
    cudaStreamDestroy((cudaStream_t)ctx);
}

/* An idle event when there is one. Reuse is safe: a stream's wait and a
 * query take the event's latest record at the time of the call, so a
 * record after the event came back here changes no earlier wait. */
static void *gpu_event_create(hs_device *d) {
    cuda_state *st = d->ctx;
    cudaEvent_t ev = NULL;
    pthread_mutex_lock(&st->event_mu);
    if (st->n_idle_events > 0) ev = st->idle_events[--st->n_idle_events];
    pthread_mutex_unlock(&st->event_mu);
    if (ev != NULL) return ev;
    set_current(d);
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return NULL;
    return ev;
}

static void gpu_event_destroy(hs_device *d, void *ctx) {
    cuda_state *st = d->ctx;
    pthread_mutex_lock(&st->event_mu);
    bool kept = st->n_idle_events < IDLE_EVENTS_MAX;
    if (kept) st->idle_events[st->n_idle_events++] = (cudaEvent_t)ctx;
    pthread_mutex_unlock(&st->event_mu);
    if (kept) return;
    set_current(d);
    cudaEventDestroy((cudaEvent_t)ctx);
}

static void gpu_event_record(hs_event *e, hs_stream *s) {
    hs_cuda_check(s, cudaEventRecord((cudaEvent_t)e->ctx, hs_cuda_stream(s)), "an event record");
}

static void gpu_stream_wait(hs_stream *s, hs_event *e) {
    hs_cuda_check(s, cudaStreamWaitEvent(hs_cuda_stream(s), (cudaEvent_t)e->ctx, 0),
                  "a stream's wait on an event");
}

static void gpu_event_synchronize(hs_event *e) {
    set_current(e->dev);
    cudaError_t err = cudaEventSynchronize((cudaEvent_t)e->ctx);
    if (err != cudaSuccess) fail_cuda(e->dev, err, "an event's wait");
}

/* cudaErrorNotReady is the answer "not yet"; any other failure is the
 * device's, recorded, and the event counts as done so nothing waits on a
 * broken device. */
static bool gpu_event_query(hs_event *e) {
    set_current(e->dev);
    cudaError_t err = cudaEventQuery((cudaEvent_t)e->ctx);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
    }
    if (err != cudaSuccess) fail_cuda(e->dev, err, "an event's query");
    return true;
}

static void gpu_stream_synchronize(hs_stream *s) {
    hs_cuda_check(s, cudaStreamSynchronize(hs_cuda_stream(s)), "a stream's wait");
}

static void gpu_synchronize(hs_device *d) {
    set_current(d);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) fail_cuda(d, err, "the device's wait");
}

static void gpu_destroy(hs_device *d) {
    cuda_state *st = d->ctx;
    if (st == NULL) return;
    set_current(d);
    cudaDeviceSynchronize();
    hs_cuda_gemm_free(d);
    hs_cuda_attention_free(d);
    hs_mem_cache_free_all(st->pinned);
    for (int i = 0; i < st->n_idle_events; i++) cudaEventDestroy(st->idle_events[i]);
    pthread_mutex_destroy(&st->event_mu);
    pthread_mutex_destroy(&st->scratch_mu);
    free(st->scratch);
    free(st);
    d->ctx = NULL;
}

static const hs_device_ops cuda_ops = {
    .alloc = gpu_alloc,
    .free = gpu_free,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .memset = gpu_memset,
    .copy = gpu_copy,
    .stream_create = gpu_stream_create,
    .stream_destroy = gpu_stream_destroy,
    .event_create = gpu_event_create,
    .event_destroy = gpu_event_destroy,
    .event_record = gpu_event_record,
    .event_query = gpu_event_query,
    .stream_wait = gpu_stream_wait,
    .event_synchronize = gpu_event_synchronize,
    .stream_synchronize = gpu_stream_synchronize,
    .synchronize = gpu_synchronize,
    .destroy = gpu_destroy,
};

/* ------------------------------------------------- scratch and scalars */

/* Records a live piece (false: its table could not grow). */
static bool scratch_note(cuda_state *st, void *p, size_t bytes) {
    pthread_mutex_lock(&st->scratch_mu);
    bool ok = true;
    if (st->n_scratch == st->cap_scratch) {
        int cap = st->cap_scratch ? 2 * st->cap_scratch : 16;
        scratch_piece *t = realloc(st->scratch, (size_t)cap * sizeof *t);
        if (t) st->scratch = t, st->cap_scratch = cap;
        else ok = false;
    }
    if (ok) st->scratch[st->n_scratch++] = (scratch_piece){p, bytes};
    pthread_mutex_unlock(&st->scratch_mu);
    return ok;
}

/* The bytes p was charged, and p forgotten. */
static size_t scratch_forget(cuda_state *st, void *p) {
    size_t bytes = 0;
    pthread_mutex_lock(&st->scratch_mu);
    for (int i = st->n_scratch - 1; i >= 0; i--)
        if (st->scratch[i].p == p) {
            bytes = st->scratch[i].bytes;
            st->scratch[i] = st->scratch[--st->n_scratch];
            break;
        }
    pthread_mutex_unlock(&st->scratch_mu);
    return bytes;
}

/* Kernel scratch is device memory like the rest: charged to the device
 * pool (its limit bounds it; peak_device_bytes counts it) while live. */
void *hs_cuda_scratch(hs_stream *s, size_t bytes, const char *what) {
    hs_device *d = s->dev;
    void *p = NULL;
    if (!hs_pool_charge(&d->device_pool, bytes)) {
        hs_kernel_oom(s,
                      "cuda device %d: %zu bytes of scratch for %s: over the device pool's limit",
                      hs_cuda_ctx_of(s)->ordinal, bytes, what);
        return NULL;
    }
    cudaError_t err = cudaMallocAsync(&p, bytes ? bytes : 1, hs_cuda_stream(s));
    if (err == cudaSuccess && scratch_note(d->ctx, p, bytes)) return p;
    if (err == cudaSuccess) hs_cuda_check(s, cudaFreeAsync(p, hs_cuda_stream(s)), "a scratch free");
    else (void)cudaGetLastError();
    hs_pool_uncharge(&d->device_pool, bytes);
    hs_kernel_oom(s, "cuda device %d: %zu bytes of scratch for %s", hs_cuda_ctx_of(s)->ordinal,
                  bytes, what);
    return NULL;
}

void hs_cuda_scratch_free(hs_stream *s, void *p) {
    if (!p) return;
    hs_cuda_check(s, cudaFreeAsync(p, hs_cuda_stream(s)), "a scratch free");
    hs_pool_uncharge(&s->dev->device_pool, scratch_forget(s->dev->ctx, p));
}

void hs_cuda_to_host(hs_stream *s, void *dst, const void *src, size_t bytes) {
    cudaStream_t st = hs_cuda_stream(s);
    hs_cuda_check(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st), "a scalar copy");
    hs_cuda_check(s, cudaStreamSynchronize(st), "a scalar copy's wait");
}

/* ---------------------------------------------------------------- table */

/* Every entry of the list, each hs_cuda_<name> (cuda.h). */
#define HS_CUDA_ENTRY(name, params, args, devs) .name = hs_cuda_##name,
static const hs_device_kernels cuda_kernels = {HS_DEVICE_KERNEL_LIST(HS_CUDA_ENTRY)};
#undef HS_CUDA_ENTRY

const hs_device_kernels *hs_device_cuda_kernels(void) { return &cuda_kernels; }

/* ----------------------------------------------------------------- init */

/* The process's rank among those of its host, from the launcher's
 * environment (Open MPI, MPICH / Intel MPI, Slurm, torchrun); 0 alone. */
static int local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

hs_status hs_device_cuda_init(hs_device *d, hs_error *e) {
    d->kind = HS_DEVICE_CUDA;
    d->name = "cuda";
    d->host_visible = false;
    if (hs_cuda_attention_env_check(e) != HS_OK) return e->code;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.device: cuda: no CUDA device is visible to this process "
                            "(%s); check the driver and CUDA_VISIBLE_DEVICES, or set "
                            "accelerator.device: cpu",
                            err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    cuda_state *st = calloc(1, sizeof *st);
    if (st == NULL) return hs_error_oom(e, "the cuda device's state: %zu bytes", sizeof *st);
    d->ctx = st;
    pthread_mutex_init(&st->scratch_mu, NULL);
    pthread_mutex_init(&st->event_mu, NULL);
    d->ops = &cuda_ops;
    d->k = &cuda_kernels;
    hs_cuda_ctx *c = &st->pub;
    /* Several ranks of a host share its GPUs round robin: one GPU per rank
     * when there are enough, several ranks on one otherwise. */
    c->ordinal = local_rank() % count;
    d->ordinal = c->ordinal;
    struct cudaDeviceProp prop;
    if ((err = cudaSetDevice(c->ordinal)) != cudaSuccess ||
        (err = cudaGetDeviceProperties(&prop, c->ordinal)) != cudaSuccess)
        return hs_error_set(e, HS_ERR_CONFIG, "accelerator.device: cuda: GPU %d cannot be used: %s",
                            c->ordinal, cudaGetErrorString(err));
    c->cc_major = prop.major, c->cc_minor = prop.minor;
    /* the name is at most 256 bytes; the datasheet match needs its start */
    memcpy(d->model, prop.name, sizeof d->model - 1);
    d->model[sizeof d->model - 1] = '\0';
    c->sm_count = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    if (prop.major < 8)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.device: cuda: GPU %d (%s) has compute capability %d.%d; "
                            "this build needs 8.0 or later (Ampere, Hopper)",
                            c->ordinal, prop.name, prop.major, prop.minor);
    const char *tf32 = getenv("HS_CUDA_TF32");
    c->tf32 = tf32 && strcmp(tf32, "1") == 0;
    /* Kernel scratch comes from the stream-ordered pool: it keeps what it
     * was given, so the step allocates from the driver only at first. */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, c->ordinal) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    hs_status s = hs_mem_cache_create("device pool", gpu_raw_alloc, gpu_raw_free, d, &d->cache, e);
    if (s == HS_OK)
        s = hs_mem_cache_create("pinned host pool", pinned_raw_alloc, pinned_raw_free, d,
                                &st->pinned, e);
    if (s == HS_OK) s = hs_cuda_gemm_init(d, e);
    if (s == HS_OK) hs_cuda_attention_init(d);
    return s;
}
