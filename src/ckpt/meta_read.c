/* ckpt/meta_read.c — parse metadata.json (Jansson) into hs_ckpt_meta. Every
 * field is type-checked; a missing or malformed one is an error naming the
 * file and the JSON path, so a damaged metadata file never loads. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

typedef struct parser {
    const char *path;
    hs_error *e;
} parser;

static hs_status bad(const parser *p, const char *where, const char *what) {
    return hs_error_set(p->e, HS_ERR_FORMAT,
                        "%s: %s %s; the metadata is damaged or not a hypershard checkpoint",
                        p->path, where, what);
}

static hs_status get_int(const parser *p, json_t *obj, const char *key, const char *where,
                         int64_t *out) {
    json_t *v = json_object_get(obj, key);
    char w[HS_CKPT_NAME_MAX + 64];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!json_is_integer(v)) return bad(p, w, "is missing or not an integer");
    *out = (int64_t)json_integer_value(v);
    return HS_OK;
}

static hs_status get_hex(const parser *p, json_t *obj, const char *key, const char *where,
                         uint64_t *out) {
    json_t *v = json_object_get(obj, key);
    char w[HS_CKPT_NAME_MAX + 64];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!json_is_string(v) || !hs_ckpt_parse_hex64(json_string_value(v), out))
        return bad(p, w, "is missing or not a \"0x...\" hex string");
    return HS_OK;
}

static hs_status get_dims(const parser *p, json_t *obj, const char *key, const char *where,
                          int *ndim, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    char w[HS_CKPT_NAME_MAX + 64];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > HS_CKPT_DIMS)
        return bad(p, w, "is missing or not an array of 1 to 4 integers");
    if (*ndim > 0 && (int)json_array_size(v) != *ndim) return bad(p, w, "has the wrong rank");
    *ndim = (int)json_array_size(v);
    for (int d = 0; d < *ndim; d++) {
        json_t *x = json_array_get(v, (size_t)d);
        if (!json_is_integer(x)) return bad(p, w, "holds a non-integer");
        out[d] = (int64_t)json_integer_value(x);
    }
    return HS_OK;
}

/* A count of steps or batches in the state: an integer, never negative. */
static hs_status get_count(const parser *p, json_t *st, const char *key, int64_t *out) {
    if (get_int(p, st, key, "state", out) != HS_OK) return p->e->code;
    if (*out < 0)
        return hs_error_set(p->e, HS_ERR_FORMAT,
                            "%s: state.%s %lld is negative; the checkpoint "
                            "is damaged (load another step)",
                            p->path, key, (long long)*out);
    return HS_OK;
}

static hs_status parse_state(const parser *p, json_t *root, hs_ckpt_state *s) {
    json_t *st = json_object_get(root, "state");
    if (!json_is_object(st)) return bad(p, "state", "is missing");
    hs_status r = get_count(p, st, "step", &s->step);
    if (r == HS_OK) r = get_count(p, st, "data_position", &s->data_position);
    if (r == HS_OK) r = get_count(p, st, "optim_step", &s->optim_step);
    if (r == HS_OK) r = get_hex(p, st, "rng_seed", "state", &s->rng_seed);
    if (r == HS_OK) r = get_hex(p, st, "rng_counter", "state", &s->rng_counter);
    if (r == HS_OK) r = get_hex(p, st, "config_hash", "state", &s->config_hash);
    return r;
}

/* "rank-<r>.bin" with 0 <= r < world: the only names a save writes. Any
 * other (metadata.json, config.yaml, a dot file) could alias a file of the
 * step directory that is not a data file. */
static bool rank_file_name(const char *s, int world) {
    if (strncmp(s, "rank-", 5) != 0 || s[5] < '0' || s[5] > '9' || (s[5] == '0' && s[6] != '.'))
        return false;
    char *end = NULL;
    long r = strtol(s + 5, &end, 10);
    return !strcmp(end, ".bin") && r < world;
}

static hs_status parse_files(const parser *p, json_t *root, hs_ckpt_meta *m) {
    json_t *fa = json_object_get(root, "files");
    if (!json_is_array(fa)) return bad(p, "files", "is missing or not an array");
    m->n_files = (int)json_array_size(fa);
    m->files = calloc((size_t)(m->n_files > 0 ? m->n_files : 1), sizeof(hs_ckpt_file));
    if (!m->files) {
        int n = m->n_files;
        m->n_files = 0;
        return hs_error_oom(p->e, "%s: the table of %d data files", p->path, n);
    }
    for (int i = 0; i < m->n_files; i++) {
        json_t *f = json_array_get(fa, (size_t)i);
        char w[64];
        snprintf(w, sizeof w, "files[%d]", i);
        json_t *name = json_object_get(f, "name");
        if (!json_is_string(name) || strlen(json_string_value(name)) >= sizeof m->files[i].name ||
            !rank_file_name(json_string_value(name), m->world_size))
            return bad(p, w,
                       "has a missing or unsafe file name (want rank-<r>.bin, r below "
                       "world_size)");
        snprintf(m->files[i].name, sizeof m->files[i].name, "%s", json_string_value(name));
        if (get_int(p, f, "bytes", w, &m->files[i].bytes) != HS_OK) return p->e->code;
    }
    return HS_OK;
}

static int file_index(const hs_ckpt_meta *m, const char *name) {
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name)) return i;
    return -1;
}

