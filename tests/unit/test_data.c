/* Data: the builtin corpus, sequence cutting, the validation split, the
 * per-epoch order, per-rank micro-batch slices and token-file errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/data.h"
#include "test_util.h"

static char tmpdir[256];

static int setup(void **s) {
    (void)s;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "data");
}
static int teardown(void **s) {
    (void)s;
    return tu_tmpdir_remove(tmpdir);
}

/* A text file of n bytes where byte i is 'A' + i % 26. */
static void text_config(hs_data_config *dc, int n, double val_fraction) {
    char *text = malloc((size_t)n);
    for (int i = 0; i < n; i++) text[i] = (char)('A' + i % 26);
    snprintf(dc->source, sizeof dc->source, "text");
    snprintf(dc->path, sizeof dc->path, "%s/text.txt", tmpdir);
    dc->val_fraction = val_fraction;
    tu_write_file(dc->path, text, (size_t)n);
    free(text);
}

static void test_builtin_corpus_is_deterministic_and_prefix_stable(void **state) {
    (void)state;
    uint8_t *a = malloc(20000), *b = malloc(20000), *c = malloc(7000);
    hs_corpus_builtin(a, 20000);
    hs_corpus_builtin(b, 20000);
    hs_corpus_builtin(c, 7000);
    assert_memory_equal(a, b, 20000);
    assert_memory_equal(a, c, 7000);
    free(a), free(b), free(c);
}

static void test_builtin_corpus_is_printable_sentences(void **state) {
    (void)state;
    enum { N = 50000 };
    uint8_t *t = malloc(N + 1);
    hs_corpus_builtin(t, N);
    int stops = 0, newlines = 0;
    for (int i = 0; i < N; i++) {
        assert_true((t[i] >= 32 && t[i] < 127) || t[i] == '\n');
        stops += t[i] == '.';
        newlines += t[i] == '\n';
    }
    t[N] = 0;
    assert_true(stops > N / 80); /* sentences are short */
    assert_true(newlines > 10);  /* paragraphs */
    assert_non_null(strstr((char *)t, ". The "));
    assert_non_null(strstr((char *)t, " an "));
    free(t);
}

static void test_sequences_are_cuts_of_seq_len_plus_1_with_shifted_targets(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 100, 0.0);
    hs_dataset *ds = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, 4, 256, 1, &ds, &e), HS_OK);
    assert_int_equal(hs_data_num_train(ds), 20); /* 100 / (4 + 1) */
    int32_t tok[4], tgt[4];
    hs_data_sequence(ds, 3, tok, tgt);
    for (int t = 0; t < 4; t++) {
        assert_int_equal(tok[t], 'A' + (15 + t) % 26);
        assert_int_equal(tgt[t], 'A' + (16 + t) % 26);
    }
    hs_data_free(ds);
}

static void test_validation_split_is_the_last_fraction_of_sequences(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 500, 0.1); /* 100 sequences of 5 */
    hs_dataset *ds = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, 4, 256, 1, &ds, &e), HS_OK);
    assert_int_equal(hs_data_num_train(ds), 90);
    assert_int_equal(hs_data_num_val(ds), 10);
    /* No train batch ever reads a validation sequence. */
    for (int g = 0; g < 50; g++)
        for (int k = 0; k < 8; k++) assert_true(hs_data_batch_sequence(ds, g, 8, k) < 90);
    hs_data_free(ds);
}

static void test_each_epoch_reads_every_train_sequence_once(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 60, 0.0); /* 12 sequences */
    hs_dataset *ds = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, 4, 256, 7, &ds, &e), HS_OK);
    int64_t order[2][12];
    for (int epoch = 0; epoch < 2; epoch++) {
        int seen[12] = {0};
        for (int g = 0; g < 3; g++)
            for (int k = 0; k < 4; k++) {
                int64_t s = hs_data_batch_sequence(ds, epoch * 3 + g, 4, k);
                seen[s]++;
                order[epoch][g * 4 + k] = s;
            }
        for (int s = 0; s < 12; s++) assert_int_equal(seen[s], 1);
    }
    assert_memory_not_equal(order[0], order[1], sizeof order[0]); /* reshuffled */
    hs_data_free(ds);
}

static void test_batches_straddling_an_epoch_keep_the_epoch_order(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 25, 0.0); /* 5 sequences, batches of 4 */
    hs_dataset *ds = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, 4, 256, 3, &ds, &e), HS_OK);
    int seen[5] = {0};
    /* Positions 0..9 are two whole epochs: batch 0, batch 1, half of batch 2. */
    for (int pos = 0; pos < 10; pos++) seen[hs_data_batch_sequence(ds, pos / 4, 4, pos % 4)]++;
    for (int s = 0; s < 5; s++) assert_int_equal(seen[s], 2);
    hs_data_free(ds);
}

