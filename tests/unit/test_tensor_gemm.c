/* hs_sgemm against a naive double loop for every transpose combination and
 * padded strides; hs_gemm_ex with 16-bit operands against fp32 GEMM of the
 * rounded inputs, rounded once; BLAS thread control.
 * HS_TEST_TIERS: avx2 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/tensor.h"

static float uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static void fill_random(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = uniform(&seed);
}

/* C = alpha * op(A) op(B) + beta * C with element access written out. */
static void gemm_naive(bool ta, bool tb, int M, int N, int K, double alpha, const float *A, int lda,
                       const float *B, int ldb, double beta, double *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += a * b;
            }
            C[i * ldc + j] = alpha * acc + beta * C[i * ldc + j];
        }
}

static void test_sgemm_all_transpose_combos_with_padded_strides_match_naive(void **state) {
    (void)state;
    enum { M = 13, N = 7, K = 19, PAD = 3 };
    for (int combo = 0; combo < 4; combo++) {
        bool ta = combo & 1, tb = combo & 2;
        int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
        float A[K * (M + PAD) + M * (K + PAD)], B[K * (N + PAD) + N * (K + PAD)];
        float C[M * ldc];
        double R[M * ldc];
        fill_random(A, (int64_t)(sizeof A / sizeof A[0]), 1 + combo);
        fill_random(B, (int64_t)(sizeof B / sizeof B[0]), 11 + combo);
        fill_random(C, M * ldc, 21 + combo);
        for (int i = 0; i < M * ldc; i++) R[i] = C[i];
        hs_sgemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, -0.5f, C, ldc, NULL);
        gemm_naive(ta, tb, M, N, K, 0.75, A, lda, B, ldb, -0.5, R, ldc);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < ldc; j++) {
                double d = fabs(C[i * ldc + j] - R[i * ldc + j]);
                if (d > 1e-5)
                    fail_msg("trans_a=%d trans_b=%d C[%d,%d]=%g naive %g", ta, tb, i, j,
                             (double)C[i * ldc + j], R[i * ldc + j]);
            }
    }
}

static void test_sgemm_k0_scales_c_by_beta_and_empty_m_is_noop(void **state) {
    (void)state;
    float C[4] = {1, 2, 3, 4}, dummy = 0;
    hs_sgemm(false, false, 2, 2, 0, 1.0f, &dummy, 1, &dummy, 2, 2.0f, C, 2, NULL);
    assert_true(C[0] == 2 && C[3] == 8);
    hs_sgemm(false, false, 0, 2, 3, 1.0f, NULL, 3, NULL, 2, 0.0f, C, 2, NULL);
    assert_true(C[0] == 2);
}

/* Round a packed matrix in place to dt (what the kernel sees). */
static void round_all(float *x, int64_t n, hs_dtype dt) {
    for (int64_t i = 0; i < n; i++) x[i] = hs_round_to(dt, x[i]);
}

static void *narrowed(const float *x, int64_t n, hs_dtype dt) {
    void *p = malloc((size_t)n * hs_dtype_size(dt));
    hs_convert(p, dt, x, HS_DTYPE_F32, n);
    return p;
}

/* gemm_ex(A in a_dt, B in b_dt, C in c_dt) == round_c(sgemm(round(A), round(B),
 * beta * round(C))): exactly on the widening path (operands widen exactly
 * and C is rounded once); where oneDNN's matmul runs the 16-bit dtype
 * (two operands of it, or one with an fp32 one rounded to it first), it
 * accumulates in fp32 in its own order, so there C is within fp32 rounding
 * of the sum, and a 16-bit C within one unit of its last place (the
 * rounding may fall on the other side). */
