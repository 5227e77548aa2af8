/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11): a counter-based generator, so element i of any tensor can be
 * produced without producing elements 0..i-1. The 64-bit element index and
 * the 64-bit stream id form the 128-bit counter; the seed is the key. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "hypershard/base.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void hs_philox4x32(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint64_t hs_hash64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* 24 bits: exactly representable in a float, strictly below 1. */
static inline float u24(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

float hs_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    hs_philox4x32(seed, stream, index, r);
    return u24(r[0]);
}

float hs_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    hs_philox4x32(seed, stream, index, r);
    /* u1 in (0, 1] keeps log() finite; the computation is in double so the
     * result does not depend on the compiler's float contraction choices. */
    double u1 = ((double)(r[0] >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(r[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void hs_rng_fill_uniform(float *out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                         float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        out[i] = lo + (hi - lo) * hs_rng_uniform(seed, stream, (uint64_t)(offset + i));
}

/* ------------------------------------------------ normal draws in blocks */

/* hs_rng_fill_normal draws RNG_LANES values at a time with loops the
 * compiler vectorises: Philox on the lanes' counters, then the Box-Muller
 * of hs_rng_normal with a double log and cos of our own (polynomials below)
 * in place of libm's scalar calls. The lane's value is kept only where it
 * provably rounds to the same float as hs_rng_normal's: its double lies
 * farther from every rounding boundary of its float than the two doubles
 * can differ (both logs, cosines and sqrt within 2^-46 relative of exact,
 * taken as s * 2^-41 in absolute terms, s = sqrt(-2 log u1) >= |value|);
 * the few that do not (about one in 2^14) are drawn again by
 * hs_rng_normal. So the fill equals hs_rng_normal element for element,
 * bit for bit (tests/unit/test_base.c sweeps millions), at a fraction of
 * its time. */
#define RNG_LANES 16

#if defined(__AVX2__)
/* Four lanes to a vector, each lane's 32-bit words in the low halves of
 * 64-bit elements: one VPMULUDQ is four 32 x 32 -> 64-bit products, and
 * nothing is shuffled. The high halves fill with bits no result reads (a
 * product reads the low halves; the words are taken from the low halves). */
static void philox_lanes(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t w0[RNG_LANES],
                         uint32_t w1[RNG_LANES]) {
    enum { V = RNG_LANES / 4 };
    __m256i c0[V], c1[V], c2[V], c3[V];
    const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
    for (int v = 0; v < V; v++) {
        uint64_t c = counter + 4 * (uint64_t)v;
        c0[v] = _mm256_set_epi64x((int64_t)(c + 3), (int64_t)(c + 2), (int64_t)(c + 1), (int64_t)c);
        c1[v] = _mm256_set_epi64x((int64_t)((c + 3) >> 32), (int64_t)((c + 2) >> 32),
                                  (int64_t)((c + 1) >> 32), (int64_t)(c >> 32));
        c2[v] = _mm256_set1_epi64x((int64_t)(uint32_t)stream);
        c3[v] = _mm256_set1_epi64x((int64_t)(stream >> 32));
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        const __m256i kv0 = _mm256_set1_epi64x(k0), kv1 = _mm256_set1_epi64x(k1);
        for (int v = 0; v < V; v++) {
            __m256i p0 = _mm256_mul_epu32(c0[v], m0), p1 = _mm256_mul_epu32(c2[v], m1);
            c0[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[v]), kv0);
            c2[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[v]), kv1);
            c1[v] = p1, c3[v] = p0;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int v = 0; v < V; v++) {
        uint64_t a[4], b[4];
        _mm256_storeu_si256((__m256i *)a, c0[v]);
        _mm256_storeu_si256((__m256i *)b, c1[v]);
        for (int j = 0; j < 4; j++) w0[4 * v + j] = (uint32_t)a[j], w1[4 * v + j] = (uint32_t)b[j];
    }
}
#else
static void philox_lanes(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t w0[RNG_LANES],
                         uint32_t w1[RNG_LANES]) {
    for (int j = 0; j < RNG_LANES; j++) {
        uint32_t r[4];
        hs_philox4x32(seed, stream, counter + (uint64_t)j, r);
        w0[j] = r[0], w1[j] = r[1];
    }
}
#endif

static double from_bits(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t to_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* log(a / 2^24) for an integer a in [1, 2^24]: a = m 2^e with m in
 * [sqrt(1/2), sqrt(2)), log m = 2 atanh(t), t = (m - 1) / (m + 1), |t| <
 * 0.1716, by its series to t^21 (next term below 2^-55 relative), and
 * (e - 24) ln 2 with ln 2 in two parts (the first times e exact). Integers
 * go to doubles through the exponent field (2^52 + i), which vectorises
 * where a 64-bit conversion does not (AVX2). */
static double log_u1(double a) {
    uint64_t bits = to_bits(a);
    uint64_t mb = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
    double m = from_bits(mb);
    uint64_t big = m > 1.4142135623730951 ? 1 : 0;
    m = big ? m * 0.5 : m;
    /* e + big - 24, as (e + big + 1000) - 1024 through 2^52 + i */
    double ed = from_bits(0x4330000000000000ull | ((bits >> 52) - 23 + big)) -
                (4503599627370496.0 + 1024.0);
    double t = (m - 1.0) / (m + 1.0), t2 = t * t;
    double p = 1.0 / 21;
    p = p * t2 + 1.0 / 19;
    p = p * t2 + 1.0 / 17;
    p = p * t2 + 1.0 / 15;
    p = p * t2 + 1.0 / 13;
    p = p * t2 + 1.0 / 11;
    p = p * t2 + 1.0 / 9;
    p = p * t2 + 1.0 / 7;
    p = p * t2 + 1.0 / 5;
    p = p * t2 + 1.0 / 3;
    double logm = 2.0 * t + 2.0 * t * t2 * p;
    return ed * 6.93147180369123816490e-01 + (ed * 1.90821492927058770002e-10 + logm);
}

/* cos x for x in [0, 2 pi]: x - k pi/2 in three parts (k <= 4, each
 * product exact; k's low bits read from the rounding sum), then the
 * quadrant's sine or cosine by their minimax polynomials on [-pi/4, pi/4]
 * (fdlibm's coefficients). */
static double cos_0_2pi(double x) {
    double kr = x * 0.63661977236758134308 + 6755399441055744.0;
    double k = kr - 6755399441055744.0;
    uint64_t q = to_bits(kr) & 3;
    double r = x - k * 1.57079632673412561417e+00;
    r = r - k * 6.07710050630396597660e-11;
    r = r - k * 2.02226624871116645580e-21;
    double z = r * r;
    double s = -2.50507602534068634195e-08 + z * 1.58969099521155010221e-10;
    s = 2.75573137070700676789e-06 + z * s;
    s = -1.98412698298579493134e-04 + z * s;
    s = 8.33333333332248946124e-03 + z * s;
    s = -1.66666666666666324348e-01 + z * s;
    s = r + r * z * s;
    double c = 2.08757232129817482790e-09 + z * -1.13596475577881948265e-11;
    c = -2.75573143513906633035e-07 + z * c;
    c = 2.48015872894767294178e-05 + z * c;
    c = -1.38888888888741095749e-03 + z * c;
    c = 4.16666666666666019037e-02 + z * c;
    c = 1.0 - (0.5 * z - z * z * c);
    double v = (q & 1) ? s : c;
    /* quadrants 1 and 2 negate: the sign bit from q's bit 0 xor bit 1 */
    return from_bits(to_bits(v) ^ (((q ^ (q >> 1)) & 1) << 63));
}

/* How far a double may lie from f (a float, as a double) and still round
 * to it: half its spacing of floats, a quarter below a power of two (where
 * the float under it is half as far). 0 for zero and subnormals, which
 * then always fall back. */
static double rounding_room(double f) {
    uint64_t b = to_bits(f), ex = b & 0x7FF0000000000000ull;
    uint64_t drop = (b & 0x000FFFFFFFFFFFFFull) ? 24 : 25;
    return from_bits(ex >= (uint64_t)(1023 - 126) << 52 ? ex - (drop << 52) : 0);
}

/* The rare lane drawn again the scalar way; kept out of line, where the
 * compiler cannot compute it for every lane of the loop that selects it. */
static __attribute__((noinline)) float redraw(uint64_t seed, uint64_t stream, uint64_t index) {
    return hs_rng_normal(seed, stream, index);
}

static void normal_lanes(float *out, int n, uint64_t seed, uint64_t stream, uint64_t index,
                         float mean, float std) {
    uint32_t w0[RNG_LANES], w1[RNG_LANES];
    double z[RNG_LANES], f[RNG_LANES];
    int64_t exact[RNG_LANES];
    philox_lanes(seed, stream, index, w0, w1);
    for (int j = 0; j < RNG_LANES; j++) {
        double s = sqrt(-2.0 * log_u1((double)(w0[j] >> 8) + 1.0));
        z[j] = s * cos_0_2pi(6.283185307179586 * ((double)(w1[j] >> 8) / 16777216.0));
        f[j] = (double)(float)z[j];
        exact[j] = fabs(z[j] - f[j]) + s * 0x1p-41 < rounding_room(f[j]);
    }
    for (int j = 0; j < n; j++)
        out[j] = mean + std * (exact[j] ? (float)f[j] : redraw(seed, stream, index + (uint64_t)j));
}

void hs_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                        float mean, float std) {
    for (int64_t i = 0; i < n; i += RNG_LANES)
        normal_lanes(out + i, n - i < RNG_LANES ? (int)(n - i) : RNG_LANES, seed, stream,
                     (uint64_t)(offset + i), mean, std);
}
