/* The profile: a device's kernels, memsets and copies timed into op
 * classes (hypershard/device.h, hs_prof_class), for `hypershard bench step
 * --breakdown`. Installed, it stands in front of the backend's tables as
 * the guard does (guard.c; the two stack): each member it wraps records the
 * class and the work of the call, reads the monotonic clock before and
 * after, and adds both to the class. Only the installing thread's
 * outermost calls are timed, so the classes never count one interval twice
 * and their sum cannot pass the wall time of the work they cover. The work
 * of each call follows the conventions of `hypershard bench ops`: 2MNK for
 * a GEMM, 4 HD per visible (query, key) pair per head for attention's
 * forward and 2.5 times that for its backward, bytes read plus bytes
 * written for the others. Not installed, nothing is wrapped. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "device/device_backend.h"
#include "device/kernel_list.h"

struct hs_device_profile {
    const hs_device_kernels *k; /* the tables it stands in front of */
    const hs_device_ops *ops;
    hs_device_kernels prof_k;
    hs_device_ops prof_ops;
    pthread_t owner; /* the thread whose calls are timed */
    bool on;
    bool busy; /* a timed call is running: calls inside it are not timed */
    int phase; /* -1, or the class elementwise calls count to */
    hs_prof_gemm_labeller label;
    void *label_ctx;
    hs_prof_stats st;
    atomic_llong untimed; /* calls from other threads */
    /* the call being timed */
    hs_prof_class cls;
    double flops, bytes;
};

static const char *const class_names[HS_PROF_CLASS_COUNT] = {
    "gemm qkv",    "gemm o",    "gemm gate/up", "gemm down", "gemm head",     "gemm other",
    "attention",   "norms",     "rope",         "swiglu",    "cross-entropy", "embedding",
    "moe routing", "optimizer", "casts",        "copies",    "elementwise",   "comm waits"};

const char *hs_prof_class_name(hs_prof_class c) {
    return c >= 0 && c < HS_PROF_CLASS_COUNT ? class_names[c] : "?";
}

bool hs_prof_class_flops(hs_prof_class c) { return c <= HS_PROF_ATTENTION; }

/* ------------------------------------------------------------ the work */

static double sz(hs_dtype dt) { return (double)hs_dtype_size(dt); }

static void set(hs_stream *s, hs_prof_class c, double flops, double bytes) {
    hs_device_profile *p = s->dev->profile;
    p->cls = c, p->flops = flops, p->bytes = bytes;
}

/* Query rows r->q0.. of r against keys r->k0..: the (query, key) pairs the
 * causal mask lets through (document masking not subtracted). */
static double visible_pairs(const hs_att_rows *r) {
    double pairs = 0.0;
    for (int i = 0; i < r->nq; i++) {
        int64_t seen = r->gq + i - r->gk + 1;
        pairs += (double)(seen < 0 ? 0 : seen > r->nk ? r->nk : seen);
    }
    return pairs;
}

static double att_flops(int B, int NH, int HD, const hs_att_rows *r) {
    return 4.0 * HD * (double)NH * B * visible_pairs(r);
}

