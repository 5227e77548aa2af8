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

/* Mixed precision, offload and fp32 main params need the FSDP engine's
 * storage even on one process (its groups are then all of size 1). */
static bool wants_policies(const hs_config *cfg) {
    int pd = cfg->fsdp.mix_precision.param_dtype, od = cfg->fsdp.mix_precision.output_dtype;
    return (pd != HS_MP_NULL && pd != HS_DTYPE_F32) || (od != HS_MP_NULL && od != HS_DTYPE_F32) ||
           cfg->fsdp.enable_offload || cfg->optimizer.fp32_main_params;
}

bool hs_engine_uses_fsdp(const hs_config *cfg, const hs_topology *topo) {
    return topo->pp > 1 || hs_topology_fsdp_active(topo, NULL, 0) || topo->tp > 1 || topo->ep > 1 ||
           wants_policies(cfg);
}

hs_model_options hs_engine_model_options(const hs_config *cfg, bool fsdp, int max_batch,
                                         hs_model_stage stage, int act_slots) {
    const hs_mix_precision *mp = &cfg->fsdp.mix_precision;
    int pd = mp->param_dtype, od = mp->output_dtype;
    hs_dtype compute = fsdp && pd != HS_MP_NULL ? (hs_dtype)pd : HS_DTYPE_F32;
    hs_model_options mo = {
        .compute_dtype = compute,
        .grad_dtype = compute,
        .max_batch = max_batch,
        .seq_len = cfg->train.seq_len,
        .activation_checkpointing = cfg->train.activation_checkpointing,
        .allocate_params = !fsdp, /* one process: the model owns data and grads */
        .stage = stage,
        .act_slots = act_slots,
        /* the threads this process computes with (train.threads, else the
         * OpenMP team: cmd_train balances it over the node's ranks) */
        .threads = cfg->train.threads > 0 ? cfg->train.threads : hs_blas_get_threads(),
    };
    if (fsdp) {
        /* Unit boundaries as FSDP2 places them (docs/fsdp-policies.md):
         * outputs cast when output_dtype is set; inputs cast to param_dtype
         * only when it is set and cast_forward_inputs is on. */
        mo.cast_unit_outputs = od != HS_MP_NULL;
        mo.unit_output_dtype = od != HS_MP_NULL ? (hs_dtype)od : compute;
        mo.keep_unit_inputs = pd == HS_MP_NULL || !mp->cast_forward_inputs;
    }
    return mo;
}

hs_model *hs_engine_catalog(const hs_engine *en) { return en->catalog ? en->catalog : en->model; }

void hs_engine_free(hs_engine *en) {
    if (en) en->free(en);
}

/* The public calls of train.h: the vtable, one call each. */
hs_model *hs_engine_model(hs_engine *en) { return en->model; }
const hs_model_hooks *hs_engine_hooks(hs_engine *en) { return en->hooks(en); }
int hs_engine_optim_params(hs_engine *en, hs_optim_param **out) {
    return en->optim_params(en, out);
}
void hs_engine_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last) {
    en->begin_micro_batch(en, sync, reshard, last);
}
hs_status hs_engine_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    return en->grad_norm(en, norm, e);
}
hs_status hs_engine_after_step(hs_engine *en, hs_error *e) { return en->after_step(en, e); }
void hs_engine_zero_grads(hs_engine *en) { en->zero_grads(en); }
void hs_engine_begin_step(hs_engine *en) {
    if (en->begin_step) en->begin_step(en);
}
void hs_engine_drain(hs_engine *en) {
    if (en->drain) en->drain(en);
}
hs_parallel *hs_engine_parallel(hs_engine *en) { return en->parallel ? en->parallel(en) : NULL; }

hs_status hs_engine_get_param(void *ctx, int param_index, float *out, hs_error *e) {
    hs_engine *en = ctx;
    return en->gather_full(en, param_index, out, e);
}

hs_status hs_engine_set_param(void *ctx, int param_index, const float *full, hs_error *e) {
    hs_engine *en = ctx;
    return en->set_full(en, param_index, full, e);
}
