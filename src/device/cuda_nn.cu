/* The cuda backend's model kernels: RMSNorm, RoPE, SwiGLU and softmax
 * cross-entropy (whole and vocab-parallel), with the semantics of
 * reference_nn.c: 16-bit values read as fp32, fp32 arithmetic, one
 * rounding per stored value, fp64 where the contract sums (RMSNorm's
 * statistics and dw, the exponential sums, the losses).
 *
 * Row kernels give one block to a row (RMSNorm's forward, the
 * cross-entropy rows), its threads striding over the columns (coalesced)
 * and meeting in a block reduction whose order depends on the block size
 * only, so each result is the same run after run. Sums handed to the host
 * are added in row order by one thread, as reference adds them. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda_dtype.cuh"
#include "cuda_nn_launch.h"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int64_t kMaxGrid = 1 << 20; /* row loops stride past it */

/* ------------------------------------------------------------ dtypes */

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }

/* fp32 -> T, round to nearest even, NaN kept (src/tensor's rule). */
template <typename T> __device__ __forceinline__ T cvt(float v);
template <> __device__ __forceinline__ float cvt<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 cvt<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half cvt<__half>(float v) { return __float2half_rn(v); }

template <typename T> struct tag {
    using type = T;
};

/* f(tag<T>{}) for the storage type of hs_dtype dt. */
template <typename F> cudaError_t with_type(int dt, F &&f) {
    switch (dt) {
    case 1: return f(tag<__nv_bfloat16>{});
    case 2: return f(tag<__half>{});
    default: return f(tag<float>{});
    }
}

/* -------------------------------------------------------- reductions */

/* Running softmax statistics of a set of logits: their max m and the sum
 * s of e^(l - m). */
struct MaxSum {
    float m;
    double s;
};

__device__ __forceinline__ float shfl_down(float v, int o) { return __shfl_down_sync(kFull, v, o); }
__device__ __forceinline__ double shfl_down(double v, int o) {
    return __shfl_down_sync(kFull, v, o);
}
__device__ __forceinline__ MaxSum shfl_down(MaxSum v, int o) {
    return {shfl_down(v.m, o), shfl_down(v.s, o)};
}

struct Sum {
    __device__ double operator()(double a, double b) const { return a + b; }
};

/* The larger; a NaN never enters (the loops compare with x > m). */
struct Max {
    __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

/* e^(from - to) in fp64; 0 for a set that saw no value. */
__device__ __forceinline__ double rescale(float from, float to) {
    return from == -INFINITY ? 0.0 : exp((double)from - (double)to);
}

struct Online {
    __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
        float m = b.m > a.m ? b.m : a.m;
        return {m, a.s * rescale(a.m, m) + b.s * rescale(b.m, m)};
    }
};

/* One logit into a thread's statistics: a new max rescales the sum (fp64,
 * rare), the others add their fp32 exponential. -inf adds nothing; NaN
 * makes the sum NaN, as it makes reference's. */
__device__ __forceinline__ void online_add(MaxSum &a, float x) {
    if (x > a.m) {
        a.s = a.s * rescale(a.m, x) + 1.0;
        a.m = x;
    } else if (x != -INFINITY) {
        a.s += (double)expf(x - a.m);
    }
}

/* Lane 0 ends with the warp's reduction. */
template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_down(v, o));
    return v;
}

/* The block's reduction, returned to every thread: warps in order, so the
 * result depends on blockDim (a multiple of 32) only. Every thread of the
 * block must call it. */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op) {
    __shared__ T part[32];
    v = warp_reduce(v, op);
    __syncthreads(); /* a previous call's readers are done with part */
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = part[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) r = op(r, part[i]);
    return r;
}

/* Threads for a row of `cols`: about eight columns each, 32 to 1024. */
int row_threads(int64_t cols) {
    int64_t t = ((cols + 7) / 8 + 31) / 32 * 32;
    return t < 32 ? 32 : t > 1024 ? 1024 : (int)t;
}

unsigned grid_for(int64_t blocks) { return (unsigned)(blocks < kMaxGrid ? blocks : kMaxGrid); }

/* ----------------------------------------------------------- rmsnorm */

/* rstd = 1/sqrt(mean(x^2) + eps): squares summed in fp64, the mean
 * rounded to fp32 (as cpu_rmsnorm.c); out = w * (x * rstd). */
