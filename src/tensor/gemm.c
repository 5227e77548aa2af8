/* GEMM through oneDNN, and the mixed-dtype path around it.
 *
 * oneDNN picks its kernels for the CPU it runs on at run time (AVX2,
 * AVX-512, AVX512-BF16, AMX), with no environment variable to set; the
 * fp32 GEMM is dnnl_sgemm. Two 16-bit operands of one dtype run oneDNN's
 * matmul primitive with fp32 accumulation (native bf16 dot products where
 * the CPU has them) and C in fp32 or 16 bits, rounded once. One fp32 and
 * one 16-bit operand (backward: an fp32 activation gradient against a bf16
 * weight or activation) round the fp32 one to 16 bits first, as PyTorch's
 * bf16 autograd holds it, and run the same matmul. Where oneDNN has no
 * such matmul on this CPU, each 16-bit operand is widened to fp32 once per
 * call, one sgemm runs, and C is rounded once on the way out. Each call
 * builds its matmul (about 5 us); a caller that repeats a few shapes many
 * times keeps them built in a plan cache (gemm_plan.c). */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>

#include "hypershard/tensor.h"

hs_status hs_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc, hs_error *e) {
    HS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return HS_OK;
    if (K == 0) { /* BLAS semantics, which dnnl_sgemm skips: C = beta C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return HS_OK;
    }
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                  B, ldb, beta, C, ldc);
    if (st == dnnl_out_of_memory)
        return hs_error_oom(e, "an fp32 GEMM of %lldx%lldx%lld: oneDNN's scratch", (long long)M,
                            (long long)N, (long long)K);
    if (st != dnnl_success)
        hs_panic("dnnl_sgemm(%c, %c, %lld, %lld, %lld, lda %lld, ldb %lld, ldc %lld) failed: %d",
                 trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', (long long)M, (long long)N, (long long)K,
                 (long long)lda, (long long)ldb, (long long)ldc, (int)st);
    return HS_OK;
}

/* C = alpha op(A) op(B) + beta C by oneDNN's matmul, built for this one
 * call; *ran false (nothing written) when oneDNN has no such matmul here. */
static hs_status matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                        int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc, bool *ran,
                        hs_error *e) {
    hs_gemm_shape s = {.trans_a = trans_a,
                       .trans_b = trans_b,
                       .M = M,
                       .N = N,
                       .K = K,
                       .alpha = alpha,
                       .a_dt = a_dt,
                       .lda = lda,
                       .b_dt = b_dt,
                       .ldb = ldb,
                       .beta = beta,
                       .c_dt = c_dt,
                       .ldc = ldc};
    hs_gemm_plan *p = NULL;
    hs_status st = hs_gemm_plan_create(&s, &p, e);
    *ran = p != NULL;
    if (!p) return st;
    hs_gemm_plan_run(p, A, B, C);
    hs_gemm_plan_free(p);
    return HS_OK;
}

/* Operands from this many elements are converted over the calling
 * thread's OpenMP team (the GEMM's), row by row: the same bits. */
#define PACK_PAR_MIN ((int64_t)1 << 16)

/* A rows x cols matrix with row stride ld, converted into a packed copy. */
static void pack_matrix(void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t rows,
                        int64_t cols, int64_t ld) {
    size_t ds = hs_dtype_size(dst_dt), ss = hs_dtype_size(src_dt);
#pragma omp parallel for schedule(static) if (rows * cols >= PACK_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++)
        hs_convert((char *)dst + (size_t)(r * cols) * ds, dst_dt,
                   (const char *)src + (size_t)(r * ld) * ss, src_dt, cols);
}

/* One fp32 operand and one 16-bit: the fp32 one (in backward, the
 * activation gradient) is rounded to the other's dtype, as a 16-bit
 * autograd holds it, and the matmul runs natively. *ran false when oneDNN
 * has no such matmul here (the caller widens instead). */
static hs_status narrowed_matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 float alpha, const void *A, hs_dtype a_dt, int64_t lda,
                                 int64_t a_rows, int64_t a_cols, const void *B, hs_dtype b_dt,
                                 int64_t ldb, int64_t b_rows, int64_t b_cols, float beta, void *C,
                                 hs_dtype c_dt, int64_t ldc, bool *ran, hs_error *e) {
    bool a32 = a_dt == HS_DTYPE_F32;
    hs_dtype dt = a32 ? b_dt : a_dt;
    int64_t rows = a32 ? a_rows : b_rows, cols = a32 ? a_cols : b_cols, ld = a32 ? lda : ldb;
    size_t bytes = (size_t)(rows * cols) * hs_dtype_size(dt);
    void *t = malloc(bytes + 1);
    *ran = false;
    if (t == NULL)
        return hs_error_oom(e, "hs_gemm_ex: %zu bytes to round a %lldx%lld operand", bytes,
                            (long long)rows, (long long)cols);
    pack_matrix(t, dt, a32 ? A : B, HS_DTYPE_F32, rows, cols, ld);
    hs_status s = a32 ? matmul(trans_a, trans_b, M, N, K, alpha, t, dt, cols, B, b_dt, ldb, beta, C,
                               c_dt, ldc, ran, e)
                      : matmul(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, t, dt, cols, beta, C,
                               c_dt, ldc, ran, e);
    free(t);
    return s;
}

