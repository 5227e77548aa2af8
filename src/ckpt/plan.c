/* ckpt/plan.c — build the save plan from every rank's tensor table.
 *
 * Walking ranks in order and each rank's tensors in its own order gives one
 * deterministic tensor order (the first rank to name a tensor places it)
 * and one writer per distinct chunk: the lowest rank holding it. Byte
 * offsets in rank r's file follow its tensors' order. Every rank computes
 * the same plan from the same gathered tables. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/plan.h"

/* Bytes travel as 2-byte elements of a 16-bit dtype: all-gather moves them
 * without looking at the values. */
#define CARRIER HS_DTYPE_BF16

hs_status hs_ckpt_all_gather_bytes(hs_pg *world, const void *mine, int64_t len, char **all,
                                   int64_t *stride, int64_t *lens, hs_error *e) {
    int w = hs_pg_size(world);
    hs_status s = hs_pg_all_gather(world, NULL, lens, &len, 4, CARRIER, e);
    if (s != HS_OK) return s;
    int64_t max = 2;
    for (int r = 0; r < w; r++) max = lens[r] > max ? lens[r] : max;
    max = (max + 7) / 8 * 8;
    char *send = calloc(1, (size_t)max);
    *all = calloc((size_t)w, (size_t)max);
    if (!send || !*all) {
        free(send);
        free(*all);
        *all = NULL;
        return hs_error_oom(e, "gathering %d x %lld bytes of checkpoint tables", w, (long long)max);
    }
    memcpy(send, mine, (size_t)len);
    s = hs_pg_all_gather(world, NULL, *all, send, max / 2, CARRIER, e);
    free(send);
    *stride = max;
    return s;
}

/* ------------------------------------------------------------ local check */

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static hs_status check_one(const hs_ckpt_tensor *t, hs_error *e) {
    char shape[96], box[160];
    if (!t->name || !t->name[0] || strlen(t->name) >= HS_CKPT_NAME_MAX)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "checkpoint tensor name is empty or longer than "
                            "%d bytes: '%.64s'",
                            HS_CKPT_NAME_MAX - 1, t->name ? t->name : "");
    if (t->ndim < 1 || t->ndim > HS_CKPT_DIMS || !hs_dtype_is_float(t->dtype))
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "checkpoint tensor '%s': %d dims (want 1..%d) "
                            "or a bad dtype",
                            t->name, t->ndim, HS_CKPT_DIMS);
    hs_shape_str(t->ndim, t->shape, shape, sizeof shape);
    hs_ckpt_box_str(t->ndim, t->offset, t->size, box, sizeof box);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->offset[d] < 0 || t->size[d] < 0 ||
            t->offset[d] + t->size[d] > t->shape[d])
            return hs_error_set(e, HS_ERR_INTERNAL,
                                "checkpoint tensor '%s' %s: chunk %s lies "
                                "outside the tensor (dim %d)",
                                t->name, shape, box, d);
    if (!t->data && hs_ckpt_tensor_numel(t) > 0)
        return hs_error_set(e, HS_ERR_INTERNAL, "checkpoint tensor '%s' chunk %s has no data",
                            t->name, box);
    return HS_OK;
}

hs_status hs_ckpt_check_local(const hs_ckpt_tensor *t, int n, hs_error *e) {
    for (int i = 0; i < n; i++)
        if (check_one(&t[i], e) != HS_OK) return e->code;
    const char **names = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    if (!names)
        return hs_error_oom(e, "checking the names of %d checkpoint tensors: %zu bytes", n,
                            sizeof(char *) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof(char *), cmp_name);
    hs_status s = HS_OK;
    for (int i = 1; i < n && s == HS_OK; i++)
        if (!strcmp(names[i], names[i - 1]))
            s = hs_error_set(e, HS_ERR_INTERNAL,
                             "checkpoint tensor '%s' is listed twice by one "
                             "rank; each rank lists a tensor once",
                             names[i]);
    free(names);
    return s;
}

/* ------------------------------------------------------------ wire format */

typedef struct wire_row {
    int32_t name_len, dtype, ndim, pad;
    int64_t shape[HS_CKPT_DIMS], offset[HS_CKPT_DIMS], size[HS_CKPT_DIMS];
} wire_row;

static size_t name_span(size_t len) { return (len + 8) / 8 * 8; } /* NUL included */

/* NULL, with *len the bytes it needed, without memory. */
static char *encode(const hs_ckpt_tensor *t, int n, int64_t *len) {
    size_t total = sizeof(int64_t);
    for (int i = 0; i < n; i++) total += sizeof(wire_row) + name_span(strlen(t[i].name));
    *len = (int64_t)total;
    char *buf = calloc(1, total), *p = buf;
    if (!buf) return NULL;
    int64_t count = n;
    memcpy(p, &count, sizeof count);
    p += sizeof count;
    for (int i = 0; i < n; i++) {
        wire_row r = {
            .name_len = (int32_t)strlen(t[i].name), .dtype = t[i].dtype, .ndim = t[i].ndim};
        for (int d = 0; d < t[i].ndim; d++)
            r.shape[d] = t[i].shape[d], r.offset[d] = t[i].offset[d], r.size[d] = t[i].size[d];
        memcpy(p, &r, sizeof r);
        memcpy(p + sizeof r, t[i].name, (size_t)r.name_len);
        p += sizeof r + name_span((size_t)r.name_len);
    }
    *len = (int64_t)total;
    return buf;
}

