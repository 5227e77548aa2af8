/* Block quantization for values on the wire (format in tensor.h): the
 * routines every backend's kernel must match bit for bit. The element
 * loops are branch-free (selects on bit patterns), so they vectorise. */
#include <math.h>

#include "hypershard/tensor.h"

static const char *const fmt_names[] = {"none", "int8", "fp8_e4m3", "int4"};
_Static_assert(sizeof fmt_names / sizeof fmt_names[0] == HS_QUANT_FMT_COUNT,
               "quant format names follow the enum");

const char *hs_quant_fmt_name(hs_quant_fmt f) {
    return (unsigned)f < HS_QUANT_FMT_COUNT ? fmt_names[f] : "?";
}

static bool is_format(hs_quant_fmt f) {
    return f == HS_QUANT_INT8 || f == HS_QUANT_FP8_E4M3 || f == HS_QUANT_INT4;
}

/* The codes of n values: a byte each, or a nibble each for int4. */
static int64_t codes_bytes(int64_t n, hs_quant_fmt f) {
    int64_t b = f == HS_QUANT_INT4 ? (n + 1) / 2 : n;
    return (b + 3) / 4 * 4;
}

size_t hs_quant_packed_bytes(int64_t n, int64_t block, hs_quant_fmt f) {
    HS_ASSERT(n >= 0 && block > 0 && is_format(f));
    return (size_t)codes_bytes(n, f) + sizeof(float) * (size_t)((n + block - 1) / block);
}

typedef union {
    float f;
    uint32_t u;
} bits32;

/* Round to nearest even on the bit pattern: a normal |y| keeps 3 of its 23
 * mantissa bits (a carry lands in the exponent); below 2^-6 the steps are
 * 2^-9, and adding 2^23 to |y| * 2^9 (exact) leaves rint of it in the low
 * mantissa bits; 448 and above saturate; NaN is 0x7F. */
static inline uint8_t e4m3_code(float y) {
    bits32 v = {.f = y}, a = {.f = fabsf(y)};
    uint32_t sign = (v.u >> 24) & 0x80u;
    uint32_t normal = ((a.u + 0x7FFFFu + ((a.u >> 20) & 1u)) >> 20) - (120u << 3);
    bits32 sub = {.f = a.f * 0x1p9f + 0x1p23f};
    uint32_t c = a.f < 0x1p-6f ? sub.u - 0x4B000000u : normal;
    c = a.f >= 448.0f ? 0x7Eu : c;
    c = a.f != a.f ? 0x7Fu : c;
    return (uint8_t)(sign | c);
}

static inline float e4m3_value(uint8_t code) {
    uint32_t c = code & 0x7Fu;
    bits32 normal = {.u = (c << 20) + (120u << 23)}, nan = {.u = 0x7FC00000u};
    float v = c >= 8u ? normal.f : (float)(c & 7u) * 0x1p-9f;
    v = c == 0x7Fu ? nan.f : v;
    return code & 0x80u ? -v : v;
}

uint8_t hs_f32_to_e4m3(float x) { return e4m3_code(x); }
float hs_e4m3_to_f32(uint8_t c) { return e4m3_value(c); }

static float *scales_of(void *packed, int64_t n, hs_quant_fmt f) {
    return (float *)((char *)packed + codes_bytes(n, f));
}

/* The block's |max| and whether it holds Inf or NaN, from one integer
 * max: |x|'s bit patterns order as the values do, and NaN's lie above
 * Inf's (0x7F800000), so the largest pattern says both. It vectorises as
 * a float comparison would not. */
static inline __attribute__((always_inline)) float amax_of(const float *x, int64_t n,
                                                           bool *finite) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        bits32 v = {.f = x[i]};
        uint32_t a = v.u & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    *finite &= m < 0x7F800000u;
    bits32 r = {.u = m};
    return r.f;
}

/* A nibble's value: the low 4 bits sign-extended. */
static inline float int4_value(uint8_t nib) { return (float)((int8_t)(uint8_t)(nib << 4) >> 4); }

/* Value i of packed int4 codes q. */
static inline float int4_at(const uint8_t *q, int64_t i) {
    return int4_value(i & 1 ? q[i >> 1] >> 4 : q[i >> 1] & 0xFu);
}

