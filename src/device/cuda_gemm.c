/* The cuda backend's GEMM: cuBLASLt matmuls with fp32 accumulation, their
 * descriptors and chosen algorithm cached per shape, the row-major
 * contract of hs_gemm_shape mapped onto cuBLASLt's column-major one.
 *
 * Row-major C [M, N] is column-major C^T [N, M], so C = op(A) op(B)
 * becomes C^T = op(B)^T op(A)^T: cuBLASLt's first operand is B, its second
 * A, each transposed as its row-major self is. fp32 runs with TF32 off
 * unless HS_CUDA_TF32=1; 16-bit operands accumulate in fp32. With one
 * 16-bit and one fp32 operand the fp32 one is rounded to the other's dtype
 * first, as the contract allows; a C whose dtype cuBLASLt cannot write
 * from these operands goes through an fp32 copy. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device/cuda.h"
#include "device/cuda_elementwise_launch.h"

#define PLAN_SLOTS 128
#define LT_WORKSPACE ((size_t)32 << 20)

typedef struct plan_key {
    int64_t M, N, K, lda, ldb, ldc;
    int ta, tb, ab_dt, c_dt, align;
} plan_key;

typedef struct plan {
    bool used;
    plan_key key;
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} plan;

typedef struct plans {
    pthread_mutex_t mu;
    uint64_t clock;
    plan slot[PLAN_SLOTS];
} plans;

static cudaDataType_t cuda_type(hs_dtype dt) {
    return dt == HS_DTYPE_BF16 ? CUDA_R_16BF : dt == HS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static void plan_release(plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = false;
}

hs_status hs_cuda_gemm_init(hs_device *d, hs_error *e) {
    hs_cuda_ctx *c = d->ctx;
    cublasLtHandle_t lt = NULL;
    cublasStatus_t st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        return hs_error_set(e, HS_ERR_INTERNAL, "cuda device %d: cublasLtCreate failed: %s",
                            c->ordinal, cublasLtGetStatusString(st));
    c->lt = lt;
    plans *ps = calloc(1, sizeof *ps);
    if (ps == NULL) return hs_error_oom(e, "cuBLASLt's plan cache: %zu bytes", sizeof *ps);
    HS_CHECK_PTHREAD(pthread_mutex_init(&ps->mu, NULL));
    c->gemm_plans = ps;
    if (cudaMalloc(&c->lt_ws, LT_WORKSPACE) != cudaSuccess) {
        (void)cudaGetLastError();
        c->lt_ws = NULL;
        return hs_error_oom(e, "cuda device %d: cuBLASLt's workspace of %zu bytes", c->ordinal,
                            LT_WORKSPACE);
    }
    c->lt_ws_bytes = LT_WORKSPACE;
    return HS_OK;
}

void hs_cuda_gemm_free(hs_device *d) {
    hs_cuda_ctx *c = d->ctx;
    plans *ps = c->gemm_plans;
    if (ps) {
        for (int i = 0; i < PLAN_SLOTS; i++) plan_release(&ps->slot[i]);
        pthread_mutex_destroy(&ps->mu);
        free(ps);
    }
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->lt) cublasLtDestroy((cublasLtHandle_t)c->lt);
    c->gemm_plans = NULL, c->lt_ws = NULL, c->lt = NULL;
}

/* The largest power of two dividing every pointer, capped at 256 (what
 * cuBLASLt's heuristic assumes when not told). */
static int alignment_of(const void *A, const void *B, const void *C) {
    uintptr_t v = (uintptr_t)A | (uintptr_t)B | (uintptr_t)C | 256;
    return (int)(v & -v);
}

/* Builds p for its key: descriptors, layouts and the heuristic's first
 * algorithm. False (p left unused) when cuBLASLt has none. */
