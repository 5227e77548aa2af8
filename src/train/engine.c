/* Choosing the engine: the single branch between one process and FSDP. */
#include "train/engines.h"

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
