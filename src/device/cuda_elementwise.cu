/* The cuda backend's element-wise kernels: dtype casts, fills, Philox
 * normal draws, fp32 arithmetic, the fp64 sum of squares, the 2-D copy and
 * the block quantization of FSDP's compressed all-gather.
 *
 * Each fp32 operation is one IEEE operation as the C code writes it:
 * __fmul_rn / __fadd_rn keep nvcc from fusing a multiply and an add into
 * an FMA, which the C build (ISO mode, no contraction) does not do either,
 * so these kernels give the cpu backend's bits. Grid-stride loops with
 * int64 indices, so n may pass 2^31. */
#include "device/cuda_dtype.cuh"
#include "device/cuda_elementwise_launch.h"

/* ------------------------------------------------------------------ casts */

template <int S, int D>
static __global__ void convert_kernel(void *dst, const void *src, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st<D>(dst, i, hs_cu_ld<S>(src, i));
}

/* The same with 16-byte loads and stores: eight elements a thread, then
 * the last n % 8 one by one (both pointers 16-byte aligned). */
template <int S, int D>
static __global__ void convert8_kernel(void *dst, const void *src, int64_t n) {
    int64_t groups = n / 8;
    for (int64_t j = hs_cu_first(); j < groups; j += hs_cu_stride()) {
        float v[8];
        hs_cu_ld8<S>(src, j, v);
        hs_cu_st8<D>(dst, j, v);
    }
    for (int64_t i = groups * 8 + hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st<D>(dst, i, hs_cu_ld<S>(src, i));
}

extern "C" cudaError_t hs_cu_convert(cudaStream_t st, void *dst, int dst_dt, const void *src,
                                     int src_dt, int64_t n) {
    if (n <= 0 || (dst_dt == src_dt && dst == src)) return cudaSuccess;
    if (dst_dt == src_dt) {
        size_t bytes = (size_t)n * (dst_dt == HS_CU_F32 ? 4u : 2u);
        return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
    }
    bool vec = hs_cu_aligned16(dst, src) && n >= 8;
    return hs_cu_by_dtype(src_dt, [&](auto s) {
        return hs_cu_by_dtype(dst_dt, [&](auto d) {
            if (vec)
                convert8_kernel<decltype(s)::value, decltype(d)::value>
                    <<<hs_cu_blocks(n / 8), HS_CU_THREADS, 0, st>>>(dst, src, n);
            else
                convert_kernel<decltype(s)::value, decltype(d)::value>
                    <<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(dst, src, n);
            return cudaGetLastError();
        });
    });
}

/* Rows of a strided matrix: blockIdx.y (striding by gridDim.y) walks the
 * rows, x the columns, so no element pays a division. */
template <int S, int D>
static __global__ void convert_2d_kernel(void *dst, int64_t dld, const void *src, int64_t sld,
                                         int64_t M, int64_t N) {
    for (int64_t r = blockIdx.y; r < M; r += gridDim.y)
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < N;
             c += (int64_t)gridDim.x * blockDim.x)
            hs_cu_st<D>(dst, r * dld + c, hs_cu_ld<S>(src, r * sld + c));
}

extern "C" cudaError_t hs_cu_convert_2d(cudaStream_t st, void *dst, int dst_dt, int64_t dld,
                                        const void *src, int src_dt, int64_t sld, int64_t M,
                                        int64_t N) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (dld == N && sld == N) return hs_cu_convert(st, dst, dst_dt, src, src_dt, M * N);
    unsigned bx = hs_cu_blocks(N), by = (unsigned)(M < 65535 ? M : 65535);
    return hs_cu_by_dtype(src_dt, [&](auto s) {
        return hs_cu_by_dtype(dst_dt, [&](auto d) {
            convert_2d_kernel<decltype(s)::value, decltype(d)::value>
                <<<dim3(bx, by), HS_CU_THREADS, 0, st>>>(dst, dld, src, sld, M, N);
            return cudaGetLastError();
        });
    });
}

template <int S>
static __global__ void convert_scaled_kernel(float *dst, const void *src, float a, bool scale,
                                             int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) {
        float v = hs_cu_ld<S>(src, i);
        dst[i] = scale ? __fmul_rn(v, a) : v;
    }
}

