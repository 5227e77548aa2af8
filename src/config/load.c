/* The public entry points of loading: defaults, load, override, copy, free.
 * A load either succeeds completely or leaves the built-in default behind:
 * a half-applied config never escapes. */
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

hs_status hs_config_defaults(hs_config *c, hs_error *err) {
    memset(c, 0, sizeof *c);
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        hs_error e;
        hs_error_clear(&e);
        hs_cfg_report r = {&e, 0};
        /* A default goes through the same YAML path a user's value does. */
        if (keys[i].type == HS_CFG_STRLIST || keys[i].type == HS_CFG_FLOAT_PAIR ||
            keys[i].type == HS_CFG_INTLIST || keys[i].type == HS_CFG_BLEND) {
            char assignment[256];
            snprintf(assignment, sizeof assignment, "%s=%s", keys[i].path, keys[i].def);
            hs_cfg_apply_override(c, assignment, &r);
        } else {
            char why[512];
            hs_cfg_scalar s = {keys[i].def, strlen(keys[i].def), true};
            if (!hs_cfg_set_scalar(c, &keys[i], s, why, sizeof why))
                hs_error_append(&e, HS_ERR_INTERNAL, "%s", why);
        }
        if (e.code == HS_ERR_OOM) {
            hs_config_free(c);
            if (err) *err = e;
            return e.code;
        }
        if (e.code != HS_OK) hs_panic("schema default of %s is invalid: %s", keys[i].path, e.msg);
    }
    return HS_OK;
}

static void list_free(char ***list, int *n) {
    for (int i = 0; i < *n; i++) free((*list)[i]);
    free(*list);
    *list = NULL;
    *n = 0;
}

void hs_config_free(hs_config *c) {
    if (!c) return;
    list_free(&c->fsdp.replicate_params, &c->fsdp.n_replicate_params);
    list_free(&c->train.freeze, &c->train.n_freeze);
    hs_cfg_blend_free(&c->data.blend, &c->data.n_blend);
}

/* NULL for an empty list; false when the copy finds no memory. */
static bool list_copy(char ***dst, char *const *src, int n) {
    *dst = NULL;
    if (n == 0) return true;
    char **d = calloc((size_t)n, sizeof(char *));
    for (int i = 0; d && i < n; i++) {
        d[i] = strdup(src[i]);
        if (d[i]) continue;
        int k = i;
        list_free(&d, &k);
    }
    *dst = d;
    return d != NULL;
}

/* Everything but the string lists is held by value (pp_layers too). */
hs_status hs_config_copy(hs_config *dst, const hs_config *src, hs_error *e) {
    *dst = *src;
    bool ok = list_copy(&dst->fsdp.replicate_params, src->fsdp.replicate_params,
                        src->fsdp.n_replicate_params);
    if (!ok) dst->fsdp.n_replicate_params = 0;
    if (!list_copy(&dst->train.freeze, src->train.freeze, src->train.n_freeze))
        ok = false, dst->train.n_freeze = 0;
    if (!hs_cfg_blend_copy(&dst->data.blend, src->data.blend, src->data.n_blend))
        ok = false, dst->data.n_blend = 0;
    if (ok) return HS_OK;
    hs_config_free(dst);
    return hs_error_oom(e, "copying the config's lists (%d + %d names, %d blend paths)",
                        src->fsdp.n_replicate_params, src->train.n_freeze, src->data.n_blend);
}

hs_status hs_config_load_text(hs_config *c, const char *text, size_t len, const char *origin,
                              const char *const *overrides, int n_overrides, hs_error *e) {
    hs_error_clear(e);
    hs_cfg_report rep = {e, 0};
    hs_config tmp;
    if (hs_config_defaults(&tmp, e) != HS_OK) {
        hs_config_defaults(c, NULL); /* freeable whatever memory allowed */
        return e->code;
    }
    if (origin && strlen(origin) >= sizeof tmp.source_path)
        hs_cfg_report_add(&rep, "%.200s...: config path longer than %zu bytes; move the file",
                          origin, sizeof tmp.source_path - 1);
    else if (origin) strcpy(tmp.source_path, origin);
    if (text) hs_cfg_read_yaml(&tmp, text, len, origin ? origin : "<config>", &rep);
    for (int i = 0; i < n_overrides; i++) hs_cfg_apply_override(&tmp, overrides[i], &rep);
    hs_cfg_report_finish(&rep);
    if (rep.count > 0) {
        hs_config_free(&tmp);
        hs_config_defaults(c, NULL); /* freeable whatever memory allowed */
        return e->code;
    }
    *c = tmp;
    return HS_OK;
}

hs_status hs_config_load(hs_config *c, const char *path, const char *const *overrides,
                         int n_overrides, hs_error *e) {
    char *text = NULL;
    size_t len = 0;
    if (path) {
        hs_error_clear(e);
        if (hs_read_file(path, &text, &len, e) != HS_OK) {
            /* A config path that cannot be read is a usage error (exit 2),
             * like any other bad command-line argument; no memory to read it
             * stays HS_ERR_OOM. */
            hs_config_defaults(c, NULL); /* freeable whatever memory allowed */
            if (e->code == HS_ERR_IO) e->code = HS_ERR_USAGE;
            return e->code;
        }
    }
    hs_status st = hs_config_load_text(c, text, len, path, overrides, n_overrides, e);
    free(text);
    return st;
}

hs_status hs_config_override(hs_config *c, const char *assignment, hs_error *e) {
    hs_error_clear(e);
    hs_cfg_report rep = {e, 0};
    hs_cfg_apply_override(c, assignment, &rep); /* leaves c untouched on error */
    return rep.count ? e->code : HS_OK;
}
