/* Private to src/device/: the cuda backend (HS_CUDA builds only).
 *
 * Its C files include this: cuda.c (memory, streams, events, the table),
 * cuda_gemm.c (cuBLASLt) and one cuda_<family>.c per kernel family, which
 * implements the table's entries hs_cuda_<name> over the CUDA C++
 * launchers of its cuda_<family>.cu, declared in cuda_<family>_launch.h
 * with plain C types. The .cu files include only their launch header:
 * device.h is C11 (<stdatomic.h>) and not C++.
 *
 * A stream's ctx is its cudaStream_t and an event's its cudaEvent_t. A
 * launcher returns the launch's cudaError_t (cudaGetLastError after it);
 * the entry hands it to hs_cuda_check, which records a failure on the
 * device as a failed scratch allocation is (hs_device_status). Entries
 * that hand a scalar back to the host (sumsq, xent, xent_shard_loss)
 * reduce into device scratch and cross with hs_cuda_to_host. */
#ifndef HS_DEVICE_CUDA_H
#define HS_DEVICE_CUDA_H

#include <cuda_runtime_api.h>

#include "device/cudnn_sdpa.h"
#include "device/device_backend.h"
#include "device/kernel_list.h"

_Static_assert(HS_DTYPE_F32 == 0 && HS_DTYPE_BF16 == 1 && HS_DTYPE_F16 == 2,
               "the launch headers pass hs_dtype as these integers");

typedef struct hs_cuda_ctx {
    int ordinal;            /* the GPU this device drives */
    int cc_major, cc_minor; /* its compute capability */
    int sm_count;
    size_t smem_optin; /* shared memory a block may opt in to */
    bool tf32;         /* fp32 GEMMs may round through TF32 (HS_CUDA_TF32=1) */
    void *lt;          /* cublasLtHandle_t */
    void *lt_ws;       /* cuBLASLt's workspace: device memory of lt_ws_bytes */
    size_t lt_ws_bytes;
    void *gemm_plans; /* cuda_gemm.c's cache of matmul descriptors */
    /* Attention on the tensor cores through hypershard-cudnn.so
     * (cudnn_sdpa.h): NULL when it is not used, and the device's note
     * says why (cuda_attention.c). */
    const hs_cudnn_sdpa_ops *sdpa_ops;
    hs_cudnn_sdpa *sdpa;
} hs_cuda_ctx;

/* s's cudaStream_t, with s's GPU made current on the calling thread (the
 * communication threads and the trainer's threads call entries too). */
cudaStream_t hs_cuda_stream(hs_stream *s);
static inline hs_cuda_ctx *hs_cuda_ctx_of(const hs_stream *s) { return (hs_cuda_ctx *)s->dev->ctx; }

/* Records err (when it is not cudaSuccess) on s's device, naming `what`:
 * the first failure is kept for hs_device_status. */
void hs_cuda_check(hs_stream *s, cudaError_t err, const char *what);
/* Device scratch for the work of one entry on s: stream-ordered
 * (cudaMallocAsync / cudaFreeAsync on s, from a pool that keeps its
 * memory), so it may be freed as soon as the kernels using it are
 * enqueued. NULL, recorded on the device as out of memory, when refused. */
void *hs_cuda_scratch(hs_stream *s, size_t bytes, const char *what);
void hs_cuda_scratch_free(hs_stream *s, void *p);
/* dst (host) = bytes of src (device) once s's work before it is done: the
 * scalars an entry hands back to the host. */
void hs_cuda_to_host(hs_stream *s, void *dst, const void *src, size_t bytes);

/* Whether attention takes cuDNN's fused SDPA (hypershard-cudnn.so, unless
 * HS_CUDA_ATTENTION=cores), said in the device's note; never fails: the
 * CUDA-core kernels serve without it (cuda_attention.c). */
void hs_cuda_attention_init(hs_device *d);
/* HS_OK, or HS_ERR_CONFIG naming HS_CUDA_ATTENTION and its two values when
 * it holds another; checked before any GPU is touched. */
hs_status hs_cuda_attention_env_check(hs_error *e);
void hs_cuda_attention_free(hs_device *d);
/* cuBLASLt's handle, workspace and descriptor cache (cuda_gemm.c). */
hs_status hs_cuda_gemm_init(hs_device *d, hs_error *e);
void hs_cuda_gemm_free(hs_device *d);

/* Every entry of the table, with its signature in hs_device_kernels; the
 * table (cuda.c) names those this backend has. */
#define HS_CUDA_DECLARE(name, params, args, ptrs) void hs_cuda_##name params;
HS_DEVICE_KERNEL_LIST(HS_CUDA_DECLARE)
#undef HS_CUDA_DECLARE

#endif