static void check_gemm_ex(hs_dtype a_dt, hs_dtype b_dt, hs_dtype c_dt, bool ta, bool tb,
                          float beta) {
    enum { M = 24, N = 40, K = 33 };
    float A[M * K], B[K * N], C0[M * N], R[M * N], got[M * N];
    int lda = ta ? M : K, ldb = tb ? K : N;
    fill_random(A, M * K, 100 + a_dt), fill_random(B, K * N, 200 + b_dt);
    fill_random(C0, M * N, 300 + c_dt);
    round_all(A, M * K, a_dt), round_all(B, K * N, b_dt), round_all(C0, M * N, c_dt);
    memcpy(R, C0, sizeof R);
    /* One fp32 operand against a 16-bit one on the native path: the fp32
     * one is rounded to the other's dtype first. */
    hs_dtype half = a_dt != HS_DTYPE_F32 ? a_dt : b_dt;
    bool mixed = (a_dt == HS_DTYPE_F32) != (b_dt == HS_DTYPE_F32);
    bool native = half != HS_DTYPE_F32 && hs_gemm_native(half, c_dt) && (mixed || a_dt == b_dt);
    float Ar[M * K], Br[K * N];
    memcpy(Ar, A, sizeof Ar), memcpy(Br, B, sizeof Br);
    if (native && a_dt == HS_DTYPE_F32) round_all(Ar, M * K, half);
    if (native && b_dt == HS_DTYPE_F32) round_all(Br, K * N, half);
    hs_sgemm(ta, tb, M, N, K, 1.25f, Ar, lda, Br, ldb, beta, R, N, NULL);
    void *a = narrowed(A, M * K, a_dt), *b = narrowed(B, K * N, b_dt),
         *c = narrowed(C0, M * N, c_dt);
    hs_gemm_ex(ta, tb, M, N, K, 1.25f, a, a_dt, lda, b, b_dt, ldb, beta, c, c_dt, N, NULL);
    hs_convert(got, HS_DTYPE_F32, c, c_dt, M * N);
    for (int i = 0; i < M * N; i++) {
        float want = hs_round_to(c_dt, R[i]);
        double ulp = c_dt == HS_DTYPE_BF16 ? 0x1p-7 : c_dt == HS_DTYPE_F16 ? 0x1p-10 : 0.0;
        double tol = native ? 1e-5 * (1.0 + fabs(want)) + ulp * fabs(want) : 0.0;
        if (fabs((double)got[i] - want) > tol)
            fail_msg("A %s B %s C %s ta=%d tb=%d beta=%g: C[%d]=%.9g want %.9g",
                     hs_dtype_name(a_dt), hs_dtype_name(b_dt), hs_dtype_name(c_dt), ta, tb,
                     (double)beta, i, (double)got[i], (double)want);
    }
    free(a), free(b), free(c);
}

static void test_gemm_ex_16bit_operands_equal_fp32_gemm_of_rounded_inputs(void **state) {
    (void)state;
    /* oneDNN runs bf16 matmuls wherever it uses AVX-512 kernels (natively
     * with AVX512-BF16, else by conversion inside them); below that (an
     * AVX2 CPU, or DNNL_MAX_CPU_ISA=AVX2) every case takes the widening
     * path, which the checks below then hold to exactness. */
    if (!strncmp(hs_gemm_isa(), "avx512", 6))
        assert_true(hs_gemm_native(HS_DTYPE_BF16, HS_DTYPE_F32) &&
                    hs_gemm_native(HS_DTYPE_BF16, HS_DTYPE_BF16));
    const hs_dtype dts[] = {HS_DTYPE_F32, HS_DTYPE_BF16, HS_DTYPE_F16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                for (int combo = 0; combo < 4; combo++)
                    check_gemm_ex(dts[a], dts[b], dts[c], combo & 1, combo & 2,
                                  combo == 3 ? 0.0f : 0.5f);
}

/* beta == 0 must not read C (it may hold NaN or garbage). */
static void test_gemm_ex_beta_zero_ignores_nan_in_bf16_c(void **state) {
    (void)state;
    uint16_t A[4], B[4], C[4];
    float one[4] = {1, 0, 0, 1}, out[4];
    hs_convert(A, HS_DTYPE_BF16, one, HS_DTYPE_F32, 4);
    hs_convert(B, HS_DTYPE_BF16, one, HS_DTYPE_F32, 4);
    for (int i = 0; i < 4; i++) C[i] = 0x7FC0; /* NaN */
    hs_gemm_ex(false, false, 2, 2, 2, 1.0f, A, HS_DTYPE_BF16, 2, B, HS_DTYPE_BF16, 2, 0.0f, C,
               HS_DTYPE_BF16, 2, NULL);
    hs_convert(out, HS_DTYPE_F32, C, HS_DTYPE_BF16, 4);
    assert_true(out[0] == 1 && out[1] == 0 && out[2] == 0 && out[3] == 1);
}

/* Strided 16-bit C: only the M x N window is written. */
static void test_gemm_ex_strided_f16_c_leaves_padding_untouched(void **state) {
    (void)state;
    enum { M = 3, N = 2, K = 4, LDC = 5 };
    float A[M * K], B[K * N], R[M * N] = {0};
    uint16_t C[M * LDC];
    fill_random(A, M * K, 5), fill_random(B, K * N, 6);
    for (int i = 0; i < M * LDC; i++) C[i] = 0x1234;
    hs_gemm_ex(false, false, M, N, K, 1.0f, A, HS_DTYPE_F32, K, B, HS_DTYPE_F32, N, 0.0f, C,
               HS_DTYPE_F16, LDC, NULL);
    hs_sgemm(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, R, N, NULL);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < LDC; j++) {
            if (j < N) assert_int_equal(C[i * LDC + j], hs_f32_to_f16(R[i * N + j]));
            else assert_int_equal(C[i * LDC + j], 0x1234);
        }
}

