/* Hugging Face config.json for LlamaForCausalLM (arch llama),
 * MixtralForCausalLM (arch moe), Qwen3ForCausalLM (arch qwen3) and
 * Qwen3MoeForCausalLM (arch qwen3_moe) and DeepseekV3ForCausalLM (arch
 * deepseek_v3): the
 * fields transformers needs to build the
 * same network, and the reverse mapping so a directory written by
 * transformers (or by us) can be checked against and loaded into a model. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf_fields.h"

/* model.arch, its Hugging Face model_type and class. */
typedef struct hf_family {
    const char *arch, *model_type, *class_name;
} hf_family;

/* Export writes each arch's first row; Mistral (no sliding window) is
 * Llama's network under Llama's tensor names, and reads as arch llama. */
static const hf_family FAMILIES[] = {{"llama", "llama", "LlamaForCausalLM"},
                                     {"llama", "mistral", "MistralForCausalLM"},
                                     {"moe", "mixtral", "MixtralForCausalLM"},
                                     {"qwen3", "qwen3", "Qwen3ForCausalLM"},
                                     {"qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM"},
                                     {"deepseek_v3", "deepseek_v3", "DeepseekV3ForCausalLM"}};
#define N_FAMILIES (int)(sizeof FAMILIES / sizeof FAMILIES[0])

static const hf_family *family_of(const char *key, bool by_model_type) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(by_model_type ? FAMILIES[i].model_type : FAMILIES[i].arch, key))
            return &FAMILIES[i];
    return NULL;
}

static bool is_qwen3_moe(const char *arch) { return !strcmp(arch, "qwen3_moe"); }

/* Qwen3-MoE's expert fields, with its dense blocks (decoder_sparse_step,
 * mlp_only_layers). */
static void hf_write_qwen3_moe(hs_json *j, const hs_model_config *mc) {
    hs_json_kv_int(j, "moe_intermediate_size", mc->moe.expert_ffn_dim);
    hs_json_kv_int(j, "num_experts", mc->moe.num_experts);
    hs_json_kv_int(j, "num_experts_per_tok", mc->moe.top_k);
    hs_json_kv_bool(j, "norm_topk_prob", mc->moe.norm_topk_prob);
    hs_json_kv_int(j, "decoder_sparse_step", mc->moe.decoder_sparse_step);
    hs_json_key(j, "mlp_only_layers");
    hs_json_begin_array(j);
    for (int i = 0; i < mc->moe.n_mlp_only_layers; i++) hs_json_int(j, mc->moe.mlp_only_layers[i]);
    hs_json_end_array(j);
    hs_json_kv_double(j, "router_aux_loss_coef", mc->moe.aux_loss_coef, 15);
    hs_json_kv_bool(j, "output_router_logits", false);
}

/* The scaled RoPE's fields (none written for plain RoPE) as
 * transformers 4 spells them, which transformers 5 reads too. */
/* DeepSeek-V3's router fields (its config.json's names; scoring_func as
 * DeepSeek's own configs write it; bias_update_speed is hypershard's) on a
 * Mixtral or Qwen3-MoE config: transformers' classes for those ignore them
 * and route by softmax, hypershard reads them back. Written only for a
 * router other than the softmax one. */
static void hf_write_router(hs_json *j, const hs_model_config *mc) {
    if (!hs_model_moe_scored(mc)) return;
    const hs_moe_config *x = &mc->moe;
    hs_json_kv_string(j, "scoring_func", x->score_func);
    hs_json_kv_int(j, "n_group", x->n_group);
    hs_json_kv_int(j, "topk_group", x->topk_group);
    hs_json_kv_double(j, "routed_scaling_factor", x->routed_scaling_factor, 15);
    hs_json_kv_double(j, "bias_update_speed", x->bias_update_speed, 15);
}

static void hf_write_rope_scaling(hs_json *j, const hs_rope_scaling *r) {
    if (strcmp(r->type, "llama3") && strcmp(r->type, "yarn")) return;
    hs_json_key(j, "rope_scaling");
    hs_json_begin_object(j);
    hs_json_kv_string(j, "rope_type", r->type);
    hs_json_kv_double(j, "factor", r->factor, 17);
    hs_json_kv_int(j, "original_max_position_embeddings", r->original_max_position);
    if (!strcmp(r->type, "llama3")) {
        hs_json_kv_double(j, "low_freq_factor", r->low_freq_factor, 17);
        hs_json_kv_double(j, "high_freq_factor", r->high_freq_factor, 17);
    } else {
        hs_json_kv_double(j, "beta_fast", r->beta_fast, 17);
        hs_json_kv_double(j, "beta_slow", r->beta_slow, 17);
        if (r->mscale > 0.0) hs_json_kv_double(j, "mscale", r->mscale, 17);
        if (r->mscale_all_dim > 0.0) hs_json_kv_double(j, "mscale_all_dim", r->mscale_all_dim, 17);
        if (r->attention_factor > 0.0)
            hs_json_kv_double(j, "attention_factor", r->attention_factor, 17);
        hs_json_kv_bool(j, "truncate", r->truncate);
    }
    hs_json_end_object(j);
}

