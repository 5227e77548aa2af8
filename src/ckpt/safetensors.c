/* Safetensors reader and writer (https://github.com/huggingface/safetensors
 * format): u64 little-endian header length N, N bytes of JSON, then the data
 * region that every tensor's data_offsets index into. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hypershard/ckpt.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this build assumes a little-endian host"
#endif

/* A header larger than this is not a model we could hold anyway; the bound
 * keeps a corrupt length from becoming a huge allocation. */
#define ST_HEADER_MAX ((uint64_t)100 << 20)

struct hs_st_file {
    char path[HS_PATH_MAX];
    void *data; /* the data region: in `map`, or allocated */
    size_t data_bytes;
    void *map; /* the file mapped read-only (hs_safetensors_open), or NULL */
    size_t map_bytes;
    hs_st_tensor *tensors;
    int n;
    char **meta_keys, **meta_values;
    int n_meta;
    /* a sharded directory's files (hs_st_merge): tensors point into them */
    hs_st_file **parts;
    int n_parts;
};

const char *hs_st_dtype_name(hs_dtype dt) {
    switch (dt) {
    case HS_DTYPE_F32: return "F32";
    case HS_DTYPE_BF16: return "BF16";
    case HS_DTYPE_F16: return "F16";
    default: return "?";
    }
}

static bool st_dtype_parse(const char *s, hs_dtype *dt) {
    for (int d = 0; hs_dtype_is_float((hs_dtype)d); d++)
        if (!strcmp(s, hs_st_dtype_name((hs_dtype)d))) return *dt = (hs_dtype)d, true;
    return false;
}

