/* libFuzzer target for the checkpoint readers: metadata.json, `latest`, and
 * the chunk-box checks behind them.
 *
 * Input: metadata.json text, optionally followed by a NUL byte and the bytes
 * of a `latest` file. Every input must parse or fail with a message, with no
 * crash, leak or sanitizer report. The property that matters is that
 * whatever the metadata checks accept can be loaded: an accepted metadata
 * file (up to 256 KiB of data) is written out as a step directory with data
 * files of the lengths it claims and CRC32s that match their bytes, and
 * then open, inspect, verify, and reads of every tensor whole and as FSDP
 * dim-0 shards over 2 and 3 ranks must all succeed; a failure aborts. The
 * `latest` bytes must either be refused or name a step-<N> directory.
 *
 * An input whose first byte is 0xB0 is not JSON but a compact description
 * of chunk boxes (see from_boxes), checked with hs_ckpt_meta_check as a save
 * checks its plan: mutations then reach the box, overlap and byte-range
 * checks directly, with extents drawn from small values and from the edges
 * of int64 (2^31, 2^32, 2^62, INT64_MAX). What the check accepts must load
 * like an accepted metadata file. */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

#define MAX_DATA_BYTES (256 << 10)

static char g_dir[256]; /* scratch: <g_dir>/latest and <g_dir>/step-0/ */
static char g_step[288];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The scratch directory goes when the run ends (libFuzzer exits through
 * exit() at -max_total_time and -runs); a crash leaves it for the replay. */
static void remove_scratch(void) { nftw(g_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/hs_fuzz_ckpt_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    atexit(remove_scratch);
    snprintf(g_step, sizeof g_step, "%s/step-0", g_dir);
    return 0;
}

static void die(const char *what, const hs_error *e) {
    fprintf(stderr, "accepted metadata then: %s: %s\n", what, e ? e->msg : "");
    abort();
}

static void write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(buf, 1, n, f) != n) || fclose(f) != 0) abort();
}

/* Byte i of every data file: distinct enough that a chunk read from the
 * wrong place, or an element copied to the wrong place, shows. */
static unsigned char pattern(int64_t i) { return (unsigned char)(i * 131 + 7 + (i >> 8)); }

/* Data files of the lengths the metadata claims, every chunk's CRC32 set
 * to match, and the metadata written back (state.step 0, to match the
 * step-0 directory). */
static void materialize(hs_ckpt_meta *m) {
    unsigned char *bytes = malloc(MAX_DATA_BYTES);
    if (!bytes) abort();
    for (int i = 0; i < MAX_DATA_BYTES; i++) bytes[i] = pattern(i);
    char path[HS_PATH_MAX];
    for (int f = 0; f < m->n_files; f++) {
        snprintf(path, sizeof path, "%s/%s", g_step, m->files[f].name);
        write_file(path, bytes, (size_t)m->files[f].bytes);
    }
    for (int i = 0; i < m->n_tensors; i++)
        for (int k = 0; k < m->tensors[i].n_chunks; k++) {
            hs_ckpt_chunk *c = &m->tensors[i].chunks[k];
            c->crc32 = hs_crc32(0, bytes + c->byte_offset, (size_t)c->length);
        }
    free(bytes);
    m->state.step = 0;
    snprintf(path, sizeof path, "%s/%s", g_step, HS_CKPT_METADATA);
    FILE *f = fopen(path, "w");
    hs_error e;
    if (!f || hs_ckpt_meta_write(m, f, path, &e) != HS_OK || fclose(f) != 0) abort();
}

/* The whole tensor as the metadata describes it, element by element: an
 * oracle for the box copies of the load. */
static unsigned char *expected(const hs_ckpt_entry *t) {
    size_t es = hs_dtype_size(t->dtype);
    int64_t numel = hs_ckpt_entry_numel(t);
    unsigned char *out = malloc((size_t)(numel > 0 ? numel : 1) * es);
    if (!out) abort();
    for (int k = 0; k < t->n_chunks; k++) {
        const hs_ckpt_chunk *c = &t->chunks[k];
        for (int64_t j = 0; j < hs_ckpt_box_numel(t->ndim, c->size); j++) {
            int64_t rest = j, g = 0, stride = 1;
            for (int d = t->ndim - 1; d >= 0; d--) {
                g += (c->offset[d] + rest % c->size[d]) * stride;
                rest /= c->size[d];
                stride *= t->shape[d];
            }
            for (size_t b = 0; b < es; b++)
                out[(size_t)g * es + b] = pattern(c->byte_offset + j * (int64_t)es + (int64_t)b);
        }
    }
    return out;
}

/* Read tensor t whole (w = 1) or as each FSDP dim-0 shard of w ranks, and
 * compare with the oracle. */
static void read_as(hs_ckpt *c, const hs_ckpt_entry *t, const unsigned char *want, int w) {
    size_t es = hs_dtype_size(t->dtype);
    int64_t numel = hs_ckpt_entry_numel(t);
    unsigned char *buf = malloc((size_t)(numel > 0 ? numel : 1) * es);
    if (!buf) abort();
    for (int r = 0; r < w; r++) {
        hs_ckpt_tensor tg;
        hs_error e;
        if (w == 1) hs_ckpt_tensor_full(&tg, t->name, t->dtype, t->ndim, t->shape, buf);
        else hs_ckpt_tensor_dim0(&tg, t->name, t->dtype, t->ndim, t->shape, w, r, buf);
        if (hs_ckpt_read(c, &tg, 1, &e) != HS_OK) die("read", &e);
        size_t at = (size_t)(tg.offset[0] * (t->shape[0] ? numel / t->shape[0] : 0)) * es;
        if (memcmp(buf, want + at, (size_t)hs_ckpt_tensor_numel(&tg) * es) != 0) {
            fprintf(stderr, "tensor '%s' read as shard %d of %d differs from the saved bytes\n",
                    t->name, r, w);
            abort();
        }
    }
    free(buf);
}