static void hf_write_fields(hs_json *j, const hs_model_config *mc, int max_position,
                            const char *dtype_name) {
    bool moe = hs_model_arch_moe(mc), qwen_moe = is_qwen3_moe(mc->arch);
    const hf_family *fam = family_of(mc->arch, false);
    HS_ASSERT(fam);
    hs_json_key(j, "architectures");
    hs_json_begin_array(j);
    hs_json_string(j, fam->class_name);
    hs_json_end_array(j);
    hs_json_kv_string(j, "model_type", fam->model_type);
    hs_json_kv_int(j, "vocab_size", mc->vocab_size);
    hs_json_kv_int(j, "hidden_size", mc->dim);
    bool mla = hs_model_arch_mla(mc), mixtral = moe && !qwen_moe && !mla;
    hs_json_kv_int(j, "intermediate_size", mixtral ? mc->moe.expert_ffn_dim : mc->ffn_dim);
    hs_json_kv_int(j, "num_hidden_layers", mc->n_layers);
    hs_json_kv_int(j, "num_attention_heads", mc->n_heads);
    hs_json_kv_int(j, "num_key_value_heads", mla ? mc->n_heads : mc->n_kv_heads);
    if (!mla) hs_json_kv_int(j, "head_dim", hs_model_head_dim(mc));
    hs_json_kv_string(j, "hidden_act", "silu");
    hs_json_kv_double(j, "rms_norm_eps", mc->norm_eps, 15);
    hs_json_kv_double(j, "rope_theta", mc->rope_theta, 15);
    hf_write_rope_scaling(j, &mc->rope_scaling);
    hs_json_kv_bool(j, "tie_word_embeddings", mc->tie_embeddings);
    hs_json_kv_int(j, "max_position_embeddings", max_position);
    hs_json_kv_double(j, "initializer_range", mc->init_std, 15);
    hs_json_kv_bool(j, "attention_bias", false);
    hs_json_kv_double(j, "attention_dropout", 0.0, 15);
    if (hs_model_arch_qk_norm(mc)) hs_json_kv_bool(j, "use_sliding_window", false);
    hs_json_kv_string(j, "torch_dtype", dtype_name);
    if (moe) hf_write_router(j, mc);
    if (mla) {
        hs_hf_write_deepseek_v3(j, mc);
    } else if (qwen_moe) {
        hf_write_qwen3_moe(j, mc);
    } else if (moe) {
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

/* One RoPE parameter object: transformers 4's "rope_scaling" or 5's
 * "rope_parameters" ({"rope_type" (or "type"): "default" | "llama3" |
 * "yarn", and that type's fields}) into mc->rope_scaling; other types
 * (linear, dynamic, longrope, ...) are another network than hypershard
 * builds. max_position: the config's max_position_embeddings, YaRN's
 * factor when it gives none (DeepSeek's convention). */
static hs_status hf_rope_fields(json_t *rs, const char *path, const char *key, int max_position,
                                hs_model_config *mc, hs_error *e) {
    if (!json_is_object(rs))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" must be an object or null", path, key);
    json_t *type = json_object_get(rs, "rope_type");
    if (!type || json_is_null(type)) type = json_object_get(rs, "type");
    const char *name = json_is_string(type) ? json_string_value(type) : NULL;
    if (!name || !strcmp(name, "default")) return HS_OK;
    hs_rope_scaling *r = &mc->rope_scaling;
    bool llama3 = !strcmp(name, "llama3"), yarn = !strcmp(name, "yarn");
    if (!llama3 && !yarn)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"%s\" is of type %s; hypershard builds plain, llama3 and yarn "
                            "RoPE, and training these weights with another would be another "
                            "network",
                            path, key, name);
    snprintf(r->type, sizeof r->type, "%s", name);
    hs_status s = hs_hf_int(rs, path, "original_max_position_embeddings", true, 1,
                            &r->original_max_position, e);
    json_t *fv = json_object_get(rs, "factor");
    bool has_factor = fv && !json_is_null(fv); /* present: a positive number (hf_double) */
    if (s == HS_OK && (llama3 || has_factor)) {
        if (!has_factor)
            return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\".\"factor\" is missing", path, key);
        s = hs_hf_double(rs, path, "factor", false, &r->factor, e);
    } else if (s == HS_OK && max_position < 1) {
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"%s\" gives no \"factor\" and there is no "
                            "max_position_embeddings to derive it from",
                            path, key);
    } else if (s == HS_OK) {
        r->factor = (double)max_position / r->original_max_position;
    }
    if (llama3) {
        if (s == HS_OK)
            s = hs_hf_double(rs, path, "low_freq_factor", false, &r->low_freq_factor, e);
        if (s == HS_OK)
            s = hs_hf_double(rs, path, "high_freq_factor", false, &r->high_freq_factor, e);
        if (s == HS_OK && !(r->high_freq_factor > r->low_freq_factor))
            s = hs_error_set(e, HS_ERR_FORMAT,
                             "%s: \"%s\": high_freq_factor %g must exceed low_freq_factor %g", path,
                             key, r->high_freq_factor, r->low_freq_factor);
        return s;
    }
    /* transformers' defaults where the file gives none */
    r->attention_factor = r->mscale = r->mscale_all_dim = 0.0;
    r->beta_fast = 32.0, r->beta_slow = 1.0, r->truncate = true;
    if (s == HS_OK) s = hs_hf_double(rs, path, "beta_fast", false, &r->beta_fast, e);
    if (s == HS_OK) s = hs_hf_double(rs, path, "beta_slow", false, &r->beta_slow, e);
    if (s == HS_OK) s = hs_hf_double(rs, path, "mscale", true, &r->mscale, e);
    if (s == HS_OK) s = hs_hf_double(rs, path, "mscale_all_dim", true, &r->mscale_all_dim, e);
    if (s == HS_OK) s = hs_hf_double(rs, path, "attention_factor", true, &r->attention_factor, e);
    if (s == HS_OK) s = hs_hf_bool(rs, path, "truncate", &r->truncate, e);
    return s;
}