extern "C" cudaError_t hs_cu_convert_scaled(cudaStream_t st, float *dst, const void *src,
                                            int src_dt, float a, int64_t n) {
    if (n <= 0) return cudaSuccess;
    return hs_cu_by_dtype(src_dt, [&](auto s) {
        convert_scaled_kernel<decltype(s)::value>
            <<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(dst, src, a, a != 1.0f, n);
        return cudaGetLastError();
    });
}

/* x := (float)(DT)x; the caller skips fp32, for which it is the identity. */
template <int DT> static __global__ void round_kernel(float *x, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) x[i] = hs_cu_round<DT>(x[i]);
}

extern "C" cudaError_t hs_cu_round(cudaStream_t st, float *x, int dt, int64_t n) {
    if (n <= 0 || dt == HS_CU_F32) return cudaSuccess;
    return hs_cu_by_dtype(dt, [&](auto d) {
        round_kernel<decltype(d)::value><<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(x, n);
        return cudaGetLastError();
    });
}

/* Each element is read before it is written, so out may be a or b. */
static __global__ void add_cast_kernel(void *out, int odt, const void *a, int adt, const void *b,
                                       int bdt, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st_dt(out, odt, i, __fadd_rn(hs_cu_ld_dt(a, adt, i), hs_cu_ld_dt(b, bdt, i)));
}

extern "C" cudaError_t hs_cu_add_cast(cudaStream_t st, void *out, int odt, const void *a, int adt,
                                      const void *b, int bdt, int64_t n) {
    if (n <= 0) return cudaSuccess;
    add_cast_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(out, odt, a, adt, b, bdt, n);
    return cudaGetLastError();
}

template <int DT> static __global__ void scale_cast_kernel(void *x, float a, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride())
        hs_cu_st<DT>(x, i, __fmul_rn(hs_cu_ld<DT>(x, i), a));
}

extern "C" cudaError_t hs_cu_scale_cast(cudaStream_t st, void *x, int dt, float a, int64_t n) {
    if (n <= 0) return cudaSuccess;
    return hs_cu_by_dtype(dt, [&](auto d) {
        scale_cast_kernel<decltype(d)::value><<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(x, a, n);
        return cudaGetLastError();
    });
}

/* ---------------------------------------------------------------- fp32 */

static __global__ void fill_kernel(float *x, float v, int64_t n) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) x[i] = v;
}

extern "C" cudaError_t hs_cu_fill(cudaStream_t st, float *x, float v, int64_t n) {
    if (n <= 0) return cudaSuccess;
    fill_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(x, v, n);
    return cudaGetLastError();
}

/* y[i] = op(y[i], x[i]) over fp32 (x may be y). Where both pointers are
 * 16-byte aligned a thread takes four elements through one 16-byte load of
 * each and one store, the n % 4 tail one by one: the same operation per
 * element either way. */
template <typename Op> static __global__ void fp32_kernel(float *y, const float *x, int64_t n, Op op) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) y[i] = op(y[i], x[i]);
}

template <typename Op>
static __global__ void fp32x4_kernel(float *y, const float *x, int64_t n, Op op) {
    int64_t quads = n / 4;
    for (int64_t j = hs_cu_first(); j < quads; j += hs_cu_stride()) {
        float4 a = ((const float4 *)y)[j], b = ((const float4 *)x)[j];
        ((float4 *)y)[j] = make_float4(op(a.x, b.x), op(a.y, b.y), op(a.z, b.z), op(a.w, b.w));
    }
    for (int64_t i = quads * 4 + hs_cu_first(); i < n; i += hs_cu_stride()) y[i] = op(y[i], x[i]);
}

template <typename Op>
static cudaError_t fp32_launch(cudaStream_t st, float *y, const float *x, int64_t n, Op op) {
    if (n <= 0) return cudaSuccess;
    if (hs_cu_aligned16(y, x))
        fp32x4_kernel<<<hs_cu_blocks((n + 3) / 4), HS_CU_THREADS, 0, st>>>(y, x, n, op);
    else
        fp32_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(y, x, n, op);
    return cudaGetLastError();
}

