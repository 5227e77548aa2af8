/* model/layers: each layer's backward against central finite differences
 * of its forward, in fp32 with the objective summed in fp64:
 * f(inputs) = sum_i r_i * out_i for a fixed random r, so d f / d out = r.
 * HS_TEST_TIERS: avx2 gemm16_native gemm16_widened */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "device/cpu_kernels.h"
#include "model/layers.h"

/* The cpu device the layers compute on, created once for the whole run. */
static hs_device *cpu_dev(void) {
    static hs_device *d;
    hs_error e;
    if (!d && hs_device_create(HS_DEVICE_CPU, NULL, &d, &e) != HS_OK) fail_msg("%s", e.msg);
    return d;
}

#define FD_H 1e-2f
#define FD_TOL 5e-3

static void fill(float *x, int64_t n, uint64_t stream, float std) {
    hs_rng_fill_normal(x, n, 1234, stream, 0, 0.0f, std);
}

static double dot(const float *r, const float *y, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    return s;
}

/* A layer under test: run(ctx) evaluates f with the current inputs. */
typedef double (*objective_fn)(void *ctx);

/* Compare the analytic gradient g of f w.r.t. x[0..n) with central
 * differences; every element when n is small, else a stride. An element's
 * error is relative to itself plus the tensor's largest entry (as the run
 * comparisons measure tensors): a sum with cancellation (attention's dK
 * over 130 near-uniform keys) carries fp32 rounding of its terms' size,
 * which a BLAS with another summation order moves by a few 1e-5. */
static void check_grad(const char *what, float *x, const float *g, int64_t n, objective_fn f,
                       void *ctx) {
    int64_t stride = n > 400 ? n / 200 : 1;
    double worst = 0.0, gmax = 0.0;
    for (int64_t j = 0; j < n; j++) gmax = fabs(g[j]) > gmax ? fabs(g[j]) : gmax;
    for (int64_t j = 0; j < n; j += stride) {
        float keep = x[j];
        x[j] = keep + FD_H;
        double fp = f(ctx);
        x[j] = keep - FD_H;
        double fm = f(ctx);
        x[j] = keep;
        double fd = (fp - fm) / (2.0 * FD_H);
        double err = fabs(fd - g[j]) / (fabs(fd) + fabs(g[j]) + gmax + 1e-2);
        if (err > worst) worst = err;
        if (err > FD_TOL)
            fail_msg("%s[%lld]: analytic %.7g vs finite difference %.7g", what, (long long)j,
                     (double)g[j], fd);
    }
    print_message("%-12s worst relative error %.2g\n", what, worst);
}

/* ---------------------------------------------------------------- rmsnorm */

typedef struct norm_case {
    int N, C;
    float x[3 * 16], w[16], y[3 * 16], r[3 * 16], rstd[3];
} norm_case;

static double norm_f(void *ctx) {
    norm_case *c = ctx;
    hs_rmsnorm_forward(c->y, c->rstd, c->x, c->w, HS_DTYPE_F32, c->N, c->C, 1e-5f);
    return dot(c->r, c->y, c->N * c->C);
}

static void test_rmsnorm_backward_matches_finite_differences(void **state) {
    (void)state;
    norm_case c = {.N = 3, .C = 16};
    fill(c.x, 48, 1, 1.0f);
    fill(c.w, 16, 2, 1.0f);
    fill(c.r, 48, 3, 1.0f);
    float dx[48], dw[16];
    for (int i = 0; i < 48; i++) dx[i] = 0.5f; /* backward must accumulate */
    for (int i = 0; i < 16; i++) dw[i] = 0.25f;
    norm_f(&c);
    hs_rmsnorm_backward(dx, dw, HS_DTYPE_F32, c.r, c.x, c.w, c.rstd, HS_DTYPE_F32, 3, 16, NULL);
    for (int i = 0; i < 48; i++) dx[i] -= 0.5f;
    for (int i = 0; i < 16; i++) dw[i] -= 0.25f;
    check_grad("rmsnorm dx", c.x, dx, 48, norm_f, &c);
    check_grad("rmsnorm dw", c.w, dw, 16, norm_f, &c);
}

static void test_rmsnorm_output_has_unit_rms_times_weight(void **state) {
    (void)state;
    float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, w[8] = {2, 2, 2, 2, 2, 2, 2, 2}, y[8], rstd;
    hs_rmsnorm_forward(y, &rstd, x, w, HS_DTYPE_F32, 1, 8, 0.0f);
    double ss = 0.0;
    for (int i = 0; i < 8; i++) ss += (double)y[i] * y[i];
    assert_float_equal(sqrt(ss / 8), 2.0, 1e-6);
    assert_float_equal(rstd, 1.0 / sqrt(204.0 / 8), 1e-7);
}

/* Plain RoPE's tables for base theta (head sizes up to 128). */
static void rope_tables(float *cos_t, float *sin_t, int T, int HD, double theta) {
    float inv[64];
    assert_true(HD / 2 <= 64);
    hs_rope_inv_freq(inv, HD, theta);
    hs_rope_tables_freqs(cos_t, sin_t, T, HD, inv, 1.0f);
}

/* ------------------------------------------------------------------- rope */

#define RB 2
#define RT 4
#define RH 3
#define RHD 6
#define RN (RB * RT * RH * RHD)

typedef struct rope_case {
    float x[RN], y[RN], r[RN], cos_t[RT * RHD / 2], sin_t[RT * RHD / 2];
} rope_case;

static double rope_f(void *ctx) {
    rope_case *c = ctx;
    memcpy(c->y, c->x, sizeof c->y);
    hs_rope_forward(c->y, HS_DTYPE_F32, c->cos_t, c->sin_t, RB, RT, RH, RHD);
    return dot(c->r, c->y, RN);
}

static void test_rope_backward_matches_finite_differences(void **state) {
    (void)state;
    rope_case c;
    rope_tables(c.cos_t, c.sin_t, RT, RHD, 10000.0);
    fill(c.x, RN, 4, 1.0f);
    fill(c.r, RN, 5, 1.0f);
    float dx[RN];
    memcpy(dx, c.r, sizeof dx);
    hs_rope_backward(dx, c.cos_t, c.sin_t, RB, RT, RH, RHD);
    check_grad("rope dx", c.x, dx, RN, rope_f, &c);
}

