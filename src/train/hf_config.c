/* Hugging Face config.json for LlamaForCausalLM (arch llama) and
 * MixtralForCausalLM (arch moe): the fields transformers needs to build the
 * same network, and the reverse mapping so a directory written by
 * transformers (or by us) can be checked against and loaded into a model. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "hypershard/train.h"

static void hf_write_fields(hs_json *j, const hs_model_config *mc, int max_position,
                            const char *dtype_name) {
    bool moe = !strcmp(mc->arch, "moe");
    hs_json_key(j, "architectures");
    hs_json_begin_array(j);
    hs_json_string(j, moe ? "MixtralForCausalLM" : "LlamaForCausalLM");
    hs_json_end_array(j);
    hs_json_kv_string(j, "model_type", moe ? "mixtral" : "llama");
    hs_json_kv_int(j, "vocab_size", mc->vocab_size);
    hs_json_kv_int(j, "hidden_size", mc->dim);
    hs_json_kv_int(j, "intermediate_size", moe ? mc->moe.expert_ffn_dim : mc->ffn_dim);
    hs_json_kv_int(j, "num_hidden_layers", mc->n_layers);
    hs_json_kv_int(j, "num_attention_heads", mc->n_heads);
    hs_json_kv_int(j, "num_key_value_heads", mc->n_kv_heads);
    hs_json_kv_int(j, "head_dim", mc->dim / mc->n_heads);
    hs_json_kv_string(j, "hidden_act", "silu");
    hs_json_kv_double(j, "rms_norm_eps", mc->norm_eps, 15);
    hs_json_kv_double(j, "rope_theta", mc->rope_theta, 15);
    hs_json_kv_bool(j, "tie_word_embeddings", mc->tie_embeddings);
    hs_json_kv_int(j, "max_position_embeddings", max_position);
    hs_json_kv_double(j, "initializer_range", mc->init_std, 15);
    hs_json_kv_bool(j, "attention_bias", false);
    hs_json_kv_double(j, "attention_dropout", 0.0, 15);
    hs_json_kv_string(j, "torch_dtype", dtype_name);
    if (moe) {
        hs_json_kv_int(j, "num_local_experts", mc->moe.num_experts);
        hs_json_kv_int(j, "num_experts_per_tok", mc->moe.top_k);
        hs_json_kv_double(j, "router_aux_loss_coef", mc->moe.aux_loss_coef, 15);
        hs_json_kv_bool(j, "output_router_logits", false);
        /* Not a Mixtral field: transformers ignores it (and warns about the
         * shared expert's weights); hypershard reads it back. */
        if (mc->moe.shared_expert_ffn_dim > 0)
            hs_json_kv_int(j, "shared_expert_intermediate_size", mc->moe.shared_expert_ffn_dim);
    } else {
        hs_json_kv_bool(j, "mlp_bias", false);
    }
}

hs_status hs_hf_config_write(const hs_model_config *mc, int max_position, const char *dtype_name,
                             const char *path, hs_error *e) {
    char tmp[HS_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = hs_fopen(tmp, "w", "check that the output directory exists and is writable", e);
    if (!f) return e->code;
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    hf_write_fields(&j, mc, max_position, dtype_name);
    hs_json_end_object(&j);
    fputc('\n', f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return hs_error_set(e, HS_ERR_IO, "cannot write %s: %s", path, hs_strerror_errno());
    }
    return HS_OK;
}

/* Reads an integer field; `required` false keeps *out when absent. */
static hs_status hf_int(json_t *root, const char *path, const char *key, bool required, int *out,
                        hs_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v && !required) return HS_OK;
    if (!json_is_integer(v))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" is %s; it must be an integer", path, key,
                            v ? "not an integer" : "missing");
    *out = (int)json_integer_value(v);
    return HS_OK;
}

static void hf_double(json_t *root, const char *key, double *out) {
    json_t *v = json_object_get(root, key);
    if (json_is_number(v)) *out = json_number_value(v);
}

static hs_status hf_read_fields(json_t *root, const char *path, hs_model_config *mc,
                                int *max_position, hs_error *e) {
    json_t *type = json_object_get(root, "model_type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    bool moe = !strcmp(t, "mixtral");
    if (!moe && strcmp(t, "llama"))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: model_type \"%s\" is not supported; hypershard reads llama and "
                            "mixtral",
                            path, t);
    snprintf(mc->arch, sizeof mc->arch, "%s", moe ? "moe" : "llama");
    hs_status s = HS_OK;
    int ffn = 0;
    if (s == HS_OK) s = hf_int(root, path, "vocab_size", true, &mc->vocab_size, e);
    if (s == HS_OK) s = hf_int(root, path, "hidden_size", true, &mc->dim, e);
    if (s == HS_OK) s = hf_int(root, path, "intermediate_size", true, &ffn, e);
    if (s == HS_OK) s = hf_int(root, path, "num_hidden_layers", true, &mc->n_layers, e);
    if (s == HS_OK) s = hf_int(root, path, "num_attention_heads", true, &mc->n_heads, e);
    mc->n_kv_heads = mc->n_heads; /* transformers' default */
    if (s == HS_OK) s = hf_int(root, path, "num_key_value_heads", false, &mc->n_kv_heads, e);
    if (s == HS_OK) s = hf_int(root, path, "max_position_embeddings", false, max_position, e);
    if (s != HS_OK) return s;
    mc->ffn_dim = ffn;
    hf_double(root, "rms_norm_eps", &mc->norm_eps);
    hf_double(root, "rope_theta", &mc->rope_theta);
    hf_double(root, "initializer_range", &mc->init_std);
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    mc->tie_embeddings = json_is_true(tie);
    if (!moe) return HS_OK;
    mc->moe.expert_ffn_dim = ffn;
    mc->moe.shared_expert_ffn_dim = 0;
    if (s == HS_OK) s = hf_int(root, path, "num_local_experts", true, &mc->moe.num_experts, e);
    if (s == HS_OK) s = hf_int(root, path, "num_experts_per_tok", true, &mc->moe.top_k, e);
    if (s == HS_OK)
        s = hf_int(root, path, "shared_expert_intermediate_size", false,
                   &mc->moe.shared_expert_ffn_dim, e);
    hf_double(root, "router_aux_loss_coef", &mc->moe.aux_loss_coef);
    return s;
}

hs_status hs_hf_config_read(const char *path, hs_model_config *mc, int *max_position,
                            hs_error *e) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root && jerr.line < 0) /* not a syntax error: the file could not be read */
        return hs_error_set(e, HS_ERR_IO, "%s: %s", path, jerr.text);
    if (!root)
        return hs_error_set(e, HS_ERR_FORMAT, "%s: line %d column %d: %s", path, jerr.line,
                            jerr.column, jerr.text);
    int maxpos = 0;
    hs_status s = json_is_object(root)
                      ? hf_read_fields(root, path, mc, &maxpos, e)
                      : hs_error_set(e, HS_ERR_FORMAT, "%s: not a JSON object", path);
    if (max_position) *max_position = maxpos;
    json_decref(root);
    return s;
}