template <typename XT, typename WT>
__global__ void __launch_bounds__(1024)
    rmsnorm_fwd_k(WT *out, float *rstd, const XT *x, const WT *w, int64_t N, int C, float eps) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const XT *xr = x + n * C;
        double ss = 0.0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float v = ld(xr[c]);
            ss += (double)v * v;
        }
        ss = block_reduce(ss, Sum());
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        if (threadIdx.x == 0) rstd[n] = r;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            out[n * C + c] = cvt<WT>(ld(w[c]) * (ld(xr[c]) * r));
    }
}

constexpr int kRows = HS_CUDA_RMSNORM_BWD_ROWS;
static_assert(kRows <= 32, "the first warp finishes the chunk's rows");

/* One chunk of kRows rows per block iteration. dx_i += r w_i dy_i - x_i k,
 * k = r^3 / C * sum_j(w_j dy_j x_j) (the row's dot in fp64); part[chunk]
 * gets the chunk's dw sums sum_n dy_i (x_i r) in fp64. The rows' dots are
 * reduced together: kRows values per thread, one block reduction. The
 * second pass reads the chunk again from cache. */
template <typename XT, typename WT>
__global__ void __launch_bounds__(256)
    rmsnorm_bwd_k(float *dx, double *part, const float *dout, const XT *x, const WT *w,
                  const float *rstd, int64_t N, int C) {
    __shared__ double dots[kRows][33];
    __shared__ float rs[kRows], ks[kRows];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int64_t chunks = (N + kRows - 1) / kRows;
    for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
        int64_t n0 = chunk * kRows;
        int nr = N - n0 < kRows ? (int)(N - n0) : kRows;
        double dot[kRows];
#pragma unroll
        for (int r = 0; r < kRows; r++) dot[r] = 0.0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float wv = ld(w[c]);
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                if (r < nr) {
                    int64_t o = (n0 + r) * C + c;
                    dot[r] += (double)wv * dout[o] * ld(x[o]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            double v = warp_reduce(dot[r], Sum());
            if (lane == 0) dots[r][warp] = v;
        }
        __syncthreads();
        if ((int)threadIdx.x < nr) {
            double d = dots[threadIdx.x][0];
            for (int i = 1; i < warps; i++) d += dots[threadIdx.x][i];
            float r = rstd[n0 + threadIdx.x];
            rs[threadIdx.x] = r;
            ks[threadIdx.x] = (float)(d * r * r * r / C);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float wv = ld(w[c]);
            double acc = 0.0;
            for (int r = 0; r < nr; r++) {
                int64_t o = (n0 + r) * C + c;
                float dy = dout[o], xv = ld(x[o]);
                dx[o] += rs[r] * wv * dy - ks[r] * xv;
                acc += (double)dy * (xv * rs[r]);
            }
            if (part) part[chunk * C + c] = acc;
        }
    }
}

/* dw[c] += the sum of part's rows at column c: a 32-column tile per block,
 * 16 row lanes each summing a stride of chunks, then the lanes in order. */
template <typename GT> __global__ void rmsnorm_dw_k(GT *dw, const double *part, int64_t chunks, int C) {
    __shared__ double lanes[16][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    double acc = 0.0;
    for (int64_t k = threadIdx.y; c < C && k < chunks; k += 16) acc += part[k * C + c];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double s = lanes[0][threadIdx.x];
        for (int i = 1; i < 16; i++) s += lanes[i][threadIdx.x];
        dw[c] = cvt<GT>(ld(dw[c]) + (float)s);
    }
}

/* -------------------------------------------------------------- rope */

/* One (b, t) row of H heads per block iteration; pair (i, i + HD/2) of
 * each head turns by the table's angle times sign. */
template <typename T>
__global__ void rope_k(T *x, const float *cos_t, const float *sin_t, float sign, int64_t rows,
                       int T_, int H, int HD) {
    int half = HD / 2, pairs = H * half;
    for (int64_t bt = blockIdx.x; bt < rows; bt += gridDim.x) {
        T *xr = x + bt * H * HD;
        int64_t t = bt % T_;
        const float *ct = cos_t + t * half, *st = sin_t + t * half;
        for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
            int h = j / half, i = j - h * half;
            int64_t a = (int64_t)h * HD + i;
            float x1 = ld(xr[a]), x2 = ld(xr[a + half]), c = ct[i], s = sign * st[i];
            xr[a] = cvt<T>(x1 * c - x2 * s);
            xr[a + half] = cvt<T>(x2 * c + x1 * s);
        }
    }
}

/* ------------------------------------------------------------ swiglu */