static void narrow_matrix(void *dst, hs_dtype dt, const float *src, int64_t rows, int64_t cols,
                          int64_t ld) {
    char *d = dst;
    size_t es = hs_dtype_size(dt);
#pragma omp parallel for schedule(static) if (rows * cols >= PACK_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; r++)
        hs_convert(d + (size_t)(r * ld) * es, dt, src + r * cols, HS_DTYPE_F32, cols);
}

/* The product in fp32: each 16-bit operand widened into one scratch, one
 * sgemm, C rounded once on the way out. */
static hs_status widened(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                         int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc,
                         hs_error *e) {
    /* Stored shapes: op(A) is M x K, so A itself is K x M when transposed. */
    int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    size_t need = 0;
    if (a_dt != HS_DTYPE_F32) need += (size_t)(a_rows * a_cols);
    if (b_dt != HS_DTYPE_F32) need += (size_t)(b_rows * b_cols);
    if (c_dt != HS_DTYPE_F32) need += (size_t)(M * N);
    float *scratch = malloc(need * sizeof(float) + 1); /* need 0: K 0 */
    if (scratch == NULL)
        return hs_error_oom(e, "hs_gemm_ex: %zu bytes of fp32 scratch for a %lldx%lldx%lld GEMM",
                            need * sizeof(float), (long long)M, (long long)N, (long long)K);
    float *next = scratch;
    const float *a32 = A, *b32 = B;
    float *c32 = C;
    int64_t lda32 = lda, ldb32 = ldb, ldc32 = ldc;
    if (a_dt != HS_DTYPE_F32) {
        pack_matrix(next, HS_DTYPE_F32, A, a_dt, a_rows, a_cols, lda);
        a32 = next, lda32 = a_cols, next += a_rows * a_cols;
    }
    if (b_dt != HS_DTYPE_F32) {
        pack_matrix(next, HS_DTYPE_F32, B, b_dt, b_rows, b_cols, ldb);
        b32 = next, ldb32 = b_cols, next += b_rows * b_cols;
    }
    if (c_dt != HS_DTYPE_F32) {
        c32 = next, ldc32 = N;
        /* beta == 0 means C is not read (BLAS semantics): zeros, so no
         * uninitialised scratch can reach the result. */
        if (beta != 0.0f) pack_matrix(c32, HS_DTYPE_F32, C, c_dt, M, N, ldc);
        else hs_fill_f32(c32, M * N, 0.0f);
    }
    hs_status s =
        hs_sgemm(trans_a, trans_b, M, N, K, alpha, a32, lda32, b32, ldb32, beta, c32, ldc32, e);
    if (s == HS_OK && c_dt != HS_DTYPE_F32) narrow_matrix(C, c_dt, c32, M, N, ldc);
    free(scratch);
    return s;
}

hs_status hs_gemm_ex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                     int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc, hs_error *e) {
    if (a_dt == HS_DTYPE_F32 && b_dt == HS_DTYPE_F32 && c_dt == HS_DTYPE_F32)
        return hs_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, e);
    HS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return HS_OK;
    bool ran = false;
    hs_status s = HS_OK;
    if (a_dt == b_dt && a_dt != HS_DTYPE_F32 && K > 0)
        s = matmul(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, c_dt, ldc,
                   &ran, e);
    int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    if (s == HS_OK && !ran && K > 0 && (a_dt == HS_DTYPE_F32) != (b_dt == HS_DTYPE_F32))
        s = narrowed_matmul(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, a_rows, a_cols, B, b_dt,
                            ldb, b_rows, b_cols, beta, C, c_dt, ldc, &ran, e);
    if (s != HS_OK || ran) return s;
    return widened(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, c_dt, ldc,
                   e);
}

