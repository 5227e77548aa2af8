/* The guard: device memory the host cannot touch. With HS_DEVICE_GUARD=1
 * the cpu and reference devices place device memory (hs_device_alloc) in
 * page-aligned mappings kept PROT_NONE while the host runs, and open them
 * only inside the device's own members: every kernel, memset and copy. A
 * read or write of device memory from above the seam (a host loop, a
 * memcpy, a tensor/ call) then faults at once, where on a GPU it would read
 * garbage or crash later; what passes under the guard runs unchanged on a
 * backend whose memory the host cannot address. Device memory comes from
 * one reserved arena, so opening and closing it is one mprotect each; the
 * mpi group opens it while it moves a stream's buffers
 * (hs_device_host_access_begin). A test tool, not a mode to train in. */
#include <pthread.h>
#include <stdio.h>
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
    int depth;   /* nested members: the mappings close when the outermost returns */
    char *arena; /* arena_bytes reserved, PROT_NONE while closed */
    size_t arena_bytes;
    size_t arena_used; /* bytes handed out from the arena's start */
    region *r;         /* live device blocks */
    size_t n, cap;
    region *spare; /* freed blocks, reused first fit */
    size_t n_spare, cap_spare;
    region *host; /* host-pool blocks */
    size_t n_host, cap_host;
};

/* Address space only (MAP_NORESERVE): pages exist once written. */
#define ARENA_BYTES ((size_t)1 << 38)

static void protect_all(hs_device_guard *g, int prot) {
    if (g->arena_used && mprotect(g->arena, g->arena_used, prot) != 0)
        hs_panic("device guard: mprotect of %zu bytes failed", g->arena_used);
}

static void open_memory(hs_device_guard *g) {
    pthread_mutex_lock(&g->mu);
    if (g->depth++ == 0) protect_all(g, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g->mu);
}

static void close_memory(hs_device_guard *g) {
    pthread_mutex_lock(&g->mu);
    if (--g->depth == 0) protect_all(g, PROT_NONE);
    pthread_mutex_unlock(&g->mu);
}

