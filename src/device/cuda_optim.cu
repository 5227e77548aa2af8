/* The cuda backend's optimizer kernels: AdamW's and Muon's element updates
 * of a parameter held in its own dtype (read as fp32, the result rounded
 * once) and Muon's momentum.
 *
 * The arithmetic is cpu_optim.c's, operation for operation (torch's
 * order): __fmul_rn / __fadd_rn / __fsub_rn and the IEEE division and
 * square root keep nvcc from fusing or approximating, so the bits are the
 * cpu backend's. */
#include "device/cuda_dtype.cuh"
#include "device/cuda_optim_launch.h"

/* m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p = p decay - step_size (m / (sqrt(v) / bias2_sqrt + eps)). */
template <int PDT>
static __global__ void adamw_kernel(void *p, float *m, float *v, const float *g,
                                    hs_cu_adamw_scalars h, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(h.beta1, m[i]), __fmul_rn(h.one_minus_beta1, gi));
        float vi =
            __fadd_rn(__fmul_rn(h.beta2, v[i]), __fmul_rn(h.one_minus_beta2, __fmul_rn(gi, gi)));
        m[i] = mi;
        v[i] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bias2_sqrt), h.eps);
        float pi = hs_cu_ld<PDT>(p, i);
        hs_cu_st<PDT>(
            p, i,
            __fsub_rn(__fmul_rn(pi, h.decay_factor), __fmul_rn(h.step_size, __fdiv_rn(mi, denom))));
    }
}

extern "C" cudaError_t hs_cu_adamw(cudaStream_t st, void *p, int pdt, float *m, float *v,
                                   const float *g, hs_cu_adamw_scalars h, int64_t n) {
    if (n <= 0) return cudaSuccess;
    return hs_cu_by_dtype(pdt, [&](auto d) {
        adamw_kernel<decltype(d)::value>
            <<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(p, m, v, g, h, n);
        return cudaGetLastError();
    });
}

/* Block b of the grid works on the tensor whose block range holds it,
 * striding over that tensor as adamw_kernel strides over its one. */
static __global__ void adamw_many_kernel(const hs_cu_adamw_item *items, int count,
                                         hs_cu_adamw_scalars h) {
    int b = (int)blockIdx.x;
    hs_cu_adamw_item it = hs_cu_item_of(items, count, b);
    int64_t stride = (int64_t)it.blocks * blockDim.x;
    for (int64_t i = (int64_t)(b - it.first_block) * blockDim.x + threadIdx.x; i < it.n;
         i += stride) {
        float gi = it.g[i];
        float mi = __fadd_rn(__fmul_rn(h.beta1, it.m[i]), __fmul_rn(h.one_minus_beta1, gi));
        float vi =
            __fadd_rn(__fmul_rn(h.beta2, it.v[i]), __fmul_rn(h.one_minus_beta2, __fmul_rn(gi, gi)));
        it.m[i] = mi;
        it.v[i] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bias2_sqrt), h.eps);
        float pi = hs_cu_ld_dt(it.p, it.pdt, i);
        hs_cu_st_dt(it.p, it.pdt, i,
                    __fsub_rn(__fmul_rn(pi, it.decay_factor),
                              __fmul_rn(h.step_size, __fdiv_rn(mi, denom))));
        /* the value p now holds, read back: a convert's bits */
        if (it.copy) hs_cu_st_dt(it.copy, it.copy_dt, i, hs_cu_ld_dt(it.p, it.pdt, i));
    }
}

extern "C" cudaError_t hs_cu_adamw_many(cudaStream_t st, hs_cu_adamw_item *items,
                                        hs_cu_adamw_item *host, int count,
                                        hs_cu_adamw_scalars h) {
    int64_t blocks = 0;
    for (int i = 0; i < count; i++) {
        host[i].first_block = (int)blocks;
        host[i].blocks = (int)hs_cu_blocks(host[i].n);
        blocks += host[i].blocks;
    }
    if (count <= 0) return cudaSuccess;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    cudaError_t err = cudaMemcpyAsync(items, host, (size_t)count * sizeof *host,
                                      cudaMemcpyHostToDevice, st);
    if (err != cudaSuccess) return err;
    adamw_many_kernel<<<(unsigned)blocks, HS_CU_THREADS, 0, st>>>(items, count, h);
    return cudaGetLastError();
}

/* g is read once before dir is written, so dir may be g. */
static __global__ void muon_momentum_kernel(float *dir, float *buf, const float *g, float mu,
                                            bool nesterov, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) {
        float gi = g[i];
        float b = __fadd_rn(__fmul_rn(mu, buf[i]), gi);
        buf[i] = b;
        dir[i] = nesterov ? __fadd_rn(gi, __fmul_rn(mu, b)) : b;
    }
}

extern "C" cudaError_t hs_cu_muon_momentum(cudaStream_t st, float *dir, float *buf, const float *g,
                                           float mu, bool nesterov, int64_t n) {
    if (n <= 0) return cudaSuccess;
    muon_momentum_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(dir, buf, g, mu, nesterov, n);
    return cudaGetLastError();
}

/* p * decay_factor rounded, then step * u subtracted: torch's mul_ then
 * add_(u, alpha=-step). */
template <int PDT>
static __global__ void muon_update_kernel(void *p, const float *u, float decay_factor, float step,
                                          int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st<PDT>(
            p, i, __fsub_rn(__fmul_rn(hs_cu_ld<PDT>(p, i), decay_factor), __fmul_rn(step, u[i])));
}

extern "C" cudaError_t hs_cu_muon_update(cudaStream_t st, void *p, int pdt, const float *u,
                                         float decay_factor, float step, int64_t n) {
    if (n <= 0) return cudaSuccess;
    return hs_cu_by_dtype(pdt, [&](auto d) {
        muon_update_kernel<decltype(d)::value>
            <<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(p, u, decay_factor, step, n);
        return cudaGetLastError();
    });
}
