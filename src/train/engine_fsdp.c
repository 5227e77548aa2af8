/* The FSDP engine: the model computes with the unsharded views the FSDP
 * hooks install, the optimizer updates the local shards. With tensor
 * parallelism the model is built with parallel/'s ops table and TP plan
 * first, and FSDP shards the TP-local tensors (spec 004 §3 steps 1-2). */
#include "train/engine_fsdp.h"

#include <stdlib.h>
#include <string.h>

#include "hypershard/fsdp.h"
#include "hypershard/parallel.h"

typedef struct fsdp_engine {
    hs_fsdp *f;
    hs_tp *tp; /* NULL without tensor parallelism */
} fsdp_engine;

static fsdp_engine *eng_of(hs_engine *en) { return en->ctx; }
static hs_fsdp *fsdp_of(hs_engine *en) { return eng_of(en)->f; }

static const hs_model_hooks *fsdp_hooks(hs_engine *en) { return hs_fsdp_hooks(fsdp_of(en)); }

static void fsdp_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last)
{
    hs_fsdp_set_micro_batch(fsdp_of(en), sync, reshard, last);
}

static int fsdp_optim_params(hs_engine *en, hs_optim_param **out)
{
    return hs_fsdp_optim_params(fsdp_of(en), out);
}

static hs_status fsdp_grad_norm(hs_engine *en, double *norm, hs_error *e)
{
    return hs_fsdp_grad_norm(fsdp_of(en), norm, e);
}

static hs_status fsdp_after_step(hs_engine *en, hs_error *e)
{
    return hs_fsdp_after_step(fsdp_of(en), e);
}

static void fsdp_zero_grads(hs_engine *en) { hs_fsdp_zero_grads(fsdp_of(en)); }

static hs_tp *fsdp_tp(hs_engine *en) { return eng_of(en)->tp; }

typedef hs_status (*gather_fn)(hs_fsdp *f, int i, float *out, hs_error *e);

/* The whole tensor: FSDP gathers the TP-local one, parallel/ the TP pieces. */
static hs_status gather_whole(hs_engine *en, gather_fn g, int i, float *out, hs_error *e)
{
    fsdp_engine *fe = eng_of(en);
    if (!fe->tp) return g(fe->f, i, out, e);
    const hs_param *p = hs_model_param(en->model, i);
    float *local = malloc((size_t)hs_param_local_numel(p) * sizeof(float) + 1);
    if (!local) return hs_error_set(e, HS_ERR_OOM, "engine: cannot allocate to gather %s", p->fqn);
    hs_status s = g(fe->f, i, local, e);
    if (s == HS_OK) s = hs_tp_gather_full(fe->tp, p, local, out, e);
    free(local);
    return s;
}

static hs_status fsdp_gather_full(hs_engine *en, int i, float *out, hs_error *e)
{
    return gather_whole(en, hs_fsdp_gather_full, i, out, e);
}

static hs_status fsdp_gather_full_grad(hs_engine *en, int i, float *out, hs_error *e)
{
    return gather_whole(en, hs_fsdp_gather_full_grad, i, out, e);
}

static hs_status fsdp_set_full(hs_engine *en, int i, const float *full, hs_error *e)
{
    fsdp_engine *fe = eng_of(en);
    if (!fe->tp) return hs_fsdp_set_full(fe->f, i, full, e);
    const hs_param *p = hs_model_param(en->model, i);
    float *local = malloc((size_t)hs_param_local_numel(p) * sizeof(float) + 1);
    if (!local) return hs_error_set(e, HS_ERR_OOM, "engine: cannot allocate to set %s", p->fqn);
    hs_tp_local_slice(p, full, local);
    hs_status s = hs_fsdp_set_full(fe->f, i, local, e);
    free(local);
    return s;
}

static void fsdp_ckpt_param(hs_engine *en, int i, hs_engine_ckpt_param *out)
{
    hs_fsdp_shard_view v;
    hs_fsdp_shard_view_get(fsdp_of(en), i, &v);
    *out = (hs_engine_ckpt_param){.row_offset = v.row_offset, .rows = v.rows, .master = v.master,
                                  .storage_rows = v.storage_rows, .model_copy = v.model_copy,
                                  .model_dtype = v.model_dtype};
}