int64_t hs_st_numel(const hs_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* The bytes a tensor's shape and dtype need; false when that overflows
 * (a file's shape is untrusted until its data_offsets agree with it). */
static bool st_bytes_of(const hs_st_tensor *t, int64_t *bytes) {
    int64_t numel;
    return hs_prod_i64(t->shape, t->ndim, &numel) &&
           hs_mul_i64(numel, (int64_t)hs_dtype_size(t->dtype), bytes);
}

/* ---------------------------------------------------------------- writer */

static char *st_header_json(const hs_st_tensor *tensors, int n, const hs_st_meta *meta, int n_meta,
                            size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    if (n_meta > 0) {
        hs_json_key(&j, "__metadata__");
        hs_json_begin_object(&j);
        for (int i = 0; i < n_meta; i++) hs_json_kv_string(&j, meta[i].key, meta[i].value);
        hs_json_end_object(&j);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        hs_json_key(&j, tensors[i].name);
        hs_json_begin_object(&j);
        hs_json_kv_string(&j, "dtype", hs_st_dtype_name(tensors[i].dtype));
        hs_json_key(&j, "shape");
        hs_json_begin_array(&j);
        for (int d = 0; d < tensors[i].ndim; d++) hs_json_int(&j, tensors[i].shape[d]);
        hs_json_end_array(&j);
        hs_json_key(&j, "data_offsets");
        hs_json_begin_array(&j);
        hs_json_int(&j, (int64_t)offset);
        hs_json_int(&j, (int64_t)(offset + tensors[i].bytes));
        hs_json_end_array(&j);
        hs_json_end_object(&j);
        offset += tensors[i].bytes;
    }
    hs_json_end_object(&j);
    /* Spaces (JSON allows trailing whitespace) up to where the data region
     * starts HS_ALIGN-aligned in the file, so in a mapping of it: a tensor
     * whose offset is a multiple of 64 bytes too (every tensor before it
     * a multiple of 16 floats: the usual shapes) can be read in place
     * (hs_model_borrow_param). The format allows no gaps between tensors. */
    while ((8 + ftell(f)) % HS_ALIGN != 0) fputc(' ', f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

hs_status hs_safetensors_write(const char *path, const hs_st_tensor *tensors, int n,
                               const hs_st_meta *meta, int n_meta, hs_error *e) {
    for (int i = 0; i < n; i++)
        if ((size_t)hs_st_numel(&tensors[i]) * hs_dtype_size(tensors[i].dtype) != tensors[i].bytes)
            return hs_error_set(
                e, HS_ERR_INTERNAL, "safetensors %s: tensor %s has %zu bytes, its shape needs %lld",
                path, tensors[i].name, tensors[i].bytes,
                (long long)(hs_st_numel(&tensors[i]) * (int64_t)hs_dtype_size(tensors[i].dtype)));
    size_t hlen = 0;
    char *header = st_header_json(tensors, n, meta, n_meta, &hlen);
    if (!header) return hs_error_oom(e, "safetensors %s: cannot build the header", path);
    char tmp[HS_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = hs_fopen(tmp, "wb", "check that the output directory exists and is writable", e);
    if (!f) {
        free(header);
        return e->code;
    }
    uint64_t n64 = hlen;
    bool ok = fwrite(&n64, 8, 1, f) == 1 && fwrite(header, 1, hlen, f) == hlen;
    for (int i = 0; ok && i < n; i++)
        ok = tensors[i].bytes == 0 ||
             fwrite(tensors[i].data, 1, tensors[i].bytes, f) == tensors[i].bytes;
    free(header);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return hs_error_set(e, HS_ERR_IO, "cannot write safetensors file %s: %s", path,
                            hs_strerror_errno());
    }
    return HS_OK;
}

/* ---------------------------------------------------------------- reader */

static hs_status st_parse_shape(const char *path, const char *name, json_t *shape, hs_st_tensor *t,
                                hs_error *e) {
    if (!json_is_array(shape) || json_array_size(shape) > HS_TENSOR_MAX_DIMS)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: \"shape\" must be an array of at most %d "
                            "dims",
                            path, name, HS_TENSOR_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return hs_error_set(
                e, HS_ERR_FORMAT,
                "safetensors %s: tensor %s: shape[%d] is not a non-negative integer", path, name,
                d);
        t->shape[d] = json_integer_value(v);
    }
    return HS_OK;
}

static hs_status st_parse_tensor(hs_st_file *f, const char *name, json_t *obj, hs_st_tensor *t,
                                 hs_error *e) {
    const char *path = f->path;
    if (strlen(name) >= HS_ST_NAME_MAX)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor name %.60s... is longer than %d", path, name,
                            HS_ST_NAME_MAX - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    json_t *dtype = json_object_get(obj, "dtype");
    if (!json_is_string(dtype) || !st_dtype_parse(json_string_value(dtype), &t->dtype))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s has dtype %s; hypershard reads F32, BF16 "
                            "and F16",
                            path, name,
                            json_is_string(dtype) ? json_string_value(dtype) : "(none)");
    hs_status s = st_parse_shape(path, name, json_object_get(obj, "shape"), t, e);
    if (s != HS_OK) return s;
    json_t *off = json_object_get(obj, "data_offsets");
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(en))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: \"data_offsets\" must be [begin, end]",
                            path, name);
    json_int_t begin = json_integer_value(b), end = json_integer_value(en);
    int64_t want = 0;
    if (!st_bytes_of(t, &want))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: shape has more elements than fit 64 bits; "
                            "the file is corrupt",
                            path, name);
    if (begin < 0 || end < begin || (uint64_t)end > f->data_bytes)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: data_offsets [%lld, %lld] lie outside the "
                            "%zu-byte data region; the file is truncated or corrupt",
                            path, name, (long long)begin, (long long)end, f->data_bytes);
    if (end - begin != want)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: data_offsets span %lld bytes but %s of "
                            "that shape needs %lld",
                            path, name, (long long)(end - begin), hs_st_dtype_name(t->dtype),
                            (long long)want);
    t->data = (const char *)f->data + begin;
    t->bytes = (size_t)want;
    return HS_OK;
}

static int st_by_offset(const void *a, const void *b) {
    const hs_st_tensor *x = *(const hs_st_tensor *const *)a, *y = *(const hs_st_tensor *const *)b;
    if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
    return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

/* No two tensors may share bytes: writing one would change the other, and
 * a crafted file could alias every weight onto one region. */
static hs_status st_check_overlaps(hs_st_file *f, hs_error *e) {
    const hs_st_tensor **order = malloc(sizeof *order * (size_t)(f->n ? f->n : 1));
    if (!order) return hs_error_oom(e, "safetensors %s: cannot allocate", f->path);
    for (int i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n, sizeof *order, st_by_offset);
    hs_status s = HS_OK;
    const hs_st_tensor *prev = NULL;
    for (int i = 0; i < f->n && s == HS_OK; i++) {
        const hs_st_tensor *t = order[i];
        if (t->bytes == 0) continue;
        if (prev && (const char *)prev->data + prev->bytes > (const char *)t->data) {
            long long pb = (const char *)prev->data - (const char *)f->data;
            long long tb = (const char *)t->data - (const char *)f->data;
            s = hs_error_set(e, HS_ERR_FORMAT,
                             "safetensors %s: tensors %s (data_offsets [%lld, %lld]) and %s "
                             "([%lld, %lld]) overlap; the file is corrupt",
                             f->path, prev->name, pb, pb + (long long)prev->bytes, t->name, tb,
                             tb + (long long)t->bytes);
        }
        prev = t;
    }
    free(order);
    return s;
}

static hs_status st_parse_meta(hs_st_file *f, json_t *meta, hs_error *e) {
    if (!json_is_object(meta))
        return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: \"__metadata__\" is not an object",
                            f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return hs_error_oom(e, "safetensors %s: cannot allocate metadata", f->path);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: __metadata__.%s is not a string",
                                f->path, key);
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(v));
        f->n_meta++; /* counted either way: the file's free frees what is there */
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return hs_error_oom(e, "safetensors %s: __metadata__.%s: %zu bytes", f->path, key,
                                strlen(key) + strlen(json_string_value(v)) + 2);
    }
    return HS_OK;
}

