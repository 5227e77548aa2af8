/* ckpt/: the metadata file round-trips every field; a damaged one is
 * rejected with a message naming the file and the field; and the load path
 * on a checkpoint built here (two data files, uneven dim-0 chunks) reads
 * overlaps bitwise, zeroes a padded tail, and names the file, the tensor
 * and both checksums or lengths when a data file is corrupted or truncated;
 * a target in (guarded) device memory gets the same bytes across the seam. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt/ckpt_internal.h"

/* A [5, 3] float32 tensor "w" in chunks rows [0,3) (rank-0.bin) and [3,5)
 * (rank-1.bin), and a [4] bfloat16 tensor "b" whole in rank-0.bin after w's
 * chunk. Value of w at (i, j) = 10*i + j. */
typedef struct fixture {
    char dir[64];
    hs_ckpt_meta m;
    float w[15];
    uint16_t b[4];
} fixture;

static void build_meta(fixture *f) {
    hs_ckpt_meta *m = &f->m;
    memset(m, 0, sizeof *m);
    m->version = HS_CKPT_VERSION;
    m->world_size = 2;
    m->created_unix = 1700000000.5;
    m->state = (hs_ckpt_state){.step = 7,
                               .data_position = 8,
                               .optim_step = 7,
                               .rng_seed = 0xfedcba9876543210ull,
                               .rng_counter = 42,
                               .config_hash = 0x8000000000000001ull};
    m->n_files = 2;
    m->files = calloc(2, sizeof(hs_ckpt_file));
    snprintf(m->files[0].name, sizeof m->files[0].name, "rank-0.bin");
    snprintf(m->files[1].name, sizeof m->files[1].name, "rank-1.bin");
    m->files[0].bytes = 9 * 4 + 4 * 2;
    m->files[1].bytes = 6 * 4;
    int w = hs_ckpt_meta_add_tensor(m, "w", HS_DTYPE_F32, 2, (int64_t[]){5, 3});
    for (int k = 0; k < 2; k++) {
        hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(&m->tensors[w]);
        c->offset[0] = k ? 3 : 0;
        c->size[0] = k ? 2 : 3;
        c->size[1] = 3;
        c->file = k;
        c->byte_offset = 0;
        c->length = c->size[0] * 3 * 4;
        c->crc32 = hs_crc32(0, f->w + c->offset[0] * 3, (size_t)c->length);
    }
    int b = hs_ckpt_meta_add_tensor(m, "b", HS_DTYPE_BF16, 1, (int64_t[]){4});
    hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(&m->tensors[b]);
    c->size[0] = 4;
    c->file = 0;
    c->byte_offset = 36;
    c->length = 8;
    c->crc32 = hs_crc32(0, f->b, 8);
}

static void write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(a, 1, na, fp);
    if (nb) fwrite(b, 1, nb, fp);
    fclose(fp);
}

static void write_meta_file(fixture *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", f->dir, HS_CKPT_METADATA);
    FILE *fp = fopen(path, "w");
    hs_error e;
    assert_int_equal(hs_ckpt_meta_write(&f->m, fp, path, &e), HS_OK);
    fclose(fp);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/hs_ckpt_meta_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) f->w[i * 3 + j] = (float)(10 * i + j);
    for (int i = 0; i < 4; i++) f->b[i] = hs_f32_to_bf16(0.5f * (float)i - 1.0f);
    build_meta(f);
    char path[128];
    snprintf(path, sizeof path, "%s/rank-0.bin", f->dir);
    write_bytes(path, f->w, 36, f->b, 8);
    snprintf(path, sizeof path, "%s/rank-1.bin", f->dir);
    write_bytes(path, f->w + 9, 24, NULL, 0);
    write_meta_file(f);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    hs_error e;
    hs_ckpt_remove_dir(f->dir, &e);
    hs_ckpt_meta_free(&f->m);
    free(f);
    return 0;
}