/* HF: inv_freq_i = theta^(-2i/HD); out[i] = x[i] cos - x[i+HD/2] sin. */
static void test_rope_pairs_dim_i_with_i_plus_half_head_dim(void **state) {
    (void)state;
    float cos_t[3 * 2], sin_t[3 * 2];
    rope_tables(cos_t, sin_t, 3, 4, 100.0);
    assert_float_equal(cos_t[2 * 2 + 1], cosf(2.0f * 0.1f), 1e-7); /* t=2, i=1: 100^(-1/2) */
    float x[4] = {1, 2, 3, 4}; /* one position-2 vector of a T=3 sequence */
    float seq[3 * 4] = {0};
    memcpy(seq + 8, x, sizeof x);
    hs_rope_forward(seq, HS_DTYPE_F32, cos_t, sin_t, 1, 3, 1, 4);
    float a0 = 2.0f, a1 = 0.2f;
    assert_float_equal(seq[8], 1 * cosf(a0) - 3 * sinf(a0), 1e-6);
    assert_float_equal(seq[9], 2 * cosf(a1) - 4 * sinf(a1), 1e-6);
    assert_float_equal(seq[10], 3 * cosf(a0) + 1 * sinf(a0), 1e-6);
    assert_float_equal(seq[11], 4 * cosf(a1) + 2 * sinf(a1), 1e-6);
    for (int i = 0; i < 4; i++) assert_float_equal(seq[i], 0.0f, 0.0f);
}

/* -------------------------------------------------------------- attention */

typedef struct att_case {
    int B, T, NH, KVH, HD;
    float *q, *k, *v, *y, *r, *lse, *delta, *scratch;
} att_case;

static int64_t att_qn(const att_case *c) { return (int64_t)c->B * c->T * c->NH * c->HD; }
static int64_t att_kn(const att_case *c) { return (int64_t)c->B * c->T * c->KVH * c->HD; }

static double att_f(void *ctx) {
    att_case *c = ctx;
    hs_attention_forward(c->y, c->lse, c->q, c->k, c->v, HS_DTYPE_F32, c->scratch, 1, c->B, c->T,
                         c->NH, c->KVH, c->HD, NULL);
    return dot(c->r, c->y, att_qn(c));
}

static void att_alloc(att_case *c) {
    int64_t qn = att_qn(c), kn = att_kn(c);
    c->q = calloc((size_t)qn, 4), c->y = calloc((size_t)qn, 4), c->r = calloc((size_t)qn, 4);
    c->k = calloc((size_t)kn, 4), c->v = calloc((size_t)kn, 4);
    c->lse = calloc((size_t)(c->B * c->NH * c->T), 4);
    c->delta = calloc((size_t)(c->B * c->NH * c->T), 4);
    c->scratch = calloc((size_t)hs_attention_scratch_floats(c->T, c->HD, 2), 4);
    fill(c->q, qn, 6, 1.0f);
    fill(c->k, kn, 7, 1.0f);
    fill(c->v, kn, 8, 1.0f);
    fill(c->r, qn, 9, 1.0f);
}

static void att_free(att_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->y), free(c->r), free(c->lse), free(c->delta);
    free(c->scratch);
}

static void check_attention(att_case *c) {
    att_alloc(c);
    int64_t qn = att_qn(c), kn = att_kn(c);
    float *dq = calloc((size_t)qn, 4), *dk = calloc((size_t)kn, 4), *dv = calloc((size_t)kn, 4);
    att_f(c);
    hs_attention_delta(c->delta, c->r, c->y, HS_DTYPE_F32, c->B, c->T, c->NH, c->HD);
    hs_attention_backward(dq, dk, dv, c->r, NULL, c->q, c->k, c->v, c->lse, c->delta, HS_DTYPE_F32,
                          c->scratch, 1, c->B, c->T, c->NH, c->KVH, c->HD, NULL);
    check_grad("attention dq", c->q, dq, qn, att_f, c);
    check_grad("attention dk", c->k, dk, kn, att_f, c);
    check_grad("attention dv", c->v, dv, kn, att_f, c);
    free(dq), free(dk), free(dv);
    att_free(c);
}

static void test_gqa_attention_backward_matches_finite_differences(void **state) {
    (void)state;
    att_case c = {.B = 2, .T = 5, .NH = 4, .KVH = 2, .HD = 4};
    check_attention(&c);
}

/* T = 130 crosses the 128-row query block: the second block sees 130 keys. */
static void test_attention_across_query_blocks_matches_finite_differences(void **state) {
    (void)state;
    att_case c = {.B = 1, .T = 130, .NH = 2, .KVH = 1, .HD = 2};
    check_attention(&c);
}

/* T = 300: the last query block (rows 256..299) meets two key tiles, so
 * its backward runs over tiles with the rows' D = dO . O. */
static void test_attention_across_key_tiles_matches_finite_differences(void **state) {
    (void)state;
    att_case c = {.B = 1, .T = 300, .NH = 2, .KVH = 1, .HD = 2};
    check_attention(&c);
}

/* The tiled kernel against softmax(QK^T/sqrt(HD) + causal mask) V in fp64:
 * T = 600 takes query rows past the first two key tiles (256 keys each),
 * so the online softmax rescales rows twice. */
static void test_attention_equals_naive_causal_softmax(void **state) {
    (void)state;
    enum { T = 600 };
    att_case c = {.B = 1, .T = T, .NH = 2, .KVH = 1, .HD = 8};
    att_alloc(&c);
    att_f(&c);
    double worst = 0.0;
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < T; t += 7) {
            double s[T], mx = -1e300, sum = 0.0;
            for (int j = 0; j <= t; j++) {
                s[j] = 0.0;
                for (int d = 0; d < 8; d++)
                    s[j] += (double)c.q[(t * 2 + h) * 8 + d] * c.k[j * 8 + d];
                s[j] /= sqrt(8.0);
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += exp(s[j] - mx);
            for (int d = 0; d < 8; d++) {
                double o = 0.0;
                for (int j = 0; j <= t; j++) o += exp(s[j] - mx) / sum * c.v[j * 8 + d];
                double err = fabs(o - c.y[(t * 2 + h) * 8 + d]);
                worst = err > worst ? err : worst;
            }
            assert_float_equal(c.lse[h * T + t], mx + log(sum), 1e-5);
        }
    print_message("tiled attention vs fp64 softmax: worst %.2e\n", worst);
    assert_true(worst < 1e-5);
    att_free(&c);
}

