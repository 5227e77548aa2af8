/* The cuda backend's Muon Newton-Schulz: reference's algorithm on the
 * table's fp32 GEMM (cuBLASLt, TF32 off unless HS_CUDA_TF32=1). X = G /
 * (|G|_F + 1e-7) (cuda_muon.cu, on the device), then `steps` times X <- aX
 * + (bA + cA^2)X with A = X X^T on the wide orientation, so that the Gram
 * matrix is the small one.
 *
 * A tall G (rows > cols) iterates on Y = X^T, which is G's own layout, so
 * nothing is transposed: A = Y^T Y and Y <- aY + Y (bA + cA^2)^T are the
 * same products read through the GEMM's transpose flags. X ping-pongs
 * between `out` and one scratch matrix, starting on the side where
 * `steps` swaps leave it in `out`. The caller's workspace `ws` is a host
 * size hint; the scratch (Gram matrix, polynomial, the second matrix,
 * the norm) comes from the stream's pool. */
#include "device/cuda.h"
#include "device/cuda_muon_launch.h"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

/* C = alpha op(A) op(B) + beta C on fp32 row-major matrices, through s's
 * table (hs_cuda_gemm). */
#define GEMM_F32(s, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)                          \
    hs_stream_gemm(s, ta, tb, M, N, K, alpha, A, HS_DTYPE_F32, lda, B, HS_DTYPE_F32, ldb, beta, C, \
                   HS_DTYPE_F32, ldc)

static void copy_f32(hs_stream *s, float *dst, const float *src, int64_t n) {
    hs_cuda_check(s,
                  cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                  hs_cuda_stream(s)),
                  "Newton-Schulz's copy");
}

/* One iteration from x into next on the n x m wide matrix X (tall: x holds
 * Y = X^T, m x n). */
static void ns_iterate(hs_stream *s, float *next, const float *x, float *gram, float *poly,
                       int64_t n, int64_t m, bool tall) {
    if (tall) GEMM_F32(s, true, false, n, n, m, 1.0f, x, n, x, n, 0.0f, gram, n);
    else GEMM_F32(s, false, true, n, n, m, 1.0f, x, m, x, m, 0.0f, gram, n);
    copy_f32(s, poly, gram, n * n);
    GEMM_F32(s, false, false, n, n, n, NS_C, gram, n, gram, n, NS_B, poly, n);
    copy_f32(s, next, x, n * m);
    if (tall) GEMM_F32(s, false, true, m, n, n, 1.0f, x, n, poly, n, NS_A, next, n);
    else GEMM_F32(s, false, false, n, m, n, 1.0f, poly, n, x, m, NS_A, next, m);
}

void hs_cuda_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows,
                                int64_t cols, int steps, float *ws) {
    (void)ws;
    if (rows <= 0 || cols <= 0) return;
    const bool tall = rows > cols;
    const int64_t n = tall ? cols : rows, m = tall ? rows : cols, numel = rows * cols;
    /* the norm's doubles first, so they stay aligned */
    const size_t norm_bytes = (hs_cu_ns_normalise_scratch(numel) + 15) & ~(size_t)15;
    const bool odd = steps > 0 && steps % 2 == 1;
    const size_t floats = steps > 0 ? (size_t)(2 * n * n + numel) : 0;
    char *buf = hs_cuda_scratch(s, norm_bytes + floats * sizeof(float), "Newton-Schulz");
    if (buf == NULL) return;
    float *gram = (float *)(buf + norm_bytes), *poly = gram + n * n, *other = poly + n * n;
    float *x = odd ? other : out, *next = odd ? out : other;
    cudaError_t err = hs_cu_ns_normalise(hs_cuda_stream(s), x, g, buf, numel);
    hs_cuda_check(s, err, "muon_newton_schulz");
    for (int k = 0; k < steps && err == cudaSuccess; k++) {
        ns_iterate(s, next, x, gram, poly, n, m, tall);
        float *t = x;
        x = next, next = t;
    }
    hs_cuda_scratch_free(s, buf);
}