/* One element of each: silu(g) u; and, d silu(g)/dg = sig(g) (1 + g (1 -
 * sig(g))), the gate's and the up projection's gradients. */
__device__ __forceinline__ float swiglu_y(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ void swiglu_d(float g, float u, float dy, float *dg, float *du) {
    float sg = 1.0f / (1.0f + expf(-g));
    *dg = dy * u * sg * (1.0f + g * (1.0f - sg));
    *du = dy * g * sg;
}

/* The hs_cu_* dtype code of a storage type. */
template <typename T>
constexpr int dt_code = std::is_same<T, __nv_bfloat16>::value ? HS_CU_BF16
                        : std::is_same<T, __half>::value      ? HS_CU_F16
                                                              : HS_CU_F32;

/* The SwiGLU kernels take eight elements a thread through 16-byte loads
 * and stores (hs_cu_ld8 / hs_cu_st8) where every pointer is 16-byte
 * aligned (vec), the n % 8 tail and the unaligned case one by one; the
 * same arithmetic per element either way, and a 16-bit output rounded as
 * the element-wise family rounds (hs_cu_st: hs_convert's bits). */
template <bool V> __device__ __forceinline__ int64_t vec_groups(int64_t n) { return V ? n / 8 : 0; }

template <typename T, bool V>
__global__ void swiglu_fwd_k(T *out, const T *gate, const T *up, int64_t n) {
    constexpr int D = dt_code<T>;
    int64_t groups = vec_groups<V>(n);
    for (int64_t j = hs_cu_first(); j < groups; j += hs_cu_stride()) {
        float g[8], u[8], y[8];
        hs_cu_ld8<D>(gate, j, g);
        hs_cu_ld8<D>(up, j, u);
#pragma unroll
        for (int k = 0; k < 8; k++) y[k] = swiglu_y(g[k], u[k]);
        hs_cu_st8<D>(out, j, y);
    }
    for (int64_t i = groups * 8 + hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st<D>(out, i, swiglu_y(ld(gate[i]), ld(up[i])));
}

/* Group j's eight gate and up gradients from 16-byte loads. */
template <typename T>
__device__ __forceinline__ void swiglu_d8(const T *gate, const T *up, const float *dout, int64_t j,
                                          float *dg, float *du) {
    constexpr int D = dt_code<T>;
    float g[8], u[8], dy[8];
    hs_cu_ld8<D>(gate, j, g);
    hs_cu_ld8<D>(up, j, u);
    hs_cu_ld8<HS_CU_F32>(dout, j, dy);
#pragma unroll
    for (int k = 0; k < 8; k++) swiglu_d(g[k], u[k], dy[k], &dg[k], &du[k]);
}

/* dout may be dgate: each element is read before it is written. */
template <typename T, bool V>
__global__ void swiglu_bwd_k(float *dgate, float *dup, bool overwrite, const float *dout,
                             const T *gate, const T *up, int64_t n) {
    int64_t groups = vec_groups<V>(n);
    for (int64_t j = hs_cu_first(); j < groups; j += hs_cu_stride()) {
        float dg[8], du[8];
        swiglu_d8(gate, up, dout, j, dg, du);
        if (!overwrite) {
            float og[8], ou[8];
            hs_cu_ld8<HS_CU_F32>(dgate, j, og);
            hs_cu_ld8<HS_CU_F32>(dup, j, ou);
#pragma unroll
            for (int k = 0; k < 8; k++) dg[k] = og[k] + dg[k], du[k] = ou[k] + du[k];
        }
        hs_cu_st8<HS_CU_F32>(dgate, j, dg);
        hs_cu_st8<HS_CU_F32>(dup, j, du);
    }
    for (int64_t i = groups * 8 + hs_cu_first(); i < n; i += hs_cu_stride()) {
        float dg, du;
        swiglu_d(ld(gate[i]), ld(up[i]), dout[i], &dg, &du);
        if (overwrite) {
            dgate[i] = dg;
            dup[i] = du;
        } else {
            dgate[i] += dg;
            dup[i] += du;
        }
    }
}

/* The same values stored in D16. */
template <typename T, int D16, bool V>
__global__ void swiglu_bwd16_k(void *dgate16, void *dup16, const float *dout, const T *gate,
                               const T *up, int64_t n) {
    int64_t groups = vec_groups<V>(n);
    for (int64_t j = hs_cu_first(); j < groups; j += hs_cu_stride()) {
        float dg[8], du[8];
        swiglu_d8(gate, up, dout, j, dg, du);
        hs_cu_st8<D16>(dgate16, j, dg);
        hs_cu_st8<D16>(dup16, j, du);
    }
    for (int64_t i = groups * 8 + hs_cu_first(); i < n; i += hs_cu_stride()) {
        float dg, du;
        swiglu_d(ld(gate[i]), ld(up[i]), dout[i], &dg, &du);
        hs_cu_st<D16>(dgate16, i, dg);
        hs_cu_st<D16>(dup16, i, du);
    }
}

/* ------------------------------------------------------ cross-entropy */

/* One pass for the row's max and sum (online softmax), a second for the
 * gradient when wanted; dlogits may be logits (each element is read by the
 * thread that writes it, and the target logit before the reduction). */
__global__ void __launch_bounds__(1024)
    xent_rows_k(double *row_loss, float *dlogits, const float *logits, const int32_t *targets,
                int64_t N, int V, float scale) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *l = logits + n * V;
        float *d = dlogits ? dlogits + n * V : nullptr;
        int32_t tgt = targets[n];
        if (tgt < 0) {
            for (int i = threadIdx.x; d && i < V; i += blockDim.x) d[i] = 0.0f;
            continue;
        }
        float lt = threadIdx.x == 0 ? l[tgt] : 0.0f;
        MaxSum a = {-INFINITY, 0.0};
        for (int i = threadIdx.x; i < V; i += blockDim.x) online_add(a, l[i]);
        a = block_reduce(a, Online());
        if (threadIdx.x == 0) row_loss[n] = (double)a.m + log(a.s) - (double)lt;
        if (!d) continue;
        float k = (float)(scale / a.s);
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float p = expf(l[i] - a.m) * k;
            d[i] = i == tgt ? p - scale : p;
        }
    }
}

