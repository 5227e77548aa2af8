/* base/: errors, pools, RNG, JSON, CRC32. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

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

/* The block fill (vector Philox, log and cos of its own, and a fallback to
 * hs_rng_normal wherever its double could round another way) equals
 * hs_rng_normal element for element: 4M draws over streams and seeds,
 * counters carrying into their high word, lengths that end mid-block, a
 * mean and std applied in float. The fallback takes about one draw in
 * 2^13, some hundreds here. */
static void test_rng_fill_normal_equals_scalar_draws_bit_for_bit(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    float *fill = malloc(N * sizeof(float));
    assert_non_null(fill);
    const struct {
        uint64_t seed, stream, offset;
        int64_t n;
        float mean, std;
    } cases[] = {{42, 0x9e3779b97f4a7c15ull, 0, N, 0.0f, 1.0f},
                 {1, 7, 0xFFFFFFFFull - 1000, N - 5, 0.0f, 0.02f},
                 {0xfedcba9876543210ull, 0, 3, N - 13, 0.5f, 0.25f},
                 {9, 0xFFFFFFFFFFFFFFFFull, (1ull << 40) + 7, N, -1.0f, 3.0f},
                 {5, 5, 0, 17, 0.0f, 1.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hs_rng_fill_normal(fill, cases[c].n, cases[c].seed, cases[c].stream,
                           (int64_t)cases[c].offset, cases[c].mean, cases[c].std);
        for (int64_t i = 0; i < cases[c].n; i++) {
            float want = cases[c].mean +
                         cases[c].std * hs_rng_normal(cases[c].seed, cases[c].stream,
                                                      cases[c].offset + (uint64_t)i);
            if (memcmp(&want, &fill[i], sizeof want) != 0)
                fail_msg("case %zu, element %lld: fill %.9g, hs_rng_normal %.9g", c, (long long)i,
                         (double)fill[i], (double)want);
        }
    }
    free(fill);
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
    assert_string_equal(
        buf, "{\"step\":3,\"loss\":2.5,\"bad\":null,\"s\":\"a\\\"b\\n\",\"list\":[true,null,{}]}");
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

/* A fresh scratch directory, removed by scratch_rm. */
static void scratch(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/hs_test_out_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void scratch_rm(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static bool dir_is_empty(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "[ -z \"$(ls -A %s)\" ]", dir);
    return system(cmd) == 0;
}

static void test_out_dir_empty_path_is_refused_naming_the_flag_or_key(void **state) {
    (void)state;
    hs_error e;
    hs_out_dir flag = {.what = "--safetensors", .path = ""};
    assert_int_equal(hs_out_dirs_check(&flag, 1, &e), HS_ERR_USAGE);
    assert_non_null(strstr(e.msg, "--safetensors: empty path; give the directory"));
    hs_out_dir key = {.what = "train.out_dir", .path = NULL};
    assert_int_equal(hs_out_dirs_check(&key, 1, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "train.out_dir: empty path"));
    assert_int_equal(hs_status_exit_code(e.code), 2);
}

static void test_out_dir_under_or_at_a_file_is_refused_naming_the_file(void **state) {
    (void)state;
    char dir[64], file[128], under[160];
    scratch(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/a_file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(under, sizeof under, "%s/sub/deeper", file);
    hs_error e;
    const char *paths[] = {file, under};
    for (int i = 0; i < 2; i++) {
        hs_out_dir d = {.what = "train.out_dir", .path = paths[i]};
        assert_int_equal(hs_out_dirs_check(&d, 1, &e), HS_ERR_CONFIG);
        char want[300];
        snprintf(want, sizeof want, "train.out_dir = %s: %s is not a directory", paths[i], file);
        assert_non_null(strstr(e.msg, want));
    }
    scratch_rm(dir);
}

static void test_out_dir_whose_file_name_is_a_directory_is_refused(void **state) {
    (void)state;
    char dir[64], sub[128];
    scratch(dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/model.safetensors", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    const char *files[] = {"config.json", "model.safetensors", NULL};
    hs_out_dir d = {.what = "--out", .path = dir, .files = files};
    hs_error e;
    assert_int_equal(hs_out_dirs_check(&d, 1, &e), HS_ERR_USAGE);
    assert_non_null(strstr(e.msg, sub));
    assert_non_null(strstr(e.msg, "is a directory, where this writes the file model.safetensors"));
    scratch_rm(dir);
}

static void test_out_dir_unwritable_parent_is_refused_with_the_reason(void **state) {
    (void)state;
    /* /proc takes no new files, even from root */
    hs_out_dir d = {.what = "--dump", .path = "/proc/hs_no_such_dir/x"};
    hs_error e;
    assert_int_equal(hs_out_dirs_check(&d, 1, &e), HS_ERR_USAGE);
    assert_non_null(strstr(e.msg, "--dump /proc/hs_no_such_dir/x: cannot create files in /proc ("));
    assert_non_null(strstr(e.msg, "choose another --dump"));
}

static void test_out_dir_missing_is_accepted_and_nothing_is_created(void **state) {
    (void)state;
    char dir[64], path[128];
    scratch(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    const char *files[] = {"metrics.jsonl", NULL};
    hs_out_dir d[2] = {{.what = "train.out_dir", .path = path, .files = files, .bytes = 1024},
                       {.what = "checkpoint.dir", .path = dir}};
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_out_dirs_check(d, 2, &e), HS_OK);
    assert_true(dir_is_empty(dir)); /* no probe file, no directory */
    scratch_rm(dir);
}

static void test_out_dirs_on_one_file_system_must_fit_its_free_space_together(void **state) {
    (void)state;
    char dir[64], a[128], b[128];
    scratch(dir, sizeof dir);
    struct statvfs fs;
    assert_int_equal(statvfs(dir, &fs), 0);
    int64_t room = (int64_t)fs.f_bavail * (int64_t)fs.f_frsize;
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    /* each alone fits, both do not */
    int64_t part = room / 10 * 6;
    hs_out_dir d[2] = {
        {.what = "train.out_dir", .path = a, .bytes = part, .bytes_what = "the weights take 60%"},
        {.what = "checkpoint.dir",
         .path = b,
         .bytes = part,
         .bytes_what = "one checkpoint takes 60%"}};
    hs_error e;
    assert_int_equal(hs_out_dirs_check(&d[0], 1, &e), HS_OK);
    assert_int_equal(hs_out_dirs_check(&d[1], 1, &e), HS_OK);
    assert_int_equal(hs_out_dirs_check(d, 2, &e), HS_ERR_CONFIG);
    char want[300];
    snprintf(want, sizeof want, "train.out_dir = %s: %s has ", a, dir);
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "MiB free and the weights take 60%; on the same file system, "
                                  "checkpoint.dir = "));
    snprintf(want, sizeof want, "(%lld bytes needed in all, ", (long long)(2 * part));
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "put one of these on another file system"));
    /* a size past int64 is refused, not wrapped */
    d[0].bytes = INT64_MAX;
    assert_int_equal(hs_out_dirs_check(d, 2, &e), HS_ERR_CONFIG);
    scratch_rm(dir);
}

static void test_fclose_written_reports_a_failed_write_naming_the_file(void **state) {
    (void)state;
    FILE *f = fopen("/dev/full", "w");
    assert_non_null(f);
    fputs("a line that cannot be stored\n", f);
    hs_error e;
    assert_int_equal(hs_fclose_written(f, "/dev/full", "free space", &e), HS_ERR_IO);
    assert_string_equal(e.msg, "cannot write /dev/full: No space left on device; free space");
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
        cmocka_unit_test(test_rng_fill_normal_equals_scalar_draws_bit_for_bit),
        cmocka_unit_test(test_rng_normal_has_unit_moments_and_uniform_is_in_range),
        cmocka_unit_test(test_crc32_of_check_string_is_cbf43926),
        cmocka_unit_test(test_json_writer_nests_escapes_and_nulls_nonfinite),
        cmocka_unit_test(test_mkdirs_creates_nested_directories),
        cmocka_unit_test(test_out_dir_empty_path_is_refused_naming_the_flag_or_key),
        cmocka_unit_test(test_out_dir_under_or_at_a_file_is_refused_naming_the_file),
        cmocka_unit_test(test_out_dir_whose_file_name_is_a_directory_is_refused),
        cmocka_unit_test(test_out_dir_unwritable_parent_is_refused_with_the_reason),
        cmocka_unit_test(test_out_dir_missing_is_accepted_and_nothing_is_created),
        cmocka_unit_test(test_out_dirs_on_one_file_system_must_fit_its_free_space_together),
        cmocka_unit_test(test_fclose_written_reports_a_failed_write_naming_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