static bool plan_build(hs_cuda_ctx *c, plan *p, const plan_key *k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    cublasComputeType_t compute = k->ab_dt == HS_DTYPE_F32 && c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                      : CUBLAS_COMPUTE_32F;
    if (cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return false;
    /* cuBLASLt's first operand is our B (op as tb), its second our A. */
    cublasOperation_t op1 = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      op2 = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof op1);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof op2);
    cudaDataType_t ab = cuda_type((hs_dtype)k->ab_dt), ct = cuda_type((hs_dtype)k->c_dt);
    /* column-major shapes of the stored matrices */
    bool ok = cublasLtMatrixLayoutCreate(&p->a, ab, k->tb ? k->K : k->N, k->tb ? k->N : k->K,
                                         k->ldb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->b, ab, k->ta ? k->M : k->K, k->ta ? k->K : k->M,
                                         k->lda) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->c, ct, k->N, k->M, k->ldc) == CUBLAS_STATUS_SUCCESS;
    p->used = true; /* from here plan_release frees what was made */
    if (!ok) return false;
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    uint64_t ws = c->lt_ws_bytes;
    uint32_t align = (uint32_t)k->align;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                         sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align,
                                         sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align,
                                         sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align,
                                         sizeof align);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, p->desc, p->a, p->b,
                                                       p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p->algo = res.algo;
    return true;
}

/* The cached plan of k, built at first use (the least recently used slot
 * goes when all are taken). NULL when cuBLASLt has no algorithm. */
static plan *plan_get(hs_cuda_ctx *c, const plan_key *k) {
    plans *ps = c->gemm_plans;
    plan *hit = NULL, *victim = &ps->slot[0];
    for (int i = 0; i < PLAN_SLOTS && !hit; i++) {
        plan *p = &ps->slot[i];
        if (p->used && memcmp(&p->key, k, sizeof *k) == 0) hit = p;
        else if (!p->used || (victim->used && p->last_use < victim->last_use)) victim = p;
    }
    if (!hit) {
        plan_release(victim);
        if (!plan_build(c, victim, k)) {
            plan_release(victim);
            return NULL;
        }
        hit = victim;
    }
    hit->last_use = ++ps->clock;
    return hit;
}

/* The elements a row-major [rows, cols] matrix of row stride ld spans. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld) {
    return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

/* C = alpha op(A) op(B) + beta C with A and B of one dtype and a C cuBLASLt
 * writes from them (their dtype, or fp32). The device's default stream
 * uses the workspace made at start; a GEMM on another stream takes one of
 * its own from the stream-ordered scratch (the same size, so the plan's
 * algorithm holds), so two streams never share a workspace. */
static void lt_matmul(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g,
                      hs_dtype ab_dt, hs_dtype c_dt) {
    hs_cuda_ctx *c = hs_cuda_ctx_of(s);
    plan_key k;
    memset(&k, 0, sizeof k); /* the key is compared bytewise */
    k.M = g->M, k.N = g->N, k.K = g->K, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    k.ta = g->trans_a, k.tb = g->trans_b, k.ab_dt = ab_dt, k.c_dt = c_dt;
    k.align = alignment_of(A, B, C);
    cudaStream_t st = hs_cuda_stream(s);
    void *ws = c->lt_ws, *own = NULL;
    if (s != s->dev->stream) {
        own = hs_cuda_scratch(s, c->lt_ws_bytes, "cuBLASLt's workspace on a side stream");
        if (own == NULL) return; /* recorded on the device as out of memory */
        ws = own;
    }
    plans *ps = c->gemm_plans;
    pthread_mutex_lock(&ps->mu);
    plan *p = plan_get(c, &k);
    cublasStatus_t r = CUBLAS_STATUS_NOT_SUPPORTED;
    if (p)
        r = cublasLtMatmul((cublasLtHandle_t)c->lt, p->desc, &g->alpha, B, p->a, A, p->b, &g->beta,
                           C, p->c, C, p->c, &p->algo, ws, c->lt_ws_bytes, st);
    pthread_mutex_unlock(&ps->mu);
    hs_cuda_scratch_free(s, own);
    if (r != CUBLAS_STATUS_SUCCESS) {
        hs_error e;
        hs_error_clear(&e);
        hs_error_set(&e, HS_ERR_INTERNAL,
                     "cuda device %d: cuBLASLt matmul M %lld N %lld K %lld (%s x %s -> %s, "
                     "trans %d %d, ld %lld %lld %lld) failed: %s",
                     c->ordinal, (long long)g->M, (long long)g->N, (long long)g->K,
                     hs_dtype_name(ab_dt), hs_dtype_name(ab_dt), hs_dtype_name(c_dt),
                     (int)g->trans_a, (int)g->trans_b, (long long)g->lda, (long long)g->ldb,
                     (long long)g->ldc, cublasLtGetStatusString(r));
        hs_device_fail(s->dev, &e);
    }
}