static hs_status gemm_one(const hs_gemm_shape *s, const void *A, const void *B, void *C,
                          hs_error *e);

/* split_rows (train.reproducibility: layout): the rows of op(A) and C in
 * calls of exactly ROW_BLOCK rows, each single-threaded inside an OpenMP
 * team (oneDNN runs one thread there), the last block padded with zero
 * rows. oneDNN's sgemm gives a row different bits for different M (below
 * 16 rows on AVX-512; at most M on AVX2 its 6-row tiles and blocking
 * decide), but the same bits at every position of a call of the same
 * shape (tests/unit/test_tensor_gemm.c), so a row's bits no longer depend
 * on M, on where the row sits, or on the threads. */
#define ROW_BLOCK 48

/* Block b's rows of op(A), and of C, at ROW_BLOCK rows: in place where the
 * block is whole, else copied into zero-padded scratch (pa, pc). */
static hs_status gemm_block(const hs_gemm_shape *s, int64_t r0, const void *A, const void *B,
                            void *C, hs_error *e) {
    const size_t ea = hs_dtype_size(s->a_dt), ec = hs_dtype_size(s->c_dt);
    int64_t rows = s->M - r0 < ROW_BLOCK ? s->M - r0 : ROW_BLOCK;
    hs_gemm_shape b = *s;
    b.M = ROW_BLOCK;
    const char *a = (const char *)A + (size_t)(s->trans_a ? r0 : r0 * s->lda) * ea;
    char *c = (char *)C + (size_t)(r0 * s->ldc) * ec;
    if (rows == ROW_BLOCK) return gemm_one(&b, a, B, c, e);
    /* the tail: op(A)'s rows packed (trans_a: K x ROW_BLOCK, else
     * ROW_BLOCK x K), C's rows beside ROW_BLOCK - rows zero rows */
    size_t abytes = (size_t)(ROW_BLOCK * s->K) * ea, cbytes = (size_t)(ROW_BLOCK * s->N) * ec;
    char *pa = calloc(1, abytes + cbytes + 1);
    if (!pa)
        return hs_error_oom(e, "GEMM: %zu bytes for a block of %d rows", abytes + cbytes,
                            ROW_BLOCK);
    char *pc = pa + abytes;
    if (s->trans_a) {
        for (int64_t k = 0; k < s->K; k++)
            memcpy(pa + (size_t)(k * ROW_BLOCK) * ea, a + (size_t)(k * s->lda) * ea,
                   (size_t)rows * ea);
        b.lda = ROW_BLOCK;
    } else {
        for (int64_t i = 0; i < rows; i++)
            memcpy(pa + (size_t)(i * s->K) * ea, a + (size_t)(i * s->lda) * ea, (size_t)s->K * ea);
        b.lda = s->K;
    }
    b.ldc = s->N;
    if (s->beta != 0.0f)
        for (int64_t i = 0; i < rows; i++)
            memcpy(pc + (size_t)(i * s->N) * ec, c + (size_t)(i * s->ldc) * ec, (size_t)s->N * ec);
    hs_status st = gemm_one(&b, pa, B, pc, e);
    for (int64_t i = 0; st == HS_OK && i < rows; i++)
        memcpy(c + (size_t)(i * s->ldc) * ec, pc + (size_t)(i * s->N) * ec, (size_t)s->N * ec);
    free(pa);
    return st;
}

/* 16-bit operands widened once for all the blocks (the values a widened
 * product reads), not block by block. */
