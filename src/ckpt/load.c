/* ckpt/load.c — open a checkpoint and fill target chunks from it.
 *
 * A target chunk takes from each saved chunk of its tensor the
 * intersection of the two boxes. A saved chunk that overlaps is read whole
 * (pread of its byte range only, never the whole file), its length and
 * CRC32 checked, and the intersection copied. Each saved chunk is read at
 * most once per target, so a rank reads only what it needs.
 *
 * The chunk is read into c->buf, host memory reused from chunk to chunk
 * (as large as the largest saved chunk read): its CRC is checked there,
 * and a target in device memory gets the overlap by H2D copies from it,
 * so no host staging beyond that buffer is needed. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

struct hs_ckpt {
    char path[HS_PATH_MAX];
    hs_ckpt_meta meta;
    int *fds;     /* per file, opened on first use; -1 before */
    int *by_name; /* tensor indices sorted by name */
    void *buf;    /* one saved chunk */
    size_t buf_cap;
};

/* ------------------------------------------------------------ open */

static int cmp_by_name_ctx(const void *a, const void *b, void *ctx) {
    const hs_ckpt_meta *m = ctx;
    return strcmp(m->tensors[*(const int *)a].name, m->tensors[*(const int *)b].name);
}

/* A data file shorter or longer than the metadata says: name the file,
 * both lengths, and the first tensor whose bytes are affected. */