/* A head of 24 (the 16-lane tiles' partial vector) and of 72 (past one
 * chunk of the P x B tiles, a partial vector after it), over rows and
 * keys that are not multiples of a tile's groups. */
static void test_attention_wide_heads_match_finite_differences(void **state) {
    (void)state;
    att_case c = {.B = 1, .T = 19, .NH = 2, .KVH = 1, .HD = 24};
    check_attention(&c);
    att_case d = {.B = 1, .T = 11, .NH = 2, .KVH = 2, .HD = 72};
    check_attention(&d);
}

/* The register tile products (hs_att_tiles) of each tier the CPU runs
 * against the products written out in fp64, on a causal-like pattern (row
 * i sees keys below i + 5): each row's own keys of S = alpha A B^T, and
 * P B and P^T B over the ranges the real calls give (P zero past a row's
 * keys), added to old values. Every output element is the same chain at
 * both tiers, so where the CPU runs both they agree bit for bit. */
enum { TL_ROWS = 13, TL_KEYS = 37, TL_HD = 72, TL_LDA = 75, TL_LDB = 77 };

typedef struct tile_out {
    float s[TL_ROWS * TL_KEYS], nn[TL_ROWS * TL_LDA], tn[TL_KEYS * TL_LDB];
} tile_out;

static int tl_seen(int i) { return i + 5 < TL_KEYS ? i + 5 : TL_KEYS; }

static void tile_ranges(int *lo, int *hi, int n, int rows, bool keys) {
    for (int i = 0, g = 0; i < rows; i += n, g++) {
        int last = i + n - 1 < rows - 1 ? i + n - 1 : rows - 1;
        lo[g] = keys ? (i - 4 > 0 ? i - 4 : 0) : 0; /* the first row that sees key i */
        hi[g] = keys ? TL_ROWS : tl_seen(last);
    }
}

static void tile_products(const hs_att_tiles *t, const float *a, const float *b, const float *p,
                          tile_out *o) {
    int c0[TL_KEYS], c1[TL_KEYS], p0[TL_KEYS], p1[TL_KEYS], k0[TL_KEYS], k1[TL_KEYS];
    tile_ranges(c0, c1, t->r_nt, TL_ROWS, false);
    tile_ranges(p0, p1, t->r_pb, TL_ROWS, false);
    tile_ranges(k0, k1, t->r_pb, TL_KEYS, true);
    float *bp = calloc((size_t)(TL_KEYS + 16) * TL_HD, sizeof(float));
    t->pack(bp, b, TL_LDB, TL_KEYS, TL_HD);
    for (int i = 0; i < TL_ROWS * TL_KEYS; i++) o->s[i] = NAN;
    t->nt(o->s, TL_KEYS, a, TL_LDA, bp, TL_HD, TL_ROWS, TL_KEYS, c0, c1, 0.125f);
    fill(o->nn, TL_ROWS * TL_LDA, 21, 1.0f);
    fill(o->tn, TL_KEYS * TL_LDB, 22, 1.0f);
    t->pb(o->nn, TL_LDA, p, TL_KEYS, 1, b, TL_LDB, TL_HD, TL_ROWS, p0, p1, 0.5f, true);
    t->pb(o->tn, TL_LDB, p, 1, TL_KEYS, a, TL_LDA, TL_HD, TL_KEYS, k0, k1, 1.0f, true);
    free(bp);
}

static void check_tiles(const char *tier, const tile_out *o, const float *a, const float *b,
                        const float *p) {
    tile_out init;
    fill(init.nn, TL_ROWS * TL_LDA, 21, 1.0f);
    fill(init.tn, TL_KEYS * TL_LDB, 22, 1.0f);
    double worst = 0.0;
    for (int i = 0; i < TL_ROWS; i++)
        for (int j = 0; j < TL_KEYS; j++) {
            double s = 0.0, m = 0.0;
            for (int d = 0; d < TL_HD; d++)
                s += (double)a[i * TL_LDA + d] * b[j * TL_LDB + d],
                    m += fabs((double)a[i * TL_LDA + d] * b[j * TL_LDB + d]);
            if (j >= tl_seen(i)) continue;
            double e = fabs(0.125 * s - o->s[i * TL_KEYS + j]) / (0.125 * m);
            worst = e > worst ? e : worst;
        }
    for (int d = 0; d < TL_HD; d++) {
        for (int i = 0; i < TL_ROWS; i++) {
            double s = 0.0, m = 0.0;
            for (int j = 0; j < TL_KEYS; j++)
                s += (double)p[i * TL_KEYS + j] * b[j * TL_LDB + d],
                    m += fabs((double)p[i * TL_KEYS + j] * b[j * TL_LDB + d]);
            double want = init.nn[i * TL_LDA + d] + 0.5 * s;
            double e = fabs(want - o->nn[i * TL_LDA + d]) / (0.5 * m + fabs(want) + 1e-30);
            worst = e > worst ? e : worst;
        }
        for (int j = 0; j < TL_KEYS; j++) {
            double s = 0.0, m = 0.0;
            for (int i = 0; i < TL_ROWS; i++)
                s += (double)p[i * TL_KEYS + j] * a[i * TL_LDA + d],
                    m += fabs((double)p[i * TL_KEYS + j] * a[i * TL_LDA + d]);
            double want = init.tn[j * TL_LDB + d] + s;
            double e = fabs(want - o->tn[j * TL_LDB + d]) / (m + fabs(want) + 1e-30);
            worst = e > worst ? e : worst;
        }
    }
    print_message("attention tiles (%s) vs fp64: worst %.2e\n", tier, worst);
    assert_true(worst < 1e-6); /* a chain of <= 72 fp32 FMAs: about 72 * 2^-24 */
    /* the padding between rows is never written */
    for (int i = 0; i < TL_ROWS; i++)
        for (int d = TL_HD; d < TL_LDA; d++)
            assert_memory_equal(&o->nn[i * TL_LDA + d], &init.nn[i * TL_LDA + d], sizeof(float));
    for (int j = 0; j < TL_KEYS; j++)
        for (int d = TL_HD; d < TL_LDB; d++)
            assert_memory_equal(&o->tn[j * TL_LDB + d], &init.tn[j * TL_LDB + d], sizeof(float));
}