static char *meta_text(const hs_ckpt_meta *m, size_t *len) {
    char *buf = NULL;
    FILE *fp = open_memstream(&buf, len);
    hs_error e;
    assert_int_equal(hs_ckpt_meta_write(m, fp, "mem", &e), HS_OK);
    fclose(fp);
    return buf;
}

static void test_metadata_round_trips_every_field(void **state) {
    fixture *f = *state;
    size_t len;
    char *text = meta_text(&f->m, &len);
    hs_ckpt_meta back;
    hs_error e;
    assert_int_equal(hs_ckpt_meta_parse(text, len, "mem", &back, &e), HS_OK);
    assert_int_equal(back.version, HS_CKPT_VERSION);
    assert_int_equal(back.world_size, 2);
    assert_true(back.created_unix == 1700000000.5);
    assert_memory_equal(&back.state, &f->m.state, sizeof back.state);
    assert_int_equal(back.n_files, 2);
    assert_int_equal(back.n_tensors, 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(back.files[i].name, f->m.files[i].name);
        assert_int_equal(back.files[i].bytes, f->m.files[i].bytes);
        const hs_ckpt_entry *a = &back.tensors[i], *b = &f->m.tensors[i];
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->ndim, b->ndim);
        assert_memory_equal(a->shape, b->shape, sizeof a->shape);
        assert_int_equal(a->n_chunks, b->n_chunks);
        for (int k = 0; k < a->n_chunks; k++)
            assert_memory_equal(&a->chunks[k], &b->chunks[k], sizeof(hs_ckpt_chunk));
    }
    hs_ckpt_meta_free(&back);
    free(text);
}

/* Replace the first `from` in the metadata text by `to` and parse it. */
static hs_status parse_edited(fixture *f, const char *from, const char *to, hs_error *e) {
    size_t len;
    char *text = meta_text(&f->m, &len);
    char *at = strstr(text, from);
    assert_non_null(at);
    size_t nf = strlen(from), nt = strlen(to);
    char *out = malloc(len + nt + 1);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    memcpy(out + pre, to, nt);
    memcpy(out + pre + nt, at + nf, len - pre - nf + 1);
    hs_ckpt_meta back;
    hs_status s = hs_ckpt_meta_parse(out, strlen(out), "x/metadata.json", &back, e);
    if (s == HS_OK) hs_ckpt_meta_free(&back);
    free(out);
    free(text);
    return s;
}

static void expect_rejected(fixture *f, const char *from, const char *to, const char *msg_part) {
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(parse_edited(f, from, to, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, msg_part) || !strstr(e.msg, "x/metadata.json"))
        fail_msg("message '%s' lacks '%s' or the file name", e.msg, msg_part);
}

static void test_damaged_metadata_is_rejected_naming_file_and_field(void **state) {
    fixture *f = *state;
    expect_rejected(f, "\"hypershard-checkpoint\"", "\"other\"", "not a hypershard checkpoint");
    expect_rejected(f, "\"version\":1", "\"version\":9", "version 9");
    expect_rejected(f, "\"step\":7", "\"step\":\"7\"", "state.step");
    expect_rejected(f, "\"crc32\":\"0x", "\"crc32\":\"1x", "crc32");
    expect_rejected(f, "\"name\":\"rank-1.bin\"", "\"name\":\"../rank-1.bin\"", "unsafe file name");
    expect_rejected(f, "\"dtype\":\"float32\"", "\"dtype\":\"int8\"", "unknown dtype");
    expect_rejected(f, "{\"format\"", "[{\"format\"", "not valid JSON");
}

static void test_metadata_that_is_not_json_is_refused_without_quoting_it(void **state) {
    (void)state;
    const char *text = "root:x:0:0:root:/root:/bin/bash\n";
    hs_ckpt_meta m;
    hs_error e;
    assert_int_equal(hs_ckpt_meta_parse(text, strlen(text), "x/metadata.json", &m, &e),
                     HS_ERR_FORMAT);
    if (!strstr(e.msg, "x/metadata.json:1:") || !strstr(e.msg, "not valid JSON") ||
        strstr(e.msg, "root"))
        fail_msg("unexpected message: %s", e.msg);
}

