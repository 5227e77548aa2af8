/* hs_convert: bulk dtype conversion.
 *
 * The element loops come from the fastest path this build and CPU have
 * (convert_x86.c: 16 lanes of AVX-512 with VCVTNEPS2BF16, else 8 of AVX2 +
 * F16C), else the scalar routines of dtype.c; every path gives the same
 * bits, NaN payloads included (tests/unit/test_dtype_convert.c checks every
 * 16-bit pattern and a sweep of fp32 ones on each path). It runs on the
 * calling thread: the comm thread calls it too; the cpu device splits large
 * casts over the OpenMP threads (src/device/cpu.c). */
#include <string.h>

#include "tensor/convert_kernels.h"

static void scalar_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hs_f32_to_bf16(src[i]);
}

static void scalar_to_f16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hs_f32_to_f16(src[i]);
}

static void scalar_from_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hs_bf16_to_f32(src[i]);
}

static void scalar_from_f16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hs_f16_to_f32(src[i]);
}

static const hs_convert_kernels scalar = {scalar_to_bf16, scalar_to_f16, scalar_from_bf16,
                                          scalar_from_f16};

static const char *const path_names[] = {"scalar", "avx2_f16c", "avx512_bf16"};
_Static_assert(sizeof path_names / sizeof path_names[0] == HS_CONVERT_PATH_COUNT,
               "path_names follow hs_convert_path");

/* Path p's loops, or the next slower path's where this build or CPU lacks p. */
static const hs_convert_kernels *kernels_of(hs_convert_path p) {
    for (int q = (int)p; q > HS_CONVERT_SCALAR; q--) {
        const hs_convert_kernels *k = hs_convert_vector_kernels((hs_convert_path)q);
        if (k) return k;
    }
    return &scalar;
}

hs_convert_path hs_convert_best_path(void) {
    for (int q = HS_CONVERT_PATH_COUNT - 1; q > HS_CONVERT_SCALAR; q--)
        if (hs_convert_vector_kernels((hs_convert_path)q)) return (hs_convert_path)q;
    return HS_CONVERT_SCALAR;
}

const char *hs_convert_path_name(hs_convert_path p) {
    return (unsigned)p < HS_CONVERT_PATH_COUNT ? path_names[p] : "?";
}

static void to_f32(const hs_convert_kernels *k, float *dst, const void *src, hs_dtype src_dt,
                   int64_t n) {
    switch (src_dt) {
    case HS_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case HS_DTYPE_BF16: k->from_bf16(dst, src, n); break;
    case HS_DTYPE_F16: k->from_f16(dst, src, n); break;
    default: hs_panic("hs_convert: bad source dtype %d", (int)src_dt);
    }
}

static void from_f32(const hs_convert_kernels *k, void *dst, hs_dtype dst_dt, const float *src,
                     int64_t n) {
    switch (dst_dt) {
    case HS_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case HS_DTYPE_BF16: k->to_bf16(dst, src, n); break;
    case HS_DTYPE_F16: k->to_f16(dst, src, n); break;
    default: hs_panic("hs_convert: bad destination dtype %d", (int)dst_dt);
    }
}

/* One contiguous range of a conversion between two different dtypes. */
static void convert_range(const hs_convert_kernels *k, void *dst, hs_dtype dst_dt, const void *src,
                          hs_dtype src_dt, int64_t n) {
    if (src_dt == HS_DTYPE_F32) {
        from_f32(k, dst, dst_dt, src, n);
        return;
    }
    if (dst_dt == HS_DTYPE_F32) {
        to_f32(k, dst, src, src_dt, n);
        return;
    }
    /* 16-bit to the other 16-bit: through fp32 in stack-sized chunks. */
    enum { CHUNK = 512 };
    float buf[CHUNK];
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t len = n - i < CHUNK ? n - i : CHUNK;
        to_f32(k, buf, s + i, src_dt, len);
        from_f32(k, d + i, dst_dt, buf, len);
    }
}

/* Widened in L1-sized tiles, then scaled while the tile is hot: one IEEE
 * multiply per element, the same as hs_scale_f32 after hs_convert. */
void hs_convert_scaled_f32(float *dst, const void *src, hs_dtype src_dt, float a, int64_t n) {
    enum { TILE = 2048 };
    HS_ASSERT(n >= 0 && (const void *)dst != src);
    const hs_convert_kernels *k = kernels_of(hs_convert_best_path());
    const size_t es = hs_dtype_size(src_dt);
    for (int64_t i = 0; i < n; i += TILE) {
        int64_t m = n - i < TILE ? n - i : TILE;
        float *d = dst + i;
        to_f32(k, d, (const char *)src + (size_t)i * es, src_dt, m);
        if (a != 1.0f)
            for (int64_t j = 0; j < m; j++) d[j] *= a;
    }
}

void hs_convert_on(hs_convert_path p, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                   int64_t n) {
    HS_ASSERT(n >= 0);
    if (n == 0) return;
    if (dst_dt == src_dt) {
        if (dst != src) memmove(dst, src, (size_t)n * hs_dtype_size(dst_dt));
        return;
    }
    HS_ASSERT(dst != src);
    convert_range(kernels_of(p), dst, dst_dt, src, src_dt, n);
}

void hs_convert(void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n) {
    hs_convert_on(hs_convert_best_path(), dst, dst_dt, src, src_dt, n);
}
