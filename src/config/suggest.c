/* Why a path is not a key: removed keys name their replacement, unknown keys
 * name the nearest valid path (edit distance over every key and section). */
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

#define LEV_MAX 256

size_t hs_cfg_levenshtein(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > LEV_MAX || nb > LEV_MAX) return (size_t)-1 / 2;
    size_t row[LEV_MAX + 1];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

int hs_cfg_nearest(const char *s, const char *const *cands, int n, size_t *dist) {
    int best = -1;
    size_t bd = (size_t)-1;
    for (int i = 0; i < n; i++) {
        size_t d = hs_cfg_levenshtein(s, cands[i]);
        if (d < bd) bd = d, best = i;
    }
    if (dist) *dist = bd;
    return best;
}

static const char *last_part(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* Every key path and every section path ("fsdp_config",
 * "fsdp_config.mix_precision"), as candidates for a suggestion. */
typedef struct path_set {
    char names[256][96];
    const char *ptrs[256];
    int n;
} path_set;

static void path_set_add(path_set *ps, const char *p, size_t len) {
    for (int i = 0; i < ps->n; i++)
        if (strlen(ps->names[i]) == len && !strncmp(ps->names[i], p, len)) return;
    if (ps->n == 256 || len >= sizeof ps->names[0]) return;
    memcpy(ps->names[ps->n], p, len);
    ps->names[ps->n][len] = '\0';
    ps->ptrs[ps->n] = ps->names[ps->n];
    ps->n++;
}

static void path_set_fill(path_set *ps) {
    int nk;
    const hs_cfg_key *keys = hs_cfg_keys(&nk);
    ps->n = 0;
    for (int i = 0; i < nk; i++) {
        for (const char *d = strchr(keys[i].path, '.'); d; d = strchr(d + 1, '.'))
            path_set_add(ps, keys[i].path, (size_t)(d - keys[i].path));
        path_set_add(ps, keys[i].path, strlen(keys[i].path));
    }
}

/* A key written in the wrong section ("fsdp_config.param_dtype") is found by
 * its last part before edit distance is tried. */
static const char *nearest_path(const path_set *ps, const char *path) {
    const char *tail = last_part(path);
    const char *same_tail = NULL;
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(last_part(ps->ptrs[i]), tail) && strcmp(ps->ptrs[i], path)) {
            if (same_tail) return NULL; /* ambiguous: fall back to distance */
            same_tail = ps->ptrs[i];
        }
    if (same_tail) return same_tail;
    size_t d;
    int best = hs_cfg_nearest(path, ps->ptrs, ps->n, &d);
    size_t limit = strlen(tail) / 3 + 2;
    return (best >= 0 && d <= limit) ? ps->ptrs[best] : NULL;
}

/* "a, b, c" of the direct children of `parent` ("" for the top level). */
static void children(const path_set *ps, const char *parent, char *out, size_t cap) {
    size_t np = strlen(parent), used = 0;
    out[0] = '\0';
    for (int i = 0; i < ps->n && used < cap; i++) {
        const char *p = ps->ptrs[i];
        if (np && (strncmp(p, parent, np) || p[np] != '.')) continue;
        const char *child = np ? p + np + 1 : p;
        if (strchr(child, '.')) continue;
        used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", child);
    }
}

static const hs_cfg_removed *removed_prefix(const char *path) {
    int n;
    const hs_cfg_removed *r = hs_cfg_removed_keys(&n);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(r[i].path);
        if (!strncmp(path, r[i].path, len) && (path[len] == '\0' || path[len] == '.')) return &r[i];
    }
    return NULL;
}

void hs_cfg_explain_path(const char *path, char *out, size_t cap) {
    const hs_cfg_removed *r = removed_prefix(path);
    if (r) {
        snprintf(out, cap, "%s %s", r->path, r->replacement);
        return;
    }
    path_set set; /* 26 KiB on the stack: a suggestion allocates nothing */
    path_set *ps = &set;
    path_set_fill(ps);
    const char *near = nearest_path(ps, path);
    int shown = (int)strnlen(path, 120);
    if (near) {
        snprintf(out, cap, "unknown key %.*s%s; did you mean %s?", shown, path,
                 path[shown] ? "..." : "", near);
    } else {
        char parent[128] = "", list[1024];
        const char *dot = strrchr(path, '.');
        if (dot && (size_t)(dot - path) < sizeof parent) {
            memcpy(parent, path, (size_t)(dot - path));
            parent[dot - path] = '\0';
        }
        if (!hs_cfg_is_section(parent)) parent[0] = '\0';
        children(ps, parent, list, sizeof list);
        snprintf(out, cap, "unknown key %.*s%s; valid keys %s%s: %s", shown, path,
                 path[shown] ? "..." : "", parent[0] ? "under " : "at the top level", parent, list);
    }
}