struct axpy_op {
    float a;
    __device__ float operator()(float y, float x) const { return __fadd_rn(y, __fmul_rn(a, x)); }
};
struct scale_op { /* x is y */
    float a;
    __device__ float operator()(float y, float) const { return __fmul_rn(y, a); }
};
struct add_op {
    __device__ float operator()(float y, float x) const { return __fadd_rn(y, x); }
};
/* 0 + x: an IEEE add (never folded away), so -0 becomes +0. */
struct add_to_zero_op {
    __device__ float operator()(float, float x) const { return __fadd_rn(0.0f, x); }
};

extern "C" cudaError_t hs_cu_axpy(cudaStream_t st, float *y, const float *x, float a, int64_t n) {
    return fp32_launch(st, y, x, n, axpy_op{a});
}

extern "C" cudaError_t hs_cu_scale(cudaStream_t st, float *x, float a, int64_t n) {
    return fp32_launch(st, x, x, n, scale_op{a});
}

extern "C" cudaError_t hs_cu_add(cudaStream_t st, float *y, const float *x, int64_t n) {
    return fp32_launch(st, y, x, n, add_op{});
}

extern "C" cudaError_t hs_cu_add_to_zero(cudaStream_t st, float *y, const float *x, int64_t n) {
    return fp32_launch(st, y, x, n, add_to_zero_op{});
}

/* ---------------------------------------------------------- normal draws */

/* Philox4x32-10 as base/rng.c's hs_philox4x32: the element index and the
 * stream id form the counter, the seed is the key. Only the first two
 * words are drawn on. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static __device__ __forceinline__ void philox_first2(uint64_t seed, uint64_t stream,
                                                     uint64_t counter, uint32_t *r0, uint32_t *r1) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        uint32_t hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    *r0 = c0, *r1 = c1;
}

/* hs_rng_normal's Box-Muller in double, rounded to float; then
 * hs_rng_fill_normal's fp32 mean + std * z. CUDA's double log and cos are
 * within 2 ulp of glibc's, so a draw may differ from the host's in the
 * last bit of the float where the double lands next to a rounding point. */
