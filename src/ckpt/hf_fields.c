/* Reading config.json fields: the typed readers with their range checks
 * and the router fields that several families share (hf_config.c,
 * hf_deepseek_v3.c). */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/hf_fields.h"

/* Reads an integer field in [lo, INT_MAX]; `required` false keeps *out
 * when absent. */
hs_status hs_hf_int(json_t *root, const char *path, const char *key, bool required, int lo,
                    int *out, hs_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v && !required) return HS_OK;
    if (!json_is_integer(v))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" is %s; it must be an integer", path, key,
                            !v                  ? "missing"
                            : json_is_string(v) ? "a string"
                                                : "not an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > INT_MAX)
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" is %lld; it must lie in [%d, %d]", path,
                            key, (long long)x, lo, INT_MAX);
    *out = (int)x;
    return HS_OK;
}

/* An optional number; present, it must be a finite number > 0 (or >= 0
 * when zero_ok). */
hs_status hs_hf_double(json_t *root, const char *path, const char *key, bool zero_ok, double *out,
                       hs_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return HS_OK;
    double x = json_is_number(v) ? json_number_value(v) : -1.0;
    if (!json_is_number(v) || !(zero_ok ? x >= 0 : x > 0) || !isfinite(x))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" must be a %s number", path, key,
                            zero_ok ? "non-negative" : "positive");
    *out = x;
    return HS_OK;
}

hs_status hs_hf_bool(json_t *root, const char *path, const char *key, bool *out, hs_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return HS_OK;
    if (!json_is_boolean(v))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = json_is_true(v);
    return HS_OK;
}

/* hf_config.c's hf_write_router's fields, each optional (absent:
 * Mixtral's router). */
hs_status hs_hf_read_router(json_t *root, const char *path, hs_model_config *mc, hs_error *e) {
    hs_moe_config *x = &mc->moe;
    json_t *f = json_object_get(root, "scoring_func");
    if (f && !(json_is_string(f) && (!strcmp(json_string_value(f), "softmax") ||
                                     !strcmp(json_string_value(f), "sigmoid"))))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"scoring_func\" must be \"softmax\" or \"sigmoid\"", path);
    if (f) snprintf(x->score_func, sizeof x->score_func, "%s", json_string_value(f));
    hs_status s = hs_hf_int(root, path, "n_group", false, 1, &x->n_group, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "topk_group", false, 1, &x->topk_group, e);
    if (s == HS_OK)
        s = hs_hf_double(root, path, "routed_scaling_factor", false, &x->routed_scaling_factor, e);
    if (s == HS_OK)
        s = hs_hf_double(root, path, "bias_update_speed", true, &x->bias_update_speed, e);
    if (x->n_group < 1) x->n_group = 1; /* a config not from the schema */
    if (x->topk_group < 1) x->topk_group = 1;
    if (s == HS_OK && (x->n_group > HS_MOE_MAX_GROUPS || x->num_experts % x->n_group ||
                       x->topk_group > x->n_group))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"n_group\" %d and \"topk_group\" %d do not divide %d experts "
                            "into groups (at most %d) to keep",
                            path, x->n_group, x->topk_group, x->num_experts, HS_MOE_MAX_GROUPS);
    return s;
}
