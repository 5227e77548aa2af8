/* DeepSeek-V3's config.json (DeepseekV3Config, arch deepseek_v3): its
 * latent attention and DeepSeekMoE fields both ways; the fields every
 * family shares are hf_config.c's. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/hf_fields.h"

/* DeepseekV3Config's latent attention and DeepSeekMoE fields (the shared
 * experts as n_shared_experts of moe_intermediate_size: config rules keep
 * the width a multiple); scoring_func and bias_update_speed as
 * hf_write_router writes them, for hypershard to read back. */
void hs_hf_write_deepseek_v3(hs_json *j, const hs_model_config *mc) {
    const hs_mla_config *a = &mc->mla;
    const hs_moe_config *x = &mc->moe;
    if (a->q_lora_rank > 0) hs_json_kv_int(j, "q_lora_rank", a->q_lora_rank);
    else {
        hs_json_key(j, "q_lora_rank");
        hs_json_null(j);
    }
    hs_json_kv_int(j, "kv_lora_rank", a->kv_lora_rank);
    hs_json_kv_int(j, "qk_nope_head_dim", a->qk_nope_head_dim);
    hs_json_kv_int(j, "qk_rope_head_dim", a->qk_rope_head_dim);
    hs_json_kv_int(j, "v_head_dim", a->v_head_dim);
    hs_json_kv_bool(j, "rope_interleave", a->rope_interleave);
    hs_json_kv_int(j, "moe_intermediate_size", x->expert_ffn_dim);
    hs_json_kv_int(j, "n_shared_experts", x->shared_expert_ffn_dim / x->expert_ffn_dim);
    hs_json_kv_int(j, "n_routed_experts", x->num_experts);
    hs_json_kv_int(j, "num_experts_per_tok", x->top_k);
    hs_json_kv_int(j, "first_k_dense_replace", x->first_k_dense_replace);
    hs_json_kv_bool(j, "norm_topk_prob", x->norm_topk_prob);
    hs_json_kv_double(j, "seq_aux_loss_coef", x->seq_aux_loss_coef, 15);
}

/* DeepseekV3Config's fields, with transformers' defaults where it has
 * them (q_lora_rank null: no compression; rope_interleave and
 * norm_topk_prob true; n_group, topk_group 1 when null). Its router is
 * always the sigmoid one, without Mixtral's aux loss. */
hs_status hs_hf_read_deepseek_v3(json_t *root, const char *path, hs_model_config *mc, hs_error *e) {
    hs_mla_config *a = &mc->mla;
    hs_moe_config *x = &mc->moe;
    *a = (hs_mla_config){.rope_interleave = true};
    mc->n_kv_heads = mc->n_heads; /* DeepseekV3Config's: one key and value a head */
    mc->head_dim = 0;             /* qk_nope_head_dim + qk_rope_head_dim */
    x->norm_topk_prob = true;
    x->aux_loss_coef = 0.0;
    x->n_group = x->topk_group = 1;
    x->decoder_sparse_step = 1;
    x->n_mlp_only_layers = 0;
    snprintf(x->score_func, sizeof x->score_func, "sigmoid");
    json_t *ql = json_object_get(root, "q_lora_rank");
    int n_shared = 0;
    hs_status s = ql && !json_is_null(ql)
                      ? hs_hf_int(root, path, "q_lora_rank", true, 1, &a->q_lora_rank, e)
                      : HS_OK;
    if (s == HS_OK) s = hs_hf_int(root, path, "kv_lora_rank", true, 1, &a->kv_lora_rank, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "qk_nope_head_dim", true, 1, &a->qk_nope_head_dim, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "qk_rope_head_dim", true, 2, &a->qk_rope_head_dim, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "v_head_dim", true, 1, &a->v_head_dim, e);
    if (s == HS_OK) s = hs_hf_bool(root, path, "rope_interleave", &a->rope_interleave, e);
    if (s == HS_OK)
        s = hs_hf_int(root, path, "moe_intermediate_size", true, 1, &x->expert_ffn_dim, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "n_shared_experts", false, 0, &n_shared, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "n_routed_experts", true, 1, &x->num_experts, e);
    if (s == HS_OK) s = hs_hf_int(root, path, "num_experts_per_tok", true, 1, &x->top_k, e);
    x->first_k_dense_replace = 0;
    if (s == HS_OK)
        s = hs_hf_int(root, path, "first_k_dense_replace", false, 0, &x->first_k_dense_replace, e);
    if (s == HS_OK) s = hs_hf_bool(root, path, "norm_topk_prob", &x->norm_topk_prob, e);
    if (s == HS_OK)
        s = hs_hf_double(root, path, "seq_aux_loss_coef", true, &x->seq_aux_loss_coef, e);
    if (s == HS_OK) s = hs_hf_read_router(root, path, mc, e);
    if (s != HS_OK) return s;
    if (n_shared > INT_MAX / x->expert_ffn_dim)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"n_shared_experts\" %d of \"moe_intermediate_size\" %d is a "
                            "shared MLP wider than %d",
                            path, n_shared, x->expert_ffn_dim, INT_MAX);
    x->shared_expert_ffn_dim = n_shared * x->expert_ffn_dim;
    snprintf(x->score_func, sizeof x->score_func, "sigmoid");
    if (a->qk_rope_head_dim % 2 || a->v_head_dim > a->qk_nope_head_dim + a->qk_rope_head_dim)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"qk_rope_head_dim\" %d must be even and \"v_head_dim\" %d at "
                            "most \"qk_nope_head_dim\" + \"qk_rope_head_dim\" = %d",
                            path, a->qk_rope_head_dim, a->v_head_dim,
                            a->qk_nope_head_dim + a->qk_rope_head_dim);
    if (x->first_k_dense_replace >= mc->n_layers)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"first_k_dense_replace\" %d leaves no layer of %d with experts",
                            path, x->first_k_dense_replace, mc->n_layers);
    if (x->top_k > x->num_experts)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s: \"num_experts_per_tok\" %d is more than \"n_routed_experts\" %d",
                            path, x->top_k, x->num_experts);
    return HS_OK;
}
