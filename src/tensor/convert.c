/* hs_convert: bulk dtype conversion.
 *
 * With AVX2 + F16C (the build adds -march=x86-64-v3 when the CPU has them)
 * eight elements go at a time; the tail and other CPUs use the scalar
 * routines of dtype.c. Both paths give identical bits, NaN payloads
 * included (tests/unit/test_dtype_convert.c checks every 16-bit pattern). */
#include <string.h>

#include "hypershard/tensor.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HS_CONVERT_SIMD 1
#else
#define HS_CONVERT_SIMD 0
#endif

#if HS_CONVERT_SIMD
/* Same integer recipe as hs_f32_to_bf16, eight lanes wide. */
static __m128i bf16x8_from_f32(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
    /* Every lane is <= 0xFFFF, so the saturating pack is exact. */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#endif

static void f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#if HS_CONVERT_SIMD
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), bf16x8_from_f32(_mm256_loadu_ps(src + i)));
#endif
    for (; i < n; i++) dst[i] = hs_f32_to_bf16(src[i]);
}

static void bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#if HS_CONVERT_SIMD
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
#endif
    for (; i < n; i++) dst[i] = hs_bf16_to_f32(src[i]);
}

static void f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#if HS_CONVERT_SIMD
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
#endif
    for (; i < n; i++) dst[i] = hs_f32_to_f16(src[i]);
}

static void f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#if HS_CONVERT_SIMD
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = hs_f16_to_f32(src[i]);
}

static void to_f32(float *dst, const void *src, hs_dtype src_dt, int64_t n) {
    switch (src_dt) {
    case HS_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case HS_DTYPE_BF16: bf16_to_f32(dst, src, n); break;
    case HS_DTYPE_F16: f16_to_f32(dst, src, n); break;
    default: hs_panic("hs_convert: bad source dtype %d", (int)src_dt);
    }
}

static void from_f32(void *dst, hs_dtype dst_dt, const float *src, int64_t n) {
    switch (dst_dt) {
    case HS_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case HS_DTYPE_BF16: f32_to_bf16(dst, src, n); break;
    case HS_DTYPE_F16: f32_to_f16(dst, src, n); break;
    default: hs_panic("hs_convert: bad destination dtype %d", (int)dst_dt);
    }
}

/* Widened in L1-sized tiles, then scaled while the tile is hot: one IEEE
 * multiply per element, the same as hs_scale_f32 after hs_convert. */
void hs_convert_scaled_f32(float *dst, const void *src, hs_dtype src_dt, float a, int64_t n) {
    enum { TILE = 2048 };
    HS_ASSERT(n >= 0 && (const void *)dst != src);
    const size_t es = hs_dtype_size(src_dt);
    for (int64_t i = 0; i < n; i += TILE) {
        int64_t m = n - i < TILE ? n - i : TILE;
        float *d = dst + i;
        to_f32(d, (const char *)src + (size_t)i * es, src_dt, m);
        if (a != 1.0f)
            for (int64_t j = 0; j < m; j++) d[j] *= a;
    }
}

void hs_convert(void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n) {
    HS_ASSERT(n >= 0);
    if (n == 0) return;
    if (dst_dt == src_dt) {
        if (dst != src) memmove(dst, src, (size_t)n * hs_dtype_size(dst_dt));
        return;
    }
    HS_ASSERT(dst != src);
    if (src_dt == HS_DTYPE_F32) {
        from_f32(dst, dst_dt, src, n);
        return;
    }
    if (dst_dt == HS_DTYPE_F32) {
        to_f32(dst, src, src_dt, n);
        return;
    }
    /* 16-bit to the other 16-bit: through fp32 in stack-sized chunks. */
    enum { CHUNK = 512 };
    float buf[CHUNK];
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t len = n - i < CHUNK ? n - i : CHUNK;
        to_f32(buf, s + i, src_dt, len);
        from_f32(d + i, dst_dt, buf, len);
    }
}