static void load_everything(hs_ckpt_meta *m) {
    int64_t total = 0;
    for (int f = 0; f < m->n_files; f++) total += m->files[f].bytes; /* checked: fits */
    if (total > MAX_DATA_BYTES) return;
    if (mkdir(g_step, 0755) != 0) abort();
    materialize(m);
    hs_ckpt *c = NULL;
    hs_error e;
    if (hs_ckpt_open(g_step, &c, &e) != HS_OK) die("open", &e);
    FILE *null = fopen("/dev/null", "w");
    hs_ckpt_print(c, null);
    fclose(null);
    int64_t verified = 0;
    if (hs_ckpt_verify(c, &verified, &e) != HS_OK) die("verify", &e);
    if (verified != total) die("verify counted other bytes than the files hold", NULL);
    for (int i = 0; i < m->n_tensors; i++) {
        unsigned char *want = expected(&m->tensors[i]);
        for (int w = 1; w <= 3; w++) read_as(c, &m->tensors[i], want, w);
        free(want);
    }
    hs_ckpt_close(c);
    if (hs_ckpt_remove_dir(g_step, &e) != HS_OK) die("cleaning up", &e);
}

/* Reads the box description one byte at a time; past the end, zeros. */
typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static unsigned next(reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

/* A small value, or (high bit set) one at the edge of int64. */
static int64_t value(reader *r) {
    static const int64_t edge[8] = {
        0, -1, 1ll << 31, 1ll << 32, 1ll << 62, INT64_MAX - 1, INT64_MAX, INT64_MIN};
    unsigned b = next(r);
    return b & 0x80 ? edge[b & 7] : (int64_t)(b % 16);
}

/* Up to 2 tensors over up to 4 files; each chunk's bytes follow the
 * previous ones of its file, with the byte offset, the length and the
 * file's size nudged by value() so that gaps, overlaps and wraps occur. */
static void from_boxes(reader *r, hs_ckpt_meta *m) {
    memset(m, 0, sizeof *m);
    m->version = HS_CKPT_VERSION;
    m->n_files = m->world_size = 1 + (int)(next(r) % 4);
    m->files = calloc((size_t)m->n_files, sizeof(hs_ckpt_file));
    for (int f = 0; f < m->n_files; f++) snprintf(m->files[f].name, 64, "rank-%d.bin", f);
    int n_tensors = 1 + (int)(next(r) % 2);
    for (int i = 0; i < n_tensors; i++) {
        int64_t shape[HS_CKPT_DIMS];
        int ndim = 1 + (int)(next(r) % HS_CKPT_DIMS);
        hs_dtype dt = (hs_dtype)(next(r) % HS_DTYPE_COUNT);
        for (int d = 0; d < ndim; d++) shape[d] = value(r);
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        int idx = hs_ckpt_meta_add_tensor(m, name, dt, ndim, shape);
        hs_ckpt_entry *t = &m->tensors[idx]; /* after the call: it may move the table */
        int n_chunks = (int)(next(r) % 5);
        for (int k = 0; k < n_chunks; k++) {
            hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(t);
            for (int d = 0; d < ndim; d++) c->offset[d] = value(r), c->size[d] = value(r);
            c->file = (int)(next(r) % (unsigned)m->n_files);
            hs_checked ck = {false};
            int64_t want =
                hs_ck_mul(&ck, hs_ck_prod(&ck, c->size, ndim), (int64_t)hs_dtype_size(dt));
            hs_ckpt_file *f = &m->files[c->file];
            c->byte_offset = hs_ck_add(&ck, f->bytes, value(r));
            c->length = hs_ck_add(&ck, want, value(r));
            f->bytes = hs_ck_add(&ck, c->byte_offset, c->length);
        }
    }
    for (int f = 0; f < m->n_files; f++) {
        hs_checked ck = {false};
        m->files[f].bytes = hs_ck_add(&ck, m->files[f].bytes, value(r));
    }
}

static void check_boxes(const uint8_t *data, size_t size) {
    reader r = {data, size};
    hs_ckpt_meta m;
    hs_error e;
    from_boxes(&r, &m);
    if (hs_ckpt_meta_check(&m, "fuzz boxes", &e) == HS_OK) load_everything(&m);
    hs_ckpt_meta_free(&m);
}

static void check_latest(const uint8_t *data, size_t size) {
    char path[HS_PATH_MAX], name[HS_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", g_dir, HS_CKPT_LATEST);
    write_file(path, data, size);
    bool found = false;
    hs_error e;
    if (hs_ckpt_latest_read(g_dir, name, sizeof name, &found, &e) == HS_OK &&
        (!found || hs_ckpt_step_of(name) < 0)) {
        fprintf(stderr, "latest accepted as '%s'\n", found ? name : "(absent)");
        abort();
    }
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 0xB0) {
        check_boxes(data + 1, size - 1);
        return 0;
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t meta_len = nul ? (size_t)(nul - data) : size;
    hs_ckpt_meta m;
    hs_error e;
    if (hs_ckpt_meta_parse((const char *)data, meta_len, "fuzz/metadata.json", &m, &e) == HS_OK) {
        load_everything(&m);
        hs_ckpt_meta_free(&m);
    }
    if (nul) check_latest(nul + 1, size - meta_len - 1);
    return 0;
}
