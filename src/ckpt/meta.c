/* ckpt/meta.c — the metadata of a checkpoint in memory, its JSON form
 * (written with hs_json), and the structural checks both save and open run:
 * a metadata file that passes them cannot make a load read outside a chunk,
 * a file or a tensor. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

void hs_ckpt_meta_free(hs_ckpt_meta *m) {
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].chunks);
    free(m->tensors);
    free(m->files);
    memset(m, 0, sizeof *m);
}

int hs_ckpt_meta_add_tensor(hs_ckpt_meta *m, const char *name, hs_dtype dt, int ndim,
                            const int64_t *shape) {
    if (m->n_tensors == m->cap_tensors) {
        int cap = m->cap_tensors ? 2 * m->cap_tensors : 16;
        hs_ckpt_entry *v = realloc(m->tensors, sizeof(hs_ckpt_entry) * (size_t)cap);
        if (!v) return -1;
        m->tensors = v, m->cap_tensors = cap;
    }
    hs_ckpt_entry *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    return m->n_tensors++;
}

hs_ckpt_chunk *hs_ckpt_entry_add_chunk(hs_ckpt_entry *t) {
    if (t->n_chunks == t->cap_chunks) {
        int cap = t->cap_chunks ? 2 * t->cap_chunks : 4;
        hs_ckpt_chunk *v = realloc(t->chunks, sizeof(hs_ckpt_chunk) * (size_t)cap);
        if (!v) return NULL;
        t->chunks = v, t->cap_chunks = cap;
    }
    hs_ckpt_chunk *c = &t->chunks[t->n_chunks++];
    memset(c, 0, sizeof *c);
    return c;
}

int64_t hs_ckpt_entry_numel(const hs_ckpt_entry *t) { return hs_ckpt_box_numel(t->ndim, t->shape); }

void hs_ckpt_hex64(uint64_t v, char *buf, size_t cap) {
    snprintf(buf, cap, "0x%016llx", (unsigned long long)v);
}

bool hs_ckpt_parse_hex64(const char *s, uint64_t *out) {
    if (!s || strncmp(s, "0x", 2) != 0 || !s[2]) return false;
    char *end = NULL;
    unsigned long long v = strtoull(s + 2, &end, 16);
    if (*end) return false;
    *out = v;
    return true;
}

/* ---------------------------------------------------------------- write */

static void json_dims(hs_json *j, const char *key, int ndim, const int64_t *v) {
    hs_json_key(j, key);
    hs_json_begin_array(j);
    for (int d = 0; d < ndim; d++) hs_json_int(j, v[d]);
    hs_json_end_array(j);
}

static void json_hex(hs_json *j, const char *key, uint64_t v) {
    char buf[24];
    hs_ckpt_hex64(v, buf, sizeof buf);
    hs_json_kv_string(j, key, buf);
}

static void write_state(hs_json *j, const hs_ckpt_state *s) {
    hs_json_key(j, "state");
    hs_json_begin_object(j);
    hs_json_kv_int(j, "step", s->step);
    hs_json_kv_int(j, "data_position", s->data_position);
    hs_json_kv_int(j, "optim_step", s->optim_step);
    json_hex(j, "rng_seed", s->rng_seed);
    json_hex(j, "rng_counter", s->rng_counter);
    json_hex(j, "config_hash", s->config_hash);
    hs_json_end_object(j);
}

static void write_chunk(hs_json *j, const hs_ckpt_meta *m, const hs_ckpt_entry *t,
                        const hs_ckpt_chunk *c) {
    char crc[16];
    snprintf(crc, sizeof crc, "0x%08x", c->crc32);
    hs_json_begin_object(j);
    json_dims(j, "offsets", t->ndim, c->offset);
    json_dims(j, "sizes", t->ndim, c->size);
    hs_json_kv_string(j, "file", m->files[c->file].name);
    hs_json_kv_int(j, "byte_offset", c->byte_offset);
    hs_json_kv_int(j, "length", c->length);
    hs_json_kv_string(j, "crc32", crc);
    hs_json_end_object(j);
}

static void write_tensor(hs_json *j, const hs_ckpt_meta *m, const hs_ckpt_entry *t) {
    hs_json_begin_object(j);
    hs_json_kv_string(j, "name", t->name);
    hs_json_kv_string(j, "dtype", hs_dtype_name(t->dtype));
    json_dims(j, "shape", t->ndim, t->shape);
    hs_json_key(j, "chunks");
    hs_json_begin_array(j);
    for (int k = 0; k < t->n_chunks; k++) write_chunk(j, m, t, &t->chunks[k]);
    hs_json_end_array(j);
    hs_json_end_object(j);
}

