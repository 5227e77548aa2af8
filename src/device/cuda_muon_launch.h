/* Private to src/device/: the launchers of cuda_muon.cu, the pieces of
 * Muon's Newton-Schulz that are not GEMMs, with plain C types for
 * cuda_muon.c. Each enqueues its work on `st` and returns the launch's
 * error (cudaGetLastError after it). */
#ifndef HS_DEVICE_CUDA_MUON_LAUNCH_H
#define HS_DEVICE_CUDA_MUON_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device scratch hs_cu_ns_normalise needs for n values. */
size_t hs_cu_ns_normalise_scratch(int64_t n);
/* x = g * (float)(1 / (|g|_F + 1e-7)), the Frobenius norm's square summed
 * in fp64 on the device (no value crosses to the host); x may be g. */
cudaError_t hs_cu_ns_normalise(cudaStream_t st, float *x, const float *g, void *scratch, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
