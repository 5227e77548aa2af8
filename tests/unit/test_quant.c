/* The block quantization of FSDP's compressed all-gather and reduction
 * (tensor.h): the e4m3 code against a decoder built from its definition
 * (every pattern, ties to even, saturation), int4's nibbles (the layout,
 * ties to even, the clamp), and the packed format against its promises:
 * the layout's size, each value within half a step of its block's scale,
 * zeros exact, a non-finite block read back as NaN, any range dequantized
 * alone equal to the same values of the whole, every float source and
 * destination dtype, and the accumulating read-back equal to a read-back
 * then an add.
 * HS_TEST_TIERS: avx2 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/tensor.h"

/* e4m3 by its definition: bias 7, 3 mantissa bits, subnormals, 0x7F NaN. */
static double e4m3_value(unsigned c) {
    unsigned e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + m, (int)e - 10);
    return c & 0x80 ? -v : v;
}

static void test_e4m3_every_code_decodes_and_round_trips(void **state) {
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        float v = hs_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == e4m3_value(c));
        assert_int_equal(hs_f32_to_e4m3(v), c);
    }
    assert_true(hs_e4m3_to_f32(0x7E) == 448.0f);
}

static void test_e4m3_rounds_to_nearest_even_and_saturates(void **state) {
    (void)state;
    /* Between each pair of neighbouring finite codes: the midpoint goes to
     * the even code, a hair either side to the nearer one. */
    for (unsigned c = 0; c < 0x7E; c++) {
        double lo = e4m3_value(c), hi = e4m3_value(c + 1), mid = (lo + hi) / 2;
        unsigned even = (c & 1) ? c + 1 : c;
        assert_int_equal(hs_f32_to_e4m3((float)mid), even);
        assert_int_equal(hs_f32_to_e4m3(nextafterf((float)mid, 0.0f)), c);
        assert_int_equal(hs_f32_to_e4m3(nextafterf((float)mid, INFINITY)), c + 1);
        assert_int_equal(hs_f32_to_e4m3((float)-mid), 0x80 | even);
    }
    assert_int_equal(hs_f32_to_e4m3(464.0f), 0x7E); /* past the top: saturates */
    assert_int_equal(hs_f32_to_e4m3(1e30f), 0x7E);
    assert_int_equal(hs_f32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(hs_f32_to_e4m3(NAN) & 0x7F, 0x7F);
    assert_int_equal(hs_f32_to_e4m3(0x1p-11f), 0); /* under half the smallest step */
}

static float value_at(uint64_t i) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + 7;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return (float)((double)(x >> 40) / (double)(1 << 24) * 2.0 - 1.0) * (1.0f + (float)(i % 13));
}

/* The bytes of n codes in format f: one each, half a one for int4. */
static int64_t code_bytes(hs_quant_fmt f, int64_t n) {
    return f == HS_QUANT_INT4 ? (n + 1) / 2 : n;
}

static float top_of(hs_quant_fmt f) {
    return f == HS_QUANT_INT8 ? 127.0f : f == HS_QUANT_INT4 ? 7.0f : 448.0f;
}

static void check_format(hs_quant_fmt f, hs_dtype src_dt, hs_dtype dst_dt, int64_t n,
                         int64_t block) {
    size_t es = hs_dtype_size(src_dt), ds = hs_dtype_size(dst_dt);
    float *x = malloc((size_t)n * sizeof *x + 4);
    void *src = malloc((size_t)n * es + 4), *dst = malloc((size_t)n * ds + 4);
    void *part = malloc((size_t)n * ds + 4);
    size_t pb = hs_quant_packed_bytes(n, block, f);
    uint8_t *packed = malloc(pb + 4);
    for (int64_t i = 0; i < n; i++) x[i] = value_at((uint64_t)i);
    for (int64_t i = block; i < 2 * block && i < n; i++) x[i] = 0.0f; /* a block of zeros */
    hs_convert(src, src_dt, x, HS_DTYPE_F32, n);
    hs_convert(x, HS_DTYPE_F32, src, src_dt, n); /* what the source holds */
    memset(packed, 0xAB, pb);
    int64_t blocks = (n + block - 1) / block;
    hs_quantize_blocks(packed, src, src_dt, n, block, f, 0, blocks / 2);
    hs_quantize_blocks(packed, src, src_dt, n, block, f, blocks / 2, blocks);
    assert_int_equal(pb % 4, 0);
    int64_t cb = code_bytes(f, n), padded = (cb + 3) / 4 * 4;
    assert_int_equal(pb, (size_t)padded + 4 * (size_t)blocks);
    for (int64_t i = cb; i < padded; i++) assert_int_equal(packed[i], 0);
    if (f == HS_QUANT_INT4 && n % 2) assert_int_equal(packed[cb - 1] >> 4, 0);
    const float *scales = (const float *)(packed + padded);
    hs_dequantize_range(dst, dst_dt, packed, n, 0, n, block, f);
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0.0f;
        for (int64_t i = lo; i < hi; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = amax / top_of(f);
        assert_true(scales[b] == s);
        for (int64_t i = lo; i < hi; i++) {
            float got = 0.0f;
            hs_convert(&got, HS_DTYPE_F32, (const char *)dst + (size_t)i * ds, dst_dt, 1);
            /* int8: half a step of s; e4m3: half a step of its 3-bit
             * mantissa (2^-4 relative) or of the subnormal grid (2^-10 s);
             * then the destination dtype's rounding of the product. */
            double step = f != HS_QUANT_FP8_E4M3 ? 0.5 * s
                                                 : fmax(fabs(x[i]) * 0x1p-4, 0x1p-10 * (double)s);
            double rnd = dst_dt == HS_DTYPE_F32 ? 1e-7 : dst_dt == HS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
            double err = fabs((double)got - x[i]);
            if (err > step * (1 + 1e-6) + rnd * fabs((double)got))
                fail_msg("%s %s->%s n=%lld block=%lld: value %lld is %.9g, read back %.9g "
                         "(scale %.9g)",
                         hs_quant_fmt_name(f), hs_dtype_name(src_dt), hs_dtype_name(dst_dt),
                         (long long)n, (long long)block, (long long)i, x[i], got, s);
            if (x[i] == 0.0f) assert_true(got == 0.0f);
        }
    }
    /* Any range alone: the same bits as the same values of the whole. */
    int64_t first = n / 3, count = n - n / 3 - n / 5;
    hs_dequantize_range(part, dst_dt, packed, n, first, count, block, f);
    assert_memory_equal(part, (const char *)dst + (size_t)first * ds, (size_t)count * ds);
    free(x), free(src), free(dst), free(part), free(packed);
}