/* Rows of one rank's table, pointing into the gathered buffer. */
typedef struct row_view {
    const wire_row *row;
    const char *name;
} row_view;

/* The row count, or -1 without memory for the views. */
static int decode(const char *buf, int64_t len, row_view **out) {
    int64_t count = 0;
    HS_ASSERT(len >= (int64_t)sizeof count);
    memcpy(&count, buf, sizeof count);
    *out = malloc(sizeof(row_view) * (size_t)(count > 0 ? count : 1));
    if (!*out) return -1;
    const char *p = buf + sizeof count;
    for (int64_t i = 0; i < count; i++) {
        (*out)[i].row = (const wire_row *)p;
        (*out)[i].name = p + sizeof(wire_row);
        p += sizeof(wire_row) + name_span((size_t)(*out)[i].row->name_len);
        HS_ASSERT(p <= buf + len);
    }
    return (int)count;
}

/* ------------------------------------------------------------ name index */

typedef struct name_index {
    int *slot; /* entry index or -1 */
    size_t mask;
} name_index;

static bool index_init(name_index *x, int n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    x->slot = malloc(sizeof(int) * cap);
    for (size_t i = 0; x->slot && i < cap; i++) x->slot[i] = -1;
    x->mask = cap - 1;
    return x->slot != NULL;
}

/* Slot of `name`: holds its entry, or -1 where it would go. */
static int *index_find(name_index *x, const hs_ckpt_meta *m, const char *name) {
    size_t h = (size_t)hs_hash64(name) & x->mask;
    while (x->slot[h] >= 0 && strcmp(m->tensors[x->slot[h]].name, name) != 0) h = (h + 1) & x->mask;
    return &x->slot[h];
}

/* ------------------------------------------------------------ build */

typedef struct builder {
    hs_ckpt_plan *p;
    name_index index;
    int *entry_rank; /* rank that placed each entry */
    int64_t *rank_bytes;
    hs_error *e;
} builder;

static hs_status mismatch(builder *b, int entry, const wire_row *r, const char *name, int rank) {
    const hs_ckpt_entry *t = &b->p->meta.tensors[entry];
    char s1[96], s2[96];
    hs_shape_str(t->ndim, t->shape, s1, sizeof s1);
    hs_shape_str(r->ndim, r->shape, s2, sizeof s2);
    return hs_error_set(b->e, HS_ERR_INTERNAL,
                        "checkpoint save: tensor '%s' is %s %s on rank %d but %s %s on rank %d; "
                        "every rank must describe the same global tensor",
                        name, hs_dtype_name(t->dtype), s1, b->entry_rank[entry],
                        hs_dtype_name((hs_dtype)r->dtype), s2, rank);
}

static int find_chunk(const hs_ckpt_entry *t, const wire_row *r) {
    size_t bytes = sizeof(int64_t) * (size_t)t->ndim;
    for (int k = 0; k < t->n_chunks; k++)
        if (!memcmp(t->chunks[k].offset, r->offset, bytes) &&
            !memcmp(t->chunks[k].size, r->size, bytes))
            return k;
    return -1;
}

static int rank_file(builder *b, int rank) {
    hs_ckpt_plan *p = b->p;
    if (p->rank_file[rank] < 0) {
        hs_ckpt_file *f = &p->meta.files[p->meta.n_files];
        snprintf(f->name, sizeof f->name, "rank-%d.bin", rank);
        p->rank_file[rank] = p->meta.n_files++;
    }
    return p->rank_file[rank];
}

static hs_status add_row(builder *b, int rank, int row, const row_view *v) {
    hs_ckpt_plan *p = b->p;
    const wire_row *r = v->row;
    int *slot = index_find(&b->index, &p->meta, v->name);
    if (*slot < 0) {
        int k = hs_ckpt_meta_add_tensor(&p->meta, v->name, (hs_dtype)r->dtype, r->ndim, r->shape);
        if (k < 0) return hs_error_oom(b->e, "checkpoint save: the plan's entry for %s", v->name);
        *slot = k;
        b->entry_rank[*slot] = rank;
    }
    hs_ckpt_entry *t = &p->meta.tensors[*slot];
    if (t->dtype != (hs_dtype)r->dtype || t->ndim != r->ndim ||
        memcmp(t->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim) != 0)
        return mismatch(b, *slot, r, v->name, rank);
    p->row_entry[row] = p->row_chunk[row] = -1;
    int64_t numel = hs_ckpt_box_numel(r->ndim, r->size);
    if (numel == 0 || find_chunk(t, r) >= 0) return HS_OK; /* empty, or a replica */
    hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(t);
    if (!c) return hs_error_oom(b->e, "checkpoint save: a chunk of %s in the plan", v->name);
    memcpy(c->offset, r->offset, sizeof c->offset);
    memcpy(c->size, r->size, sizeof c->size);
    c->file = rank_file(b, rank);
    c->byte_offset = b->rank_bytes[rank];
    c->length = numel * (int64_t)hs_dtype_size(t->dtype);
    b->rank_bytes[rank] += c->length;
    p->meta.files[c->file].bytes = b->rank_bytes[rank];
    p->total_bytes += c->length;
    p->rank_chunks[rank]++;
    p->row_entry[row] = *slot;
    p->row_chunk[row] = t->n_chunks - 1;
    return HS_OK;
}