static void test_order_depends_on_the_seed_only(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 500, 0.0);
    hs_dataset *a = NULL, *b = NULL, *c = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, 4, 256, 11, &a, &e), HS_OK);
    assert_int_equal(hs_data_open(&dc, 4, 256, 11, &b, &e), HS_OK);
    assert_int_equal(hs_data_open(&dc, 4, 256, 12, &c, &e), HS_OK);
    int differ = 0;
    for (int g = 5; g >= 0; g--) /* any visiting order gives the same answer */
        for (int k = 0; k < 16; k++) {
            assert_int_equal(hs_data_batch_sequence(a, g, 16, k),
                             hs_data_batch_sequence(b, g, 16, k));
            differ += hs_data_batch_sequence(a, g, 16, k) != hs_data_batch_sequence(c, g, 16, k);
        }
    assert_true(differ > 0);
    hs_data_free(a), hs_data_free(b), hs_data_free(c);
}

static void test_union_of_rank_slices_over_micro_batches_is_the_global_batch(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 26 * 40, 0.0);
    enum { T = 6, G = 12, MBS = 2, D = 3, M = G / (MBS * D) };
    hs_dataset *ds = NULL;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, T, 256, 5, &ds, &e), HS_OK);
    int32_t want_tok[G][T], want_tgt[G][T], tok[MBS * T], tgt[MBS * T];
    for (int g = 0; g < 3; g++) {
        for (int k = 0; k < G; k++)
            hs_data_sequence(ds, hs_data_batch_sequence(ds, g, G, k), want_tok[k], want_tgt[k]);
        int covered[G] = {0};
        for (int m = 0; m < M; m++)
            for (int d = 0; d < D; d++) {
                hs_data_micro_batch(ds, g, G, m, MBS, d, D, tok, tgt);
                for (int i = 0; i < MBS; i++) {
                    int k = m * MBS * D + d * MBS + i;
                    covered[k]++;
                    assert_memory_equal(tok + i * T, want_tok[k], sizeof want_tok[k]);
                    assert_memory_equal(tgt + i * T, want_tgt[k], sizeof want_tgt[k]);
                }
            }
        for (int k = 0; k < G; k++) assert_int_equal(covered[k], 1);
    }
    hs_data_free(ds);
}

static void test_byte_sources_need_vocab_256(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 100, 0.0);
    hs_dataset *ds = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_data_open(&dc, 4, 128, 1, &ds, &e), HS_ERR_CONFIG);
    assert_null(ds);
    assert_non_null(strstr(e.msg, "model.vocab_size"));
}

static void test_too_little_data_for_a_train_sequence_is_a_config_error(void **state) {
    (void)state;
    hs_data_config dc = {0};
    text_config(&dc, 10, 0.5);
    hs_dataset *ds = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_data_open(&dc, 8, 256, 1, &ds, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "train.seq_len"));
    assert_non_null(strstr(e.msg, dc.path));
}

/* Write toks to path, read them back unchanged, and open them as a tokens
 * dataset of 4-token sequences over `vocab`: sequence `seq` (5 tokens with
 * its targets) starts at toks[5 seq] and its targets end at toks[5 seq + 4]. */
static void check_tokens_round_trip(const char *path, const uint32_t *toks, int64_t n, int vocab,
                                    int seq, hs_data_config *dc) {
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_tokens_write(path, toks, n, &e), HS_OK);
    uint32_t *back = NULL;
    int64_t got = 0;
    assert_int_equal(hs_tokens_read(path, &back, &got, &e), HS_OK);
    assert_int_equal(got, n);
    assert_memory_equal(back, toks, (size_t)n * sizeof *toks);
    free(back);
    *dc = (hs_data_config){.source = "tokens", .val_fraction = 0.0};
    snprintf(dc->path, sizeof dc->path, "%s", path);
    hs_dataset *ds = NULL;
    assert_int_equal(hs_data_open(dc, 4, vocab, 1, &ds, &e), HS_OK);
    int32_t tok[4], tgt[4];
    hs_data_sequence(ds, seq, tok, tgt);
    assert_int_equal(tok[0], (int32_t)toks[5 * seq]);
    assert_int_equal(tgt[3], (int32_t)toks[5 * seq + 4]);
    hs_data_free(ds);
}

static void test_tokens_file_round_trips(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/t.bin", tmpdir);
    uint32_t toks[50];
    for (int i = 0; i < 50; i++) toks[i] = (uint32_t)(i * 997 % 1000);
    hs_data_config dc;
    check_tokens_round_trip(path, toks, 50, 1000, 2, &dc);
    /* A token >= vocab_size is named with its position. */
    hs_error e;
    hs_dataset *ds = NULL;
    hs_error_clear(&e);
    assert_int_equal(hs_data_open(&dc, 4, 990, 1, &ds, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "model.vocab_size"));
}