/* The tiles' exponentials (exp_sum) against exp in fp64 rounded to fp32:
 * at most 2 ulp over the normal range, the ends and NaN as hs_expf's, the
 * sum of a softmax row's (x <= 0) within fp32 lanes' rounding, values past
 * n untouched; the two tiers
 * bit for bit where the CPU runs both. */
static void check_exp_sum(const hs_att_tiles *t, const char *tier, float *out) {
    enum { N = 1 << 16 };
    float *s = malloc((N + 16) * sizeof(float));
    int worst = 0;
    for (int pass = 0; pass < 31; pass++) {
        for (int i = 0; i < N + 16; i++)
            s[i] = -87.3f + (88.3f + 87.3f) * (float)(pass * N + i) / (31.0f * N) + 1.0f;
        float keep[16];
        memcpy(keep, s + N - 13, sizeof keep);
        int n = N - 13; /* a partial last vector at both widths */
        double want_sum = 0.0, got = t->exp_sum(s, n, 1.0f);
        for (int i = 0; i < n; i++) {
            float x = -87.3f + (88.3f + 87.3f) * (float)(pass * N + i) / (31.0f * N);
            float want = (float)exp((double)x);
            int32_t a, b;
            memcpy(&a, &want, 4), memcpy(&b, &s[i], 4);
            int d = abs(a - b);
            worst = d > worst ? d : worst;
            if (d > 2)
                fail_msg("%s exp_sum: e^%.9g = %.9g, exp = %.9g (%d ulp)", tier, (double)x,
                         (double)s[i], (double)want, d);
            want_sum += s[i];
        }
        if (pass < 15) /* x <= 0, as a softmax row has: fp32 lanes hold the sum */
            assert_true(fabs(got - want_sum) <= 1e-6 * want_sum);
        assert_memory_equal(s + n, keep, sizeof keep); /* past n: untouched */
        if (pass == 7) memcpy(out, s, 4096 * sizeof(float));
    }
    print_message("attention tiles (%s) exp: worst %d ulp on [-87.3, 88.3]\n", tier, worst);
    float ends[5] = {0.0f, -INFINITY, -100.0f, INFINITY, NAN};
    double sum = t->exp_sum(ends, 5, 0.0f);
    assert_true(ends[0] == 1.0f && ends[1] == 0.0f && ends[2] == 0.0f);
    assert_true(isinf(ends[3]) && isnan(ends[4]) && isnan(sum));
    memcpy(out + 4096, ends, sizeof ends);
    free(s);
}

static void test_attention_tiles_exp_within_2_ulp(void **state) {
    (void)state;
    const hs_att_tiles *t2 = hs_att_tiles_avx2(), *t5 = hs_att_tiles_avx512();
    if (!t2) skip();
    float *o2 = malloc(4101 * sizeof(float)), *o5 = malloc(4101 * sizeof(float));
    check_exp_sum(t2, "avx2", o2);
    if (t5 && hs_cpu_wide_vectors()) {
        check_exp_sum(t5, "avx512", o5);
        assert_memory_equal(o2, o5, 4101 * sizeof(float));
    }
    free(o2), free(o5);
}

static void test_attention_tiles_match_fp64_and_agree_across_tiers(void **state) {
    (void)state;
    const hs_att_tiles *t2 = hs_att_tiles_avx2(), *t5 = hs_att_tiles_avx512();
    if (!t2) skip();
    float *a = malloc(TL_ROWS * TL_LDA * sizeof(float)), *b = malloc(TL_KEYS * TL_LDB * 4);
    float *p = malloc(TL_ROWS * TL_KEYS * sizeof(float));
    fill(a, TL_ROWS * TL_LDA, 23, 1.0f);
    fill(b, TL_KEYS * TL_LDB, 24, 1.0f);
    fill(p, TL_ROWS * TL_KEYS, 25, 1.0f);
    for (int i = 0; i < TL_ROWS; i++) /* P past a row's keys is zero, as att_probs leaves it */
        for (int j = tl_seen(i); j < TL_KEYS; j++) p[i * TL_KEYS + j] = 0.0f;
    tile_out *o2 = malloc(sizeof(tile_out)), *o5 = malloc(sizeof(tile_out));
    tile_products(t2, a, b, p, o2);
    check_tiles("avx2", o2, a, b, p);
    if (t5 && hs_cpu_wide_vectors()) {
        tile_products(t5, a, b, p, o5);
        check_tiles("avx512", o5, a, b, p);
        for (int i = 0; i < TL_ROWS; i++)
            assert_memory_equal(&o2->s[i * TL_KEYS], &o5->s[i * TL_KEYS],
                                (size_t)tl_seen(i) * sizeof(float));
        assert_memory_equal(o2->nn, o5->nn, sizeof o2->nn);
        assert_memory_equal(o2->tn, o5->tn, sizeof o2->tn);
    } else print_message("attention tiles: no AVX-512 here, one tier checked\n");
    free(a), free(b), free(p), free(o2), free(o5);
}

/* A row range (a CP rank's queries against part of the keys) under
 * document masking, through the cpu backend's table without a workspace:
 * with two GEMM threads its heads go over the threads (the register tiles
 * run one thread each) and every output equals one thread's bit for bit. */
enum { RR_B = 2, RR_T = 300, RR_NH = 4, RR_KVH = 2, RR_HD = 16 };
enum { RR_QN = RR_B * RR_T * RR_NH * RR_HD, RR_KN = RR_B * RR_T * RR_KVH * RR_HD };

