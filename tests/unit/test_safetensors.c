/* Safetensors: bitwise round trips in every dtype, the header layout other
 * readers rely on, and errors that name the file and the tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/ckpt.h"
#include "test_util.h"

static char tmpdir[256];

static int setup(void **s) {
    (void)s;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "st");
}
static int teardown(void **s) {
    (void)s;
    return tu_tmpdir_remove(tmpdir);
}

static char *tmp_path(const char *name) {
    static char buf[4][300];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 300, "%s/%s", tmpdir, name);
    return p;
}

static char *read_bytes(const char *path, size_t *n) {
    char *buf = NULL;
    hs_error e;
    assert_int_equal(hs_read_file(path, &buf, n, &e), HS_OK);
    return buf;
}

static void test_round_trip_is_bitwise_in_f32_bf16_f16(void **state) {
    (void)state;
    float a[6] = {1.5f, -2.25f, 3.0e-8f, 1e30f, -0.0f, 7.0f};
    uint16_t b[5], h[3 * 2 * 2];
    for (int i = 0; i < 5; i++) b[i] = hs_f32_to_bf16(0.1f * (float)i - 0.2f);
    for (int i = 0; i < 12; i++) h[i] = hs_f32_to_f16((float)i / 3.0f);
    hs_st_tensor t[3] = {
        {.name = "model.embed_tokens.weight",
         .dtype = HS_DTYPE_F32,
         .ndim = 2,
         .shape = {2, 3},
         .data = a,
         .bytes = sizeof a},
        {.name = "model.norm.weight",
         .dtype = HS_DTYPE_BF16,
         .ndim = 1,
         .shape = {5},
         .data = b,
         .bytes = sizeof b},
        {.name = "experts",
         .dtype = HS_DTYPE_F16,
         .ndim = 3,
         .shape = {3, 2, 2},
         .data = h,
         .bytes = sizeof h},
    };
    hs_st_meta meta[] = {{"format", "pt"}, {"note", "a \"quoted\" value"}};
    hs_error e;
    const char *path = tmp_path("rt.safetensors");
    assert_int_equal(hs_safetensors_write(path, t, 3, meta, 2, &e), HS_OK);
    hs_st_file *f = NULL;
    assert_int_equal(hs_safetensors_open(path, &f, &e), HS_OK);
    assert_int_equal(hs_safetensors_count(f), 3);
    for (int i = 0; i < 3; i++) {
        const hs_st_tensor *r = hs_safetensors_find(f, t[i].name);
        assert_non_null(r);
        assert_int_equal(r->dtype, t[i].dtype);
        assert_int_equal(r->ndim, t[i].ndim);
        for (int d = 0; d < r->ndim; d++) assert_int_equal(r->shape[d], t[i].shape[d]);
        assert_int_equal(r->bytes, t[i].bytes);
        assert_memory_equal(r->data, t[i].data, t[i].bytes);
    }
    assert_string_equal(hs_safetensors_meta(f, "format"), "pt");
    assert_string_equal(hs_safetensors_meta(f, "note"), "a \"quoted\" value");
    assert_null(hs_safetensors_find(f, "absent"));
    float back[12];
    hs_st_to_f32(hs_safetensors_find(f, "experts"), back);
    for (int i = 0; i < 12; i++) assert_true(back[i] == hs_f16_to_f32(h[i]));
    hs_safetensors_close(f);
}

static void test_data_region_starts_64_byte_aligned_and_data_follows_in_order(void **state) {
    (void)state;
    float a[3] = {1, 2, 3}, b[1] = {4};
    hs_st_tensor t[2] = {
        {.name = "a", .dtype = HS_DTYPE_F32, .ndim = 1, .shape = {3}, .data = a, .bytes = 12},
        {.name = "b", .dtype = HS_DTYPE_F32, .ndim = 1, .shape = {1}, .data = b, .bytes = 4},
    };
    hs_error e;
    const char *path = tmp_path("layout.safetensors");
    assert_int_equal(hs_safetensors_write(path, t, 2, NULL, 0, &e), HS_OK);
    size_t n = 0;
    char *buf = read_bytes(path, &n);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    assert_int_equal(hlen % 8, 0);
    assert_int_equal((8 + hlen) % HS_ALIGN, 0);
    assert_int_equal(n, 8 + hlen + 16);
    assert_memory_equal(buf + 8 + hlen, a, 12);
    assert_memory_equal(buf + 8 + hlen + 12, b, 4);
    assert_non_null(strstr(buf + 8, "\"data_offsets\":[12,16]"));
    free(buf);
}

static void expect_open_error(const char *path, const char *needle1, const char *needle2) {
    hs_st_file *f = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_safetensors_open(path, &f, &e), HS_ERR_FORMAT);
    assert_null(f);
    assert_non_null(strstr(e.msg, path));
    if (needle1 && !strstr(e.msg, needle1)) fail_msg("'%s' lacks '%s'", e.msg, needle1);
    if (needle2 && !strstr(e.msg, needle2)) fail_msg("'%s' lacks '%s'", e.msg, needle2);
}

static void test_truncated_files_are_errors_naming_the_file(void **state) {
    (void)state;
    float a[64];
    for (int i = 0; i < 64; i++) a[i] = (float)i;
    hs_st_tensor t = {.name = "w",
                      .dtype = HS_DTYPE_F32,
                      .ndim = 2,
                      .shape = {8, 8},
                      .data = a,
                      .bytes = sizeof a};
    hs_error e;
    const char *full = tmp_path("full.safetensors");
    assert_int_equal(hs_safetensors_write(full, &t, 1, NULL, 0, &e), HS_OK);
    size_t n = 0;
    char *buf = read_bytes(full, &n);
    const char *cut = tmp_path("cut.safetensors");
    tu_write_file(cut, buf, 5); /* inside the length field */
    expect_open_error(cut, "truncated", NULL);
    tu_write_file(cut, buf, 20); /* inside the header */
    expect_open_error(cut, "truncated", NULL);
    tu_write_file(cut, buf, n - 4); /* inside the data */
    expect_open_error(cut, "truncated", "w");
    free(buf);
}

