/* Megatron-LM indexed datasets and blends: the packed stream equals an HSTK
 * file of the same tokens, EOS between documents, every dtype, every bad
 * field refused by name, and a 0.7/0.3 blend that draws its shares and
 * reads the same samples at any data-parallel layout and after a resume. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/data.h"
#include "test_util.h"

static char tmpdir[256];

static int setup(void **s) {
    (void)s;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "data_indexed");
}
static int teardown(void **s) {
    (void)s;
    return tu_tmpdir_remove(tmpdir);
}

/* An index and data file in memory, as Megatron's builder writes them:
 * sequences back to back, documents of `per_doc` sequences. */
typedef struct files {
    uint8_t idx[1 << 17], bin[1 << 16];
    size_t idx_len, bin_len;
} files;

static const size_t widths[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};

static void put(uint8_t *p, double v, int dtype) {
    int8_t i8 = (int8_t)v;
    int16_t i16 = (int16_t)v;
    int32_t i32 = (int32_t)v;
    int64_t i64 = (int64_t)v;
    float f32 = (float)v;
    uint16_t u16 = (uint16_t)v;
    switch (dtype) {
    case 1: *p = (uint8_t)v; break;
    case 2: memcpy(p, &i8, 1); break;
    case 3: memcpy(p, &i16, 2); break;
    case 4: memcpy(p, &i32, 4); break;
    case 5: memcpy(p, &i64, 8); break;
    case 6: memcpy(p, &v, 8); break;
    case 7: memcpy(p, &f32, 4); break;
    default: memcpy(p, &u16, 2); break;
    }
}

static void build(files *f, int dtype, const double *tokens, const int32_t *lens, int64_t n_seq,
                  int per_doc) {
    memset(f, 0, sizeof *f);
    uint8_t *p = f->idx;
    memcpy(p, "MMIDIDX\0\0", 9), p += 9;
    uint64_t version = 1;
    memcpy(p, &version, 8), p += 8;
    *p++ = (uint8_t)dtype;
    uint64_t S = (uint64_t)n_seq, D = (uint64_t)((n_seq + per_doc - 1) / per_doc + 1);
    memcpy(p, &S, 8), p += 8;
    memcpy(p, &D, 8), p += 8;
    memcpy(p, lens, 4 * (size_t)n_seq), p += 4 * n_seq;
    int64_t ptr = 0, t = 0;
    for (int64_t s = 0; s < n_seq; s++) {
        memcpy(p, &ptr, 8), p += 8;
        for (int i = 0; i < lens[s]; i++) put(f->bin + ptr + i * widths[dtype], tokens[t++], dtype);
        ptr += lens[s] * (int64_t)widths[dtype];
    }
    f->bin_len = (size_t)ptr;
    for (uint64_t d = 0; d < D; d++) {
        int64_t v = (int64_t)d * per_doc < n_seq ? (int64_t)d * per_doc : n_seq;
        memcpy(p, &v, 8), p += 8;
    }
    f->idx_len = (size_t)(p - f->idx);
}

static void write_files(const files *f, const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s.idx", prefix);
    tu_write_file(path, f->idx, f->idx_len);
    snprintf(path, sizeof path, "%s.bin", prefix);
    tu_write_file(path, f->bin, f->bin_len);
}

/* n tokens in sequences of 1..7 tokens, one sequence per document. */
static int64_t ragged(double *tokens, int32_t *lens, int64_t n, int vocab, uint64_t seed) {
    int64_t s = 0, t = 0;
    while (t < n) {
        int32_t len = (int32_t)(1 + (seed + (uint64_t)s * 7) % 7);
        if (t + len > n) len = (int32_t)(n - t);
        for (int i = 0; i < len; i++, t++)
            tokens[t] = (double)((seed * 31 + (uint64_t)t * 13) % (uint64_t)vocab);
        lens[s++] = len;
    }
    return s;
}

static void indexed_config(hs_data_config *dc, const char *prefix, int eos_id) {
    memset(dc, 0, sizeof *dc);
    snprintf(dc->source, sizeof dc->source, "indexed");
    snprintf(dc->path, sizeof dc->path, "%s", prefix);
    dc->eos_id = eos_id;
    dc->val_fraction = 0.1;
}