/* Ids over 65,535 (Llama 3's vocabulary) make a version 2 file of uint32
 * tokens; ids that fit 16 bits keep version 1 (2 bytes per token). */
static void test_tokens_file_holds_uint32_ids_as_version_2(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/t32.bin", tmpdir);
    uint32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (uint32_t)(128255 - i * 3001);
    hs_data_config dc;
    check_tokens_round_trip(path, toks, 40, 128256, 1, &dc);
    hs_error e;
    hs_error_clear(&e);
    char *raw = NULL;
    size_t len = 0;
    assert_int_equal(hs_read_file(path, &raw, &len, &e), HS_OK);
    uint32_t version;
    memcpy(&version, raw + 4, 4);
    assert_int_equal(version, HS_TOKENS_VERSION_U32);
    assert_int_equal(len, 16 + 40 * 4);
    free(raw);
    hs_dataset *ds = NULL;
    /* a vocabulary smaller than the ids is named */
    hs_error_clear(&e);
    assert_int_equal(hs_data_open(&dc, 4, 65536, 1, &ds, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "token 128255 at position 0 is >= model.vocab_size 65536"));
    /* 16-bit ids stay version 1 */
    uint32_t small[3] = {1, 65535, 7};
    assert_int_equal(hs_tokens_write(path, small, 3, &e), HS_OK);
    assert_int_equal(hs_read_file(path, &raw, &len, &e), HS_OK);
    memcpy(&version, raw + 4, 4);
    assert_int_equal(version, HS_TOKENS_VERSION_U16);
    assert_int_equal(len, 16 + 3 * 2);
    free(raw);
}

static void expect_format_error(const char *bytes, size_t n, const char *needle) {
    char path[300];
    snprintf(path, sizeof path, "%s/bad.bin", tmpdir);
    tu_write_file(path, bytes, n);
    uint32_t *out = NULL;
    int64_t count = 0;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_tokens_read(path, &out, &count, &e), HS_ERR_FORMAT);
    assert_null(out);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, needle));
}

static void test_tokens_file_header_errors_name_the_file(void **state) {
    (void)state;
    char buf[32] = {0};
    expect_format_error("HST", 3, "shorter");
    memcpy(buf, "ABCD", 4);
    expect_format_error(buf, 16, "magic");
    memcpy(buf, "HSTK", 4);
    buf[4] = 3; /* version 3 */
    expect_format_error(buf, 16, "version 3");
    buf[4] = 1;
    buf[8] = 5; /* 5 tokens declared, 3 present */
    expect_format_error(buf, 16 + 6, "truncated");
    buf[4] = 2; /* 3 uint32 tokens declared, 7 bytes present */
    buf[8] = 3;
    expect_format_error(buf, 16 + 7, "truncated");
}

/* A count whose byte size does not fit 64 bits is refused by the field's
 * name, with the count and the bytes there are. */
static void test_tokens_file_count_beyond_64_bits_names_the_count_field(void **state) {
    (void)state;
    char buf[16 + 8] = {0};
    memcpy(buf, "HSTK", 4);
    buf[4] = 2;
    memset(buf + 8, 0xff, 8); /* count 2^64 - 1 */
    expect_format_error(buf, sizeof buf, "count field says 18446744073709551615 tokens");
    memset(buf + 8, 0, 8);
    buf[15] = 0x40; /* count 2^62: times 4 bytes wraps to 0 */
    expect_format_error(buf, 16, "count field says 4611686018427387904 tokens");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_corpus_is_deterministic_and_prefix_stable),
        cmocka_unit_test(test_builtin_corpus_is_printable_sentences),
        cmocka_unit_test(test_sequences_are_cuts_of_seq_len_plus_1_with_shifted_targets),
        cmocka_unit_test(test_validation_split_is_the_last_fraction_of_sequences),
        cmocka_unit_test(test_each_epoch_reads_every_train_sequence_once),
        cmocka_unit_test(test_batches_straddling_an_epoch_keep_the_epoch_order),
        cmocka_unit_test(test_order_depends_on_the_seed_only),
        cmocka_unit_test(test_union_of_rank_slices_over_micro_batches_is_the_global_batch),
        cmocka_unit_test(test_byte_sources_need_vocab_256),
        cmocka_unit_test(test_too_little_data_for_a_train_sequence_is_a_config_error),
        cmocka_unit_test(test_tokens_file_round_trips),
        cmocka_unit_test(test_tokens_file_holds_uint32_ids_as_version_2),
        cmocka_unit_test(test_tokens_file_header_errors_name_the_file),
        cmocka_unit_test(test_tokens_file_count_beyond_64_bits_names_the_count_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