/* Room for one more record: false when the list could not grow. */
static bool room(region **r, size_t *n, size_t *cap) {
    if (*n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 64;
    region *v = realloc(*r, c * sizeof *v);
    if (!v) return false;
    *r = v, *cap = c;
    return true;
}

/* False (nothing recorded) when the list could not grow. */
static bool record(region **r, size_t *n, size_t *cap, void *p, size_t bytes) {
    if (!room(r, n, cap)) return false;
    (*r)[(*n)++] = (region){p, bytes};
    return true;
}

/* Drops p's record; returns its bytes (0: not recorded). */
static size_t forget(region *r, size_t *n, const void *p) {
    for (size_t i = 0; i < *n; i++) {
        if (r[i].p != p) continue;
        size_t bytes = r[i].bytes;
        r[i] = r[--*n];
        return bytes;
    }
    return 0;
}

static size_t page_round(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

/* Under g->mu: a freed block of at least len bytes (its length in *len),
 * or the arena's next pages. */
static void *take(hs_device_guard *g, size_t *len) {
    for (size_t i = 0; i < g->n_spare; i++) {
        if (g->spare[i].bytes < *len) continue;
        region b = g->spare[i];
        g->spare[i] = g->spare[--g->n_spare];
        *len = b.bytes;
        return b.p;
    }
    if (*len > g->arena_bytes - g->arena_used) return NULL;
    char *p = g->arena + g->arena_used;
    g->arena_used += *len;
    if (g->depth > 0 && mprotect(p, *len, PROT_READ | PROT_WRITE) != 0)
        hs_panic("device guard: mprotect of %zu bytes failed", *len);
    return p;
}

static void *guard_raw_alloc(void *ctx, size_t bytes) {
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    size_t len = page_round(bytes ? bytes : 1);
    pthread_mutex_lock(&g->mu);
    /* Room for its record first: a block the guard does not know of would
     * read as host memory. */
    void *p = room(&g->r, &g->n, &g->cap) ? take(g, &len) : NULL;
    if (p) record(&g->r, &g->n, &g->cap, p, len);
    pthread_mutex_unlock(&g->mu);
    return p;
}

/* The pages go back to the system; the addresses stay reserved (and are
 * not reused when the spare list cannot grow). */
static void guard_raw_free(void *ctx, void *p) {
    hs_device_guard *g = ((hs_device *)ctx)->guard;
    pthread_mutex_lock(&g->mu);
    size_t len = forget(g->r, &g->n, p);
    if (len) {
        madvise(p, len, MADV_DONTNEED);
        record(&g->spare, &g->n_spare, &g->cap_spare, p, len);
    }
    pthread_mutex_unlock(&g->mu);
}

static bool in_any(const region *r, size_t n, const char *c) {
    for (size_t i = 0; i < n; i++)
        if (c >= (const char *)r[i].p && c < (const char *)r[i].p + r[i].bytes) return true;
    return false;
}

/* Whether p lies in a live mapping of device memory, or (with pinned) in
 * host-pool memory, which a GPU's kernels may read as pinned memory (the
 * offloaded optimizer). */
static bool in_device(hs_device_guard *g, const void *p, bool pinned) {
    pthread_mutex_lock(&g->mu);
    bool found = in_any(g->r, g->n, p) || (pinned && in_any(g->host, g->n_host, p));
    pthread_mutex_unlock(&g->mu);
    return found;
}

/* Each non-NULL argument of `dev` must be device memory. */
static void need_device(hs_device_guard *g, const char *op, const char *names, const void *const *p,
                        size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] && !in_device(g, p[i], true))
            hs_panic("device guard: %s: argument %zu of %s is host memory (%p), not device "
                     "memory: copy it across with hs_device_copy first",
                     op, i + 1, names, p[i]);
}

static void *guarded_host_alloc(hs_device *d, size_t bytes) {
    hs_device_guard *g = d->guard;
    void *p = g->ops->host_alloc(d, bytes);
    pthread_mutex_lock(&g->mu);
    bool known = p && record(&g->host, &g->n_host, &g->cap_host, p, bytes);
    pthread_mutex_unlock(&g->mu);
    if (p && !known) g->ops->host_free(d, p), p = NULL;
    return p;
}

static void guarded_host_free(hs_device *d, void *p) {
    hs_device_guard *g = d->guard;
    pthread_mutex_lock(&g->mu);
    forget(g->host, &g->n_host, p);
    pthread_mutex_unlock(&g->mu);
    g->ops->host_free(d, p);
}

static void guarded_memset(hs_stream *s, void *p, int value, size_t bytes) {
    hs_device_guard *g = s->dev->guard;
    if (bytes && !in_device(g, p, true))
        hs_panic("device guard: memset of %zu bytes of host memory", bytes);
    open_memory(g);
    g->ops->memset(s, p, value, bytes);
    close_memory(g);
}

static void guarded_copy(hs_stream *s, void *dst, const void *src, size_t bytes,
                         hs_copy_kind kind) {
    hs_device_guard *g = s->dev->guard;
    static const char *const kinds[] = {"H2D", "D2H", "D2D"};
    bool dst_ok = in_device(g, dst, false) == (kind != HS_COPY_D2H);
    bool src_ok = in_device(g, src, false) == (kind != HS_COPY_H2D);
    if (bytes && (!dst_ok || !src_ok))
        hs_panic("device guard: a %s copy of %zu bytes from %s memory to %s memory", kinds[kind],
                 bytes, in_device(g, src, false) ? "device" : "host",
                 in_device(g, dst, false) ? "device" : "host");
    open_memory(g);
    g->ops->copy(s, dst, src, bytes, kind);
    close_memory(g);
}

