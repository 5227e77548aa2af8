/* The cpu optimizer kernels: AdamW's and Muon's element updates of a
 * parameter in its own dtype (the optimizer keeps the per-step scalars),
 * the in-place scaling of 16-bit data, and Muon's momentum and
 * Newton-Schulz orthogonalisation (its matmuls on BLAS). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu.h"
#include "device/device_backend.h"

/* Elements per chunk: the unit the threads share out, and a 16-bit
 * tensor's widened copy on the stack (each element is updated the same way
 * whatever the split). 4096: each conversion call's dispatch (about
 * 0.16 us) spread over enough elements not to show. */
#define UPDATE_CHUNK 4096
#define UPDATE_PAR_MIN 65536

/* Updates n fp32 values x, the tensor's elements [off, off + n). */
typedef void (*update_fn)(float *x, int64_t off, int64_t n, const void *ctx);

/* Runs fn over x's values as fp32, in chunks split over the threads: in
 * place when x is fp32, else through a widened copy of each chunk that is
 * rounded back once (round to nearest even). copy (NULL: none) gets each
 * chunk's new values in copy_dt while they are in cache: the bits of a
 * convert of x afterwards (x's value rounded to x's dtype, then to
 * copy_dt). */
static void update_in_dtype(void *x, hs_dtype dt, void *copy, hs_dtype copy_dt, int64_t n,
                            update_fn fn, const void *ctx) {
    int64_t chunks = (n + UPDATE_CHUNK - 1) / UPDATE_CHUNK;
    size_t es = hs_dtype_size(dt), cs = hs_dtype_size(copy_dt);
#pragma omp parallel for schedule(static) if (n >= UPDATE_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t off = c * UPDATE_CHUNK, k = n - off < UPDATE_CHUNK ? n - off : UPDATE_CHUNK;
        char *xc = (char *)x + (size_t)off * es;
        char *cc = copy ? (char *)copy + (size_t)off * cs : NULL;
        if (dt == HS_DTYPE_F32) {
            fn((float *)xc, off, k, ctx);
            if (cc) hs_convert(cc, copy_dt, xc, HS_DTYPE_F32, k);
            continue;
        }
        float buf[UPDATE_CHUNK];
        hs_convert(buf, HS_DTYPE_F32, xc, dt, k);
        fn(buf, off, k, ctx);
        hs_convert(xc, dt, buf, HS_DTYPE_F32, k);
        if (cc) hs_convert(cc, copy_dt, xc, dt, k);
    }
}

void hs_adamw_update_f32(float *restrict p, float *restrict m, float *restrict v,
                         const float *restrict g, const hs_adamw_hparams *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        m[i] = h->beta1 * m[i] + h->one_minus_beta1 * g[i];
        v[i] = h->beta2 * v[i] + h->one_minus_beta2 * (g[i] * g[i]);
        float denom = sqrtf(v[i]) / h->bias2_sqrt + h->eps;
        p[i] = p[i] * h->decay_factor - h->step_size * (m[i] / denom);
    }
}

typedef struct adamw_ctx {
    float *m, *v;
    const float *g;
    const hs_adamw_hparams *h;
} adamw_ctx;

static void adamw_chunk(float *p, int64_t off, int64_t n, const void *vctx) {
    const adamw_ctx *x = vctx;
    hs_adamw_update_f32(p, x->m + off, x->v + off, x->g + off, x->h, n);
}

void hs_cpu_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n) {
    adamw_ctx x = {.m = m, .v = v, .g = g, .h = h};
    update_in_dtype(p, pdt, NULL, pdt, n, adamw_chunk, &x);
}

/* Tensor by tensor, each copy written chunk by chunk as its values are
 * updated (no second pass over p). */
void hs_cpu_adamw_many(hs_stream *s, const hs_adamw_tensor *t, int count,
                       const hs_adamw_hparams *h) {
    for (int i = 0; i < count; i++) {
        hs_adamw_hparams hi = *h;
        hi.decay_factor = t[i].decay_factor;
        adamw_ctx x = {.m = t[i].m, .v = t[i].v, .g = t[i].g, .h = &hi};
        update_in_dtype(t[i].p, t[i].pdt, t[i].copy, t[i].copy_dt, t[i].n, adamw_chunk, &x);
    }
}

typedef struct muon_ctx {
    const float *u;
    float decay_factor, step;
} muon_ctx;