/* Between C (ldc) and a packed [M, N] buffer, in one launch. */
static void convert_rows(hs_stream *s, void *dst, hs_dtype ddt, int64_t dld, const void *src,
                         hs_dtype sdt, int64_t sld, int64_t M, int64_t N) {
    hs_cuda_check(s,
                  hs_cu_convert_2d(hs_cuda_stream(s), dst, (int)ddt, dld, src, (int)sdt, sld, M, N),
                  "gemm's C conversion");
}

void hs_cuda_gemm(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g) {
    if (g->M == 0 || g->N == 0) return;
    if (g->K == 0) { /* C = beta C */
        if (g->beta == 1.0f) return;
        size_t es = hs_dtype_size(g->c_dt);
        if (g->beta == 0.0f) {
            hs_cuda_check(s,
                          cudaMemset2DAsync(C, (size_t)g->ldc * es, 0, (size_t)g->N * es,
                                            (size_t)g->M, hs_cuda_stream(s)),
                          "gemm's zero C");
            return;
        }
        if (g->c_dt == HS_DTYPE_F32 && g->ldc == g->N) {
            hs_cuda_scale(s, C, g->beta, g->M * g->N);
            return;
        }
        hs_error e;
        hs_error_clear(&e);
        hs_error_set(&e, HS_ERR_INTERNAL,
                     "cuda gemm: K = 0 with beta %g on a strided or 16-bit C is not provided",
                     (double)g->beta);
        hs_device_fail(s->dev, &e);
        return;
    }
    /* One dtype for both operands: the fp32 one rounded to the other's
     * (or, two 16-bit dtypes, B to A's). */
    hs_dtype ab = g->a_dt == HS_DTYPE_F32 ? g->b_dt : g->a_dt;
    const void *a = A, *b = B;
    void *tmp = NULL;
    if (g->a_dt != g->b_dt) {
        bool round_a = g->a_dt != ab;
        int64_t n = round_a ? span(g->trans_a ? g->K : g->M, g->trans_a ? g->M : g->K, g->lda)
                            : span(g->trans_b ? g->N : g->K, g->trans_b ? g->K : g->N, g->ldb);
        tmp = hs_cuda_scratch(s, (size_t)n * hs_dtype_size(ab), "gemm's rounded operand");
        if (tmp == NULL) return;
        hs_cuda_convert(s, tmp, ab, round_a ? A : B, round_a ? g->a_dt : g->b_dt, n);
        if (round_a) a = tmp;
        else b = tmp;
    }
    if (g->c_dt == ab || g->c_dt == HS_DTYPE_F32) {
        lt_matmul(s, C, a, b, g, ab, g->c_dt);
    } else { /* C in a dtype cuBLASLt does not write from ab: through fp32 */
        float *c32 = hs_cuda_scratch(s, (size_t)(g->M * g->N) * sizeof(float), "gemm's fp32 C");
        if (c32) {
            if (g->beta != 0.0f)
                convert_rows(s, c32, HS_DTYPE_F32, g->N, C, g->c_dt, g->ldc, g->M, g->N);
            hs_gemm_shape g32 = *g;
            g32.c_dt = HS_DTYPE_F32, g32.ldc = g->N;
            lt_matmul(s, c32, a, b, &g32, ab, HS_DTYPE_F32);
            convert_rows(s, C, g->c_dt, g->ldc, c32, HS_DTYPE_F32, g->N, g->M, g->N);
            hs_cuda_scratch_free(s, c32);
        }
    }
    hs_cuda_scratch_free(s, tmp);
}