/* Every kernel of the table, as (name, parameters, arguments, the
 * arguments that are device memory). The others are host values: shapes,
 * hyperparameters and workspaces described by host structs, and the scalar
 * results of reductions (xent's loss and valid count, xent_shard_loss's
 * loss, sumsq's sum), which a backend hands back in host memory. */
#define HS_GUARDED_KERNELS(X)                                                                      \
    X(gemm, (hs_stream * s, void *C, const void *A, const void *B, const hs_gemm_shape *g),        \
      (s, C, A, B, g), (C, A, B))                                                                  \
    X(convert,                                                                                     \
      (hs_stream * s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n),    \
      (s, dst, dst_dt, src, src_dt, n), (dst, src))                                                \
    X(convert_scaled,                                                                              \
      (hs_stream * s, float *dst, const void *src, hs_dtype src_dt, float a, int64_t n),           \
      (s, dst, src, src_dt, a, n), (dst, src))                                                     \
    X(fill, (hs_stream * s, float *x, float v, int64_t n), (s, x, v, n), (x))                      \
    X(rng_normal,                                                                                  \
      (hs_stream * s, float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,         \
       float mean, float std),                                                                     \
      (s, x, n, seed, stream, offset, mean, std), (x))                                             \
    X(axpy, (hs_stream * s, float *y, const float *x, float a, int64_t n), (s, y, x, a, n),        \
      (y, x))                                                                                      \
    X(scale, (hs_stream * s, float *x, float a, int64_t n), (s, x, a, n), (x))                     \
    X(add, (hs_stream * s, float *y, const float *x, int64_t n), (s, y, x, n), (y, x))             \
    X(add_to_zero, (hs_stream * s, float *y, const float *x, int64_t n), (s, y, x, n), (y, x))     \
    X(sumsq, (hs_stream * s, double *out, const float *x, int64_t n), (s, out, x, n), (x))         \
    X(round, (hs_stream * s, float *x, hs_dtype dt, int64_t n), (s, x, dt, n), (x))                \
    X(add_cast,                                                                                    \
      (hs_stream * s, void *out, hs_dtype odt, const void *a, hs_dtype adt, const void *b,         \
       hs_dtype bdt, int64_t n),                                                                   \
      (s, out, odt, a, adt, b, bdt, n), (out, a, b))                                               \
    X(scale_cast, (hs_stream * s, void *x, hs_dtype dt, float a, int64_t n), (s, x, dt, a, n),     \
      (x))                                                                                         \
    X(rmsnorm_fwd,                                                                                 \
      (hs_stream * s, void *out, float *rstd, const void *x, hs_dtype xdt, const void *w,          \
       hs_dtype dt, int64_t N, int C, float eps),                                                  \
      (s, out, rstd, x, xdt, w, dt, N, C, eps), (out, rstd, x, w))                                 \
    X(rmsnorm_bwd,                                                                                 \
      (hs_stream * s, float *dx, void *dw, hs_dtype gdt, const float *dout, const void *x,         \
       hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt, int64_t N, int C, double *ws), \
      (s, dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, ws), (dx, dw, dout, x, w, rstd, ws))       \
    X(rope_tables, (hs_stream * s, float *cos_t, float *sin_t, int T, int HD, double theta),       \
      (s, cos_t, sin_t, T, HD, theta), (cos_t, sin_t))                                             \
    X(rope_fwd,                                                                                    \
      (hs_stream * s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t, int B, int T,  \
       int H, int HD),                                                                             \
      (s, x, dt, cos_t, sin_t, B, T, H, HD), (x, cos_t, sin_t))                                    \
    X(rope_bwd,                                                                                    \
      (hs_stream * s, float *dx, const float *cos_t, const float *sin_t, int B, int T, int H,      \
       int HD),                                                                                    \
      (s, dx, cos_t, sin_t, B, T, H, HD), (dx, cos_t, sin_t))                                      \
    X(swiglu_fwd,                                                                                  \
      (hs_stream * s, void *out, const void *gate, const void *up, hs_dtype dt, int64_t n),        \
      (s, out, gate, up, dt, n), (out, gate, up))                                                  \
    X(swiglu_bwd,                                                                                  \
      (hs_stream * s, float *dgate, float *dup, bool overwrite, const float *dout,                 \
       const void *gate, const void *up, hs_dtype dt, int64_t n),                                  \
      (s, dgate, dup, overwrite, dout, gate, up, dt, n), (dgate, dup, dout, gate, up))             \
    X(attention_fwd,                                                                               \
      (hs_stream * s, void *out, hs_dtype odt, float *lse, const void *q, const void *k,           \
       const void *v, hs_dtype dt, int B, int NH, int KVH, int HD, const hs_att_rows *r,           \
       const hs_att_work *w),                                                                      \
      (s, out, odt, lse, q, k, v, dt, B, NH, KVH, HD, r, w), (out, lse, q, k, v))                  \
    X(attention_bwd,                                                                               \
      (hs_stream * s, float *dq, float *dk, float *dv, const float *dout, const void *out,         \
       hs_dtype odt, const void *q, const void *k, const void *v, const float *lse, hs_dtype dt,   \
       int B, int NH, int KVH, int HD, const hs_att_rows *r, const hs_att_work *w),                \
      (s, dq, dk, dv, dout, out, odt, q, k, v, lse, dt, B, NH, KVH, HD, r, w),                     \
      (dq, dk, dv, dout, out, q, k, v, lse))                                                       \
    X(attention_merge,                                                                             \
      (hs_stream * s, float *out, float *lse, const float *bout, const float *blse, int B, int NH, \
       int HD, const hs_att_rows *r),                                                              \
      (s, out, lse, bout, blse, B, NH, HD, r), (out, lse, bout, blse))                             \
    X(xent,                                                                                        \
      (hs_stream * s, double *loss, int64_t *valid, float *dlogits, const float *logits,           \
       const int32_t *targets, int64_t N, int V, float scale),                                     \
      (s, loss, valid, dlogits, logits, targets, N, V, scale), (dlogits, logits, targets))         \
    X(xent_shard_max, (hs_stream * s, float *row_max, const float *logits, int64_t N, int V),      \
      (s, row_max, logits, N, V), (row_max, logits))                                               \
    X(xent_shard_sums,                                                                             \
      (hs_stream * s, float *row_sumexp, float *row_target, const float *logits,                   \
       const float *gmax, const int32_t *targets, int64_t N, int V, int64_t v0),                   \
      (s, row_sumexp, row_target, logits, gmax, targets, N, V, v0),                                \
      (row_sumexp, row_target, logits, gmax, targets))                                             \
    X(xent_shard_grad,                                                                             \
      (hs_stream * s, float *logits, const float *gmax, const float *row_sumexp,                   \
       const int32_t *targets, int64_t N, int V, int64_t v0, float scale),                         \
      (s, logits, gmax, row_sumexp, targets, N, V, v0, scale),                                     \
      (logits, gmax, row_sumexp, targets))                                                         \
    X(xent_shard_loss,                                                                             \
      (hs_stream * s, double *loss, const float *gmax, const float *row_sumexp,                    \
       const float *row_target, const int32_t *targets, int64_t N),                                \
      (s, loss, gmax, row_sumexp, row_target, targets, N),                                         \
      (gmax, row_sumexp, row_target, targets))                                                     \
    X(embedding_fwd,                                                                               \
      (hs_stream * s, void *out, hs_dtype odt, const int32_t *tokens, const void *wte,             \
       hs_dtype dt, int64_t N, int C, int64_t v0, int V),                                          \
      (s, out, odt, tokens, wte, dt, N, C, v0, V), (out, tokens, wte))                             \
    X(embedding_bwd,                                                                               \
      (hs_stream * s, void *dwte, hs_dtype gdt, const float *dout, const int32_t *tokens,          \
       int64_t N, int C, int64_t v0, int V),                                                       \
      (s, dwte, gdt, dout, tokens, N, C, v0, V), (dwte, dout, tokens))                             \
    X(moe_route,                                                                                   \
      (hs_stream * s, int32_t * expert, float *weight, float *probs, int64_t N, int E, int K,      \
       bool renorm, hs_dtype dt),                                                                  \
      (s, expert, weight, probs, N, E, K, renorm, dt), (expert, weight, probs))                    \
    X(moe_permute,                                                                                 \
      (hs_stream * s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt, int64_t N,    \
       int K, int C),                                                                              \
      (s, xg, x, row_pair, dt, N, K, C), (xg, x, row_pair))                                        \
    X(moe_permute_bwd,                                                                             \
      (hs_stream * s, float *dx, const float *dxg, const int32_t *row_pair, int64_t N, int K,      \
       int C),                                                                                     \
      (s, dx, dxg, row_pair, N, K, C), (dx, dxg, row_pair))                                        \
    X(moe_unpermute,                                                                               \
      (hs_stream * s, float *out, const void *y, hs_dtype dt, const int32_t *pair_row,             \
       const float *weight, int64_t N, int K, int C, float *ws),                                   \
      (s, out, y, dt, pair_row, weight, N, K, C, ws), (out, y, pair_row, weight, ws))              \
    X(moe_combine_bwd,                                                                             \
      (hs_stream * s, float *dyg, float *dw, const float *dout, const void *y, hs_dtype dt,        \
       const int32_t *pair_row, const float *weight, int64_t N, int K, int C, float *ws),          \
      (s, dyg, dw, dout, y, dt, pair_row, weight, N, K, C, ws),                                    \
      (dyg, dw, dout, y, pair_row, weight, ws))                                                    \
    X(moe_route_bwd,                                                                               \
      (hs_stream * s, float *dp, const float *probs, const int32_t *expert, const float *dw,       \
       const float *aux_grad, int64_t N, int E, int K, bool renorm),                               \
      (s, dp, probs, expert, dw, aux_grad, N, E, K, renorm), (dp, probs, expert, dw, aux_grad))    \
    X(moe_stats,                                                                                   \
      (hs_stream * s, int64_t * count, double *prob_sum, const int32_t *expert,                    \
       const float *probs, int64_t N, int E, int K),                                               \
      (s, count, prob_sum, expert, probs, N, E, K), (count, prob_sum, expert, probs))              \
    X(moe_stats_add,                                                                               \
      (hs_stream * s, int64_t * count, double *prob_sum, const int64_t *count_in,                  \
       const double *prob_sum_in, int E),                                                          \
      (s, count, prob_sum, count_in, prob_sum_in, E), (count, prob_sum, count_in, prob_sum_in))    \
    X(moe_dispatch,                                                                                \
      (hs_stream * s, int32_t * offset, int32_t * row_pair, int32_t * pair_row,                    \
       const int32_t *expert, const int64_t *count, int64_t N, int E, int K),                      \
      (s, offset, row_pair, pair_row, expert, count, N, E, K),                                     \
      (offset, row_pair, pair_row, expert, count))                                                 \
    X(adamw,                                                                                       \
      (hs_stream * s, void *p, hs_dtype pdt, float *m, float *v, const float *g,                   \
       const hs_adamw_hparams *h, int64_t n),                                                      \
      (s, p, pdt, m, v, g, h, n), (p, m, v, g))                                                    \
    X(muon_momentum,                                                                               \
      (hs_stream * s, float *dir, float *buf, const float *g, float mu, bool nesterov, int64_t n), \
      (s, dir, buf, g, mu, nesterov, n), (dir, buf, g))                                            \
    X(muon_newton_schulz,                                                                          \
      (hs_stream * s, float *out, const float *g, int64_t rows, int64_t cols, int steps,           \
       float *ws),                                                                                 \
      (s, out, g, rows, cols, steps, ws), (out, g, ws))                                            \
    X(muon_update,                                                                                 \
      (hs_stream * s, void *p, hs_dtype pdt, const float *u, float decay_factor, float step,       \
       int64_t n),                                                                                 \
      (s, p, pdt, u, decay_factor, step, n), (p, u))                                               \
    X(copy_2d,                                                                                     \
      (hs_stream * s, void *dst, size_t dst_stride, const void *src, size_t src_stride,            \
       int64_t rows, size_t row_bytes),                                                            \
      (s, dst, dst_stride, src, src_stride, rows, row_bytes), (dst, src))