static void rows_on(int threads, const float *qkv, const int32_t *lo, float *o) {
    hs_device *d = cpu_dev();
    hs_att_rows r = {.Tq = RR_T,
                     .Tk = RR_T,
                     .q0 = 40,
                     .nq = 200,
                     .k0 = 0,
                     .nk = 260,
                     .gq = 40,
                     .gk = 0,
                     .lo = lo,
                     .lo_ld = RR_T};
    const float *q = qkv, *k = q + RR_QN, *v = k + RR_KN, *dout = v + RR_KN;
    float *out = o, *lse = out + RR_QN, *dq = lse + RR_B * RR_NH * RR_T, *dk = dq + RR_QN;
    float *dv = dk + RR_KN;
    int was = hs_blas_get_threads();
    hs_blas_set_threads(threads);
    d->k->attention_fwd(d->stream, out, HS_DTYPE_F32, lse, q, k, v, HS_DTYPE_F32, RR_B, RR_NH,
                        RR_KVH, RR_HD, &r, NULL);
    d->k->attention_bwd(d->stream, dq, dk, dv, dout, out, HS_DTYPE_F32, q, k, v, lse, HS_DTYPE_F32,
                        RR_B, RR_NH, RR_KVH, RR_HD, &r, NULL);
    hs_stream_synchronize(d->stream);
    hs_blas_set_threads(was);
}

static void test_attention_rows_on_two_threads_equal_one_bitwise(void **state) {
    (void)state;
    size_t in = (size_t)2 * RR_QN + 2 * RR_KN, outn = in + RR_B * RR_NH * RR_T;
    float *qkv = malloc(in * sizeof(float)), *a = calloc(outn, sizeof(float));
    float *b = calloc(outn, sizeof(float));
    int32_t *lo = malloc(RR_B * RR_T * sizeof(int32_t));
    fill(qkv, (int64_t)in, 26, 1.0f);
    for (int s = 0; s < RR_B; s++) /* documents of 37 and 53 tokens */
        for (int p = 0; p < RR_T; p++) lo[s * RR_T + p] = p - p % (37 + 16 * s);
    rows_on(1, qkv, lo, a);
    rows_on(2, qkv, lo, b);
    assert_memory_equal(a, b, outn * sizeof(float));
    double mag = 0.0; /* the outputs were computed, not left zero */
    for (size_t i = 0; i < outn; i++) mag += fabs(a[i]);
    assert_true(mag > 1.0);
    free(qkv), free(a), free(b), free(lo);
}

/* The 16-bit backward (dout rounded once, P and dS rounded for their
 * GEMMs) against the fp32 backward of the same bf16 inputs: equal to bf16
 * precision (normwise), three query blocks and two key tiles deep; split
 * over two threads, forward and backward give the one-thread bits. */
static double rel_norm(const float *a, const float *b, int64_t n) {
    double d = 0.0, r = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d += e * e, r += (double)b[i] * b[i];
    }
    return sqrt(d / r);
}