static void fsdp_free(hs_engine *en)
{
    fsdp_engine *fe = eng_of(en);
    hs_fsdp_free(fe->f);
    hs_model_free(en->model);
    hs_tp_free(fe->tp);
    free(fe);
    free(en);
}

/* Tensor parallelism over the mesh's tp dim, when it is > 1. */
static hs_status tp_create(const hs_engine_env *env, hs_tp **out, hs_error *e)
{
    *out = NULL;
    const hs_config *cfg = env->cfg; /* config validation refused what TP cannot run */
    if (env->topo->tp < 2) return HS_OK;
    return hs_tp_create(env->comm, hs_mesh_group(env->mesh, HS_DIM_TP),
                        cfg->accelerator.sequence_parallel, cfg->accelerator.loss_parallel, out, e);
}

static hs_status tp_plan(hs_tp *tp, hs_model *m, hs_error *e)
{
    if (!tp) return HS_OK;
    int n = 0;
    const hs_tp_rule *rules = hs_tp_default_plan(&n);
    return hs_tp_apply_plan(tp, m, rules, n, e);
}

hs_status hs_engine_fsdp_create(const hs_engine_env *env, hs_engine **out, hs_error *e)
{
    *out = NULL;
    const hs_config *cfg = env->cfg;
    const hs_mix_precision *mp = &cfg->fsdp.mix_precision;
    int pd = mp->param_dtype, od = mp->output_dtype;
    hs_dtype compute = pd == HS_MP_NULL ? HS_DTYPE_F32 : (hs_dtype)pd;
    hs_model_options mo = {
        .compute_dtype = compute,
        .grad_dtype = compute,
        .max_batch = env->max_batch,
        .seq_len = cfg->train.seq_len,
        .activation_checkpointing = cfg->train.activation_checkpointing,
        .allocate_params = false,
        .pool = &env->dev->device_pool,
        /* Unit boundaries as FSDP2 places them (docs/fsdp-policies.md):
         * outputs cast when output_dtype is set; inputs cast to param_dtype
         * only when it is set and cast_forward_inputs is on. */
        .cast_unit_outputs = od != HS_MP_NULL,
        .unit_output_dtype = od != HS_MP_NULL ? (hs_dtype)od : compute,
        .keep_unit_inputs = pd == HS_MP_NULL || !mp->cast_forward_inputs,
    };
    hs_tp *tp = NULL;
    hs_status s = tp_create(env, &tp, e);
    if (s != HS_OK) return s;
    mo.ops = tp ? hs_tp_ops(tp) : NULL;
    hs_model *m = NULL;
    s = hs_model_create(&cfg->model, &mo, &m, e);
    if (s == HS_OK) s = tp_plan(tp, m, e);
    hs_fsdp *f = NULL;
    if (s == HS_OK)
        s = hs_fsdp_wrap(cfg, env->mesh, env->comm, env->dev, m, (uint64_t)cfg->train.seed,
                         env->log, &f, e);
    hs_engine *en = s == HS_OK ? calloc(1, sizeof *en) : NULL;
    fsdp_engine *fe = s == HS_OK ? calloc(1, sizeof *fe) : NULL;
    if (s == HS_OK && (!en || !fe))
        s = hs_error_set(e, HS_ERR_OOM, "engine: cannot allocate the FSDP engine");
    if (s != HS_OK) {
        free(en);
        free(fe);
        hs_fsdp_free(f);
        hs_model_free(m);
        hs_tp_free(tp);
        return s;
    }
    *fe = (fsdp_engine){.f = f, .tp = tp};
    *en = (hs_engine){
        .name = tp ? "fsdp+tp" : "fsdp",
        .ctx = fe,
        .model = m,
        .hooks = fsdp_hooks,
        .begin_micro_batch = fsdp_begin_micro_batch,
        .optim_params = fsdp_optim_params,
        .grad_norm = fsdp_grad_norm,
        .after_step = fsdp_after_step,
        .zero_grads = fsdp_zero_grads,
        .gather_full = fsdp_gather_full,
        .set_full = fsdp_set_full,
        .gather_full_grad = fsdp_gather_full_grad,
        .ckpt_param = fsdp_ckpt_param,
        .tp = fsdp_tp,
        .free = fsdp_free,
    };
    *out = en;
    return HS_OK;
}
