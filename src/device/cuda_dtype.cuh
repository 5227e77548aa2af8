/* Private to src/device/'s .cu files: the storage dtypes in device code and
 * the shape of an element-wise launch.
 *
 * Dtypes are the integers of hs_dtype (0 fp32, 1 bf16, 2 fp16). Every
 * conversion gives the bits of tensor/'s scalar routines (hs_f32_to_bf16,
 * hs_f32_to_f16 and back), which are the bit reference: round to nearest
 * even, and a NaN keeps its sign and top payload bits and is made quiet,
 * where the hardware's conversion would give the canonical NaN. Finite
 * values and infinities go through the hardware's round-to-nearest-even
 * conversion, which is that rule. */
#ifndef HS_DEVICE_CUDA_DTYPE_CUH
#define HS_DEVICE_CUDA_DTYPE_CUH

#include <stdint.h>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

enum { HS_CU_F32 = 0, HS_CU_BF16 = 1, HS_CU_F16 = 2 };

/* Threads per block of the element-wise kernels, and the most blocks one
 * launches: a grid-stride loop covers the rest. */
#define HS_CU_THREADS 256
#define HS_CU_MAX_BLOCKS 65535

static inline unsigned hs_cu_blocks(int64_t n) {
    int64_t b = (n + HS_CU_THREADS - 1) / HS_CU_THREADS;
    return (unsigned)(b < 1 ? 1 : b > HS_CU_MAX_BLOCKS ? HS_CU_MAX_BLOCKS : b);
}

/* The first element of this thread and the stride of a grid-stride loop. */
__device__ __forceinline__ int64_t hs_cu_first(void) {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t hs_cu_stride(void) { return (int64_t)gridDim.x * blockDim.x; }

/* Multi-tensor kernels: tensor i owns the grid's blocks [first_block,
 * first_block + blocks) (ascending in i). The tensor that block b works
 * on, by binary search. */
template <typename Item>
__device__ __forceinline__ const Item &hs_cu_item_of(const Item *items, int count, int b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (items[mid].first_block <= b) lo = mid;
        else hi = mid - 1;
    }
    return items[lo];
}

/* ---------------------------------------------------------- conversions */

__device__ __forceinline__ bool hs_cu_f32_is_nan(uint32_t x) {
    return (x & 0x7FFFFFFFu) > 0x7F800000u;
}

__device__ __forceinline__ uint16_t hs_cu_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if (hs_cu_f32_is_nan(x)) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u); /* to nearest, ties to even; overflow to Inf */
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float hs_cu_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t hs_cu_f32_to_f16(float f) {
    uint32_t x = __float_as_uint(f);
    if (hs_cu_f32_is_nan(x))
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu));
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float hs_cu_f16_to_f32(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) /* NaN, made quiet */
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7FC00000u |
                               ((uint32_t)(h & 0x3FFu) << 13));
    return __half2float(__ushort_as_half(h));
}

/* ------------------------------------------------- loads and stores */

/* Element i of p (dtype DT) as fp32, and v stored there rounded once. */
template <int DT> __device__ __forceinline__ float hs_cu_ld(const void *p, int64_t i) {
    if (DT == HS_CU_BF16) return hs_cu_bf16_to_f32(((const uint16_t *)p)[i]);
    if (DT == HS_CU_F16) return hs_cu_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Elements 8j .. 8j+7 of p (dtype DT; p 16-byte aligned) as fp32, and v
 * stored there rounded once: 16-byte loads and stores (two for fp32), the
 * same value per element as hs_cu_ld / hs_cu_st. */
template <int DT> __device__ __forceinline__ void hs_cu_ld8(const void *p, int64_t j, float *v) {
    if constexpr (DT == HS_CU_F32) {
        float4 a = ((const float4 *)p)[2 * j], b = ((const float4 *)p)[2 * j + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
        uint4 w = ((const uint4 *)p)[j];
        uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint16_t lo = (uint16_t)(u[k] & 0xFFFFu), hi = (uint16_t)(u[k] >> 16);
            v[2 * k] = DT == HS_CU_BF16 ? hs_cu_bf16_to_f32(lo) : hs_cu_f16_to_f32(lo);
            v[2 * k + 1] = DT == HS_CU_BF16 ? hs_cu_bf16_to_f32(hi) : hs_cu_f16_to_f32(hi);
        }
    }
}

template <int DT> __device__ __forceinline__ void hs_cu_st8(void *p, int64_t j, const float *v) {
    if constexpr (DT == HS_CU_F32) {
        ((float4 *)p)[2 * j] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[2 * j + 1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        uint32_t u[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint16_t lo =
                DT == HS_CU_BF16 ? hs_cu_f32_to_bf16(v[2 * k]) : hs_cu_f32_to_f16(v[2 * k]);
            uint16_t hi = DT == HS_CU_BF16 ? hs_cu_f32_to_bf16(v[2 * k + 1])
                                           : hs_cu_f32_to_f16(v[2 * k + 1]);
            u[k] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
        ((uint4 *)p)[j] = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

/* Whether every pointer is 16-byte aligned (the 8-element paths). */
static inline bool hs_cu_aligned16(const void *a, const void *b) {
    return (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

template <int DT> __device__ __forceinline__ void hs_cu_st(void *p, int64_t i, float v) {
    if (DT == HS_CU_BF16) ((uint16_t *)p)[i] = hs_cu_f32_to_bf16(v);
    else if (DT == HS_CU_F16) ((uint16_t *)p)[i] = hs_cu_f32_to_f16(v);
    else ((float *)p)[i] = v;
}

/* The value a store to DT and a load back give (hs_round_f32's). */
template <int DT> __device__ __forceinline__ float hs_cu_round(float v) {
    if (DT == HS_CU_BF16) return hs_cu_bf16_to_f32(hs_cu_f32_to_bf16(v));
    if (DT == HS_CU_F16) return hs_cu_f16_to_f32(hs_cu_f32_to_f16(v));
    return v;
}

/* The same with the dtype known only at run time (the same for every
 * thread, so the branch does not diverge). */
__device__ __forceinline__ float hs_cu_ld_dt(const void *p, int dt, int64_t i) {
    switch (dt) {
    case HS_CU_BF16: return hs_cu_ld<HS_CU_BF16>(p, i);
    case HS_CU_F16: return hs_cu_ld<HS_CU_F16>(p, i);
    default: return hs_cu_ld<HS_CU_F32>(p, i);
    }
}

__device__ __forceinline__ void hs_cu_st_dt(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case HS_CU_BF16: hs_cu_st<HS_CU_BF16>(p, i, v); break;
    case HS_CU_F16: hs_cu_st<HS_CU_F16>(p, i, v); break;
    default: hs_cu_st<HS_CU_F32>(p, i, v); break;
    }
}

/* f(std::integral_constant<int, DT>()) for the run-time dtype dt: a
 * launcher instantiates its kernel for each storage dtype and picks one. */
template <typename F> static inline cudaError_t hs_cu_by_dtype(int dt, F f) {
    switch (dt) {
    case HS_CU_BF16: return f(std::integral_constant<int, HS_CU_BF16>());
    case HS_CU_F16: return f(std::integral_constant<int, HS_CU_F16>());
    default: return f(std::integral_constant<int, HS_CU_F32>());
    }
}

#endif