static void test_bf16_attention_backward_matches_fp32_of_rounded_inputs(void **state) {
    (void)state;
    att_case c = {.B = 2, .T = 300, .NH = 4, .KVH = 2, .HD = 16};
    att_alloc(&c);
    int64_t qn = att_qn(&c), kn = att_kn(&c);
    uint16_t *q16 = malloc((size_t)qn * 2), *k16 = malloc((size_t)kn * 2);
    uint16_t *v16 = malloc((size_t)kn * 2), *y16 = malloc((size_t)qn * 2);
    uint16_t *r16 = malloc((size_t)qn * 2);
    hs_convert(q16, HS_DTYPE_BF16, c.q, HS_DTYPE_F32, qn);
    hs_convert(k16, HS_DTYPE_BF16, c.k, HS_DTYPE_F32, kn);
    hs_convert(v16, HS_DTYPE_BF16, c.v, HS_DTYPE_F32, kn);
    hs_convert(r16, HS_DTYPE_BF16, c.r, HS_DTYPE_F32, qn);
    hs_convert(c.q, HS_DTYPE_F32, q16, HS_DTYPE_BF16, qn); /* the fp32 run reads the same values */
    hs_convert(c.k, HS_DTYPE_F32, k16, HS_DTYPE_BF16, kn);
    hs_convert(c.v, HS_DTYPE_F32, v16, HS_DTYPE_BF16, kn);
    float *g = calloc((size_t)(2 * qn + 4 * kn), 4);
    float *lse16 = calloc((size_t)(c.B * c.NH * c.T), 4);
    float *dq = g, *dk = g + qn, *dv = dk + kn;
    float *dq16 = dv + kn, *dk16 = dq16 + qn, *dv16 = dk16 + kn;
    att_f(&c);
    hs_attention_delta(c.delta, c.r, c.y, HS_DTYPE_F32, c.B, c.T, c.NH, c.HD);
    hs_attention_backward(dq, dk, dv, c.r, NULL, c.q, c.k, c.v, c.lse, c.delta, HS_DTYPE_F32,
                          c.scratch, 1, c.B, c.T, c.NH, c.KVH, c.HD, NULL);
    hs_attention_forward(y16, lse16, q16, k16, v16, HS_DTYPE_BF16, c.scratch, 1, c.B, c.T, c.NH,
                         c.KVH, c.HD, NULL);
    hs_attention_delta(c.delta, c.r, y16, HS_DTYPE_BF16, c.B, c.T, c.NH, c.HD);
    hs_attention_backward(dq16, dk16, dv16, c.r, r16, q16, k16, v16, lse16, c.delta, HS_DTYPE_BF16,
                          c.scratch, 1, c.B, c.T, c.NH, c.KVH, c.HD, NULL);
    /* split over two threads (the scratch is sized for them): the same bits */
    int was = hs_blas_get_threads();
    hs_blas_set_threads(1);
    uint16_t *y2 = malloc((size_t)qn * 2);
    float *lse2 = calloc((size_t)(c.B * c.NH * c.T), 4), *g2 = calloc((size_t)(qn + 2 * kn), 4);
    hs_attention_forward(y2, lse2, q16, k16, v16, HS_DTYPE_BF16, c.scratch, 2, c.B, c.T, c.NH,
                         c.KVH, c.HD, NULL);
    hs_attention_backward(g2, g2 + qn, g2 + qn + kn, c.r, r16, q16, k16, v16, lse2, c.delta,
                          HS_DTYPE_BF16, c.scratch, 2, c.B, c.T, c.NH, c.KVH, c.HD, NULL);
    hs_blas_set_threads(was);
    assert_memory_equal(y2, y16, (size_t)qn * 2);
    assert_memory_equal(lse2, lse16, (size_t)(c.B * c.NH * c.T) * 4);
    assert_memory_equal(g2, dq16, (size_t)(qn + 2 * kn) * 4);
    free(y2), free(lse2), free(g2);
    double eq = rel_norm(dq16, dq, qn), ek = rel_norm(dk16, dk, kn), ev = rel_norm(dv16, dv, kn);
    print_message("bf16 attention backward vs fp32: dq %.2e dk %.2e dv %.2e\n", eq, ek, ev);
    assert_true(eq < 2e-2 && ek < 2e-2 && ev < 2e-2);
    assert_true(eq > 0.0); /* the 16-bit path did round */
    free(q16), free(k16), free(v16), free(y16), free(r16), free(g), free(lse16);
    att_free(&c);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct glu_case {
    float g[40], u[40], y[40], r[40];
} glu_case;

static double glu_f(void *ctx) {
    glu_case *c = ctx;
    hs_swiglu_forward(c->y, c->g, c->u, HS_DTYPE_F32, 40);
    return dot(c->r, c->y, 40);
}

static void test_swiglu_backward_matches_finite_differences(void **state) {
    (void)state;
    glu_case c;
    fill(c.g, 40, 10, 2.0f);
    fill(c.u, 40, 11, 1.0f);
    fill(c.r, 40, 12, 1.0f);
    float dg[40] = {0}, du[40] = {0};
    hs_swiglu_backward(dg, du, c.r, c.g, c.u, HS_DTYPE_F32, 40);
    check_grad("swiglu dgate", c.g, dg, 40, glu_f, &c);
    check_grad("swiglu dup", c.u, du, 40, glu_f, &c);
    float y;
    hs_swiglu_forward(&y, &(float){2.0f}, &(float){3.0f}, HS_DTYPE_F32, 1);
    assert_float_equal(y, 2.0 / (1.0 + exp(-2.0)) * 3.0, 1e-6);
}

/* The element kernels against their formulas written out here one
 * element at a time, bit for bit: SwiGLU forward and backward (fp32 and
 * bf16 storage) and the cross-entropy's loss and gradient. Run natively
 * this holds the AVX-512 clones (HS_WIDE) where the CPU has them, and at
 * the avx2 tier the x86-64-v3 loops: each is the same arithmetic per
 * element, so both equal the formula, and each other. 4099 elements: the
 * vector bodies and their tails. */
static void test_element_kernels_equal_their_formulas_bitwise(void **state) {
    (void)state;
    enum { N = 4099, R = 3, V = N / R };
    float *g = malloc(sizeof(float) * N * 6), *u = g + N, *y = u + N, *dg = y + N, *du = dg + N,
          *r = du + N;
    uint16_t g16[N], u16[N], y16[N];
    assert_non_null(g);
    fill(g, N, 21, 4.0f), fill(u, N, 22, 1.0f), fill(r, N, 23, 1.0f);
    for (int i = 0; i < N; i++) g16[i] = hs_f32_to_bf16(g[i]), u16[i] = hs_f32_to_bf16(u[i]);
    hs_swiglu_forward(y, g, u, HS_DTYPE_F32, N);
    hs_swiglu_forward(y16, g16, u16, HS_DTYPE_BF16, N);
    for (int i = 0; i < N; i++) {
        float a = g[i], a16 = hs_bf16_to_f32(g16[i]);
        float want = a / (1.0f + hs_expf(-a)) * u[i];
        uint16_t want16 = hs_f32_to_bf16(a16 / (1.0f + hs_expf(-a16)) * hs_bf16_to_f32(u16[i]));
        if (memcmp(&want, &y[i], 4) || want16 != y16[i])
            fail_msg("swiglu forward element %d: %a / %04x, formula %a / %04x", i, (double)y[i],
                     y16[i], (double)want, want16);
    }
    hs_swiglu_backward_ex(dg, du, true, r, g, u, HS_DTYPE_F32, N);
    for (int i = 0; i < N; i++) {
        float a = g[i], sg = 1.0f / (1.0f + hs_expf(-a));
        float wg = r[i] * u[i] * sg * (1.0f + a * (1.0f - sg)), wu = r[i] * a * sg;
        if (memcmp(&wg, &dg[i], 4) || memcmp(&wu, &du[i], 4))
            fail_msg("swiglu backward element %d: %a %a, formula %a %a", i, (double)dg[i],
                     (double)du[i], (double)wg, (double)wu);
    }
    int32_t t[R] = {5, -1, V - 1};
    double loss = hs_xent_forward_backward(dg, g, t, R, V, 0.5f, NULL), want_loss = 0.0;
    for (int n = 0; n < R; n++) {
        const float *l = g + (int64_t)n * V;
        float *d = du + (int64_t)n * V;
        if (t[n] < 0) {
            memset(d, 0, sizeof(float) * V);
            continue;
        }
        float mx = hs_row_max(l, V);
        for (int i = 0; i < V; i++) d[i] = hs_expf(l[i] - mx);
        double sum = hs_row_sum(d, V);
        float k = (float)(0.5f / sum);
        for (int i = 0; i < V; i++) d[i] *= k;
        d[t[n]] -= 0.5f;
        want_loss += (double)mx + log(sum) - (double)l[t[n]];
    }
    assert_memory_equal(dg, du, sizeof(float) * R * V);
    if (memcmp(&loss, &want_loss, sizeof loss))
        fail_msg("cross-entropy loss %a, formula %a", loss, want_loss);
    free(g);
}

/* ---------------------------------------------------------------- linear */

typedef struct lin_case {
    float x[6 * 5], w[4 * 5], y[6 * 4], r[6 * 4];
} lin_case;

static double lin_f(void *ctx) {
    lin_case *c = ctx;
    hs_linear_forward(cpu_dev(), c->y, c->x, c->w, HS_DTYPE_F32, 6, 5, 4, 0);
    return dot(c->r, c->y, 24);
}

static void test_linear_backward_matches_finite_differences(void **state) {
    (void)state;
    lin_case c;
    fill(c.x, 30, 13, 1.0f);
    fill(c.w, 20, 14, 1.0f);
    fill(c.r, 24, 15, 1.0f);
    float dx[30] = {0}, dw[20] = {0};
    hs_linear_backward(cpu_dev(), dx, dw, HS_DTYPE_F32, c.r, c.x, c.w, HS_DTYPE_F32, 6, 5, 4);
    check_grad("linear dx", c.x, dx, 30, lin_f, &c);
    check_grad("linear dw", c.w, dw, 20, lin_f, &c);
    /* y = x W^T with W [out, in]: y[0][1] = sum_i x[0][i] w[1][i] */
    lin_f(&c);
    double want = 0.0;
    for (int i = 0; i < 5; i++) want += (double)c.x[i] * c.w[5 + i];
    assert_float_equal(c.y[1], want, 1e-6);
    float before = c.y[1];
    hs_linear_forward(cpu_dev(), c.y, c.x, c.w, HS_DTYPE_F32, 6, 5, 4, 1); /* accumulate */
    assert_float_equal(c.y[1], 2 * before, 1e-6);
}

static void test_linear_bf16_weight_gradient_accumulates_with_one_rounding(void **state) {
    (void)state;
    float x[2] = {1.0f, 2.0f}, dy[1] = {1.0f};
    uint16_t w[2] = {hs_f32_to_bf16(1.0f), hs_f32_to_bf16(1.0f)};
    uint16_t xb[2] = {hs_f32_to_bf16(x[0]), hs_f32_to_bf16(x[1])};
    uint16_t dw[2] = {hs_f32_to_bf16(256.0f), hs_f32_to_bf16(0.5f)};
    hs_linear_backward(cpu_dev(), NULL, dw, HS_DTYPE_BF16, dy, xb, w, HS_DTYPE_BF16, 1, 2, 1);
    assert_float_equal(hs_bf16_to_f32(dw[0]), hs_round_to(HS_DTYPE_BF16, 257.0f), 0.0f);
    assert_float_equal(hs_bf16_to_f32(dw[1]), 2.5f, 0.0f);
}

/* ------------------------------------------------------------- embedding */

typedef struct emb_case {
    int32_t tok[6];
    float wte[5 * 3], y[6 * 3], r[6 * 3];
} emb_case;

static double emb_f(void *ctx) {
    emb_case *c = ctx;
    hs_embedding_forward(c->y, c->tok, c->wte, HS_DTYPE_F32, 6, 3);
    return dot(c->r, c->y, 18);
}

static void test_embedding_backward_sums_rows_of_repeated_tokens(void **state) {
    (void)state;
    emb_case c = {.tok = {4, 1, 4, 0, 2, 4}};
    fill(c.wte, 15, 16, 1.0f);
    fill(c.r, 18, 17, 1.0f);
    float dw[15] = {0};
    hs_embedding_backward(dw, HS_DTYPE_F32, c.r, c.tok, 6, 3);
    check_grad("embedding", c.wte, dw, 15, emb_f, &c);
    for (int i = 0; i < 3; i++) assert_float_equal(dw[3 * 3 + i], 0.0f, 0.0f); /* token 3 unused */
}

/* --------------------------------------------------------- cross-entropy */

typedef struct xent_case {
    float l[4 * 7];
    int32_t t[4];
} xent_case;

static double xent_f(void *ctx) {
    xent_case *c = ctx;
    return hs_xent_forward_backward(NULL, c->l, c->t, 4, 7, 0.0f, NULL) * 0.25;
}

static void test_cross_entropy_backward_matches_finite_differences(void **state) {
    (void)state;
    xent_case c = {.t = {3, -1, 0, 6}};
    fill(c.l, 28, 18, 2.0f);
    float d[28];
    int64_t valid = 0;
    double loss = hs_xent_forward_backward(d, c.l, c.t, 4, 7, 0.25f, &valid);
    assert_int_equal(valid, 3);
    assert_float_equal(loss * 0.25, xent_f(&c), 1e-12);
    for (int i = 7; i < 14; i++) assert_float_equal(d[i], 0.0f, 0.0f); /* ignored row */
    check_grad("xent dlogits", c.l, d, 28, xent_f, &c);
    /* in place: the logits buffer becomes the gradient */
    float inplace[28];
    memcpy(inplace, c.l, sizeof inplace);
    double again = hs_xent_forward_backward(inplace, inplace, c.t, 4, 7, 0.25f, NULL);
    assert_memory_equal(&again, &loss, sizeof loss);
    assert_memory_equal(inplace, d, sizeof d);
}

static void test_cross_entropy_of_uniform_logits_is_log_v(void **state) {
    (void)state;
    float l[5] = {3, 3, 3, 3, 3};
    int32_t t[1] = {2};
    assert_float_equal(hs_xent_forward_backward(NULL, l, t, 1, 5, 1.0f, NULL), log(5.0), 1e-6);
}

/* hs_expf against exp in fp64 rounded to fp32: at most 2 ulp apart over
 * the normal range, and the ends and NaN as documented. */
static void test_vectorised_expf_within_2_ulp(void **state) {
    (void)state;
    int worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.3f + (88.3f + 87.3f) * (float)i / 2000000.0f;
        float want = (float)exp((double)x), got = hs_expf(x);
        int32_t a, b;
        memcpy(&a, &want, 4), memcpy(&b, &got, 4);
        int d = abs(a - b);
        if (d > worst) worst = d;
        if (d > 2)
            fail_msg("hs_expf(%.9g) = %.9g, exp = %.9g (%d ulp)", (double)x, (double)got,
                     (double)want, d);
    }
    print_message("hs_expf      worst %d ulp on [-87.3, 88.3]\n", worst);
    assert_true(hs_expf(0.0f) == 1.0f);
    assert_true(hs_expf(-INFINITY) == 0.0f && hs_expf(-100.0f) == 0.0f);
    assert_true(isinf(hs_expf(INFINITY)) && isinf(hs_expf(100.0f)));
    assert_true(isnan(hs_expf(NAN)));
}

