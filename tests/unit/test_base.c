/* base/: errors, pools, RNG, JSON, CRC32. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "hypershard/base.h"

static void test_exit_codes_are_2_for_config_and_usage_1_otherwise(void **state) {
    (void)state;
    assert_int_equal(hs_status_exit_code(HS_OK), 0);
    assert_int_equal(hs_status_exit_code(HS_ERR_CONFIG), 2);
    assert_int_equal(hs_status_exit_code(HS_ERR_USAGE), 2);
    assert_int_equal(hs_status_exit_code(HS_ERR_IO), 1);
    assert_int_equal(hs_status_exit_code(HS_ERR_TIMEOUT), 1);
}

static void test_error_append_keeps_first_code_and_every_line(void **state) {
    (void)state;
    hs_error e;
    hs_error_clear(&e);
    hs_error_append(&e, HS_ERR_CONFIG, "first %d", 1);
    hs_error_append(&e, HS_ERR_IO, "second %s", "two");
    assert_int_equal(e.code, HS_ERR_CONFIG);
    assert_int_equal(e.lines, 2);
    assert_string_equal(e.msg, "first 1\nsecond two");
    hs_error_set(&e, HS_ERR_IO, "only");
    assert_string_equal(e.msg, "only");
    assert_int_equal(e.code, HS_ERR_IO);
}

static void test_error_overflow_is_cut_not_overrun(void **state) {
    (void)state;
    hs_error e;
    hs_error_clear(&e);
    char line[1000];
    memset(line, 'x', sizeof line - 1);
    line[sizeof line - 1] = '\0';
    for (int i = 0; i < 20; i++) hs_error_append(&e, HS_ERR_CONFIG, "%s", line);
    assert_true(strlen(e.msg) < sizeof e.msg);
    assert_non_null(strstr(e.msg, "more errors cut"));
}

static void test_fopen_error_names_path_and_hint(void **state) {
    (void)state;
    hs_error e;
    hs_error_clear(&e);
    FILE *f = hs_fopen("/nonexistent/dir/file.yaml", "r", "check the path", &e);
    assert_null(f);
    assert_int_equal(e.code, HS_ERR_IO);
    assert_non_null(strstr(e.msg, "/nonexistent/dir/file.yaml"));
    assert_non_null(strstr(e.msg, "check the path"));
}

static void test_pool_tracks_current_and_peak_bytes(void **state) {
    (void)state;
    hs_pool p;
    hs_pool_init(&p, "device");
    void *a = hs_pool_alloc(&p, 1000);
    void *b = hs_pool_calloc(&p, 3000);
    assert_int_equal((uintptr_t)a % HS_ALIGN, 0);
    assert_int_equal((uintptr_t)b % HS_ALIGN, 0);
    assert_int_equal(hs_pool_current(&p), 4000);
    assert_int_equal(hs_pool_block_size(b), 3000);
    for (int i = 0; i < 3000; i++) assert_int_equal(((unsigned char *)b)[i], 0);
    hs_pool_free(&p, a);
    assert_int_equal(hs_pool_current(&p), 3000);
    assert_int_equal(hs_pool_peak(&p), 4000);
    hs_pool_reset_peak(&p);
    assert_int_equal(hs_pool_peak(&p), 3000);
    hs_pool_free(&p, b);
    hs_pool_free(&p, NULL);
    assert_int_equal(hs_pool_current(&p), 0);
}

/* Known-answer vectors published with the Random123 library for
 * philox4x32-10: counter and key all zeros, and all ones. */
static void test_philox_matches_random123_known_answers(void **state) {
    (void)state;
    uint32_t r[4];
    hs_philox4x32(0, 0, 0, r);
    assert_int_equal(r[0], 0x6627e8d5u);
    assert_int_equal(r[1], 0xe169c58du);
    assert_int_equal(r[2], 0xbc57ac4cu);
    assert_int_equal(r[3], 0x9b00dbd8u);
    hs_philox4x32(UINT64_MAX, UINT64_MAX, UINT64_MAX, r);
    assert_int_equal(r[0], 0x408f276du);
    assert_int_equal(r[1], 0x41c83b0eu);
    assert_int_equal(r[2], 0xa20bc7c6u);
    assert_int_equal(r[3], 0x6d5451fdu);
}

static void test_rng_slice_equals_same_slice_of_full_fill(void **state) {
    (void)state;
    enum { N = 1000 };
    float full[N], part[300];
    uint64_t stream = hs_hash64("model.layers.0.mlp.up_proj.weight");
    hs_rng_fill_normal(full, N, 42, stream, 0, 0.0f, 0.02f);
    hs_rng_fill_normal(part, 300, 42, stream, 500, 0.0f, 0.02f);
    assert_memory_equal(part, full + 500, sizeof part);
    /* Another stream gives other values. */
    hs_rng_fill_normal(part, 300, 42, stream + 1, 500, 0.0f, 0.02f);
    assert_memory_not_equal(part, full + 500, sizeof part);
}