static void test_overlapping_or_missing_chunks_are_rejected(void **state) {
    fixture *f = *state;
    /* second chunk of w starting at row 2 overlaps the first */
    expect_rejected(f, "\"offsets\":[3,0]", "\"offsets\":[2,0]", "overlap");
    /* a hole: the second chunk claims rows [3,4) only (and 12 bytes) */
    hs_ckpt_chunk *c = &f->m.tensors[0].chunks[1];
    c->size[0] = 1;
    c->length = 12;
    f->m.files[1].bytes = 12;
    expect_rejected(f, "\"format\"", "\"format\"", "cover 12 of 15 elements");
}

static void test_bytes_outside_every_chunk_are_rejected_as_padding(void **state) {
    fixture *f = *state;
    /* rank-1.bin claims 4 bytes more than its chunks hold */
    expect_rejected(f, "\"bytes\":24", "\"bytes\":28", "do not tile its 28 bytes");
}

static void test_duplicate_tensor_names_are_rejected(void **state) {
    fixture *f = *state;
    snprintf(f->m.tensors[1].name, sizeof f->m.tensors[1].name, "w");
    expect_rejected(f, "\"format\"", "\"format\"", "'w' is listed twice");
}

static void test_chunk_offset_near_int64_max_is_rejected_naming_tensor_and_dim(void **state) {
    fixture *f = *state;
    /* offset + size wraps negative: it used to pass as "inside [5, 3]" and
     * then abort the load, whose rows [3, 5) were never filled */
    expect_rejected(f, "\"offsets\":[3,0]", "\"offsets\":[9223372036854775806,0]",
                    "dim 0: offset 9223372036854775806, size 2, extent 5");
    expect_rejected(f, "\"offsets\":[3,0]", "\"offsets\":[3,9223372036854775807]",
                    "outside the tensor");
}

static void test_element_count_that_wraps_to_zero_is_rejected(void **state) {
    fixture *f = *state;
    /* [2^32, 2^32] has 2^64 elements: an unchecked product is 0, which
     * its zero chunks "covered" */
    hs_ckpt_meta_add_tensor(&f->m, "huge", HS_DTYPE_F32, 2, (int64_t[]){1ll << 32, 1ll << 32});
    expect_rejected(f, "\"format\"", "\"format\"",
                    "tensor 'huge' float32 [4294967296, 4294967296] has more elements or bytes");
    /* 2^62 elements fit, their 2^64 bytes do not */
    f->m.tensors[2].shape[0] = f->m.tensors[2].shape[1] = 1ll << 31;
    expect_rejected(f, "\"format\"", "\"format\"", "'huge' float32 [2147483648, 2147483648] has");
    /* no elements, but extents no row size or shard offset can be
     * computed from (found by fuzz_ckpt_meta: an FSDP dim-0 read of it
     * overflowed in hs_fsdp_row_offset) */
    f->m.tensors[2].ndim = 4;
    memcpy(f->m.tensors[2].shape, (int64_t[]){INT64_MAX, 0, 1, INT64_MAX}, 4 * sizeof(int64_t));
    expect_rejected(f, "\"format\"", "\"format\"",
                    "[9223372036854775807, 0, 1, 9223372036854775807] has more elements");
    f->m.tensors[2].ndim = 2;
    memcpy(f->m.tensors[2].shape, (int64_t[]){0, INT64_MAX / 2}, 2 * sizeof(int64_t));
    expect_rejected(f, "\"format\"", "\"format\"", "zero extents counted as 1");
}

static void test_byte_offset_past_the_file_end_is_rejected_without_overflow(void **state) {
    fixture *f = *state;
    expect_rejected(f, "\"byte_offset\":36", "\"byte_offset\":9223372036854775800",
                    "8 bytes at byte_offset 9223372036854775800 lie outside rank-0.bin (44 bytes)");
    expect_rejected(f, "\"bytes\":24", "\"bytes\":-24", "rank-1.bin has -24 bytes");
}

