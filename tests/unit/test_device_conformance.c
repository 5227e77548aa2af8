/* Every compiled backend against `reference`, op by op (after ggml's
 * tests/test-backend-ops): one table of ops, each with the dtypes it
 * applies to, its shapes (odd sizes, zero lengths, tails past a vector or
 * chunk width, strided and transposed operands) and its tolerance per dtype
 * written beside it. A case runs the op on both backends from the same
 * seeded inputs and compares every output: max |got - want| over
 * max(max |want|, the op's floor), NaN where `want` has none failing. An entry the
 * backend does not have (NULL) is counted as not provided, not checked.
 * The backend under test is argv[1] (cpu, cuda), every compiled one but
 * reference without it; one that is compiled but cannot be created here
 * (cuda on a machine without a GPU) is skipped with the reason, exit 77.
 * Buffers come from the device's host pool and results are read after its
 * stream is synchronized, so the same cases hold a GPU backend.
 * HS_DEVICE_TEST_VERBOSE=1 prints each case's error.
 * HS_TEST_DEVICES: cpu cuda */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/device.h"

enum { F32 = 1 << HS_DTYPE_F32, BF16 = 1 << HS_DTYPE_BF16, F16 = 1 << HS_DTYPE_F16 };
#define ALL_DT (F32 | BF16 | F16)
#define MAX_OUT 8
#define MAX_SHAPES 16

/* ----------------------------------------------------------- buffers */

/* One case: an op on one device, its kernels run on the device's stream. */
typedef struct kcase {
    hs_device *dev;
    const hs_device_kernels *k;
    hs_stream *s;
    hs_dtype dt;
    const int64_t *d; /* the shape, read per op */
} kcase;

/* Every buffer a kernel is handed comes from the host pool of the case's
 * device: pinned and mapped on cuda, where a kernel reads and writes it in
 * place and so does the host, plain RAM on cpu and reference. Kernels run
 * asynchronously on the case's stream, so the host reads an output, or
 * writes a buffer a kernel has used, only after done(). Host-only arrays
 * stay on the C heap. */
static void *zeros(const kcase *c, size_t n, size_t size) {
    size_t bytes = n > 0 ? n * size : 1;
    void *p = hs_host_alloc(c->dev, bytes);
    HS_ASSERT(p != NULL);
    memset(p, 0, bytes);
    return p;
}

static void release(const kcase *c, const void *p) {
    if (p) hs_host_free(c->dev, (void *)p);
}

/* The host waits for every kernel the case has enqueued. */
static void done(const kcase *c) { hs_stream_synchronize(c->s); }

typedef struct outs {
    int n;
    float *v[MAX_OUT];
    int64_t len[MAX_OUT];
} outs;

/* A copy of n values of p (dtype dt) as fp32, kept as one output; p is
 * host memory or, after done(), a case's buffer. */
static void put(outs *o, const void *p, hs_dtype dt, int64_t n) {
    HS_ASSERT(o->n < MAX_OUT);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    hs_convert(v, HS_DTYPE_F32, p, dt, n);
    o->v[o->n] = v, o->len[o->n++] = n;
}

static void outs_free(outs *o) {
    for (int i = 0; i < o->n; i++) free(o->v[i]);
    o->n = 0;
}

