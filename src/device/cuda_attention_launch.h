/* Private to src/device/: the launchers of cuda_attention.cu, in plain C
 * types for cuda_attention.c (dtypes as integers: 0 fp32, 1 bf16, 2 fp16).
 * Each enqueues its kernels on st and returns the launch's cudaError_t
 * (cudaGetLastError after it). */
#ifndef HS_DEVICE_CUDA_ATTENTION_LAUNCH_H
#define HS_DEVICE_CUDA_ATTENTION_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest head dim the kernels hold (their per-lane accumulators and
 * shared tiles are sized for it). */
#define HS_CUDA_ATT_MAX_HD 256

/* One call's shapes and row ranges (hs_att_rows): q/out [B, Tq, NH*HD],
 * k/v [B, Tk, KVH*HD]; query rows [q0, q0+nq), row q0 at global position
 * gq, against key rows [k0, k0+nk), row k0 at global position gk; lo: each
 * position's document start ([B, lo_ld] int32, device memory) or NULL. */
typedef struct hs_cuda_att_dims {
    int B, NH, KVH, HD;
    int Tq, q0, nq;
    int Tk, k0, nk;
    int64_t gq, gk;
    const int32_t *lo;
    int64_t lo_ld;
} hs_cuda_att_dims;

/* out (odt) and lse ([B, NH, Tq] fp32) on the query rows of d only.
 * smem_optin: the shared memory a block may opt in to on this GPU. */
cudaError_t hs_cuda_launch_attention_fwd(cudaStream_t st, void *out, int odt, float *lse,
                                         const void *q, const void *k, const void *v, int dt,
                                         hs_cuda_att_dims d, size_t smem_optin);
/* delta[b, h, t] ([B, NH, Tq]) = sum over the head dim of dout * out (out
 * in odt), on the rows t of [t0, t0+nt). */
cudaError_t hs_cuda_launch_attention_delta(cudaStream_t st, float *delta, const float *dout,
                                           const void *out, int odt, int B, int NH, int HD, int Tq,
                                           int t0, int nt);
/* dq (query rows of d), dk and dv (key rows of d) += the gradients, fp32,
 * from each query row's delta ([B, NH, Tq]). */
cudaError_t hs_cuda_launch_attention_bwd(cudaStream_t st, float *dq, float *dk, float *dv,
                                         const float *dout, const void *q, const void *k,
                                         const void *v, const float *lse, const float *delta,
                                         int dt, hs_cuda_att_dims d, size_t smem_optin);
/* The ring's online-softmax merge on query rows [q0, q0+nq) of Tq. */
cudaError_t hs_cuda_launch_attention_merge(cudaStream_t st, float *out, float *lse,
                                           const float *bout, const float *blse, int B, int NH,
                                           int HD, int Tq, int q0, int nq);

#ifdef __cplusplus
}
#endif

#endif
