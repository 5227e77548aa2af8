/* train.freeze: which parameters train without gradient (fine-tuning),
 * checked against the whole model and applied to the model an engine runs
 * (engine.h). */
#include <fnmatch.h>
#include <string.h>

#include "train/engines.h"

static bool frozen_name(const hs_config *cfg, const char *fqn) {
    for (int k = 0; k < cfg->train.n_freeze; k++)
        if (fnmatch(cfg->train.freeze[k], fqn, 0) == 0) return true;
    return false;
}

/* The MoE layer's backward needs every gradient of the router and experts. */
static bool moe_param(const hs_param *p) {
    return p->kind == HS_PARAM_ROUTER || p->kind == HS_PARAM_EXPERT ||
           strstr(p->fqn, ".block_sparse_moe.") != NULL;
}

hs_status hs_train_freeze_check(const hs_config *cfg, const hs_model *catalog, hs_error *e) {
    hs_error_clear(e);
    const hs_fsdp_config *fc = &cfg->fsdp;
    if (cfg->train.n_freeze && fc->comm_fusion)
        hs_error_append(e, HS_ERR_CONFIG,
                        "train.freeze with fsdp_config.comm_fusion: true: a fused unit reduces "
                        "all its sharded parameters in one reduce-scatter, frozen ones too; set "
                        "fsdp_config.comm_fusion: false");
    int n = hs_model_num_params(catalog);
    for (int k = 0; k < cfg->train.n_freeze; k++) {
        const char *pat = cfg->train.freeze[k];
        int matched = 0;
        for (int i = 0; i < n; i++) {
            const hs_param *p = hs_model_param((hs_model *)catalog, i);
            if (fnmatch(pat, p->fqn, 0) != 0) continue;
            matched++;
            if (moe_param(p))
                hs_error_append(e, HS_ERR_CONFIG,
                                "train.freeze[%d] = '%s' matches %s, a parameter of the MoE "
                                "layer, which cannot be frozen (its backward needs the router's "
                                "and experts' gradients); narrow the pattern",
                                k, pat, p->fqn);
        }
        if (!matched)
            hs_error_append(e, HS_ERR_CONFIG,
                            "train.freeze[%d] = '%s' matches no parameter of the model; patterns "
                            "are globs over FQNs such as model.embed_tokens.weight or "
                            "model.layers.0.*",
                            k, pat);
    }
    return e->code;
}

int hs_train_freeze_apply(const hs_config *cfg, hs_model *m) {
    int n = 0;
    for (int i = 0; i < hs_model_num_params(m); i++)
        if (frozen_name(cfg, hs_model_param(m, i)->fqn)) hs_model_freeze(m, i), n++;
    return n;
}