/* Reference's row_max: NaN only when the first logit is NaN. */
__global__ void __launch_bounds__(1024)
    xent_shard_max_k(float *row_max, const float *logits, int64_t N, int V) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *l = logits + n * V;
        float m = -INFINITY;
        for (int i = threadIdx.x; i < V; i += blockDim.x) m = l[i] > m ? l[i] : m;
        m = block_reduce(m, Max());
        if (threadIdx.x == 0) row_max[n] = l[0] != l[0] ? l[0] : m;
    }
}

__global__ void __launch_bounds__(1024)
    xent_shard_sums_k(float *row_sumexp, float *row_target, const float *logits,
                      const float *gmax, const int32_t *targets, int64_t N, int V, int64_t v0) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *l = logits + n * V;
        float g = gmax[n];
        double s = 0.0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) s += (double)expf(l[i] - g);
        s = block_reduce(s, Sum());
        if (threadIdx.x == 0) {
            int64_t t = (int64_t)targets[n] - v0;
            row_sumexp[n] = (float)s;
            row_target[n] = targets[n] >= 0 && t >= 0 && t < V ? l[t] : 0.0f;
        }
    }
}

__global__ void xent_shard_grad_k(float *logits, const float *gmax, const float *row_sumexp,
                                  const int32_t *targets, int64_t N, int V, int64_t v0,
                                  float scale) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        float *l = logits + n * V;
        if (targets[n] < 0) {
            for (int i = threadIdx.x; i < V; i += blockDim.x) l[i] = 0.0f;
            continue;
        }
        int64_t t = (int64_t)targets[n] - v0;
        float g = gmax[n], k = (float)(scale / (double)row_sumexp[n]);
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float p = expf(l[i] - g) * k;
            l[i] = i == t ? p - scale : p;
        }
    }
}

/* The row terms of the two losses. */
struct RowLoss {
    const double *row;
    __device__ double operator()(int64_t i) const { return row[i]; }
};

struct ShardLoss {
    const float *gmax, *sumexp, *target;
    __device__ double operator()(int64_t i) const {
        return (double)gmax[i] + log((double)sumexp[i]) - (double)target[i];
    }
};

constexpr int kSumThreads = 256;

/* One block: the terms of kSumThreads rows at a time computed in
 * parallel, then added by thread 0 in row order (fp64, as reference). */
