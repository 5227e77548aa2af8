/* Safetensors reader and writer (https://github.com/huggingface/safetensors
 * format): u64 little-endian header length N, N bytes of JSON, then the data
 * region that every tensor's data_offsets index into. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/train.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this build assumes a little-endian host"
#endif

/* A header larger than this is not a model we could hold anyway; the bound
 * keeps a corrupt length from becoming a huge allocation. */
#define ST_HEADER_MAX ((uint64_t)100 << 20)

struct hs_st_file {
    char path[HS_PATH_MAX];
    void *data; /* the data region */
    size_t data_bytes;
    hs_st_tensor *tensors;
    int n;
    char **meta_keys, **meta_values;
    int n_meta;
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
    for (int d = 0; d < HS_DTYPE_COUNT; d++)
        if (!strcmp(s, hs_st_dtype_name((hs_dtype)d))) return *dt = (hs_dtype)d, true;
    return false;
}

int64_t hs_st_numel(const hs_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
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
    /* Spaces up to a multiple of 8 keep the data region (and so every F32
     * tensor of ours) 8-byte aligned; JSON allows trailing whitespace. */
    while (ftell(f) % 8 != 0) fputc(' ', f);
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
            return hs_error_set(e, HS_ERR_INTERNAL,
                                "safetensors %s: tensor %s has %zu bytes, its shape needs %lld", path,
                                tensors[i].name, tensors[i].bytes,
                                (long long)(hs_st_numel(&tensors[i]) *
                                            (int64_t)hs_dtype_size(tensors[i].dtype)));
    size_t hlen = 0;
    char *header = st_header_json(tensors, n, meta, n_meta, &hlen);
    if (!header) return hs_error_set(e, HS_ERR_OOM, "safetensors %s: cannot build the header", path);
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
        ok = tensors[i].bytes == 0 || fwrite(tensors[i].data, 1, tensors[i].bytes, f) == tensors[i].bytes;
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
            return hs_error_set(e, HS_ERR_FORMAT,
                                "safetensors %s: tensor %s: shape[%d] is not a non-negative integer",
                                path, name, d);
        t->shape[d] = json_integer_value(v);
    }
    return HS_OK;
}

static hs_status st_parse_tensor(hs_st_file *f, const char *name, json_t *obj, hs_st_tensor *t,
                                 hs_error *e) {
    const char *path = f->path;
    if (strlen(name) >= HS_ST_NAME_MAX)
        return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: tensor name %.60s... is longer than %d",
                            path, name, HS_ST_NAME_MAX - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    json_t *dtype = json_object_get(obj, "dtype");
    if (!json_is_string(dtype) || !st_dtype_parse(json_string_value(dtype), &t->dtype))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s has dtype %s; hypershard reads F32, BF16 "
                            "and F16",
                            path, name, json_is_string(dtype) ? json_string_value(dtype) : "(none)");
    hs_status s = st_parse_shape(path, name, json_object_get(obj, "shape"), t, e);
    if (s != HS_OK) return s;
    json_t *off = json_object_get(obj, "data_offsets");
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(en))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: \"data_offsets\" must be [begin, end]", path,
                            name);
    json_int_t begin = json_integer_value(b), end = json_integer_value(en);
    size_t want = (size_t)hs_st_numel(t) * hs_dtype_size(t->dtype);
    if (begin < 0 || end < begin || (uint64_t)end > f->data_bytes)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: data_offsets [%lld, %lld] lie outside the "
                            "%zu-byte data region; the file is truncated or corrupt",
                            path, name, (long long)begin, (long long)end, f->data_bytes);
    if ((size_t)(end - begin) != want)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: tensor %s: data_offsets span %lld bytes but %s of "
                            "that shape needs %zu",
                            path, name, (long long)(end - begin), hs_st_dtype_name(t->dtype), want);
    t->data = (const char *)f->data + begin;
    t->bytes = want;
    return HS_OK;
}

static hs_status st_parse_meta(hs_st_file *f, json_t *meta, hs_error *e) {
    if (!json_is_object(meta))
        return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: \"__metadata__\" is not an object",
                            f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return hs_error_set(e, HS_ERR_OOM, "safetensors %s: cannot allocate metadata", f->path);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return hs_error_set(e, HS_ERR_FORMAT,
                                "safetensors %s: __metadata__.%s is not a string", f->path, key);
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(v));
        f->n_meta++;
    }
    return HS_OK;
}

static hs_status st_parse_header(hs_st_file *f, const char *text, size_t len, hs_error *e) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root)
        return hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: header JSON line %d column %d: %s",
                            f->path, jerr.line, jerr.column, jerr.text);
    hs_status s = HS_OK;
    if (!json_is_object(root)) {
        s = hs_error_set(e, HS_ERR_FORMAT, "safetensors %s: header is not a JSON object", f->path);
    } else {
        f->tensors = calloc(json_object_size(root) + 1, sizeof(hs_st_tensor));
        if (!f->tensors) s = hs_error_set(e, HS_ERR_OOM, "safetensors %s: cannot allocate", f->path);
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
    }
    json_decref(root);
    return s;
}

static hs_status st_read_all(hs_st_file *f, FILE *fp, hs_error *e) {
    if (fseek(fp, 0, SEEK_END) != 0)
        return hs_error_set(e, HS_ERR_IO, "safetensors %s: cannot seek: %s", f->path,
                            hs_strerror_errno());
    long size = ftell(fp);
    rewind(fp);
    uint64_t hlen = 0;
    if (size < 8 || fread(&hlen, 8, 1, fp) != 1)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: %ld bytes is shorter than the 8-byte header length; "
                            "the file is truncated or not safetensors",
                            f->path, size);
    if (hlen > ST_HEADER_MAX || hlen > (uint64_t)size - 8)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "safetensors %s: header length %llu does not fit the %ld-byte file; the "
                            "file is truncated or not safetensors",
                            f->path, (unsigned long long)hlen, size);
    char *header = malloc(hlen ? hlen : 1);
    f->data_bytes = (size_t)((uint64_t)size - 8 - hlen);
    f->data = aligned_alloc(HS_ALIGN, (f->data_bytes / HS_ALIGN + 1) * HS_ALIGN);
    if (!header || !f->data) {
        free(header);
        return hs_error_set(e, HS_ERR_OOM, "safetensors %s: cannot allocate %zu bytes", f->path,
                            f->data_bytes);
    }
    hs_status s = HS_OK;
    if (fread(header, 1, hlen, fp) != hlen ||
        (f->data_bytes && fread(f->data, 1, f->data_bytes, fp) != f->data_bytes))
        s = hs_error_set(e, HS_ERR_IO, "safetensors %s: read failed: %s", f->path,
                         hs_strerror_errno());
    if (s == HS_OK) s = st_parse_header(f, header, hlen, e);
    free(header);
    return s;
}

hs_status hs_safetensors_open(const char *path, hs_st_file **out, hs_error *e) {
    *out = NULL;
    hs_st_file *f = calloc(1, sizeof *f);
    if (!f) return hs_error_set(e, HS_ERR_OOM, "safetensors %s: cannot allocate", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    FILE *fp = hs_fopen(path, "rb", "check the path (a directory needs /model.safetensors)", e);
    if (!fp) {
        free(f);
        return e->code;
    }
    hs_status s = st_read_all(f, fp, e);
    fclose(fp);
    if (s != HS_OK) {
        hs_safetensors_close(f);
        return s;
    }
    *out = f;
    return HS_OK;
}

void hs_safetensors_close(hs_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_meta; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->tensors);
    free(f->data);
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