static void test_rng_normal_has_unit_moments_and_uniform_is_in_range(void **state) {
    (void)state;
    enum { N = 200000 };
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        double x = hs_rng_normal(7, 3, (uint64_t)i);
        s += x, s2 += x * x;
        float u = hs_rng_uniform(7, 3, (uint64_t)i);
        assert_true(u >= 0.0f && u < 1.0f);
    }
    double mean = s / N, var = s2 / N - mean * mean;
    assert_true(mean > -0.01 && mean < 0.01);
    assert_true(var > 0.98 && var < 1.02);
}

static void test_crc32_of_check_string_is_cbf43926(void **state) {
    (void)state;
    assert_int_equal(hs_crc32(0, "123456789", 9), 0xCBF43926u);
    /* Chaining over pieces equals one call. */
    assert_int_equal(hs_crc32(hs_crc32(0, "1234", 4), "56789", 5), 0xCBF43926u);
}

static void test_json_writer_nests_escapes_and_nulls_nonfinite(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    hs_json_kv_int(&j, "step", 3);
    hs_json_kv_double(&j, "loss", 2.5, 9);
    hs_json_kv_double(&j, "bad", 0.0 / 0.0, 9);
    hs_json_kv_string(&j, "s", "a\"b\n");
    hs_json_key(&j, "list");
    hs_json_begin_array(&j);
    hs_json_bool(&j, true);
    hs_json_null(&j);
    hs_json_begin_object(&j);
    hs_json_end_object(&j);
    hs_json_end_array(&j);
    hs_json_end_object(&j);
    fclose(f);
    assert_string_equal(buf, "{\"step\":3,\"loss\":2.5,\"bad\":null,\"s\":\"a\\\"b\\n\",\"list\":[true,null,{}]}");
    free(buf);
}

static void test_mkdirs_creates_nested_directories(void **state) {
    (void)state;
    char tmpl[] = "/tmp/hs_test_base_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char path[256];
    snprintf(path, sizeof path, "%s/a/b/c", tmpl);
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_mkdirs(path, &e), HS_OK);
    assert_int_equal(hs_mkdirs(path, &e), HS_OK); /* idempotent */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    assert_int_equal(system(cmd), 0);
}

static void test_checked_arithmetic_reports_int64_overflow_and_sticks(void **state) {
    (void)state;
    int64_t r = 0;
    assert_true(hs_mul_i64(INT64_C(1) << 31, INT64_C(1) << 31, &r));
    assert_int_equal(r, INT64_C(1) << 62);
    assert_false(hs_mul_i64(INT64_C(1) << 32, INT64_C(1) << 32, &r));
    assert_false(hs_add_i64(INT64_MAX, 1, &r));
    assert_true(hs_add_i64(INT64_MAX - 1, 1, &r));
    assert_int_equal(r, INT64_MAX);
    const int64_t ok[3] = {1024, 1024, 1024}, big[3] = {INT64_C(1) << 40, 1 << 20, 1 << 10};
    assert_true(hs_prod_i64(ok, 3, &r));
    assert_int_equal(r, INT64_C(1) << 30);
    assert_false(hs_prod_i64(big, 3, &r));
    hs_checked c = {0};
    assert_int_equal(hs_ck_add(&c, hs_ck_mul(&c, 3, 4), 5), 17);
    assert_false(c.overflow);
    assert_int_equal(hs_ck_prod(&c, big, 3), INT64_MAX);
    assert_true(c.overflow);
    /* once overflowed, later small steps do not look exact again */
    assert_int_equal(hs_ck_add(&c, 1, 1), INT64_MAX);
    assert_true(c.overflow);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_codes_are_2_for_config_and_usage_1_otherwise),
        cmocka_unit_test(test_checked_arithmetic_reports_int64_overflow_and_sticks),
        cmocka_unit_test(test_error_append_keeps_first_code_and_every_line),
        cmocka_unit_test(test_error_overflow_is_cut_not_overrun),
        cmocka_unit_test(test_fopen_error_names_path_and_hint),
        cmocka_unit_test(test_pool_tracks_current_and_peak_bytes),
        cmocka_unit_test(test_philox_matches_random123_known_answers),
        cmocka_unit_test(test_rng_slice_equals_same_slice_of_full_fill),
        cmocka_unit_test(test_rng_normal_has_unit_moments_and_uniform_is_in_range),
        cmocka_unit_test(test_crc32_of_check_string_is_cbf43926),
        cmocka_unit_test(test_json_writer_nests_escapes_and_nulls_nonfinite),
        cmocka_unit_test(test_mkdirs_creates_nested_directories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