template <typename Term>
__global__ void __launch_bounds__(kSumThreads)
    ordered_sum_k(hs_cuda_loss_total *out, Term term, const int32_t *targets, int64_t N) {
    __shared__ double terms[kSumThreads];
    __shared__ bool used[kSumThreads];
    double total = 0.0;
    int64_t valid = 0;
    for (int64_t base = 0; base < N; base += kSumThreads) {
        int64_t i = base + threadIdx.x;
        bool u = i < N && targets[i] >= 0;
        terms[threadIdx.x] = u ? term(i) : 0.0;
        used[threadIdx.x] = u;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int j = 0; j < kSumThreads; j++)
                if (used[j]) total += terms[j], valid++;
        __syncthreads();
    }
    if (threadIdx.x == 0) out->loss = total, out->valid = valid;
}

} // namespace

/* ---------------------------------------------------------- launchers */

extern "C" cudaError_t hs_cuda_launch_rmsnorm_fwd(cudaStream_t st, void *out, float *rstd,
                                                  const void *x, int xdt, const void *w, int dt,
                                                  int64_t N, int C, float eps) {
    if (N == 0) return cudaSuccess;
    return with_type(xdt, [&](auto xt) {
        return with_type(dt, [&](auto wt) {
            using XT = typename decltype(xt)::type;
            using WT = typename decltype(wt)::type;
            rmsnorm_fwd_k<XT, WT><<<grid_for(N), row_threads(C), 0, st>>>(
                (WT *)out, rstd, (const XT *)x, (const WT *)w, N, C, eps);
            return cudaGetLastError();
        });
    });
}

extern "C" cudaError_t hs_cuda_launch_rmsnorm_bwd(cudaStream_t st, float *dx, double *part,
                                                  const float *dout, const void *x, int xdt,
                                                  const void *w, const float *rstd, int dt,
                                                  int64_t N, int C) {
    if (N == 0 || C == 0) return cudaSuccess;
    int threads = row_threads(C) < 256 ? row_threads(C) : 256;
    return with_type(xdt, [&](auto xt) {
        return with_type(dt, [&](auto wt) {
            using XT = typename decltype(xt)::type;
            using WT = typename decltype(wt)::type;
            rmsnorm_bwd_k<XT, WT><<<grid_for(hs_cuda_rmsnorm_bwd_chunks(N)), threads, 0, st>>>(
                dx, part, dout, (const XT *)x, (const WT *)w, rstd, N, C);
            return cudaGetLastError();
        });
    });
}

extern "C" cudaError_t hs_cuda_launch_rmsnorm_dw(cudaStream_t st, void *dw, int gdt,
                                                 const double *part, int64_t N, int C) {
    if (N == 0 || C == 0) return cudaSuccess;
    return with_type(gdt, [&](auto gt) {
        using GT = typename decltype(gt)::type;
        rmsnorm_dw_k<GT><<<(unsigned)((C + 31) / 32), dim3(32, 16), 0, st>>>(
            (GT *)dw, part, hs_cuda_rmsnorm_bwd_chunks(N), C);
        return cudaGetLastError();
    });
}

extern "C" cudaError_t hs_cuda_launch_rope(cudaStream_t st, void *x, int dt, const float *cos_t,
                                           const float *sin_t, float sign, int B, int T, int H,
                                           int HD) {
    int64_t rows = (int64_t)B * T, pairs = (int64_t)H * (HD / 2);
    if (rows == 0 || pairs == 0) return cudaSuccess;
    int threads = (int)((pairs + 31) / 32 * 32 < 256 ? (pairs + 31) / 32 * 32 : 256);
    return with_type(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        rope_k<TT><<<grid_for(rows), threads, 0, st>>>((TT *)x, cos_t, sin_t, sign, rows, T, H,
                                                        HD);
        return cudaGetLastError();
    });
}

constexpr int kElemThreads = 256;

static unsigned elem_blocks(int64_t n) { return grid_for((n + kElemThreads - 1) / kElemThreads); }

/* Blocks for n elements, eight a thread where vec. */
static unsigned swiglu_blocks(int64_t n, bool vec) { return elem_blocks(vec ? (n + 7) / 8 : n); }

static bool aligned(const void *a, const void *b, const void *c, const void *d) {
    return hs_cu_aligned16(a, b) && hs_cu_aligned16(c, d);
}

extern "C" cudaError_t hs_cuda_launch_swiglu_fwd(cudaStream_t st, void *out, const void *gate,
                                                 const void *up, int dt, int64_t n) {
    if (n == 0) return cudaSuccess;
    bool vec = aligned(out, gate, up, up);
    return with_type(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (vec)
            swiglu_fwd_k<TT, true><<<swiglu_blocks(n, true), kElemThreads, 0, st>>>(
                (TT *)out, (const TT *)gate, (const TT *)up, n);
        else
            swiglu_fwd_k<TT, false><<<swiglu_blocks(n, false), kElemThreads, 0, st>>>(
                (TT *)out, (const TT *)gate, (const TT *)up, n);
        return cudaGetLastError();
    });
}