static void test_indexed_stream_equals_the_hstk_file_of_the_same_tokens(void **state) {
    (void)state;
    enum { N = 3000, T = 16, V = 500 };
    static double tok[N];
    static int32_t lens[N];
    static uint32_t u[N];
    static files f;
    int64_t S = ragged(tok, lens, N, V, 5);
    for (int i = 0; i < N; i++) u[i] = (uint32_t)tok[i];
    char prefix[300], hstk[300];
    snprintf(prefix, sizeof prefix, "%s/same", tmpdir);
    snprintf(hstk, sizeof hstk, "%s/same.hstk", tmpdir);
    build(&f, 8, tok, lens, S, 1);
    write_files(&f, prefix);
    hs_error e;
    assert_int_equal(hs_tokens_write(hstk, u, N, &e), HS_OK);
    hs_data_config a, b;
    indexed_config(&a, prefix, -1);
    b = a;
    snprintf(b.source, sizeof b.source, "tokens");
    snprintf(b.path, sizeof b.path, "%s", hstk);
    hs_dataset *da, *db;
    assert_int_equal(hs_data_open(&a, T, V, 9, &da, &e), HS_OK);
    assert_int_equal(hs_data_open(&b, T, V, 9, &db, &e), HS_OK);
    assert_int_equal(hs_data_num_tokens(da), N);
    assert_int_equal(hs_data_num_train(da), hs_data_num_train(db));
    assert_int_equal(hs_data_num_val(da), hs_data_num_val(db));
    int64_t all = hs_data_num_train(da) + hs_data_num_val(da);
    int32_t t1[T], g1[T], t2[T], g2[T];
    for (int64_t s = 0; s < all; s++) {
        hs_data_sequence(da, s, t1, g1);
        hs_data_sequence(db, s, t2, g2);
        assert_memory_equal(t1, t2, sizeof t1);
        assert_memory_equal(g1, g2, sizeof g1);
    }
    for (int g = 0; g < 40; g++)
        assert_int_equal(hs_data_batch_sequence(da, g, 8, g % 8),
                         hs_data_batch_sequence(db, g, 8, g % 8));
    hs_data_free(da);
    hs_data_free(db);
}

/* Documents of two sequences each: an EOS after every document but the
 * last, none inside a document. */
static void test_eos_goes_between_documents_only(void **state) {
    (void)state;
    static files f;
    double tok[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t lens[] = {2, 1, 3, 0, 2, 1}; /* docs {1 2 | 3}, {4 5 6 | -}, {7 8 | 9} */
    build(&f, 4, tok, lens, 6, 2);
    hs_indexed *ix;
    hs_error e;
    assert_int_equal(hs_indexed_parse("mem", f.idx, f.idx_len, f.bin, f.bin_len, 50, 0, &ix, &e),
                     HS_OK);
    assert_int_equal(hs_indexed_num_documents(ix), 3);
    int32_t want[] = {1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9}, got[11];
    assert_int_equal(hs_indexed_num_tokens(ix), 11);
    hs_indexed_read(ix, 0, 11, got);
    assert_memory_equal(got, want, sizeof want);
    for (int p = 0; p < 11; p++) { /* any start position */
        hs_indexed_read(ix, p, 11 - p, got);
        assert_memory_equal(got, want + p, sizeof(int32_t) * (size_t)(11 - p));
    }
    hs_indexed_free(ix);
    assert_int_equal(hs_indexed_parse("mem", f.idx, f.idx_len, f.bin, f.bin_len, 50, -1, &ix, &e),
                     HS_OK);
    assert_int_equal(hs_indexed_num_tokens(ix), 9);
    hs_indexed_free(ix);
}

static void test_every_megatron_dtype_reads_the_same_ids(void **state) {
    (void)state;
    static files f;
    double tok[] = {0, 1, 17, 100, 127, 3, 42};
    int32_t lens[] = {3, 4};
    int32_t want[7], got[7];
    for (int i = 0; i < 7; i++) want[i] = (int32_t)tok[i];
    for (int dtype = 1; dtype <= 8; dtype++) {
        build(&f, dtype, tok, lens, 2, 1);
        hs_indexed *ix;
        hs_error e;
        assert_int_equal(
            hs_indexed_parse("mem", f.idx, f.idx_len, f.bin, f.bin_len, 128, -1, &ix, &e), HS_OK);
        hs_indexed_read(ix, 0, 7, got);
        assert_memory_equal(got, want, sizeof want);
        hs_indexed_free(ix);
    }
}

static void expect_refused(const files *f, int vocab, const char *field) {
    hs_indexed *ix = (hs_indexed *)1;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(
        hs_indexed_parse("bad/set", f->idx, f->idx_len, f->bin, f->bin_len, vocab, 0, &ix, &e),
        HS_ERR_CONFIG);
    assert_null(ix);
    assert_non_null(strstr(e.msg, "bad/set."));
    if (!strstr(e.msg, field)) fail_msg("'%s' not in: %s", field, e.msg);
}

static void test_each_bad_field_is_refused_by_name(void **state) {
    (void)state;
    static files good, f;
    double tok[] = {1, 2, 3, 4, 5, 6};
    int32_t lens[] = {2, 4};
    build(&good, 8, tok, lens, 2, 1);
    const size_t H = 34, lens_at = H, ptrs_at = H + 8, docs_at = H + 24;
    f = good, f.idx_len = 20;
    expect_refused(&f, 10, "shorter than the 34-byte header");
    f = good, f.idx[3] = 'X';
    expect_refused(&f, 10, "magic");
    f = good, f.idx[9] = 2;
    expect_refused(&f, 10, "version field is 2");
    f = good, f.idx[17] = 9;
    expect_refused(&f, 10, "dtype code 9");
    f = good, f.idx_len -= 8;
    expect_refused(&f, 10, "truncated or corrupt");
    f = good, memset(f.idx + 18, 0xff, 8); /* sequence count 2^64 - 1 */
    expect_refused(&f, 10, "sequence count field (18446744073709551615)");
    f = good, f.idx[lens_at + 4 + 3] = 0x80; /* length -2^31 + 4 */
    expect_refused(&f, 10, "sequence_lengths[1]");
    f = good, f.bin_len -= 1; /* the last sequence runs past the data */
    expect_refused(&f, 10, "sequence_pointers[1]");
    f = good, f.idx[ptrs_at + 8 + 7] = 0x80; /* a negative pointer */
    expect_refused(&f, 10, "sequence_pointers[1]");
    f = good, f.idx[docs_at + 16] = 1; /* last document index 1, not 2 */
    expect_refused(&f, 10, "document_indices[2]");
    f = good, f.idx[docs_at] = 1; /* first document index 1, not 0 */
    expect_refused(&f, 10, "document_indices[0]");
    f = good;
    expect_refused(&f, 6, "token 6 (uint16) at sequence 1, position 3");
    double frac[] = {1, 2.5};
    int32_t one[] = {2};
    build(&f, 7, frac, one, 1, 1);
    expect_refused(&f, 10, "token 2.5 (float32)");
    double neg[] = {1, -3};
    build(&f, 2, neg, one, 1, 1);
    expect_refused(&f, 10, "token -3 (int8)");
}

static void expect_open_error(const hs_data_config *dc, int vocab, const char *a, const char *b) {
    hs_dataset *ds = (hs_dataset *)1;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_data_open(dc, 8, vocab, 1, &ds, &e), HS_ERR_CONFIG);
    assert_null(ds);
    if (!strstr(e.msg, a) || !strstr(e.msg, b)) fail_msg("'%s' / '%s' not in: %s", a, b, e.msg);
}