/* Values at a time through an fp32 copy when the dtype is 16-bit. */
#define QUANT_CHUNK 256

/* round-half-even(x / s) clamped to [-top, top], or 0 where the block's
 * scale is not positive (zeros, or a non-finite block: code 0 reads back
 * 0 * s). */
static inline float code_of(float x, float s, float top) {
    float r = s > 0.0f ? rintf(x / s) : 0.0f;
    return r > top ? top : r < -top ? -top : r;
}

/* n values (at most a chunk) from index `at` into their codes in q, value
 * i by the scale sv[i] of its block, so one loop covers a run of short
 * blocks (a loop per block of 32 costs more than the block); int4's codes
 * first, then paired into bytes (at is even: blocks are). */
static inline __attribute__((always_inline)) void
encode_each(uint8_t *q, int64_t at, const float *x, int64_t n, const float *sv, hs_quant_fmt f) {
    if (f == HS_QUANT_INT8) {
        for (int64_t i = 0; i < n; i++)
            q[at + i] = (uint8_t)(int8_t)(int32_t)code_of(x[i], sv[i], 127.0f);
    } else if (f == HS_QUANT_INT4) {
        uint8_t c[QUANT_CHUNK];
        for (int64_t i = 0; i < n; i++)
            c[i] = (uint8_t)((uint32_t)(int32_t)code_of(x[i], sv[i], 7.0f) & 0xFu);
        uint8_t *b = q + at / 2;
        for (int64_t j = 0; j < n / 2; j++) b[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
        if (n & 1) b[n / 2] = c[n - 1];
    } else {
        for (int64_t i = 0; i < n; i++) q[at + i] = sv[i] > 0.0f ? e4m3_code(x[i] / sv[i]) : 0;
    }
}

/* Blocks shorter than a chunk: runs of whole blocks a chunk long, each
 * block's scale from its |max|, then one encode over the run. */
static inline __attribute__((always_inline)) void
quantize_small(uint8_t *q, float *scales, const void *src, hs_dtype src_dt, int64_t n,
               int64_t block, hs_quant_fmt f, int64_t b0, int64_t b1, float top) {
    const size_t es = hs_dtype_size(src_dt);
    const int64_t per = QUANT_CHUNK / block;
    float buf[QUANT_CHUNK], sv[QUANT_CHUNK];
    for (int64_t b = b0; b < b1; b += per) {
        int64_t e = b + per < b1 ? b + per : b1, lo = b * block;
        int64_t hi = e * block < n ? e * block : n;
        const float *x = (const float *)((const char *)src + (size_t)lo * es);
        if (src_dt != HS_DTYPE_F32) hs_convert(buf, HS_DTYPE_F32, x, src_dt, hi - lo), x = buf;
        for (int64_t j = b; j < e; j++) {
            int64_t l = j * block - lo, h = (j + 1) * block < n ? (j + 1) * block - lo : n - lo;
            bool finite = true;
            float amax = amax_of(x + l, h - l, &finite), sc = finite ? amax / top : NAN;
            scales[j] = sc;
            for (int64_t i = l; i < h; i++) sv[i] = sc;
        }
        encode_each(q, lo, x, hi - lo, sv, f);
    }
}

static inline __attribute__((always_inline)) void quantize_body(void *packed, const void *src,
                                                                hs_dtype src_dt, int64_t n,
                                                                int64_t block, hs_quant_fmt f,
                                                                int64_t b0, int64_t b1) {
    uint8_t *q = packed;
    float *scales = scales_of(packed, n, f);
    const float top = f == HS_QUANT_INT8 ? 127.0f : f == HS_QUANT_INT4 ? 7.0f : 448.0f;
    const size_t es = hs_dtype_size(src_dt);
    float buf[QUANT_CHUNK], sv[QUANT_CHUNK];
    if (block < QUANT_CHUNK) quantize_small(q, scales, src, src_dt, n, block, f, b0, b1, top);
    /* a block of a chunk or more: its |max| over its chunks, then each
     * chunk encoded (read again) */
    for (int64_t b = block < QUANT_CHUNK ? b1 : b0; b < b1; b++) {
        int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = lo; i < hi; i += QUANT_CHUNK) {
            int64_t k = hi - i < QUANT_CHUNK ? hi - i : QUANT_CHUNK;
            const float *x = (const float *)((const char *)src + (size_t)i * es);
            if (src_dt != HS_DTYPE_F32) hs_convert(buf, HS_DTYPE_F32, x, src_dt, k), x = buf;
            float m = amax_of(x, k, &finite);
            amax = m > amax ? m : amax;
        }
        float sc = finite ? amax / top : NAN;
        scales[b] = sc;
        for (int64_t i = 0; i < QUANT_CHUNK; i++) sv[i] = sc;
        for (int64_t i = lo; i < hi; i += QUANT_CHUNK) {
            int64_t k = hi - i < QUANT_CHUNK ? hi - i : QUANT_CHUNK;
            const float *x = (const float *)((const char *)src + (size_t)i * es);
            if (src_dt != HS_DTYPE_F32) hs_convert(buf, HS_DTYPE_F32, x, src_dt, k), x = buf;
            encode_each(q, i, x, k, sv, f);
        }
    }
    if (b1 * block >= n) /* the last block's owner zeroes the alignment tail */
        for (int64_t i = f == HS_QUANT_INT4 ? (n + 1) / 2 : n; i < codes_bytes(n, f); i++) q[i] = 0;
}

