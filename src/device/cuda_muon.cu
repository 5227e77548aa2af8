/* The cuda backend's kernels for Muon's Newton-Schulz besides its GEMMs:
 * the normalisation g / (|g|_F + 1e-7), as the cpu backend forms it (the
 * squares summed in fp64, the factor rounded to fp32 once, one fp32
 * product per value), with the norm kept on the device so the iteration
 * never waits for the host. The sum of squares is the element-wise
 * family's (cuda_elementwise.cu): a fixed tree, the same bits run to run. */
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "device/cuda_dtype.cuh"
#include "device/cuda_elementwise_launch.h"
#include "device/cuda_muon_launch.h"

/* x = g * (float)(1 / (sqrt(*sumsq) + 1e-7)) */
static __global__ void scale_kernel(float *x, const float *g, const double *sumsq, int64_t n) {
    const float a = (float)(1.0 / (sqrt(*sumsq) + 1e-7));
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) x[i] = __fmul_rn(g[i], a);
}

extern "C" size_t hs_cu_ns_normalise_scratch(int64_t n) { return hs_cu_sumsq_scratch(n); }

extern "C" cudaError_t hs_cu_ns_normalise(cudaStream_t st, float *x, const float *g, void *scratch,
                                          int64_t n) {
    if (n <= 0) return cudaSuccess;
    double *sumsq = (double *)scratch; /* hs_cu_sumsq leaves the sum in its first double */
    cudaError_t err = hs_cu_sumsq(st, sumsq, g, n);
    if (err != cudaSuccess) return err;
    scale_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(x, g, sumsq, n);
    return cudaGetLastError();
}