/* A cached product has hs_gemm_ex's bits for every shape, whether its
 * plan is built, reused, refused (fp32 operands go to hs_gemm_ex) or
 * beyond the cache's capacity; a repeated shape builds nothing more. */
static void test_gemm_cache_matches_gemm_ex_bit_for_bit(void **state) {
    (void)state;
    enum { M = 24, N = 40, K = 33, LDC = N + 3, CASES = 20 };
    float A[M * K], B[K * N], C0[M * LDC];
    fill_random(A, M * K, 11), fill_random(B, K * N, 12), fill_random(C0, M * LDC, 13);
    uint16_t a16[M * K], b16[K * N];
    hs_convert(a16, HS_DTYPE_BF16, A, HS_DTYPE_F32, M * K);
    hs_convert(b16, HS_DTYPE_BF16, B, HS_DTYPE_F32, K * N);
    hs_gemm_cache gc;
    hs_gemm_cache_init(&gc);
    /* 20 distinct shapes (M = 24 .. 5), two of them fp32: 18 plans for 16
     * slots, so the last two run uncached. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < CASES; i++) {
            bool ta = i & 1, tb = i & 2, f32 = i % 7 == 6;
            hs_dtype dt = f32 ? HS_DTYPE_F32 : HS_DTYPE_BF16;
            hs_dtype c_dt = i % 5 == 4 ? HS_DTYPE_BF16 : HS_DTYPE_F32;
            int m = M - i;
            hs_gemm_shape s = {.trans_a = ta,
                               .trans_b = tb,
                               .M = m,
                               .N = N,
                               .K = K,
                               .alpha = i % 3 ? 0.75f : 1.0f,
                               .beta = i % 4 ? 0.5f : 0.0f,
                               .a_dt = dt,
                               .b_dt = dt,
                               .c_dt = c_dt,
                               .lda = ta ? m : K,
                               .ldb = tb ? K : N,
                               .ldc = LDC};
            const void *a = f32 ? (const void *)A : a16, *b = f32 ? (const void *)B : b16;
            float want[M * LDC], got[M * LDC];
            hs_convert(want, c_dt, C0, HS_DTYPE_F32, M * LDC); /* packed at the front */
            hs_convert(got, c_dt, C0, HS_DTYPE_F32, M * LDC);
            hs_gemm_ex(ta, tb, m, N, K, s.alpha, a, dt, s.lda, b, dt, s.ldb, s.beta, want, c_dt,
                       LDC, NULL);
            int before = gc.n;
            hs_gemm_cached(&gc, &s, a, b, got, NULL);
            if (memcmp(want, got, (size_t)(M * LDC) * hs_dtype_size(c_dt)))
                fail_msg("case %d pass %d: bits differ from hs_gemm_ex", i, pass);
            if (pass == 1) assert_int_equal(gc.n, before);
        }
    assert_int_equal(gc.n, HS_GEMM_CACHE_SIZE);
    for (int i = 0; i < gc.n; i++) {
        assert_int_equal(gc.shapes[i].a_dt, HS_DTYPE_BF16); /* fp32 never takes a slot */
        if (!strncmp(hs_gemm_isa(), "avx512", 6)) assert_non_null(gc.plans[i]);
    }
    hs_gemm_cache_free(&gc);
    assert_int_equal(gc.n, 0);
    /* Shapes that differ only in a scale, a stride or a transpose are
     * different plans: each must give its own hs_gemm_ex result. */
    hs_gemm_cache_init(&gc);
    hs_gemm_shape base = {.M = 8,
                          .N = 8,
                          .K = 8,
                          .alpha = 1.0f,
                          .beta = 0.0f,
                          .a_dt = HS_DTYPE_BF16,
                          .b_dt = HS_DTYPE_BF16,
                          .c_dt = HS_DTYPE_F32,
                          .lda = 8,
                          .ldb = 8,
                          .ldc = 8};
    hs_gemm_shape v[6] = {base, base, base, base, base, base};
    v[1].alpha = 0.5f, v[2].beta = 1.0f, v[3].trans_a = true, v[4].ldb = 9, v[5].trans_b = true;
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < 6; i++) {
            float want[64], got[64];
            for (int j = 0; j < 64; j++) want[j] = got[j] = (float)j;
            hs_gemm_ex(v[i].trans_a, v[i].trans_b, 8, 8, 8, v[i].alpha, a16, HS_DTYPE_BF16,
                       v[i].lda, b16, HS_DTYPE_BF16, v[i].ldb, v[i].beta, want, HS_DTYPE_F32, 8,
                       NULL);
            hs_gemm_cached(&gc, &v[i], a16, b16, got, NULL);
            if (memcmp(want, got, sizeof want)) fail_msg("variant %d rep %d differs", i, rep);
        }
    assert_int_equal(gc.n, 6);
    hs_gemm_cache_free(&gc);
}

