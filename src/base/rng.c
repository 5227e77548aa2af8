/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11): a counter-based generator, so element i of any tensor can be
 * produced without producing elements 0..i-1. The 64-bit element index and
 * the 64-bit stream id form the 128-bit counter; the seed is the key. */
#include <math.h>

#include "hypershard/base.h"

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

void hs_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                        float mean, float std) {
    for (int64_t i = 0; i < n; i++)
        out[i] = mean + std * hs_rng_normal(seed, stream, (uint64_t)(offset + i));
}
