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