static hs_status st_parse_header(hs_st_file *f, const char *text, size_t len, hs_error *e) {
    json_error_t jerr;
    /* A repeated tensor name would otherwise silently replace the first. */
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: header JSON line %d column %d: %s",
                            f->path, jerr.line, jerr.column, jerr.text);
    hs_status s = HS_OK;
    if (!json_is_object(root)) {
        s = hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: header is not a JSON object", f->path);
    } else {
        f->tensors = calloc(json_object_size(root) + 1, sizeof(hs_st_tensor));
        if (!f->tensors) s = hs_error_oom(e, "safetensors %s: cannot allocate", f->path);
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            if (s != HS_OK) break;
            if (!strcmp(key, "__metadata__")) s = st_parse_meta(f, v, e);
            else if (!json_is_object(v))
                s = hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: entry %s is not an object",
                                 f->path, key);
            else s = st_parse_tensor(f, key, v, &f->tensors[f->n++], e);
        }
        if (s == HS_OK) s = st_check_overlaps(f, e);
    }
    json_decref(root);
    return s;
}

/* The 8-byte header length of a file of `size` bytes, checked. */
static hs_status st_header_len(const hs_st_file *f, const void *first8, uint64_t size,
                               uint64_t *hlen, hs_error *e) {
    if (size < 8)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: %llu bytes is shorter than the 8-byte header length; "
                            "the file is truncated or not safetensors",
                            f->path, (unsigned long long)size);
    memcpy(hlen, first8, 8);
    if (*hlen > ST_HEADER_MAX)
        return hs_error_set(
            e, HS_ERR_FORMAT,
            "safetensors %s: the header is %llu bytes, larger than the limit of "
            "%llu bytes this reader accepts; the file is corrupt or not safetensors",
            f->path, (unsigned long long)*hlen, (unsigned long long)ST_HEADER_MAX);
    if (*hlen > size - 8)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: header length %llu does not fit the %llu-byte file; "
                            "the file is truncated or not safetensors",
                            f->path, (unsigned long long)*hlen, (unsigned long long)size);
    return HS_OK;
}

/* Room for the data region (aligned, never empty). */
static hs_status st_alloc_data(hs_st_file *f, uint64_t bytes, hs_error *e) {
    f->data_bytes = (size_t)bytes;
    f->data = aligned_alloc(HS_ALIGN, (f->data_bytes / HS_ALIGN + 1) * HS_ALIGN);
    return f->data ? HS_OK
                   : hs_error_oom(e, "safetensors %s: cannot allocate %zu bytes", f->path,
                                  f->data_bytes);
}

static hs_status st_read_all(hs_st_file *f, FILE *fp, hs_error *e) {
    long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (size < 0)
        return hs_error_set(e, HS_ERR_IO, "safetensors %s: cannot seek: %s", f->path,
                            hs_strerror_errno());
    rewind(fp);
    uint64_t hlen = 0;
    char first8[8] = {0};
    size_t got = fread(first8, 1, 8, fp);
    hs_status s = st_header_len(f, first8, got == 8 ? (uint64_t)size : got, &hlen, e);
    if (s != HS_OK) return s;
    char *header = malloc(hlen ? hlen : 1);
    if (!header) return hs_error_oom(e, "safetensors %s: cannot allocate", f->path);
    /* The data region is read where it lies in the page cache (a private
     * mapping: no zero-filled copy of the whole file), or, where the file
     * cannot be mapped, into memory of its own. Writable but private, as
     * the memory of its own is: a parameter that reads its values here
     * (hs_model_borrow_param) and were written would copy the page, never
     * fault and never reach the file. */
    uint64_t data_bytes = (uint64_t)size - 8 - hlen;
    void *map = data_bytes
                    ? mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(fp), 0)
                    : MAP_FAILED;
    if (map != MAP_FAILED) {
        f->map = map, f->map_bytes = (size_t)size;
        f->data = (char *)map + 8 + hlen, f->data_bytes = (size_t)data_bytes;
    } else {
        s = st_alloc_data(f, data_bytes, e);
    }
    if (s == HS_OK &&
        (fread(header, 1, hlen, fp) != hlen ||
         (!f->map && f->data_bytes && fread(f->data, 1, f->data_bytes, fp) != f->data_bytes)))
        s = hs_error_set(e, HS_ERR_IO, "safetensors %s: read failed: %s", f->path,
                         hs_strerror_errno());
    if (s == HS_OK) s = st_parse_header(f, header, hlen, e);
    free(header);
    return s;
}

