/* Choosing the engine: the single branch between one process and FSDP. */
#include "train/engine.h"
#include "train/engine_fsdp.h"

hs_status hs_engine_create(const hs_engine_env *env, hs_engine **out, hs_error *e) {
    *out = NULL;
    char why[256];
    bool fsdp = hs_topology_fsdp_active(env->topo, why, sizeof why);
    if (env->log) hs_log_info(env->log, fsdp ? "%s" : "fsdp: %s", why);
    /* Tensor and pipeline parallelism run in the FSDP engine, whose
     * degree-1 groups issue no collective when there is no FSDP domain
     * (dp * cp = 1). */
    if (env->topo->pp > 1) {
        hs_engine *inner = NULL;
        hs_status s = hs_engine_fsdp_create(env, &inner, e);
        return s == HS_OK ? hs_engine_pp_create(env, inner, out, e) : s;
    }
    if (fsdp || env->topo->tp > 1 || env->topo->ep > 1) return hs_engine_fsdp_create(env, out, e);
    if (env->topo->world == 1) return hs_engine_local_create(env, out, e);
    return hs_error_set(e, HS_ERR_CONFIG,
                        "world size %d has no FSDP domain (%s) and no model parallelism: raise "
                        "the data-parallel size (dp*cp > 1), set accelerator.tp_size, ep_size or "
                        "pp_size, or run with -n 1",
                        env->topo->world, why);
}

hs_model *hs_engine_catalog(const hs_engine *en) { return en->catalog ? en->catalog : en->model; }

void hs_engine_free(hs_engine *en) {
    if (en) en->free(en);
}

hs_status hs_engine_get_param(void *ctx, int param_index, float *out, hs_error *e) {
    hs_engine *en = ctx;
    return en->gather_full(en, param_index, out, e);
}

hs_status hs_engine_set_param(void *ctx, int param_index, const float *full, hs_error *e) {
    hs_engine *en = ctx;
    return en->set_full(en, param_index, full, e);
}