/* The routine and its AVX-512 clone (HS_WIDE, tensor.h): the same bits. */
static void quantize_plain(void *packed, const void *src, hs_dtype src_dt, int64_t n, int64_t block,
                           hs_quant_fmt f, int64_t b0, int64_t b1) {
    quantize_body(packed, src, src_dt, n, block, f, b0, b1);
}

HS_WIDE static void quantize_wide(void *packed, const void *src, hs_dtype src_dt, int64_t n,
                                  int64_t block, hs_quant_fmt f, int64_t b0, int64_t b1) {
    quantize_body(packed, src, src_dt, n, block, f, b0, b1);
}

void hs_quantize_blocks(void *packed, const void *src, hs_dtype src_dt, int64_t n, int64_t block,
                        hs_quant_fmt f, int64_t b0, int64_t b1) {
    /* an int4 block starts at an even value: no byte is two blocks' */
    HS_ASSERT(is_format(f) && (f != HS_QUANT_INT4 || block % 2 == 0));
    (hs_cpu_wide_vectors() ? quantize_wide : quantize_plain)(packed, src, src_dt, n, block, f, b0,
                                                             b1);
}

/* Values at .. at + n of codes q (at most a chunk), each times its
 * block's scale sv[i], added to out (add) or stored. int4: an odd first
 * value alone, then whole bytes (low nibble, then high), so the loop over
 * bytes vectorises, then an odd last value. */
static inline __attribute__((always_inline)) void decode_each(float *out, const uint8_t *q,
                                                              int64_t at, int64_t n,
                                                              const float *sv, hs_quant_fmt f,
                                                              bool add) {
    if (f == HS_QUANT_INT8) {
        for (int64_t i = 0; i < n; i++) {
            float v = (float)(int8_t)q[at + i] * sv[i];
            out[i] = add ? out[i] + v : v;
        }
    } else if (f == HS_QUANT_INT4) {
        int64_t i = 0;
        if (n > 0 && at & 1) {
            float v = int4_at(q, at) * sv[0];
            out[0] = add ? out[0] + v : v;
            i = 1;
        }
        const uint8_t *c = q + ((at + i) >> 1);
        float *o = out + i;
        const float *so = sv + i;
        int64_t pairs = (n - i) / 2;
        for (int64_t j = 0; j < pairs; j++) {
            float lo = int4_value(c[j] & 0xFu) * so[2 * j],
                  hi = int4_value(c[j] >> 4) * so[2 * j + 1];
            o[2 * j] = add ? o[2 * j] + lo : lo;
            o[2 * j + 1] = add ? o[2 * j + 1] + hi : hi;
        }
        if (i + 2 * pairs < n) {
            float v = int4_at(q, at + n - 1) * sv[n - 1];
            out[n - 1] = add ? out[n - 1] + v : v;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float v = e4m3_value(q[at + i]) * sv[i];
            out[i] = add ? out[i] + v : v;
        }
    }
}

