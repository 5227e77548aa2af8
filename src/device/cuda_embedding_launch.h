/* Private to src/device/: the launchers of cuda_embedding.cu (the token
 * embedding's row gather and its deterministic scatter-add), with plain C
 * types for cuda_embedding.c: dtypes as hs_dtype's integers (0 fp32,
 * 1 bf16, 2 fp16). Each enqueues its work on `st` and returns the launch's
 * error (cudaGetLastError after it). */
#ifndef HS_DEVICE_CUDA_EMBEDDING_LAUNCH_H
#define HS_DEVICE_CUDA_EMBEDDING_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[n,:] (odt) = wte[tokens[n] - v0,:] (dt) where the table's V rows
 * hold the token, zeros elsewhere. */
cudaError_t hs_cu_embedding_fwd(cudaStream_t st, void *out, int odt, const int32_t *tokens,
                                const void *wte, int dt, int64_t N, int C, int64_t v0, int V);
/* The bytes of device scratch hs_cu_embedding_bwd needs for N tokens into
 * a table of V rows; 0 when N is past what it can sort (2^31 - 1). */
size_t hs_cu_embedding_bwd_scratch(int64_t N, int V);
/* dwte[tokens[n] - v0,:] += dout[n,:] for the tokens the table holds, each
 * row's tokens added in token order with one rounding to gdt per addition
 * (the reference's bits), through `scratch` of the bytes above. */
cudaError_t hs_cu_embedding_bwd(cudaStream_t st, void *scratch, size_t scratch_bytes, void *dwte,
                                int gdt, const float *dout, const int32_t *tokens, int64_t N, int C,
                                int64_t v0, int V);

#ifdef __cplusplus
}
#endif

#endif
