/* What each model.arch builds, asked by every layer that depends on it, so
 * the families are named in one place. */
#include <string.h>

#include "hypershard/config.h"

static bool qwen3_moe(const hs_model_config *m) { return !strcmp(m->arch, "qwen3_moe"); }

bool hs_model_arch_moe(const hs_model_config *m) { return !strcmp(m->arch, "moe") || qwen3_moe(m); }

bool hs_model_arch_qk_norm(const hs_model_config *m) {
    return !strcmp(m->arch, "qwen3") || qwen3_moe(m);
}

const hs_moe_names *hs_model_arch_moe_names(const hs_model_config *m) {
    static const hs_moe_names mixtral = {"block_sparse_moe", "w1", "w2", "w3"};
    static const hs_moe_names qwen = {"mlp", "gate_proj", "down_proj", "up_proj"};
    return qwen3_moe(m) ? &qwen : &mixtral;
}

bool hs_model_arch_moe_renorm(const hs_model_config *m) {
    return !qwen3_moe(m) || m->moe.norm_topk_prob;
}

bool hs_model_layer_moe(const hs_model_config *m, int layer) {
    if (!hs_model_arch_moe(m)) return false;
    for (int i = 0; i < m->moe.n_mlp_only_layers; i++)
        if (m->moe.mlp_only_layers[i] == layer) return false;
    int step = m->moe.decoder_sparse_step > 0 ? m->moe.decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

int hs_model_dense_layers(const hs_model_config *m) {
    int n = 0;
    for (int i = 0; i < m->n_layers; i++) n += !hs_model_layer_moe(m, i);
    return n;
}

int hs_model_head_dim(const hs_model_config *m) {
    if (m->head_dim > 0) return m->head_dim;
    return m->n_heads > 0 ? m->dim / m->n_heads : 0;
}