hs_status hs_ckpt_meta_write(const hs_ckpt_meta *m, FILE *f, const char *path, hs_error *e) {
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    hs_json_kv_string(&j, "format", HS_CKPT_FORMAT);
    hs_json_kv_int(&j, "version", HS_CKPT_VERSION);
    hs_json_kv_int(&j, "world_size", m->world_size);
    hs_json_kv_double(&j, "created_unix", m->created_unix, 15);
    write_state(&j, &m->state);
    hs_json_key(&j, "files");
    hs_json_begin_array(&j);
    for (int i = 0; i < m->n_files; i++) {
        hs_json_begin_object(&j);
        hs_json_kv_string(&j, "name", m->files[i].name);
        hs_json_kv_int(&j, "bytes", m->files[i].bytes);
        hs_json_end_object(&j);
    }
    hs_json_end_array(&j);
    hs_json_key(&j, "tensors");
    hs_json_begin_array(&j);
    for (int i = 0; i < m->n_tensors; i++) write_tensor(&j, m, &m->tensors[i]);
    hs_json_end_array(&j);
    hs_json_end_object(&j);
    fputc('\n', f);
    if (ferror(f))
        return hs_error_set(e, HS_ERR_IO, "cannot write %s: %s", path, hs_strerror_errno());
    return HS_OK;
}

/* ---------------------------------------------------------------- check */

/* Every extent, offset and length here may come from a damaged or hostile
 * metadata file, so each comparison is written so that it cannot overflow
 * (x > limit - size rather than x + size > limit, with both sides already
 * known non-negative) and every product is checked. */

/* Elements and bytes of a chunk or tensor box; false when either overflows. */
static bool box_bytes(const hs_ckpt_entry *t, const int64_t *size, int64_t *numel, int64_t *bytes) {
    return hs_prod_i64(size, t->ndim, numel) &&
           hs_mul_i64(*numel, (int64_t)hs_dtype_size(t->dtype), bytes);
}

static hs_status check_chunk(const hs_ckpt_meta *m, const hs_ckpt_entry *t, const hs_ckpt_chunk *c,
                             const char *where, hs_error *e) {
    char box[160], shape[96];
    hs_ckpt_box_str(t->ndim, c->offset, c->size, box, sizeof box);
    hs_shape_str(t->ndim, t->shape, shape, sizeof shape);
    for (int d = 0; d < t->ndim; d++)
        if (c->offset[d] < 0 || c->size[d] <= 0 || c->offset[d] > t->shape[d] - c->size[d])
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: tensor '%s' %s: chunk %s is empty or outside the tensor "
                                "(dim %d: offset %lld, size %lld, extent %lld); the metadata is "
                                "damaged",
                                where, t->name, shape, box, d, (long long)c->offset[d],
                                (long long)c->size[d], (long long)t->shape[d]);
    /* Inside the tensor, whose byte count check_tensor proved fits. */
    int64_t numel = 0, want = 0;
    bool fits = box_bytes(t, c->size, &numel, &want);
    HS_ASSERT(fits);
    if (c->length != want)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: tensor '%s' chunk %s: length %lld bytes, expected %lld (%lld "
                            "elements of %s); the metadata is damaged",
                            where, t->name, box, (long long)c->length, (long long)want,
                            (long long)numel, hs_dtype_name(t->dtype));
    if (c->file < 0 || c->file >= m->n_files)
        return hs_error_set(e, HS_ERR_FORMAT, "%s: tensor '%s' chunk %s names no listed file",
                            where, t->name, box);
    const hs_ckpt_file *f = &m->files[c->file];
    if (c->byte_offset < 0 || c->byte_offset > f->bytes - c->length)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: tensor '%s' chunk %s: %lld bytes at byte_offset %lld lie outside "
                            "%s (%lld bytes); the metadata is damaged",
                            where, t->name, box, (long long)c->length, (long long)c->byte_offset,
                            f->name, (long long)f->bytes);
    return HS_OK;
}

/* Chunks that all span dims 1.. whole (FSDP dim-0 shards) are disjoint
 * when sorted by dim-0 offset each ends before the next starts. */
static int cmp_dim0(const void *a, const void *b) {
    int64_t x = ((const hs_ckpt_chunk *)a)->offset[0], y = ((const hs_ckpt_chunk *)b)->offset[0];
    return (x > y) - (x < y);
}