/* A field of a RoPE object read and refused: the message names the
 * object too. */
static hs_status in_object(hs_status s, const char *key, hs_error *e) {
    if (s == HS_OK) return s;
    char was[HS_ERROR_MSG_MAX];
    snprintf(was, sizeof was, "%s", e->msg);
    return hs_error_set(e, s, "%s (in \"%s\")", was, key);
}

static hs_status hf_rope_object(json_t *rs, const char *path, const char *key, int max_position,
                                hs_model_config *mc, hs_error *e) {
    return in_object(hf_rope_fields(rs, path, key, max_position, mc, e), key, e);
}

/* RoPE's base: "rope_theta", or inside transformers 5's "rope_parameters";
 * its scaling: transformers 4's "rope_scaling" or the same object. */
static hs_status hf_rope(json_t *root, const char *path, int max_position, hs_model_config *mc,
                         hs_error *e) {
    if (hs_hf_double(root, path, "rope_theta", false, &mc->rope_theta, e) != HS_OK) return e->code;
    snprintf(mc->rope_scaling.type, sizeof mc->rope_scaling.type, "none");
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs) &&
        hf_rope_object(rs, path, "rope_scaling", max_position, mc, e) != HS_OK)
        return e->code;
    json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp)) return HS_OK;
    if (!json_is_object(rp))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"rope_parameters\" must be an object", path);
    if (hf_rope_object(rp, path, "rope_parameters", max_position, mc, e) != HS_OK) return e->code;
    return hs_hf_double(rp, path, "rope_theta", false, &mc->rope_theta, e);
}

/* Fields transformers reads that this model has no choice in: a value
 * other than the one it builds would load into a different network. */
static hs_status hf_check_fixed(json_t *root, const char *path, const hs_model_config *mc,
                                hs_error *e) {
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"hidden_act\" is not \"silu\"; hypershard builds SwiGLU MLPs",
                            path);
    static const char *const flags[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    static const char *const why[] = {"builds layers without biases",
                                      "builds layers without biases",
                                      "builds full causal attention in every layer"};
    for (int i = 0; i < 3; i++) {
        bool on = false;
        if (hs_hf_bool(root, path, flags[i], &on, e) != HS_OK) return e->code;
        if (on)
            return hs_error_set(e, HS_ERR_FORMAT, "%s: \"%s\" is true; hypershard %s", path,
                                flags[i], why[i]);
    }
    /* Mistral and Mixtral attend within "sliding_window" positions when it
     * is set; Qwen3 only under use_sliding_window, refused above. */
    json_t *sw = json_object_get(root, "sliding_window");
    if (!hs_model_arch_qk_norm(mc) && sw && !json_is_null(sw))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"sliding_window\" is set; hypershard builds full causal "
                            "attention in every layer (Mistral from v0.2 and Mixtral set it to "
                            "null)",
                            path);
    return HS_OK;
}

