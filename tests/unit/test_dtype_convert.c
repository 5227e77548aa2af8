/* dtype names and the f32 <-> bf16 / f16 conversions: every 16-bit pattern,
 * rounding ties, specials, and random f32 values against a reference built
 * from double arithmetic; the vector hs_convert against the scalar routines
 * bit for bit.
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

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }
static bool f16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }

/* Independent decoders: value from the IEEE fields with ldexp. The all-ones
 * exponent with a zero mantissa decodes to 2^(emax+1), which is exactly the
 * "Inf" candidate the IEEE overflow rule measures distance to. */
static double bf16_decode_ref(uint16_t h) {
    int e = (h >> 7) & 0xFF, m = h & 0x7F;
    double v = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return (h & 0x8000) ? -v : v;
}

static double f16_decode_ref(uint16_t h) {
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Nearest non-negative pattern for |x| among patterns [0, top] (top is the
 * Inf pattern), ties to the even pattern; binary search over the monotone
 * decode. */
static uint16_t nearest_pattern(double ax, uint16_t top, double (*decode)(uint16_t)) {
    uint32_t lo = 0, hi = top;
    if (ax >= decode(top)) return top;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (decode((uint16_t)mid) <= ax) lo = mid;
        else hi = mid;
    }
    double dl = ax - decode((uint16_t)lo), dh = decode((uint16_t)hi) - ax;
    if (dl < dh) return (uint16_t)lo;
    if (dh < dl) return (uint16_t)hi;
    return (uint16_t)((lo & 1) ? hi : lo);
}

static uint16_t bf16_ref(float f) {
    uint16_t s = signbit(f) ? 0x8000 : 0;
    return (uint16_t)(s | nearest_pattern(fabs((double)f), 0x7F80, bf16_decode_ref));
}

static uint16_t f16_ref(float f) {
    uint16_t s = signbit(f) ? 0x8000 : 0;
    return (uint16_t)(s | nearest_pattern(fabs((double)f), 0x7C00, f16_decode_ref));
}

static void test_dtype_names_parse_and_sizes(void **state) {
    (void)state;
    hs_dtype dt;
    assert_string_equal(hs_dtype_name(HS_DTYPE_F32), "float32");
    assert_string_equal(hs_dtype_name(HS_DTYPE_BF16), "bfloat16");
    assert_string_equal(hs_dtype_name(HS_DTYPE_F16), "float16");
    assert_true(hs_dtype_parse("bfloat16", &dt) && dt == HS_DTYPE_BF16);
    assert_true(hs_dtype_parse("bf16", &dt) && dt == HS_DTYPE_BF16);
    assert_true(hs_dtype_parse("fp16", &dt) && dt == HS_DTYPE_F16);
    assert_true(hs_dtype_parse("float32", &dt) && dt == HS_DTYPE_F32);
    assert_true(hs_dtype_parse("fp32", &dt) && dt == HS_DTYPE_F32);
    assert_false(hs_dtype_parse("float64", &dt));
    assert_false(hs_dtype_parse("", &dt));
    assert_false(hs_dtype_parse(NULL, &dt));
    assert_int_equal(hs_dtype_size(HS_DTYPE_F32), 4);
    assert_int_equal(hs_dtype_size(HS_DTYPE_BF16), 2);
    assert_int_equal(hs_dtype_size(HS_DTYPE_F16), 2);
    /* the wire's byte dtype has a name and a size, but no config takes it */
    assert_string_equal(hs_dtype_name(HS_DTYPE_U8), "uint8");
    assert_int_equal(hs_dtype_size(HS_DTYPE_U8), 1);
    assert_false(hs_dtype_parse("uint8", &dt));
    assert_false(hs_dtype_parse("u8", &dt));
    assert_false(hs_dtype_is_float(HS_DTYPE_U8));
}

static void test_bf16_all_65536_patterns_decode_and_round_trip(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hs_bf16_to_f32((uint16_t)h);
        if (bf16_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_true(bf16_is_nan(hs_f32_to_bf16(f)));
            continue;
        }
        if ((h & 0x7FFF) == 0x7F80) assert_true(isinf(f) && (signbit(f) != 0) == (h >> 15));
        else assert_true((double)f == bf16_decode_ref((uint16_t)h));
        assert_int_equal(hs_f32_to_bf16(f), h);
    }
}

static void test_f16_all_65536_patterns_decode_and_round_trip(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hs_f16_to_f32((uint16_t)h);
        if (f16_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_true(f16_is_nan(hs_f32_to_f16(f)));
            continue;
        }
        if ((h & 0x7FFF) == 0x7C00) assert_true(isinf(f) && (signbit(f) != 0) == (h >> 15));
        else assert_true((double)f == f16_decode_ref((uint16_t)h));
        assert_true((signbit(f) != 0) == ((h & 0x8000) != 0));
        assert_int_equal(hs_f32_to_f16(f), h);
    }
}

