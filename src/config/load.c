/* The public entry points of loading: defaults, load, override, copy, free.
 * A load either succeeds completely or leaves the built-in default behind:
 * a half-applied config never escapes. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

void hs_cfg_report_add(hs_cfg_report *r, const char *fmt, ...) {
    if (++r->count > HS_CFG_MAX_REPORTED) {
        if (r->e->code == HS_OK) r->e->code = HS_ERR_CONFIG;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    hs_error_vappend(r->e, HS_ERR_CONFIG, fmt, ap);
    va_end(ap);
}

void hs_cfg_report_finish(hs_cfg_report *r) {
    if (r->count > HS_CFG_MAX_REPORTED)
        hs_error_append(r->e, HS_ERR_CONFIG, "... and %d more errors",
                        r->count - HS_CFG_MAX_REPORTED);
}

void hs_config_defaults(hs_config *c) {
    memset(c, 0, sizeof *c);
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        hs_error e;
        hs_error_clear(&e);
        hs_cfg_report r = {&e, 0};
        /* A default goes through the same YAML path a user's value does. */
        if (keys[i].type == HS_CFG_STRLIST || keys[i].type == HS_CFG_FLOAT_PAIR ||
            keys[i].type == HS_CFG_INTLIST) {
            char assignment[256];
            snprintf(assignment, sizeof assignment, "%s=%s", keys[i].path, keys[i].def);
            hs_cfg_apply_override(c, assignment, &r);
        } else {
            char why[512];
            hs_cfg_scalar s = {keys[i].def, strlen(keys[i].def), true};
            if (!hs_cfg_set_scalar(c, &keys[i], s, why, sizeof why))
                hs_error_append(&e, HS_ERR_INTERNAL, "%s", why);
        }
        if (e.code != HS_OK) hs_panic("schema default of %s is invalid: %s", keys[i].path, e.msg);
    }
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
}

static char **list_copy(char *const *src, int n) {
    if (n == 0) return NULL;
    char **dst = calloc((size_t)n, sizeof(char *));
    if (!dst) hs_oom("copying the config");
    for (int i = 0; i < n; i++) {
        dst[i] = strdup(src[i]);
        if (!dst[i]) hs_oom("copying the config");
    }
    return dst;
}

/* Everything but the string lists is held by value (pp_layers too). */
void hs_config_copy(hs_config *dst, const hs_config *src) {
    *dst = *src;
    dst->fsdp.replicate_params =
        list_copy(src->fsdp.replicate_params, src->fsdp.n_replicate_params);
    dst->train.freeze = list_copy(src->train.freeze, src->train.n_freeze);
}

hs_status hs_config_load_text(hs_config *c, const char *text, size_t len, const char *origin,
                              const char *const *overrides, int n_overrides, hs_error *e) {
    hs_error_clear(e);
    hs_cfg_report rep = {e, 0};
    hs_config tmp;
    hs_config_defaults(&tmp);
    if (origin && strlen(origin) >= sizeof tmp.source_path)
        hs_cfg_report_add(&rep, "%.200s...: config path longer than %zu bytes; move the file",
                          origin, sizeof tmp.source_path - 1);
    else if (origin) strcpy(tmp.source_path, origin);
    if (text) hs_cfg_read_yaml(&tmp, text, len, origin ? origin : "<config>", &rep);
    for (int i = 0; i < n_overrides; i++) hs_cfg_apply_override(&tmp, overrides[i], &rep);
    hs_cfg_report_finish(&rep);
    if (rep.count > 0) {
        hs_config_free(&tmp);
        hs_config_defaults(c);
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
             * like any other bad command-line argument. */
            hs_config_defaults(c);
            e->code = HS_ERR_USAGE;
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
