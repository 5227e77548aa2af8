/* hs_xsum, the exact sum of squares train.reproducibility: layout's
 * gradient norm rests on: the same limbs and value for every order and
 * split of the values (merged as ranks merge theirs), the value within one
 * rounding of a 113-bit reference where that reference is itself exact,
 * subnormals and the largest floats exactly, NaN and infinity kept; and
 * the pairwise trees' order, summed at once (hs_tree_f64, strided too) or
 * built part by part (hs_tree_stack). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/tensor.h"

static uint64_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Values whose exponents span 2^-40 .. 2^40, signs mixed. */
static void fill_wide(float *x, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        double m = (double)(next(&seed) & 0xFFFFFF) / 16777216.0 + 0.5;
        int e = (int)(next(&seed) % 81) - 40;
        x[i] = (float)(ldexp(m, e) * ((next(&seed) & 1) ? -1.0 : 1.0));
    }
}

static hs_xsum sum_of(const float *x, int n) {
    hs_xsum s;
    hs_xsum_init(&s);
    hs_xsum_add_squares(&s, x, n);
    return s;
}

static void test_order_and_split_do_not_change_the_bits(void **state) {
    (void)state;
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    fill_wide(x, N, 7);
    hs_xsum whole = sum_of(x, N);
    /* shuffled, then cut into four uneven pieces merged in reverse order */
    memcpy(y, x, N * sizeof *y);
    uint64_t s = 99;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(next(&s) % (uint64_t)(i + 1));
        float t = y[i];
        y[i] = y[j], y[j] = t;
    }
    int cut[5] = {0, 1, 70001, 150000, N};
    hs_xsum merged;
    hs_xsum_init(&merged);
    for (int k = 3; k >= 0; k--) {
        hs_xsum part = sum_of(y + cut[k], cut[k + 1] - cut[k]);
        hs_xsum_merge(&merged, &part);
    }
    hs_xsum_merge(&whole, &(hs_xsum){0}); /* normalised like merged */
    assert_memory_equal(whole.limb, merged.limb, sizeof whole.limb);
    double a = hs_xsum_value(&whole), b = hs_xsum_value(&merged);
    assert_memory_equal(&a, &b, sizeof a);
    /* a naive double sum of the same squares depends on the order */
    double fx = 0, fy = 0;
    for (int i = 0; i < N; i++) fx += (double)x[i] * x[i], fy += (double)y[i] * y[i];
    print_message("  naive double sums of the two orders differ by %.3g relative\n",
                  fabs(fx - fy) / fx);
    free(x);
    free(y);
}

static void test_value_is_the_exact_sum_rounded(void **state) {
    (void)state;
    /* exponents within 2^-8 .. 2^8: the squares span 2^-16 .. 2^17 and
     * their 48 bits; 4096 of them fit a 113-bit reference exactly */
    enum { N = 4096 };
    float x[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        double m = (double)(next(&s) & 0xFFFFFF) / 16777216.0 + 0.5;
        x[i] = (float)ldexp(m, (int)(next(&s) % 17) - 8);
    }
    __float128 ref = 0;
    for (int i = 0; i < N; i++) ref += (__float128)x[i] * (__float128)x[i];
    hs_xsum sum = sum_of(x, N);
    double v = hs_xsum_value(&sum), r = (double)ref;
    assert_true(fabs(v - r) <= fabs(r) * DBL_EPSILON);
}

static void test_extremes_are_exact(void **state) {
    (void)state;
    float tiny = ldexpf(1.0f, -149), big = FLT_MAX;
    float v[1024];
    for (int i = 0; i < 1024; i++) v[i] = tiny;
    hs_xsum s = sum_of(v, 1024);
    assert_true(hs_xsum_value(&s) == ldexp(1.0, -288)); /* 1024 x 2^-298 */
    s = sum_of(&big, 1);
    assert_true(hs_xsum_value(&s) == (double)big * (double)big);
    float z[3] = {0.0f, -0.0f, 0.0f};
    s = sum_of(z, 3);
    assert_true(hs_xsum_value(&s) == 0.0);
    float w[3] = {1.0f, INFINITY, 2.0f};
    s = sum_of(w, 3);
    assert_true(isinf(hs_xsum_value(&s)));
    w[1] = NAN;
    s = sum_of(w, 3);
    assert_true(isnan(hs_xsum_value(&s)));
}

static void test_tree_adds_pairs_first(void **state) {
    (void)state;
    /* 1e16 + 1 loses the 1; (1 + 1) + (1e16 + ...) shows the order */
    double v[4] = {1.0, 1.0, 1e16, -1e16};
    assert_true(hs_tree_f64(v, 4, 1) == 2.0); /* (1 + 1) + (1e16 - 1e16) */
    double w[3] = {1e16, 1.0, 1.0};
    assert_true(hs_tree_f64(w, 3, 1) == 1e16 + 1.0 + 1.0); /* (1e16 + 1) + 1 */
    assert_true(hs_tree_f64(v, 1, 1) == 1.0);
}

/* Values whose sum shows the order: a stack-built tree gives the bits of
 * hs_tree_f64 over the same values, and a stride reads every other one. */
static void test_tree_stack_builds_the_same_tree(void **state) {
    (void)state;
    double v[8] = {1e16, 1.0, -1e16, 1.0, 3.0, 1e-3, 1e20, -1e20}, slot[5];
    hs_tree_stack st = {.top = 0};
    for (int p = 0; p < 8; p++) {
        int s = st.top;
        slot[s] = v[p];
        int merges = hs_tree_stack_push(&st);
        for (int k = 0; k < merges; k++) slot[s - k - 1] += slot[s - k];
    }
    assert_int_equal(st.top, 1);
    double want = hs_tree_f64(v, 8, 1);
    assert_memory_equal(&slot[0], &want, sizeof want);
    double naive = 0.0;
    for (int p = 0; p < 8; p++) naive += v[p];
    assert_true(naive != want); /* the values tell the orders apart */
    double pairs[8] = {1.0, 9.0, 1.0, 9.0, 1e16, 9.0, -1e16, 9.0};
    assert_true(hs_tree_f64(pairs, 4, 2) == 2.0); /* (1 + 1) + (1e16 - 1e16) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_split_do_not_change_the_bits),
        cmocka_unit_test(test_value_is_the_exact_sum_rounded),
        cmocka_unit_test(test_extremes_are_exact),
        cmocka_unit_test(test_tree_adds_pairs_first),
        cmocka_unit_test(test_tree_stack_builds_the_same_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