static void test_bf16_ties_round_to_even_and_overflow_to_inf(void **state) {
    (void)state;
    assert_int_equal(hs_f32_to_bf16(float_of(0x3F808000)), 0x3F80); /* 1 + 2^-8: tie, down */
    assert_int_equal(hs_f32_to_bf16(float_of(0x3F818000)), 0x3F82); /* tie, up to even */
    assert_int_equal(hs_f32_to_bf16(float_of(0x3F808001)), 0x3F81); /* just above the tie */
    assert_int_equal(hs_f32_to_bf16(float_of(0xBF818000)), 0xBF82); /* sign is symmetric */
    assert_int_equal(hs_f32_to_bf16(3.4028235e38f), 0x7F80);        /* FLT_MAX overflows */
    assert_int_equal(hs_f32_to_bf16(float_of(0x7F7F7FFF)), 0x7F7F); /* largest that stays */
    assert_int_equal(hs_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(hs_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(hs_f32_to_bf16(float_of(0x00018000)), 0x0002); /* f32 subnormal tie */
    assert_int_equal(hs_f32_to_bf16(-0.0f), 0x8000);
}

static void test_f16_ties_subnormals_and_overflow(void **state) {
    (void)state;
    assert_int_equal(hs_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);     /* tie, down to even */
    assert_int_equal(hs_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02); /* tie, up to even */
    assert_int_equal(hs_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(hs_f32_to_f16(65519.996f), 0x7BFF);
    assert_int_equal(hs_f32_to_f16(65520.0f), 0x7C00); /* tie at max: odd, so Inf */
    assert_int_equal(hs_f32_to_f16(1e6f), 0x7C00);
    assert_int_equal(hs_f32_to_f16(-1e6f), 0xFC00);
    assert_int_equal(hs_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(hs_f32_to_f16(0x1p-25f), 0x0000); /* tie between 0 and 2^-24 */
    assert_int_equal(hs_f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(hs_f32_to_f16(3 * 0x1p-25f), 0x0002);        /* tie 1|2 -> 2 */
    assert_int_equal(hs_f32_to_f16(5 * 0x1p-25f), 0x0002);        /* tie 2|3 -> 2 */
    assert_int_equal(hs_f32_to_f16(0x1p-14f - 0x1p-30f), 0x0400); /* rounds up to normal */
    assert_int_equal(hs_f32_to_f16(-0x1p-26f), 0x8000);
    assert_int_equal(hs_f32_to_f16(1e-45f), 0x0000);
}

static void test_nan_stays_nan_and_becomes_quiet(void **state) {
    (void)state;
    float snan = float_of(0x7F800001), neg_nan = float_of(0xFFC12345);
    assert_int_equal(hs_f32_to_bf16(snan), 0x7FC0);
    assert_int_equal(hs_f32_to_f16(snan), 0x7E00);
    assert_true(bf16_is_nan(hs_f32_to_bf16(neg_nan)) && (hs_f32_to_bf16(neg_nan) & 0x8000));
    assert_true(f16_is_nan(hs_f32_to_f16(neg_nan)) && (hs_f32_to_f16(neg_nan) & 0x8000));
    assert_true(isnan(hs_f16_to_f32(0x7C01)));
    assert_true(bits_of(hs_f16_to_f32(0x7C01)) & 0x400000u);
    assert_true(isnan(hs_round_to(HS_DTYPE_BF16, NAN)));
    assert_true(isnan(hs_round_to(HS_DTYPE_F16, NAN)));
    assert_true(hs_round_to(HS_DTYPE_F32, 1.2345678f) == 1.2345678f);
    assert_true(hs_round_to(HS_DTYPE_BF16, 1.2345678f) ==
                hs_bf16_to_f32(hs_f32_to_bf16(1.2345678f)));
}

/* Random finite f32 over the whole exponent range. */
static float random_finite(uint64_t *s) {
    for (;;) {
        uint32_t u = (uint32_t)splitmix64(s);
        if ((u & 0x7F800000u) != 0x7F800000u) return float_of(u);
    }
}

static void test_random_f32_match_double_reference(void **state) {
    (void)state;
    uint64_t s = 42;
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x);
    uint16_t *hb = malloc(N * sizeof *hb), *hh = malloc(N * sizeof *hh);
    for (int i = 0; i < N; i++) {
        /* Half the values near 1 (dense ties at the bottom bits), half anywhere. */
        x[i] = (i & 1) ? random_finite(&s)
                       : float_of(0x3F800000u | ((uint32_t)splitmix64(&s) & 0x7FFFFF));
    }
    hs_convert(hb, HS_DTYPE_BF16, x, HS_DTYPE_F32, N);
    hs_convert(hh, HS_DTYPE_F16, x, HS_DTYPE_F32, N);
    for (int i = 0; i < N; i++) {
        uint16_t rb = bf16_ref(x[i]), rh = f16_ref(x[i]);
        if (hs_f32_to_bf16(x[i]) != rb || hb[i] != rb || hs_f32_to_f16(x[i]) != rh || hh[i] != rh)
            fail_msg("x=%a (0x%08x): bf16 ref %04x scalar %04x vector %04x; f16 ref %04x scalar "
                     "%04x vector %04x",
                     (double)x[i], bits_of(x[i]), rb, hs_f32_to_bf16(x[i]), hb[i], rh,
                     hs_f32_to_f16(x[i]), hh[i]);
    }
    free(x), free(hb), free(hh);
}

/* Tie points of both formats: exact halfway values, and one f32 ulp either side. */
static void test_every_bf16_and_f16_tie_matches_reference(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x7F80; h++) {
        double mid = (bf16_decode_ref((uint16_t)h) + bf16_decode_ref((uint16_t)(h + 1))) / 2;
        uint32_t b = bits_of((float)mid);
        for (uint32_t d = b - (b > 0); d <= b + 1; d++)
            assert_int_equal(hs_f32_to_bf16(float_of(d)), bf16_ref(float_of(d)));
    }
    for (uint32_t h = 0; h < 0x7C00; h++) {
        double mid = (f16_decode_ref((uint16_t)h) + f16_decode_ref((uint16_t)(h + 1))) / 2;
        uint32_t b = bits_of((float)mid);
        for (uint32_t d = b - 1; d <= b + 1; d++)
            assert_int_equal(hs_f32_to_f16(float_of(d)), f16_ref(float_of(d)));
    }
}

/* hs_convert (vectorised body + scalar tail) equals the scalar routine, bit
 * for bit, for every 16-bit pattern in both directions. Length 65536+5 puts
 * some patterns in the tail too. */
static void test_convert_vector_equals_scalar_all_16bit_patterns(void **state) {
    (void)state;
    enum { N = 65536 + 5 };
    uint16_t *h = malloc(N * 2), *back = malloc(N * 2), *other = malloc(N * 2);
    float *f = malloc(N * 4);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)((i * 40503u + (i >= 65536)) & 0xFFFF);
    for (int k = 0; k < 2; k++) {
        hs_dtype dt = k ? HS_DTYPE_F16 : HS_DTYPE_BF16, od = k ? HS_DTYPE_BF16 : HS_DTYPE_F16;
        hs_convert(f, HS_DTYPE_F32, h, dt, N);
        hs_convert(back, dt, f, HS_DTYPE_F32, N);
        hs_convert(other, od, h, dt, N);
        for (int i = 0; i < N; i++) {
            float sf = k ? hs_f16_to_f32(h[i]) : hs_bf16_to_f32(h[i]);
            uint16_t sb = k ? hs_f32_to_f16(f[i]) : hs_f32_to_bf16(f[i]);
            uint16_t so = k ? hs_f32_to_bf16(sf) : hs_f32_to_f16(sf);
            if (bits_of(f[i]) != bits_of(sf) || back[i] != sb || other[i] != so)
                fail_msg("%s pattern %04x at %d: widen %08x vs %08x, narrow %04x vs %04x, "
                         "cross %04x vs %04x",
                         hs_dtype_name(dt), h[i], i, bits_of(f[i]), bits_of(sf), back[i], sb,
                         other[i], so);
        }
    }
    free(h), free(back), free(other), free(f);
}

/* Random f32 bit patterns including NaNs with random payloads, signalling
 * NaNs and Infs: vector narrowing equals scalar narrowing. */
static void test_convert_vector_equals_scalar_random_f32_bits_with_nans(void **state) {
    (void)state;
    enum { N = 100007 };
    uint64_t s = 7;
    float *x = malloc(N * 4);
    uint16_t *b = malloc(N * 2), *h = malloc(N * 2);
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)splitmix64(&s);
        if (i % 3 == 0) u |= 0x7F800000u; /* Inf/NaN region, both signs, both NaN kinds */
        x[i] = float_of(u);
    }
    hs_convert(b, HS_DTYPE_BF16, x, HS_DTYPE_F32, N);
    hs_convert(h, HS_DTYPE_F16, x, HS_DTYPE_F32, N);
    for (int i = 0; i < N; i++) {
        if (b[i] != hs_f32_to_bf16(x[i]) || h[i] != hs_f32_to_f16(x[i]))
            fail_msg("0x%08x: bf16 %04x vs %04x, f16 %04x vs %04x", bits_of(x[i]), b[i],
                     hs_f32_to_bf16(x[i]), h[i], hs_f32_to_f16(x[i]));
        if (isnan(x[i])) assert_true(bf16_is_nan(b[i]) && f16_is_nan(h[i]));
    }
    free(x), free(b), free(h);
}

