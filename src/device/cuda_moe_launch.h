/* Private to src/device/: the launchers of cuda_moe.cu (MoE routing,
 * dispatch, permutation, combine, their backward and the router's
 * statistics), with plain C types for cuda_moe.c: dtypes as hs_dtype's
 * integers (0 fp32, 1 bf16, 2 fp16), counts int64_t. The arguments mean
 * what they mean in hs_device_kernels (include/hypershard/device.h). Each
 * enqueues its work on `st` and returns the launch's error
 * (cudaGetLastError after it); `scratch` is device memory of the bytes
 * the matching *_scratch function asks for, from the caller. */
#ifndef HS_DEVICE_CUDA_MOE_LAUNCH_H
#define HS_DEVICE_CUDA_MOE_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of scratch moe_route needs: 0 when its per-row workspace fits in
 * shared memory (E + K doubles a row). */
size_t hs_cu_moe_route_scratch(int64_t N, int E, int K);
cudaError_t hs_cu_moe_route(cudaStream_t st, int32_t *expert, float *weight, float *probs,
                            void *scratch, int64_t N, int E, int K, bool renorm, int dt);
/* The router beyond the softmax (hs_moe_router's fields, device.h):
 * sigmoid scores, a correction bias [E] (NULL: none), n_group groups of
 * which topk_group are kept, the weights times scale. Scratch: 0 when its
 * per-row workspace fits in shared memory (2E + K doubles a row). */
#define HS_CU_MOE_MAX_GROUPS 64 /* n_group: hs_moe_router's bound */
typedef struct hs_cu_router {
    bool sigmoid, renorm;
    int n_group, topk_group;
    float scale;
} hs_cu_router;
size_t hs_cu_moe_route_scored_scratch(int64_t N, int E, int K);
cudaError_t hs_cu_moe_route_scored(cudaStream_t st, int32_t *expert, float *weight, float *probs,
                                   const float *bias, void *scratch, int64_t N, int E, int K,
                                   hs_cu_router r, int dt);
cudaError_t hs_cu_moe_permute(cudaStream_t st, void *xg, const void *x, const int32_t *row_pair,
                              int dt, int64_t N, int K, int C);
/* Bytes of scratch moe_permute_bwd needs: row_pair's inverse. */
size_t hs_cu_moe_permute_bwd_scratch(int64_t N, int K);
cudaError_t hs_cu_moe_permute_bwd(cudaStream_t st, float *dx, const float *dxg,
                                  const int32_t *row_pair, void *scratch, int64_t N, int K, int C);
cudaError_t hs_cu_moe_unpermute(cudaStream_t st, float *out, const void *y, int dt,
                                const int32_t *pair_row, const float *weight, int64_t N, int K,
                                int C);
cudaError_t hs_cu_moe_combine_bwd(cudaStream_t st, float *dyg, float *dw, const float *dout,
                                  const void *y, int dt, const int32_t *pair_row,
                                  const float *weight, int64_t N, int K, int C);
cudaError_t hs_cu_moe_route_bwd(cudaStream_t st, float *dp, const float *probs,
                                const int32_t *expert, const float *dw, const float *aux_grad,
                                int64_t N, int E, int K, hs_cu_router r);
/* Bytes of scratch moe_stats needs: the blocks' partial sums of probs (0
 * when prob_sum is not asked for). */
size_t hs_cu_moe_stats_scratch(int64_t N, int E, bool sums);
cudaError_t hs_cu_moe_stats(cudaStream_t st, int64_t *count, double *prob_sum,
                            const int32_t *expert, const float *probs, void *scratch, int64_t N,
                            int E, int K);
cudaError_t hs_cu_moe_stats_add(cudaStream_t st, int64_t *count, double *prob_sum,
                                const int64_t *count_in, const double *prob_sum_in, int E);
cudaError_t hs_cu_moe_dispatch(cudaStream_t st, int32_t *offset, int32_t *row_pair,
                               int32_t *pair_row, const int32_t *expert, const int64_t *count,
                               int64_t N, int E, int K);

#ifdef __cplusplus
}
#endif

#endif