static void work_gemm(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g) {
    hs_device_profile *p = s->dev->profile;
    hs_prof_class c = p->label ? p->label(p->label_ctx, C, A, B, g) : HS_PROF_GEMM_OTHER;
    double M = (double)g->M, N = (double)g->N, K = (double)g->K;
    set(s, c, 2.0 * M * N * K,
        M * K * sz(g->a_dt) + K * N * sz(g->b_dt) +
            M * N * sz(g->c_dt) * (g->beta != 0.0f ? 2 : 1));
}
static void work_convert(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                         int64_t n) {
    set(s, HS_PROF_CAST, 0, (double)n * (sz(dst_dt) + sz(src_dt)));
}
static void work_convert_scaled(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                                int64_t n) {
    set(s, HS_PROF_CAST, 0, (double)n * (4 + sz(src_dt)));
}
static void work_fill(hs_stream *s, float *x, float v, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 4.0 * n);
}
static void work_rng_normal(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                            int64_t offset, float mean, float std) {
    set(s, HS_PROF_ELEMENTWISE, 0, 4.0 * n);
}
static void work_axpy(hs_stream *s, float *y, const float *x, float a, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 12.0 * n);
}
static void work_scale(hs_stream *s, float *x, float a, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 8.0 * n);
}
static void work_add(hs_stream *s, float *y, const float *x, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 12.0 * n);
}
static void work_add_to_zero(hs_stream *s, float *y, const float *x, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 8.0 * n);
}
static void work_sumsq(hs_stream *s, double *out, const float *x, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, 4.0 * n);
}
static void work_sumsq_many(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                            int count) {
    double bytes = 0.0;
    for (int i = 0; i < count; i++) bytes += 4.0 * (double)n[i];
    set(s, HS_PROF_ELEMENTWISE, 0, bytes);
}
static void work_round(hs_stream *s, float *x, hs_dtype dt, int64_t n) {
    set(s, HS_PROF_CAST, 0, 8.0 * n);
}
static void work_add_cast(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                          const void *b, hs_dtype bdt, int64_t n) {
    set(s, HS_PROF_ELEMENTWISE, 0, (double)n * (sz(odt) + sz(adt) + sz(bdt)));
}
static void work_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n) {
    set(s, HS_PROF_CAST, 0, 2.0 * sz(dt) * n);
}
static void work_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                             const void *w, hs_dtype dt, int64_t N, int C, float eps) {
    set(s, HS_PROF_NORM, 0, (double)N * C * (sz(xdt) + sz(dt)) + 4.0 * N + sz(dt) * C);
}
static void work_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                             const void *x, hs_dtype xdt, const void *w, const float *rstd,
                             hs_dtype dt, int64_t N, int C, double *ws) {
    set(s, HS_PROF_NORM, 0, (double)N * C * (8 + 4 + sz(xdt)) + 4.0 * N + 2 * sz(gdt) * C);
}
static void work_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD,
                             const float *inv_freq, float scale) {
    set(s, HS_PROF_ROPE, 0, 4.0 * T * HD);
}
static void work_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t,
                          const float *sin_t, int B, int T, int H, int HD) {
    set(s, HS_PROF_ROPE, 0, 2.0 * sz(dt) * B * T * H * HD + 4.0 * T * HD);
}
static void work_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B,
                          int T, int H, int HD) {
    set(s, HS_PROF_ROPE, 0, 8.0 * B * T * H * HD + 4.0 * T * HD);
}
static void work_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                            int64_t n) {
    set(s, HS_PROF_SWIGLU, 0, 3.0 * sz(dt) * n);
}
static void work_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite,
                            const float *dout, const void *gate, const void *up, hs_dtype dt,
                            int64_t n) {
    set(s, HS_PROF_SWIGLU, 0, (double)n * (4 + 2 * sz(dt) + (overwrite ? 8 : 16)));
}
static void work_swiglu_bwd16(hs_stream *s, void *dgate16, void *dup16, const float *dout,
                              const void *gate, const void *up, hs_dtype dt, int64_t n) {
    set(s, HS_PROF_SWIGLU, 0, (double)n * (4 + 4 * sz(dt)));
}
static void work_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                               const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH,
                               int HD, const hs_att_rows *r, const hs_att_work *w) {
    double io = (double)B * HD *
                ((double)r->nq * NH * (sz(dt) + sz(odt)) + 2.0 * r->nk * KVH * sz(dt));
    set(s, HS_PROF_ATTENTION, att_flops(B, NH, HD, r), io);
}
static void work_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                               const void *out, hs_dtype odt, const void *q, const void *k,
                               const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                               int HD, const hs_att_rows *r, const hs_att_work *w) {
    double io = (double)B * HD *
                ((double)r->nq * NH * (sz(dt) + sz(odt) + 12) + 2.0 * r->nk * KVH * (sz(dt) + 8));
    set(s, HS_PROF_ATTENTION, 2.5 * att_flops(B, NH, HD, r), io);
}
static void work_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                                 const float *blse, int B, int NH, int HD, const hs_att_rows *r) {
    set(s, HS_PROF_ATTENTION, 0, (double)B * NH * r->nq * (12.0 * HD + 12));
}
static void work_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits,
                      const float *logits, const int32_t *targets, int64_t N, int V, float scale) {
    set(s, HS_PROF_XENT, 0, (double)N * V * (dlogits ? 8 : 4) + 4.0 * N);
}
static void work_xent_shard_max(hs_stream *s, float *row_max, const float *logits, int64_t N,
                                int V) {
    set(s, HS_PROF_XENT, 0, 4.0 * N * V);
}
static void work_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target,
                                 const float *logits, const float *gmax, const int32_t *targets,
                                 int64_t N, int V, int64_t v0) {
    set(s, HS_PROF_XENT, 0, 4.0 * N * V);
}
static void work_xent_shard_grad(hs_stream *s, float *logits, const float *gmax,
                                 const float *row_sumexp, const int32_t *targets, int64_t N, int V,
                                 int64_t v0, float scale) {
    set(s, HS_PROF_XENT, 0, 8.0 * N * V);
}
static void work_xent_shard_loss(hs_stream *s, double *loss, const float *gmax,
                                 const float *row_sumexp, const float *row_target,
                                 const int32_t *targets, int64_t N) {
    set(s, HS_PROF_XENT, 0, 16.0 * N);
}
static void work_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                               const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V) {
    set(s, HS_PROF_EMBEDDING, 0, (double)N * C * (sz(dt) + sz(odt)) + 4.0 * N);
}
static void work_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                               const int32_t *tokens, int64_t N, int C, int64_t v0, int V) {
    set(s, HS_PROF_EMBEDDING, 0, (double)N * C * (4 + 2 * sz(gdt)) + 4.0 * N);
}
static void work_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs,
                           const float *bias, int64_t N, int E, int K, hs_moe_router r,
                           hs_dtype dt) {
    set(s, HS_PROF_MOE, 0, 8.0 * N * E + 8.0 * N * K);
}
static void work_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair,
                             hs_dtype dt, int64_t N, int K, int C) {
    set(s, HS_PROF_MOE, 0, 2.0 * sz(dt) * N * K * C + 4.0 * N * K);
}
static void work_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                                 int64_t N, int K, int C) {
    set(s, HS_PROF_MOE, 0, 12.0 * N * K * C + 4.0 * N * K);
}
static void work_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                               const int32_t *pair_row, const float *weight, int64_t N, int K,
                               int C, float *ws) {
    set(s, HS_PROF_MOE, 0, (double)N * K * C * sz(dt) + 4.0 * N * C + 8.0 * N * K);
}
static void work_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout,
                                 const void *y, hs_dtype dt, const int32_t *pair_row,
                                 const float *weight, int64_t N, int K, int C, float *ws) {
    set(s, HS_PROF_MOE, 0, (double)N * K * C * (4 + sz(dt)) + 4.0 * N * C + 12.0 * N * K);
}
static void work_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                               const float *dw, const float *aux_grad, int64_t N, int E, int K,
                               hs_moe_router r) {
    set(s, HS_PROF_MOE, 0, 8.0 * N * E + 8.0 * N * K);
}
static void work_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                           const float *probs, int64_t N, int E, int K) {
    set(s, HS_PROF_MOE, 0, 4.0 * N * K + (prob_sum ? 4.0 * N * E : 0));
}
static void work_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum,
                               const int64_t *count_in, const double *prob_sum_in, int E) {
    set(s, HS_PROF_MOE, 0, 32.0 * E);
}
static void work_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                              const int32_t *expert, const int64_t *count, int64_t N, int E,
                              int K) {
    set(s, HS_PROF_MOE, 0, 12.0 * N * K + 12.0 * E);
}
static void work_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                       const hs_adamw_hparams *h, int64_t n) {
    set(s, HS_PROF_OPTIMIZER, 0, (double)n * (2 * sz(pdt) + 20));
}
static void work_adamw_many(hs_stream *s, const hs_adamw_tensor *t, int count,
                            const hs_adamw_hparams *h) {
    double bytes = 0.0;
    for (int i = 0; i < count; i++)
        bytes += (double)t[i].n * (2 * sz(t[i].pdt) + 20 + (t[i].copy ? sz(t[i].copy_dt) : 0));
    set(s, HS_PROF_OPTIMIZER, 0, bytes);
}
static void work_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                               bool nesterov, int64_t n) {
    set(s, HS_PROF_OPTIMIZER, 0, 16.0 * n);
}
static void work_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows,
                                    int64_t cols, int steps, float *ws) {
    double a = (double)(rows < cols ? rows : cols), b = (double)(rows < cols ? cols : rows);
    set(s, HS_PROF_OPTIMIZER, steps * (4.0 * a * a * b + 2.0 * a * a * a), 8.0 * a * b);
}
static void work_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u,
                             float decay_factor, float step, int64_t n) {
    set(s, HS_PROF_OPTIMIZER, 0, (double)n * (2 * sz(pdt) + 4));
}
static void work_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src,
                         size_t src_stride, int64_t rows, size_t row_bytes) {
    set(s, HS_PROF_COPY, 0, 2.0 * (double)rows * (double)row_bytes);
}