static void test_packed_blocks_read_back_within_half_a_step(void **state) {
    (void)state;
    const int64_t sizes[][2] = {{1, 2}, {7, 4}, {256, 128}, {1000, 256}, {4099, 64}, {3, 256}};
    for (int f = HS_QUANT_INT8; f < HS_QUANT_FMT_COUNT; f++)
        for (int sd = 0; sd < 3; sd++)
            for (int dd = 0; dd < 3; dd++)
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
                    check_format((hs_quant_fmt)f, (hs_dtype)sd, (hs_dtype)dd, sizes[k][0],
                                 sizes[k][1]);
    check_format(HS_QUANT_INT8, HS_DTYPE_F32, HS_DTYPE_F32, 9, 1); /* a block a value */
}

/* int4 by its definition: value 2k in the low nibble of byte k, two's
 * complement in [-7, 7], round-half-even of x / (amax / 7). */
static void test_int4_nibbles_ties_and_clamp(void **state) {
    (void)state;
    /* amax 7: s = 1, so the codes are the rounded values themselves */
    float x[10] = {7.0f, -7.0f, 0.5f, 1.5f, -2.5f, 3.49f, -0.5f, 6.5f, 2.0f, -1.0f};
    int want[10] = {7, -7, 0, 2, -2, 3, 0, 6, 2, -1};
    uint8_t packed[64];
    float out[10];
    hs_quantize_blocks(packed, x, HS_DTYPE_F32, 10, 10, HS_QUANT_INT4, 0, 1);
    hs_quantize_blocks(packed, x, HS_DTYPE_F32, 10, 10, HS_QUANT_INT4, 0, 1);
    for (int i = 0; i < 10; i++) {
        int nib = i & 1 ? packed[i / 2] >> 4 : packed[i / 2] & 15;
        assert_int_equal(nib >= 8 ? nib - 16 : nib, want[i]);
    }
    assert_true(*(const float *)(packed + 8) == 1.0f); /* 5 bytes of codes, padded to 8 */
    hs_dequantize_range(out, HS_DTYPE_F32, packed, 10, 0, 10, 10, HS_QUANT_INT4);
    for (int i = 0; i < 10; i++) assert_true(out[i] == (float)want[i]);
    /* the odd range from an odd value, alone */
    hs_dequantize_range(out, HS_DTYPE_F32, packed, 10, 3, 5, 10, HS_QUANT_INT4);
    for (int i = 0; i < 5; i++) assert_true(out[i] == (float)want[3 + i]);
    assert_string_equal(hs_quant_fmt_name(HS_QUANT_INT4), "int4");
    assert_int_equal(hs_quant_packed_bytes(9, 4, HS_QUANT_INT4), 8 + 4 * 3);
}

static void test_non_finite_block_reads_back_nan_and_others_stay(void **state) {
    (void)state;
    float x[12] = {1, 2, 3, 4, 5, INFINITY, 7, 8, 9, 10, NAN, 12};
    uint8_t packed[64];
    float out[12];
    for (int f = HS_QUANT_INT8; f < HS_QUANT_FMT_COUNT; f++) {
        hs_quantize_blocks(packed, x, HS_DTYPE_F32, 12, 4, (hs_quant_fmt)f, 0, 3);
        hs_dequantize_range(out, HS_DTYPE_F32, packed, 12, 0, 12, 4, (hs_quant_fmt)f);
        for (int i = 0; i < 4; i++) /* half a step of the finite block's grid */
            assert_true(fabsf(out[i] - x[i]) <=
                        (f != HS_QUANT_FP8_E4M3 ? 2.0f / top_of((hs_quant_fmt)f) : x[i] * 0x1p-4f) *
                            1.0001f);
        for (int i = 4; i < 12; i++) assert_true(isnan(out[i]));
    }
    assert_string_equal(hs_quant_fmt_name(HS_QUANT_FP8_E4M3), "fp8_e4m3");
    assert_int_equal(hs_quant_packed_bytes(0, 8, HS_QUANT_INT8), 0);
}

