/* The cpu device: pool accounting, copies, the trace record of each copy,
 * the error for a CUDA request in a build without CUDA, its casts split
 * over threads, and the note a backend leaves for the log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/device_backend.h"
#include "hypershard/device.h"
#include "hypershard/tensor.h"

static hs_device *make_cpu(hs_trace *trace) {
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, trace, &d, &e), HS_OK);
    assert_non_null(d);
    return d;
}

static void test_kind_names_and_parse(void **state) {
    (void)state;
    hs_device_kind k;
    assert_string_equal(hs_device_kind_name(HS_DEVICE_CPU), "cpu");
    assert_string_equal(hs_device_kind_name(HS_DEVICE_CUDA), "cuda");
    assert_true(hs_device_kind_parse("cuda", &k) && k == HS_DEVICE_CUDA);
    assert_true(hs_device_kind_parse("cpu", &k) && k == HS_DEVICE_CPU);
    assert_false(hs_device_kind_parse("tpu", &k));
    assert_false(hs_device_kind_parse(NULL, &k));
}

/* Where cuda cannot open (a build without the backend, or a machine
 * without a GPU), creating it is a configuration error that says why and
 * points to cpu. */
static void test_cuda_that_cannot_open_is_config_error_pointing_to_cpu(void **state) {
    (void)state;
    hs_device *d = (hs_device *)(uintptr_t)1;
    hs_error e;
    hs_error_clear(&e);
    hs_status s = hs_device_create(HS_DEVICE_CUDA, NULL, &d, &e);
    if (s == HS_OK) { /* a GPU is here */
        assert_true(hs_device_kind_compiled(HS_DEVICE_CUDA));
        assert_false(d->host_visible);
        hs_device_free(d);
        return;
    }
    assert_int_equal(s, HS_ERR_CONFIG);
    assert_null(d);
    assert_int_equal(e.code, HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, hs_device_kind_compiled(HS_DEVICE_CUDA)
                                      ? "no CUDA device is visible"
                                      : "no CUDA backend"));
    assert_non_null(strstr(e.msg, "accelerator.device: cpu"));
    assert_int_equal(hs_status_exit_code(e.code), 2);
}

static void test_device_and_host_pools_count_current_and_peak_separately(void **state) {
    (void)state;
    hs_device *d = make_cpu(NULL);
    assert_string_equal(d->name, "cpu");
    void *a = hs_device_alloc(d, 1000), *b = hs_device_alloc(d, 24);
    void *h = hs_host_alloc(d, 500);
    assert_int_equal((uintptr_t)a % HS_ALIGN, 0);
    assert_int_equal(hs_pool_current(&d->device_pool), 1024);
    assert_int_equal(hs_pool_current(&d->host_pool), 500);
    hs_device_free_mem(d, a);
    assert_int_equal(hs_pool_current(&d->device_pool), 24);
    assert_int_equal(hs_pool_peak(&d->device_pool), 1024);
    void *c = hs_device_alloc(d, 100);
    assert_int_equal(hs_pool_peak(&d->device_pool), 1024); /* 124 < earlier peak */
    hs_pool_reset_peak(&d->device_pool);
    assert_int_equal(hs_pool_peak(&d->device_pool), 124);
    hs_host_free(d, h);
    assert_int_equal(hs_pool_current(&d->host_pool), 0);
    assert_int_equal(hs_pool_peak(&d->host_pool), 500);
    hs_device_free_mem(d, b);
    hs_device_free_mem(d, c);
    hs_device_free_mem(d, NULL);
    assert_int_equal(hs_pool_current(&d->device_pool), 0);
    hs_device_free(d);
}

static void test_h2d_d2h_d2d_copies_move_every_byte(void **state) {
    (void)state;
    hs_device *d = make_cpu(NULL);
    enum { N = 4099 };
    unsigned char *h = hs_host_alloc(d, N), *back = hs_host_alloc(d, N);
    unsigned char *x = hs_device_alloc(d, N), *y = hs_device_alloc(d, N);
    for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 31 + 7);
    hs_device_copy(d, x, h, N, HS_COPY_H2D);
    hs_device_copy(d, y, x, N, HS_COPY_D2D);
    memset(back, 0, N);
    hs_device_copy(d, back, y, N, HS_COPY_D2H);
    d->ops->synchronize(d);
    assert_memory_equal(h, back, N);
    hs_device_copy(d, back, h, 0, HS_COPY_H2D); /* zero bytes: nothing happens */
    hs_device_free_mem(d, x), hs_device_free_mem(d, y);
    hs_host_free(d, h), hs_host_free(d, back);
    hs_device_free(d);
}

