/* Private to src/device/: the launchers of cuda_nn.cu (RMSNorm, RoPE,
 * SwiGLU, cross-entropy), in plain C types so that cuda_nn.c (C11) and
 * cuda_nn.cu (CUDA C++) share them. Dtypes are hs_dtype's integers (0 fp32,
 * 1 bf16, 2 fp16); pointers are device memory or mapped pinned host memory.
 * Each launcher enqueues its kernels on `st` and returns cudaGetLastError()
 * after them (cudaSuccess, launching nothing, when there is no element;
 * the two losses still store a zero total then). */
#ifndef HS_DEVICE_CUDA_NN_LAUNCH_H
#define HS_DEVICE_CUDA_NN_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of one block of rmsnorm's backward: each such chunk leaves one row
 * of C fp64 partial dw sums, added in chunk order afterwards, so dw does
 * not depend on the grid or the GPU. */
#define HS_CUDA_RMSNORM_BWD_ROWS 32
static inline int64_t hs_cuda_rmsnorm_bwd_chunks(int64_t N) {
    return (N + HS_CUDA_RMSNORM_BWD_ROWS - 1) / HS_CUDA_RMSNORM_BWD_ROWS;
}

/* A loss summed over rows in row order (fp64) and its count of rows with a
 * target >= 0: what xent and xent_shard_loss hand back to the host. */
typedef struct hs_cuda_loss_total {
    double loss;
    int64_t valid;
} hs_cuda_loss_total;

cudaError_t hs_cuda_launch_rmsnorm_fwd(cudaStream_t st, void *out, float *rstd, const void *x,
                                       int xdt, const void *w, int dt, int64_t N, int C, float eps);
/* dx += ...; with part (hs_cuda_rmsnorm_bwd_chunks(N) rows of C doubles)
 * each chunk's dw sums are stored there; NULL: dw is not wanted. */
cudaError_t hs_cuda_launch_rmsnorm_bwd(cudaStream_t st, float *dx, double *part, const float *dout,
                                       const void *x, int xdt, const void *w, const float *rstd,
                                       int dt, int64_t N, int C);
/* dw (gdt) += the sum of part's chunk rows, rounded once. */
cudaError_t hs_cuda_launch_rmsnorm_dw(cudaStream_t st, void *dw, int gdt, const double *part,
                                      int64_t N, int C);

/* x [B, T, H, HD] (dt) rotated in place by the tables' angle times sign
 * (+1 forward; -1 on the fp32 gradient, dt 0, backward). */
cudaError_t hs_cuda_launch_rope(cudaStream_t st, void *x, int dt, const float *cos_t,
                                const float *sin_t, float sign, int B, int T, int H, int HD);

cudaError_t hs_cuda_launch_swiglu_fwd(cudaStream_t st, void *out, const void *gate, const void *up,
                                      int dt, int64_t n);
/* swiglu_bwd's stored values rounded into the 16-bit dt (hs_convert's
 * bits). */
cudaError_t hs_cuda_launch_swiglu_bwd16(cudaStream_t st, void *dgate16, void *dup16,
                                        const float *dout, const void *gate, const void *up, int dt,
                                        int64_t n);
cudaError_t hs_cuda_launch_swiglu_bwd(cudaStream_t st, float *dgate, float *dup, bool overwrite,
                                      const float *dout, const void *gate, const void *up, int dt,
                                      int64_t n);

/* Each valid row's loss into row_loss [N] (fp64) and its gradient into
 * dlogits (NULL: none), then their sum in row order into *total (device
 * memory, as row_loss). */
cudaError_t hs_cuda_launch_xent(cudaStream_t st, hs_cuda_loss_total *total, double *row_loss,
                                float *dlogits, const float *logits, const int32_t *targets,
                                int64_t N, int V, float scale);
cudaError_t hs_cuda_launch_xent_shard_max(cudaStream_t st, float *row_max, const float *logits,
                                          int64_t N, int V);
cudaError_t hs_cuda_launch_xent_shard_sums(cudaStream_t st, float *row_sumexp, float *row_target,
                                           const float *logits, const float *gmax,
                                           const int32_t *targets, int64_t N, int V, int64_t v0);
cudaError_t hs_cuda_launch_xent_shard_grad(cudaStream_t st, float *logits, const float *gmax,
                                           const float *row_sumexp, const int32_t *targets,
                                           int64_t N, int V, int64_t v0, float scale);
cudaError_t hs_cuda_launch_xent_shard_loss(cudaStream_t st, hs_cuda_loss_total *total,
                                           const float *gmax, const float *row_sumexp,
                                           const float *row_target, const int32_t *targets,
                                           int64_t N);

#ifdef __cplusplus
}
#endif

#endif