/* split_rows: a row of C has the same bits whatever M, its place and the
 * thread count (train.reproducibility: layout), for every transpose of A,
 * with beta, at this machine's tier and (HS_TEST_TIERS) at AVX2, where
 * oneDNN's own product gives rows different bits for different M. */
static void test_split_rows_bits_depend_on_the_row_alone(void **state) {
    (void)state;
    enum { M = 150, N = 96, K = 520 };
    float *A = malloc(sizeof(float) * M * K), *At = malloc(sizeof(float) * M * K);
    float *B = malloc(sizeof(float) * N * K), *C0 = malloc(sizeof(float) * M * N);
    float *ref = malloc(sizeof(float) * M * N), *got = malloc(sizeof(float) * M * N);
    fill_random(A, (int64_t)M * K, 5);
    fill_random(B, (int64_t)N * K, 6);
    fill_random(C0, (int64_t)M * N, 7);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
    int before = hs_blas_get_threads();
    for (int ta = 0; ta <= 1; ta++) {
        hs_gemm_shape s = {.trans_a = ta,
                           .trans_b = true,
                           .M = M,
                           .N = N,
                           .K = K,
                           .alpha = 0.5f,
                           .beta = 1.0f,
                           .a_dt = HS_DTYPE_F32,
                           .b_dt = HS_DTYPE_F32,
                           .c_dt = HS_DTYPE_F32,
                           .lda = ta ? M : K,
                           .ldb = K,
                           .ldc = N,
                           .split_rows = true};
        const float *a = ta ? At : A;
        hs_blas_set_threads(1);
        memcpy(ref, C0, sizeof(float) * M * N);
        assert_int_equal(hs_gemm_run(&s, a, B, ref, NULL), HS_OK);
        static const int starts[] = {0, 1, 17, 100}, counts[] = {150, 7, 60, 50};
        for (int threads = 1; threads <= 3; threads++) {
            hs_blas_set_threads(threads);
            for (int v = 0; v < 4; v++) {
                hs_gemm_shape p = s;
                int r0 = starts[v];
                p.M = counts[v];
                memcpy(got, C0, sizeof(float) * M * N);
                const float *pa = ta ? a + r0 : a + (int64_t)r0 * K;
                assert_int_equal(hs_gemm_run(&p, pa, B, got + (int64_t)r0 * N, NULL), HS_OK);
                if (memcmp(ref + (int64_t)r0 * N, got + (int64_t)r0 * N,
                           sizeof(float) * counts[v] * N))
                    fail_msg("trans_a %d, %d threads, rows %d..%d differ", ta, threads, r0,
                             r0 + counts[v]);
            }
        }
        /* what it guards against: oneDNN's product of 7 rows */
        hs_blas_set_threads(1);
        s.split_rows = false;
        s.M = 7;
        memcpy(got, C0, sizeof(float) * M * N);
        assert_int_equal(hs_gemm_run(&s, a, B, got, NULL), HS_OK);
        print_message("  trans_a %d: oneDNN's own 7-row product %s the rows' bits\n", ta,
                      memcmp(ref, got, sizeof(float) * 7 * N) ? "changes" : "keeps");
    }
    hs_blas_set_threads(before);
    free(A);
    free(At);
    free(B);
    free(C0);
    free(ref);
    free(got);
}

static void test_blas_threads_set_then_get(void **state) {
    (void)state;
    int before = hs_blas_get_threads();
    assert_true(before >= 1);
    hs_blas_set_threads(1);
    assert_int_equal(hs_blas_get_threads(), 1);
    hs_blas_set_threads(before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgemm_all_transpose_combos_with_padded_strides_match_naive),
        cmocka_unit_test(test_sgemm_k0_scales_c_by_beta_and_empty_m_is_noop),
        cmocka_unit_test(test_gemm_ex_16bit_operands_equal_fp32_gemm_of_rounded_inputs),
        cmocka_unit_test(test_gemm_ex_beta_zero_ignores_nan_in_bf16_c),
        cmocka_unit_test(test_gemm_ex_strided_f16_c_leaves_padding_untouched),
        cmocka_unit_test(test_gemm_cache_matches_gemm_ex_bit_for_bit),
        cmocka_unit_test(test_split_rows_bits_depend_on_the_row_alone),
        cmocka_unit_test(test_blas_threads_set_then_get),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