static void work_quantize(hs_stream *s, void *packed, const void *src, hs_dtype src_dt, int64_t n,
                          int64_t block, hs_quant_fmt f) {
    set(s, HS_PROF_CAST, 0, 2.0 * sz(src_dt) * n + (double)hs_quant_packed_bytes(n, block, f));
}
static void work_dequantize(hs_stream *s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                            int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    set(s, HS_PROF_CAST, 0, (double)count * (1 + sz(dst_dt)) + 4.0 * (count / block + 1));
}

static void work_dequantize_add(hs_stream *s, float *dst, const void *packed, int64_t n,
                                int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    set(s, HS_PROF_CAST, 0, (double)count * 9 + 4.0 * (count / block + 1));
}

/* ----------------------------------------------------------- the timing */

/* Whether this call is timed: enabled, on the installing thread, and not
 * inside another timed call (whose time already covers it). */
static bool timed(hs_device_profile *p) {
    if (!pthread_equal(pthread_self(), p->owner)) {
        atomic_fetch_add(&p->untimed, 1);
        return false;
    }
    if (!p->on || p->busy) return false;
    p->busy = true;
    return true;
}

static void done(hs_device_profile *p, double t0) {
    double dt = hs_now() - t0;
    int c = p->phase >= 0 && p->cls == HS_PROF_ELEMENTWISE ? p->phase : (int)p->cls;
    hs_prof_entry *e = &p->st.c[c];
    e->seconds += dt, e->flops += p->flops, e->bytes += p->bytes, e->calls++;
    p->busy = false;
}