static void test_copies_are_traced_on_copy_lane_with_byte_count(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, true, NULL);
    hs_device *d = make_cpu(t);
    char *h = hs_host_alloc(d, 4096), *x = hs_device_alloc(d, 4096);
    memset(h, 1, 4096);
    hs_device_copy(d, x, h, 4096, HS_COPY_H2D);
    hs_device_copy(d, h, x, 1000, HS_COPY_D2H);
    hs_device_copy(d, x + 2048, x, 2048, HS_COPY_D2D);
    char *json = NULL;
    size_t len = 0;
    hs_error e;
    assert_int_equal(hs_trace_serialize(t, 0.0, &json, &len, &e), HS_OK);
    const char *h2d = strstr(json, "{\"name\":\"H2D\"");
    assert_non_null(h2d);
    assert_non_null(strstr(h2d, "\"tid\":2"));
    assert_non_null(strstr(json, "\"bytes\":4096"));
    assert_non_null(strstr(json, "{\"name\":\"D2H\""));
    assert_non_null(strstr(json, "\"bytes\":1000"));
    assert_non_null(strstr(json, "{\"name\":\"D2D\""));
    assert_non_null(strstr(json, "\"bytes\":2048"));
    free(json);
    hs_device_free_mem(d, x), hs_host_free(d, h);
    hs_device_free(d);
    hs_trace_free(t);
}

static void test_disabled_trace_records_no_copy_span(void **state) {
    (void)state;
    hs_trace *t = hs_trace_create(0, false, NULL);
    hs_device *d = make_cpu(t);
    char a[64] = {1}, b[64];
    hs_device_copy(d, b, a, sizeof a, HS_COPY_H2D);
    assert_int_equal(b[0], 1);
    char *json = NULL;
    size_t len = 0;
    hs_error e;
    assert_int_equal(hs_trace_serialize(t, 0.0, &json, &len, &e), HS_OK);
    assert_null(strstr(json, "H2D"));
    free(json);
    hs_device_free(d);
    hs_trace_free(t);
}

/* A cast long enough to be split over the threads gives every element
 * hs_convert's bits (the scalar routine's), the blocks' edges, the last
 * short block and fp32 subnormals included, both ways. */
static void test_large_cast_split_over_threads_matches_scalar(void **state) {
    (void)state;
    enum { N = (1 << 20) + 37 };
    hs_device *d = make_cpu(NULL);
    float *x = malloc(N * 4), *w = malloc(N * 4);
    uint16_t *b = malloc(N * 2);
    assert_true(x && w && b);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        if (i % 5 == 0) u &= 0x807FFFFFu; /* subnormals */
        memcpy(&x[i], &u, 4);
    }
    hs_blas_set_threads(2);
    hs_dev_convert(d, b, HS_DTYPE_BF16, x, HS_DTYPE_F32, N);
    for (int i = 0; i < N; i++)
        if (b[i] != hs_f32_to_bf16(x[i]))
            fail_msg("at %d: %04x vs %04x", i, b[i], hs_f32_to_bf16(x[i]));
    hs_dev_convert(d, w, HS_DTYPE_F32, b, HS_DTYPE_BF16, N);
    for (int i = 0; i < N; i++) {
        float r = hs_bf16_to_f32(b[i]);
        assert_memory_equal(&w[i], &r, 4);
    }
    free(x), free(w), free(b);
    hs_device_free(d);
}

/* A device starts without a note (serial 0); each note a backend leaves
 * moves the serial on, so a reader that logs on a change says it once. */
static void test_note_starts_empty_and_each_new_note_moves_the_serial(void **state) {
    (void)state;
    hs_device *d = make_cpu(NULL);
    char line[64] = "x";
    assert_int_equal(hs_device_note_read(d, line, sizeof line), 0);
    assert_string_equal(line, "");
    hs_device_note(d, "attention runs on %s", "the cores");
    assert_int_equal(hs_device_note_read(d, line, sizeof line), 1);
    assert_string_equal(line, "attention runs on the cores");
    assert_int_equal(hs_device_note_read(d, line, sizeof line), 1);
    char small[8];
    hs_device_note(d, "a note longer than the reader's buffer");
    assert_int_equal(hs_device_note_read(d, small, sizeof small), 2);
    assert_string_equal(small, "a note ");
    hs_device_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names_and_parse),
        cmocka_unit_test(test_cuda_that_cannot_open_is_config_error_pointing_to_cpu),
        cmocka_unit_test(test_device_and_host_pools_count_current_and_peak_separately),
        cmocka_unit_test(test_h2d_d2h_d2d_copies_move_every_byte),
        cmocka_unit_test(test_copies_are_traced_on_copy_lane_with_byte_count),
        cmocka_unit_test(test_disabled_trace_records_no_copy_span),
        cmocka_unit_test(test_large_cast_split_over_threads_matches_scalar),
        cmocka_unit_test(test_note_starts_empty_and_each_new_note_moves_the_serial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