static void test_dequantize_add_is_dequantize_then_add(void **state) {
    (void)state;
    enum { N = 1000, B = 64 };
    float x[N], acc[N], want[N], piece[N];
    uint8_t packed[N + 4 * (N / B + 1) + 4];
    for (int f = HS_QUANT_INT8; f < HS_QUANT_FMT_COUNT; f++) {
        for (int i = 0; i < N; i++) x[i] = value_at((uint64_t)i + 99), acc[i] = value_at(i);
        memcpy(want, acc, sizeof want);
        hs_quantize_blocks(packed, x, HS_DTYPE_F32, N, B, (hs_quant_fmt)f, 0, (N + B - 1) / B);
        hs_dequantize_range(piece, HS_DTYPE_F32, packed, N, 100, 800, B, (hs_quant_fmt)f);
        hs_add_f32(want + 7, piece, 800);
        hs_dequantize_add_f32(acc + 7, packed, N, 100, 800, B, (hs_quant_fmt)f);
        assert_memory_equal(acc, want, sizeof acc);
    }
}

/* Every code and every value read back, against the format's definition
 * written out here one value at a time: int8 and int4 codes are
 * round-half-even(x / s) clamped, e4m3's hs_f32_to_e4m3(x / s), values
 * code * s, added to fp32 in one rounding. Natively this holds the
 * AVX-512 clones (HS_WIDE) where the CPU has them, at the avx2 tier the
 * x86-64-v3 loops: both equal the definition, and each other. Ranges
 * start and end on odd values (int4's half bytes). */
static void codes_and_values_at(int64_t B) {
    enum { N = 4099 };
    const int64_t NB = (N + B - 1) / B;
    float x[N], back[N], acc[N];
    uint8_t packed[N + 4 * N + 4];
    for (int f = HS_QUANT_INT8; f < HS_QUANT_FMT_COUNT; f++) {
        hs_quant_fmt fmt = (hs_quant_fmt)f;
        for (int i = 0; i < N; i++) x[i] = value_at((uint64_t)i + 7 * (uint64_t)f);
        hs_quantize_blocks(packed, x, HS_DTYPE_F32, N, B, fmt, 0, NB);
        const float *scales = (const float *)(packed + (code_bytes(fmt, N) + 3) / 4 * 4);
        for (int i = 0; i < N; i++) {
            float s = scales[i / B], r = rintf(x[i] / s), top = top_of(fmt);
            r = r > top ? top : r < -top ? -top : r;
            int code;
            float want;
            if (fmt == HS_QUANT_FP8_E4M3) {
                code = packed[i];
                assert_int_equal(code, hs_f32_to_e4m3(x[i] / s));
                want = hs_e4m3_to_f32((uint8_t)code) * s;
            } else {
                int nib = i & 1 ? packed[i / 2] >> 4 : packed[i / 2] & 15;
                code = fmt == HS_QUANT_INT8 ? (int8_t)packed[i] : nib >= 8 ? nib - 16 : nib;
                assert_int_equal(code, (int)r);
                want = (float)code * s;
            }
            back[i] = want;
        }
        float got[N];
        hs_dequantize_range(got, HS_DTYPE_F32, packed, N, 0, N, B, fmt);
        assert_memory_equal(got, back, sizeof got);
        for (int i = 0; i < N; i++) acc[i] = x[i];
        hs_dequantize_add_f32(acc + 1, packed, N, 301, N - 302, B, fmt);
        for (int i = 0; i < N - 302; i++)
            if (acc[1 + i] != x[1 + i] + back[301 + i])
                fail_msg("%s add at %d: %a, want %a", hs_quant_fmt_name(fmt), 301 + i,
                         (double)acc[1 + i], (double)(x[1 + i] + back[301 + i]));
    }
}

/* Blocks of a chunk (256 values) and more take one path, shorter ones
 * another (runs of whole blocks, a scale a value): both, and an uneven
 * block. */
static void test_codes_and_values_equal_the_definition_bitwise(void **state) {
    (void)state;
    const int64_t blocks[] = {256, 512, 32, 6, 2};
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) codes_and_values_at(blocks[k]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_every_code_decodes_and_round_trips),
        cmocka_unit_test(test_e4m3_rounds_to_nearest_even_and_saturates),
        cmocka_unit_test(test_packed_blocks_read_back_within_half_a_step),
        cmocka_unit_test(test_int4_nibbles_ties_and_clamp),
        cmocka_unit_test(test_non_finite_block_reads_back_nan_and_others_stay),
        cmocka_unit_test(test_dequantize_add_is_dequantize_then_add),
        cmocka_unit_test(test_codes_and_values_equal_the_definition_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
