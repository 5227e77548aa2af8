/* Attention's fp32 tile products in registers, one table per ISA tier:
 * the score product S = alpha Q K^T over K packed into panels of keys,
 * and the products whose inner index is a tile's keys or rows (P V, dS K,
 * P^T dO, dS^T Q), each restricted group by group to the keys its rows
 * see, so a causal tile's masked part is skipped at the micro-tile's
 * granularity instead of computed and thrown away. The body is
 * cpu_attention_tile.h, included once per tier; where it is taken:
 * cpu_attention.c. */
#include <math.h>

#include "device/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__AVX2__)
#include <immintrin.h>

/* The first two steps of an n x n transpose (n vectors r, prefix the
 * intrinsics' _mm256 or _mm512): u[4i + k]'s 128-bit lane j holds rows
 * 4i .. 4i+3 at column 4j + k. */
#define TRANSPOSE_4X4(p, r, u, n)                                                                  \
    do {                                                                                           \
        __typeof__(r[0]) t_[n];                                                                    \
        for (int i_ = 0; i_ < (n) / 2; i_++) {                                                     \
            t_[2 * i_] = p##_unpacklo_ps(r[2 * i_], r[2 * i_ + 1]);                                \
            t_[2 * i_ + 1] = p##_unpackhi_ps(r[2 * i_], r[2 * i_ + 1]);                            \
        }                                                                                          \
        for (int i_ = 0; i_ < (n) / 4; i_++) {                                                     \
            u[4 * i_] = p##_shuffle_ps(t_[4 * i_], t_[4 * i_ + 2], 0x44);                          \
            u[4 * i_ + 1] = p##_shuffle_ps(t_[4 * i_], t_[4 * i_ + 2], 0xEE);                      \
            u[4 * i_ + 2] = p##_shuffle_ps(t_[4 * i_ + 1], t_[4 * i_ + 3], 0x44);                  \
            u[4 * i_ + 3] = p##_shuffle_ps(t_[4 * i_ + 1], t_[4 * i_ + 3], 0xEE);                  \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------ AVX2 + FMA, 8 lanes */

#define TILE(name) name##_avx2
#define TW 8
#define TR_NT 6
#define TR_PB 6
#define TNV 2
#define tv __m256
#define tmask __m256i
#define tv_zero() _mm256_setzero_ps()
#define tv_load(p) _mm256_loadu_ps(p)
#define tv_bcast(x) _mm256_set1_ps(x)
#define tv_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define tv_mul(a, b) _mm256_mul_ps(a, b)
#define tv_store(p, v) _mm256_storeu_ps(p, v)
#define tv_mask(n)                                                                                 \
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define tv_loadm(p, m) _mm256_maskload_ps(p, m)
#define tv_storem(p, v, m) _mm256_maskstore_ps(p, m, v)
#define tv_add(a, b) _mm256_add_ps(a, b)
#define tv_sub(a, b) _mm256_sub_ps(a, b)
#define tv_min(a, b) _mm256_min_ps(a, b)
#define tv_max(a, b) _mm256_max_ps(a, b)
#define tv_keep(v, m) _mm256_and_ps(v, _mm256_castsi256_ps(m))
#define tv_pow2(n)                                                                                 \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
#define tcmp __m256
#define tv_lt(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define tv_gt(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define tv_nan(a) _mm256_cmp_ps(a, a, _CMP_UNORD_Q)
#define tv_sel(c, a, b) _mm256_blendv_ps(b, a, c)
#define tv_transpose(r) transpose8(r)
#define tv_sum(v) sum8(v)

/* The 8 lanes in double: (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)). */
static inline __attribute__((always_inline)) double sum8(__m256 v) {
    __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

/* r[0..8) as the rows of an 8 x 8 block, transposed in place. */
static inline __attribute__((always_inline)) void transpose8(__m256 *r) {
    __m256 u[8];
    TRANSPOSE_4X4(_mm256, r, u, 8);
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}
#include "device/cpu_attention_tile.h"
#undef TILE
#undef TW
#undef TR_NT
#undef TR_PB
#undef TNV
#undef tv
#undef tmask
#undef tv_zero
#undef tv_load
#undef tv_bcast
#undef tv_fma
#undef tv_mul
#undef tv_store
#undef tv_mask
#undef tv_loadm
#undef tv_storem
#undef tv_add
#undef tv_sub
#undef tv_min
#undef tv_max
#undef tv_keep
#undef tv_pow2
#undef tcmp
#undef tv_lt
#undef tv_gt
#undef tv_nan
#undef tv_sel
#undef tv_transpose
#undef tv_sum

const hs_att_tiles *hs_att_tiles_avx2(void) { return &table_avx2; }

/* ----------------------------------------------------------- AVX-512, 16 lanes */

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")
#define TILE(name) name##_avx512
#define TW 16
#define TR_NT 12
#define TR_PB 6
#define TNV 4
#define tv __m512
#define tmask __mmask16
#define tv_zero() _mm512_setzero_ps()
#define tv_load(p) _mm512_loadu_ps(p)
#define tv_bcast(x) _mm512_set1_ps(x)
#define tv_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define tv_mul(a, b) _mm512_mul_ps(a, b)
#define tv_store(p, v) _mm512_storeu_ps(p, v)
#define tv_mask(n) ((__mmask16)((1u << (n)) - 1u))
#define tv_loadm(p, m) _mm512_maskz_loadu_ps(m, p)
#define tv_storem(p, v, m) _mm512_mask_storeu_ps(p, m, v)
#define tv_add(a, b) _mm512_add_ps(a, b)
#define tv_sub(a, b) _mm512_sub_ps(a, b)
#define tv_min(a, b) _mm512_min_ps(a, b)
#define tv_max(a, b) _mm512_max_ps(a, b)
#define tv_keep(v, m) _mm512_maskz_mov_ps(m, v)
#define tv_pow2(n)                                                                                 \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
#define tcmp __mmask16
#define tv_lt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define tv_gt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define tv_nan(a) _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)
#define tv_sel(c, a, b) _mm512_mask_blend_ps(c, b, a)
#define tv_transpose(r) transpose16(r)
#define tv_sum(v) sum16(v)

/* The 16 lanes in double: the halves added lane by lane, then those 8 in
 * _mm512_reduce_add_pd's tree. */
static inline __attribute__((always_inline)) double sum16(__m512 v) {
    __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    return _mm512_reduce_add_pd(_mm512_add_pd(a, b));
}

/* r[0..16) as the rows of a 16 x 16 block, transposed in place. */
static inline __attribute__((always_inline)) void transpose16(__m512 *r) {
    __m512 u[16], v[16];
    TRANSPOSE_4X4(_mm512, r, u, 16);
    for (int k = 0; k < 4; k++) {
        v[k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
        v[4 + k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        v[8 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        v[12 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(v[k], v[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(v[k], v[8 + k], 0xdd);
    }
}
#include "device/cpu_attention_tile.h"
#pragma GCC pop_options

const hs_att_tiles *hs_att_tiles_avx512(void) { return &table_avx512; }

#else

const hs_att_tiles *hs_att_tiles_avx2(void) { return NULL; }
const hs_att_tiles *hs_att_tiles_avx512(void) { return NULL; }

#endif
