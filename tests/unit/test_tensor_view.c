/* The hs_tensor view (shape math, dim-0 narrowing, shape strings) and the
 * fp32 elementwise and reduction kernels. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/tensor.h"

static void test_tensor_numel_bytes_and_row_numel(void **state) {
    (void)state;
    uint16_t buf[2 * 3 * 4];
    int64_t shape[3] = {2, 3, 4};
    hs_tensor t = hs_tensor_make(buf, HS_DTYPE_BF16, 3, shape);
    assert_int_equal(hs_tensor_numel(&t), 24);
    assert_int_equal(hs_tensor_bytes(&t), 48);
    assert_int_equal(hs_tensor_row_numel(&t), 12);
    hs_tensor v = hs_tensor_make(buf, HS_DTYPE_F32, 1, (int64_t[]){5});
    assert_int_equal(hs_tensor_row_numel(&v), 1);
    hs_tensor s = hs_tensor_make(buf, HS_DTYPE_F32, 0, NULL);
    assert_int_equal(hs_tensor_numel(&s), 1); /* a scalar */
}

static void test_narrow0_rows_2_to_4_of_5x3_bf16_points_at_row_2(void **state) {
    (void)state;
    uint16_t buf[5 * 3];
    hs_tensor t = hs_tensor_make(buf, HS_DTYPE_BF16, 2, (int64_t[]){5, 3});
    hs_tensor n = hs_tensor_narrow0(&t, 2, 2);
    assert_ptr_equal(n.data, buf + 6);
    assert_int_equal(n.shape[0], 2);
    assert_int_equal(n.shape[1], 3);
    assert_int_equal(n.dtype, HS_DTYPE_BF16);
    hs_tensor e = hs_tensor_narrow0(&t, 5, 0);
    assert_ptr_equal(e.data, buf + 15);
    assert_int_equal(hs_tensor_numel(&e), 0);
}

static void test_shape_str_formats_and_truncates_safely(void **state) {
    (void)state;
    char buf[32], tiny[5];
    assert_string_equal(hs_shape_str(2, (int64_t[]){4, 16}, buf, sizeof buf), "[4, 16]");
    assert_string_equal(hs_shape_str(0, NULL, buf, sizeof buf), "[]");
    assert_string_equal(hs_shape_str(1, (int64_t[]){7}, buf, sizeof buf), "[7]");
    hs_shape_str(3, (int64_t[]){1000, 2000, 3000}, tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), 4);
}

static void test_elementwise_fill_add_axpy_scale(void **state) {
    (void)state;
    float y[9], x[9];
    hs_fill_f32(y, 9, 2.0f);
    for (int i = 0; i < 9; i++) x[i] = (float)i;
    hs_add_f32(y, x, 9);         /* 2 + i */
    hs_axpy_f32(y, -0.5f, x, 9); /* 2 + i/2 */
    hs_scale_f32(y, 4.0f, 9);    /* 8 + 2i */
    for (int i = 0; i < 9; i++) assert_true(y[i] == 8.0f + 2.0f * (float)i);
}

static void test_reductions_accumulate_in_double(void **state) {
    (void)state;
    /* 2^24 + 1 + 1 + ...: an fp32 accumulator would lose every 1. */
    float x[1001];
    x[0] = 16777216.0f;
    for (int i = 1; i < 1001; i++) x[i] = 1.0f;
    assert_true(hs_sum_f32(x, 1001) == 16778216.0);
    float y[3] = {3, -4, 0};
    assert_true(hs_sumsq_f32(y, 3) == 25.0);
    assert_true(hs_max_abs_f32(y, 3) == 4.0f);
    assert_true(hs_sum_f32(y, 0) == 0.0);
}

/* The first NaN / infinity of 300,000 values (blocks of 4096 over the
 * threads): at element 0, at a block's last and next block's first
 * element, deep in the tail, with later ones behind it, on one thread and
 * two; -1 when all are finite (the largest finite value included). */
static void test_first_nonfinite_is_the_first_whatever_the_threads(void **state) {
    (void)state;
    enum { N = 300000 };
    static float x[N];
    const int64_t at[] = {0, 4095, 4096, 123457, N - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY, NAN, -INFINITY};
    int threads0 = hs_blas_get_threads();
    for (int t = 1; t <= 2; t++) {
        hs_blas_set_threads(t);
        for (int64_t i = 0; i < N; i++) x[i] = (float)(i % 97) - 48.0f;
        x[77] = 3.4028235e38f;
        assert_int_equal(hs_first_nonfinite_f32(x, N), -1);
        assert_int_equal(hs_first_nonfinite_f32(x, 0), -1);
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            x[at[k]] = bad[k];
            if (at[k] + 5 < N) x[at[k] + 5] = NAN; /* a later one must not win */
            assert_int_equal(hs_first_nonfinite_f32(x, N), at[k]);
            assert_int_equal(hs_first_nonfinite_f32(x + at[k] + 1, N - at[k] - 1),
                             at[k] + 5 < N ? 4 : -1);
            x[at[k]] = 1.0f;
            if (at[k] + 5 < N) x[at[k] + 5] = 1.0f;
        }
    }
    hs_blas_set_threads(threads0);
}

static void test_max_abs_and_rel_diff_do_not_hide_nan(void **state) {
    (void)state;
    float a[3] = {1, NAN, 2}, b[3] = {1, 1, 2}, c[3] = {1.1f, 1, 2};
    assert_true(isnan(hs_max_abs_f32(a, 3)));
    assert_true(isinf(hs_max_rel_diff_f32(a, b, 3, 1e-6)));
    assert_true(isinf(hs_max_rel_diff_f32(b, a, 3, 1e-6)));
    assert_true(hs_max_rel_diff_f32(b, b, 3, 1e-6) == 0.0);
    assert_true(fabs(hs_max_rel_diff_f32(c, b, 3, 1e-6) - 0.1) < 1e-6);
    float z[1] = {0}, w[1] = {1e-3f};
    assert_true(fabs(hs_max_rel_diff_f32(w, z, 1, 1.0) - 1e-3) < 1e-9); /* floor applies */
    float inf1[1] = {INFINITY};
    assert_true(hs_max_rel_diff_f32(inf1, inf1, 1, 1e-6) == 0.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_numel_bytes_and_row_numel),
        cmocka_unit_test(test_narrow0_rows_2_to_4_of_5x3_bf16_points_at_row_2),
        cmocka_unit_test(test_shape_str_formats_and_truncates_safely),
        cmocka_unit_test(test_elementwise_fill_add_axpy_scale),
        cmocka_unit_test(test_reductions_accumulate_in_double),
        cmocka_unit_test(test_max_abs_and_rel_diff_do_not_hide_nan),
        cmocka_unit_test(test_first_nonfinite_is_the_first_whatever_the_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