/* p * decay_factor rounded, then step * u subtracted: the bits of torch's
 * mul_ then add_(u, alpha=-step). */
static void muon_chunk(float *p, int64_t off, int64_t n, const void *vctx) {
    const muon_ctx *x = vctx;
    const float *u = x->u + off;
    for (int64_t i = 0; i < n; i++) p[i] = p[i] * x->decay_factor - x->step * u[i];
}

void hs_cpu_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                        float step, int64_t n) {
    muon_ctx x = {.u = u, .decay_factor = decay_factor, .step = step};
    update_in_dtype(p, pdt, NULL, pdt, n, muon_chunk, &x);
}

/* x *= a in place (a loop of its own: hs_scale_f32 would open a nested
 * parallel region per chunk). */
static void scale_chunk(float *x, int64_t off, int64_t n, const void *vctx) {
    const float a = *(const float *)vctx;
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

void hs_cpu_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n) {
    update_in_dtype(x, dt, NULL, dt, n, scale_chunk, &a);
}

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

int64_t hs_newton_schulz5_scratch_floats(int64_t rows, int64_t cols) {
    int64_t n = rows < cols ? rows : cols;
    return 2 * rows * cols + 2 * n * n;
}

static void transpose(float *dst, const float *src, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* One iteration on X (n x m, n <= m): X <- a X + (b A + c A^2) X, A = X X^T. */
static hs_status ns_iterate(float *x_next, const float *x, float *gram, float *poly, int64_t n,
                            int64_t m, hs_error *e) {
    hs_status s = hs_sgemm(false, true, n, n, m, 1.0f, x, m, x, m, 0.0f, gram, n, e);
    if (s != HS_OK) return s;
    memcpy(poly, gram, (size_t)(n * n) * sizeof(float));
    s = hs_sgemm(false, false, n, n, n, NS_C, gram, n, gram, n, NS_B, poly, n, e);
    if (s != HS_OK) return s;
    memcpy(x_next, x, (size_t)(n * m) * sizeof(float));
    return hs_sgemm(false, false, n, m, n, 1.0f, poly, n, x, m, NS_A, x_next, m, e);
}

hs_status hs_newton_schulz5(float *out, const float *g, int64_t rows, int64_t cols, int steps,
                            float *scratch, hs_error *e) {
    HS_ASSERT(rows > 0 && cols > 0 && steps >= 0);
    float *owned = NULL;
    if (scratch == NULL) {
        size_t bytes = (size_t)hs_newton_schulz5_scratch_floats(rows, cols) * sizeof(float);
        owned = malloc(bytes);
        if (owned == NULL)
            return hs_error_oom(e, "Newton-Schulz: %zu bytes of scratch for a %lldx%lld matrix",
                                bytes, (long long)rows, (long long)cols);
        scratch = owned;
    }
    /* Iterate on the wide orientation so the Gram matrix is the small one. */
    bool tall = rows > cols;
    int64_t n = tall ? cols : rows, m = tall ? rows : cols, numel = rows * cols;
    float *x = scratch, *x_next = scratch + numel, *gram = x_next + numel, *poly = gram + n * n;
    if (tall) transpose(x, g, rows, cols);
    else memcpy(x, g, (size_t)numel * sizeof(float));
    double norm = sqrt(hs_sumsq_f32(x, numel));
    hs_scale_f32(x, (float)(1.0 / (norm + 1e-7)), numel);
    hs_status st = HS_OK;
    for (int s = 0; s < steps && st == HS_OK; s++) {
        st = ns_iterate(x_next, x, gram, poly, n, m, e);
        float *t = x;
        x = x_next, x_next = t;
    }
    if (st == HS_OK && tall) transpose(out, x, cols, rows);
    else if (st == HS_OK) memcpy(out, x, (size_t)numel * sizeof(float));
    free(owned);
    return st;
}

void hs_cpu_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        buf[i] = mu * buf[i] + g[i];
        dir[i] = nesterov ? g[i] + mu * buf[i] : buf[i];
    }
}

void hs_cpu_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols,
                               int steps, float *ws) {
    hs_error e;
    hs_error_clear(&e);
    if (hs_newton_schulz5(out, g, rows, cols, steps, ws, &e) != HS_OK) hs_device_fail(s->dev, &e);
}
