/* hs_parallelize: one rank's model, parallelized in torchtitan's order —
 * TP, CP and EP by parallel/'s style table, the pipeline stage, FSDP. */
#include "train/engines.h"

#include "hypershard/fsdp.h"
#include "hypershard/parallel.h"

hs_status hs_parallelize(const hs_engine_env *env, hs_parallelized *out, hs_error *e) {
    *out = (hs_parallelized){0};
    const hs_config *cfg = env->cfg;
    /* TP -> CP -> EP */
    hs_status s = hs_parallel_create(&cfg->model, &cfg->accelerator, env->mesh, env->comm, env->dev,
                                     NULL, 0, &out->par, e);
    /* PP: the stage's chunks of blocks; the seam places every parameter */
    hs_model_options mo =
        hs_engine_model_options(cfg, true, env->max_batch, env->stage, env->act_slots);
    mo.dev = env->dev;
    mo.weights_from_file = env->weights_from_file;
    if (s == HS_OK) {
        mo.par = hs_parallel_seam(out->par);
        s = hs_model_create(&cfg->model, &mo, &out->model, e);
    }
    /* FSDP over what the model-parallel plan left on this rank */
    if (s == HS_OK) hs_train_freeze_apply(cfg, out->model);
    if (s == HS_OK)
        s = hs_fsdp_wrap(&cfg->fsdp, cfg->optimizer.fp32_main_params, env->mesh, env->comm,
                         env->dev, out->model, (uint64_t)cfg->train.seed, env->log, &out->fsdp, e);
    if (s != HS_OK) hs_parallelized_free(out);
    return s;
}

void hs_parallelized_free(hs_parallelized *pz) {
    hs_fsdp_free(pz->fsdp);
    hs_model_free(pz->model);
    hs_parallel_free(pz->par);
    *pz = (hs_parallelized){0};
}