/* A hand-made file: `header` JSON, then `data_bytes` zero bytes. */
static const char *craft(const char *name, const char *header, size_t data_bytes) {
    const char *path = tmp_path(name);
    size_t hl = strlen(header);
    char *buf = calloc(1, 8 + hl + data_bytes);
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8);
    memcpy(buf + 8, header, hl);
    tu_write_file(path, buf, 8 + hl + data_bytes);
    free(buf);
    return path;
}

static void test_bad_headers_name_the_tensor_and_the_problem(void **state) {
    (void)state;
    expect_open_error(
        craft("dt.st", "{\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8),
        "tensor x", "I64");
    expect_open_error(
        craft("sz.st", "{\"y\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
        "tensor y", "needs 12");
    expect_open_error(craft("js.st", "{\"z\":{\"dtype\":", 0), "line 1", NULL);
    expect_open_error(
        craft("sh.st", "{\"s\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0),
        "tensor s", "shape[0]");
    const char *huge = tmp_path("len.st");
    uint64_t big = (uint64_t)1 << 40;
    tu_write_file(huge, &big, 8);
    expect_open_error(huge, "larger than the limit", "1099511627776");
}

static void test_a_tensor_name_given_twice_is_refused(void **state) {
    (void)state;
    expect_open_error(craft("twice.st",
                            "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            8),
                      "duplicate", "\"w\"");
}

static void test_overlapping_data_offsets_are_refused_naming_both_tensors(void **state) {
    (void)state;
    expect_open_error(craft("ovl.st",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                            16),
                      "tensors a (data_offsets [0, 16]) and b ([8, 16]) overlap", NULL);
    /* the same bytes under two names overlap too */
    expect_open_error(craft("alias.st",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                            8),
                      "overlap", NULL);
}

static void test_a_shape_whose_byte_count_overflows_is_refused(void **state) {
    (void)state;
    /* 2^62 + 1 rows of 4 F16: 2^64 + 4 elements wrap to 4, i.e. 8 bytes */
    expect_open_error(craft("wrap.st",
                            "{\"x\":{\"dtype\":\"F16\",\"shape\":[4611686018427387905,4],"
                            "\"data_offsets\":[0,8]}}",
                            8),
                      "tensor x", "64 bits");
}

/* A header just over the 100 MiB limit, in a file long enough to hold it
 * (sparse): the refusal says the header is too large, with both numbers,
 * not that the length does not fit the file. */
static void test_a_header_over_the_limit_is_refused_saying_so(void **state) {
    (void)state;
    const char *path = tmp_path("big_header.st");
    uint64_t hlen = ((uint64_t)100 << 20) + 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&hlen, 8, 1, f), 1);
    assert_int_equal(ftruncate(fileno(f), (off_t)(8 + hlen)), 0);
    fclose(f);
    expect_open_error(path, "the header is 104857608 bytes, larger than the limit of 104857600",
                      NULL);
}

static void test_unaligned_tensors_of_other_writers_convert_exactly(void **state) {
    (void)state;
    /* F16 of 3 elements (6 bytes) puts the following F32 at offset 6. */
    const char *path = craft("unal.st",
                             "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                             "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[6,14]}}",
                             14);
    /* Patch the data in: header length is known from the file. */
    size_t n = 0;
    char *buf = read_bytes(path, &n);
    uint64_t hl;
    memcpy(&hl, buf, 8);
    float vals[2] = {3.5f, -1.25f};
    memcpy(buf + 8 + hl + 6, vals, 8);
    tu_write_file(path, buf, n);
    free(buf);
    hs_st_file *f = NULL;
    hs_error e;
    assert_int_equal(hs_safetensors_open(path, &f, &e), HS_OK);
    float out[2];
    hs_st_to_f32(hs_safetensors_find(f, "f"), out);
    assert_true(out[0] == 3.5f && out[1] == -1.25f);
    hs_safetensors_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_is_bitwise_in_f32_bf16_f16),
        cmocka_unit_test(test_data_region_starts_64_byte_aligned_and_data_follows_in_order),
        cmocka_unit_test(test_truncated_files_are_errors_naming_the_file),
        cmocka_unit_test(test_bad_headers_name_the_tensor_and_the_problem),
        cmocka_unit_test(test_a_tensor_name_given_twice_is_refused),
        cmocka_unit_test(test_overlapping_data_offsets_are_refused_naming_both_tensors),
        cmocka_unit_test(test_a_shape_whose_byte_count_overflows_is_refused),
        cmocka_unit_test(test_a_header_over_the_limit_is_refused_saying_so),
        cmocka_unit_test(test_unaligned_tensors_of_other_writers_convert_exactly),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
