/* What each model.arch builds, asked by every layer that depends on it, so
 * the families are named in one place. */
#include <string.h>

#include "hypershard/config.h"

static bool qwen3_moe(const hs_model_config *m) { return !strcmp(m->arch, "qwen3_moe"); }

bool hs_model_arch_mla(const hs_model_config *m) { return !strcmp(m->arch, "deepseek_v3"); }

bool hs_model_arch_moe(const hs_model_config *m) {
    return !strcmp(m->arch, "moe") || qwen3_moe(m) || hs_model_arch_mla(m);
}

bool hs_model_arch_qk_norm(const hs_model_config *m) {
    return !strcmp(m->arch, "qwen3") || qwen3_moe(m);
}

const hs_moe_names *hs_model_arch_moe_names(const hs_model_config *m) {
    static const hs_moe_names mixtral = {"block_sparse_moe", "w1", "w2", "w3", "shared_expert"};
    static const hs_moe_names qwen = {"mlp", "gate_proj", "down_proj", "up_proj", "shared_expert"};
    static const hs_moe_names deepseek = {"mlp", "gate_proj", "down_proj", "up_proj",
                                          "shared_experts"};
    if (hs_model_arch_mla(m)) return &deepseek;
    return qwen3_moe(m) ? &qwen : &mixtral;
}

bool hs_model_arch_moe_renorm(const hs_model_config *m) {
    return !(qwen3_moe(m) || hs_model_arch_mla(m)) || m->moe.norm_topk_prob;
}

bool hs_model_moe_bias(const hs_model_config *m) {
    return hs_model_arch_moe(m) &&
           (m->moe.bias_update_speed > 0 || !strcmp(m->moe.score_func, "sigmoid"));
}

bool hs_model_moe_scored(const hs_model_config *m) {
    const hs_moe_config *x = &m->moe;
    /* a config not from the schema (zeroed) has Mixtral's router */
    bool scaled = x->routed_scaling_factor > 0 && x->routed_scaling_factor != 1.0;
    return hs_model_arch_moe(m) &&
           (!strcmp(x->score_func, "sigmoid") || x->n_group > 1 || scaled || hs_model_moe_bias(m));
}

bool hs_model_layer_moe(const hs_model_config *m, int layer) {
    if (!hs_model_arch_moe(m)) return false;
    if (layer < m->moe.first_k_dense_replace) return false;
    for (int i = 0; i < m->moe.n_mlp_only_layers; i++)
        if (m->moe.mlp_only_layers[i] == layer) return false;
    int step = m->moe.decoder_sparse_step > 0 ? m->moe.decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

/* Counted without visiting every block (a config may have a million): the
 * blocks with (i + 1) % step == 0, less those listed (once each). */
int hs_model_dense_layers(const hs_model_config *m) {
    if (!hs_model_arch_moe(m) || m->n_layers < 1) return m->n_layers > 0 ? m->n_layers : 0;
    const hs_moe_config *x = &m->moe;
    int step = x->decoder_sparse_step > 0 ? x->decoder_sparse_step : 1, moe = m->n_layers / step;
    /* first_k_dense_replace comes with step 1 and no list (config rules) */
    if (x->first_k_dense_replace > 0)
        return x->first_k_dense_replace < m->n_layers ? x->first_k_dense_replace : m->n_layers;
    for (int i = 0; i < x->n_mlp_only_layers; i++) {
        int l = x->mlp_only_layers[i];
        bool again = false;
        for (int j = 0; j < i && !again; j++) again = x->mlp_only_layers[j] == l;
        moe -= !again && l >= 0 && l < m->n_layers && (l + 1) % step == 0;
    }
    return m->n_layers - moe;
}

int hs_model_head_dim(const hs_model_config *m) {
    if (hs_model_arch_mla(m)) return m->mla.qk_nope_head_dim + m->mla.qk_rope_head_dim;
    if (m->head_dim > 0) return m->head_dim;
    return m->n_heads > 0 ? m->dim / m->n_heads : 0;
}