static void test_duplicate_files_negative_state_and_bad_world_are_rejected(void **state) {
    fixture *f = *state;
    snprintf(f->m.files[1].name, sizeof f->m.files[1].name, "rank-0.bin");
    expect_rejected(f, "\"format\"", "\"format\"", "rank-0.bin is listed twice");
    snprintf(f->m.files[1].name, sizeof f->m.files[1].name, "rank-1.bin");
    expect_rejected(f, "\"step\":7", "\"step\":-7", "state.step -7 is negative");
    expect_rejected(f, "\"optim_step\":7", "\"optim_step\":-1", "state.optim_step -1 is negative");
    expect_rejected(f, "\"world_size\":2", "\"world_size\":0", "root.world_size");
    expect_rejected(f, "\"world_size\":2", "\"world_size\":4294967298", "root.world_size");
    expect_rejected(f, "\"created_unix\":1700000000.5", "\"created_unix\":1e300",
                    "root.created_unix");
    /* a duplicated chunk overlaps itself */
    hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(&f->m.tensors[1]);
    *c = f->m.tensors[1].chunks[0];
    expect_rejected(f, "\"format\"", "\"format\"", "'b' [4]: two chunks overlap");
}

static void test_data_file_not_named_rank_r_bin_is_refused(void **state) {
    fixture *f = *state;
    /* metadata.json or config.yaml as a "data file" would alias the step
     * directory's own files; rank-2.bin cannot come from a 2-rank save */
    expect_rejected(f, "\"name\":\"rank-0.bin\"", "\"name\":\"metadata.json\"",
                    "files[0] has a missing or unsafe file name (want rank-<r>.bin");
    expect_rejected(f, "\"name\":\"rank-1.bin\"", "\"name\":\"rank-2.bin\"", "files[1]");
    expect_rejected(f, "\"name\":\"rank-1.bin\"", "\"name\":\"rank-01.bin\"", "files[1]");
}

static void test_tensor_with_no_elements_and_no_chunks_is_accepted(void **state) {
    fixture *f = *state;
    /* its chunk list is empty (NULL): the overlap check must not touch it */
    hs_ckpt_meta_add_tensor(&f->m, "none", HS_DTYPE_F32, 2, (int64_t[]){0, 8});
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(parse_edited(f, "\"format\"", "\"format\"", &e), HS_OK);
}

static void target_rows(hs_ckpt_tensor *t, float *buf, int64_t row0, int64_t rows,
                        int64_t storage) {
    hs_ckpt_tensor_full(t, "w", HS_DTYPE_F32, 2, (int64_t[]){5, 3}, buf);
    t->offset[0] = row0;
    t->size[0] = rows;
    t->storage_rows = storage;
}

static void test_read_overlap_across_two_files_is_bitwise_and_tail_zero(void **state) {
    fixture *f = *state;
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(f->dir, &c, &e), HS_OK);
    assert_int_equal(hs_ckpt_get_state(c)->step, 7);
    assert_int_equal(hs_ckpt_get_state(c)->rng_seed, 0xfedcba9876543210ull);
    /* rows [2,4) span both saved chunks; a padded storage of 3 rows */
    float buf[9];
    for (int k = 0; k < 9; k++) buf[k] = 123.0f;
    hs_ckpt_tensor t;
    target_rows(&t, buf, 2, 2, 3);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_OK);
    assert_memory_equal(buf, f->w + 6, 6 * sizeof(float));
    for (int k = 6; k < 9; k++) assert_true(buf[k] == 0.0f);
    /* a zero-row target at the end reads nothing and succeeds */
    target_rows(&t, buf, 5, 0, 0);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_OK);
    uint16_t b[4];
    hs_ckpt_tensor_full(&t, "b", HS_DTYPE_BF16, 1, (int64_t[]){4}, b);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_OK);
    assert_memory_equal(b, f->b, sizeof b);
    int64_t bytes = 0;
    assert_int_equal(hs_ckpt_verify(c, &bytes, &e), HS_OK);
    assert_int_equal(bytes, 68);
    hs_ckpt_close(c);
}