static hs_status check_file_length(const hs_ckpt *c, int f, hs_error *e) {
    const hs_ckpt_file *file = &c->meta.files[f];
    char path[HS_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", c->path, file->name);
    struct stat st;
    if (stat(path, &st) != 0)
        return hs_error_set(e, HS_ERR_IO,
                            "checkpoint %s: data file %s is missing (%s); the "
                            "checkpoint is incomplete — load an earlier one",
                            c->path, path, strerror(errno));
    if ((int64_t)st.st_size == file->bytes) return HS_OK;
    const char *tensor = "(none)";
    for (int i = 0; i < c->meta.n_tensors && (int64_t)st.st_size < file->bytes; i++)
        for (int k = 0; k < c->meta.tensors[i].n_chunks; k++) {
            const hs_ckpt_chunk *ch = &c->meta.tensors[i].chunks[k];
            if (ch->file == f && ch->byte_offset + ch->length > (int64_t)st.st_size) {
                tensor = c->meta.tensors[i].name;
                i = c->meta.n_tensors;
                break;
            }
        }
    return hs_error_set(e, HS_ERR_FORMAT,
                        "checkpoint data file %s is %lld bytes, expected %lld (%s; first tensor "
                        "affected: '%s'); the file is damaged — load an earlier checkpoint",
                        path, (long long)st.st_size, (long long)file->bytes,
                        (int64_t)st.st_size < file->bytes ? "truncated" : "too long", tensor);
}

/* `path` is a step directory, or a checkpoint.dir whose `latest` names one. */
static hs_status resolve_dir(const char *path, char *out, size_t cap, hs_error *e) {
    char probe[HS_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/%s", path, HS_CKPT_METADATA);
    if (hs_ckpt_is_file(probe)) return snprintf(out, cap, "%s", path), HS_OK;
    char name[HS_PATH_MAX];
    bool found = false;
    if (!hs_ckpt_is_dir(path))
        return hs_error_set(e, HS_ERR_USAGE,
                            "%s is not a checkpoint directory (it does not exist "
                            "or is not a directory)",
                            path);
    if (hs_ckpt_latest_read(path, name, sizeof name, &found, e) != HS_OK) return e->code;
    if (!found)
        return hs_error_set(e, HS_ERR_USAGE,
                            "%s is not a checkpoint: it holds neither %s (a "
                            "step directory) nor %s (a checkpoint.dir)",
                            path, HS_CKPT_METADATA, HS_CKPT_LATEST);
    int len = snprintf(out, cap, "%s/%s", path, name);
    if (len < 0 || (size_t)len >= cap)
        return hs_error_set(e, HS_ERR_USAGE, "checkpoint path %s/%s is too long", path, name);
    snprintf(probe, sizeof probe, "%s/%s", out, HS_CKPT_METADATA);
    if (!hs_ckpt_is_file(probe))
        return hs_error_set(e, HS_ERR_IO,
                            "%s/%s names %s, which has no %s; the directory was "
                            "changed by hand — point %s at an existing step directory",
                            path, HS_CKPT_LATEST, out, HS_CKPT_METADATA, HS_CKPT_LATEST);
    return HS_OK;
}

/* A directory named step-<N> holds the metadata of step N: one renamed or
 * refilled by hand would otherwise resume at a step its name does not say,
 * and `latest` would point at the wrong save. */
static hs_status check_step_name(const hs_ckpt *c, const char *mpath, hs_error *e) {
    size_t n = strlen(c->path);
    while (n > 1 && c->path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && c->path[b - 1] != '/') b--;
    char base[HS_PATH_MAX];
    snprintf(base, sizeof base, "%.*s", (int)(n - b), c->path + b);
    int64_t named = hs_ckpt_step_of(base);
    if (named < 0 || named == c->meta.state.step) return HS_OK;
    return hs_error_set(e, HS_ERR_FORMAT,
                        "%s: state.step is %lld but the directory is %s; the "
                        "metadata belongs to another save — restore the directory's own "
                        "metadata, or rename the directory step-%lld",
                        mpath, (long long)c->meta.state.step, base, (long long)c->meta.state.step);
}

hs_status hs_ckpt_open(const char *path, hs_ckpt **out, hs_error *e) {
    *out = NULL;
    hs_ckpt *c = calloc(1, sizeof *c);
    if (!c) return hs_error_oom(e, "opening checkpoint %s: %zu bytes", path, sizeof *c);
    if (resolve_dir(path, c->path, sizeof c->path, e) != HS_OK) return free(c), e->code;
    char mpath[HS_PATH_MAX + 64];
    snprintf(mpath, sizeof mpath, "%s/%s", c->path, HS_CKPT_METADATA);
    char *text = NULL;
    size_t len = 0;
    hs_status s = hs_read_file(mpath, &text, &len, e);
    if (s == HS_OK) s = hs_ckpt_meta_parse(text, len, mpath, &c->meta, e);
    free(text);
    if (s != HS_OK) return free(c), s;
    if (check_step_name(c, mpath, e) != HS_OK) return hs_ckpt_meta_free(&c->meta), free(c), e->code;
    c->fds = malloc(sizeof(int) * (size_t)(c->meta.n_files > 0 ? c->meta.n_files : 1));
    c->by_name = malloc(sizeof(int) * (size_t)(c->meta.n_tensors > 0 ? c->meta.n_tensors : 1));
    if (!c->fds || !c->by_name) {
        hs_error_oom(e, "opening checkpoint %s: the tables of %d files and %d tensors", path,
                     c->meta.n_files, c->meta.n_tensors);
        free(c->fds), free(c->by_name), hs_ckpt_meta_free(&c->meta), free(c);
        return HS_ERR_OOM;
    }
    for (int f = 0; f < c->meta.n_files; f++) c->fds[f] = -1;
    for (int f = 0; f < c->meta.n_files && s == HS_OK; f++) s = check_file_length(c, f, e);
    for (int i = 0; i < c->meta.n_tensors; i++) c->by_name[i] = i;
    qsort_r(c->by_name, (size_t)c->meta.n_tensors, sizeof(int), cmp_by_name_ctx, &c->meta);
    if (s != HS_OK) return hs_ckpt_close(c), s;
    *out = c;
    return HS_OK;
}

void hs_ckpt_close(hs_ckpt *c) {
    if (!c) return;
    for (int f = 0; f < c->meta.n_files; f++)
        if (c->fds[f] >= 0) close(c->fds[f]);
    free(c->fds);
    free(c->by_name);
    free(c->buf);
    hs_ckpt_meta_free(&c->meta);
    free(c);
}

const char *hs_ckpt_path(const hs_ckpt *c) { return c->path; }
const hs_ckpt_meta *hs_ckpt_meta_of(const hs_ckpt *c) { return &c->meta; }
const hs_ckpt_state *hs_ckpt_get_state(const hs_ckpt *c) { return &c->meta.state; }
int hs_ckpt_saved_world(const hs_ckpt *c) { return c->meta.world_size; }
int hs_ckpt_num_tensors(const hs_ckpt *c) { return c->meta.n_tensors; }

void hs_ckpt_tensor_info(const hs_ckpt *c, int i, hs_ckpt_info *out) {
    HS_ASSERT(i >= 0 && i < c->meta.n_tensors);
    const hs_ckpt_entry *t = &c->meta.tensors[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->n_chunks = t->n_chunks;
    out->bytes = hs_ckpt_entry_numel(t) * (int64_t)hs_dtype_size(t->dtype);
}

int hs_ckpt_find(const hs_ckpt *c, const char *name) {
    int lo = 0, hi = c->meta.n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int cmp = strcmp(c->meta.tensors[c->by_name[mid]].name, name);
        if (cmp == 0) return c->by_name[mid];
        if (cmp < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* ------------------------------------------------------------ read */

/* The data file of a chunk, opened on first use; `path` gets its path. */
static hs_status chunk_file(hs_ckpt *c, const hs_ckpt_chunk *ch, char *path, size_t cap,
                            hs_error *e) {
    snprintf(path, cap, "%s/%s", c->path, c->meta.files[ch->file].name);
    if (c->fds[ch->file] < 0 && (c->fds[ch->file] = open(path, O_RDONLY)) < 0)
        return hs_error_set(e, HS_ERR_IO, "cannot open checkpoint data file %s: %s", path,
                            strerror(errno));
    return HS_OK;
}

/* c->buf holds at least n bytes. A chunk too large for memory is an error
 * naming it, not an abort. */
static hs_status chunk_buffer(hs_ckpt *c, const hs_ckpt_entry *t, const char *box, size_t n,
                              const char *path, hs_error *e) {
    if (n <= c->buf_cap) return HS_OK;
    free(c->buf);
    c->buf = malloc(n);
    c->buf_cap = c->buf ? n : 0;
    if (!c->buf)
        return hs_error_oom(e,
                            "%zu bytes to read tensor '%s' chunk "
                            "%s from %s",
                            n, t->name, box, path);
    return HS_OK;
}

/* Read `n` bytes of the chunk at `done` into c->buf; short is truncation. */
static hs_status chunk_piece(hs_ckpt *c, const hs_ckpt_entry *t, const hs_ckpt_chunk *ch,
                             const char *box, const char *path, int64_t done, size_t n,
                             hs_error *e) {
    int64_t got = 0;
    if (hs_ckpt_pread_all(c->fds[ch->file], c->buf, n, ch->byte_offset + done, path, &got, e) !=
        HS_OK)
        return e->code;
    if (got != (int64_t)n)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint data file %s is truncated: tensor '%s' chunk %s needs "
                            "bytes [%lld, %lld), the file ends at %lld; load an earlier checkpoint",
                            path, t->name, box, (long long)ch->byte_offset,
                            (long long)(ch->byte_offset + ch->length),
                            (long long)(ch->byte_offset + done + got));
    return HS_OK;
}

static hs_status chunk_crc(const hs_ckpt_entry *t, const hs_ckpt_chunk *ch, const char *box,
                           const char *path, uint32_t crc, hs_error *e) {
    if (crc == ch->crc32) return HS_OK;
    return hs_error_set(e, HS_ERR_FORMAT,
                        "checkpoint data file %s is corrupted: tensor '%s' chunk %s (bytes "
                        "[%lld, %lld)) has CRC32 0x%08x, the metadata expects 0x%08x; load an "
                        "earlier checkpoint",
                        path, t->name, box, (long long)ch->byte_offset,
                        (long long)(ch->byte_offset + ch->length), crc, ch->crc32);
}

/* Read a saved chunk of tensor t whole into c->buf and check it. */
static hs_status read_chunk(hs_ckpt *c, const hs_ckpt_entry *t, const hs_ckpt_chunk *ch,
                            hs_error *e) {
    char path[HS_PATH_MAX + 128], box[160];
    hs_ckpt_box_str(t->ndim, ch->offset, ch->size, box, sizeof box);
    if (chunk_file(c, ch, path, sizeof path, e) != HS_OK ||
        chunk_buffer(c, t, box, (size_t)ch->length, path, e) != HS_OK ||
        chunk_piece(c, t, ch, box, path, 0, (size_t)ch->length, e) != HS_OK)
        return e->code;
    return chunk_crc(t, ch, box, path, hs_crc32(0, c->buf, (size_t)ch->length), e);
}

/* Check a saved chunk's length and CRC32 reading it in pieces, so verify
 * needs no memory in proportion to the largest chunk. */
#define VERIFY_PIECE ((int64_t)16 << 20)

static hs_status verify_chunk(hs_ckpt *c, const hs_ckpt_entry *t, const hs_ckpt_chunk *ch,
                              hs_error *e) {
    char path[HS_PATH_MAX + 128], box[160];
    hs_ckpt_box_str(t->ndim, ch->offset, ch->size, box, sizeof box);
    int64_t piece = ch->length < VERIFY_PIECE ? ch->length : VERIFY_PIECE;
    if (chunk_file(c, ch, path, sizeof path, e) != HS_OK ||
        chunk_buffer(c, t, box, (size_t)piece, path, e) != HS_OK)
        return e->code;
    uint32_t crc = 0;
    for (int64_t done = 0; done < ch->length; done += piece) {
        size_t n = (size_t)(ch->length - done < piece ? ch->length - done : piece);
        if (chunk_piece(c, t, ch, box, path, done, n, e) != HS_OK) return e->code;
        crc = hs_crc32(crc, c->buf, n);
    }
    return chunk_crc(t, ch, box, path, crc, e);
}

static hs_status check_target(const hs_ckpt *c, const hs_ckpt_tensor *tg, int *idx, hs_error *e) {
    *idx = hs_ckpt_find(c, tg->name);
    if (*idx < 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s has no tensor '%s' (it holds %d "
                            "tensors; `hypershard ckpt inspect %s` lists them)",
                            c->path, tg->name, c->meta.n_tensors, c->path);
    const hs_ckpt_entry *t = &c->meta.tensors[*idx];
    char s1[96], s2[96], box[160];
    hs_shape_str(t->ndim, t->shape, s1, sizeof s1);
    hs_shape_str(tg->ndim, tg->shape, s2, sizeof s2);
    if (t->ndim != tg->ndim || memcmp(t->shape, tg->shape, sizeof(int64_t) * (size_t)t->ndim) ||
        t->dtype != tg->dtype)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s: tensor '%s' is %s %s there, the "
                            "model expects %s %s; the checkpoint was saved from a different model "
                            "or precision policy",
                            c->path, tg->name, hs_dtype_name(t->dtype), s1,
                            hs_dtype_name(tg->dtype), s2);
    for (int d = 0; d < tg->ndim; d++)
        if (tg->offset[d] < 0 || tg->size[d] < 0 || tg->offset[d] > tg->shape[d] - tg->size[d])
            return hs_error_set(e, HS_ERR_INTERNAL,
                                "checkpoint load: target chunk %s of '%s' %s "
                                "lies outside the tensor",
                                hs_ckpt_box_str(tg->ndim, tg->offset, tg->size, box, sizeof box),
                                tg->name, s2);
    if (tg->storage_rows != 0 && tg->storage_rows < tg->size[0])
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "checkpoint load: '%s' storage_rows %lld < chunk "
                            "rows %lld",
                            tg->name, (long long)tg->storage_rows, (long long)tg->size[0]);
    return HS_OK;
}

static void move_h2d(void *ctx, void *dst, const void *src, size_t bytes) {
    hs_device_copy(ctx, dst, src, bytes, HS_COPY_H2D);
}

/* RFC §7.4: the padded communication storage is rebuilt with a zero tail,
 * never left with whatever it held before the load. */
static void zero_tail(const hs_ckpt_tensor *tg, size_t es) {
    if (tg->storage_rows <= tg->size[0]) return;
    int64_t row = hs_ckpt_box_numel(tg->ndim - 1, tg->size + 1);
    char *tail = (char *)tg->data + (size_t)(tg->size[0] * row) * es;
    size_t bytes = (size_t)((tg->storage_rows - tg->size[0]) * row) * es;
    if (tg->dev) hs_dev_zero(tg->dev, tail, bytes);
    else memset(tail, 0, bytes);
}

static hs_status read_target(hs_ckpt *c, const hs_ckpt_tensor *tg, hs_error *e) {
    int idx;
    if (check_target(c, tg, &idx, e) != HS_OK) return e->code;
    const hs_ckpt_entry *t = &c->meta.tensors[idx];
    size_t es = hs_dtype_size(t->dtype);
    zero_tail(tg, es);
    int64_t off[HS_CKPT_DIMS], size[HS_CKPT_DIMS], filled = 0;
    for (int k = 0; k < t->n_chunks; k++) {
        const hs_ckpt_chunk *ch = &t->chunks[k];
        if (!hs_ckpt_box_intersect(t->ndim, ch->offset, ch->size, tg->offset, tg->size, off, size))
            continue;
        if (read_chunk(c, t, ch, e) != HS_OK) return e->code;
        /* c->buf holds the checked chunk on the host; a device target
         * takes the overlap H2D, one copy per contiguous run. */
        if (tg->dev)
            hs_ckpt_box_move(t->ndim, off, size, es, c->buf, ch->offset, ch->size, tg->data,
                             tg->offset, tg->size, move_h2d, tg->dev);
        else
            hs_ckpt_box_copy(t->ndim, off, size, es, c->buf, ch->offset, ch->size, tg->data,
                             tg->offset, tg->size);
        filled += hs_ckpt_box_numel(t->ndim, size);
    }
    HS_ASSERT(filled == hs_ckpt_tensor_numel(tg)); /* the saved chunks tile the tensor */
    return HS_OK;
}

hs_status hs_ckpt_read(hs_ckpt *c, const hs_ckpt_tensor *targets, int n, hs_error *e) {
    for (int i = 0; i < n; i++)
        if (read_target(c, &targets[i], e) != HS_OK) return e->code;
    return HS_OK;
}

hs_status hs_ckpt_verify(hs_ckpt *c, int64_t *bytes, hs_error *e) {
    *bytes = 0;
    for (int i = 0; i < c->meta.n_tensors; i++)
        for (int k = 0; k < c->meta.tensors[i].n_chunks; k++) {
            const hs_ckpt_chunk *ch = &c->meta.tensors[i].chunks[k];
            if (verify_chunk(c, &c->meta.tensors[i], ch, e) != HS_OK) return e->code;
            *bytes += ch->length; /* the checks proved the total fits */
        }
    return HS_OK;
}