extern "C" cudaError_t hs_cuda_launch_swiglu_bwd(cudaStream_t st, float *dgate, float *dup,
                                                 bool overwrite, const float *dout,
                                                 const void *gate, const void *up, int dt,
                                                 int64_t n) {
    if (n == 0) return cudaSuccess;
    bool vec = aligned(dgate, dup, dout, gate) && hs_cu_aligned16(up, up);
    return with_type(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (vec)
            swiglu_bwd_k<TT, true><<<swiglu_blocks(n, true), kElemThreads, 0, st>>>(
                dgate, dup, overwrite, dout, (const TT *)gate, (const TT *)up, n);
        else
            swiglu_bwd_k<TT, false><<<swiglu_blocks(n, false), kElemThreads, 0, st>>>(
                dgate, dup, overwrite, dout, (const TT *)gate, (const TT *)up, n);
        return cudaGetLastError();
    });
}

template <typename T, int D16>
static cudaError_t swiglu_bwd16(cudaStream_t st, void *dgate16, void *dup16, const float *dout,
                                const void *gate, const void *up, int64_t n) {
    if (aligned(dgate16, dup16, dout, gate) && hs_cu_aligned16(up, up))
        swiglu_bwd16_k<T, D16, true><<<swiglu_blocks(n, true), kElemThreads, 0, st>>>(
            dgate16, dup16, dout, (const T *)gate, (const T *)up, n);
    else
        swiglu_bwd16_k<T, D16, false><<<swiglu_blocks(n, false), kElemThreads, 0, st>>>(
            dgate16, dup16, dout, (const T *)gate, (const T *)up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_swiglu_bwd16(cudaStream_t st, void *dgate16, void *dup16,
                                                   const float *dout, const void *gate,
                                                   const void *up, int dt, int64_t n) {
    if (n == 0) return cudaSuccess;
    if (dt == 2) return swiglu_bwd16<__half, HS_CU_F16>(st, dgate16, dup16, dout, gate, up, n);
    return swiglu_bwd16<__nv_bfloat16, HS_CU_BF16>(st, dgate16, dup16, dout, gate, up, n);
}

extern "C" cudaError_t hs_cuda_launch_xent(cudaStream_t st, hs_cuda_loss_total *total,
                                           double *row_loss, float *dlogits, const float *logits,
                                           const int32_t *targets, int64_t N, int V, float scale) {
    if (N > 0)
        xent_rows_k<<<grid_for(N), row_threads(V), 0, st>>>(row_loss, dlogits, logits, targets, N,
                                                             V, scale);
    ordered_sum_k<<<1, kSumThreads, 0, st>>>(total, RowLoss{row_loss}, targets, N);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_xent_shard_max(cudaStream_t st, float *row_max,
                                                     const float *logits, int64_t N, int V) {
    if (N == 0 || V == 0) return cudaSuccess;
    xent_shard_max_k<<<grid_for(N), row_threads(V), 0, st>>>(row_max, logits, N, V);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_xent_shard_sums(cudaStream_t st, float *row_sumexp,
                                                      float *row_target, const float *logits,
                                                      const float *gmax, const int32_t *targets,
                                                      int64_t N, int V, int64_t v0) {
    if (N == 0) return cudaSuccess;
    xent_shard_sums_k<<<grid_for(N), row_threads(V), 0, st>>>(row_sumexp, row_target, logits,
                                                               gmax, targets, N, V, v0);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_xent_shard_grad(cudaStream_t st, float *logits,
                                                      const float *gmax, const float *row_sumexp,
                                                      const int32_t *targets, int64_t N, int V,
                                                      int64_t v0, float scale) {
    if (N == 0 || V == 0) return cudaSuccess;
    xent_shard_grad_k<<<grid_for(N), row_threads(V), 0, st>>>(logits, gmax, row_sumexp, targets,
                                                               N, V, v0, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_xent_shard_loss(cudaStream_t st, hs_cuda_loss_total *total,
                                                      const float *gmax, const float *row_sumexp,
                                                      const float *row_target,
                                                      const int32_t *targets, int64_t N) {
    ordered_sum_k<<<1, kSumThreads, 0, st>>>(total, ShardLoss{gmax, row_sumexp, row_target},
                                             targets, N);
    return cudaGetLastError();
}