/* The lane reductions: the serial max exactly, the serial fp64 sum and dot
 * to rounding, for every length around the lane, chain and tail
 * boundaries, with the maximum anywhere; a NaN first in the row stays, one
 * anywhere else does not. */
static void test_row_reductions_match_serial_loops(void **state) {
    (void)state;
    enum { ROWN = 160 };
    float x[ROWN], y[ROWN];
    fill(x, ROWN, 21, 1.0f);
    fill(y, ROWN, 22, 1.0f);
    for (int n = 1; n <= ROWN; n++)
        for (int at = 0; at < n; at += 5) {
            float saved = x[at];
            x[at] = 9.0f;
            float mx = x[0];
            double sum = 0.0, dt = 0.0;
            for (int i = 0; i < n; i++) {
                mx = x[i] > mx ? x[i] : mx;
                sum += x[i], dt += (double)x[i] * y[i];
            }
            assert_true(hs_row_max(x, n) == mx);
            assert_true(fabs(hs_row_sum(x, n) - sum) <= 1e-13 * (1.0 + fabs(sum)));
            assert_true(fabs(hs_row_dot(x, y, n) - dt) <= 1e-13 * (1.0 + fabs(dt)));
            x[at] = saved;
        }
    for (int at = 0; at < ROWN; at += 3) {
        float saved = x[at];
        x[at] = NAN;
        assert_true(isnan(hs_row_max(x, ROWN)) == (at == 0));
        x[at] = saved;
    }
}