/* Files on disk: a missing blend path and bad weights, each by name. */
static void test_blend_paths_and_weights_are_checked(void **state) {
    (void)state;
    static files f;
    static double tok[400];
    static int32_t lens[400];
    int64_t S = ragged(tok, lens, 400, 50, 1);
    build(&f, 8, tok, lens, S, 1);
    char a[300], missing[300];
    snprintf(a, sizeof a, "%s/bl_a", tmpdir);
    snprintf(missing, sizeof missing, "%s/nothing_here", tmpdir);
    write_files(&f, a);
    hs_blend_entry entries[2] = {{a, 1.0}, {missing, 1.0}};
    hs_data_config dc;
    indexed_config(&dc, "", -1);
    dc.blend = entries, dc.n_blend = 2;
    expect_open_error(&dc, 50, missing, ".bin");
    entries[1].path = a;
    entries[1].weight = -0.5;
    expect_open_error(&dc, 50, "data.blend[1].weight", "-0.5");
    entries[1].weight = 0, entries[0].weight = 0;
    expect_open_error(&dc, 50, "data.blend", "sum to 0");
    entries[0].weight = 1;
    snprintf(dc.path, sizeof dc.path, "%s", a);
    expect_open_error(&dc, 50, "data.blend", "data.path");
    indexed_config(&dc, a, 60);
    expect_open_error(&dc, 50, "data.eos_id", "60");
}

/* Two datasets at 0.7 / 0.3: over 10,000 samples each draws within 1% of
 * its weight; W = 1 and W = 4 read the same samples, and so does a run
 * that resumes at step 40 on another layout. */