static bool chunks_overlap(const hs_ckpt_entry *t, int *i_out, int *j_out) {
    if (t->n_chunks < 2) return false; /* and t->chunks may be NULL */
    bool dim0 = true;
    for (int k = 0; k < t->n_chunks && dim0; k++)
        for (int d = 1; d < t->ndim; d++)
            if (t->chunks[k].offset[d] != 0 || t->chunks[k].size[d] != t->shape[d]) dim0 = false;
    int64_t off[HS_CKPT_DIMS], size[HS_CKPT_DIMS];
    if (dim0) {
        hs_ckpt_chunk *s =
            malloc(sizeof(hs_ckpt_chunk) * (size_t)(t->n_chunks > 0 ? t->n_chunks : 1));
        memcpy(s, t->chunks, sizeof(hs_ckpt_chunk) * (size_t)t->n_chunks);
        qsort(s, (size_t)t->n_chunks, sizeof *s, cmp_dim0);
        bool bad = false;
        for (int k = 1; k < t->n_chunks && !bad; k++)
            bad = s[k].offset[0] < s[k - 1].offset[0] + s[k - 1].size[0];
        free(s);
        *i_out = *j_out = -1;
        return bad;
    }
    for (int i = 0; i < t->n_chunks; i++)
        for (int j = i + 1; j < t->n_chunks; j++)
            if (hs_ckpt_box_intersect(t->ndim, t->chunks[i].offset, t->chunks[i].size,
                                      t->chunks[j].offset, t->chunks[j].size, off, size))
                return *i_out = i, *j_out = j, true;
    return false;
}

static hs_status check_tiling(const hs_ckpt_entry *t, const char *where, hs_error *e) {
    char shape[96], a[160], b[160];
    hs_shape_str(t->ndim, t->shape, shape, sizeof shape);
    int i, j;
    if (chunks_overlap(t, &i, &j)) {
        if (i < 0)
            return hs_error_set(e, HS_ERR_FORMAT, "%s: tensor '%s' %s: two chunks overlap on dim 0",
                                where, t->name, shape);
        return hs_error_set(
            e, HS_ERR_FORMAT, "%s: tensor '%s' %s: chunks %s and %s overlap", where, t->name, shape,
            hs_ckpt_box_str(t->ndim, t->chunks[i].offset, t->chunks[i].size, a, sizeof a),
            hs_ckpt_box_str(t->ndim, t->chunks[j].offset, t->chunks[j].size, b, sizeof b));
    }
    /* Disjoint chunks inside the tensor: the sum is at most its numel. */
    int64_t covered = 0;
    hs_checked ck = {false};
    for (int k = 0; k < t->n_chunks; k++)
        covered = hs_ck_add(&ck, covered, hs_ckpt_box_numel(t->ndim, t->chunks[k].size));
    HS_ASSERT(!ck.overflow);
    if (covered != hs_ckpt_entry_numel(t))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: tensor '%s' %s: its chunks cover %lld of %lld elements; every "
                            "element must be held by some rank",
                            where, t->name, shape, (long long)covered,
                            (long long)hs_ckpt_entry_numel(t));
    return HS_OK;
}

static hs_status check_tensor(const hs_ckpt_meta *m, const hs_ckpt_entry *t, const char *where,
                              hs_error *e) {
    if (t->ndim < 1 || t->ndim > HS_CKPT_DIMS || !hs_dtype_is_float(t->dtype))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: tensor '%s' has %d dims or a bad dtype", where,
                            t->name, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: tensor '%s' has extent %lld in dim %d; "
                                "extents are never negative, the metadata is damaged",
                                where, t->name, (long long)t->shape[d], d);
    /* Zero extents count as 1: a tensor with no elements must not hide
     * others whose product overflows, since a load computes row sizes from
     * the extents of dims 1.. and FSDP shard rows from dim 0. */
    char shape[96];
    int64_t nonzero[HS_CKPT_DIMS], numel, bytes;
    for (int d = 0; d < t->ndim; d++) nonzero[d] = t->shape[d] > 0 ? t->shape[d] : 1;
    if (!box_bytes(t, nonzero, &numel, &bytes))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: tensor '%s' %s %s has more elements or bytes "
                            "than a 64-bit count holds (zero extents counted as 1); the metadata "
                            "is damaged",
                            where, t->name, hs_dtype_name(t->dtype),
                            hs_shape_str(t->ndim, t->shape, shape, sizeof shape));
    for (int k = 0; k < t->n_chunks; k++)
        if (check_chunk(m, t, &t->chunks[k], where, e) != HS_OK) return e->code;
    return check_tiling(t, where, e);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const hs_ckpt_entry *const *)a)->name,
                  (*(const hs_ckpt_entry *const *)b)->name);
}