static float *widen_operands(hs_gemm_shape *s, const void **A, const void **B, hs_error *e) {
    int64_t a_rows = s->trans_a ? s->K : s->M, a_cols = s->trans_a ? s->M : s->K;
    int64_t b_rows = s->trans_b ? s->N : s->K, b_cols = s->trans_b ? s->K : s->N;
    size_t need = (s->a_dt != HS_DTYPE_F32 ? (size_t)(a_rows * a_cols) : 0) +
                  (s->b_dt != HS_DTYPE_F32 ? (size_t)(b_rows * b_cols) : 0);
    float *w = malloc(need * sizeof(float) + 1), *next = w;
    if (!w) {
        hs_error_oom(e, "GEMM: %zu bytes to widen its operands", need * sizeof(float));
        return NULL;
    }
    if (s->a_dt != HS_DTYPE_F32) {
        pack_matrix(next, HS_DTYPE_F32, *A, s->a_dt, a_rows, a_cols, s->lda);
        *A = next, s->a_dt = HS_DTYPE_F32, s->lda = a_cols, next += a_rows * a_cols;
    }
    if (s->b_dt != HS_DTYPE_F32) {
        pack_matrix(next, HS_DTYPE_F32, *B, s->b_dt, b_rows, b_cols, s->ldb);
        *B = next, s->b_dt = HS_DTYPE_F32, s->ldb = b_cols;
    }
    return w;
}

static hs_status gemm_rows(const hs_gemm_shape *shape, const void *A, const void *B, void *C,
                           hs_error *e) {
    hs_gemm_shape w = *shape;
    const hs_gemm_shape *s = &w;
    float *wide = NULL;
    if (w.widen && (w.a_dt != HS_DTYPE_F32 || w.b_dt != HS_DTYPE_F32)) {
        wide = widen_operands(&w, &A, &B, e);
        if (!wide) return e ? e->code : HS_ERR_OOM;
    }
    int64_t blocks = (s->M + ROW_BLOCK - 1) / ROW_BLOCK;
    int n = omp_in_parallel() ? 1 : omp_get_max_threads();
    hs_status st = HS_OK;
    /* always a team, even of one block: outside one oneDNN would take
     * every thread, and may split K among them */
#pragma omp parallel for schedule(static) num_threads(n)
    for (int64_t b = 0; b < blocks; b++) {
        hs_error mine;
        hs_status ms = gemm_block(s, b * ROW_BLOCK, A, B, C, &mine);
#pragma omp critical(hs_gemm_rows)
        if (ms != HS_OK && st == HS_OK) {
            st = ms;
            if (e) *e = mine;
        }
    }
    free(wide);
    return st;
}

hs_status hs_gemm_run(const hs_gemm_shape *s, const void *A, const void *B, void *C, hs_error *e) {
    if (s->split_rows && s->M > 0 && s->N > 0) return gemm_rows(s, A, B, C, e);
    return gemm_one(s, A, B, C, e);
}

static hs_status gemm_one(const hs_gemm_shape *s, const void *A, const void *B, void *C,
                          hs_error *e) {
    bool all32 = s->a_dt == HS_DTYPE_F32 && s->b_dt == HS_DTYPE_F32 && s->c_dt == HS_DTYPE_F32;
    if (!s->widen || all32 || s->M == 0 || s->N == 0)
        return hs_gemm_ex(s->trans_a, s->trans_b, s->M, s->N, s->K, s->alpha, A, s->a_dt, s->lda, B,
                          s->b_dt, s->ldb, s->beta, C, s->c_dt, s->ldc, e);
    HS_ASSERT(s->M > 0 && s->N > 0 && s->K >= 0);
    return widened(s->trans_a, s->trans_b, s->M, s->N, s->K, s->alpha, A, s->a_dt, s->lda, B,
                   s->b_dt, s->ldb, s->beta, C, s->c_dt, s->ldc, e);
}

/* oneDNN runs on OpenMP: the calling thread's team size. */
void hs_blas_set_threads(int n) {
    HS_ASSERT(n >= 1);
    omp_set_num_threads(n);
}

int hs_blas_get_threads(void) { return omp_get_max_threads(); }

const char *hs_gemm_isa(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx)
        return "avx512_core_amx";
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16)
        return "avx512_core_bf16";
    if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) return "avx512_core";
    if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2) return "avx2";
    return "sse41";
}

bool hs_gemm_native(hs_dtype dt, hs_dtype c_dt) {
    if (dt == HS_DTYPE_F32) return false;
    const uint16_t one[4] = {0}, two[4] = {0};
    float c[4];
    bool ran = false;
    /* A probe that cannot allocate its plan answers no, as if there were no
     * such matmul: it has nothing to report to, and the GEMMs that follow
     * meet the same shortage and report it. */
    matmul(false, false, 2, 2, 2, 1.0f, one, dt, 2, two, dt, 2, 0.0f, c, c_dt, 2, &ran, NULL);
    return ran;
}