/* A target in guarded device memory (HS_DEVICE_GUARD: the host cannot
 * touch it) is filled by H2D copies and its padded tail zeroed by the
 * device: the same bytes a host target gets, read back D2H. */
static void test_read_into_guarded_device_memory_is_bitwise_with_zero_tail(void **state) {
    fixture *f = *state;
    setenv("HS_DEVICE_GUARD", "1", 1);
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    unsetenv("HS_DEVICE_GUARD");
    assert_non_null(d->guard);
    float *dw = hs_device_alloc(d, 9 * sizeof(float)), host[9];
    uint16_t *db = hs_device_alloc(d, sizeof f->b), b[4];
    for (int k = 0; k < 9; k++) host[k] = 123.0f;
    hs_device_copy(d, dw, host, sizeof host, HS_COPY_H2D);
    hs_ckpt *c = NULL;
    assert_int_equal(hs_ckpt_open(f->dir, &c, &e), HS_OK);
    hs_ckpt_tensor t[2];
    target_rows(&t[0], dw, 2, 2, 3); /* rows [2,4) from both files, 3 rows of storage */
    hs_ckpt_tensor_full(&t[1], "b", HS_DTYPE_BF16, 1, (int64_t[]){4}, db);
    t[0].dev = t[1].dev = d;
    assert_int_equal(hs_ckpt_read(c, t, 2, &e), HS_OK);
    hs_ckpt_close(c);
    hs_device_copy(d, host, dw, sizeof host, HS_COPY_D2H);
    hs_device_copy(d, b, db, sizeof b, HS_COPY_D2H);
    assert_memory_equal(host, f->w + 6, 6 * sizeof(float));
    for (int k = 6; k < 9; k++) assert_true(host[k] == 0.0f);
    assert_memory_equal(b, f->b, sizeof b);
    hs_device_free_mem(d, dw);
    hs_device_free_mem(d, db);
    hs_device_free(d);
}

static void test_missing_tensor_and_shape_mismatch_name_the_fqn_and_shapes(void **state) {
    fixture *f = *state;
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(f->dir, &c, &e), HS_OK);
    float buf[20];
    hs_ckpt_tensor t;
    hs_ckpt_tensor_full(&t, "nope", HS_DTYPE_F32, 1, (int64_t[]){3}, buf);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "has no tensor 'nope'"));
    hs_ckpt_tensor_full(&t, "w", HS_DTYPE_F32, 2, (int64_t[]){4, 5}, buf);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "'w' is float32 [5, 3] there, the model expects float32 [4, 5]"));
    hs_ckpt_close(c);
}

static void test_flipped_byte_names_file_tensor_and_both_crcs(void **state) {
    fixture *f = *state;
    char path[128];
    snprintf(path, sizeof path, "%s/rank-1.bin", f->dir);
    FILE *fp = fopen(path, "r+b");
    fseek(fp, 5, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 5, SEEK_SET);
    fputc(ch ^ 0x01, fp);
    fclose(fp);
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(f->dir, &c, &e), HS_OK); /* lengths are fine */
    float buf[6];
    hs_ckpt_tensor t;
    target_rows(&t, buf, 0, 2, 0); /* rows [0,2) need rank-0.bin only */
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_OK);
    target_rows(&t, buf, 3, 2, 0);
    assert_int_equal(hs_ckpt_read(c, &t, 1, &e), HS_ERR_FORMAT);
    char want[160];
    snprintf(want, sizeof want, "the metadata expects 0x%08x", f->m.tensors[0].chunks[1].crc32);
    if (!strstr(e.msg, path) || !strstr(e.msg, "tensor 'w' chunk [3:5, 0:3]") ||
        !strstr(e.msg, "corrupted") || !strstr(e.msg, want))
        fail_msg("unexpected message: %s", e.msg);
    hs_ckpt_close(c);
}

