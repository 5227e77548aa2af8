/* GEMM through OpenBLAS, and the mixed-dtype wrapper around it.
 *
 * hs_gemm_ex widens each 16-bit operand to fp32 once per call (one scratch
 * allocation for all of them), runs a single fp32 sgemm, and rounds C once
 * on the way out. One large sgemm is far faster than tile-by-tile calls at
 * the sizes the model uses, and the scratch is freed before returning. */
#include <cblas.h>
#include <stdlib.h>

#include "hypershard/tensor.h"

void hs_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
              int64_t ldc)
{
    HS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    HS_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX);
    HS_ASSERT(lda <= INT32_MAX && ldb <= INT32_MAX && ldc <= INT32_MAX);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha, A,
                (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* Widen a rows x cols matrix with row stride ld into a packed fp32 copy. */
static void widen_matrix(float *dst, const void *src, hs_dtype dt, int64_t rows, int64_t cols,
                         int64_t ld)
{
    const char *s = src;
    size_t es = hs_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++)
        hs_convert(dst + r * cols, HS_DTYPE_F32, s + (size_t)(r * ld) * es, dt, cols);
}

static void narrow_matrix(void *dst, hs_dtype dt, const float *src, int64_t rows, int64_t cols,
                          int64_t ld)
{
    char *d = dst;
    size_t es = hs_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++)
        hs_convert(d + (size_t)(r * ld) * es, dt, src + r * cols, HS_DTYPE_F32, cols);
}

void hs_gemm_ex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc)
{
    if (a_dt == HS_DTYPE_F32 && b_dt == HS_DTYPE_F32 && c_dt == HS_DTYPE_F32) {
        hs_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    HS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    /* Stored shapes: op(A) is M x K, so A itself is K x M when transposed. */
    int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    size_t need = 0;
    if (a_dt != HS_DTYPE_F32) need += (size_t)(a_rows * a_cols);
    if (b_dt != HS_DTYPE_F32) need += (size_t)(b_rows * b_cols);
    if (c_dt != HS_DTYPE_F32) need += (size_t)(M * N);
    float *scratch = malloc(need * sizeof(float));
    if (scratch == NULL)
        hs_oom("hs_gemm_ex: cannot allocate %zu bytes of fp32 scratch for a %lldx%lldx%lld GEMM",
                 need * sizeof(float), (long long)M, (long long)N, (long long)K);
    float *next = scratch;
    const float *a32 = A, *b32 = B;
    float *c32 = C;
    int64_t lda32 = lda, ldb32 = ldb, ldc32 = ldc;
    if (a_dt != HS_DTYPE_F32) {
        widen_matrix(next, A, a_dt, a_rows, a_cols, lda);
        a32 = next, lda32 = a_cols, next += a_rows * a_cols;
    }
    if (b_dt != HS_DTYPE_F32) {
        widen_matrix(next, B, b_dt, b_rows, b_cols, ldb);
        b32 = next, ldb32 = b_cols, next += b_rows * b_cols;
    }
    if (c_dt != HS_DTYPE_F32) {
        c32 = next, ldc32 = N;
        /* beta == 0 means C is not read (BLAS semantics): zeros, so no
         * uninitialised scratch can reach the result. */
        if (beta != 0.0f) widen_matrix(c32, C, c_dt, M, N, ldc);
        else hs_fill_f32(c32, M * N, 0.0f);
    }
    hs_sgemm(trans_a, trans_b, M, N, K, alpha, a32, lda32, b32, ldb32, beta, c32, ldc32);
    if (c_dt != HS_DTYPE_F32) narrow_matrix(C, c_dt, c32, M, N, ldc);
    free(scratch);
}

void hs_blas_set_threads(int n)
{
    HS_ASSERT(n >= 1);
    openblas_set_num_threads(n);
}

int hs_blas_get_threads(void) { return openblas_get_num_threads(); }
