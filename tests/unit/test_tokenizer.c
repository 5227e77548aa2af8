/* tokenizer.json from outside: every token id is checked (an integer in
 * range, no id shared by two vocab tokens) before it indexes anything, and
 * every refusal names the file and the field. A well-formed byte-level BPE
 * still encodes and decodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/config.h"
#include "hypershard/data.h"
#include "test_util.h"

static char tmpdir[256];

static int setup(void **s) {
    (void)s;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "tok");
}
static int teardown(void **s) {
    (void)s;
    return tu_tmpdir_remove(tmpdir);
}

#define GPT2_SPLIT "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

/* Llama 3's split (bpe.c's pattern, each backslash doubled for JSON). */
#define LLAMA3_SPLIT                                                                               \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": " \
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "       \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "      \
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "                   \
    "\"add_prefix_space\": false, \"use_regex\": false}]}"

/* A tokenizer.json with pre_tokenizer `pre`, model.vocab `vocab` (JSON
 * text), the merge "a b" and added_tokens `added`; returns its path. */
static const char *write_tokenizer_pre(const char *name, const char *pre, const char *vocab,
                                       const char *added) {
    static char path[300];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    char text[4096];
    int n = snprintf(text, sizeof text,
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"a b\"]},\n"
                     " \"pre_tokenizer\": %s,\n \"added_tokens\": %s}\n",
                     vocab, pre, added);
    tu_write_file(path, text, (size_t)n);
    return path;
}

/* The same behind GPT-2's split. */
static const char *write_tokenizer(const char *name, const char *vocab, const char *added) {
    return write_tokenizer_pre(name, GPT2_SPLIT, vocab, added);
}

/* hs_bpe_load refuses the file with a message holding the path and both needles. */
static void expect_refused(const char *path, const char *needle1, const char *needle2) {
    hs_bpe *b = (hs_bpe *)1;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_bpe_load(path, &b, &e), HS_ERR_FORMAT);
    assert_null(b);
    if (!strstr(e.msg, path)) fail_msg("'%s' does not name the file", e.msg);
    if (needle1 && !strstr(e.msg, needle1)) fail_msg("'%s' lacks '%s'", e.msg, needle1);
    if (needle2 && !strstr(e.msg, needle2)) fail_msg("'%s' lacks '%s'", e.msg, needle2);
}

static void test_vocab_id_minus_5_is_refused_naming_file_and_token(void **state) {
    (void)state;
    expect_refused(write_tokenizer("m5.json", "{\"a\": 0, \"b\": -5}", "[]"), "model.vocab[\"b\"]",
                   "-5");
}

static void test_vocab_id_2_pow_32_is_refused(void **state) {
    (void)state;
    expect_refused(write_tokenizer("big.json", "{\"a\": 0, \"b\": 4294967296}", "[]"),
                   "model.vocab[\"b\"]", "4294967296");
}

static void test_vocab_id_int_max_is_refused_instead_of_overflowing(void **state) {
    (void)state;
    expect_refused(write_tokenizer("imax.json", "{\"a\": 0, \"b\": 2147483647}", "[]"),
                   "model.vocab[\"b\"]", "2147483647");
}

static void test_added_token_id_minus_7_is_refused_naming_its_index(void **state) {
    (void)state;
    expect_refused(write_tokenizer("add.json", "{\"a\": 0, \"b\": 1}",
                                   "[{\"id\": 2, \"content\": \"<s>\"},"
                                   " {\"id\": -7, \"content\": \"</s>\"}]"),
                   "added_tokens[1].id", "-7");
}

static void test_string_ids_are_refused_not_read_as_0(void **state) {
    (void)state;
    expect_refused(write_tokenizer("str.json", "{\"a\": 0, \"b\": \"5\"}", "[]"),
                   "model.vocab[\"b\"]", "a string");
}

static void test_missing_or_list_vocab_is_refused_naming_the_file(void **state) {
    (void)state;
    const char *path = write_tokenizer("list.json", "[\"a\", \"b\"]", "[]");
    expect_refused(path, "model.vocab", "a list");
    path = write_tokenizer("none.json", "null", "[]");
    expect_refused(path, "model.vocab", "not an object");
}

static void test_two_vocab_tokens_with_one_id_are_refused_naming_both(void **state) {
    (void)state;
    expect_refused(write_tokenizer("dup.json", "{\"a\": 0, \"b\": 1, \"c\": 1}", "[]"),
                   "model.vocab[\"b\"]", "model.vocab[\"c\"]");
}

static void test_a_repeated_vocab_key_is_refused(void **state) {
    (void)state;
    expect_refused(write_tokenizer("key.json", "{\"a\": 0, \"b\": 1, \"a\": 2}", "[]"), "duplicate",
                   NULL);
}