static hs_status parse_chunk(const parser *p, json_t *cj, hs_ckpt_meta *m, hs_ckpt_entry *t,
                             const char *where) {
    hs_ckpt_chunk *c = hs_ckpt_entry_add_chunk(t);
    if (!c) return hs_error_oom(p->e, "%s: %s: room for its chunk %d", p->path, where, t->n_chunks);
    int nd = t->ndim;
    if (get_dims(p, cj, "offsets", where, &nd, c->offset) != HS_OK) return p->e->code;
    if (get_dims(p, cj, "sizes", where, &nd, c->size) != HS_OK) return p->e->code;
    json_t *file = json_object_get(cj, "file");
    if (!json_is_string(file) || (c->file = file_index(m, json_string_value(file))) < 0)
        return bad(p, where, "names a data file that is not in \"files\"");
    if (get_int(p, cj, "byte_offset", where, &c->byte_offset) != HS_OK) return p->e->code;
    if (get_int(p, cj, "length", where, &c->length) != HS_OK) return p->e->code;
    uint64_t crc = 0;
    json_t *cv = json_object_get(cj, "crc32");
    const char *cs = json_is_string(cv) ? json_string_value(cv) : NULL;
    if (!cs || strlen(cs) != 10 || !hs_ckpt_parse_hex64(cs, &crc))
        return bad(p, where, "has no \"crc32\" of the form \"0x1234abcd\"");
    c->crc32 = (uint32_t)crc;
    return HS_OK;
}

static hs_status parse_tensor(const parser *p, json_t *tj, int i, hs_ckpt_meta *m) {
    char w[HS_CKPT_NAME_MAX + 32];
    snprintf(w, sizeof w, "tensors[%d]", i);
    json_t *name = json_object_get(tj, "name"), *dtype = json_object_get(tj, "dtype");
    hs_dtype dt;
    if (!json_is_string(name) || strlen(json_string_value(name)) >= HS_CKPT_NAME_MAX)
        return bad(p, w, "has no name (or one longer than 255 bytes)");
    snprintf(w, sizeof w, "tensor '%s'", json_string_value(name));
    if (!json_is_string(dtype) || !hs_dtype_parse(json_string_value(dtype), &dt))
        return bad(p, w, "has a missing or unknown dtype (want float32, bfloat16 or float16)");
    int nd = 0;
    int64_t shape[HS_CKPT_DIMS];
    if (get_dims(p, tj, "shape", w, &nd, shape) != HS_OK) return p->e->code;
    int idx = hs_ckpt_meta_add_tensor(m, json_string_value(name), dt, nd, shape);
    if (idx < 0) return hs_error_oom(p->e, "%s: %s: room for tensor %d", p->path, w, i);
    hs_ckpt_entry *t = &m->tensors[idx]; /* after the call: it may move the table */
    json_t *ca = json_object_get(tj, "chunks");
    if (!json_is_array(ca)) return bad(p, w, "has no \"chunks\" array");
    for (size_t k = 0; k < json_array_size(ca); k++) {
        char cw[HS_CKPT_NAME_MAX + 64];
        snprintf(cw, sizeof cw, "%s chunks[%zu]", w, k);
        if (parse_chunk(p, json_array_get(ca, k), m, t, cw) != HS_OK) return p->e->code;
    }
    return HS_OK;
}

static hs_status parse_root(const parser *p, json_t *root, hs_ckpt_meta *m) {
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), HS_CKPT_FORMAT) != 0)
        return hs_error_set(p->e, HS_ERR_FORMAT,
                            "%s: \"format\" is not \"%s\"; this is not a hypershard checkpoint",
                            p->path, HS_CKPT_FORMAT);
    int64_t version = 0, world = 0;
    if (get_int(p, root, "version", "root", &version) != HS_OK) return p->e->code;
    if (version != HS_CKPT_VERSION)
        return hs_error_set(p->e, HS_ERR_FORMAT,
                            "%s: checkpoint format version %lld, this build reads version %d; "
                            "load it with the hypershard release that wrote it",
                            p->path, (long long)version, HS_CKPT_VERSION);
    m->version = (int)version;
    if (get_int(p, root, "world_size", "root", &world) != HS_OK) return p->e->code;
    if (world < 1 || world > HS_CKPT_WORLD_MAX)
        return bad(p, "root.world_size", "is not between 1 and 1048576");
    m->world_size = (int)world;
    /* Optional; a time before 1970 or past the year 5000 is no save time. */
    json_t *created = json_object_get(root, "created_unix");
    m->created_unix = json_is_number(created) ? json_number_value(created) : 0;
    if (created && (!json_is_number(created) || !(m->created_unix >= 0 && m->created_unix < 1e11)))
        return bad(p, "root.created_unix", "is not a time in seconds since 1970");
    if (parse_state(p, root, &m->state) != HS_OK || parse_files(p, root, m) != HS_OK)
        return p->e->code;
    json_t *ta = json_object_get(root, "tensors");
    if (!json_is_array(ta)) return bad(p, "tensors", "is missing or not an array");
    for (size_t i = 0; i < json_array_size(ta); i++)
        if (parse_tensor(p, json_array_get(ta, i), (int)i, m) != HS_OK) return p->e->code;
    return hs_ckpt_meta_check(m, p->path, p->e);
}

hs_status hs_ckpt_meta_parse(const char *text, size_t len, const char *path, hs_ckpt_meta *m,
                             hs_error *e) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* Jansson quotes the token it stopped at ("... near 'root:x'"); the
         * file may be something other than metadata (a link to any file),
         * so only the position is given. */
        char *near = strstr(je.text, " near '");
        if (near) *near = '\0';
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s:%d:%d: not valid JSON (%s); the metadata is damaged — load an "
                            "earlier checkpoint",
                            path, je.line, je.column, je.text);
    }
    parser p = {path, e};
    hs_status s = json_is_object(root) ? parse_root(&p, root, m)
                                       : bad(&p, "the top level", "is not an object");
    json_decref(root);
    if (s != HS_OK) hs_ckpt_meta_free(m);
    return s;
}