/* Narrowing n fp32 values on path p equals the scalar routines, bit for
 * bit; what differs is named. */
static void check_narrow_on(hs_convert_path p, const float *x, uint16_t *b, uint16_t *h,
                            int64_t n) {
    hs_convert_on(p, b, HS_DTYPE_BF16, x, HS_DTYPE_F32, n);
    hs_convert_on(p, h, HS_DTYPE_F16, x, HS_DTYPE_F32, n);
    for (int64_t i = 0; i < n; i++)
        if (b[i] != hs_f32_to_bf16(x[i]) || h[i] != hs_f32_to_f16(x[i]))
            fail_msg("%s path, 0x%08x at %lld: bf16 %04x vs %04x, f16 %04x vs %04x",
                     hs_convert_path_name(p), bits_of(x[i]), (long long)i, b[i],
                     hs_f32_to_bf16(x[i]), h[i], hs_f32_to_f16(x[i]));
}

/* Every path this build and CPU have against the scalar routines: every
 * high half of an fp32 pattern with low halves at and around the rounding
 * ties (0x7FFF, 0x8000, 0x8001: bf16's), every fp32 subnormal of both signs
 * (which VCVTNEPS2BF16 alone would flush to zero), NaNs and Infs with all
 * payload tops, and each length 1..40 from an odd address (masked and
 * scalar tails). Then both directions of every 16-bit pattern. */