/* n values in [-scale, scale] from `seed`, stored in dt. */
static void *rnd(const kcase *c, hs_dtype dt, int64_t n, uint64_t seed, float scale) {
    void *p = zeros(c, (size_t)n, hs_dtype_size(dt));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((x >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
        hs_st(p, dt, i, u * scale);
    }
    return p;
}

static int32_t *ids(const kcase *c, int64_t n, int V, uint64_t seed) {
    int32_t *t = zeros(c, (size_t)n, sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)((i * 7 + (int64_t)seed) % V);
    return t;
}

/* ----------------------------------------------------------------- ops */

typedef struct op_def {
    const char *name;
    size_t entry; /* offsetof the kernel in hs_device_kernels */
    unsigned dtypes;
    float tol[HS_DTYPE_COUNT];
    double floor; /* errors are relative to max(max |want|, floor) */
    int64_t shapes[MAX_SHAPES][8];
    int n_shapes;
    void (*run)(const kcase *c, outs *o);
} op_def;

/* d = {M, N, K, trans_a, trans_b, pad, beta0, mixed}: A, B, C with row
 * strides `pad` past their minimum; C = 0.5 op(A) op(B) + C, or with
 * beta0 C = 0.5 op(A) op(B) over a C of NaNs (BLAS: C is not read); all
 * in dt, or with mixed B and C in fp32. */
static void run_gemm(const kcase *c, outs *o) {
    const int64_t *d = c->d;
    bool ta = d[3], tb = d[4];
    hs_dtype bc_dt = d[7] ? HS_DTYPE_F32 : c->dt;
    int64_t lda = (ta ? d[0] : d[2]) + d[5], ldb = (tb ? d[2] : d[1]) + d[5], ldc = d[1] + d[5];
    int64_t na = (ta ? d[2] : d[0]) * lda, nb = (tb ? d[1] : d[2]) * ldb, nc = d[0] * ldc;
    void *A = rnd(c, c->dt, na, 1, 1.0f), *B = rnd(c, bc_dt, nb, 2, 1.0f);
    void *C = rnd(c, bc_dt, nc, 3, 1.0f);
    for (int64_t i = 0; d[6] && i < nc; i++) hs_st(C, bc_dt, i, NAN);
    hs_gemm_shape g = {.trans_a = ta,
                       .trans_b = tb,
                       .M = d[0],
                       .N = d[1],
                       .K = d[2],
                       .alpha = 0.5f,
                       .beta = d[6] ? 0.0f : 1.0f,
                       .a_dt = c->dt,
                       .b_dt = bc_dt,
                       .c_dt = bc_dt,
                       .lda = lda,
                       .ldb = ldb,
                       .ldc = ldc};
    c->k->gemm(c->s, C, A, B, &g);
    done(c);
    for (int64_t i = 0; d[6] && i < d[0]; i++) /* the padding past N is no output */
        for (int64_t j = d[1]; j < ldc; j++) hs_st(C, bc_dt, i * ldc + j, 0.0f);
    put(o, C, bc_dt, nc);
    release(c, A), release(c, B), release(c, C);
}

/* d = {n}: dt -> fp32, fp32 -> dt, and dt -> fp32 scaled by 0.75. */
static void run_convert(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    void *x = rnd(c, c->dt, n, 4, 3.0f), *y = rnd(c, HS_DTYPE_F32, n, 5, 3.0f);
    float *f = zeros(c, (size_t)n, 4);
    void *h = zeros(c, (size_t)n, 4);
    c->k->convert(c->s, f, HS_DTYPE_F32, x, c->dt, n);
    c->k->convert(c->s, h, c->dt, y, HS_DTYPE_F32, n);
    done(c);
    put(o, f, HS_DTYPE_F32, n);
    put(o, h, c->dt, n);
    c->k->convert_scaled(c->s, f, x, c->dt, 0.75f, n);
    done(c);
    put(o, f, HS_DTYPE_F32, n);
    release(c, x), release(c, y), release(c, f), release(c, h);
}

/* d = {n}: fill; 0 + x with -0s (values and signs); normal draws from
 * counter 3 of a Philox stream, mean 0.5, std 0.02; then y += 0.5 x,
 * x *= -2, y += x, and sum(y^2); sumsq_many over y, y's last two thirds
 * and nothing: the first the bits sumsq gave on the same backend. */
static void run_elementwise(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    float *x = rnd(c, HS_DTYPE_F32, n, 6, 1.0f), *y = rnd(c, HS_DTYPE_F32, n, 7, 1.0f);
    float *z = zeros(c, (size_t)n, 4);
    c->k->fill(c->s, z, 1.25f, n);
    done(c);
    put(o, z, HS_DTYPE_F32, n);
    /* 0 + x over every fifth value -0: the sign bits are an output too */
    for (int64_t i = 0; i < n; i += 5) x[i] = -0.0f;
    c->k->add_to_zero(c->s, z, x, n);
    done(c);
    put(o, z, HS_DTYPE_F32, n);
    for (int64_t i = 0; i < n; i++) z[i] = signbit(z[i]) ? -1.0f : 1.0f;
    put(o, z, HS_DTYPE_F32, n);
    c->k->rng_normal(c->s, z, n, 7, 11, 3, 0.5f, 0.02f);
    c->k->axpy(c->s, y, x, 0.5f, n);
    c->k->scale(c->s, x, -2.0f, n);
    c->k->add(c->s, y, x, n);
    double ss = -1.0;
    c->k->sumsq(c->s, &ss, y, n);
    done(c);
    put(o, z, HS_DTYPE_F32, n);
    put(o, y, HS_DTYPE_F32, n);
    float f = (float)ss;
    put(o, &f, HS_DTYPE_F32, 1);
    const float *parts[3] = {y, y + n / 3, y};
    int64_t lens[3] = {n, n - n / 3, 0};
    double many[3] = {-1.0, -1.0, -1.0};
    c->k->sumsq_many(c->s, many, parts, lens, 3);
    assert_memory_equal(&many[0], &ss, sizeof ss);
    assert_true(many[2] == 0.0);
    f = (float)many[1];
    put(o, &f, HS_DTYPE_F32, 1);
    release(c, x), release(c, y), release(c, z);
}

/* d = {n}: the in-place round to dt, and the residual add of a dt and an
 * fp32 operand stored in dt and in fp32. */
static void run_round_add(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    float *x = rnd(c, HS_DTYPE_F32, n, 8, 3.0f), *y = rnd(c, HS_DTYPE_F32, n, 9, 1.0f);
    void *a = rnd(c, c->dt, n, 10, 2.0f), *out = rnd(c, c->dt, n, 0, 0.0f);
    c->k->round(c->s, x, c->dt, n);
    c->k->add_cast(c->s, out, c->dt, a, c->dt, y, HS_DTYPE_F32, n);
    done(c);
    put(o, x, HS_DTYPE_F32, n);
    put(o, out, c->dt, n);
    c->k->add_cast(c->s, y, HS_DTYPE_F32, a, c->dt, y, HS_DTYPE_F32, n);
    done(c);
    put(o, y, HS_DTYPE_F32, n);
    release(c, x), release(c, y), release(c, a), release(c, out);
}

/* d = {N, C, x32}: forward (out, rstd), then backward into dx and dw; x
 * in dt, or in fp32 with x32 (a block's input at a unit boundary). */
static void run_rmsnorm(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int C = (int)c->d[1];
    hs_dtype xdt = c->d[2] ? HS_DTYPE_F32 : c->dt;
    void *x = rnd(c, xdt, N * C, 8, 2.0f), *w = rnd(c, c->dt, C, 9, 1.5f);
    void *out = rnd(c, c->dt, N * C, 0, 0);
    float *rstd = rnd(c, HS_DTYPE_F32, N, 0, 0), *dout = rnd(c, HS_DTYPE_F32, N * C, 10, 1.0f);
    float *dx = rnd(c, HS_DTYPE_F32, N * C, 11, 0.1f), *dw = rnd(c, HS_DTYPE_F32, C, 12, 0.1f);
    c->k->rmsnorm_fwd(c->s, out, rstd, x, xdt, w, c->dt, N, C, 1e-5f);
    c->k->rmsnorm_bwd(c->s, dx, dw, HS_DTYPE_F32, dout, x, xdt, w, rstd, c->dt, N, C, NULL);
    done(c);
    put(o, out, c->dt, N * C), put(o, rstd, HS_DTYPE_F32, N);
    put(o, dx, HS_DTYPE_F32, N * C), put(o, dw, HS_DTYPE_F32, C);
    release(c, x), release(c, w), release(c, out), release(c, rstd), release(c, dout);
    release(c, dx), release(c, dw);
}

/* d = {B, T, H, HD}: forward on x (dt) and backward on an fp32 gradient,
 * with tables of any values (the kernels do not assume cos^2 + sin^2 = 1). */
static void run_rope(const kcase *c, outs *o) {
    int B = (int)c->d[0], T = (int)c->d[1], H = (int)c->d[2], HD = (int)c->d[3];
    int64_t n = (int64_t)B * T * H * HD, nt = (int64_t)T * (HD / 2);
    float *ct = rnd(c, HS_DTYPE_F32, nt, 27, 1.0f), *st = rnd(c, HS_DTYPE_F32, nt, 28, 1.0f);
    void *x = rnd(c, c->dt, n, 13, 2.0f);
    float *dx = rnd(c, HS_DTYPE_F32, n, 14, 1.0f);
    c->k->rope_fwd(c->s, x, c->dt, ct, st, B, T, H, HD);
    c->k->rope_bwd(c->s, dx, ct, st, B, T, H, HD);
    done(c);
    put(o, x, c->dt, n), put(o, dx, HS_DTYPE_F32, n);
    release(c, ct), release(c, st), release(c, x), release(c, dx);
}

/* d = {T, HD, theta, scale x 1000}: plain frequencies, and scaled
 * tables (YaRN's attention factor) where d[3] is not 1000. */
static void run_rope_tables(const kcase *c, outs *o) {
    int T = (int)c->d[0], HD = (int)c->d[1];
    int64_t nt = (int64_t)T * (HD / 2);
    float *ct = rnd(c, HS_DTYPE_F32, nt, 0, 0), *st = rnd(c, HS_DTYPE_F32, nt, 0, 0);
    float inv[256];
    assert_true(HD / 2 <= 256);
    hs_rope_inv_freq(inv, HD, (double)c->d[2]);
    c->k->rope_tables(c->s, ct, st, T, HD, inv, c->d[3] ? (float)c->d[3] / 1000.0f : 1.0f);
    done(c);
    put(o, ct, HS_DTYPE_F32, nt), put(o, st, HS_DTYPE_F32, nt);
    release(c, ct), release(c, st);
}

/* d = {n}: forward, backward accumulating, backward overwriting, and (16-bit)
 * the overwriting backward rounded into dt in one pass. */
static void run_swiglu(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    void *g = rnd(c, c->dt, n, 15, 6.0f), *u = rnd(c, c->dt, n, 16, 2.0f);
    void *out = rnd(c, c->dt, n, 0, 0);
    float *dout = rnd(c, HS_DTYPE_F32, n, 17, 1.0f);
    float *dg = rnd(c, HS_DTYPE_F32, n, 18, 0.5f), *du = rnd(c, HS_DTYPE_F32, n, 19, 0.5f);
    c->k->swiglu_fwd(c->s, out, g, u, c->dt, n);
    c->k->swiglu_bwd(c->s, dg, du, false, dout, g, u, c->dt, n);
    done(c);
    put(o, out, c->dt, n);
    put(o, dg, HS_DTYPE_F32, n), put(o, du, HS_DTYPE_F32, n);
    c->k->swiglu_bwd(c->s, dg, du, true, dout, g, u, c->dt, n);
    done(c);
    put(o, dg, HS_DTYPE_F32, n);
    if (c->dt != HS_DTYPE_F32) { /* swiglu_bwd16: the bits of the two passes above */
        void *g16 = zeros(c, (size_t)n, 2), *u16 = zeros(c, (size_t)n, 2);
        void *want = zeros(c, (size_t)n, 2);
        c->k->swiglu_bwd16(c->s, g16, u16, dout, g, u, c->dt, n);
        c->k->convert(c->s, want, c->dt, dg, HS_DTYPE_F32, n);
        done(c);
        assert_memory_equal(g16, want, (size_t)n * 2);
        c->k->convert(c->s, want, c->dt, du, HS_DTYPE_F32, n);
        done(c);
        assert_memory_equal(u16, want, (size_t)n * 2);
        put(o, g16, c->dt, n);
        release(c, g16), release(c, u16), release(c, want);
    }
    release(c, g), release(c, u), release(c, out), release(c, dout), release(c, dg);
    release(c, du);
}

/* d = {B, NH, KVH, HD, T, variant, workspace, documents}: variant 0 all
 * rows; 1 a context-parallel range (query rows [T/3, T) at global
 * position 2T, key rows [1, T) at T + T/2); 2 one where the first query
 * rows see no key (keys start at a global position past theirs). Forward
 * into an odt = dt output, then backward accumulating into dq, dk, dv. */
static hs_att_rows att_variant(int T, int variant) {
    hs_att_rows r = {.Tq = T, .Tk = T, .q0 = 0, .nq = T, .k0 = 0, .nk = T, .gq = 0, .gk = 0};
    if (variant == 1) {
        r.q0 = T / 3, r.nq = T - T / 3, r.gq = 2 * T;
        r.k0 = T > 0, r.nk = T - (T > 0), r.gk = T + T / 2;
    }
    if (variant == 2) r.gk = T / 2;
    return r;
}

/* Document masking (d[7] = 1): sequence b holds documents of 5 + b
 * positions each, by global position, over every position a variant
 * reaches (below 4T). lo is a kernel's argument (device memory); the
 * hs_att_rows that points to it is a host struct. */
static int32_t *att_documents(const kcase *c, int B, int T, hs_att_rows *r) {
    int64_t ld = 4 * (int64_t)T + 1;
    int32_t *lo = zeros(c, (size_t)(B * ld), sizeof *lo);
    for (int b = 0; b < B; b++)
        for (int64_t p = 0; p < ld; p++) lo[b * ld + p] = (int32_t)(p - p % (5 + b));
    r->lo = lo, r->lo_ld = ld;
    return lo;
}

static void run_attention(const kcase *c, outs *o) {
    const int64_t *d = c->d;
    int B = (int)d[0], NH = (int)d[1], KVH = (int)d[2], HD = (int)d[3], T = (int)d[4];
    hs_att_rows r = att_variant(T, (int)d[5]);
    int32_t *lo = d[7] ? att_documents(c, B, T, &r) : NULL;
    int64_t nq = (int64_t)B * T * NH * HD, nk = (int64_t)B * T * KVH * HD;
    void *q = rnd(c, c->dt, nq, 29, 1.5f), *k = rnd(c, c->dt, nk, 30, 1.5f);
    void *v = rnd(c, c->dt, nk, 31, 1.0f);
    void *out = rnd(c, c->dt, nq, 32, 1.0f);
    float *lse = rnd(c, HS_DTYPE_F32, (int64_t)B * NH * T, 33, 1.0f);
    float *dout = rnd(c, HS_DTYPE_F32, nq, 34, 1.0f), *dq = rnd(c, HS_DTYPE_F32, nq, 35, 0.1f);
    float *dk = rnd(c, HS_DTYPE_F32, nk, 36, 0.1f), *dv = rnd(c, HS_DTYPE_F32, nk, 37, 0.1f);
    /* d[6] = 1: the caller's workspace as the model gives it (scratch for
     * two threads, a delta buffer, dout rounded to a 16-bit dt), in the
     * device's memory as a GPU attention takes it */
    hs_att_work w = {0}, *wp = d[6] ? &w : NULL;
    if (wp) {
        w.threads = 2;
        w.scratch = zeros(c, (size_t)hs_attention_scratch_floats(T, HD, 2) + 1, sizeof(float));
        w.delta = zeros(c, (size_t)((int64_t)B * NH * T + 1), sizeof(float));
        if (c->dt != HS_DTYPE_F32) {
            void *d16 = rnd(c, c->dt, nq, 38, 0.0f);
            hs_convert(d16, c->dt, dout, HS_DTYPE_F32, nq);
            w.dout16 = d16;
        }
    }
    c->k->attention_fwd(c->s, out, c->dt, lse, q, k, v, c->dt, B, NH, KVH, HD, &r, wp);
    done(c);
    put(o, out, c->dt, nq), put(o, lse, HS_DTYPE_F32, (int64_t)B * NH * T);
    c->k->attention_bwd(c->s, dq, dk, dv, dout, out, c->dt, q, k, v, lse, c->dt, B, NH, KVH, HD, &r,
                        wp);
    done(c);
    put(o, dq, HS_DTYPE_F32, nq), put(o, dk, HS_DTYPE_F32, nk), put(o, dv, HS_DTYPE_F32, nk);
    release(c, q), release(c, k), release(c, v), release(c, out), release(c, lse);
    release(c, dout), release(c, dq), release(c, dk), release(c, dv);
    release(c, w.scratch), release(c, w.delta), release(c, w.dout16), release(c, lo);
}

/* d = {B, NH, HD, T, variant}: a ring block merged into an accumulated
 * output on att_variant's query rows; every fifth row of the block saw no
 * key (its lse -inf) and must stay as it was. */
static void run_attention_merge(const kcase *c, outs *o) {
    const int64_t *d = c->d;
    int B = (int)d[0], NH = (int)d[1], HD = (int)d[2], T = (int)d[3];
    hs_att_rows r = att_variant(T, (int)d[4]);
    int64_t n = (int64_t)B * T * NH * HD, rows = (int64_t)B * NH * T;
    float *out = rnd(c, HS_DTYPE_F32, n, 46, 1.0f), *bout = rnd(c, HS_DTYPE_F32, n, 47, 1.0f);
    float *lse = rnd(c, HS_DTYPE_F32, rows, 48, 3.0f), *blse = rnd(c, HS_DTYPE_F32, rows, 49, 3.0f);
    for (int64_t i = 0; i < rows; i += 5) blse[i] = -INFINITY;
    c->k->attention_merge(c->s, out, lse, bout, blse, B, NH, HD, &r);
    done(c);
    put(o, out, HS_DTYPE_F32, n), put(o, lse, HS_DTYPE_F32, rows);
    release(c, out), release(c, bout), release(c, lse), release(c, blse);
}

/* d = {N, V}: loss, valid rows and the gradient in place of the logits;
 * every third target is ignored (-1). The loss and the count are host
 * values. */
static void run_xent(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int V = (int)c->d[1];
    float *l = rnd(c, HS_DTYPE_F32, N * V, 20, 8.0f);
    int32_t *t = ids(c, N, V, 3);
    for (int64_t i = 0; i < N; i += 3) t[i] = -1;
    double loss = -1.0;
    int64_t valid = -1;
    c->k->xent(c->s, &loss, &valid, NULL, l, t, N, V, 0.5f);
    done(c);
    float lv[2] = {(float)loss, (float)valid};
    put(o, lv, HS_DTYPE_F32, 2);
    c->k->xent(c->s, &loss, &valid, l, l, t, N, V, 0.5f);
    done(c);
    lv[0] = (float)loss, lv[1] = (float)valid;
    put(o, lv, HS_DTYPE_F32, 2), put(o, l, HS_DTYPE_F32, N * V);
    release(c, l), release(c, t);
}

/* d = {N, V, v0}: the vocab-parallel pieces on one shard of V columns
 * starting at v0 of a 2V vocabulary, with the shard's own maxima as the
 * reduced ones: maxima, fp32 sums and target logits, then the gradient in
 * place; every third target is ignored, the others fall in and out of the
 * shard. */
static void run_xent_shard(const kcase *c, outs *o) {
    int64_t N = c->d[0], v0 = c->d[2];
    int V = (int)c->d[1];
    float *l = rnd(c, HS_DTYPE_F32, N * V, 23, 8.0f);
    float *mx = zeros(c, (size_t)N + 1, sizeof(float));
    float *sum = zeros(c, (size_t)N + 1, sizeof(float));
    float *tl = zeros(c, (size_t)N + 1, sizeof(float));
    int32_t *t = ids(c, N, 2 * V, 3);
    for (int64_t i = 0; i < N; i += 3) t[i] = -1;
    c->k->xent_shard_max(c->s, mx, l, N, V);
    c->k->xent_shard_sums(c->s, sum, tl, l, mx, t, N, V, v0);
    done(c);
    put(o, mx, HS_DTYPE_F32, N), put(o, sum, HS_DTYPE_F32, N), put(o, tl, HS_DTYPE_F32, N);
    c->k->xent_shard_grad(c->s, l, mx, sum, t, N, V, v0, 0.5f);
    done(c);
    put(o, l, HS_DTYPE_F32, N * V);
    release(c, l), release(c, mx), release(c, sum), release(c, tl), release(c, t);
}

/* d = {N, E, K}: MoE routing of random logits rounded to dt: the chosen
 * experts (compared as numbers: one swapped choice fails), their weights in
 * dt's values and the softmax left in place. */
static void run_moe_route(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int E = (int)c->d[1], K = (int)c->d[2];
    float *p = rnd(c, HS_DTYPE_F32, N * E, 24, 4.0f), *w = zeros(c, (size_t)(N * K) + 1, 4);
    int32_t *ex = zeros(c, (size_t)(N * K) + 1, sizeof *ex);
    float *exf = calloc((size_t)(N * K) + 1, 4);
    hs_moe_router r = {.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1.0f};
    c->k->moe_route(c->s, ex, w, p, NULL, N, E, K, r, c->dt);
    done(c);
    for (int64_t i = 0; i < N * K; i++) exf[i] = (float)ex[i];
    put(o, exf, HS_DTYPE_F32, N * K), put(o, w, HS_DTYPE_F32, N * K);
    put(o, p, HS_DTYPE_F32, N * E);
    release(c, p), release(c, w), release(c, ex), free(exf);
}

/* d = {N, E, K, G, TG, renorm}: DeepSeek-V3's router: sigmoid scores, a
 * random correction bias, G groups of which TG are kept, weights times
 * 2.5; then its backward from random weight gradients. */
static void run_moe_route_scored(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int E = (int)c->d[1], K = (int)c->d[2];
    hs_moe_router r = {.sigmoid = true,
                       .renorm = c->d[5] != 0,
                       .n_group = (int)c->d[3],
                       .topk_group = (int)c->d[4],
                       .scale = 2.5f};
    float *p = rnd(c, HS_DTYPE_F32, N * E, 24, 4.0f), *w = zeros(c, (size_t)(N * K) + 1, 4);
    float *bias = rnd(c, HS_DTYPE_F32, E, 25, 0.2f), *dw = rnd(c, HS_DTYPE_F32, N * K, 26, 1.0f);
    float *dp = rnd(c, HS_DTYPE_F32, N * E, 27, 1.0f);
    int32_t *ex = zeros(c, (size_t)(N * K) + 1, sizeof *ex);
    float *exf = calloc((size_t)(N * K) + 1, 4);
    c->k->moe_route(c->s, ex, w, p, bias, N, E, K, r, c->dt);
    c->k->moe_route_bwd(c->s, dp, p, ex, dw, NULL, N, E, K, r);
    done(c);
    for (int64_t i = 0; i < N * K; i++) exf[i] = (float)ex[i];
    put(o, exf, HS_DTYPE_F32, N * K), put(o, w, HS_DTYPE_F32, N * K);
    put(o, p, HS_DTYPE_F32, N * E), put(o, dp, HS_DTYPE_F32, N * E);
    release(c, p), release(c, w), release(c, bias), release(c, dw), release(c, dp);
    release(c, ex), free(exf);
}

/* d = {N, K, C, E}: MoE dispatch and combine of N tokens with K slots
 * each on E experts (pair p's expert (p * 5 + p / 3) % E, grouped by a
 * stable counting sort as the model plans them): x rows to grouped order,
 * then random grouped rows y summed back per token with random weights. */
static void group_pairs(int64_t P, int E, int32_t *row_pair, int32_t *pair_row) {
    int64_t r = 0;
    for (int e = 0; e < E; e++)
        for (int64_t p = 0; p < P; p++)
            if ((p * 5 + p / 3) % E == e) row_pair[r] = (int32_t)p, pair_row[p] = (int32_t)r++;
}

static void run_moe_permute(const kcase *c, outs *o) {
    int64_t N = c->d[0], P = N * c->d[1];
    int K = (int)c->d[1], C = (int)c->d[2], E = (int)c->d[3];
    int32_t *row_pair = zeros(c, (size_t)P + 1, sizeof *row_pair);
    int32_t *pair_row = zeros(c, (size_t)P + 1, sizeof *pair_row);
    group_pairs(P, E, row_pair, pair_row);
    void *x = rnd(c, c->dt, N * C, 40, 2.0f), *xg = rnd(c, c->dt, P * C, 0, 0);
    void *y = rnd(c, c->dt, P * C, 41, 2.0f);
    float *w = rnd(c, HS_DTYPE_F32, P, 42, 1.0f), *out = rnd(c, HS_DTYPE_F32, N * C, 43, 1.0f);
    float *ws = zeros(c, (size_t)C + 1, sizeof *ws);
    c->k->moe_permute(c->s, xg, x, row_pair, c->dt, N, K, C);
    c->k->moe_unpermute(c->s, out, y, c->dt, pair_row, w, N, K, C, ws);
    done(c);
    put(o, xg, c->dt, P * C), put(o, out, HS_DTYPE_F32, N * C);
    release(c, row_pair), release(c, pair_row), release(c, x), release(c, xg), release(c, y);
    release(c, w), release(c, out), release(c, ws);
}

/* d = {N, K, C, E}: the dispatch's backward, grouped rows added back onto
 * their tokens' rows (which do not start at zero). */
static void run_moe_permute_bwd(const kcase *c, outs *o) {
    int64_t N = c->d[0], P = N * c->d[1];
    int K = (int)c->d[1], C = (int)c->d[2], E = (int)c->d[3];
    int32_t *row_pair = zeros(c, (size_t)P + 1, sizeof *row_pair);
    int32_t *pair_row = zeros(c, (size_t)P + 1, sizeof *pair_row);
    group_pairs(P, E, row_pair, pair_row);
    float *dxg = rnd(c, HS_DTYPE_F32, P * C, 44, 1.0f);
    float *dx = rnd(c, HS_DTYPE_F32, N * C, 45, 1.0f);
    c->k->moe_permute_bwd(c->s, dx, dxg, row_pair, N, K, C);
    done(c);
    put(o, dx, HS_DTYPE_F32, N * C);
    release(c, row_pair), release(c, pair_row), release(c, dxg), release(c, dx);
}

/* d = {N, K, C, E, aux}: the combine's backward (grouped rows in reverse
 * pair order) and the router's, renormalised and not, from probabilities
 * that sum to 1 per token,
 * token t choosing experts t, t + 1, ... (mod E), with the aux-loss
 * gradient when aux. */
static void run_moe_bwd(const kcase *c, outs *o) {
    int64_t N = c->d[0], P = N * c->d[1];
    int K = (int)c->d[1], C = (int)c->d[2], E = (int)c->d[3];
    int32_t *pair_row = zeros(c, (size_t)P + 1, sizeof *pair_row);
    int32_t *sel = zeros(c, (size_t)P + 1, sizeof *sel);
    for (int64_t p = 0; p < P; p++)
        pair_row[p] = (int32_t)(P - 1 - p), sel[p] = (int32_t)((p / K + p % K) % E);
    float *dout = rnd(c, HS_DTYPE_F32, N * C, 44, 1.0f), *w = rnd(c, HS_DTYPE_F32, P, 45, 1.0f);
    void *y = rnd(c, c->dt, P * C, 46, 2.0f);
    float *dyg = rnd(c, HS_DTYPE_F32, P * C, 0, 0), *dw = rnd(c, HS_DTYPE_F32, P, 0, 0);
    float *ws = zeros(c, (size_t)C + 1, sizeof *ws);
    float *probs = rnd(c, HS_DTYPE_F32, N * E, 47, 1.0f);
    float *aux = c->d[4] ? rnd(c, HS_DTYPE_F32, E, 48, 0.1f) : NULL;
    float *dp = rnd(c, HS_DTYPE_F32, N * E, 49, 1.0f);
    for (int64_t t = 0; t < N; t++) {
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += (probs[t * E + e] = 1.5f + probs[t * E + e]);
        for (int e = 0; e < E; e++) probs[t * E + e] /= sum;
    }
    c->k->moe_combine_bwd(c->s, dyg, dw, dout, y, c->dt, pair_row, w, N, K, C, ws);
    hs_moe_router r = {.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1.0f};
    c->k->moe_route_bwd(c->s, dp, probs, sel, dw, aux, N, E, K, r);
    done(c);
    put(o, dyg, HS_DTYPE_F32, P * C), put(o, dw, HS_DTYPE_F32, P), put(o, dp, HS_DTYPE_F32, N * E);
    /* the weights as the softmax gave them (Qwen3-MoE's norm_topk_prob false) */
    r.renorm = false;
    c->k->moe_route_bwd(c->s, dp, probs, sel, dw, aux, N, E, K, r);
    done(c);
    put(o, dp, HS_DTYPE_F32, N * E);
    release(c, pair_row), release(c, sel), release(c, dout), release(c, w), release(c, y);
    release(c, dyg), release(c, dw), release(c, ws), release(c, probs), release(c, aux);
    release(c, dp);
}

/* Counts and fp64 sums as fp32 outputs: exact for counts below 2^24 and
 * sums to fp32's precision, which the tolerance asks for. */
static void put_stats(outs *o, const int64_t *count, const double *prob_sum, int E) {
    float *v = calloc((size_t)E + 1, sizeof *v);
    for (int e = 0; e < E; e++) v[e] = (float)count[e];
    put(o, v, HS_DTYPE_F32, E);
    for (int e = 0; prob_sum && e < E; e++) v[e] = (float)prob_sum[e];
    if (prob_sum) put(o, v, HS_DTYPE_F32, E);
    free(v);
}

/* Statistics that do not start at zero, so that a store in place of += fails. */
static void stats_start(const kcase *c, int64_t *count, double *prob_sum, int E, uint64_t seed) {
    float *r = rnd(c, HS_DTYPE_F32, E, seed, 1.0f);
    for (int e = 0; e < E; e++) count[e] = 3 * e + 1, prob_sum[e] = 2.0 + r[e];
    release(c, r);
}

/* d = {N, E, K, no_sums}: the router's statistics accumulated from K
 * distinct experts per token (token t: (t * 3 + k * 5) % E, ..., the next
 * free one up) and softmax-like probabilities; with no_sums, counts only. */
static int32_t *distinct_sel(const kcase *c, int64_t N, int E, int K) {
    int32_t *sel = zeros(c, (size_t)(N * K) + 1, sizeof *sel);
    for (int64_t t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            int32_t e = (int32_t)((t * 3 + k * 5) % E);
            for (int j = 0; j < k; j++) /* taken: the next one, from the start */
                if (sel[t * K + j] == e) e = (e + 1) % E, j = -1;
            sel[t * K + k] = e;
        }
    return sel;
}

static void run_moe_stats(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int E = (int)c->d[1], K = (int)c->d[2];
    int32_t *sel = distinct_sel(c, N, E, K);
    float *probs = rnd(c, HS_DTYPE_F32, N * E, 50, 0.5f);
    for (int64_t i = 0; i < N * E; i++) probs[i] += 0.5f;
    int64_t *count = zeros(c, (size_t)E, sizeof *count);
    double *prob_sum = zeros(c, (size_t)E, sizeof *prob_sum);
    stats_start(c, count, prob_sum, E, 51);
    double *sums = c->d[3] ? NULL : prob_sum;
    c->k->moe_stats(c->s, count, sums, sel, probs, N, E, K);
    done(c);
    put_stats(o, count, sums, E);
    release(c, sel), release(c, probs), release(c, count), release(c, prob_sum);
}

/* d = {E, no_sums}: running totals += a layer's statistics. */
static void run_moe_stats_add(const kcase *c, outs *o) {
    int E = (int)c->d[0];
    int64_t *count = zeros(c, (size_t)E + 1, sizeof *count);
    int64_t *in = zeros(c, (size_t)E + 1, sizeof *in);
    double *sum = zeros(c, (size_t)E + 1, sizeof *sum);
    double *sum_in = zeros(c, (size_t)E + 1, sizeof *sum_in);
    stats_start(c, count, sum, E, 52);
    stats_start(c, in, sum_in, E, 53);
    for (int e = 0; e < E; e++) in[e] *= 7, sum_in[e] *= 1000.0;
    double *sums = c->d[1] ? NULL : sum;
    c->k->moe_stats_add(c->s, count, sums, in, sum_in, E);
    done(c);
    put_stats(o, count, sums, E);
    release(c, count), release(c, in), release(c, sum), release(c, sum_in);
}

/* Integers as fp32 outputs: exact below 2^24. */
static void put_ints(outs *o, const int32_t *v, int64_t n) {
    float *f = calloc((size_t)n + 1, sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
    put(o, f, HS_DTYPE_F32, n);
    free(f);
}

/* d = {N, E, K}: the grouped order of distinct per-token experts, with the
 * counts moe_stats gives them. */
static void run_moe_dispatch(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    int E = (int)c->d[1], K = (int)c->d[2];
    int32_t *sel = distinct_sel(c, N, E, K);
    int64_t *count = zeros(c, (size_t)E, sizeof *count);
    for (int64_t p = 0; p < N * K; p++) count[sel[p]]++;
    int32_t *offset = zeros(c, (size_t)E + 1, sizeof *offset);
    int32_t *row_pair = zeros(c, (size_t)(N * K) + 1, sizeof *row_pair);
    int32_t *pair_row = zeros(c, (size_t)(N * K) + 1, sizeof *pair_row);
    c->k->moe_dispatch(c->s, offset, row_pair, pair_row, sel, count, N, E, K);
    done(c);
    put_ints(o, offset, E + 1);
    put_ints(o, row_pair, N * K);
    put_ints(o, pair_row, N * K);
    release(c, sel), release(c, count), release(c, offset), release(c, row_pair);
    release(c, pair_row);
}

/* d = {N, C, V, v0, f32}: a table of V rows holding the vocabulary rows
 * [v0, v0 + V) of a 2 v0 + V vocabulary: gather (into fp32 rows with f32,
 * else into dt), then scatter-add with repeated tokens; with v0 > 0 the
 * tokens fall below, inside and above the range. */
static void run_embedding(const kcase *c, outs *o) {
    int64_t N = c->d[0], v0 = c->d[3];
    int C = (int)c->d[1], V = (int)c->d[2];
    hs_dtype odt = c->d[4] ? HS_DTYPE_F32 : c->dt;
    void *wte = rnd(c, c->dt, (int64_t)V * C, 21, 1.0f), *out = rnd(c, odt, N * C, 0, 0);
    void *dwte = rnd(c, c->dt, (int64_t)V * C, 22, 0.1f);
    float *dout = rnd(c, HS_DTYPE_F32, N * C, 23, 1.0f);
    for (int64_t i = 0; i < N * C; i++) hs_st(out, odt, i, NAN); /* rows outside must be written */
    int32_t *t = ids(c, N, (int)(2 * v0 + V), 1);
    c->k->embedding_fwd(c->s, out, odt, t, wte, c->dt, N, C, v0, V);
    c->k->embedding_bwd(c->s, dwte, c->dt, dout, t, N, C, v0, V);
    done(c);
    put(o, out, odt, N * C), put(o, dwte, c->dt, (int64_t)V * C);
    release(c, wte), release(c, out), release(c, dwte), release(c, dout), release(c, t);
}

/* d = {N, all_ignored}: the vocab-parallel loss from reduced row maxima,
 * sums and target logits; every third target is ignored (all with
 * all_ignored). The fp64 loss (a host value) is compared as its fp32
 * rounding and the fp32 rounding of the rest, so an error in its low bits
 * shows. */
static void run_xent_shard_loss(const kcase *c, outs *o) {
    int64_t N = c->d[0];
    float *mx = rnd(c, HS_DTYPE_F32, N, 27, 8.0f), *sum = rnd(c, HS_DTYPE_F32, N, 28, 50.0f);
    float *tl = rnd(c, HS_DTYPE_F32, N, 29, 8.0f);
    for (int64_t i = 0; i < N; i++) sum[i] = fabsf(sum[i]) + 1.0f;
    int32_t *t = ids(c, N, 1000, 5);
    for (int64_t i = 0; i < N; i++)
        if (c->d[1] || i % 3 == 1) t[i] = -1 - (int32_t)(i % 2); /* -1 and -2 */
    double loss = NAN;
    c->k->xent_shard_loss(c->s, &loss, mx, sum, tl, t, N);
    done(c);
    float hi = (float)loss, lo = (float)(loss - hi);
    put(o, &hi, HS_DTYPE_F32, 1), put(o, &lo, HS_DTYPE_F32, 1);
    release(c, mx), release(c, sum), release(c, tl), release(c, t);
}

/* d = {n}: three AdamW steps with weight decay, p held in dt (fp32
 * states). */
static void run_adamw(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    void *p = rnd(c, c->dt, n, 24, 1.0f);
    float *g = rnd(c, HS_DTYPE_F32, n, 25, 0.1f);
    float *m = rnd(c, HS_DTYPE_F32, n, 26, 0.01f), *v = rnd(c, HS_DTYPE_F32, n, 0, 0);
    for (int step = 1; step <= 3; step++) {
        double lr = 1e-2, bc1 = 1.0 - pow(0.9, step), bc2 = 1.0 - pow(0.999, step);
        hs_adamw_hparams h = {.beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .one_minus_beta1 = 0.1f,
                              .one_minus_beta2 = (float)(1.0 - 0.999),
                              .step_size = (float)(lr / bc1),
                              .bias2_sqrt = (float)sqrt(bc2),
                              .eps = 1e-8f,
                              .decay_factor = (float)(1.0 - lr * 0.1)};
        c->k->adamw(c->s, p, c->dt, m, v, g, &h, n);
    }
    done(c);
    put(o, p, c->dt, n), put(o, m, HS_DTYPE_F32, n), put(o, v, HS_DTYPE_F32, n);
    /* adamw_many: the same tensor as two pieces and an empty one, the
     * second piece without weight decay, against adamw per piece on a
     * copy: the same bits; each piece also writes p in another dtype, the
     * bits of a convert of the updated p */
    size_t e = hs_dtype_size(c->dt);
    void *p2 = zeros(c, (size_t)n, e);
    float *m2 = zeros(c, (size_t)n, 4), *v2 = zeros(c, (size_t)n, 4);
    memcpy(p2, p, (size_t)n * e), memcpy(m2, m, (size_t)n * 4), memcpy(v2, v, (size_t)n * 4);
    int64_t half = n / 2;
    hs_dtype cdt = c->dt == HS_DTYPE_F32 ? HS_DTYPE_BF16 : HS_DTYPE_F32;
    size_t ce = hs_dtype_size(cdt);
    void *cp = zeros(c, (size_t)n, ce), *cp_want = zeros(c, (size_t)n, ce);
    hs_adamw_hparams h = {.beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .one_minus_beta1 = 0.1f,
                          .one_minus_beta2 = (float)(1.0 - 0.999),
                          .step_size = 0.05f,
                          .bias2_sqrt = 0.06f,
                          .eps = 1e-8f,
                          .decay_factor = 0.999f};
    hs_adamw_tensor t[3] = {
        {.p = p2,
         .pdt = c->dt,
         .m = m2,
         .v = v2,
         .g = g,
         .n = half,
         .decay_factor = 0.999f,
         .copy = cp,
         .copy_dt = cdt},
        {.p = (char *)p2 + half * e,
         .pdt = c->dt,
         .m = m2 + half,
         .v = v2 + half,
         .g = g + half,
         .n = n - half,
         .decay_factor = 1.0f,
         .copy = (char *)cp + half * ce,
         .copy_dt = cdt},
        {.p = p2, .pdt = c->dt, .m = m2, .v = v2, .g = g, .n = 0, .decay_factor = 0.5f}};
    c->k->adamw_many(c->s, t, 3, &h);
    c->k->adamw(c->s, p, c->dt, m, v, g, &h, half);
    hs_adamw_hparams plain = h;
    plain.decay_factor = 1.0f;
    c->k->adamw(c->s, (char *)p + half * e, c->dt, m + half, v + half, g + half, &plain, n - half);
    c->k->convert(c->s, cp_want, cdt, p, c->dt, n);
    done(c);
    assert_memory_equal(p2, p, (size_t)n * e);
    assert_memory_equal(cp, cp_want, (size_t)n * ce);
    assert_memory_equal(m2, m, (size_t)n * 4);
    assert_memory_equal(v2, v, (size_t)n * 4);
    put(o, p2, c->dt, n);
    release(c, p), release(c, g), release(c, m), release(c, v);
    release(c, p2), release(c, m2), release(c, v2);
    release(c, cp), release(c, cp_want);
}

/* d = {n}: three Muon updates p = 0.99 p - 0.02 u, p held in dt. */
static void run_muon_update(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    void *p = rnd(c, c->dt, n, 30, 1.0f);
    float *u = rnd(c, HS_DTYPE_F32, n, 31, 1.0f);
    for (int step = 0; step < 3; step++) c->k->muon_update(c->s, p, c->dt, u, 0.99f, 0.02f, n);
    done(c);
    put(o, p, c->dt, n);
    release(c, p), release(c, u);
}

/* d = {n}: x *= -0.75 and then x *= 3 in place, x held in dt. */
static void run_scale_cast(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    void *x = rnd(c, c->dt, n, 32, 2.0f);
    c->k->scale_cast(c->s, x, c->dt, -0.75f, n);
    done(c);
    put(o, x, c->dt, n);
    c->k->scale_cast(c->s, x, c->dt, 3.0f, n);
    done(c);
    put(o, x, c->dt, n);
    release(c, x);
}

/* d = {n, block, fmt, nan}: a source in dt quantized (a block of zeros,
 * with nan a NaN in the last block), read back whole into dt and fp32
 * (then added to itself), and a middle range alone; the scales are an
 * output of their own. */
static void run_quantize(const kcase *c, outs *o) {
    int64_t n = c->d[0], block = c->d[1];
    hs_quant_fmt f = (hs_quant_fmt)c->d[2];
    void *x = rnd(c, c->dt, n, 71, 3.0f);
    for (int64_t i = block; i < 2 * block && i < n; i++) hs_st(x, c->dt, i, 0.0f);
    if (c->d[3] && n > 0) hs_st(x, c->dt, n - 1, NAN);
    size_t pb = hs_quant_packed_bytes(n, block, f);
    uint8_t *packed = zeros(c, pb, 1);
    void *back = zeros(c, (size_t)n, hs_dtype_size(c->dt));
    float *back32 = zeros(c, (size_t)n, sizeof(float));
    int64_t first = n / 3, count = n / 2;
    float *mid = zeros(c, (size_t)count, sizeof(float));
    c->k->quantize(c->s, packed, x, c->dt, n, block, f);
    c->k->dequantize(c->s, back, c->dt, packed, n, 0, n, block, f);
    c->k->dequantize(c->s, back32, HS_DTYPE_F32, packed, n, 0, n, block, f);
    c->k->dequantize(c->s, mid, HS_DTYPE_F32, packed, n, first, count, block, f);
    if (c->k->dequantize_add) c->k->dequantize_add(c->s, back32, packed, n, 0, n, block, f);
    done(c);
    put(o, back, c->dt, n), put(o, back32, HS_DTYPE_F32, n), put(o, mid, HS_DTYPE_F32, count);
    put(o, packed + pb - 4 * ((n + block - 1) / block), HS_DTYPE_F32, (n + block - 1) / block);
    release(c, x), release(c, packed), release(c, back), release(c, back32), release(c, mid);
}

/* d = {n, nesterov}: Muon's momentum from a buffer that does not start at
 * zero, twice. */
static void run_muon_momentum(const kcase *c, outs *o) {
    int64_t n = c->d[0];
    float *dir = rnd(c, HS_DTYPE_F32, n, 0, 0), *buf = rnd(c, HS_DTYPE_F32, n, 60, 1.0f);
    float *g = rnd(c, HS_DTYPE_F32, n, 61, 1.0f);
    for (int i = 0; i < 2; i++) c->k->muon_momentum(c->s, dir, buf, g, 0.95f, c->d[1] != 0, n);
    done(c);
    put(o, dir, HS_DTYPE_F32, n), put(o, buf, HS_DTYPE_F32, n);
    release(c, dir), release(c, buf), release(c, g);
}

/* d = {rows, cols, steps, workspace}: Newton-Schulz of a random matrix,
 * with the caller's workspace or the kernel's own. */
static void run_muon_newton_schulz(const kcase *c, outs *o) {
    int64_t rows = c->d[0], cols = c->d[1];
    float *g = rnd(c, HS_DTYPE_F32, rows * cols, 62, 1.0f);
    float *out = rnd(c, HS_DTYPE_F32, rows * cols, 0, 0);
    float *ws = c->d[3] ? zeros(c, (size_t)hs_newton_schulz5_scratch_floats(rows, cols) + 1, 4)
                        : NULL;
    c->k->muon_newton_schulz(c->s, out, g, rows, cols, (int)c->d[2], ws);
    done(c);
    put(o, out, HS_DTYPE_F32, rows * cols);
    release(c, g), release(c, out), release(c, ws);
}

/* d = {rows, row_bytes, pad}: rows between strides row_bytes + pad and
 * row_bytes + 2 pad; the gaps of the destination keep their bytes. */
static void run_copy_2d(const kcase *c, outs *o) {
    int64_t rows = c->d[0];
    size_t rb = (size_t)c->d[1] * 4, ss = rb + (size_t)c->d[2] * 4,
           ds = rb + 2 * (size_t)c->d[2] * 4;
    int64_t nd = (int64_t)(rows * (int64_t)ds / 4);
    float *src = rnd(c, HS_DTYPE_F32, (int64_t)(rows * (int64_t)ss / 4), 63, 1.0f);
    float *dst = rnd(c, HS_DTYPE_F32, nd, 64, 1.0f);
    c->k->copy_2d(c->s, dst, ds, src, ss, rows, rb);
    done(c);
    put(o, dst, HS_DTYPE_F32, nd);
    release(c, src), release(c, dst);
}

#define K(member) offsetof(hs_device_kernels, member)

/* Tolerances {fp32, bf16, fp16}: fp32 outputs are a few fp32 roundings
 * from the fp64 reference; a 16-bit output is one rounding of its dtype
 * (bf16 2^-8, fp16 2^-11 relative to the largest element) plus inputs the
 * fast path rounded on the way. */
/* The floor: 1 for RMSNorm, whose dx on a short row is a difference of two
 * nearly equal terms of the inputs' size (the fp32 fast path loses its
 * low bits to cancellation there, as any fp32 code would). */
static const op_def ops[] = {
    {"gemm",
     K(gemm),
     ALL_DT,
     {2e-6f, 1.6e-2f, 2e-3f},
     1e-30,
     {{1, 1, 1, 0, 0, 0},
      {7, 5, 3, 0, 0, 0},
      {33, 17, 65, 0, 0, 0},
      {13, 9, 11, 1, 0, 0},
      {13, 9, 11, 0, 1, 3},
      {19, 23, 29, 1, 1, 5},
      {0, 4, 5, 0, 0, 0},
      {4, 4, 0, 0, 0, 1}},
     8,
     run_gemm},
    {"gemm_beta0",
     K(gemm),
     ALL_DT,
     {2e-6f, 1.6e-2f, 2e-3f},
     1e-30,
     {{7, 5, 3, 0, 0, 0, 1}, {33, 17, 65, 1, 0, 2, 1}, {4, 4, 0, 0, 0, 0, 1}},
     3,
     run_gemm},
    /* One 16-bit operand and one fp32: where oneDNN has the native matmul
     * the fast path rounds the fp32 operand to the other's dtype (as a
     * 16-bit autograd holds it), so the bound is one 16-bit rounding. */
    {"gemm_mixed",
     K(gemm),
     BF16 | F16,
     {0, 1.6e-2f, 2e-3f},
     1e-30,
     {{7, 5, 3, 0, 0, 0, 0, 1}, {33, 17, 65, 0, 1, 0, 0, 1}, {19, 23, 29, 1, 0, 3, 1, 1}},
     3,
     run_gemm},
    {"convert",
     K(convert),
     ALL_DT,
     {0, 4e-3f, 5e-4f},
     1e-30,
     {{0}, {1}, {7}, {1000}, {40001}},
     5,
     run_convert},
    {"elementwise",
     K(fill),
     F32,
     {1e-6f, 0, 0},
     1e-30,
     {{0}, {1}, {7}, {1000}, {40001}},
     5,
     run_elementwise},
    {"round_add_cast",
     K(round),
     ALL_DT,
     {0, 4e-3f, 5e-4f},
     1e-30,
     {{0}, {1}, {7}, {40001}},
     4,
     run_round_add},
    {"rmsnorm",
     K(rmsnorm_fwd),
     ALL_DT,
     {1e-6f, 8e-3f, 1e-3f},
     1.0,
     {{1, 1}, {3, 7}, {5, 64}, {33, 257}, {70, 33}, {0, 16}, {5, 64, 1}, {70, 33, 1}},
     8,
     run_rmsnorm},
    {"rope",
     K(rope_fwd),
     ALL_DT,
     {1e-6f, 8e-3f, 1e-3f},
     1e-30,
     {{1, 1, 1, 2}, {2, 5, 3, 8}, {1, 7, 2, 64}, {2, 3, 4, 18}, {0, 3, 2, 4}},
     5,
     run_rope},
    {"rope_tables",
     K(rope_tables),
     F32,
     {0, 0, 0},
     1e-30,
     {{1, 2, 10000}, {7, 8, 10000}, {300, 64, 500000}, {0, 4, 10000}, {40, 16, 10000, 1139}},
     5,
     run_rope_tables},
    {"swiglu",
     K(swiglu_fwd),
     ALL_DT,
     {2e-6f, 8e-3f, 1e-3f},
     1e-30,
     {{0}, {1}, {7}, {8193}, {40001}},
     5,
     run_swiglu},
    {"attention",
     K(attention_fwd),
     ALL_DT,
     {1e-5f, 2e-2f, 4e-3f},
     1e-30,
     {{1, 1, 1, 2, 1, 0},
      {2, 4, 2, 8, 7, 0},
      {1, 4, 1, 16, 33, 0},
      {1, 2, 2, 8, 300, 0},
      {2, 4, 2, 8, 9, 1},
      {1, 2, 1, 4, 300, 1},
      {1, 2, 1, 4, 10, 2},
      {1, 2, 1, 4, 0, 0},
      {2, 4, 2, 8, 33, 0, 1},
      {1, 2, 1, 4, 300, 0, 1},
      {2, 4, 2, 8, 9, 1, 1},
      {2, 4, 2, 8, 33, 0, 0, 1},
      {1, 2, 1, 4, 300, 0, 1, 1},
      {2, 4, 2, 8, 9, 1, 0, 1},
      {1, 2, 1, 4, 300, 1, 1, 1}},
     15,
     run_attention},
    {"attention_merge",
     K(attention_merge),
     F32,
     {1e-6f, 0, 0},
     1e-30,
     {{1, 1, 1, 1, 0}, {2, 3, 8, 7, 0}, {1, 4, 64, 33, 1}, {2, 2, 16, 12, 2}, {1, 2, 8, 0, 0}},
     5,
     run_attention_merge},
    {"xent",
     K(xent),
     F32,
     {2e-6f, 0, 0},
     1e-30,
     {{1, 1}, {3, 7}, {4, 1000}, {7, 33}, {0, 5}},
     5,
     run_xent},
    {"xent_shard",
     K(xent_shard_sums),
     F32,
     {2e-6f, 0, 0},
     1e-30,
     {{1, 1, 0}, {3, 7, 0}, {4, 1000, 1000}, {7, 33, 20}, {0, 5, 0}},
     5,
     run_xent_shard},
    /* The same fp64 additions in row order: the low bits are compared too. */
    {"xent_shard_loss",
     K(xent_shard_loss),
     F32,
     {1e-6f, 0, 0},
     1e-30,
     {{0}, {1}, {2}, {7}, {1000}, {4099}, {5, 1}},
     7,
     run_xent_shard_loss},
    {"moe_route",
     K(moe_route),
     ALL_DT,
     {1e-6f, 4e-3f, 5e-4f},
     1.0,
     {{1, 4, 2}, {7, 8, 2}, {33, 16, 4}, {5, 3, 3}, {0, 4, 1}},
     5,
     run_moe_route},
    /* The choices equal, as above; the sigmoid's backward is element-wise. */
    {"moe_route_scored",
     K(moe_route),
     ALL_DT,
     {1e-6f, 4e-3f, 5e-4f},
     1.0,
     {{1, 4, 2, 2, 1, 1},
      {7, 8, 2, 4, 2, 1},
      {33, 16, 4, 4, 2, 0},
      {5, 6, 3, 3, 2, 1},
      {9, 8, 3, 1, 1, 1},
      {0, 4, 1, 2, 1, 1}},
     6,
     run_moe_route_scored},
    {"moe_permute",
     K(moe_permute),
     ALL_DT,
     {1e-6f, 1e-6f, 1e-6f},
     1e-30,
     {{1, 1, 1, 1}, {7, 2, 5, 4}, {33, 4, 17, 8}, {5, 3, 64, 3}, {0, 2, 8, 4}},
     5,
     run_moe_permute},
    {"moe_permute_bwd",
     K(moe_permute_bwd),
     F32,
     {1e-7f, 0, 0},
     1e-30,
     {{1, 1, 1, 1}, {7, 2, 5, 4}, {33, 4, 17, 8}, {5, 3, 64, 3}, {0, 2, 8, 4}},
     5,
     run_moe_permute_bwd},
    {"moe_bwd",
     K(moe_combine_bwd),
     ALL_DT,
     {1e-6f, 1e-6f, 1e-6f},
     1e-30,
     {{1, 1, 1, 1, 0}, {7, 2, 5, 4, 1}, {33, 4, 17, 8, 0}, {5, 3, 64, 3, 1}, {0, 2, 8, 4, 1}},
     5,
     run_moe_bwd},
    /* The statistics are one fp64 rounding per addition in an order the
     * table fixes: fp32's precision of the outputs is all they may lose. */
    {"moe_stats",
     K(moe_stats),
     F32,
     {1e-7f, 0, 0},
     1e-30,
     {{0, 4, 2},
      {1, 1, 1},
      {1, 4, 2},
      {7, 3, 3},
      {33, 8, 2},
      {5, 1, 1},
      {9, 16, 4, 1},
      {4099, 64, 6},
      {40001, 8, 2},
      {40001, 8, 2, 1}},
     10,
     run_moe_stats},
    {"moe_stats_add",
     K(moe_stats_add),
     F32,
     {1e-7f, 0, 0},
     1e-30,
     {{1}, {3}, {64}, {7, 1}},
     4,
     run_moe_stats_add},
    /* Integers: exact. */
    {"moe_dispatch",
     K(moe_dispatch),
     F32,
     {0, 0, 0},
     1e-30,
     {{0, 4, 2}, {1, 1, 1}, {1, 4, 2}, {7, 3, 3}, {33, 8, 2}, {4099, 64, 6}, {40001, 8, 2}},
     7,
     run_moe_dispatch},
    {"embedding",
     K(embedding_fwd),
     ALL_DT,
     {1e-6f, 8e-3f, 1e-3f},
     1e-30,
     {{1, 1, 1},
      {5, 7, 3},
      {9, 33, 4},
      {0, 4, 4},
      {9, 33, 4, 3},
      {40, 16, 8, 5},
      {1, 1, 1, 0, 1},
      {9, 33, 4, 3, 1},
      {40, 16, 8, 5, 1},
      {0, 4, 4, 2, 1}},
     10,
     run_embedding},
    /* A 16-bit parameter: one rounding of its dtype per step; 70001 is
     * past the fast path's threading threshold. */
    {"muon_momentum",
     K(muon_momentum),
     F32,
     {1e-6f, 0, 0},
     1e-30,
     {{0, 0}, {1, 0}, {7, 1}, {4099, 0}, {4099, 1}},
     5,
     run_muon_momentum},
    /* Five iterations of fp32 GEMMs against fp64 ones. */
    {"muon_newton_schulz",
     K(muon_newton_schulz),
     F32,
     {2e-5f, 0, 0},
     1e-30,
     {{1, 1, 5, 0}, {3, 7, 5, 1}, {16, 9, 5, 0}, {32, 64, 5, 1}, {64, 32, 3, 0}},
     5,
     run_muon_newton_schulz},
    {"copy_2d",
     K(copy_2d),
     F32,
     {0, 0, 0},
     1e-30,
     {{0, 4, 1}, {1, 1, 0}, {7, 5, 3}, {33, 64, 1}},
     4,
     run_copy_2d},
    {"adamw",
     K(adamw),
     ALL_DT,
     {2e-6f, 8e-3f, 1e-3f},
     1e-30,
     {{0}, {1}, {7}, {1000}, {4099}, {70001}},
     6,
     run_adamw},
    {"muon_update",
     K(muon_update),
     ALL_DT,
     {1e-6f, 8e-3f, 1e-3f},
     1e-30,
     {{0}, {1}, {7}, {1000}, {4099}, {70001}},
     6,
     run_muon_update},
    {"scale_cast",
     K(scale_cast),
     ALL_DT,
     {1e-7f, 4e-3f, 5e-4f},
     1e-30,
     {{0}, {1}, {7}, {1025}, {70001}},
     5,
     run_scale_cast},
    /* The same bits: every backend is the tensor layer's routine. */
    {"quantize",
     K(quantize),
     ALL_DT,
     {0, 0, 0},
     1e-30,
     {{0, 8, HS_QUANT_INT8},
      {1, 1, HS_QUANT_INT8},
      {7, 4, HS_QUANT_FP8_E4M3, 1},
      {1000, 128, HS_QUANT_INT8, 1},
      {4099, 256, HS_QUANT_FP8_E4M3},
      {70001, 32, HS_QUANT_INT8},
      {70001, 2048, HS_QUANT_FP8_E4M3},
      {7, 4, HS_QUANT_INT4, 1},
      {1001, 128, HS_QUANT_INT4},
      {70001, 32, HS_QUANT_INT4}},
     10,
     run_quantize},
};

/* ------------------------------------------------------------ the driver */

static bool has(const hs_device_kernels *k, size_t entry) {
    void (*fn)(void);
    memcpy(&fn, (const char *)k + entry, sizeof fn);
    return fn != NULL;
}

/* Normalised max error of got against want; INFINITY where got has a NaN
 * that want does not, or the lengths differ. */
static double norm_err(const outs *got, const outs *want, double floor) {
    if (got->n != want->n) return INFINITY;
    double worst = 0.0;
    for (int j = 0; j < got->n; j++) {
        if (got->len[j] != want->len[j]) return INFINITY;
        double mx = floor, diff = 0.0;
        for (int64_t i = 0; i < got->len[j]; i++) {
            double a = got->v[j][i], b = want->v[j][i];
            if (isnan(a) != isnan(b)) return INFINITY;
            if (isnan(b)) continue;
            mx = fabs(b) > mx ? fabs(b) : mx;
            diff = fabs(a - b) > diff ? fabs(a - b) : diff;
        }
        worst = diff / mx > worst ? diff / mx : worst;
    }
    return worst;
}

typedef struct tally {
    int checked, failed, not_provided, ops_checked;
} tally;

static void run_op(const op_def *op, hs_device *dev, hs_device *ref, tally *t, bool verbose) {
    if (!has(dev->k, op->entry)) {
        t->not_provided++;
        printf("  %-12s not provided by %s\n", op->name, dev->name);
        return;
    }
    t->ops_checked++;
    for (int dt = 0; dt < HS_DTYPE_COUNT; dt++) {
        if (!(op->dtypes & (1u << dt))) continue;
        for (int i = 0; i < op->n_shapes; i++) {
            outs got = {0}, want = {0};
            kcase cg = {dev, dev->k, dev->stream, (hs_dtype)dt, op->shapes[i]};
            kcase cw = {ref, ref->k, ref->stream, (hs_dtype)dt, op->shapes[i]};
            op->run(&cg, &got);
            op->run(&cw, &want);
            double err = norm_err(&got, &want, op->floor);
            bool ok = err <= op->tol[dt];
            t->checked++;
            if (!ok) t->failed++;
            if (!ok || verbose)
                printf("  %s %-12s %-9s shape #%d {%lld, %lld, %lld, %lld}: error %.3g (tolerance "
                       "%.3g)\n",
                       ok ? "ok  " : "FAIL", op->name, hs_dtype_name((hs_dtype)dt), i,
                       (long long)op->shapes[i][0], (long long)op->shapes[i][1],
                       (long long)op->shapes[i][2], (long long)op->shapes[i][3], err,
                       (double)op->tol[dt]);
            outs_free(&got), outs_free(&want);
        }
    }
}

/* A failure the device recorded instead of returning it (a launch, a
 * kernel's scratch): it fails the backend, with its message. */
static void assert_no_fault(hs_device *d) {
    hs_error e;
    hs_error_clear(&e);
    hs_status st = hs_device_status(d, &e);
    if (st != HS_OK) printf("%s: the device recorded a failure: %s\n", d->name, e.msg);
    assert_int_equal(st, HS_OK);
}

/* The backends under test; `tested` counts those that could be created. */
typedef struct selection {
    hs_device_kind kinds[HS_DEVICE_KIND_COUNT];
    int n, tested;
} selection;

/* reference itself is the oracle, so it is not run against itself. A
 * backend that needs hardware (every one but cpu) and cannot be created
 * here is skipped with the reason; cpu must always be created. */
static void test_backends_match_reference_op_by_op(void **state) {
    selection *sel = *state;
    bool verbose = getenv("HS_DEVICE_TEST_VERBOSE") != NULL;
    hs_device *ref = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_REFERENCE, NULL, &ref, &e), HS_OK);
    for (int b = 0; b < sel->n; b++) {
        hs_device *dev = NULL;
        hs_error_clear(&e);
        if (hs_device_create(sel->kinds[b], NULL, &dev, &e) != HS_OK) {
            if (sel->kinds[b] == HS_DEVICE_CPU) fail_msg("cpu: cannot be created: %s", e.msg);
            printf("%s: skipped, the device cannot be created here: %s\n",
                   hs_device_kind_name(sel->kinds[b]), e.msg);
            continue;
        }
        tally t = {0};
        printf("%s against reference:\n", dev->name);
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            run_op(&ops[i], dev, ref, &t, verbose);
        printf("%s: %d cases (op x dtype x shape) over %d ops checked, %d failed; %d ops not "
               "provided\n",
               dev->name, t.checked, t.ops_checked, t.failed, t.not_provided);
        assert_no_fault(dev);
        assert_no_fault(ref);
        assert_int_equal(t.failed, 0);
        assert_true(t.checked > 0);
        hs_device_free(dev);
        sel->tested++;
    }
    hs_device_free(ref);
    if (sel->tested == 0) skip();
}

/* argv[1]: the backend to test (cpu, cuda); without it every compiled
 * backend but reference. Exit 77 (a skip to ctest) when none could be
 * created. */
int main(int argc, char **argv) {
    selection sel = {0};
    if (argc > 2) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    if (argc == 2) {
        hs_device_kind k;
        if (!hs_device_kind_parse(argv[1], &k) || k == HS_DEVICE_REFERENCE) {
            fprintf(stderr,
                    "%s: '%s' is not a backend to test: name cpu or cuda (reference is the "
                    "oracle the others are held to)\n",
                    argv[0], argv[1]);
            return 2;
        }
        sel.kinds[sel.n++] = k;
    }
    for (int k = 0; argc == 1 && k < HS_DEVICE_KIND_COUNT; k++)
        if (k != HS_DEVICE_REFERENCE && hs_device_kind_compiled((hs_device_kind)k))
            sel.kinds[sel.n++] = (hs_device_kind)k;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_backends_match_reference_op_by_op, &sel),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed == 0 && sel.tested == 0 ? 77 : failed;
}