static hs_st_file *st_new(const char *path, hs_error *e) {
    hs_st_file *f = calloc(1, sizeof *f);
    if (!f) hs_error_oom(e, "safetensors %s: cannot allocate", path);
    else snprintf(f->path, sizeof f->path, "%s", path);
    return f;
}

static hs_status st_finish(hs_st_file *f, hs_status s, hs_st_file **out) {
    if (s != HS_OK) hs_safetensors_close(f);
    else *out = f;
    return s;
}

hs_status hs_safetensors_open(const char *path, hs_st_file **out, hs_error *e) {
    *out = NULL;
    hs_st_file *f = st_new(path, e);
    if (!f) return e->code;
    FILE *fp = hs_fopen(path, "rb", "check the path (a directory needs /model.safetensors)", e);
    if (!fp) {
        free(f);
        return e->code;
    }
    hs_status s = st_read_all(f, fp, e);
    fclose(fp);
    return st_finish(f, s, out);
}

hs_status hs_safetensors_open_mem(const char *path, const void *buf, size_t len, hs_st_file **out,
                                  hs_error *e) {
    *out = NULL;
    hs_st_file *f = st_new(path, e);
    if (!f) return e->code;
    uint64_t hlen = 0;
    char first8[8] = {0};
    memcpy(first8, buf, len < 8 ? len : 8);
    hs_status s = st_header_len(f, first8, len, &hlen, e);
    if (s == HS_OK) s = st_alloc_data(f, len - 8 - hlen, e);
    if (s == HS_OK) {
        memcpy(f->data, (const char *)buf + 8 + hlen, f->data_bytes);
        s = st_parse_header(f, (const char *)buf + 8, hlen, e);
    }
    return st_finish(f, s, out);
}

hs_st_file *hs_st_merge(const char *path, hs_st_file **parts, int n_parts, hs_error *e) {
    hs_st_file *f = st_new(path, e);
    int n = 0;
    for (int i = 0; i < n_parts; i++) n += parts[i]->n;
    if (f) f->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *f->tensors);
    if (f && !f->tensors) {
        free(f);
        f = NULL;
        hs_error_oom(e, "safetensors %s: %d tensors' descriptors", path, n);
    }
    if (!f) {
        for (int i = 0; i < n_parts; i++) hs_safetensors_close(parts[i]);
        free(parts);
        return NULL;
    }
    for (int i = 0; i < n_parts; i++)
        for (int t = 0; t < parts[i]->n; t++) f->tensors[f->n++] = parts[i]->tensors[t];
    f->parts = parts, f->n_parts = n_parts;
    return f;
}

void hs_safetensors_close(hs_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_parts; i++) hs_safetensors_close(f->parts[i]);
    free(f->parts);
    for (int i = 0; i < f->n_meta; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->tensors);
    if (f->map) munmap(f->map, f->map_bytes);
    else free(f->data);
    free(f);
}

int hs_safetensors_count(const hs_st_file *f) { return f->n; }

const hs_st_tensor *hs_safetensors_tensor(const hs_st_file *f, int i) {
    HS_ASSERT(i >= 0 && i < f->n);
    return &f->tensors[i];
}

const hs_st_tensor *hs_safetensors_find(const hs_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *hs_safetensors_meta(const hs_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}

void hs_st_to_f32(const hs_st_tensor *t, float *out) {
    int64_t n = hs_st_numel(t);
    size_t es = hs_dtype_size(t->dtype);
    /* Tensors of other writers may sit at any byte offset: convert through
     * an aligned bounce buffer instead of loading through a cast pointer. */
    enum { CHUNK = 4096 };
    _Alignas(64) uint8_t bounce[CHUNK * 4];
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t len = n - i < CHUNK ? n - i : CHUNK;
        memcpy(bounce, (const uint8_t *)t->data + (size_t)i * es, (size_t)len * es);
        hs_convert(out + i, HS_DTYPE_F32, bounce, t->dtype, len);
    }
}