#define PROFILED(name, params, args, devs)                                                         \
    static void profiled_##name params {                                                           \
        hs_device_profile *p_ = s->dev->profile;                                                   \
        if (!timed(p_)) {                                                                          \
            p_->k->name args;                                                                      \
            return;                                                                                \
        }                                                                                          \
        work_##name args;                                                                          \
        double t0_ = hs_now();                                                                     \
        p_->k->name args;                                                                          \
        done(p_, t0_);                                                                             \
    }
HS_DEVICE_KERNEL_LIST(PROFILED)
#undef PROFILED

static void profiled_memset(hs_stream *s, void *ptr, int value, size_t bytes) {
    hs_device_profile *p = s->dev->profile;
    if (!timed(p)) {
        p->ops->memset(s, ptr, value, bytes);
        return;
    }
    set(s, HS_PROF_ELEMENTWISE, 0, (double)bytes);
    double t0 = hs_now();
    p->ops->memset(s, ptr, value, bytes);
    done(p, t0);
}

static void profiled_copy(hs_stream *s, void *dst, const void *src, size_t bytes,
                          hs_copy_kind kind) {
    hs_device_profile *p = s->dev->profile;
    if (!timed(p)) {
        p->ops->copy(s, dst, src, bytes, kind);
        return;
    }
    set(s, HS_PROF_COPY, 0, 2.0 * (double)bytes);
    double t0 = hs_now();
    p->ops->copy(s, dst, src, bytes, kind);
    done(p, t0);
}

/* ------------------------------------------------------------- the API */

hs_status hs_device_profile_install(hs_device *d, hs_error *e) {
    HS_ASSERT(d->profile == NULL);
    hs_device_profile *p = calloc(1, sizeof *p);
    if (!p) return hs_error_oom(e, "device profile: %zu bytes of state", sizeof *p);
    p->k = d->k, p->ops = d->ops;
    p->owner = pthread_self();
    p->phase = -1;
    atomic_init(&p->untimed, 0);
    p->prof_k = *d->k;
#define SET(name, params, args, devs)                                                              \
    if (p->k->name) p->prof_k.name = profiled_##name;
    HS_DEVICE_KERNEL_LIST(SET)
#undef SET
    p->prof_ops = *d->ops;
    p->prof_ops.memset = profiled_memset;
    p->prof_ops.copy = profiled_copy;
    d->profile = p;
    d->k = &p->prof_k;
    d->ops = &p->prof_ops;
    return HS_OK;
}

void hs_device_profile_free(hs_device *d) {
    free(d->profile);
    d->profile = NULL;
}

void hs_device_profile_enable(hs_device *d, bool on) {
    if (d->profile) d->profile->on = on;
}

void hs_device_profile_set_labeller(hs_device *d, hs_prof_gemm_labeller fn, void *ctx) {
    if (d->profile) d->profile->label = fn, d->profile->label_ctx = ctx;
}

void hs_device_profile_set_phase(hs_device *d, int phase) {
    HS_ASSERT(phase >= -1 && phase < HS_PROF_CLASS_COUNT);
    if (d->profile) d->profile->phase = phase;
}

void hs_device_profile_get(const hs_device *d, hs_prof_stats *out) {
    *out = (hs_prof_stats){0};
    if (!d->profile) return;
    *out = d->profile->st;
    out->untimed_calls = atomic_load(&d->profile->untimed);
}

void hs_device_profile_reset(hs_device *d) {
    if (!d->profile) return;
    d->profile->st = (hs_prof_stats){0};
    atomic_store(&d->profile->untimed, 0);
}

void hs_device_profile_add(hs_device *d, hs_prof_class c, double seconds, double bytes) {
    hs_device_profile *p = d->profile;
    HS_ASSERT(c >= 0 && c < HS_PROF_CLASS_COUNT);
    if (!p || !p->on || !pthread_equal(pthread_self(), p->owner)) return;
    hs_prof_entry *e = &p->st.c[c];
    e->seconds += seconds, e->bytes += bytes, e->calls++;
}