static hs_status build(builder *b, row_view **views, const int *counts) {
    hs_ckpt_plan *p = b->p;
    for (int r = 0; r < p->world; r++)
        for (int i = 0; i < counts[r]; i++)
            if (add_row(b, r, p->rank_base[r] + i, &views[r][i]) != HS_OK) return b->e->code;
    return hs_ckpt_meta_check(&p->meta, "checkpoint save", b->e);
}

/* False without memory (hs_ckpt_plan_free cleans up either way). */
static bool plan_alloc(hs_ckpt_plan *p, const int *counts) {
    p->rank_base = calloc((size_t)p->world + 1, sizeof(int));
    if (!p->rank_base) return false;
    for (int r = 0; r < p->world; r++) p->rank_base[r + 1] = p->rank_base[r] + counts[r];
    int rows = p->rank_base[p->world];
    p->row_entry = malloc(sizeof(int) * (size_t)(rows > 0 ? rows : 1));
    p->row_chunk = malloc(sizeof(int) * (size_t)(rows > 0 ? rows : 1));
    p->rank_file = malloc(sizeof(int) * (size_t)p->world);
    p->rank_chunks = calloc((size_t)p->world, sizeof(int));
    for (int r = 0; p->rank_file && r < p->world; r++) p->rank_file[r] = -1;
    p->meta.files = calloc((size_t)p->world, sizeof(hs_ckpt_file));
    p->meta.world_size = p->world;
    p->meta.version = HS_CKPT_VERSION;
    return p->row_entry && p->row_chunk && p->rank_file && p->rank_chunks && p->meta.files;
}

/* The plan from the gathered tables: `all` holds each rank's at a stride. */
static hs_status plan_rows(hs_ckpt_plan *p, const char *all, int64_t stride, const int64_t *lens,
                           hs_error *e) {
    row_view **views = calloc((size_t)p->world, sizeof(row_view *));
    int *counts = calloc((size_t)p->world, sizeof(int)), rows = 0;
    bool ok = views && counts;
    for (int r = 0; ok && r < p->world; r++) {
        counts[r] = decode(all + r * stride, lens[r], &views[r]);
        ok = counts[r] >= 0;
        rows += ok ? counts[r] : 0;
    }
    builder b = {.p = p, .e = e};
    ok = ok && plan_alloc(p, counts) && index_init(&b.index, rows);
    b.entry_rank = ok ? calloc((size_t)(rows > 0 ? rows : 1), sizeof(int)) : NULL;
    b.rank_bytes = ok ? calloc((size_t)p->world, sizeof(int64_t)) : NULL;
    hs_status s = b.entry_rank && b.rank_bytes
                      ? build(&b, views, counts)
                      : hs_error_oom(e, "checkpoint save: the plan of %d ranks' tables (%d rows)",
                                     p->world, rows);
    free(b.index.slot);
    free(b.entry_rank);
    free(b.rank_bytes);
    for (int r = 0; views && r < p->world; r++) free(views[r]);
    free(views);
    free(counts);
    return s;
}

hs_status hs_ckpt_plan_build(hs_pg *world, const hs_ckpt_tensor *t, int n, hs_ckpt_plan *p,
                             hs_error *e) {
    memset(p, 0, sizeof *p);
    p->world = hs_pg_size(world);
    p->rank = hs_pg_rank(world);
    int64_t len = 0, stride = 0;
    char *mine = encode(t, n, &len), *all = NULL;
    int64_t *lens = calloc((size_t)p->world, sizeof(int64_t));
    if (!mine || !lens) {
        free(mine);
        free(lens);
        return hs_error_oom(e, "checkpoint save: this rank's table of %d tensors (%lld bytes)", n,
                            (long long)len);
    }
    hs_status s = hs_ckpt_all_gather_bytes(world, mine, len, &all, &stride, lens, e);
    free(mine);
    if (s == HS_OK) s = plan_rows(p, all, stride, lens, e);
    free(lens);
    free(all);
    return s;
}

void hs_ckpt_plan_free(hs_ckpt_plan *p) {
    hs_ckpt_meta_free(&p->meta);
    free(p->rank_base);
    free(p->row_entry);
    free(p->row_chunk);
    free(p->rank_file);
    free(p->rank_chunks);
    memset(p, 0, sizeof *p);
}