static void test_truncated_file_names_file_lengths_and_tensor(void **state) {
    fixture *f = *state;
    char path[128];
    snprintf(path, sizeof path, "%s/rank-0.bin", f->dir);
    assert_int_equal(truncate(path, 40), 0);
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(f->dir, &c, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, path) || !strstr(e.msg, "is 40 bytes, expected 44") ||
        !strstr(e.msg, "truncated") || !strstr(e.msg, "'b'"))
        fail_msg("unexpected message: %s", e.msg);
}

static void test_latest_is_followed_and_a_plain_dir_is_a_usage_error(void **state) {
    fixture *f = *state;
    char parent[64];
    snprintf(parent, sizeof parent, "/tmp/hs_ckpt_parent_XXXXXX");
    assert_non_null(mkdtemp(parent));
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(parent, &c, &e), HS_ERR_USAGE);
    assert_non_null(strstr(e.msg, "is not a checkpoint"));
    char step[160];
    snprintf(step, sizeof step, "%s/step-7", parent);
    assert_int_equal(rename(f->dir, step), 0);
    assert_int_equal(hs_ckpt_write_atomic(parent, HS_CKPT_LATEST, "step-7\n", &e), HS_OK);
    assert_int_equal(hs_ckpt_open(parent, &c, &e), HS_OK);
    assert_string_equal(hs_ckpt_path(c), step);
    hs_ckpt_close(c);
    hs_ckpt_config cfg = {.keep_last = 2};
    snprintf(cfg.dir, sizeof cfg.dir, "%s", parent);
    snprintf(cfg.resume, sizeof cfg.resume, "auto");
    char path[HS_PATH_MAX];
    bool found = false;
    assert_int_equal(hs_ckpt_resolve_resume(&cfg, path, sizeof path, &found, &e), HS_OK);
    assert_true(found);
    assert_string_equal(path, step);
    snprintf(cfg.resume, sizeof cfg.resume, "none");
    assert_int_equal(hs_ckpt_resolve_resume(&cfg, path, sizeof path, &found, &e), HS_OK);
    assert_false(found);
    assert_int_equal(rename(step, f->dir), 0);
    assert_int_equal(hs_ckpt_remove_dir(parent, &e), HS_OK);
}

static void test_metadata_of_another_step_inside_step_3_is_refused(void **state) {
    fixture *f = *state;
    char parent[64], step[160];
    snprintf(parent, sizeof parent, "/tmp/hs_ckpt_parent_XXXXXX");
    assert_non_null(mkdtemp(parent));
    snprintf(step, sizeof step, "%s/step-3", parent); /* the metadata says step 7 */
    assert_int_equal(rename(f->dir, step), 0);
    hs_ckpt *c = NULL;
    hs_error e;
    assert_int_equal(hs_ckpt_open(step, &c, &e), HS_ERR_FORMAT);
    assert_null(c);
    if (!strstr(e.msg, "step-3/metadata.json: state.step is 7 but the directory is step-3"))
        fail_msg("unexpected message: %s", e.msg);
    assert_int_equal(hs_ckpt_write_atomic(parent, HS_CKPT_LATEST, "step-3\n", &e), HS_OK);
    assert_int_equal(hs_ckpt_open(parent, &c, &e), HS_ERR_FORMAT); /* through latest too */
    assert_non_null(strstr(e.msg, "state.step is 7"));
    char seven[160];
    snprintf(seven, sizeof seven, "%s/step-7/", parent); /* a trailing slash is the same dir */
    assert_int_equal(rename(step, seven), 0);
    assert_int_equal(hs_ckpt_open(seven, &c, &e), HS_OK);
    hs_ckpt_close(c);
    assert_int_equal(rename(seven, f->dir), 0);
    assert_int_equal(hs_ckpt_remove_dir(parent, &e), HS_OK);
}

/* `latest` must be a small regular file naming step-<N>: a link to another
 * file (here one holding a fake password line), binary bytes or a name
 * with a NUL after it are refused naming the path, and the foreign bytes
 * never appear in the message. */
