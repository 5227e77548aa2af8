/* The device profile (src/device/profile.c): absent unless installed,
 * silent while disabled, and once enabled every call of the installing
 * thread lands in its class with its work, GEMMs in the class the labeller
 * names, elementwise calls in the phase's class, calls from another thread
 * counted as untimed. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "hypershard/device.h"

enum { N = 64 };

typedef struct fixture {
    hs_device *d;
    float *a, *b, *c;
} fixture;

static fixture make(bool install) {
    fixture f = {0};
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &f.d, &e), HS_OK);
    if (install) assert_int_equal(hs_device_profile_install(f.d, &e), HS_OK);
    f.a = hs_device_alloc(f.d, N * N * sizeof(float));
    f.b = hs_device_alloc(f.d, N * N * sizeof(float));
    f.c = hs_device_alloc(f.d, N * N * sizeof(float));
    hs_dev_fill(f.d, f.a, N * N, 1.0f);
    hs_dev_fill(f.d, f.b, N * N, 2.0f);
    return f;
}

static void drop(fixture *f) {
    hs_device_free_mem(f->d, f->a), hs_device_free_mem(f->d, f->b), hs_device_free_mem(f->d, f->c);
    hs_device_free(f->d);
}

static void gemm(fixture *f) {
    hs_dev_gemm(f->d, false, false, N, N, N, 1.0f, f->a, HS_DTYPE_F32, N, f->b, HS_DTYPE_F32, N,
                0.0f, f->c, HS_DTYPE_F32, N);
}

static int64_t total_calls(const hs_prof_stats *st) {
    int64_t n = 0;
    for (int c = 0; c < HS_PROF_CLASS_COUNT; c++) n += st->c[c].calls;
    return n;
}

static void test_not_installed_nothing_is_wrapped(void **state) {
    (void)state;
    fixture f = make(false);
    const hs_device_kernels *k = f.d->k;
    assert_null(f.d->profile);
    hs_device_profile_enable(f.d, true); /* no-ops without a profile */
    hs_device_profile_set_phase(f.d, HS_PROF_OPTIMIZER);
    gemm(&f);
    assert_ptr_equal(f.d->k, k);
    hs_prof_stats st;
    hs_device_profile_get(f.d, &st);
    assert_int_equal(total_calls(&st), 0);
    drop(&f);
}

static void test_disabled_profile_counts_nothing(void **state) {
    (void)state;
    fixture f = make(true);
    assert_non_null(f.d->profile);
    gemm(&f);
    hs_dev_scale(f.d, f.c, 0.5f, N * N);
    hs_prof_stats st;
    hs_device_profile_get(f.d, &st);
    assert_int_equal(total_calls(&st), 0);
    drop(&f);
}

static hs_prof_class label_by_b(void *ctx, const void *C, const void *A, const void *B,
                                const hs_gemm_shape *g) {
    (void)C, (void)A, (void)g;
    return B == ctx ? HS_PROF_GEMM_DOWN : HS_PROF_GEMM_OTHER;
}

static void test_enabled_profile_times_each_class(void **state) {
    (void)state;
    fixture f = make(true);
    hs_device_profile_enable(f.d, true);
    gemm(&f); /* no labeller: other */
    hs_device_profile_set_labeller(f.d, label_by_b, f.b);
    gemm(&f);
    hs_dev_scale(f.d, f.c, 0.5f, N * N);
    hs_dev_convert(f.d, f.a, HS_DTYPE_BF16, f.c, HS_DTYPE_F32, N * N);
    hs_device_profile_set_phase(f.d, HS_PROF_OPTIMIZER);
    hs_dev_scale(f.d, f.c, 0.5f, N * N); /* elementwise: the phase's */
    hs_dev_zero(f.d, f.c, N * N * sizeof(float));
    hs_dev_convert(f.d, f.a, HS_DTYPE_BF16, f.c, HS_DTYPE_F32, N * N); /* a cast stays one */
    hs_device_profile_set_phase(f.d, -1);
    hs_device_profile_add(f.d, HS_PROF_COMM_WAIT, 0.25, 0.0);
    hs_prof_stats st;
    hs_device_profile_get(f.d, &st);
    assert_int_equal(st.c[HS_PROF_GEMM_OTHER].calls, 1);
    assert_int_equal(st.c[HS_PROF_GEMM_DOWN].calls, 1);
    assert_true(st.c[HS_PROF_GEMM_DOWN].flops == 2.0 * N * N * N);
    assert_true(st.c[HS_PROF_GEMM_DOWN].seconds > 0.0);
    assert_int_equal(st.c[HS_PROF_ELEMENTWISE].calls, 1);
    assert_true(st.c[HS_PROF_ELEMENTWISE].bytes == 8.0 * N * N);
    assert_int_equal(st.c[HS_PROF_CAST].calls, 2);
    assert_true(st.c[HS_PROF_CAST].bytes == 2 * 6.0 * N * N);
    assert_int_equal(st.c[HS_PROF_OPTIMIZER].calls, 2);
    assert_int_equal(st.c[HS_PROF_COMM_WAIT].calls, 1);
    assert_true(st.c[HS_PROF_COMM_WAIT].seconds == 0.25);
    assert_int_equal(total_calls(&st), 8);
    assert_int_equal(st.untimed_calls, 0);
    hs_device_profile_reset(f.d);
    hs_device_profile_get(f.d, &st);
    assert_int_equal(total_calls(&st), 0);
    drop(&f);
}

static void *gemm_thread(void *arg) {
    gemm(arg);
    return NULL;
}

static void test_other_threads_calls_are_not_timed(void **state) {
    (void)state;
    fixture f = make(true);
    hs_device_profile_enable(f.d, true);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, gemm_thread, &f), 0);
    pthread_join(t, NULL);
    hs_prof_stats st;
    hs_device_profile_get(f.d, &st);
    assert_int_equal(total_calls(&st), 0);
    assert_int_equal(st.untimed_calls, 1);
    drop(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_installed_nothing_is_wrapped),
        cmocka_unit_test(test_disabled_profile_counts_nothing),
        cmocka_unit_test(test_enabled_profile_times_each_class),
        cmocka_unit_test(test_other_threads_calls_are_not_timed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