static void test_convert_every_path_equals_scalar_fp32_sweep(void **state) {
    (void)state;
    static const uint16_t lows[] = {0x0000, 0x0001, 0x1000, 0x7FFF, 0x8000,
                                    0x8001, 0xC000, 0xFFFE, 0xFFFF};
    enum { NL = sizeof lows / sizeof lows[0], NS = 1 << 23 };
    const int64_t n = (int64_t)65536 * NL;
    float *x = malloc((size_t)NS * 2 * sizeof(float));
    uint16_t *b = malloc((size_t)NS * 2 * 2), *h = malloc((size_t)NS * 2 * 2);
    assert_non_null(x);
    assert_non_null(b);
    assert_non_null(h);
    printf("hs_convert path on this CPU: %s\n", hs_convert_path_name(hs_convert_best_path()));
    for (int p = 0; p < HS_CONVERT_PATH_COUNT; p++) {
        for (int64_t i = 0; i < n; i++) x[i] = float_of(((uint32_t)(i / NL) << 16) | lows[i % NL]);
        check_narrow_on((hs_convert_path)p, x, b, h, n);
        for (int64_t i = 0; i < 2 * (int64_t)NS; i++) /* subnormals and zeros, both signs */
            x[i] = float_of((uint32_t)(i % NS) | (i >= NS ? 0x80000000u : 0u));
        check_narrow_on((hs_convert_path)p, x, b, h, 2 * (int64_t)NS);
        for (int len = 1; len <= 40; len++) {
            for (int i = 0; i < len + 1; i++)
                x[i] = float_of(i % 3 ? 0x00400000u + (uint32_t)i * 0x9E37u : 0x3F808000u + i);
            check_narrow_on((hs_convert_path)p, x + 1, b + 1, h + 1, len);
        }
        enum { N16 = 65536 + 21 };
        for (int i = 0; i < N16; i++) b[i] = (uint16_t)((i * 40503u + (i >= 65536)) & 0xFFFF);
        for (int k = 0; k < 2; k++) {
            hs_dtype dt = k ? HS_DTYPE_F16 : HS_DTYPE_BF16;
            hs_convert_on((hs_convert_path)p, x, HS_DTYPE_F32, b, dt, N16);
            hs_convert_on((hs_convert_path)p, h, dt, x, HS_DTYPE_F32, N16);
            for (int i = 0; i < N16; i++) {
                float sf = k ? hs_f16_to_f32(b[i]) : hs_bf16_to_f32(b[i]);
                if (bits_of(x[i]) != bits_of(sf) ||
                    h[i] != (k ? hs_f32_to_f16(sf) : hs_f32_to_bf16(sf)))
                    fail_msg("%s path, %s %04x: widen %08x vs %08x, back %04x",
                             hs_convert_path_name((hs_convert_path)p), hs_dtype_name(dt), b[i],
                             bits_of(x[i]), bits_of(sf), h[i]);
            }
        }
    }
    free(x), free(b), free(h);
}