/* sv[i] = the scale of value at + i's block, i < m. */
static void fill_scales(float *sv, const float *scales, int64_t at, int64_t m, int64_t block) {
    for (int64_t i = 0; i < m;) {
        int64_t b = (at + i) / block, k = (b + 1) * block - (at + i);
        k = k < m - i ? k : m - i;
        for (int64_t j = 0; j < k; j++) sv[i + j] = scales[b];
        i += k;
    }
}

static inline __attribute__((always_inline)) void dequantize_body(void *dst, hs_dtype dst_dt,
                                                                  const void *packed, int64_t n,
                                                                  int64_t first, int64_t count,
                                                                  int64_t block, hs_quant_fmt f) {
    const uint8_t *q = packed;
    const float *scales = scales_of((void *)packed, n, f);
    const size_t es = hs_dtype_size(dst_dt);
    float buf[QUANT_CHUNK], sv[QUANT_CHUNK];
    for (int64_t i = 0; i < count; i += QUANT_CHUNK) {
        int64_t m = count - i < QUANT_CHUNK ? count - i : QUANT_CHUNK, at = first + i;
        char *out = (char *)dst + (size_t)i * es;
        fill_scales(sv, scales, at, m, block);
        decode_each(dst_dt == HS_DTYPE_F32 ? (float *)out : buf, q, at, m, sv, f, false);
        /* bf16, the common compute dtype, rounded in the same pass */
        if (dst_dt == HS_DTYPE_BF16)
            for (int64_t j = 0; j < m; j++) ((uint16_t *)out)[j] = hs_f32_to_bf16(buf[j]);
        else if (dst_dt != HS_DTYPE_F32) hs_convert(out, dst_dt, buf, HS_DTYPE_F32, m);
    }
}

static void dequantize_plain(void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                             int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    dequantize_body(dst, dst_dt, packed, n, first, count, block, f);
}

HS_WIDE static void dequantize_wide(void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                                    int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    dequantize_body(dst, dst_dt, packed, n, first, count, block, f);
}

void hs_dequantize_range(void *dst, hs_dtype dst_dt, const void *packed, int64_t n, int64_t first,
                         int64_t count, int64_t block, hs_quant_fmt f) {
    HS_ASSERT(is_format(f));
    HS_ASSERT(first >= 0 && count >= 0 && first + count <= n);
    (hs_cpu_wide_vectors() ? dequantize_wide : dequantize_plain)(dst, dst_dt, packed, n, first,
                                                                 count, block, f);
}

static inline __attribute__((always_inline)) void add_body(float *dst, const void *packed,
                                                           int64_t n, int64_t first, int64_t count,
                                                           int64_t block, hs_quant_fmt f) {
    const uint8_t *q = packed;
    const float *scales = scales_of((void *)packed, n, f);
    float sv[QUANT_CHUNK];
    for (int64_t i = 0; i < count; i += QUANT_CHUNK) {
        int64_t m = count - i < QUANT_CHUNK ? count - i : QUANT_CHUNK;
        fill_scales(sv, scales, first + i, m, block);
        decode_each(dst + i, q, first + i, m, sv, f, true);
    }
}

static void add_plain(float *dst, const void *packed, int64_t n, int64_t first, int64_t count,
                      int64_t block, hs_quant_fmt f) {
    add_body(dst, packed, n, first, count, block, f);
}

HS_WIDE static void add_wide(float *dst, const void *packed, int64_t n, int64_t first,
                             int64_t count, int64_t block, hs_quant_fmt f) {
    add_body(dst, packed, n, first, count, block, f);
}

void hs_dequantize_add_f32(float *dst, const void *packed, int64_t n, int64_t first, int64_t count,
                           int64_t block, hs_quant_fmt f) {
    HS_ASSERT(is_format(f));
    HS_ASSERT(first >= 0 && count >= 0 && first + count <= n);
    (hs_cpu_wide_vectors() ? add_wide : add_plain)(dst, packed, n, first, count, block, f);
}
