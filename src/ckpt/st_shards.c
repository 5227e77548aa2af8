/* A Hugging Face weights directory: one model.safetensors, or the shards
 * that model.safetensors.index.json lists (save_pretrained splits a model
 * above its max_shard_size, 5 GB by default), read as one file. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_internal.h"

#define INDEX_NAME "model.safetensors.index.json"

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void hs_safetensors_dir_path(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/model.safetensors", dir);
    if (exists(out)) return;
    char index[HS_PATH_MAX + 48];
    snprintf(index, sizeof index, "%s/" INDEX_NAME, dir);
    if (exists(index)) snprintf(out, cap, "%s", index);
}

/* A shard's name as the index gives it: a file of the directory. */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 200;
}

/* The index's shard names, each once, in the order they first appear. */
static hs_status shard_names(json_t *map, const char *path, const char ***names, int *n,
                             hs_error *e) {
    size_t cap = json_object_size(map);
    *names = calloc(cap > 0 ? cap : 1, sizeof **names);
    *n = 0;
    if (!*names) return hs_error_oom(e, "%s: %zu shard names", path, cap);
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        const char *file = json_is_string(v) ? json_string_value(v) : NULL;
        if (!file || !plain_name(file))
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: weight_map gives tensor %s the file %s%s%s; it must name a "
                                "safetensors file of the directory",
                                path, key, file ? "\"" : "", file ? file : "(not a string)",
                                file ? "\"" : "");
        bool seen = false;
        for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], file);
        if (!seen) (*names)[(*n)++] = file;
    }
    if (*n == 0) return hs_error_set(e, HS_ERR_FORMAT, "%s: weight_map names no tensor", path);
    return HS_OK;
}

/* Every tensor of shard `file` is one the map puts there, and every
 * tensor the map puts there is in it. */
static hs_status check_shard(json_t *map, const char *path, const char *file, const hs_st_file *f,
                             hs_error *e) {
    for (int t = 0; t < hs_safetensors_count(f); t++) {
        const char *name = hs_safetensors_tensor(f, t)->name;
        json_t *v = json_object_get(map, name);
        if (!v)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: tensor %s is in %s, but weight_map does not list it", path,
                                name, file);
        if (strcmp(json_string_value(v), file) != 0)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: tensor %s is in %s, but weight_map puts it in %s", path, name,
                                file, json_string_value(v));
    }
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!strcmp(json_string_value(v), file) && !hs_safetensors_find(f, key))
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: weight_map puts tensor %s in %s, which lacks it", path, key,
                                file);
    }
    return HS_OK;
}

static hs_status open_shards(const char *dir, const char *path, json_t *map, hs_st_file **out,
                             hs_error *e) {
    const char **names = NULL;
    int n = 0;
    hs_status s = shard_names(map, path, &names, &n, e);
    hs_st_file **parts = s == HS_OK ? calloc((size_t)n, sizeof *parts) : NULL;
    if (s == HS_OK && !parts) s = hs_error_oom(e, "%s: %d shards", path, n);
    int opened = 0;
    for (int i = 0; s == HS_OK && i < n; i++) {
        char shard[HS_PATH_MAX + 256];
        snprintf(shard, sizeof shard, "%s/%s", dir, names[i]);
        if (!exists(shard)) {
            s = hs_error_set(e, HS_ERR_IO,
                             "%s: weight_map names the shard %s, which is not in %s; copy every "
                             "shard of the checkpoint there",
                             path, names[i], dir);
            break;
        }
        s = hs_safetensors_open(shard, &parts[i], e);
        if (s == HS_OK) opened++, s = check_shard(map, path, names[i], parts[i], e);
    }
    free(names);
    if (s != HS_OK) {
        for (int i = 0; i < opened; i++) hs_safetensors_close(parts[i]);
        free(parts);
        return s;
    }
    *out = hs_st_merge(path, parts, n, e);
    return *out ? HS_OK : e->code;
}

hs_status hs_safetensors_open_dir(const char *dir, hs_st_file **out, hs_error *e) {
    *out = NULL;
    char path[HS_PATH_MAX + 48];
    hs_safetensors_dir_path(dir, path, sizeof path);
    size_t n = strlen(path), m = strlen(INDEX_NAME);
    if (n < m || strcmp(path + n - m, INDEX_NAME) != 0) return hs_safetensors_open(path, out, e);
    char *text = NULL;
    size_t len = 0;
    if (hs_read_file(path, &text, &len, e) != HS_OK) return e->code;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return hs_error_set(e, HS_ERR_FORMAT, "%s: line %d column %d: %s", path, jerr.line,
                            jerr.column, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    hs_status s = json_is_object(map)
                      ? open_shards(dir, path, map, out, e)
                      : hs_error_set(e, HS_ERR_FORMAT, "%s: no \"weight_map\" object", path);
    json_decref(root);
    return s;
}
