/* The guard: device memory the host cannot touch. With HS_DEVICE_GUARD=1
 * the cpu and reference devices place device memory (hs_device_alloc) in
 * page-aligned mappings kept PROT_NONE while the host runs, and open them
 * only inside the device's own members: every kernel, memset and copy. A
 * read or write of device memory from above the seam (a host loop, a
 * memcpy, a tensor/ call) then faults at once, where on a GPU it would read
 * garbage or crash later; what passes under the guard runs unchanged on a
 * backend whose memory the host cannot address. One process only: the mpi
 * group reads device buffers on its communication thread, as host-staged
 * MPI cannot on a GPU (NCCL's groups will take device pointers). Slow
 * (every call re-protects every live mapping): a test tool, not a mode to
 * train in. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device/device_backend.h"

typedef struct region {
    void *p;
    size_t bytes;
} region;

struct hs_device_guard {
    const hs_device_ops *ops; /* the backend's own tables */
    const hs_device_kernels *k;
    hs_device_ops guarded_ops;
    hs_device_kernels guarded_k;
    pthread_mutex_t mu;
    int depth; /* nested members: the mappings close when the outermost returns */
    region *r;
    size_t n, cap;
};

static void protect_all(hs_device_guard *g, int prot)
{
    for (size_t i = 0; i < g->n; i++)
        if (mprotect(g->r[i].p, g->r[i].bytes, prot) != 0)
            hs_panic("device guard: mprotect of %zu bytes failed", g->r[i].bytes);
}

static void open_memory(hs_device_guard *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->depth++ == 0) protect_all(g, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g->mu);
}

static void close_memory(hs_device_guard *g)
{
    pthread_mutex_lock(&g->mu);
    if (--g->depth == 0) protect_all(g, PROT_NONE);
    pthread_mutex_unlock(&g->mu);
}

static size_t page_round(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

static void *guard_raw_alloc(void *ctx, size_t bytes)
{
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    size_t len = page_round(bytes ? bytes : 1);
    pthread_mutex_lock(&g->mu);
    int prot = g->depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = NULL;
    if (p && g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        region *r = realloc(g->r, cap * sizeof *r);
        if (!r) hs_oom("device guard: %zu mapping records", cap);
        g->r = r, g->cap = cap;
    }
    if (p) g->r[g->n++] = (region){p, len};
    pthread_mutex_unlock(&g->mu);
    return p;
}

static void guard_raw_free(void *ctx, void *p)
{
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->n; i++) {
        if (g->r[i].p != p) continue;
        munmap(p, g->r[i].bytes);
        g->r[i] = g->r[--g->n];
        break;
    }
    pthread_mutex_unlock(&g->mu);
}

static void guarded_memset(hs_stream *s, void *p, int value, size_t bytes)
{
    hs_device_guard *g = s->dev->guard;
    open_memory(g);
    g->ops->memset(s, p, value, bytes);
    close_memory(g);
}

static void guarded_copy(hs_stream *s, void *dst, const void *src, size_t bytes, hs_copy_kind kind)
{
    hs_device_guard *g = s->dev->guard;
    open_memory(g);
    g->ops->copy(s, dst, src, bytes, kind);
    close_memory(g);
}