static __global__ void rng_normal_kernel(float *x, int64_t n, uint64_t seed, uint64_t stream,
                                         int64_t offset, float mean, float stdev) {
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) {
        uint32_t r0, r1;
        philox_first2(seed, stream, (uint64_t)(offset + i), &r0, &r1);
        double u1 = ((double)(r0 >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(r1 >> 8) / 16777216.0;
        float z = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        x[i] = __fadd_rn(mean, __fmul_rn(stdev, z));
    }
}

extern "C" cudaError_t hs_cu_rng_normal(cudaStream_t st, float *x, int64_t n, uint64_t seed,
                                        uint64_t stream, int64_t offset, float mean, float stdev) {
    if (n <= 0) return cudaSuccess;
    rng_normal_kernel<<<hs_cu_blocks(n), HS_CU_THREADS, 0, st>>>(x, n, seed, stream, offset, mean,
                                                                 stdev);
    return cudaGetLastError();
}

/* ------------------------------------------------------- sum of squares */

/* Partial sums of a fixed number of blocks (from n alone), then one block
 * over them in a fixed order: the same n gives the same bits every run. */
#define SUMSQ_PER_THREAD 8
#define SUMSQ_MAX_BLOCKS 1024

static int sumsq_blocks(int64_t n) {
    int64_t b = (n + HS_CU_THREADS * SUMSQ_PER_THREAD - 1) / (HS_CU_THREADS * SUMSQ_PER_THREAD);
    return (int)(b < 1 ? 1 : b > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : b);
}

/* The block's sum of v, in thread 0 (blockDim.x == HS_CU_THREADS). */
static __device__ double block_sum(double v) {
    __shared__ double warp_sums[HS_CU_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < HS_CU_THREADS / 32 ? warp_sums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    }
    return v;
}

static __global__ void sumsq_partial_kernel(double *part, const float *x, int64_t n) {
    double acc = 0.0;
    for (int64_t i = hs_cu_first(); i < n; i += hs_cu_stride()) {
        double v = x[i];
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

static __global__ void sumsq_final_kernel(double *out, const double *part, int parts) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += part[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}

extern "C" size_t hs_cu_sumsq_scratch(int64_t n) {
    return (size_t)(1 + sumsq_blocks(n)) * sizeof(double);
}

extern "C" cudaError_t hs_cu_sumsq(cudaStream_t st, double *scratch, const float *x, int64_t n) {
    int blocks = sumsq_blocks(n);
    sumsq_partial_kernel<<<blocks, HS_CU_THREADS, 0, st>>>(scratch + 1, x, n < 0 ? 0 : n);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    sumsq_final_kernel<<<1, HS_CU_THREADS, 0, st>>>(scratch, scratch + 1, blocks);
    return cudaGetLastError();
}

/* Many tensors at once: a descriptor per tensor, its blocks numbered on
 * from the tensors before it. */
struct sumsq_item {
    const float *x;
    int64_t n;
    int first_block, blocks;
};

/* Block b of the grid is block b - first_block of the tensor whose range
 * holds it, striding as sumsq_partial_kernel does over that tensor. */
static __global__ void sumsq_many_partial_kernel(double *part, const sumsq_item *items,
                                                 int count) {
    int b = (int)blockIdx.x;
    sumsq_item it = hs_cu_item_of(items, count, b);
    double acc = 0.0;
    int64_t stride = (int64_t)it.blocks * blockDim.x;
    for (int64_t i = (int64_t)(b - it.first_block) * blockDim.x + threadIdx.x; i < it.n;
         i += stride) {
        double v = it.x[i];
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[b] = acc;
}

/* One block per tensor: sumsq_final_kernel over that tensor's partials. */
static __global__ void sumsq_many_final_kernel(double *sums, const double *part,
                                               const sumsq_item *items) {
    sumsq_item it = items[blockIdx.x];
    double acc = 0.0;
    for (int i = threadIdx.x; i < it.blocks; i += blockDim.x) acc += part[it.first_block + i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) sums[blockIdx.x] = acc;
}

static int64_t sumsq_many_blocks(const int64_t *n, int count) {
    int64_t blocks = 0;
    for (int i = 0; i < count; i++) blocks += sumsq_blocks(n[i] < 0 ? 0 : n[i]);
    return blocks;
}

extern "C" size_t hs_cu_sumsq_many_scratch(const int64_t *n, int count) {
    return (size_t)count * sizeof(sumsq_item) + (size_t)sumsq_many_blocks(n, count) * sizeof(double);
}

extern "C" cudaError_t hs_cu_sumsq_many(cudaStream_t st, double *sums, void *scratch, void *host,
                                        const float *const *x, const int64_t *n, int count) {
    if (count <= 0) return cudaSuccess;
    int64_t blocks = sumsq_many_blocks(n, count);
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    sumsq_item *items = (sumsq_item *)host;
    int first = 0;
    for (int i = 0; i < count; i++) {
        int64_t m = n[i] < 0 ? 0 : n[i];
        items[i] = sumsq_item{x[i], m, first, sumsq_blocks(m)};
        first += items[i].blocks;
    }
    sumsq_item *dev_items = (sumsq_item *)scratch;
    double *part = (double *)((char *)scratch + (size_t)count * sizeof(sumsq_item));
    cudaError_t err = cudaMemcpyAsync(dev_items, items, (size_t)count * sizeof(sumsq_item),
                                      cudaMemcpyHostToDevice, st);
    if (err != cudaSuccess) return err;
    sumsq_many_partial_kernel<<<(unsigned)blocks, HS_CU_THREADS, 0, st>>>(part, dev_items, count);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    sumsq_many_final_kernel<<<(unsigned)count, HS_CU_THREADS, 0, st>>>(sums, part, dev_items);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- 2-D copy */

/* The pitch a 2-D copy takes (cudaDeviceProp::memPitch on current GPUs);
 * rows further apart go one copy each. */
#define COPY_MAX_PITCH ((size_t)INT32_MAX)

extern "C" cudaError_t hs_cu_copy_2d(cudaStream_t st, void *dst, size_t dst_stride, const void *src,
                                     size_t src_stride, int64_t rows, size_t row_bytes) {
    if (rows <= 0 || row_bytes == 0) return cudaSuccess;
    if (rows == 1 || (dst_stride == row_bytes && src_stride == row_bytes))
        return cudaMemcpyAsync(dst, src, (size_t)rows * row_bytes, cudaMemcpyDefault, st);
    if (dst_stride <= COPY_MAX_PITCH && src_stride <= COPY_MAX_PITCH)
        return cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, row_bytes, (size_t)rows,
                                 cudaMemcpyDefault, st);
    cudaError_t err = cudaSuccess;
    for (int64_t r = 0; r < rows && err == cudaSuccess; r++)
        err = cudaMemcpyAsync((char *)dst + (size_t)r * dst_stride,
                              (const char *)src + (size_t)r * src_stride, row_bytes,
                              cudaMemcpyDefault, st);
    return err;
}

/* ------------------------------------------------- block quantization */

/* The tensor layer's hs_f32_to_e4m3 / hs_e4m3_to_f32, step for step. */
__device__ __forceinline__ uint8_t cu_f32_to_e4m3(float x) {
    uint32_t u = __float_as_uint(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    float a = fabsf(x);
    if (isnan(x)) return (uint8_t)(sign | 0x7Fu);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7Eu);
    if (a < 0x1p-6f) return (uint8_t)(sign | (uint8_t)rintf(__fmul_rn(a, 0x1p9f)));
    u = __float_as_uint(a);
    u += 0x7FFFFu + ((u >> 20) & 1u);
    uint32_t e = (u >> 23) - 127u + 7u, m = (u >> 20) & 7u;
    if (e > 15u || (e == 15u && m == 7u)) return (uint8_t)(sign | 0x7Eu);
    return (uint8_t)(sign | (e << 3) | m);
}

__device__ __forceinline__ float cu_e4m3_to_f32(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    float v = e == 15 && m == 7 ? __int_as_float(0x7FC00000)
              : e == 0          ? ldexpf((float)m, -9)
                                : ldexpf((float)(8 + m), e - 10);
    return c & 0x80u ? -v : v;
}

__host__ __device__ static inline int64_t quant_codes_bytes(int64_t n, int fmt) {
    int64_t b = fmt == HS_CU_QUANT_INT4 ? (n + 1) / 2 : n;
    return (b + 3) / 4 * 4;
}

/* int4: round-half-even(y) in [-7, 7] as a nibble, and a nibble's value */
__device__ __forceinline__ uint32_t cu_int4_code(float y) {
    return (uint32_t)(int32_t)fminf(fmaxf(rintf(y), -7.0f), 7.0f) & 0xFu;
}

/* Code i's value (times nothing: the scale is the caller's). */
__device__ __forceinline__ float cu_code_value(const uint8_t *q, int64_t i, int fmt) {
    if (fmt == HS_CU_QUANT_INT8) return (float)(int8_t)q[i];
    if (fmt == HS_CU_QUANT_INT4) {
        uint32_t nib = i & 1 ? q[i >> 1] >> 4 : q[i >> 1] & 0xFu;
        return (float)((int8_t)(uint8_t)(nib << 4) >> 4);
    }
    return cu_e4m3_to_f32(q[i]);
}

/* One thread block per quantization block (grid-stride over them): the
 * block's |max| by a shared-memory tree (max is exact in any order), then
 * each thread its values' codes (int4: a byte, two values, each). */
template <int DT>
static __global__ void quantize_kernel(uint8_t *q, float *scales, const void *src, int64_t n,
                                       int64_t block, int fmt) {
    __shared__ float amax_part[HS_CU_THREADS];
    __shared__ int bad_part[HS_CU_THREADS];
    const float top = fmt == HS_CU_QUANT_INT8 ? 127.0f : fmt == HS_CU_QUANT_INT4 ? 7.0f : 448.0f;
    int64_t blocks = (n + block - 1) / block;
    for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0.0f;
        int bad = 0;
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float a = fabsf(hs_cu_ld<DT>(src, i));
            bad |= !isfinite(a);
            amax = a > amax ? a : amax;
        }
        amax_part[threadIdx.x] = amax;
        bad_part[threadIdx.x] = bad;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w) {
                float o = amax_part[threadIdx.x + w];
                amax_part[threadIdx.x] = o > amax_part[threadIdx.x] ? o : amax_part[threadIdx.x];
                bad_part[threadIdx.x] |= bad_part[threadIdx.x + w];
            }
            __syncthreads();
        }
        float s = bad_part[0] ? __int_as_float(0x7FC00000) : __fdiv_rn(amax_part[0], top);
        if (threadIdx.x == 0) scales[b] = s;
        if (fmt == HS_CU_QUANT_INT4) { /* lo is even: a byte is this block's */
            for (int64_t k = lo / 2 + threadIdx.x; k < (hi + 1) / 2; k += blockDim.x) {
                uint32_t c = 0;
                for (int h = 0; h < 2 && 2 * k + h < hi; h++)
                    if (s > 0.0f) c |= cu_int4_code(__fdiv_rn(hs_cu_ld<DT>(src, 2 * k + h), s))
                                       << (4 * h);
                q[k] = (uint8_t)c;
            }
        } else {
            for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
                float y = s > 0.0f ? __fdiv_rn(hs_cu_ld<DT>(src, i), s) : 0.0f;
                if (fmt == HS_CU_QUANT_INT8) {
                    float r = fminf(fmaxf(rintf(y), -127.0f), 127.0f);
                    q[i] = (uint8_t)(int8_t)r;
                } else {
                    q[i] = cu_f32_to_e4m3(y);
                }
            }
        }
        __syncthreads(); /* the shared parts are the next block's */
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (int64_t i = fmt == HS_CU_QUANT_INT4 ? (n + 1) / 2 : n; i < quant_codes_bytes(n, fmt);
             i++)
            q[i] = 0;
}

