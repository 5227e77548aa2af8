/* dtype names and the scalar f32 <-> bf16 / f16 conversions.
 *
 * The scalar routines are the reference the vector paths in convert.c must
 * match bit for bit, including NaN payloads: a NaN is made quiet and keeps
 * the top bits of its payload, exactly as the F16C instructions do. */
#include <stdio.h>
#include <string.h>

#include "hypershard/tensor.h"

static const char *const hs_dtype_names[] = {"float32", "bfloat16", "float16", "uint8"};
_Static_assert(sizeof(hs_dtype_names) / sizeof(hs_dtype_names[0]) == HS_DTYPE_COUNT,
               "hs_dtype_names must follow hs_dtype");

static const char *const hs_dtype_short_names[] = {"fp32", "bf16", "fp16", "u8"};
_Static_assert(sizeof(hs_dtype_short_names) / sizeof(hs_dtype_short_names[0]) == HS_DTYPE_COUNT,
               "hs_dtype_short_names must follow hs_dtype");

size_t hs_dtype_size(hs_dtype dt) {
    HS_ASSERT(dt >= 0 && dt < HS_DTYPE_COUNT);
    return dt == HS_DTYPE_F32 ? 4 : dt == HS_DTYPE_U8 ? 1 : 2;
}

const char *hs_dtype_name(hs_dtype dt) {
    if (dt < 0 || dt >= HS_DTYPE_COUNT) return "unknown";
    return hs_dtype_names[dt];
}

bool hs_dtype_parse(const char *s, hs_dtype *out) {
    if (s == NULL) return false;
    for (int i = 0; hs_dtype_is_float((hs_dtype)i); i++) {
        if (strcmp(s, hs_dtype_names[i]) == 0 || strcmp(s, hs_dtype_short_names[i]) == 0) {
            *out = (hs_dtype)i;
            return true;
        }
    }
    return false;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* hs_f32_to_bf16 / hs_bf16_to_f32 are inline in tensor.h. */

/* |x| below the smallest normal f16 (2^-14): produce a subnormal or zero. */
static uint16_t f16_subnormal_from_bits(uint32_t x) {
    int e = (int)(x >> 23);
    int shift = 126 - e; /* value / 2^-24 == m * 2^(e-126) */
    if (shift > 24) return 0;
    uint32_t m = (x & 0x7FFFFFu) | (e ? 0x800000u : 0);
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)r; /* r == 0x400 is the smallest normal: still correct */
}

uint16_t hs_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to Inf */
    if (x < 0x38800000u) return (uint16_t)(sign | f16_subnormal_from_bits(x));
    /* Rebias the exponent (127 -> 15) and round the 13 dropped bits to
     * nearest even in one add. */
    x += 0xC8000FFFu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (x >> 13));
}

float hs_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) {
        /* Inf, or NaN made quiet (what VCVTPH2PS does). */
        uint32_t nan_quiet = m ? 0x400000u : 0;
        return f32_from_bits(sign | 0x7F800000u | (m << 13) | nan_quiet);
    }
    if (e == 0) {
        if (m == 0) return f32_from_bits(sign);
        /* Subnormal: shift the leading 1 into the implicit position. */
        int exp = 113; /* 127 - 14 */
        while (!(m & 0x400u)) {
            m <<= 1;
            exp--;
        }
        return f32_from_bits(sign | ((uint32_t)exp << 23) | ((m & 0x3FFu) << 13));
    }
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

float hs_round_to(hs_dtype dt, float f) {
    switch (dt) {
    case HS_DTYPE_BF16: return hs_bf16_to_f32(hs_f32_to_bf16(f));
    case HS_DTYPE_F16: return hs_f16_to_f32(hs_f32_to_f16(f));
    default: return f;
    }
}

const char *hs_placement_str(hs_placement p, char *buf, size_t cap) {
    switch (p.kind) {
    case HS_PLACEMENT_REPLICATE: snprintf(buf, cap, "Replicate()"); break;
    case HS_PLACEMENT_SHARD: snprintf(buf, cap, "Shard(%d)", p.dim); break;
    case HS_PLACEMENT_PARTIAL: snprintf(buf, cap, "Partial()"); break;
    default: snprintf(buf, cap, "?"); break;
    }
    return buf;
}