#define DEVICE_ARGS(...)                                                                           \
    ((const void *const[]){__VA_ARGS__}),                                                          \
        sizeof((const void *const[]){__VA_ARGS__}) / sizeof(const void *)
#define GUARDED(name, params, args, devs)                                                          \
    static void guarded_##name params {                                                            \
        hs_device_guard *guard_ = s->dev->guard; /* `g` is a kernel argument */                    \
        need_device(guard_, #name, #devs, DEVICE_ARGS devs);                                       \
        open_memory(guard_);                                                                       \
        guard_->k->name args;                                                                      \
        close_memory(guard_);                                                                      \
    }
HS_GUARDED_KERNELS(GUARDED)
#undef GUARDED

#define ONE(name, params, args, devs) +1
_Static_assert(0 HS_GUARDED_KERNELS(ONE) == sizeof(hs_device_kernels) / sizeof(void (*)(void)),
               "the guard wraps every member of hs_device_kernels");
#undef ONE

void hs_device_host_access_begin(hs_device *d) {
    if (d->guard) open_memory(d->guard);
}

void hs_device_host_access_end(hs_device *d) {
    if (d->guard) close_memory(d->guard);
}

hs_status hs_device_guard_install(hs_device *d, hs_error *e) {
    hs_device_guard *g = calloc(1, sizeof *g);
    if (!g) return hs_error_oom(e, "device guard: %zu bytes of state", sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    /* The largest reservation the address-space limit (ulimit -v) allows. */
    for (g->arena_bytes = ARENA_BYTES; g->arena_bytes >= ((size_t)1 << 24); g->arena_bytes /= 2) {
        g->arena = mmap(NULL, g->arena_bytes, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g->arena != MAP_FAILED) break;
    }
    if (g->arena == MAP_FAILED) {
        free(g);
        return hs_error_oom(e, "device guard: an arena of 16 MiB of address space (ulimit -v)");
    }
    g->ops = d->ops, g->k = d->k;
    g->guarded_ops = *d->ops;
    g->guarded_ops.memset = guarded_memset;
    g->guarded_ops.copy = guarded_copy;
    g->guarded_ops.host_alloc = guarded_host_alloc;
    g->guarded_ops.host_free = guarded_host_free;
    g->guarded_k = *d->k;
#define SET(name, params, args, devs)                                                              \
    if (g->k->name) g->guarded_k.name = guarded_##name;
    HS_GUARDED_KERNELS(SET)
#undef SET
    d->guard = g;
    d->ops = &g->guarded_ops;
    d->k = &g->guarded_k;
    hs_mem_cache_free_all(d->cache);
    d->cache = NULL;
    hs_status s =
        hs_mem_cache_create("device pool", guard_raw_alloc, guard_raw_free, d, &d->cache, e);
    if (s != HS_OK) return s;
    fprintf(stderr,
            "device guard: the %s device's memory is closed to the host outside its calls\n",
            d->name);
    return HS_OK;
}

void hs_device_guard_free(hs_device *d) {
    hs_device_guard *g = d->guard;
    if (!g) return;
    munmap(g->arena, g->arena_bytes);
    free(g->r);
    free(g->spare);
    free(g->host);
    pthread_mutex_destroy(&g->mu);
    free(g);
    d->guard = NULL;
}