static hs_status check_names(const hs_ckpt_meta *m, const char *where, hs_error *e) {
    const hs_ckpt_entry **v = malloc(sizeof(*v) * (size_t)(m->n_tensors > 0 ? m->n_tensors : 1));
    if (!v) return hs_error_oom(e, "%s: checking the names of %d tensors", where, m->n_tensors);
    for (int i = 0; i < m->n_tensors; i++) v[i] = &m->tensors[i];
    qsort(v, (size_t)m->n_tensors, sizeof *v, cmp_name);
    hs_status s = HS_OK;
    for (int i = 1; i < m->n_tensors && s == HS_OK; i++)
        if (!strcmp(v[i]->name, v[i - 1]->name))
            s = hs_error_set(e, HS_ERR_FORMAT, "%s: tensor '%s' is listed twice", where,
                             v[i]->name);
    free(v);
    return s;
}

typedef struct byte_range {
    int file;
    int64_t lo, hi;
} byte_range;

static int cmp_range(const void *a, const void *b) {
    const byte_range *x = a, *y = b;
    if (x->file != y->file) return x->file - y->file;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Every byte of every data file belongs to exactly one chunk: the files
 * hold actual shards and nothing else (no padding, no stale bytes). */
static hs_status check_files(const hs_ckpt_meta *m, const char *where, hs_error *e) {
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) n += m->tensors[i].n_chunks;
    byte_range *r = malloc(sizeof *r * (size_t)(n > 0 ? n : 1));
    if (!r) return hs_error_oom(e, "%s: checking the byte ranges of %d chunks", where, n);
    n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        for (int k = 0; k < m->tensors[i].n_chunks; k++) {
            const hs_ckpt_chunk *c = &m->tensors[i].chunks[k];
            r[n++] = (byte_range){c->file, c->byte_offset, c->byte_offset + c->length};
        }
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    hs_status s = HS_OK;
    int k = 0;
    for (int f = 0; f < m->n_files && s == HS_OK; f++) {
        int64_t at = 0;
        for (; k < n && r[k].file == f && r[k].lo == at; k++) at = r[k].hi;
        if (at != m->files[f].bytes || (k < n && r[k].file == f))
            s = hs_error_set(e, HS_ERR_FORMAT,
                             "%s: the chunks of %s do not tile its %lld bytes (gap or overlap "
                             "at byte %lld); the metadata is damaged",
                             where, m->files[f].name, (long long)m->files[f].bytes, (long long)at);
    }
    free(r);
    return s;
}

static int cmp_file_name(const void *a, const void *b) {
    return strcmp((*(const hs_ckpt_file *const *)a)->name, (*(const hs_ckpt_file *const *)b)->name);
}

/* The file table: unique names, byte counts that are not negative and
 * whose total (the checkpoint's size, which inspect and verify add up)
 * fits in 64 bits. Sorted, so a world of many ranks costs n log n. */
static hs_status check_file_table(const hs_ckpt_meta *m, const char *where, hs_error *e) {
    hs_checked total = {false};
    int64_t sum = 0;
    for (int i = 0; i < m->n_files; i++) {
        if (m->files[i].bytes < 0)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: data file %s has %lld bytes; the "
                                "metadata is damaged",
                                where, m->files[i].name, (long long)m->files[i].bytes);
        sum = hs_ck_add(&total, sum, m->files[i].bytes);
    }
    if (total.overflow)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: the %d data files add up to more bytes than "
                            "a 64-bit count holds; the metadata is damaged",
                            where, m->n_files);
    const hs_ckpt_file **v = malloc(sizeof(*v) * (size_t)(m->n_files > 0 ? m->n_files : 1));
    if (!v)
        return hs_error_oom(e, "%s: checking %d data file names: %zu bytes", where, m->n_files,
                            sizeof(*v) * (size_t)(m->n_files > 0 ? m->n_files : 1));
    for (int i = 0; i < m->n_files; i++) v[i] = &m->files[i];
    qsort(v, (size_t)m->n_files, sizeof *v, cmp_file_name);
    hs_status s = HS_OK;
    for (int i = 1; i < m->n_files && s == HS_OK; i++)
        if (!strcmp(v[i]->name, v[i - 1]->name))
            s = hs_error_set(e, HS_ERR_FORMAT,
                             "%s: data file %s is listed twice; the metadata "
                             "is damaged",
                             where, v[i]->name);
    free(v);
    return s;
}

hs_status hs_ckpt_meta_check(const hs_ckpt_meta *m, const char *where, hs_error *e) {
    if (check_file_table(m, where, e) != HS_OK) return e->code;
    for (int i = 0; i < m->n_tensors; i++)
        if (check_tensor(m, &m->tensors[i], where, e) != HS_OK) return e->code;
    if (check_names(m, where, e) != HS_OK) return e->code;
    return check_files(m, where, e);
}