static void test_latest_that_is_a_link_or_garbage_is_refused_without_echoing_it(void **state) {
    (void)state;
    char parent[64], latest[128], secret[128];
    snprintf(parent, sizeof parent, "/tmp/hs_ckpt_latest_XXXXXX");
    assert_non_null(mkdtemp(parent));
    snprintf(latest, sizeof latest, "%s/latest", parent);
    snprintf(secret, sizeof secret, "%s/secret", parent);
    FILE *fp = fopen(secret, "w");
    fputs("root:x:0:0:root:/root:/bin/bash\n", fp);
    fclose(fp);
    assert_int_equal(symlink(secret, latest), 0);
    hs_ckpt *c = NULL;
    hs_error e;
    char name[64];
    bool found = true;
    assert_int_equal(hs_ckpt_open(parent, &c, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, latest) || !strstr(e.msg, "is a symbolic link") ||
        !strstr(e.msg, "step-100") || strstr(e.msg, "root:"))
        fail_msg("unexpected message: %s", e.msg);
    assert_int_equal(unlink(latest), 0);
    assert_int_equal(rename(secret, latest), 0); /* the same bytes as a plain file */
    assert_int_equal(hs_ckpt_latest_read(parent, name, sizeof name, &found, &e), HS_ERR_FORMAT);
    assert_false(found);
    if (!strstr(e.msg, "holds 32 bytes that are not a step directory name") ||
        strstr(e.msg, "root:"))
        fail_msg("unexpected message: %s", e.msg);
    write_bytes(latest, "step-3\0x\n", 9, NULL, 0);
    assert_int_equal(hs_ckpt_latest_read(parent, name, sizeof name, &found, &e), HS_ERR_FORMAT);
    write_bytes(latest, "step-3x\n", 8, NULL, 0); /* name-like: shown, to fix it by hand */
    assert_int_equal(hs_ckpt_latest_read(parent, name, sizeof name, &found, &e), HS_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "names 'step-3x'"));
    write_bytes(latest, "step-3\n", 7, NULL, 0);
    assert_int_equal(hs_ckpt_latest_read(parent, name, sizeof name, &found, &e), HS_OK);
    assert_true(found);
    assert_string_equal(name, "step-3");
    assert_int_equal(hs_ckpt_remove_dir(parent, &e), HS_OK);
}

/* verify reads a chunk in 16 MiB pieces: an 18 MiB chunk is checked whole
 * (CRC chained over the pieces), and damage in its second piece is found
 * with the byte range and both CRCs, or as truncation with the file's end. */