/* Every kernel of the table, as (name, parameters, arguments). */
#define HS_GUARDED_KERNELS(X) \
    X(gemm, (hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g), (s, C, A, B, g)) \
    X(convert, (hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n), (s, dst, dst_dt, src, src_dt, n)) \
    X(convert_scaled, (hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a, int64_t n), (s, dst, src, src_dt, a, n)) \
    X(fill, (hs_stream *s, float *x, float v, int64_t n), (s, x, v, n)) \
    X(rng_normal, (hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t offset, float mean, float std), (s, x, n, seed, stream, offset, mean, std)) \
    X(axpy, (hs_stream *s, float *y, const float *x, float a, int64_t n), (s, y, x, a, n)) \
    X(scale, (hs_stream *s, float *x, float a, int64_t n), (s, x, a, n)) \
    X(add, (hs_stream *s, float *y, const float *x, int64_t n), (s, y, x, n)) \
    X(add_to_zero, (hs_stream *s, float *y, const float *x, int64_t n), (s, y, x, n)) \
    X(sumsq, (hs_stream *s, double *out, const float *x, int64_t n), (s, out, x, n)) \
    X(round, (hs_stream *s, float *x, hs_dtype dt, int64_t n), (s, x, dt, n)) \
    X(add_cast, (hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt, const void *b, hs_dtype bdt, int64_t n), (s, out, odt, a, adt, b, bdt, n)) \
    X(rmsnorm_fwd, (hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt, const void *w, hs_dtype dt, int64_t N, int C, float eps), (s, out, rstd, x, xdt, w, dt, N, C, eps)) \
    X(rmsnorm_bwd, (hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout, const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt, int64_t N, int C, double *ws), (s, dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, ws)) \
    X(rope_tables, (hs_stream *s, float *cos_t, float *sin_t, int T, int HD, double theta), (s, cos_t, sin_t, T, HD, theta)) \
    X(rope_fwd, (hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t, int B, int T, int H, int HD), (s, x, dt, cos_t, sin_t, B, T, H, HD)) \
    X(rope_bwd, (hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int HD), (s, dx, cos_t, sin_t, B, T, H, HD)) \
    X(swiglu_fwd, (hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt, int64_t n), (s, out, gate, up, dt, n)) \
    X(swiglu_bwd, (hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout, const void *gate, const void *up, hs_dtype dt, int64_t n), (s, dgate, dup, overwrite, dout, gate, up, dt, n)) \
    X(attention_fwd, (hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q, const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD, const hs_att_rows *r, const hs_att_work *w), (s, out, odt, lse, q, k, v, dt, B, NH, KVH, HD, r, w)) \
    X(attention_bwd, (hs_stream *s, float *dq, float *dk, float *dv, const float *dout, const void *out, hs_dtype odt, const void *q, const void *k, const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH, int HD, const hs_att_rows *r, const hs_att_work *w), (s, dq, dk, dv, dout, out, odt, q, k, v, lse, dt, B, NH, KVH, HD, r, w)) \
    X(xent, (hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits, const int32_t *targets, int64_t N, int V, float scale), (s, loss, valid, dlogits, logits, targets, N, V, scale)) \
    X(xent_shard_max, (hs_stream *s, float *row_max, const float *logits, int64_t N, int V), (s, row_max, logits, N, V)) \
    X(xent_shard_sums, (hs_stream *s, float *row_sumexp, float *row_target, const float *logits, const float *gmax, const int32_t *targets, int64_t N, int V, int64_t v0), (s, row_sumexp, row_target, logits, gmax, targets, N, V, v0)) \
    X(xent_shard_grad, (hs_stream *s, float *logits, const float *gmax, const float *row_sumexp, const int32_t *targets, int64_t N, int V, int64_t v0, float scale), (s, logits, gmax, row_sumexp, targets, N, V, v0, scale)) \
    X(embedding_fwd, (hs_stream *s, void *out, const int32_t *tokens, const void *wte, hs_dtype dt, int64_t N, int C), (s, out, tokens, wte, dt, N, C)) \
    X(embedding_bwd, (hs_stream *s, void *dwte, hs_dtype gdt, const float *dout, const int32_t *tokens, int64_t N, int C), (s, dwte, gdt, dout, tokens, N, C)) \
    X(moe_route, (hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N, int E, int K, bool renorm, hs_dtype dt), (s, expert, weight, probs, N, E, K, renorm, dt)) \
    X(moe_permute, (hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt, int64_t N, int K, int C), (s, xg, x, row_pair, dt, N, K, C)) \
    X(moe_unpermute, (hs_stream *s, float *out, const void *y, hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N, int K, int C, float *ws), (s, out, y, dt, pair_row, weight, N, K, C, ws)) \
    X(moe_combine_bwd, (hs_stream *s, float *dyg, float *dw, const float *dout, const void *y, hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N, int K, int C, float *ws), (s, dyg, dw, dout, y, dt, pair_row, weight, N, K, C, ws)) \
    X(moe_route_bwd, (hs_stream *s, float *dp, const float *probs, const int32_t *expert, const float *dw, const float *aux_grad, int64_t N, int E, int K), (s, dp, probs, expert, dw, aux_grad, N, E, K)) \
    X(moe_stats, (hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert, const float *probs, int64_t N, int E, int K), (s, count, prob_sum, expert, probs, N, E, K)) \
    X(moe_stats_add, (hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in, const double *prob_sum_in, int E), (s, count, prob_sum, count_in, prob_sum_in, E)) \
    X(moe_dispatch, (hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row, const int32_t *expert, const int64_t *count, int64_t N, int E, int K), (s, offset, row_pair, pair_row, expert, count, N, E, K)) \
    X(adamw, (hs_stream *s, float *p, float *m, float *v, const float *g, const hs_adamw_hparams *h, int64_t n), (s, p, m, v, g, h, n)) \
    X(muon_momentum, (hs_stream *s, float *dir, float *buf, const float *g, float mu, bool nesterov, int64_t n), (s, dir, buf, g, mu, nesterov, n)) \
    X(muon_newton_schulz, (hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols, int steps, float *ws), (s, out, g, rows, cols, steps, ws)) \
    X(copy_2d, (hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride, int64_t rows, size_t row_bytes), (s, dst, dst_stride, src, src_stride, rows, row_bytes))

#define GUARDED(name, params, args)                                            \
    static void guarded_##name params                                          \
    {                                                                          \
        hs_device_guard *guard_ = s->dev->guard; /* `g` is a kernel argument */ \
        open_memory(guard_);                                                   \
        guard_->k->name args;                                                  \
        close_memory(guard_);                                                  \
    }
HS_GUARDED_KERNELS(GUARDED)
#undef GUARDED

#define ONE(name, params, args) +1
_Static_assert(0 HS_GUARDED_KERNELS(ONE) == sizeof(hs_device_kernels) / sizeof(void (*)(void)),
               "the guard wraps every member of hs_device_kernels");
#undef ONE

void hs_device_guard_install(hs_device *d)
{
    hs_device_guard *g = calloc(1, sizeof *g);
    if (!g) hs_oom("device guard: its state");
    pthread_mutex_init(&g->mu, NULL);
    g->ops = d->ops, g->k = d->k;
    g->guarded_ops = *d->ops;
    g->guarded_ops.memset = guarded_memset;
    g->guarded_ops.copy = guarded_copy;
    g->guarded_k = *d->k;
#define SET(name, params, args) \
    if (g->k->name) g->guarded_k.name = guarded_##name;
    HS_GUARDED_KERNELS(SET)
#undef SET
    d->guard = g;
    d->ops = &g->guarded_ops;
    d->k = &g->guarded_k;
    hs_mem_cache_free_all(d->cache);
    d->cache = hs_mem_cache_create("device pool (guarded)", guard_raw_alloc, guard_raw_free, d);
}

void hs_device_guard_free(hs_device *d)
{
    hs_device_guard *g = d->guard;
    if (!g) return;
    free(g->r);
    pthread_mutex_destroy(&g->mu);
    free(g);
    d->guard = NULL;
}