static void test_convert_same_dtype_copies_and_zero_length_is_noop(void **state) {
    (void)state;
    float a[3] = {1, 2, 3}, c[3] = {0};
    hs_convert(c, HS_DTYPE_F32, a, HS_DTYPE_F32, 3);
    assert_memory_equal(a, c, sizeof a);
    hs_convert(a, HS_DTYPE_F32, a, HS_DTYPE_F32, 3);
    assert_true(a[2] == 3.0f);
    hs_convert(NULL, HS_DTYPE_BF16, NULL, HS_DTYPE_F32, 0);
}

/* hs_convert_scaled_f32 gives the bits of hs_convert then hs_scale_f32 for
 * every 16-bit pattern (and fp32 input), across tile boundaries; and
 * hs_add_to_zero_f32 the bits of adding into zeros (-0 becomes +0). */
static void test_convert_scaled_equals_convert_then_scale(void **state) {
    (void)state;
    enum { N = 65536 + 2053 };
    uint16_t *h = malloc(N * 2);
    float *want = malloc(N * 4), *got = malloc(N * 4), *z = malloc(N * 4);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)((i * 40503u + (i >= 65536)) & 0xFFFF);
    const float scales[] = {2.0f, 0.3f, 1.0f, -3.5f};
    for (int k = 0; k < 2; k++) {
        hs_dtype dt = k ? HS_DTYPE_F16 : HS_DTYPE_BF16;
        for (size_t j = 0; j < sizeof scales / sizeof *scales; j++) {
            hs_convert(want, HS_DTYPE_F32, h, dt, N);
            hs_scale_f32(want, scales[j], N);
            memset(got, 0xFF, N * 4);
            hs_convert_scaled_f32(got, h, dt, scales[j], N);
            for (int i = 0; i < N; i++)
                if (bits_of(got[i]) != bits_of(want[i]) && !(isnan(got[i]) && isnan(want[i])))
                    fail_msg("%s %04x * %g: %08x vs %08x", hs_dtype_name(dt), h[i],
                             (double)scales[j], bits_of(got[i]), bits_of(want[i]));
        }
    }
    hs_convert(z, HS_DTYPE_F32, h, HS_DTYPE_BF16, N); /* includes -0 and NaNs */
    hs_convert_scaled_f32(got, z, HS_DTYPE_F32, 0.75f, N);
    memcpy(want, z, N * 4);
    hs_scale_f32(want, 0.75f, N);
    for (int i = 0; i < N; i++)
        assert_true(bits_of(got[i]) == bits_of(want[i]) || (isnan(got[i]) && isnan(want[i])));
    memset(want, 0, N * 4);
    hs_add_f32(want, z, N);
    memset(got, 0xFF, N * 4);
    hs_add_to_zero_f32(got, z, N);
    for (int i = 0; i < N; i++)
        assert_true(bits_of(got[i]) == bits_of(want[i]) || (isnan(got[i]) && isnan(want[i])));
    float mz = -0.0f, out = 1.0f;
    hs_add_to_zero_f32(&out, &mz, 1);
    assert_true(bits_of(out) == 0u); /* as 0 + -0 */
    free(h), free(want), free(got), free(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_names_parse_and_sizes),
        cmocka_unit_test(test_bf16_all_65536_patterns_decode_and_round_trip),
        cmocka_unit_test(test_f16_all_65536_patterns_decode_and_round_trip),
        cmocka_unit_test(test_bf16_ties_round_to_even_and_overflow_to_inf),
        cmocka_unit_test(test_f16_ties_subnormals_and_overflow),
        cmocka_unit_test(test_nan_stays_nan_and_becomes_quiet),
        cmocka_unit_test(test_random_f32_match_double_reference),
        cmocka_unit_test(test_every_bf16_and_f16_tie_matches_reference),
        cmocka_unit_test(test_convert_vector_equals_scalar_all_16bit_patterns),
        cmocka_unit_test(test_convert_vector_equals_scalar_random_f32_bits_with_nans),
        cmocka_unit_test(test_convert_every_path_equals_scalar_fp32_sweep),
        cmocka_unit_test(test_convert_same_dtype_copies_and_zero_length_is_noop),
        cmocka_unit_test(test_convert_scaled_equals_convert_then_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
