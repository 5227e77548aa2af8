/* hs_xsum: the exact sum of squares of fp32 values, in fixed point.
 *
 * x = m * 2^(e-150) for the 24-bit integer m and biased exponent e (1 for
 * subnormals), so x^2 = m^2 * 2^(2e-300): a 48-bit integer at one of 254
 * binary positions. Squares are added exactly into a 64-bit counter per
 * exponent (2^16 of them at most before the counters are folded), the
 * counters into 32-bit limbs of a number whose lowest bit is 2^-298. No
 * rounding happens anywhere before hs_xsum_value, so the sum does not
 * depend on the order of the values or on how they were split among
 * calls, threads and ranks: train.reproducibility: layout's gradient norm
 * (docs/numerics.md "Layout-invariant training"). */
#include <math.h>
#include <string.h>

#include "hypershard/tensor.h"

#define EXPONENTS 256
#define FOLD_EVERY 65536 /* squares < 2^48: 2^16 of them fit a uint64 */

void hs_xsum_init(hs_xsum *x) { memset(x, 0, sizeof *x); }

/* Carries moved up so that every limb but the last holds 32 bits. */
static void normalise(hs_xsum *x) {
    for (int i = 0; i + 1 < HS_XSUM_LIMBS; i++) {
        x->limb[i + 1] += x->limb[i] >> 32;
        x->limb[i] &= 0xffffffff;
    }
}

/* acc * 2^(2e - 2) (in units of the lowest bit) added to the limbs. */
static void fold(hs_xsum *x, uint64_t acc, int e) {
    int bit = 2 * e - 2, i = bit / 32;
    unsigned __int128 v = (unsigned __int128)acc << (bit % 32);
    x->limb[i] += (int64_t)(uint32_t)v;
    x->limb[i + 1] += (int64_t)(uint32_t)(v >> 32);
    x->limb[i + 2] += (int64_t)(uint32_t)(v >> 64);
}

void hs_xsum_add_squares(hs_xsum *x, const float *v, int64_t n) {
    uint64_t acc[EXPONENTS];
    for (int64_t b0 = 0; b0 < n; b0 += FOLD_EVERY) {
        int64_t b1 = n - b0 < FOLD_EVERY ? n : b0 + FOLD_EVERY;
        memset(acc, 0, sizeof acc);
        for (int64_t i = b0; i < b1; i++) {
            uint32_t u;
            memcpy(&u, &v[i], sizeof u);
            uint32_t e = (u >> 23) & 0xff, m = u & 0x7fffff;
            if (e == 0xff) {
                x->nonfinite |= m ? 2 : 1;
                continue;
            }
            if (e) m |= 0x800000;
            else e = 1;
            acc[e] += (uint64_t)m * m;
        }
        for (int e = 1; e < EXPONENTS - 1; e++)
            if (acc[e]) fold(x, acc[e], e);
        normalise(x);
    }
}

void hs_xsum_merge(hs_xsum *into, const hs_xsum *from) {
    for (int i = 0; i < HS_XSUM_LIMBS; i++) into->limb[i] += from->limb[i];
    into->nonfinite |= from->nonfinite;
    normalise(into);
}

double hs_xsum_value(const hs_xsum *x) {
    if (x->nonfinite & 2) return NAN;
    if (x->nonfinite & 1) return INFINITY;
    hs_xsum t = *x;
    normalise(&t);
    double s = 0.0;
    for (int i = HS_XSUM_LIMBS - 1; i >= 0; i--) s += ldexp((double)t.limb[i], 32 * i - 298);
    return s;
}