/* What the model could not be built from, said in config.json's terms. */
static hs_status hf_check_shape(const char *path, const hs_model_config *mc, bool moe,
                                hs_error *e) {
    if (!mc->head_dim && mc->dim % mc->n_heads != 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"hidden_size\" %d is not a multiple of \"num_attention_heads\" "
                            "%d",
                            path, mc->dim, mc->n_heads);
    if (mc->n_heads % mc->n_kv_heads != 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"num_attention_heads\" %d is not a multiple of "
                            "\"num_key_value_heads\" %d",
                            path, mc->n_heads, mc->n_kv_heads);
    if (hs_model_head_dim(mc) % 2)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: the head size %d (\"head_dim\", or \"hidden_size\" / "
                            "\"num_attention_heads\") is odd; RoPE rotates pairs",
                            path, hs_model_head_dim(mc));
    if (moe && mc->moe.top_k > mc->moe.num_experts)
        return hs_error_set(
            e, HS_ERR_FORMAT, "%s: \"num_experts_per_tok\" %d is more than \"%s\" %d", path,
            mc->moe.top_k, is_qwen3_moe(mc->arch) ? "num_experts" : "num_local_experts",
            mc->moe.num_experts);
    return HS_OK;
}

/* Qwen3-MoE's dense blocks: decoder_sparse_step (default 1) and
 * mlp_only_layers (default []), each entry a block of the model; at least
 * one block keeps its experts (hs_model_layer_moe). */
static hs_status hf_read_dense_layers(json_t *root, const char *path, hs_model_config *mc,
                                      hs_error *e) {
    hs_moe_config *x = &mc->moe;
    x->decoder_sparse_step = 1;
    x->n_mlp_only_layers = 0;
    if (hs_hf_int(root, path, "decoder_sparse_step", false, 1, &x->decoder_sparse_step, e) != HS_OK)
        return e->code;
    json_t *only = json_object_get(root, "mlp_only_layers");
    if (only && !json_is_null(only) && !json_is_array(only))
        return hs_error_set(e, HS_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list", path);
    size_t n = only && json_is_array(only) ? json_array_size(only) : 0;
    if (n > HS_MOE_MAX_MLP_ONLY)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"mlp_only_layers\" lists %zu layers; hypershard reads at most "
                            "%d",
                            path, n, HS_MOE_MAX_MLP_ONLY);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(only, i);
        json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;
        if (l < 0 || l >= mc->n_layers)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s: \"mlp_only_layers\"[%zu] is not a layer index of the "
                                "model's %d (\"num_hidden_layers\")",
                                path, i, mc->n_layers);
        x->mlp_only_layers[x->n_mlp_only_layers++] = (int)l;
    }
    if (hs_model_dense_layers(mc) == mc->n_layers)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"mlp_only_layers\" and \"decoder_sparse_step\" %d leave no "
                            "layer with experts; a dense model is model_type qwen3",
                            path, x->decoder_sparse_step);
    return HS_OK;
}

/* Qwen3MoeConfig's expert fields, with transformers' defaults where it has
 * them (norm_topk_prob false, router_aux_loss_coef 0.001). A missing count
 * of experts is reported as num_local_experts. */
static hs_status hf_read_qwen3_moe(json_t *root, const char *path, hs_model_config *mc,
                                   hs_error *e) {
    hs_status s = hf_read_dense_layers(root, path, mc, e);
    mc->moe.shared_expert_ffn_dim = 0;
    mc->moe.norm_topk_prob = false;
    mc->moe.aux_loss_coef = 0.001;
    if (s == HS_OK)
        s = hs_hf_int(root, path, "moe_intermediate_size", true, 1, &mc->moe.expert_ffn_dim, e);
    /* the Hub's configs say num_experts; transformers 5 writes it as
     * num_local_experts (Qwen3MoeConfig's attribute_map) */
    const char *experts = json_object_get(root, "num_experts") ? "num_experts"
                                                               : "num_local_experts";
    if (s == HS_OK) s = hs_hf_int(root, path, experts, true, 1, &mc->moe.num_experts, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "num_experts_per_tok", true, 1, &mc->moe.top_k, e);
    if (s == HS_OK) s = hs_hf_bool(root, path, "norm_topk_prob", &mc->moe.norm_topk_prob, e);
    if (s == HS_OK)
        s = hs_hf_double(root, path, "router_aux_loss_coef", true, &mc->moe.aux_loss_coef, e);
    if (s == HS_OK) s = hs_hf_read_router(root, path, mc, e);
    return s == HS_OK ? hf_check_shape(path, mc, true, e) : s;
}