static void test_blend_shares_layouts_and_resume(void **state) {
    (void)state;
    static files fa, fb;
    static double ta[6000], tb[3000];
    static int32_t la[6000], lb[3000];
    build(&fa, 8, ta, la, ragged(ta, la, 6000, 100, 2), 1);
    build(&fb, 4, tb, lb, ragged(tb, lb, 3000, 100, 3), 1);
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/bl7", tmpdir);
    snprintf(b, sizeof b, "%s/bl3", tmpdir);
    write_files(&fa, a);
    write_files(&fb, b);
    hs_blend_entry entries[2] = {{a, 0.7}, {b, 0.3}};
    hs_data_config dc;
    indexed_config(&dc, "", 0);
    dc.blend = entries, dc.n_blend = 2;
    enum { T = 8, G = 16, STEPS = 625 }; /* 10,000 samples */
    hs_dataset *one, *four, *resumed;
    hs_error e;
    assert_int_equal(hs_data_open(&dc, T, 100, 11, &one, &e), HS_OK);
    assert_int_equal(hs_data_open(&dc, T, 100, 11, &four, &e), HS_OK);
    assert_int_equal(hs_data_open(&dc, T, 100, 11, &resumed, &e), HS_OK);
    static int32_t x1[G * T], y1[G * T], x4[G * T], y4[G * T], xr[G * T], yr[G * T];
    int64_t from[2] = {0, 0};
    for (int g = 0; g < STEPS; g++) {
        for (int k = 0; k < G; k++) /* one rank, one micro-batch of G */
            from[hs_data_sequence_source(one, hs_data_batch_sequence(one, g, G, k))]++;
        hs_data_micro_batch(one, g, G, 0, G, 0, 1, x1, y1);
        for (int m = 0; m < 2; m++) /* four ranks, two micro-batches of 2 */
            for (int d = 0; d < 4; d++)
                hs_data_micro_batch(four, g, G, m, 2, d, 4, x4 + (m * 8 + d * 2) * T,
                                    y4 + (m * 8 + d * 2) * T);
        assert_memory_equal(x1, x4, sizeof x1);
        assert_memory_equal(y1, y4, sizeof y1);
        if (g >= 40 && g < 60) { /* the resumed run: two ranks, from step 41 on */
            for (int d = 1; d >= 0; d--)
                hs_data_micro_batch(resumed, g, G, 0, 8, d, 2, xr + d * 8 * T, yr + d * 8 * T);
            assert_memory_equal(x1, xr, sizeof x1);
        }
    }
    double share = (double)from[0] / (G * STEPS);
    assert_true(fabs(share - 0.7) < 0.01);
    assert_true(fabs((double)from[1] / (G * STEPS) - 0.3) < 0.01);
    /* Validation blends too: its first 10 sequences hold both datasets. */
    int n0 = 0;
    for (int v = 0; v < 10; v++)
        n0 += hs_data_sequence_source(one, hs_data_num_train(one) + v) == 0;
    assert_true(n0 == 7);
    hs_data_free(one);
    hs_data_free(four);
    hs_data_free(resumed);
}

/* The blending index alone: every prefix within one sample of its
 * target, out-of-order questions answered as in order, zero weights never
 * drawn, and caps respected by fill. */
static void test_blending_index_arithmetic(void **state) {
    (void)state;
    double w[3] = {5, 3, 2};
    hs_blend *b;
    hs_error e;
    assert_int_equal(hs_blend_create(w, 3, &b, &e), HS_OK);
    static int member[10000];
    static int64_t local[10000];
    int64_t count[3] = {0, 0, 0};
    for (int k = 0; k < 10000; k++) {
        member[k] = hs_blend_at(b, k, &local[k]);
        assert_int_equal(local[k], count[member[k]]++);
        for (int i = 0; i < 3; i++) assert_true(fabs((double)count[i] - w[i] / 10 * (k + 1)) < 1.0);
    }
    for (int k = 9999; k >= 0; k -= 997) { /* replays */
        int64_t l;
        assert_int_equal(hs_blend_at(b, k, &l), member[k]);
        assert_int_equal(l, local[k]);
    }
    hs_blend_free(b);
    double z[2] = {0, 1};
    assert_int_equal(hs_blend_create(z, 2, &b, &e), HS_OK);
    for (int k = 0; k < 100; k++) {
        int64_t l;
        assert_int_equal(hs_blend_at(b, k, &l), 1);
    }
    hs_blend_free(b);
    int64_t caps[3] = {2, 50, 50};
    int32_t m[30];
    int64_t l[30];
    assert_int_equal(hs_blend_fill(w, caps, 3, m, l, 30, &e), HS_OK);
    int got[3] = {0, 0, 0};
    for (int k = 0; k < 30; k++) got[m[k]]++;
    assert_int_equal(got[0], 2);
    assert_int_equal(got[1] + got[2], 28);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexed_stream_equals_the_hstk_file_of_the_same_tokens),
        cmocka_unit_test(test_eos_goes_between_documents_only),
        cmocka_unit_test(test_every_megatron_dtype_reads_the_same_ids),
        cmocka_unit_test(test_each_bad_field_is_refused_by_name),
        cmocka_unit_test(test_blend_paths_and_weights_are_checked),
        cmocka_unit_test(test_blend_shares_layouts_and_resume),
        cmocka_unit_test(test_blending_index_arithmetic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