static void test_verify_checks_an_18_mib_chunk_piece_by_piece(void **state) {
    (void)state;
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/hs_ckpt_big_XXXXXX");
    assert_non_null(mkdtemp(dir));
    const int64_t n = 18 << 18, bytes = n * 4; /* 18 MiB of float32 */
    unsigned char *data = malloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) data[i] = (unsigned char)(i * 7 + (i >> 12));
    hs_ckpt_meta m = {.version = HS_CKPT_VERSION, .world_size = 1, .n_files = 1};
    m.files = calloc(1, sizeof(hs_ckpt_file));
    snprintf(m.files[0].name, sizeof m.files[0].name, "rank-0.bin");
    m.files[0].bytes = bytes;
    int t = hs_ckpt_meta_add_tensor(&m, "big", HS_DTYPE_F32, 1, (int64_t[]){n});
    hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(&m.tensors[t]);
    c->size[0] = n;
    c->length = bytes;
    c->crc32 = hs_crc32(0, data, (size_t)bytes);
    snprintf(path, sizeof path, "%s/rank-0.bin", dir);
    data[17 << 20] ^= 1; /* in the second piece */
    write_bytes(path, data, (size_t)bytes, NULL, 0);
    snprintf(path, sizeof path, "%s/%s", dir, HS_CKPT_METADATA);
    FILE *fp = fopen(path, "w");
    hs_error e;
    assert_int_equal(hs_ckpt_meta_write(&m, fp, path, &e), HS_OK);
    fclose(fp);
    hs_ckpt *ck = NULL;
    int64_t verified = 0;
    assert_int_equal(hs_ckpt_open(dir, &ck, &e), HS_OK);
    assert_int_equal(hs_ckpt_verify(ck, &verified, &e), HS_ERR_FORMAT);
    char want[128];
    snprintf(want, sizeof want, "bytes [0, %lld)) has CRC32 0x%08x, the metadata expects 0x%08x",
             (long long)bytes, hs_crc32(0, data, (size_t)bytes), c->crc32);
    if (!strstr(e.msg, want)) fail_msg("unexpected message: %s", e.msg);
    snprintf(path, sizeof path, "%s/rank-0.bin", dir);
    data[17 << 20] ^= 1;
    write_bytes(path, data, (size_t)bytes, NULL, 0);
    assert_int_equal(hs_ckpt_verify(ck, &verified, &e), HS_OK);
    assert_int_equal(verified, bytes);
    assert_int_equal(truncate(path, 17 << 20), 0); /* after open: only the read sees it */
    assert_int_equal(hs_ckpt_verify(ck, &verified, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, "is truncated") || !strstr(e.msg, "the file ends at 17825792"))
        fail_msg("unexpected message: %s", e.msg);
    hs_ckpt_close(ck);
    hs_ckpt_meta_free(&m);
    free(data);
    assert_int_equal(hs_ckpt_remove_dir(dir, &e), HS_OK);
}

static void test_resume_auto_in_an_empty_dir_starts_fresh(void **state) {
    (void)state;
    hs_ckpt_config cfg = {.keep_last = 2};
    snprintf(cfg.dir, sizeof cfg.dir, "/tmp/hs_ckpt_never_created_dir");
    snprintf(cfg.resume, sizeof cfg.resume, "auto");
    char path[HS_PATH_MAX];
    bool found = true;
    hs_error e;
    assert_int_equal(hs_ckpt_resolve_resume(&cfg, path, sizeof path, &found, &e), HS_OK);
    assert_false(found);
    snprintf(cfg.resume, sizeof cfg.resume, "/tmp/hs_ckpt_never_created_dir/step-3");
    assert_int_equal(hs_ckpt_resolve_resume(&cfg, path, sizeof path, &found, &e), HS_ERR_USAGE);
    assert_non_null(strstr(e.msg, "checkpoint.resume = /tmp/hs_ckpt_never_created_dir/step-3"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_metadata_round_trips_every_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_metadata_is_rejected_naming_file_and_field,
                                        setup, teardown),
        cmocka_unit_test(test_metadata_that_is_not_json_is_refused_without_quoting_it),
        cmocka_unit_test_setup_teardown(test_overlapping_or_missing_chunks_are_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bytes_outside_every_chunk_are_rejected_as_padding,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_tensor_names_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_overlap_across_two_files_is_bitwise_and_tail_zero,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_read_into_guarded_device_memory_is_bitwise_with_zero_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_missing_tensor_and_shape_mismatch_name_the_fqn_and_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_byte_names_file_tensor_and_both_crcs, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_truncated_file_names_file_lengths_and_tensor, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_latest_is_followed_and_a_plain_dir_is_a_usage_error,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_chunk_offset_near_int64_max_is_rejected_naming_tensor_and_dim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_element_count_that_wraps_to_zero_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_byte_offset_past_the_file_end_is_rejected_without_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_duplicate_files_negative_state_and_bad_world_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_data_file_not_named_rank_r_bin_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tensor_with_no_elements_and_no_chunks_is_accepted,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_metadata_of_another_step_inside_step_3_is_refused,
                                        setup, teardown),
        cmocka_unit_test(test_latest_that_is_a_link_or_garbage_is_refused_without_echoing_it),
        cmocka_unit_test(test_verify_checks_an_18_mib_chunk_piece_by_piece),
        cmocka_unit_test(test_resume_auto_in_an_empty_dir_starts_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