extern "C" cudaError_t hs_cu_quantize(cudaStream_t st, void *packed, const void *src, int src_dt,
                                      int64_t n, int64_t block, int fmt) {
    if (n <= 0) return cudaSuccess;
    int64_t blocks = (n + block - 1) / block;
    unsigned grid = (unsigned)(blocks < HS_CU_MAX_BLOCKS ? blocks : HS_CU_MAX_BLOCKS);
    uint8_t *q = (uint8_t *)packed;
    float *scales = (float *)(q + quant_codes_bytes(n, fmt));
    return hs_cu_by_dtype(src_dt, [&](auto d) {
        quantize_kernel<decltype(d)::value>
            <<<grid, HS_CU_THREADS, 0, st>>>(q, scales, src, n, block, fmt);
        return cudaGetLastError();
    });
}

template <int DT>
static __global__ void dequantize_kernel(void *dst, const uint8_t *q, const float *scales,
                                         int64_t first, int64_t count, int64_t block, int fmt) {
    for (int64_t i = hs_cu_first(); i < count; i += hs_cu_stride()) {
        int64_t at = first + i;
        hs_cu_st<DT>(dst, i, __fmul_rn(cu_code_value(q, at, fmt), scales[at / block]));
    }
}

extern "C" cudaError_t hs_cu_dequantize(cudaStream_t st, void *dst, int dst_dt, const void *packed,
                                        int64_t n, int64_t first, int64_t count, int64_t block,
                                        int fmt) {
    if (count <= 0) return cudaSuccess;
    const uint8_t *q = (const uint8_t *)packed;
    const float *scales = (const float *)(q + quant_codes_bytes(n, fmt));
    return hs_cu_by_dtype(dst_dt, [&](auto d) {
        dequantize_kernel<decltype(d)::value>
            <<<hs_cu_blocks(count), HS_CU_THREADS, 0, st>>>(dst, q, scales, first, count, block,
                                                           fmt);
        return cudaGetLastError();
    });
}

static __global__ void dequantize_add_kernel(float *dst, const uint8_t *q, const float *scales,
                                             int64_t first, int64_t count, int64_t block,
                                             int fmt) {
    for (int64_t i = hs_cu_first(); i < count; i += hs_cu_stride()) {
        int64_t at = first + i;
        dst[i] = __fadd_rn(dst[i], __fmul_rn(cu_code_value(q, at, fmt), scales[at / block]));
    }
}

extern "C" cudaError_t hs_cu_dequantize_add(cudaStream_t st, float *dst, const void *packed,
                                            int64_t n, int64_t first, int64_t count, int64_t block,
                                            int fmt) {
    if (count <= 0) return cudaSuccess;
    const uint8_t *q = (const uint8_t *)packed;
    const float *scales = (const float *)(q + quant_codes_bytes(n, fmt));
    dequantize_add_kernel<<<hs_cu_blocks(count), HS_CU_THREADS, 0, st>>>(dst, q, scales, first,
                                                                        count, block, fmt);
    return cudaGetLastError();
}
