/* The cuda backend's kernels for Muon's Newton-Schulz besides its GEMMs:
 * the normalisation g / (|g|_F + 1e-7), as the cpu backend forms it (the
 * squares summed in fp64, the factor rounded to fp32 once, one fp32
 * product per value), with the norm kept on the device so the iteration
 * never waits for the host. The sum is a fixed tree of per-block partial
 * sums, the same bits run to run. */
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "device/cuda_muon_launch.h"

#define THREADS 256
#define MAX_PARTS 1024
/* Values a thread takes in the sum of squares before another block is
 * added. */
#define PER_THREAD 16

static int parts_for(int64_t n) {
    int64_t b = (n + THREADS * PER_THREAD - 1) / (THREADS * PER_THREAD);
    return (int)(b < 1 ? 1 : b > MAX_PARTS ? MAX_PARTS : b);
}

/* The block's sum of v, in thread 0 (blockDim.x == THREADS). */
static __device__ double block_sum(double v) {
    __shared__ double warp_sums[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / 32 ? warp_sums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    }
    return v;
}

static __global__ void sumsq_part_kernel(double *part, const float *g, int64_t n) {
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * THREADS) {
        const double v = g[i];
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

/* factor = (float)(1 / (sqrt(sum of the parts) + 1e-7)), kept as a double. */
static __global__ void factor_kernel(double *factor, const double *part, int parts) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < parts; i += THREADS) acc += part[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *factor = (double)(float)(1.0 / (sqrt(acc) + 1e-7));
}

static __global__ void scale_kernel(float *x, const float *g, const double *factor, int64_t n) {
    const float a = (float)*factor;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * THREADS)
        x[i] = __fmul_rn(g[i], a);
}

extern "C" size_t hs_cu_ns_normalise_scratch(int64_t n) {
    return (size_t)(1 + parts_for(n)) * sizeof(double);
}

extern "C" cudaError_t hs_cu_ns_normalise(cudaStream_t st, float *x, const float *g, void *scratch,
                                          int64_t n) {
    if (n <= 0) return cudaSuccess;
    double *factor = (double *)scratch, *part = factor + 1;
    const int parts = parts_for(n);
    sumsq_part_kernel<<<parts, THREADS, 0, st>>>(part, g, n);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    factor_kernel<<<1, THREADS, 0, st>>>(factor, part, parts);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    int64_t blocks = (n + THREADS - 1) / THREADS;
    scale_kernel<<<(unsigned)(blocks > 65535 ? 65535 : blocks), THREADS, 0, st>>>(x, g, factor, n);
    return cudaGetLastError();
}