static hs_status hf_read_fields(json_t *root, const char *path, hs_model_config *mc,
                                int *max_position, hs_error *e) {
    json_t *type = json_object_get(root, "model_type");
    const char *t = json_is_string(type) ? json_string_value(type) : "(missing)";
    const hf_family *fam = family_of(t, true);
    if (!fam)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: model_type \"%s\" is not supported; hypershard reads llama, "
                            "mistral, mixtral, qwen3, qwen3_moe and deepseek_v3",
                            path, t);
    snprintf(mc->arch, sizeof mc->arch, "%s", fam->arch);
    bool moe = hs_model_arch_moe(mc);
    hs_status s = HS_OK;
    int ffn = 0;
    if (s == HS_OK) s = hs_hf_int(root, path, "vocab_size", true, 1, &mc->vocab_size, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "hidden_size", true, 1, &mc->dim, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "intermediate_size", true, 1, &ffn, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "num_hidden_layers", true, 1, &mc->n_layers, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "num_attention_heads", true, 1, &mc->n_heads, e);
    mc->n_kv_heads = mc->n_heads; /* transformers' default */
    if (s == HS_OK) s = hs_hf_int(root, path, "num_key_value_heads", false, 1, &mc->n_kv_heads, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "max_position_embeddings", false, 1, max_position, e);
    if (s == HS_OK) s = hs_hf_double(root, path, "rms_norm_eps", false, &mc->norm_eps, e);
    if (s == HS_OK) s = hf_rope(root, path, *max_position, mc, e);
    if (s == HS_OK) s = hs_hf_double(root, path, "initializer_range", true, &mc->init_std, e);
    mc->tie_embeddings = false; /* transformers' Llama default */
    if (s == HS_OK) s = hs_hf_bool(root, path, "tie_word_embeddings", &mc->tie_embeddings, e);
    /* transformers' default: Qwen3Config's 128, else hidden_size / heads */
    int head_dim = hs_model_arch_qk_norm(mc) ? 128 : 0;
    if (s == HS_OK) s = hs_hf_int(root, path, "head_dim", false, 1, &head_dim, e);
    if (s == HS_OK) s = hf_check_fixed(root, path, mc, e);
    if (s != HS_OK) return s;
    /* null (dim / n_heads) where that is the size, so configs stay as written */
    bool derived = mc->dim % mc->n_heads == 0 && head_dim == mc->dim / mc->n_heads;
    mc->head_dim = derived ? 0 : head_dim;
    mc->ffn_dim = ffn;
    if (hs_model_arch_mla(mc)) return hs_hf_read_deepseek_v3(root, path, mc, e);
    if (!moe) return hf_check_shape(path, mc, false, e);
    if (is_qwen3_moe(mc->arch)) return hf_read_qwen3_moe(root, path, mc, e);
    mc->moe.norm_topk_prob = true; /* Mixtral renormalises */
    mc->moe.expert_ffn_dim = ffn;
    mc->moe.shared_expert_ffn_dim = 0;
    if (s == HS_OK)
        s = hs_hf_int(root, path, "num_local_experts", true, 1, &mc->moe.num_experts, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "num_experts_per_tok", true, 1, &mc->moe.top_k, e);
    if (s == HS_OK)
        s = hs_hf_int(root, path, "shared_expert_intermediate_size", false, 0,
                      &mc->moe.shared_expert_ffn_dim, e);
    if (s == HS_OK)
        s = hs_hf_double(root, path, "router_aux_loss_coef", true, &mc->moe.aux_loss_coef, e);
    if (s == HS_OK) s = hs_hf_read_router(root, path, mc, e);
    return s == HS_OK ? hf_check_shape(path, mc, true, e) : s;
}

hs_status hs_hf_config_parse(const char *path, const char *text, size_t len, hs_model_config *mc,
                             int *max_position, hs_error *e) {
    json_error_t jerr;
    /* A repeated key would silently replace the first. */
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
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

hs_status hs_hf_config_read(const char *path, hs_model_config *mc, int *max_position, hs_error *e) {
    char *text = NULL;
    size_t len = 0;
    if (hs_read_file(path, &text, &len, e) != HS_OK) return e->code;
    hs_status s = hs_hf_config_parse(path, text, len, mc, max_position, e);
    free(text);
    return s;
}