/* The threaded element kernels give the same bits on 1 and 2 threads. */
enum { EW_N = 1 << 17, EW_C = 256 };
typedef struct ew_out {
    float y[EW_N], dg[EW_N], du[EW_N], xn[EW_N], rstd[EW_N / EW_C], xr[EW_N], dx[EW_N], dw[EW_C];
    double sumsq;
} ew_out;

static void run_elementwise(int threads, const float *g, const float *u, ew_out *o) {
    int64_t n = EW_N;
    hs_blas_set_threads(threads);
    hs_swiglu_forward(o->y, g, u, HS_DTYPE_F32, n);
    hs_swiglu_backward(o->dg, o->du, o->y, g, u, HS_DTYPE_F32, n);
    hs_rmsnorm_forward(o->xn, o->rstd, g, u, HS_DTYPE_F32, n / EW_C, EW_C, 1e-5f);
    hs_rmsnorm_backward(o->dx, o->dw, HS_DTYPE_F32, o->y, g, u, o->rstd, HS_DTYPE_F32, n / EW_C,
                        EW_C, NULL);
    memcpy(o->xr, g, (size_t)n * 4);
    float cs[64 * 8], sn[64 * 8];
    rope_tables(cs, sn, 64, 16, 10000.0);
    hs_rope_forward(o->xr, HS_DTYPE_F32, cs, sn, (int)(n / (64 * 4 * 16)), 64, 4, 16);
    /* more than one chunk of the fixed split (65536 elements) */
    o->sumsq = hs_sumsq_f32(o->dg, n);
}

static void test_threaded_kernels_equal_one_thread_bitwise(void **state) {
    (void)state;
    float *g = malloc(sizeof(float) * EW_N * 2);
    ew_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    assert_non_null(g), assert_non_null(a), assert_non_null(b);
    float *u = g + EW_N;
    for (int i = 0; i < EW_N; i++) g[i] = sinf(0.01f * i) * 3.0f, u[i] = cosf(0.003f * i);
    int was = hs_blas_get_threads();
    run_elementwise(1, g, u, a);
    run_elementwise(2, g, u, b);
    hs_blas_set_threads(was);
    assert_memory_equal(a, b, sizeof *a);
    /* the sum of squares in its fixed order is the serial fp64 sum to
     * rounding */
    double serial = 0.0;
    for (int i = 0; i < EW_N; i++) serial += (double)a->dg[i] * a->dg[i];
    assert_true(fabs(a->sumsq - serial) <= 1e-12 * serial);
    free(g), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_backward_matches_finite_differences),
        cmocka_unit_test(test_rmsnorm_output_has_unit_rms_times_weight),
        cmocka_unit_test(test_rope_backward_matches_finite_differences),
        cmocka_unit_test(test_rope_pairs_dim_i_with_i_plus_half_head_dim),
        cmocka_unit_test(test_gqa_attention_backward_matches_finite_differences),
        cmocka_unit_test(test_attention_across_query_blocks_matches_finite_differences),
        cmocka_unit_test(test_attention_across_key_tiles_matches_finite_differences),
        cmocka_unit_test(test_attention_equals_naive_causal_softmax),
        cmocka_unit_test(test_attention_wide_heads_match_finite_differences),
        cmocka_unit_test(test_attention_tiles_match_fp64_and_agree_across_tiers),
        cmocka_unit_test(test_attention_tiles_exp_within_2_ulp),
        cmocka_unit_test(test_attention_rows_on_two_threads_equal_one_bitwise),
        cmocka_unit_test(test_bf16_attention_backward_matches_fp32_of_rounded_inputs),
        cmocka_unit_test(test_swiglu_backward_matches_finite_differences),
        cmocka_unit_test(test_element_kernels_equal_their_formulas_bitwise),
        cmocka_unit_test(test_row_reductions_match_serial_loops),
        cmocka_unit_test(test_threaded_kernels_equal_one_thread_bitwise),
        cmocka_unit_test(test_vectorised_expf_within_2_ulp),
        cmocka_unit_test(test_linear_backward_matches_finite_differences),
        cmocka_unit_test(test_linear_bf16_weight_gradient_accumulates_with_one_rounding),
        cmocka_unit_test(test_embedding_backward_sums_rows_of_repeated_tokens),
        cmocka_unit_test(test_cross_entropy_backward_matches_finite_differences),
        cmocka_unit_test(test_cross_entropy_of_uniform_logits_is_log_v),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
