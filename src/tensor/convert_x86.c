/* The vector loops of hs_convert, bit for bit the scalar routines of
 * dtype.c (tests/unit/test_dtype_convert.c holds every path to them).
 *
 * AVX2 + F16C, 8 lanes: compiled in when the build targets them (the build
 * adds -march=x86-64-v3 on a machine that has them), the bf16 rounding in
 * integer arithmetic. AVX-512, 16 lanes: compiled with a target attribute
 * and chosen at run time where the CPU has AVX512-BF16, so the binary
 * still runs on CPUs without it. VCVTNEPS2BF16 rounds to nearest even and
 * makes a NaN quiet by truncation, as the scalar routine does, but reads an
 * fp32 subnormal as zero: a vector holding one takes the integer recipe
 * for those lanes. Tails run masked, in the same instructions. */
#include "tensor/convert_kernels.h"

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 10)
#include <immintrin.h>
#define HAVE_AVX512_PATH 1
#else
#define HAVE_AVX512_PATH 0
#endif
#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#else
#define HAVE_AVX2_PATH 0
#endif

#if HAVE_AVX2_PATH
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

static void avx2_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), bf16x8_from_f32(_mm256_loadu_ps(src + i)));
    for (; i < n; i++) dst[i] = hs_f32_to_bf16(src[i]);
}

static void avx2_from_bf16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++) dst[i] = hs_bf16_to_f32(src[i]);
}

static void avx2_to_f16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = hs_f32_to_f16(src[i]);
}

static void avx2_from_f16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = hs_f16_to_f32(src[i]);
}

static const hs_convert_kernels avx2 = {avx2_to_bf16, avx2_to_f16, avx2_from_bf16, avx2_from_f16};
#endif

#if HAVE_AVX512_PATH
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* Lanes [0, m) of 16, m in [1, 16]. */
AVX512 static inline __mmask16 lanes(int64_t m) {
    return (__mmask16)(m >= 16 ? 0xFFFFu : (1u << m) - 1u);
}

AVX512 static void avx512_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    const __m512i expo = _mm512_set1_epi32(0x7F800000), mant = _mm512_set1_epi32(0x007FFFFF);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = lanes(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, src + i);
        __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
        __m512i x = _mm512_castps_si512(v);
        /* exponent 0, mantissa not: an fp32 subnormal, which the
         * instruction reads as zero */
        __mmask16 sub = _mm512_testn_epi32_mask(x, expo) & _mm512_test_epi32_mask(x, mant);
        if (sub) {
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
            __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
            __m256i rounded =
                _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(x, bias), 16));
            r = _mm256_mask_blend_epi16(sub, r, rounded);
        }
        _mm256_mask_storeu_epi16(dst + i, k, r);
    }
}

AVX512 static void avx512_from_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = lanes(n - i);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, src + i));
        _mm512_mask_storeu_ps(dst + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

AVX512 static void avx512_to_f16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = lanes(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}

AVX512 static void avx512_from_f16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = lanes(n - i);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

static const hs_convert_kernels avx512 = {avx512_to_bf16, avx512_to_f16, avx512_from_bf16,
                                          avx512_from_f16};

static bool cpu_has_avx512_bf16(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
#endif

const hs_convert_kernels *hs_convert_vector_kernels(hs_convert_path p) {
    switch (p) {
#if HAVE_AVX512_PATH
    case HS_CONVERT_AVX512: return cpu_has_avx512_bf16() && hs_cpu_isa_allows(p) ? &avx512 : NULL;
#endif
#if HAVE_AVX2_PATH
    case HS_CONVERT_AVX2: return &avx2;
#endif
    default: return NULL;
    }
}