/* train's check of model.vocab_size against the tokenizer beside the token
 * file reads the same ids: a list vocab was a silent vocabulary of 0. */
static void test_tokenizer_check_refuses_a_list_vocab_naming_the_file(void **state) {
    (void)state;
    const char *path = write_tokenizer("tokenizer.json", "[\"a\", \"b\"]", "[]");
    hs_config c;
    hs_config_defaults(&c, NULL);
    snprintf(c.data.source, sizeof c.data.source, "tokens");
    snprintf(c.data.path, sizeof c.data.path, "%s/tokens.hstk", tmpdir);
    int64_t vocab = -1;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_tokenizer_check(&c, &vocab, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, path) || !strstr(e.msg, "model.vocab"))
        fail_msg("'%s' does not name the file and the field", e.msg);
    hs_config_free(&c);
}

/* Hugging Face's BPE builder refuses a merge whose sides or result are not
 * in the vocabulary; so does hs_bpe_load, naming the merge and the token. */
static void test_merge_of_a_token_not_in_the_vocab_is_refused_naming_it(void **state) {
    (void)state;
    expect_refused(write_tokenizer("merge.json", "{\"a\": 0, \"b\": 1}", "[]"), "model.merges[0]",
                   "\"ab\"");
}

static void test_ids_in_range_load_and_encode_and_decode(void **state) {
    (void)state;
    const char *path = write_tokenizer("ok.json", "{\"a\": 0, \"b\": 1, \"ab\": 2}",
                                       "[{\"id\": 3, \"content\": \"<s>\"}]");
    hs_bpe *b = NULL;
    hs_error e;
    assert_int_equal(hs_bpe_load(path, &b, &e), HS_OK);
    assert_int_equal(hs_bpe_vocab_size(b), 4);
    int32_t *ids = NULL;
    int n = 0;
    assert_int_equal(hs_bpe_encode(b, "ab", &ids, &n, &e), HS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    char out[8];
    assert_int_equal(hs_bpe_decode(b, 2, out, sizeof out), 2);
    assert_memory_equal(out, "ab", 2);
    assert_int_equal(hs_bpe_decode(b, 3, out, sizeof out), 3);
    assert_memory_equal(out, "<s>", 3);
    assert_int_equal(hs_bpe_decode(b, 123456, out, 4), 3); /* "<12" of "<123456>" */
    free(ids);
    hs_bpe_free(b);
}

/* C0 20 was read as a space: before a digit it made Llama 3's splitter cut
 * a piece of no bytes and encode never advanced. Each invalid byte now
 * stands alone, as the byte-level symbol of that byte. */
static void test_invalid_utf8_before_a_space_is_one_byte_and_encode_advances(void **state) {
    (void)state;
    /* U+00C0 is byte 0xC0's symbol, U+0120 the space's */
    const char *path = write_tokenizer_pre("l3.json", LLAMA3_SPLIT,
                                           "{\"\\u00c0\": 0, \"\\u0120\": 1, \"1\": 2, "
                                           "\"a\": 3, \"b\": 4, \"ab\": 5}",
                                           "[]");
    hs_bpe *b = NULL;
    hs_error e;
    assert_int_equal(hs_bpe_load(path, &b, &e), HS_OK);
    int32_t *ids = NULL;
    int n = 0;
    hs_error_clear(&e);
    hs_status s = hs_bpe_encode(b, "\xc0 1", &ids, &n, &e);
    if (s != HS_OK) fail_msg("%s", e.msg);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
    free(ids);
    hs_bpe_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_id_minus_5_is_refused_naming_file_and_token),
        cmocka_unit_test(test_vocab_id_2_pow_32_is_refused),
        cmocka_unit_test(test_vocab_id_int_max_is_refused_instead_of_overflowing),
        cmocka_unit_test(test_added_token_id_minus_7_is_refused_naming_its_index),
        cmocka_unit_test(test_string_ids_are_refused_not_read_as_0),
        cmocka_unit_test(test_missing_or_list_vocab_is_refused_naming_the_file),
        cmocka_unit_test(test_two_vocab_tokens_with_one_id_are_refused_naming_both),
        cmocka_unit_test(test_a_repeated_vocab_key_is_refused),
        cmocka_unit_test(test_tokenizer_check_refuses_a_list_vocab_naming_the_file),
        cmocka_unit_test(test_ids_in_range_load_and_encode_and_decode),
        cmocka_unit_test(test_merge_of_a_token_not_in_the_vocab_is_refused_naming_it),
        cmocka_unit_test(test_invalid_utf8_before_a_space_is_one_byte_and_encode_advances),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
